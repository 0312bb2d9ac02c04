"""Threshold rules and the residual post-processor of gradient sharing.

Each rule is a frozen dataclass registered in the one configuration
vocabulary (:mod:`sparkavg.configurable`) under the kind ``"threshold"``;
it owns its update: :meth:`ThresholdRule.initial_tau` gives the first τ and
:meth:`ThresholdRule.next_tau` the τ after a step that sent a given
fraction of the entries.  :func:`clip_when_due` is DL4J's residual
post-processor, always on at DL4J's values (every :data:`CLIP_EVERY`
iterations to ``±CLIP_K τ``): no user story sets it.

Validation happens in the constructors, so a rule that exists is one the
encoder accepts: every τ goes through :func:`check_tau`, which is
:func:`sparkavg.ops` 's own threshold check (τ travels as float32 bits)
plus one rule of ours -- τ must be a *normal* float32 (>= 1.2e-38), since
a subnormal τ is a symptom (τ adapted towards zero) and GPU kernels may
flush it to zero.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .. import ops
from ..configurable import Configurable, register
from ..ops._checks import check_threshold

__all__ = [
    "TAU_MIN",
    "TAU_MAX",
    "check_tau",
    "ThresholdRule",
    "FixedThreshold",
    "AdaptiveThreshold",
    "TargetSparsityThreshold",
    "CLIP_EVERY",
    "CLIP_K",
    "clip_when_due",
]

#: Smallest τ a rule produces or accepts: the smallest normal float32 (~1.18e-38).
TAU_MIN = float(np.finfo(np.float32).tiny)
#: Largest τ a rule produces or accepts: the largest float32 (~3.40e38).
TAU_MAX = float(np.finfo(np.float32).max)
#: The adaptive rules' step: τ halves (or doubles) in 20 steps (DL4J's).
DECAY = 0.5 ** (1.0 / 20.0)
#: DL4J's residual post-processor: every this many iterations the residual is clipped ...
CLIP_EVERY = 5
#: ... to ``[-CLIP_K τ, CLIP_K τ]`` (>= 1: below 1 the clip would take back entries not sent yet).
CLIP_K = 5.0

_TAU_RANGE = "a finite float32 > 0 (between 1.2e-38 and 3.4e38)"


def _real(name: str, value) -> float:
    """``value`` as a float; TypeError naming ``name`` for non-reals and bools."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"Expect {name} to be a real number, got {type(value).__name__} {value!r}")
    return float(value)


def check_tau(value, name: str = "threshold") -> float:
    """Check a threshold τ (or a rule's initial τ) and return it as a float.

    The value is returned unrounded (rules adapt τ in float64, as the
    executors always have); the encoder rounds it to float32 on every call.

    Parameters
    ----------
    value : real
        The threshold.
    name : str, default "threshold"
        Field name used in the error message.

    Returns
    -------
    float

    Raises
    ------
    TypeError
        ``value`` is not a real number (or is a bool).
    ValueError
        ``value`` is NaN, infinite, <= 0, or does not round to a normal
        float32 (1e-50 becomes 0, 1e39 becomes inf, 1e-40 is subnormal):
        "Expect threshold to be a finite float32 > 0 (between 1.2e-38 and
        3.4e38), got 1e-50".
    """
    tau = _real(name, value)
    try:
        tau32 = check_threshold(tau)  # the encoder's own rule: finite, > 0, float32-representable
    except ValueError:
        raise ValueError(f"Expect {name} to be {_TAU_RANGE}, got {value!r}") from None
    if tau32 < TAU_MIN:
        raise ValueError(f"Expect {name} to be {_TAU_RANGE}, got {value!r} (a subnormal float32)")
    return tau


def _fraction(name: str, value, *, closed_right: bool) -> float:
    v = _real(name, value)
    ok = 0.0 < v <= 1.0 if closed_right else 0.0 < v < 1.0
    if not ok:
        raise ValueError(f"Expect {name} in (0, 1{']' if closed_right else ')'}, got {value!r}")
    return v


class ThresholdRule(Configurable):
    """Base of the threshold rules: a first τ and an update per step.

    Subclasses implement :meth:`initial_tau` and :meth:`_update`;
    :meth:`next_tau` keeps the result inside ``[TAU_MIN, TAU_MAX]`` so that
    τ stays a valid encoder threshold however long a rule keeps lowering or
    raising it (a worker whose updates are all zero sends nothing and
    would otherwise drive τ to 0 within a few thousand steps).
    """

    _config_kind = "threshold"  # a field annotated ThresholdRule rebuilds from this registry

    def initial_tau(self) -> float:
        """τ of the first step (float)."""
        raise NotImplementedError

    def _update(self, tau: float, sparsity: float) -> float:
        raise NotImplementedError

    def next_tau(self, tau: float, sparsity: float) -> float:
        """τ for the next step.

        Parameters
        ----------
        tau : float
            τ of the step just taken.
        sparsity : float
            Fraction of the entries that step sent, ``entries / N`` in [0, 1].

        Returns
        -------
        float
            The new τ, clamped to ``[TAU_MIN, TAU_MAX]``.
        """
        return min(max(self._update(tau, sparsity), TAU_MIN), TAU_MAX)


@register("threshold")
@dataclass(frozen=True)
class FixedThreshold(ThresholdRule):
    """A constant threshold τ (DL4J's ``updatesThreshold(1e-3)``).

    Parameters
    ----------
    threshold : float, default 1e-3
        τ; a finite normal float32 > 0.
    """

    threshold: float = 1e-3

    def __post_init__(self):
        object.__setattr__(self, "threshold", check_tau(self.threshold, "threshold"))

    def initial_tau(self) -> float:
        return self.threshold

    def _update(self, tau: float, sparsity: float) -> float:
        return tau


@register("threshold")
@dataclass(frozen=True)
class AdaptiveThreshold(ThresholdRule):
    """DL4J's default rule: keep τ while the last step's sparsity is inside
    ``[min_sparsity, max_sparsity]``; below it (too sparse) multiply τ by
    :data:`DECAY`, above it (too dense) divide τ by it.

    Parameters
    ----------
    initial : float, default 1e-4
        First τ; a finite normal float32 > 0.
    min_sparsity : float, default 1e-4
        Lower end of the accepted fraction of entries sent, in (0, 1].
    max_sparsity : float, default 1e-2
        Upper end, ``min_sparsity < max_sparsity <= 1``.
    """

    initial: float = 1e-4
    min_sparsity: float = 1e-4
    max_sparsity: float = 1e-2
    decay: ClassVar[float] = DECAY

    def __post_init__(self):
        object.__setattr__(self, "initial", check_tau(self.initial, "initial"))
        lo = _fraction("min_sparsity", self.min_sparsity, closed_right=True)
        hi = _fraction("max_sparsity", self.max_sparsity, closed_right=True)
        if not lo < hi:
            raise ValueError(f"Expect 0 < min_sparsity < max_sparsity <= 1, got min_sparsity={self.min_sparsity!r}, "
                             f"max_sparsity={self.max_sparsity!r}")
        object.__setattr__(self, "min_sparsity", lo)
        object.__setattr__(self, "max_sparsity", hi)

    def initial_tau(self) -> float:
        return self.initial

    def _update(self, tau: float, sparsity: float) -> float:
        if sparsity < self.min_sparsity:
            return tau * self.decay  # too sparse: lower τ
        if sparsity > self.max_sparsity:
            return tau / self.decay  # too dense: raise τ
        return tau


@register("threshold")
@dataclass(frozen=True)
class TargetSparsityThreshold(ThresholdRule):
    """Steer τ so that about ``target`` of the entries are sent each step:
    below the target multiply τ by :data:`DECAY`, at or above it divide.

    Parameters
    ----------
    initial : float, default 1e-3
        First τ; a finite normal float32 > 0.
    target : float, default 1e-3
        Wanted fraction of entries sent per step, in (0, 1).
    """

    initial: float = 1e-3
    target: float = 1e-3
    decay: ClassVar[float] = DECAY

    def __post_init__(self):
        object.__setattr__(self, "initial", check_tau(self.initial, "initial"))
        object.__setattr__(self, "target", _fraction("target", self.target, closed_right=False))

    def initial_tau(self) -> float:
        return self.initial

    def _update(self, tau: float, sparsity: float) -> float:
        return tau * self.decay if sparsity < self.target else tau / self.decay


def clip_when_due(residual, tau: float, iteration: int, every: int = CLIP_EVERY, k: float = CLIP_K) -> bool:
    """DL4J's residual post-processor: after iterations ``every, 2*every, ...``
    clip ``residual`` in place to ``[-k*float32(τ), k*float32(τ)]``.

    Parameters
    ----------
    residual : float32 1-D array (numpy or CuPy), C-contiguous
    tau : float
        The current τ.
    iteration : int
        Steps completed, counting the one just taken.
    every : int, default :data:`CLIP_EVERY`
    k : float, default :data:`CLIP_K`

    Returns
    -------
    bool
        Whether the residual was clipped.
    """
    if iteration % every:
        return False
    ops.clip_residual(residual, tau, k)
    return True
