"""TensorBoard event files from a fit (``pip install sparkavg[tensorboard]``).

Written with TensorBoard's own event-file writer
(``tensorboard.summary.writer``), no TensorFlow or PyTorch needed:

=================================  ======================  ============================
tag                                step                    what
=================================  ======================  ============================
``epoch/loss``,                    epoch (from 1)          the epoch's ``trainer.history``
``epoch/examples_per_second``,                             entry (``epoch/val_loss``,
``epoch/learning_rate``,                                   ``epoch/val_<metric>`` and
``epoch/seconds``, ``epoch/...``                           ``epoch/accuracy`` with validation
                                                           data)
``round/loss``,                    round of the fit        the ``round_end`` event
``round/round_loss``,              (from 1, across
``round/examples_per_second``,     epochs)
``round/seconds``
``params/<layer>.<name>``          epoch                   histogram of the layer's
                                                           parameters (``params`` when
                                                           the model has no segments)
``sharing/<series>``               epoch                   histogram of every sampled
                                                           threshold / sparsity /
                                                           residual-norm point
``sharing/<series>/<worker>``      iteration               the sampled points
=================================  ======================  ============================
"""
from __future__ import annotations

import logging
import os
import time
from typing import Optional

import numpy as np

from .base import TrainingListener

__all__ = ["TensorBoardListener"]

logger = logging.getLogger(__name__)

#: Histogram buckets.
BINS = 30


def _import_tensorboard():
    try:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import HistogramProto, Summary
        from tensorboard.summary.writer.event_file_writer import EventFileWriter
    except ImportError as exc:
        raise ImportError(f"TensorBoardListener needs tensorboard: pip install sparkavg[tensorboard] ({exc})") from exc
    return Event, HistogramProto, Summary, EventFileWriter


def _histogram(proto, values: np.ndarray):
    values = np.asarray(values, dtype=np.float64).ravel()
    values = values[np.isfinite(values)]
    if values.size == 0:
        return None
    counts, edges = np.histogram(values, bins=BINS)
    return proto(min=float(values.min()), max=float(values.max()), num=float(values.size), sum=float(values.sum()),
                 sum_squares=float(np.dot(values, values)), bucket_limit=edges[1:].tolist(),
                 bucket=counts.astype(np.float64).tolist())


class TensorBoardListener(TrainingListener):
    """Writes scalars per epoch and per round and histograms of the
    parameters and of the sharing threshold / sparsity to ``log_dir``.

    Parameters
    ----------
    log_dir : str or os.PathLike
        The run's folder (``tensorboard --logdir`` its parent); created if
        missing.  Each fit adds one event file.
    rounds : bool, default True
        Scalars per round.
    histograms : bool, default True
        Parameter histograms per epoch (a pass over the parameters on the
        driver) and sharing histograms.
    """

    def __init__(self, log_dir, *, rounds: bool = True, histograms: bool = True):
        if not isinstance(log_dir, (str, os.PathLike)) or not str(log_dir):
            raise ValueError(f"Expect log_dir as a folder path, got {log_dir!r}")
        self._proto = _import_tensorboard()  # fail at construction, not in the middle of a fit
        self.log_dir = os.fspath(log_dir)
        self.rounds, self.histograms = bool(rounds), bool(histograms)
        self._writer = None
        self._round_step = 0

    # ------------------------------------------------------------ writing
    def _add(self, step: int, values) -> None:
        Event, _, Summary, _ = self._proto
        if self._writer is None or not values:
            return
        self._writer.add_event(Event(wall_time=time.time(), step=int(step), summary=Summary(value=values)))

    def _scalar(self, tag: str, value: float):
        return self._proto[2].Value(tag=tag, simple_value=float(value))

    def _histo(self, tag: str, values) -> Optional[object]:
        histo = _histogram(self._proto[1], values)
        return None if histo is None else self._proto[2].Value(tag=tag, histo=histo)

    # ------------------------------------------------------------- events
    def on_fit_start(self, trainer, event: dict) -> None:
        self._close()
        os.makedirs(self.log_dir, exist_ok=True)
        self._writer = self._proto[3](self.log_dir)  # round steps go on across this listener's fits

    def on_round_end(self, trainer, event: dict) -> None:
        if not self.rounds:
            return
        self._round_step += 1
        self._add(self._round_step, [self._scalar(f"round/{key}", event[key])
                                     for key in ("loss", "round_loss", "examples_per_second", "seconds")])

    def on_sharing_progress(self, trainer, event: dict) -> None:
        values_by_step = {}
        for name, lanes in event["series"].items():
            everything = []
            for lane, points in lanes.items():
                for step, value in points:
                    values_by_step.setdefault(int(step), []).append(self._scalar(f"sharing/{name}/{lane}", value))
                    everything.append(value)
            if self.histograms:
                histo = self._histo(f"sharing/{name}", everything)
                if histo is not None:
                    self._add(event["epoch"], [histo])
        for step in sorted(values_by_step):
            self._add(step, values_by_step[step])

    def on_epoch_end(self, trainer, event: dict) -> None:
        scalars = [self._scalar(f"epoch/{key}", value) for key, value in event.items()
                   if key not in ("epoch", "target_epochs") and isinstance(value, (int, float))
                   and not isinstance(value, bool) and value is not None]
        self._add(event["epoch"], scalars)
        if self.histograms and trainer is not None:
            self._add(event["epoch"], self._parameter_histograms(trainer.network))
        if self._writer is not None:
            self._writer.flush()

    def _parameter_histograms(self, network) -> list:
        from ..backend import to_cpu

        params = np.asarray(to_cpu(network.state["params"]))
        segments = getattr(network, "param_segments", None) or []
        if not segments:
            return [h for h in [self._histo("params", params)] if h is not None]
        out = []
        for seg in segments:
            histo = self._histo(f"params/{seg.layer}.{seg.name}", params[seg.start:seg.stop])
            if histo is not None:
                out.append(histo)
        return out

    def on_fit_end(self, trainer, event: dict) -> None:
        self._close()

    def on_failure(self, trainer, event: dict) -> None:
        if not event["recovered"]:
            self._close()

    def _close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
