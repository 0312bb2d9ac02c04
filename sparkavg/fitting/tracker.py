"""What one fit does at every epoch end besides training: the learning
rate, validation metrics, the best epoch, early stopping, the epoch's log
line and ``epoch_end`` event, and the :class:`~sparkavg.fitting.history.History`
the fit returns.

:class:`FitTracker` is driver-side and Spark-free: the trainer calls it at
fixed points of its epoch loop (before the first epoch, after each epoch's
checkpoint and validation pass, at the end of the fit) and does what it
answers.  The best epoch's state is kept by :class:`~sparkavg.fitting.best.BestEpoch`.
"""
from __future__ import annotations

import logging
import os
import time
from typing import Callable, Optional, Sequence

from ..stats import DecisionName, SeriesName
from .best import BestEpoch, update_record
from .early_stopping import EarlyStopping, Monitor
from .history import History
from .metrics import LOSS, VALIDATION_PREFIX, ValidationPlan, check_metrics, evaluated_as, monitor_names

__all__ = ["FitTracker"]

logger = logging.getLogger(__name__)


def _checked_early_stopping(value) -> Optional[EarlyStopping]:
    if value is None or isinstance(value, EarlyStopping):
        return value
    raise TypeError(f"Expect early_stopping as an EarlyStopping(...) or None, got {type(value).__name__} "
                    f"{value!r:.80}")


class FitTracker:
    """The epoch-end bookkeeping of one ``fit``.

    Parameters
    ----------
    early_stopping : EarlyStopping, optional
    metrics : list of str, optional
        Validation metrics to record (:mod:`sparkavg.fitting.metrics`).
    validation : bool
        Whether the fit has validation data.
    network : sparkavg.nn.Model
        The model the fit trains.
    history : list of dict
        The trainer's history (one entry per epoch, appended by the trainer).
    spec : DataSpec
        The model's data spec (``classification``, ``num_outputs``).
    stats : TrainingStats
        Where the series and decisions go.
    events : EventDispatcher
        The trainer's listeners: ``epoch_end`` goes to them, and a
        ``request_stop`` made through them ends the fit after the epoch in flight.
    run_id : str
        The run the checkpoints belong to.
    checkpoint_dir : str, optional
        Where the best checkpoint is marked.

    Raises
    ------
    ValueError
        A monitor this fit does not produce (the names it does produce are
        listed), or metrics without validation data.
    """

    def __init__(self, early_stopping, metrics: Optional[Sequence[str]], *, validation: bool, network, history: list,
                 spec, stats, events, run_id: str, checkpoint_dir: Optional[str] = None):
        es = self.early_stopping = _checked_early_stopping(early_stopping)
        metrics = check_metrics(metrics)
        if metrics and not validation:
            raise ValueError(f"Expect validation_data with metrics={metrics!r}: they are computed on it, got none")
        classification, units = evaluated_as(spec)
        available = monitor_names(classification, validation)
        if es is not None and es.monitor not in available:
            hint = " (validation values need validation_data)" if es.needs_validation and not validation else ""
            raise ValueError(f"Expect EarlyStopping.monitor among the values this fit produces, {available}, got "
                             f"{es.monitor!r}{hint}")
        named = metrics + ([es.metric] if es is not None and es.metric else [])
        self.plan = ValidationPlan(classification, units, named) if validation else None
        self.monitor = Monitor(es, VALIDATION_PREFIX + LOSS if validation else LOSS)
        self.network, self.history, self.stats, self.events = network, history, stats, events
        self.best = BestEpoch(checkpoint_dir, run_id, in_memory=es is not None and es.restore_best)
        self.events.stop_request = None
        self.started, self.seconds_before = time.perf_counter(), 0.0
        self.stop_reason: Optional[str] = None
        self.stop_message = ""

    @classmethod
    def of(cls, trainer, early_stopping, metrics, validation_data) -> "FitTracker":
        """The tracker of a fit of ``trainer`` (a :class:`~sparkavg.spark.SparkTrainer`)."""
        return cls(early_stopping, metrics, validation=validation_data is not None, network=trainer.network,
                   history=trainer.history, spec=trainer.spec, stats=trainer.stats,
                   events=trainer._events,  # the trainer's own dispatcher: its listeners, the stop request
                   run_id=trainer.run_id, checkpoint_dir=trainer.checkpoint_dir)

    # ---------------------------------------------------------------- resume
    def resume(self, checkpoint) -> None:
        """Continue the run of ``checkpoint`` (a :class:`~sparkavg.spark.checkpoint.Checkpoint`):
        its early-stopping state (rebuilt from its history when it has none)
        and its best epoch's folder beside it."""
        self.monitor.load_state_dict(checkpoint.extra.get("early_stopping"), checkpoint.extra.get("history", []))
        self.seconds_before = self.monitor.seconds
        self.best.resume(os.path.dirname(checkpoint.directory), checkpoint.run_id, self.monitor.best_epoch)

    def done_before_start(self, epochs_done: int) -> bool:
        """Whether the run already met its stopping rule (a resumed run that
        stopped: then no epoch trains); a fresh run forgets another run's best checkpoint."""
        if self.best.epoch is None:
            self.best.forget_other_runs()
        reason, why = self.monitor.verdict(epochs_done)
        if reason is not None:
            self._stop(reason, f"the run had already met its stopping rule: {why}", epochs_done)
        return reason is not None

    # ---------------------------------------------------------------- epochs
    def learning_rate(self, epoch: int) -> Optional[float]:
        """The learning rate of the last step of epoch ``epoch`` (from 0)."""
        try:
            return float(self.network.updater.rate(max(int(self.network.iteration) - 1, 0), epoch))
        except Exception as exc:  # a model without a sparkavg updater, a schedule out of range
            logger.debug("no learning rate to record: %s", exc)
            return None

    def evaluations(self) -> list:
        """Fresh evaluations for this epoch's validation pass."""
        return self.plan.evaluations()

    def end_epoch(self, entry: dict, evaluations, target: int, checkpoint: Optional[str],
                  snapshot: Callable[[], dict]) -> bool:
        """After an epoch, its checkpoint and its validation pass: the learning
        rate and validation values into ``entry`` (the epoch's history entry),
        the series into the stats, the best epoch kept, the checkpoint's
        record brought up to date, the log line, ``epoch_end`` to the
        listeners; True when the fit stops here.

        Parameters
        ----------
        entry : dict
            The epoch's history entry (``epoch`` from 1, ``loss``, ``examples`` ...).
        evaluations : list or None
            The validation pass's merged :meth:`evaluations` (None without validation data).
        target : int
            The fit's epoch target (for the log line and ``epoch_end``).
        checkpoint : str or None
            This epoch's checkpoint folder.
        snapshot : callable
            Host copies of the network's state vectors by name (called only
            when the best epoch is kept in memory).
        """
        epoch = entry["epoch"]
        entry["learning_rate"] = self.learning_rate(epoch - 1)
        if entry["learning_rate"] is not None:
            self.stats.series(SeriesName.LEARNING_RATE, epoch, entry["learning_rate"])
        if evaluations is not None:
            values = self.plan.values(evaluations)
            entry.update(values)
            entry["accuracy"] = values.get(VALIDATION_PREFIX + "accuracy")  # its earlier name (None: regression)
            for name, value in values.items():
                if value is not None:
                    self.stats.series(SeriesName.VALIDATION, epoch, value, lane=name)
        m = self.monitor
        reason, why = m.decide(epoch, entry.get(m.monitor), int(self.network.epoch), self.seconds())
        if m.best_epoch == epoch:
            self.best.keep(epoch, checkpoint if self.early_stopping is not None else None, snapshot,
                           {"monitor": m.monitor, "mode": m.mode, "value": m.best_value})
        if checkpoint is not None:
            extra = {"history": self.history}
            if self.early_stopping is not None:
                extra["early_stopping"] = m.state_dict()
            update_record(checkpoint, extra)
        logger.info("epoch %d/%d: loss %.4f, %d examples in %.1fs (%.0f ex/s)%s", epoch, target, entry["loss"],
                    entry["examples"], entry["seconds"], entry["examples_per_second"],
                    ValidationPlan.describe(entry))
        if self.events.wants("epoch_end"):
            self.events.emit("epoch_end", {**entry, "target_epochs": target, "decisions": [
                d for d in self.stats.decisions if d.get("epoch") == epoch - 1]})
        if reason is not None:
            self._stop(reason, why, epoch)
            return True
        return self.end_request(epoch)

    def end_request(self, epoch: int) -> bool:
        """Whether a listener asked the fit to stop (``trainer.request_stop``)
        by the end of epoch ``epoch`` (from 1)."""
        request = self.events.stop_request
        if request is not None and self.stop_reason is None:
            self._stop("listener", f"a listener asked: {request}", epoch)
        return self.stop_reason is not None

    def diverged(self, exc: BaseException, epoch: int) -> bool:
        """Whether an epoch whose training loss was NaN or infinite (``exc``,
        the network already restored to the epoch's start) ends the fit
        rather than failing it: with early stopping it does."""
        if self.early_stopping is None:
            return False
        self._stop("invalid_score", f"epoch {epoch + 1} diverged ({exc}) and is not kept", epoch)
        return True

    def seconds(self) -> float:
        """The run's seconds so far (a resumed run's earlier fits included)."""
        return self.seconds_before + time.perf_counter() - self.started

    def _stop(self, reason: str, why: str, epoch: int) -> None:
        self.stop_reason, self.stop_message = reason, why
        logger.info("early stopping after epoch %d (%s): %s", epoch, reason, why)

    # ---------------------------------------------------------------- the end
    def finish(self, network, history: list) -> History:
        """The fit's :class:`History`; with ``restore_best``, ``network`` put
        back to the best epoch's state first (logged and recorded)."""
        m, es = self.monitor, self.early_stopping
        restored = False
        if es is not None and es.restore_best and m.best_epoch is not None and m.best_epoch != int(network.epoch):
            where = self.best.restore(network)
            restored = where is not None
            if restored:
                logger.info("restore_best: the model holds the state of its best epoch %d (%s %.6g), from %s",
                            m.best_epoch, m.monitor, m.best_value, where)
        if es is not None:
            what = f"stopped: {self.stop_reason} ({self.stop_message})" if self.stop_reason else "ran every epoch"
            best = f"best epoch {m.best_epoch} ({m.monitor} {m.best_value:.6g})" if m.best_epoch else "no best epoch"
            self.stats.decision(DecisionName.EARLY_STOPPING, self.stop_reason or "completed",
                                f"{what}; {best}" + ("; restored" if restored else ""),
                                epoch=max(int(network.epoch) - 1, 0))
        return History(history=list(history), best_epoch=m.best_epoch, monitor=m.monitor, mode=m.mode,
                       best_value=m.best_value, stop_reason=self.stop_reason, stop_message=self.stop_message,
                       restored_best=restored)
