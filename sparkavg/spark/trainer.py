"""The one trainer interface: ``SparkTrainer(spark_or_sc, network, master)``.

The master (:class:`ParameterAveraging` or :class:`GradientSharing`) says
how an epoch is distributed (its runner); everything else -- minibatching
once per fit, epochs, checkpoints, divergence, evaluation, inference,
statistics, cleanup -- lives here once, on one seam to Spark.
"""
from __future__ import annotations

import logging
import math
import os
import threading
import time
import uuid
import weakref
from typing import List, Optional, Sequence

import numpy as np

from ..backend import to_cpu
from ..data.validation import DataSpec, rebatch_partition, weight_input
from ..fitting.metrics import default_evaluation
from ..fitting.tracker import FitTracker
from ..listeners.base import EventDispatcher
from ..listeners.progress import progress_listeners
from . import checkpoint as ckpt_io
from .data import is_dataframe, resolve_features
from ..fitting.divergence import divergence_policy
from .errors import DivergenceError, TrainingCancelled, raise_failures
from .executor.inference import add_scores, make_evaluator, make_predict_fn, make_scorer, merge_evaluations
from .masters import ParameterAveraging
from .runners import runner_for
from .runners.base import network_state
from .streaming import STORAGE_DECISION, prepare_source
from ..data.transforms import input_encoding
from .seam import seam_for
from ..stats import Phase, TrainingStats
from ..data.storage import release_live_locations
from .termination import release_on_sigterm

__all__ = ["SparkTrainer"]

logger = logging.getLogger(__name__)

#: Minibatch size of evaluate/score/predict (DL4J's default).
EVAL_BATCH_SIZE = 64


class SparkTrainer:
    """Train, evaluate and run a model on Spark.

    Parameters
    ----------
    spark_or_sc : SparkSession or SparkContext
    network : sparkavg.nn.Model
        Any model of the contract (:class:`sparkavg.nn.Network`,
        :class:`sparkavg.nn.Graph`, ``sparkavg.torch.TorchModel``).
        Trained in place; ``trainer.network`` is always this object.
    master : ParameterAveraging or GradientSharing, default ParameterAveraging()
    features_col : str, dict or list of str, default "features"
        Feature column(s) when data is a DataFrame: one column for a model
        with one input; for several inputs (a :class:`~sparkavg.nn.Graph`'s)
        a dict ``{input name: column}`` or a list of columns in the order
        of the model's inputs.  Numeric array (or ml Vector) columns feed
        float inputs; integer columns feed id inputs (an Embedding's) and
        stay integer.
    label_col : str
        The label column when data is a DataFrame.
    weight_col : str, optional
        A numeric column of per-row weights (finite, >= 0; pyspark.ml's
        ``weightCol``) when data is a DataFrame: each row's loss is scaled by
        its weight (:mod:`sparkavg.nn.losses`) and parameter averaging
        weighs each worker by the summed weights of the rows it trained.
    checkpoint_dir : str, optional
        When set, a checkpoint is written after every epoch (before the
        validation pass).  It holds one run: a fresh fit refuses a folder
        with another run's checkpoints unless ``fit(...,
        overwrite_checkpoints=True)``.
    on_divergence : {"raise", "recover"} or Recover, default "raise"
        A non-finite loss or parameter on a worker stops the fit with
        :class:`~sparkavg.spark.DivergenceError` naming the worker and
        iteration (the model is restored to the last good state: the
        start of that epoch, as :meth:`fit` says).
        ``"recover"`` (or :class:`~sparkavg.spark.Recover` with its own
        numbers) instead restores the state from the start of the epoch,
        halves the learning rate and trains the epoch again (up to 3 times
        per fit).
    listeners : list, optional
        Objects with ``on_<event>(trainer, event)`` methods, called on the
        driver (:mod:`sparkavg.listeners`: ``MLflowListener``,
        ``TensorBoardListener``, or a :class:`~sparkavg.listeners.TrainingListener`
        of your own).  One that raises is logged and recorded
        (:attr:`listener_errors`) and the fit goes on.
    progress : {"auto", True, False}, default "auto"
        A progress bar (tqdm) of epochs and rounds on the driver: "auto"
        when stderr is a terminal and tqdm is installed.  Without it, the
        rounds' progress goes to periodic log lines.

    Notes
    -----
    The trainer holds exported minibatches; :meth:`close` (or leaving
    ``with SparkTrainer(...)``, or interpreter exit) releases them, and so
    does a SIGTERM during a fit in the main thread (which then still ends
    the process, :mod:`~sparkavg.spark.termination`).  The
    parameters ``predict`` ships live as long as the RDD it returns (and
    RDDs derived from it): released when it is garbage-collected, by
    :meth:`close`, or at interpreter exit -- never when only the trainer
    goes away.
    """

    def __init__(self, spark_or_sc, network, master=None, *, features_col: str = "features",
                 label_col: str = "label", weight_col: Optional[str] = None, checkpoint_dir: Optional[str] = None,
                 on_divergence="raise", listeners: Optional[Sequence] = None, progress="auto"):
        from ..nn import Model

        if not isinstance(network, Model):
            missing = sorted(n for n in ("state", "load_state", "spec", "fit_batch", "to_json", "fingerprint")
                             if not hasattr(network, n))
            raise TypeError(f"Expect a model (sparkavg.nn.Network, Graph, sparkavg.torch.TorchModel: the "
                            f"sparkavg.nn.Model contract), got {type(network).__name__} {network!r:.80}"
                            + (f" (it lacks {missing})" if missing else ""))
        if checkpoint_dir is not None:
            if not isinstance(checkpoint_dir, (str, os.PathLike)):
                raise TypeError(f"Expect checkpoint_dir as a folder path (str or os.PathLike) or None, got "
                                f"{type(checkpoint_dir).__name__} {checkpoint_dir!r:.80}")
            checkpoint_dir = os.fspath(checkpoint_dir)
        self.seam = seam_for(spark_or_sc)
        self.master = master if master is not None else ParameterAveraging()
        self._runner = runner_for(self.seam, self.master)
        self.network = network
        self.features_col, self.label_col = features_col, label_col
        self.checkpoint_dir = checkpoint_dir
        if weight_col is not None and (not isinstance(weight_col, str) or not weight_col):
            raise TypeError(f"Expect weight_col as a column name (str) or None, got {weight_col!r}")
        self.weight_col = weight_col
        self.recover = divergence_policy(on_divergence)
        self.eval_batch_size = EVAL_BATCH_SIZE
        self.run_id = uuid.uuid4().hex[:12]
        self.stats = TrainingStats(workers=self.workers)
        self.history: List[dict] = []
        self._prepared_for = None
        # What the trainer holds on the cluster: the fitted data's minibatches.  Released by
        # close(), and at interpreter exit when never closed.
        self._held = {"prepared": None}
        self._finalizer = weakref.finalize(self, SparkTrainer._release, self._held)
        self._events = EventDispatcher(list(listeners or ()) + progress_listeners(progress), owner=self)
        self._runner.events = self._events
        self._epoch_running: Optional[int] = None
        # predict()'s shipped parameters belong to the RDDs it returned (one finalizer each,
        # run when that RDD is collected): listed here only so that close() can release them.
        self._predictions: List[weakref.finalize] = []
        self._fitting, self._fitting_thread = threading.Lock(), None
        self._checkpointed = None  # (folder, epoch) of the last checkpoint this trainer wrote or resumed from

    # ------------------------------------------------------------ resources
    @property
    def _prepared(self):
        return self._held["prepared"]

    @staticmethod
    def _release(resources: dict) -> None:
        prepared = resources.get("prepared")
        if prepared is not None:
            resources["prepared"] = None
            try:
                prepared.release()
            except Exception as exc:  # e.g. a SparkContext stopped before the trainer was closed
                logger.debug("could not release the fit's minibatches: %s", exc)

    @staticmethod
    def _destroy_shipped(handle) -> None:
        try:
            handle.destroy()
        except Exception:  # a stopped SparkContext has released it already
            pass

    def close(self) -> None:
        """Release exported minibatches, persisted blocks and the parameters
        shipped by :meth:`predict` (its RDDs cannot be computed afterwards)."""
        self._prepared_for = None
        SparkTrainer._release(self._held)
        for release in self._predictions:
            release()
        self._predictions.clear()

    def __enter__(self) -> "SparkTrainer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ data
    @property
    def spec(self) -> DataSpec:
        return DataSpec.of(self.network.spec)

    @property
    def workers(self) -> int:
        return self.master.workers or self.seam.default_parallelism

    @property
    def epochs_done(self) -> int:
        """Epochs the network has trained (its ``epoch`` counter)."""
        return int(self.network.epoch)

    def _prepare(self, data):
        """Minibatch ``data`` once; reused when the same data is fitted again."""
        if self._prepared is not None and self._prepared_for is data:
            return self._prepared
        self.release_data()
        with self.stats.timed(Phase.EXPORT):
            prepared, choice = prepare_source(self.seam, data, self.spec, self.master, self._runner.streams,
                                              self._features_for(data) + self._weights_for(data), self.label_col)
        self._held["prepared"], self._prepared_for = prepared, data
        for name, value, reason in [(STORAGE_DECISION, choice.value, choice.reason), *prepared.decisions()]:
            self.stats.decision(name, value, reason)
            logger.info("%s %s: %s", name.replace("_", " "), value, reason)
        if not prepared.sizes:
            raise ValueError("Expect training data with at least one example, got an empty dataset")
        logger.info("prepared %d examples in %d minibatches (%s)", prepared.examples, len(prepared.sizes),
                    prepared.description)
        return prepared

    def _features_for(self, data) -> tuple:
        """The model's inputs, each with its ``features_col`` column for a
        DataFrame (:func:`~sparkavg.spark.data.resolve_features`)."""
        if is_dataframe(data):
            return resolve_features(self.features_col, self.spec)
        return self.spec.inputs

    def _weights_for(self, data) -> tuple:
        """``weight_col`` as one more input of the training data (it travels with the features,
        checked on the executors, and leaves them before the model sees them)."""
        if self.weight_col is None:
            return ()
        if not is_dataframe(data):
            raise ValueError(f"Expect a DataFrame with weight_col={self.weight_col!r} (a column), got "
                             f"{type(data).__name__}: weigh RDD data by making it a DataFrame")
        return (weight_input(self.weight_col),)

    def release_data(self) -> None:
        """Drop the minibatches (files or blocks) of the last fitted data."""
        if self._prepared is not None:
            self._prepared.release()
        self._held["prepared"], self._prepared_for = None, None

    @property
    def listeners(self) -> list:
        """The listeners given (and the progress bar, when one is shown)."""
        return list(self._events.listeners)

    @property
    def listener_errors(self) -> List[dict]:
        """``{"listener", "event", "epoch", "type", "message"}`` per listener call that raised."""
        return list(self._events.errors)

    @property
    def listener_seconds(self) -> dict:
        """Event name -> seconds the listeners took on the driver (all fits of this trainer)."""
        return dict(self._events.seconds)

    # ------------------------------------------------------------------- fit
    def fit(self, data, epochs: int = 1, *, resume_from: Optional[str] = None, validation_data=None,
            early_stopping=None, metrics: Optional[Sequence[str]] = None, overwrite_checkpoints: bool = False):
        """Train for ``epochs`` epochs, or until ``early_stopping`` ends the run.

        Parameters
        ----------
        data : RDD of (features, label) pairs or of (x, y) minibatches, or DataFrame
        epochs : int
            Epochs to train; with ``resume_from``, the TOTAL epoch target (a
            fit of 5 epochs stopped after 2 resumes with the remaining 3).
        resume_from : str, optional
            A checkpoint folder, or a checkpoint_dir (its newest complete
            checkpoint).  The checkpoint's architecture and master
            configuration must be the trainer's; its run is continued.
        validation_data : optional
            Evaluated after every epoch (not counted in training time):
            ``val_loss`` and ``val_<metric>`` land in ``trainer.history``.
        early_stopping : sparkavg.fitting.early_stopping.EarlyStopping, optional
            When to stop early; the best epoch (:mod:`sparkavg.fitting`).
        metrics : list of str, optional
            Validation metrics (:mod:`sparkavg.fitting.metrics`): ``["f1", "auc"]``.
        overwrite_checkpoints : bool, default False
            Let a fresh fit replace another run's checkpoints in
            ``checkpoint_dir``: they are deleted before its first epoch (none
            of the old run's epochs is left to resume).

        Returns
        -------
        History
            ``history``, ``best_epoch``, ``stop_reason`` (:class:`~sparkavg.fitting.History`).

        Raises
        ------
        RuntimeError
            Another thread is already in ``fit`` on this trainer (its
            bookkeeping and minibatches are one fit's).

        Notes
        -----
        A fit that fails in an epoch -- a bad row a streamed epoch reaches
        after some of its rounds were merged, a lost worker with no retry
        left, a divergence -- leaves the model as that epoch found it: its
        state before the fit, or at the end of the fit's last completed
        epoch (what that epoch's checkpoint holds), with ``epochs_done``
        and ``history`` to match.  The log and a note on the exception say
        which.  A cancelled fit (:meth:`cancel`) keeps its completed rounds.
        """
        if not self._fitting.acquire(blocking=False):
            raise RuntimeError(f"Expect one fit at a time on a trainer, got a second concurrent fit (thread "
                               f"{self._fitting_thread!r} is fitting); use one SparkTrainer per thread")
        try:
            self._fitting_thread = threading.current_thread().name
            self._epoch_running = None
            self._runner.cancel_request.clear()
            try:
                with release_on_sigterm(release_live_locations), \
                        self.seam.watch_cancels(self._runner.cancel_request.set):
                    return self._fit(data, epochs, resume_from=resume_from, validation_data=validation_data,
                                     tracker=FitTracker.of(self, early_stopping, metrics, validation_data),
                                     overwrite=bool(overwrite_checkpoints))
            except BaseException as exc:
                self._emit_failure(exc, recovered=False)
                raise
        finally:
            self._fitting_thread = None
            self._fitting.release()

    def cancel(self, reason: str = "SparkTrainer.cancel()") -> bool:
        """Stop the running fit at its next round boundary (from any thread).

        The round that runs finishes and is merged; the next one does not
        start, and ``fit`` raises :class:`~sparkavg.spark.TrainingCancelled`
        naming ``reason``.  The model then holds the state of the last
        completed round (under gradient sharing, and for averaging's rounds
        inside one barrier stage, a round is a whole epoch);
        the checkpoints are those of the epochs completed before.  A
        ``sc.cancelAllJobs()`` (or ``cancelJobGroup`` of the fit's group,
        ``cancelJobsWithTag`` of one of its tags; ``interruptAll`` /
        ``interruptTag`` on Spark Connect) made in this driver process while
        a fit runs also stops it: at once when it cancels a running job,
        else at the next round boundary.

        Returns
        -------
        bool
            Whether a fit was running (none: nothing happens).
        """
        if self._fitting_thread is None:
            return False
        self._runner.cancel_request.set(reason)
        return True

    def request_stop(self, reason: str = "request_stop()") -> bool:
        """End the running fit after the epoch in flight, which finishes as usual; ``fit`` returns with
        ``stop_reason`` ``"listener"`` (:mod:`sparkavg.listeners.base`).  Whether a fit was running."""
        if self._fitting_thread is not None:
            self._events.stop_request = str(reason)
        return self._fitting_thread is not None

    def _emit_failure(self, exc: BaseException, recovered: bool) -> None:
        epoch = self._epoch_running
        self._events.emit("failure", {"epoch": None if epoch is None else epoch + 1, "error": exc,
                                      "message": str(exc), "type": type(exc).__name__, "recovered": recovered})

    def _fit(self, data, epochs: int, *, resume_from: Optional[str], validation_data, tracker: FitTracker,
             overwrite: bool):
        fit_started = time.perf_counter()
        if not isinstance(epochs, int) or isinstance(epochs, bool) or epochs < 1:
            raise ValueError(f"Expect epochs >= 1 (an int), got {epochs!r}")
        self.master.validate_for(self.workers)
        self._runner.check_model(self.network)  # before any job: what the master cannot train
        if resume_from is not None:
            found, saved, runner_state = ckpt_io.find_resumable(
                resume_from, network=self.network, master=self.master.to_config(), epochs=epochs,
                check=self._runner.check_state_dict)
            self._restore(found, saved, runner_state)
            tracker.resume(found)
            logger.info("resuming %s; %d epoch(s) to go", found.describe(), epochs - self.epochs_done)
        elif self.checkpoint_dir and not overwrite:
            ckpt_io.check_fresh(self.checkpoint_dir, self.run_id)
        elif self.checkpoint_dir:  # overwrite: the old run's later epochs must not be resumed by mistake
            ckpt_io.remove_other_runs(self.checkpoint_dir, self.run_id)
        target = epochs if resume_from is not None else self.epochs_done + epochs
        prepared = self._prepare(data)
        if self._events.wants("fit_start"):
            self._events.emit("fit_start", {
                "run_id": self.run_id, "epochs": target, "epochs_done": self.epochs_done,
                "resumed": resume_from is not None, "workers": self.workers, "master": self.master.to_config(),
                "network": self.network.to_config(), "num_params": int(self.network.num_params),
                "examples": int(prepared.examples), "minibatches": len(prepared.sizes)})
        self.seam.begin_fit()
        recoveries, first_epoch = 0, self.epochs_done
        stop = tracker.done_before_start(self.epochs_done)
        while self.epochs_done < target and not stop:
            epoch = self._epoch_running = self.epochs_done
            snapshot = self._snapshot()  # restored when the epoch fails (or diverges, under Recover)
            t0 = time.perf_counter()
            try:
                summary = self._runner.run_epoch(self.network, prepared, epoch, self.workers, self.stats)
                if not math.isfinite(summary["loss"]):
                    raise DivergenceError(f"training diverged: the loss of epoch {epoch + 1} is {summary['loss']}")
            except TrainingCancelled as exc:
                kept = (f"the checkpoint of epoch {epoch} in {self.checkpoint_dir!r} is intact (resume_from it)"
                        if self.checkpoint_dir and epoch > 0 else "there is no checkpoint of an earlier epoch")
                logger.warning("fit cancelled in epoch %d: %s", epoch + 1, kept)
                raise TrainingCancelled(f"{exc}; the fit stopped in epoch {epoch + 1}: {kept}") from exc.__cause__
            except DivergenceError as exc:
                if self.recover is None or recoveries >= self.recover.max_recoveries:
                    self._restore_failed(snapshot, exc, epoch, first_epoch)
                    if tracker.diverged(exc, epoch):  # early stopping: an invalid score ends the run
                        break
                    raise
                recoveries += 1
                self._emit_failure(exc, recovered=True)
                self._recover(snapshot, exc, epoch)
                continue
            except Exception as exc:  # rounds of the epoch may be merged already: none of them is kept
                self._restore_failed(snapshot, exc, epoch, first_epoch)
                raise
            seconds = time.perf_counter() - t0
            self.stats.record(Phase.EPOCH, t0, t0 + seconds, epoch=epoch)
            self.network.epoch = epoch + 1
            entry = {"epoch": epoch + 1, "seconds": seconds,
                     "examples_per_second": summary["examples"] / max(seconds, 1e-9), **summary}
            self.history.append(entry)
            evaluations = path = None
            if self.checkpoint_dir:  # before validation: a failing validation pass loses no trained epoch
                with self.stats.timed(Phase.CHECKPOINT, epoch=epoch):
                    path = ckpt_io.save_checkpoint(self.checkpoint_dir, self.network, run_id=self.run_id,
                                                   epochs_done=epoch + 1, target_epochs=target,
                                                   master=self.master.to_config(), extra={"history": self.history},
                                                   runner_state=self._runner.state_dict())
                self._checkpointed = (path, epoch + 1)
                self._events.emit("checkpoint", {"epoch": epoch + 1, "path": path})
            if validation_data is not None:
                with self.stats.timed(Phase.EVALUATE, epoch=epoch):
                    evaluations = self.evaluate(validation_data, tracker.evaluations())
            stop = tracker.end_epoch(entry, evaluations, target, path, lambda: self._snapshot()[0])
        self._epoch_running = None
        history = tracker.finish(self.network, self.history)
        summary_text = self.stats.summary()
        logger.info("%s", summary_text)
        self._events.emit("fit_end", {"run_id": self.run_id, "epochs_done": self.epochs_done,
                                      "seconds": time.perf_counter() - fit_started, "history": self.history,
                                      "summary": summary_text, "best_epoch": history.best_epoch,
                                      "stop_reason": history.stop_reason})
        return history

    def _snapshot(self) -> tuple:
        """Host copies of the network's state vectors (in its own dtype), its
        iteration and epoch, and the runner's state: what :meth:`_load_snapshot` restores."""
        net = self.network
        live = net.state
        vectors = {k: np.array(to_cpu(live[k]), copy=True) for k in ("params", "updater", "buffers")}
        return vectors, net.iteration, net.epoch, self._runner.state_dict()

    def _load_snapshot(self, snapshot: tuple) -> None:
        vectors, iteration, epoch, runner_state = snapshot
        net = self.network
        net.load_state(vectors)
        net.iteration, net.epoch = iteration, epoch
        self._runner.load_state_dict(runner_state)

    def _restore_failed(self, snapshot: tuple, exc: BaseException, epoch: int, first_epoch: int) -> None:
        """After a failed epoch: the network and runner as they were when it
        started -- before the fit, or at the end of the fit's last completed
        epoch (its checkpoint's state) --, said in the log and in a note on ``exc``."""
        if epoch == first_epoch:
            where = "its state before the fit" + (f", at the end of epoch {epoch}" if epoch else "")
        else:
            where = f"its state at the end of epoch {epoch}"
        if epoch and self._checkpointed is not None and self._checkpointed[1] == epoch:
            where += f" (as its checkpoint {self._checkpointed[0]!r} holds)"
        try:
            self._load_snapshot(snapshot)
        except Exception as err:  # pragma: no cover - a model that refuses its own state
            logger.error("the fit failed in epoch %d (%s) and the model could not be restored to %s: %s",
                         epoch + 1, exc, where, err)
            return
        note = f"sparkavg: the fit failed in epoch {epoch + 1}; the model was restored to {where}"
        logger.warning("%s: %s", note, exc)
        if hasattr(exc, "add_note"):  # Python 3.11+: shown with the traceback
            exc.add_note(note)

    def _recover(self, snapshot, exc, epoch: int) -> None:
        self._load_snapshot(snapshot)
        net = self.network
        old = net.updater.learning_rate
        new = old * self.recover.lr_factor
        # a schedule keeps its shape: its scale changes so that its base rate is the new one
        net.updater = net.updater.with_learning_rate(new)
        what = "learning rate" if net.updater.schedule is None else "base learning rate of the schedule"
        self.stats.decision("learning_rate", new, f"epoch {epoch + 1} diverged ({exc}); restored the epoch's "
                            f"starting state, {what} {old:.3g} -> {new:.3g}", epoch=epoch)
        logger.warning("epoch %d diverged (%s): restored its starting state, %s %.3g -> %.3g, "
                       "training it again", epoch + 1, exc, what, old, new)

    def _restore(self, found, saved, runner_state: dict) -> None:
        """Load a checkpoint (loaded and checked whole by ``find_resumable``)
        INTO the trainer's own network object and runner: all of it, or --
        when something still fails -- nothing."""
        net = self.network
        before = self._snapshot()
        try:
            net.load_state({k: saved.state[k] for k in ("params", "updater", "buffers")})
            net.iteration = saved.iteration
            net.epoch = found.epochs_done
            self._runner.load_state_dict(runner_state)
        except BaseException:
            self._load_snapshot(before)
            raise
        self.run_id = found.run_id
        self.history[:] = found.extra.get("history", [])
        self._checkpointed = (found.directory, found.epochs_done)

    # ------------------------------------------------------- evaluate/predict
    def _inference(self, what: str, make, combine, data):
        shipped = self.seam.ship(network_state(self.network, with_updater=False))
        try:
            task = make(shipped)
            result = self.seam.aggregate_examples(data, task, combine, self._features_for(data), self.label_col,
                                                  what)
        finally:
            shipped.destroy()
        raise_failures(result, what)
        return result

    def evaluate(self, data, evaluations: Optional[Sequence] = None):
        """Distributed evaluation in one pass over ``data``.

        Each partition fills fresh copies of ``evaluations`` (default: one
        :class:`Evaluation`, or :class:`RegressionEvaluation` for MSE nets);
        ``treeAggregate`` merges them.  Returns one evaluation, or a list
        when ``evaluations`` is given.  Raises ``ValueError`` on data with
        no example.
        """
        single = evaluations is None
        evals = [default_evaluation(self.spec)] if single else list(evaluations)
        rebatch = rebatch_partition(self.spec, self.eval_batch_size)
        config = self.network.to_json()
        encoding, device = input_encoding(self.master.data), self.master.device.value
        merged = self._inference("evaluation", lambda s: make_evaluator(config, s, evals, rebatch, encoding, device),
                                 merge_evaluations, data)
        if merged is None or merged[0].count == 0:
            raise ValueError("Expect data with at least one example to evaluate, got none")
        return merged[0] if single else merged

    def score(self, data) -> float:
        """Mean loss over every example of ``data``."""
        rebatch = rebatch_partition(self.spec, self.eval_batch_size)
        config = self.network.to_json()
        encoding, device = input_encoding(self.master.data), self.master.device.value
        result = self._inference("scoring", lambda s: make_scorer(config, s, rebatch, encoding, device), add_scores,
                                 data)
        if result is None or result[1] == 0:
            raise ValueError("Expect data with at least one example to score, got none")
        return result[0] / result[1]

    def predict(self, data):
        """Distributed inference, never collected to the driver.

        Classic sessions: an RDD of output rows.  Rows ``(key, features)``
        give ``(key, output)`` (RDDs are unordered, keys say which is which);
        bare feature arrays give outputs in the partition order; a DataFrame
        uses ``features_col``.  Spark Connect (DataFrames only): the input
        DataFrame with an ``output`` column (``array<float>``).  Tasks run
        the network where they train (the master's ``device``).

        The shipped parameters live as long as the returned RDD (an RDD
        derived from it refers to it): they are released when it is
        garbage-collected or by :meth:`close`, not when the trainer is.
        On Connect they travel inside the DataFrame's plan.  A DataFrame
        built from the RDD (``createDataFrame``) does not keep it: keep the
        RDD while such a DataFrame is computed.
        """
        shipped = self.seam.ship(network_state(self.network, with_updater=False))
        try:
            result = self.seam.map_features(
                data, make_predict_fn(self.network.to_json(), shipped, self.eval_batch_size,
                                      input_encoding(self.master.data), self.master.device.value),
                self._features_for(data))
        except BaseException:
            SparkTrainer._destroy_shipped(shipped)
            raise
        self._predictions = [f for f in self._predictions if f.alive]
        self._predictions.append(weakref.finalize(result, SparkTrainer._destroy_shipped, shipped))
        return result
