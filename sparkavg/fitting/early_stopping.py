"""Early stopping: end a fit when its monitored value stops improving, and keep its best epoch.

:class:`EarlyStopping` is what a user chooses (``fit(...,
early_stopping=EarlyStopping(patience=3))``, ``NetworkEstimator(earlyStopping=...)``);
:class:`Monitor` is the rule a fit runs with it: after every epoch
``decide`` says whether to stop and why, and which epoch is the best so
far; its ``state_dict`` travels in the fit's checkpoints, so a resumed
run goes on counting where it stopped.  The terminations are DL4J's
(``EarlyStoppingConfiguration``):

==================  ==============================================================
reason              when
==================  ==============================================================
``no_improvement``  ``patience`` epochs in a row did not improve on the best value
                    by more than ``min_delta`` (``patience=0``: the first that did not)
``max_epochs``      the model has trained ``max_epochs`` epochs (in all, a resumed
                    run's earlier epochs included)
``max_seconds``     the run has taken ``max_seconds`` (training and validation, a
                    resumed run's earlier fits included), checked at epoch ends
``invalid_score``   the training loss or the monitored value is NaN or infinite
                    (the diverged epoch is not kept)
``listener``        a listener asked the fit to stop (``trainer.request_stop``)
==================  ==============================================================

Every check runs when an epoch has ended (checkpointed and validated):
the epoch in flight always finishes.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Tuple

from ..configurable import Configurable, register
from .metrics import LOSS, VALIDATION_PREFIX, higher_is_better, monitor_names

__all__ = ["EarlyStopping", "Monitor", "STOP_REASONS"]

#: Why a fit stopped before its last epoch (see the module's table).
STOP_REASONS = ("no_improvement", "max_epochs", "max_seconds", "invalid_score", "listener")


def _int_at_least(minimum: int) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, numbers.Integral) and not isinstance(v, bool) and v >= minimum


def _real(positive: bool) -> Callable[[Any], bool]:
    return lambda v: (isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)
                      and (v > 0 if positive else v >= 0))


#: Each field's constraint and how it is named in the error, checked by :func:`_check_fields` alone.
_CONSTRAINTS: Dict[str, Tuple[Callable[[Any], bool], str]] = {
    "monitor": (lambda v: isinstance(v, str) and v in monitor_names(),
                f"one of {monitor_names()}"),
    "mode": (lambda v: v in ("min", "max"), "'min' or 'max' (None: from the monitor)"),
    "patience": (_int_at_least(0), "an int >= 0"),
    "min_delta": (_real(positive=False), "a finite float >= 0"),
    "restore_best": (lambda v: isinstance(v, bool), "a bool"),
    "max_epochs": (lambda v: v is None or _int_at_least(1)(v), "None or an int >= 1"),
    "max_seconds": (lambda v: v is None or _real(positive=True)(v), "None or a finite float > 0"),
}


def _check_fields(obj) -> None:
    for name, (ok, expected) in _CONSTRAINTS.items():
        value = getattr(obj, name)
        if not ok(value):
            raise ValueError(f"Expect EarlyStopping.{name} to be {expected}, got {type(value).__name__} "
                             f"{value!r:.80}")


@register("early_stopping")
@dataclass(frozen=True)
class EarlyStopping(Configurable):
    """When a fit stops before its last epoch, and whether it ends on its best epoch.

    Parameters
    ----------
    monitor : str, default "val_loss"
        The history value watched after every epoch: ``"val_loss"`` or
        ``"val_<metric>"`` (:mod:`sparkavg.fitting.metrics`; the metric is
        computed even when ``metrics=`` does not name it) -- both need
        validation data -- or ``"loss"``, the training loss.
    mode : {"min", "max"}, optional
        Whether lower or higher is better; by default from the monitor
        (``max`` for accuracy, F1, AUC and R², ``min`` for losses and errors).
    patience : int, default 3
        Epochs in a row without improvement that end the fit (0: the first).
    min_delta : float, default 0.0
        What counts as an improvement: better than the best by more than this.
    restore_best : bool, default True
        At the end of the fit, put the best epoch's state (parameters,
        updater state, buffers) back into the model: from its checkpoint
        with a ``checkpoint_dir``, else from a copy kept in driver memory.
        The model's epoch counter still says how many epochs were trained.
    max_epochs : int, optional
        End the fit once the model has trained this many epochs in all.
    max_seconds : float, optional
        End the fit at the first epoch end after this many seconds of the
        run (a resumed run counts its earlier fits).
    """

    monitor: str = "val_loss"
    mode: Optional[str] = None
    patience: int = 3
    min_delta: float = 0.0
    restore_best: bool = True
    max_epochs: Optional[int] = None
    max_seconds: Optional[float] = None

    def __post_init__(self):
        if self.mode is None and isinstance(self.monitor, str):
            object.__setattr__(self, "mode", "max" if higher_is_better(self.monitor) else "min")
        _check_fields(self)

    @property
    def needs_validation(self) -> bool:
        """Whether the monitor is a validation value (``val_...``)."""
        return self.monitor.startswith(VALIDATION_PREFIX)

    @property
    def metric(self) -> Optional[str]:
        """The validation metric the monitor names (None for the losses)."""
        if not self.needs_validation or self.monitor == VALIDATION_PREFIX + LOSS:
            return None
        return self.monitor[len(VALIDATION_PREFIX):]


def _finite(value) -> bool:
    return isinstance(value, numbers.Real) and math.isfinite(value)


class Monitor:
    """The rule of one fit: the best epoch of ``monitor`` so far and, with an
    :class:`EarlyStopping`, whether to stop (``decide -> (reason, why)``).

    Parameters
    ----------
    config : EarlyStopping, optional
        None: only the best epoch is tracked (of ``monitor``); nothing stops.
    monitor : str, optional
        What to track without a config (``val_loss`` or ``loss``).
    """

    def __init__(self, config: Optional[EarlyStopping] = None, monitor: str = LOSS):
        self.config = config
        self.monitor = config.monitor if config is not None else monitor
        self.mode = config.mode if config is not None else ("max" if higher_is_better(monitor) else "min")
        self.best_epoch: Optional[int] = None
        self.best_value: Optional[float] = None
        self.wait = 0
        self.seconds = 0.0

    def _better(self, value: float) -> bool:
        if self.best_value is None:
            return True
        delta = self.config.min_delta if self.config is not None else 0.0
        return value < self.best_value - delta if self.mode == "min" else value > self.best_value + delta

    def observe(self, epoch: int, value) -> bool:
        """Note epoch ``epoch``'s (from 1) monitored value; True when it is the new best.
        A missing or non-finite value is no improvement."""
        if _finite(value) and self._better(float(value)):
            self.best_epoch, self.best_value, self.wait = epoch, float(value), 0
            return True
        self.wait += 1
        return False

    def decide(self, epoch: int, value, epochs_trained: int, seconds: float) -> Tuple[Optional[str], str]:
        """After epoch ``epoch`` (from 1) whose monitored value is ``value``:
        ``(reason, why)``, reason one of :data:`STOP_REASONS` or None to go on.

        ``epochs_trained``: the model's epochs in all; ``seconds``: the run's so far."""
        self.observe(epoch, value)
        self.seconds = float(seconds)
        return self.verdict(epochs_trained, value)

    def verdict(self, epochs_trained: int, value=None) -> Tuple[Optional[str], str]:
        """Whether the state as it is ends the run (a resumed run asks before
        its first epoch); ``value``, when given, is checked finite."""
        c = self.config
        if c is None:
            return None, ""
        if value is not None and not _finite(value):
            return "invalid_score", f"{self.monitor} is {value}"
        if self.wait > 0 and self.wait >= c.patience:
            since = (f"improved on {self.best_value:.6g} (epoch {self.best_epoch}) by more than {c.min_delta:g}"
                     if self.best_epoch else "had a finite value")
            return "no_improvement", f"{self.monitor} has not {since} for {self.wait} epoch(s), patience {c.patience}"
        if c.max_epochs is not None and epochs_trained >= c.max_epochs:
            return "max_epochs", f"the model has trained {epochs_trained} epoch(s), max_epochs {c.max_epochs}"
        if c.max_seconds is not None and self.seconds >= c.max_seconds:
            return "max_seconds", f"the run has taken {self.seconds:.1f} s, max_seconds {c.max_seconds:g}"
        return None, ""

    def state_dict(self) -> dict:
        """JSON-ready state: what a checkpoint keeps."""
        return {"monitor": self.monitor, "mode": self.mode, "best_epoch": self.best_epoch,
                "best_value": self.best_value, "wait": self.wait, "seconds": self.seconds}

    def load_state_dict(self, state: dict, history=()) -> None:
        """Continue from a checkpoint's :meth:`state_dict`; when it is missing
        or tracked another monitor, the state is rebuilt from the run's
        ``history`` entries (the checkpoint's)."""
        if isinstance(state, dict) and state.get("monitor") == self.monitor and state.get("mode") == self.mode:
            best = state.get("best_value")
            epoch = state.get("best_epoch")
            self.best_value = float(best) if _finite(best) else None
            self.best_epoch = int(epoch) if isinstance(epoch, int) and self.best_value is not None else None
            self.wait = int(state.get("wait", 0)) if _int_at_least(0)(state.get("wait", 0)) else 0
            self.seconds = float(state["seconds"]) if _real(False)(state.get("seconds")) else 0.0
            return
        self.best_epoch = self.best_value = None
        self.wait, self.seconds = 0, 0.0
        for entry in history:
            if isinstance(entry, dict) and isinstance(entry.get("epoch"), int):
                self.observe(entry["epoch"], entry.get(self.monitor))
                self.seconds += float(entry.get("seconds", 0.0)) if _finite(entry.get("seconds")) else 0.0
