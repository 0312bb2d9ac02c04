"""The moment correction of averaged updater state: whether it runs.

The arithmetic -- the averaged second moment of Adam-like updaters brought
to the workers' combined batch, read from the spread of their first
moments -- is :func:`sparkavg.averaging.merge.correct_second_moment`, run
by every round's merge (the driver's or, rounds inside one stage, every
rank's).
"""
from __future__ import annotations

from typing import Tuple

from ...averaging.merge import correct_second_moment
from . import Policy

__all__ = ["MomentCorrection", "correct_second_moment"]


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
