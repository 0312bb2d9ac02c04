"""Threshold and residual state of one gradient-sharing worker.

The codec is :func:`sparkavg.ops.encode` / :func:`sparkavg.ops.decode`;
this small object holds what changes between messages (after
torch's PowerSGDState): τ, the residual post-processing schedule and the
statistics of what was sent.  It crosses epochs as plain values.
"""
from __future__ import annotations

import numpy as np

from .. import ops
from .config import AdaptiveThreshold, FixedThreshold, ResidualClipping, TargetSparsityThreshold

__all__ = ["ThresholdState"]


class ThresholdState:
    """τ and its update rule for one worker.

    Attributes are grouped: set by user (``algorithm``, ``clipping``);
    internal (``tau``, ``iteration``); statistics (``last_sparsity``).
    Message counts live in :class:`sparkavg.ops.EncodingState`.
    """

    __slots__ = (
        # set by user
        "algorithm", "clipping",
        # internal
        "tau", "iteration",
        # statistics
        "last_sparsity",
    )

    def __init__(self, algorithm, clipping: ResidualClipping | None):
        self.algorithm = algorithm
        self.clipping = clipping
        if isinstance(algorithm, FixedThreshold):
            self.tau = float(algorithm.threshold)
        else:
            self.tau = float(algorithm.initial)
        self.iteration = 0
        self.last_sparsity = 0.0

    def after_step(self, entries: int, n: int, residual: np.ndarray) -> None:
        """Account for one step that sent ``entries`` of ``n`` values, adapt τ,
        and clip the residual when the post-processor is due."""
        self.iteration += 1
        sparsity = entries / n if n else 0.0
        self.last_sparsity = sparsity
        alg = self.algorithm
        if isinstance(alg, AdaptiveThreshold):
            if sparsity < alg.min_sparsity:
                self.tau *= alg.decay  # too sparse: lower τ
            elif sparsity > alg.max_sparsity:
                self.tau /= alg.decay  # too dense: raise τ
        elif isinstance(alg, TargetSparsityThreshold):
            self.tau = self.tau * alg.decay if sparsity < alg.target else self.tau / alg.decay
        if self.clipping is not None and self.iteration % self.clipping.frequency == 0:
            ops.clip_residual(residual, self.tau, self.clipping.k)

    def to_plain(self) -> dict:
        return {"tau": self.tau, "iteration": self.iteration, "last_sparsity": self.last_sparsity}

    @classmethod
    def from_plain(cls, algorithm, clipping, plain: dict | None) -> "ThresholdState":
        state = cls(algorithm, clipping)
        if plain:
            state.tau = float(plain["tau"])
            state.iteration = int(plain["iteration"])
            state.last_sparsity = float(plain["last_sparsity"])
        return state
