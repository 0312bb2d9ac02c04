"""The moment correction of averaged updater state.

Each of ``K`` workers adds ``g^2`` of its own ``B``-example gradients to an
Adam-like second moment ``v``: ``E[g_B^2] = mu^2 + s^2 / B``, where one
process at ``K B`` examples per step adds ``mu^2 + s^2 / (K B)``.  The plain
average of the workers' ``v`` is therefore too large by ``(1 - 1/K) s^2 / B``
in the share of ``v`` written this round, and the steps ``m / sqrt(v)`` too
small: up to ``1/sqrt(K)`` where the noise dominates.  The workers' first
moments ``m`` started the round equal, so their spread is noise: its
variance across workers is ``c s^2 / B`` with ``c = (1 - b1) / (1 + b1) (1 -
b1^(2 F))`` after ``F`` steps, which gives the excess to take off the
round's share ``1 - b2^F`` of ``v``.  With few workers one coordinate's
spread is too noisy to use alone, so the excess is pooled per block (a
parameter tensor): each block keeps the fraction ``1 - excess / added`` of
what the round added to its ``v``, in ``[1/K, 1]``.

The updater says which slots these are through its sub-contract
(:attr:`~sparkavg.nn.updaters.Updater.roles`, ``slots``, ``decays``).
"""
from __future__ import annotations

from typing import Tuple

import numpy as np

from ...backend import get_array_module, to_cpu
from . import Policy

__all__ = ["MomentCorrection", "correct_second_moment"]


def correct_second_moment(updater, state, moment_sq, sent, workers: int, steps: int, blocks=None) -> None:
    """Correct the averaged second moment of ``workers`` workers in ``state`` in place.

    Parameters
    ----------
    updater : Updater
        With ``"first_moment"`` and ``"second_moment"`` slots (else nothing happens).
    state : ndarray
        The workers' average state; its second-moment slot is corrected.
    moment_sq : ndarray (n,)
        The workers' average of ``m * m`` (same weights).
    sent : ndarray
        The state every worker started the round from.
    workers, steps : int
        Workers averaged (nothing below 2); minibatches each fitted.
    blocks : list of (start, stop), optional
        Parameter ranges pooled together (default: all as one block).
    """
    n = moment_sq.shape[0]
    first, second = updater.slot("first_moment", n), updater.slot("second_moment", n)
    if first is None or second is None or workers < 2 or steps < 1 or n == 0:
        return
    decays = updater.decays()
    b1, b2 = decays[updater.roles["first_moment"]], decays[updater.roles["second_moment"]]
    xp = get_array_module(state)
    c = (1.0 - b1) / (1.0 + b1) * (1.0 - b1 ** (2 * steps))
    m, v = state[first], state[second]
    spread = xp.maximum(moment_sq - m * m, 0.0)  # the workers' variance of m (weighted, population)
    # (1 - 1/K) s^2/B from a population variance of K values: spread * K/(K-1) / c * (1 - 1/K) = spread / c
    excess = spread * ((1.0 - b2 ** steps) / c)
    added = xp.maximum(v - (b2 ** steps) * sent[second], 0.0)  # what this round wrote into v
    for start, stop in blocks or [(0, n)]:
        total = float(added[start:stop].sum())
        if total > 0.0:
            keep = min(1.0, max(1.0 / workers, 1.0 - float(excess[start:stop].sum()) / total))
            v[start:stop] -= (1.0 - keep) * added[start:stop]


class MomentCorrection(Policy):
    """Decision ``moment_correction``: whether an epoch's rounds correct the
    averaged updater state (off under preset ``"dl4j"``)."""

    name = "moment_correction"

    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self.on = False

    def choice(self, updater, workers: int, save_updater: bool) -> Tuple[bool, str]:
        """``(on, reason)`` without changing the running epoch's choice."""
        name = type(updater).__name__ if updater is not None else "the model's updater"
        roles = getattr(updater, "roles", {})
        if not self.enabled:
            return False, "preset 'dl4j': the workers' updater states are averaged plainly"
        if not save_updater:
            return False, "save_updater=False: no updater state is averaged"
        if "first_moment" not in roles or "second_moment" not in roles:
            return False, f"{name} keeps no second moment to correct: its state is averaged plainly"
        if workers < 2:
            return False, "one worker: its state is one process's"
        return True, (f"{name}'s averaged second moment is corrected to the second moment of the {workers} "
                      f"workers' combined batch, read from the spread of their first moments")

    def decide(self, updater, workers: int, save_updater: bool) -> Tuple[bool, str]:
        """The running epoch's choice (:meth:`choice`), kept in :attr:`on`."""
        self.on, why = self.choice(updater, workers, save_updater)
        return self.on, why

    @staticmethod
    def correct(network, result) -> None:
        """The averaged updater state of ``result`` (weighted sums, in place)
        corrected for the workers' gradient noise while ``network`` still
        holds the state the round started from; nothing without the
        workers' first-moment spread or with one worker."""
        workers = len(result.speeds)
        if result.state is None or getattr(result, "moment_sq", None) is None or workers < 2:
            return
        inv = 1.0 / result.weight
        state = result.state.astype(np.float64) * inv
        sent = np.asarray(to_cpu(network.state["updater"]), dtype=np.float64)
        segments = network.param_segments  # the contract's declared parameter tensors
        correct_second_moment(network.updater, state, result.moment_sq.astype(np.float64) * inv, sent, workers,
                              max(1, round(result.batches / workers)),
                              [(seg.start, seg.stop) for seg in segments] if segments else None)
        result.state[...] = state * result.weight
