"""The moment correction of averaged updater state.

Each worker's Adam-like second moment measures the gradient noise of its
own, smaller minibatch, so their plain average is larger than the second
moment of the workers' combined batch and shrinks every step after it.
The workers also return the squares of their first moments, whose spread
measures that noise; the driver corrects the averaged state with it
(:meth:`~sparkavg.nn.updaters.Updater.correct_averaged_state`).
"""
from __future__ import annotations

from typing import Tuple

import numpy as np

from ...backend import to_cpu
from . import Policy

__all__ = ["MomentCorrection"]


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
        noise_moment = getattr(updater, "noise_moment", None)
        if not self.enabled:
            return False, "preset 'dl4j': the workers' updater states are averaged plainly"
        if not save_updater:
            return False, "save_updater=False: no updater state is averaged"
        if noise_moment is None or noise_moment(1) is None:
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
        segments = getattr(network, "param_segments", None)  # a contract model may have none: one block
        network.updater.correct_averaged_state(state, result.moment_sq.astype(np.float64) * inv, sent, workers,
                                               max(1, round(result.batches / workers)),
                                               [(seg.start, seg.stop) for seg in segments] if segments else None)
        result.state[...] = state * result.weight
