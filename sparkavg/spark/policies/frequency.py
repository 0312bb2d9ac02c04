"""How often to average (decision ``averaging_frequency``): pinned, or
``"auto"`` from measured round costs under the local-SGD convergence bound;
the cost model itself -- :func:`choose_frequency`, :func:`convergence_bound`,
:func:`round_costs` ... -- is :mod:`sparkavg.averaging.frequency` (no Spark).
"""
from __future__ import annotations

from typing import Optional, Tuple

from ...averaging.frequency import (CONVERGENCE_CONSTANT, MAX_FREQUENCY, MAX_PLAIN_MOMENTUM_FREQUENCY,
                                    MIN_ROUNDS_PER_EPOCH, TARGET_OVERHEAD, RoundCosts, RoundTiming, WorkerBusy,
                                    busy_from_payloads, choose_frequency, convergence_bound, even_rounds,
                                    round_costs, rounds_from_events, rounds_needed)
from . import Policy

__all__ = ["AveragingFrequency", "TARGET_OVERHEAD", "MAX_FREQUENCY", "MAX_PLAIN_MOMENTUM_FREQUENCY", "RoundCosts",
           "WorkerBusy", "RoundTiming", "round_costs", "rounds_from_events", "busy_from_payloads", "choose_frequency",
           "even_rounds", "convergence_bound", "rounds_needed", "CONVERGENCE_CONSTANT", "MIN_ROUNDS_PER_EPOCH"]


class AveragingFrequency(Policy):
    """Decision ``averaging_frequency``: the minibatches each worker fits
    between averagings in an epoch -- pinned, or ``"auto"``: from the
    measured costs (:func:`choose_frequency`) under the convergence bound
    (:func:`convergence_bound`) and, for an updater with a momentum of its
    own (never under block momentum), under
    :data:`MAX_PLAIN_MOMENTUM_FREQUENCY` (preset ``"sparkavg"``)."""

    name = "averaging_frequency"

    def __init__(self, frequency, momentum_cap: bool = True):
        self.frequency, self.momentum_cap = frequency, momentum_cap

    @property
    def auto(self) -> bool:
        return self.frequency == "auto"

    def bound(self, per_worker: int, workers: int, epoch: int, updater=None) -> Tuple[int, str]:
        """The largest frequency ``"auto"`` may choose in ``epoch``, and why."""
        bound = convergence_bound(per_worker, workers, epoch)
        own = float(getattr(updater, "momentum", 0.0) or 0.0)
        cap = MAX_PLAIN_MOMENTUM_FREQUENCY
        if not self.momentum_cap or own <= 0.0 or bound[0] <= cap:
            return bound
        return cap, (f"momentum bound {cap}: {type(updater).__name__} has its own momentum {own:g} and is "
                     f"averaged plainly, whose replicas drift apart in longer rounds; the {bound[1]}")

    def decide(self, costs: Optional[RoundCosts], per_worker: int, workers: int, epoch: int,
               updater=None) -> Tuple[int, str]:
        """``(frequency, reason)`` for an epoch of ``per_worker`` minibatches per worker."""
        if not self.auto:
            return int(self.frequency), f"averaging_frequency={self.frequency} (set by user)"
        bound = self.bound(per_worker, workers, epoch, updater)
        if costs is None:  # the probe saw no minibatch fitted: nothing to measure
            return min(MAX_FREQUENCY, bound[0]), f"no probe round fitted a minibatch: the bound; {bound[1]}"
        return choose_frequency(costs, TARGET_OVERHEAD, MAX_FREQUENCY, per_worker, bound)
