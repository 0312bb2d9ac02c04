"""Training events on the driver: :class:`TrainingListener` and the dispatcher the trainer owns.

A listener is any object with one or more ``on_<event>(trainer, event)``
methods (subclassing :class:`TrainingListener` is optional); ``trainer`` is
the :class:`~sparkavg.spark.SparkTrainer` and ``event`` a plain ``dict``
(a fresh copy per listener: changing it changes nothing else).  Listeners
run on the driver, in the thread that called ``fit``, never inside Spark
tasks.  A listener that raises is logged (with its traceback the first
time), recorded (:attr:`EventDispatcher.errors`, ``trainer.listener_errors``
and a ``listener_error`` decision in ``trainer.stats``) and the fit goes on
as if it had returned.

A listener may end the fit: ``trainer.request_stop(reason)`` from any
handler (Keras' ``model.stop_training = True``).  The epoch in flight
finishes as usual -- its rounds, checkpoint, validation and ``epoch_end``
-- and ``fit`` returns a history whose ``stop_reason`` is ``"listener"``;
the checkpoints are those of completed epochs, as after any fit.

Events and their payloads
-------------------------
Epochs and rounds count from 1 in every payload (as in ``trainer.history``).

``fit_start`` -- once per ``fit``, after the data is minibatched:
    ``run_id`` (str), ``epochs`` (int, the fit's epoch target),
    ``epochs_done`` (int, epochs trained before this fit), ``resumed``
    (bool), ``workers`` (int), ``master`` (dict, ``Master.to_config()``),
    ``network`` (dict, the network's configuration), ``num_params`` (int),
    ``examples`` and ``minibatches`` (int, of the training data).
``round_end`` -- after each merged round (parameter averaging: one per
    ``averaging_frequency`` minibatches; gradient sharing: one per epoch):
    ``epoch``, ``round``, ``rounds`` (int), ``loss`` (float, mean over the
    epoch so far), ``round_loss`` (float, mean over this round),
    ``examples`` (int, this epoch so far), ``round_examples`` (int),
    ``seconds`` (float, this round's wall time), ``examples_per_second``
    (float, this round's).
``sharing_progress`` -- after a round whose workers recorded sharing
    series (gradient sharing with ``collect_stats``): ``epoch``, ``round``
    (int) and ``series``: ``{name: {worker lane: [[iteration, value], ...]}}``
    for ``threshold``, ``sparsity`` and ``residual_norm``, each lane's
    points evenly sampled down to at most :data:`SAMPLED_POINTS`.  The
    points travel with the round's results: they arrive when the stage ends.
``epoch_end`` -- after each epoch (after its checkpoint and validation):
    the epoch's ``trainer.history`` entry -- ``epoch``, ``loss``,
    ``examples``, ``rounds``, ``seconds``, ``examples_per_second``,
    ``learning_rate``, with ``validation_data`` ``val_loss`` and
    ``val_<metric>`` (:mod:`sparkavg.fitting.metrics`; a classifier's
    ``val_accuracy`` also as ``accuracy``), and what the master adds
    (``averaging_frequency``, ``replica_max_abs_diff``) -- plus
    ``target_epochs`` (int) and ``decisions`` (list of the
    ``trainer.stats.decisions`` entries of this epoch).
``checkpoint`` -- after a checkpoint is written: ``epoch`` (int), ``path`` (str).
``failure`` -- when something goes wrong: ``epoch`` (int, the epoch being
    trained, or None before the first), ``error`` (the exception),
    ``message`` (str), ``type`` (str, the exception's class name) and
    ``recovered`` (bool: True for a diverged epoch that ``on_divergence=
    "recover"`` trains again; False when ``fit`` raises it, after this event).
``fit_end`` -- once per successful ``fit``: ``run_id`` (str),
    ``epochs_done`` (int), ``seconds`` (float, the fit's wall time),
    ``history`` (list of dict, every epoch's entry), ``summary`` (str,
    ``trainer.stats.summary()``), ``best_epoch`` (int or None) and
    ``stop_reason`` (str or None: why the fit ended early).
"""
from __future__ import annotations

import copy
import logging
import time
import weakref
from typing import Any, Iterable, List, Optional

__all__ = ["TrainingListener", "EventDispatcher", "EVENTS", "SAMPLED_POINTS", "sample_points"]

logger = logging.getLogger(__name__)

#: Every event a listener may handle, as ``on_<name>`` methods.
EVENTS = ("fit_start", "round_end", "sharing_progress", "epoch_end", "checkpoint", "failure", "fit_end")
#: Points per worker and series in a ``sharing_progress`` event at most.
SAMPLED_POINTS = 64
#: Errors kept in :attr:`EventDispatcher.errors` at most (the count goes on).
MAX_KEPT_ERRORS = 100


class TrainingListener:
    """Base class of driver-side listeners: every ``on_<event>`` does nothing.

    Override the events you need; payloads are documented in
    :mod:`sparkavg.listeners.base`.  One listener may serve several fits
    (e.g. the stages of a ``Pipeline``): open what it writes to in
    ``on_fit_start`` and flush or close it in ``on_fit_end`` / ``on_failure``.
    """

    def on_fit_start(self, trainer, event: dict) -> None:
        """The fit starts (data minibatched, nothing trained yet)."""

    def on_round_end(self, trainer, event: dict) -> None:
        """A round was merged into the network."""

    def on_sharing_progress(self, trainer, event: dict) -> None:
        """Sampled threshold / sparsity / residual series of a gradient-sharing round."""

    def on_epoch_end(self, trainer, event: dict) -> None:
        """An epoch is done (checkpointed and validated)."""

    def on_checkpoint(self, trainer, event: dict) -> None:
        """A checkpoint was written."""

    def on_failure(self, trainer, event: dict) -> None:
        """The fit failed (or an epoch diverged and is trained again)."""

    def on_fit_end(self, trainer, event: dict) -> None:
        """The fit finished."""


def _handles(listener, name: str) -> bool:
    method = getattr(listener, "on_" + name, None)
    if method is None:
        return False
    # A TrainingListener method left as it is does nothing: skip building its payload.
    return getattr(type(listener), "on_" + name, None) is not getattr(TrainingListener, "on_" + name)


def sample_points(points: list, limit: int = SAMPLED_POINTS) -> list:
    """At most ``limit`` of ``points``, evenly spaced, the first and last kept."""
    n = len(points)
    if n <= limit:
        return [list(p[:2]) for p in points]
    if limit == 1:
        return [list(points[-1][:2])]
    return [list(points[round(i * (n - 1) / (limit - 1))][:2]) for i in range(limit)]


class EventDispatcher:
    """Calls the listeners of one trainer; owned by the trainer (``trainer._events``).

    Parameters
    ----------
    listeners : iterable of objects with ``on_<event>`` methods
    owner : SparkTrainer, optional
        Passed to every listener call (held by a weak reference).

    Attributes
    ----------
    errors : list of dict
        ``{"listener", "event", "epoch", "type", "message"}`` per listener
        call that raised (the first :data:`MAX_KEPT_ERRORS`).
    error_count : int
        Every listener call that raised.
    seconds : dict
        Event name -> seconds spent in its listener calls (payloads included).
    """

    def __init__(self, listeners: Optional[Iterable[Any]] = (), owner=None):
        if listeners is None:
            listeners = ()
        if isinstance(listeners, (str, bytes)) or not hasattr(listeners, "__iter__"):
            raise TypeError(f"Expect listeners as a list of listener objects, got {type(listeners).__name__}")
        listeners = list(listeners)
        for listener in listeners:
            if not any(callable(getattr(listener, "on_" + name, None)) for name in EVENTS):
                raise TypeError(f"Expect a listener with one of the methods "
                                f"{', '.join('on_' + n for n in EVENTS)}, got {type(listener).__name__}")
        self.listeners: List[Any] = listeners
        self._owner = weakref.ref(owner) if owner is not None else (lambda: None)
        self._wanted = {name: [x for x in listeners if _handles(x, name)] for name in EVENTS}
        self.errors: List[dict] = []
        self.error_count = 0
        self.seconds = {name: 0.0 for name in EVENTS}
        self._reported = set()
        #: Why a listener asked the running fit to stop (``trainer.request_stop``), or None.
        self.stop_request: Optional[str] = None

    def __bool__(self) -> bool:
        return bool(self.listeners)

    def wants(self, name: str) -> bool:
        """Whether any listener handles event ``name`` (payloads are built only then)."""
        return bool(self._wanted[name])

    @property
    def shows_progress(self) -> bool:
        """Whether a listener draws progress (the runner's periodic log lines then stay quiet)."""
        return any(getattr(x, "shows_progress", False) for x in self.listeners)

    def emit(self, name: str, payload: dict) -> None:
        """Call ``on_<name>(trainer, copy of payload)`` on each listener that has it.

        A listener that raises is logged and recorded; the next one is still
        called and nothing is raised here.
        """
        wanted = self._wanted.get(name)
        if wanted is None:
            raise ValueError(f"Expect an event in {EVENTS}, got {name!r}")
        if not wanted:
            return
        start = time.perf_counter()
        trainer = self._owner()
        for listener in wanted:
            try:
                getattr(listener, "on_" + name)(trainer, self._copy(payload))
            except Exception as exc:
                self._failed(listener, name, payload, exc, trainer)
        self.seconds[name] += time.perf_counter() - start

    @staticmethod
    def _copy(payload: dict) -> dict:
        out = {}
        for key, value in payload.items():
            # Exceptions and other objects go as they are; containers are copied so no listener sees another's edits.
            out[key] = copy.deepcopy(value) if isinstance(value, (dict, list)) else value
        return out

    def _failed(self, listener, name: str, payload: dict, exc: Exception, trainer) -> None:
        who = type(listener).__name__
        epoch = payload.get("epoch")
        self.error_count += 1
        if len(self.errors) < MAX_KEPT_ERRORS:
            self.errors.append({"listener": who, "event": name, "epoch": epoch, "type": type(exc).__name__,
                                "message": str(exc)})
        first = (who, name) not in self._reported
        self._reported.add((who, name))
        logger.warning("listener %s raised in on_%s (%s: %s); the fit goes on without it for this event", who, name,
                       type(exc).__name__, exc, exc_info=exc if first else None)
        stats = getattr(trainer, "stats", None)
        if stats is not None:
            try:
                stats.decision("listener_error", who, f"on_{name} raised {type(exc).__name__}: {exc}; ignored",
                               epoch=epoch - 1 if isinstance(epoch, int) and epoch > 0 else None)
            except Exception:  # recording must never be what stops the fit
                logger.debug("could not record the listener error", exc_info=True)
