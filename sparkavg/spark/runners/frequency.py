"""How often to average: the frequency chosen from measured costs (pure logic).

A round of parameter averaging costs ``overhead + F * iteration`` seconds:
``overhead`` is what a round pays whatever its length (the Spark job's
latency, shipping the state, the result path back, the driver's merge) and
``iteration`` is what one minibatch costs the slowest worker (its ``fit``
plus waiting for the data).  :func:`choose_frequency` picks the smallest
``F`` whose overhead stays at or under ``target`` of a round::

    overhead / (overhead + F * iteration) <= target
    F = ceil(overhead * (1 - target) / (target * iteration))

clamped to ``[1, max_frequency]`` (the bound that protects convergence),
then evened out over the epoch (:func:`even_rounds`): no more rounds, and
none left short.

The costs come from rounds already run -- the previous epoch's, read off
the training statistics (:func:`rounds_from_events`) -- or, before the
first epoch, from probe rounds whose worker payloads are read directly
(:func:`busy_from_payloads`).  Nothing here imports Spark.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Iterable, List, Mapping, Optional, Sequence, Tuple

from ..stats import DRIVER_LANE, Phase

__all__ = ["RoundCosts", "WorkerBusy", "RoundTiming", "round_costs", "rounds_from_events", "busy_from_payloads",
           "choose_frequency", "even_rounds"]

#: Worker phases whose time grows with the minibatches of a round.
_PER_MINIBATCH = (Phase.FIT, Phase.DATA_LOAD)

#: ``(busy seconds, minibatches fitted)`` of one worker in one round.
WorkerBusy = Tuple[float, int]
#: ``(driver wall seconds of the round, [WorkerBusy per worker])``.
RoundTiming = Tuple[float, Sequence[WorkerBusy]]


@dataclass(frozen=True)
class RoundCosts:
    """What a round costs, measured.

    Attributes
    ----------
    overhead : float
        Seconds per round that do not grow with the frequency (median over
        the rounds measured): the driver's round wall time minus the
        slowest worker's fit and data time.
    iteration : float
        Seconds per minibatch of the slowest worker (median over rounds).
    rounds : int
        Rounds measured.
    source : str
        Where the figures come from, in words ("2 probe rounds", "epoch 3").
    """

    overhead: float
    iteration: float
    rounds: int
    source: str

    def to_plain(self) -> dict:
        return {"overhead": self.overhead, "iteration": self.iteration, "rounds": self.rounds,
                "source": self.source}

    @classmethod
    def from_plain(cls, d: Mapping) -> "RoundCosts":
        return cls(float(d["overhead"]), float(d["iteration"]), int(d["rounds"]), str(d["source"]))


def round_costs(rounds: Iterable[RoundTiming], source: str) -> Optional[RoundCosts]:
    """Median overhead and iteration time over ``rounds``; None without a
    round in which some worker fitted a minibatch.

    Per round the slowest worker (largest busy time) sets both figures: the
    round waits for it.  Overhead below zero (clock noise) counts as zero.
    """
    overheads, iterations = [], []
    for wall, workers in rounds:
        busy = [(t, n) for t, n in workers if n > 0]
        if not busy:
            continue
        t, n = max(busy)
        overheads.append(max(0.0, float(wall) - t))
        iterations.append(t / n)
    if not overheads:
        return None
    return RoundCosts(statistics.median(overheads), statistics.median(iterations), len(overheads), source)


def rounds_from_events(events: Iterable, epoch: int) -> List[RoundTiming]:
    """The :data:`RoundTiming` of every round of ``epoch`` in training-stats
    events (:attr:`TrainingStats.events`): the driver's ``round`` span and,
    per worker lane, its ``fit`` + ``data_load`` seconds and ``fit`` count."""
    walls: dict = {}
    busy: dict = {}
    for e in events:
        if e.epoch != epoch or e.round is None:
            continue
        if e.lane == DRIVER_LANE:
            if e.phase == Phase.ROUND:
                walls[e.round] = e.duration
        elif e.phase in _PER_MINIBATCH:
            slot = busy.setdefault(e.round, {}).setdefault(e.lane, [0.0, 0])
            slot[0] += e.duration
            slot[1] += e.phase == Phase.FIT
    return [(walls[r], [tuple(v) for v in busy.get(r, {}).values()]) for r in sorted(walls)]


def busy_from_payloads(payloads: Iterable[Mapping]) -> List[WorkerBusy]:
    """Per worker payload (:meth:`PhaseRecorder.to_payload`, one per task),
    its ``fit`` + ``data_load`` seconds and ``fit`` count."""
    out = []
    for payload in payloads:
        t, n = 0.0, 0
        for phase, _start, duration, _fields in payload.get("events", ()):
            if phase in _PER_MINIBATCH:
                t += float(duration)
                n += phase == Phase.FIT
        out.append((t, n))
    return out


def choose_frequency(costs: RoundCosts, target: float, max_frequency: int,
                     minibatches_per_worker: Optional[int] = None) -> Tuple[int, str]:
    """The averaging frequency for ``costs`` and why.

    Parameters
    ----------
    costs : RoundCosts
    target : float
        Largest share of a round the overhead may take, in (0, 1).
    max_frequency : int
        Upper bound (protects convergence), >= 1.
    minibatches_per_worker : int, optional
        Minibatches each worker fits per epoch; only mentioned in the reason
        when the frequency covers the whole epoch.

    Returns
    -------
    (int, str)
        The frequency and one sentence saying how it was reached.
    """
    if not 0.0 < target < 1.0:
        raise ValueError(f"Expect 0 < target < 1, got {target!r}")
    if not (isinstance(max_frequency, int) and max_frequency >= 1):
        raise ValueError(f"Expect max_frequency >= 1 (an int), got {max_frequency!r}")
    o, t = costs.overhead, costs.iteration
    measured = (f"round overhead {o * 1000:.1f} ms and {t * 1000:.2f} ms per minibatch "
                f"(median of {costs.rounds} round(s), {costs.source})")
    if t <= 0.0 or not math.isfinite(t) or not math.isfinite(o):
        return max_frequency, f"{measured}: no usable iteration time, so the bound {max_frequency}"
    exact = o * (1.0 - target) / (target * t)
    wanted = max(1, math.ceil(exact - 1e-9))
    rule = f"ceil({o * 1000:.1f} x {1 - target:.2f} / ({target:.2f} x {t * 1000:.2f})) = {wanted}"
    frequency = min(wanted, max_frequency)
    evened = None
    if minibatches_per_worker is not None and frequency < minibatches_per_worker:
        frequency, evened = even_rounds(minibatches_per_worker, frequency, max_frequency)
    whole_epoch = minibatches_per_worker is not None and frequency >= minibatches_per_worker
    length = min(frequency, minibatches_per_worker) if whole_epoch else frequency
    share = o / (o + length * t) if o + length * t > 0 else 0.0
    if wanted > max_frequency:
        reason = (f"{measured}: {rule} would keep overhead at {100 * target:.0f}% of a round; capped at "
                  f"max_averaging_frequency {max_frequency} (convergence bound)")
    else:
        reason = f"{measured}: {rule} (target {100 * target:.0f}%)"
    if whole_epoch:
        reason += f"; an epoch has {minibatches_per_worker} minibatches per worker: one round per epoch"
    elif evened is not None:
        reason += f"; {evened}"
    reason += f"; overhead {100 * share:.0f}% of a round"
    return frequency, reason


def even_rounds(minibatches: int, frequency: int, max_frequency: int) -> Tuple[int, Optional[str]]:
    """The frequency that splits an epoch of ``minibatches`` per worker into
    rounds of (nearly) equal length, and a phrase saying so (None when
    ``frequency`` already does).

    ``minibatches // frequency`` rounds of ``ceil(minibatches / rounds)``
    each: never more rounds than ``frequency`` gives, and no short last
    round paying a whole round's overhead for a fraction of the work
    (937 minibatches at 124: 8 rounds, the last of 69; evened: 7 of 134).
    Where that would pass ``max_frequency`` the rounds stay as many as
    ``frequency`` gives and only their lengths even out.
    """
    as_given = math.ceil(minibatches / frequency)
    rounds = minibatches // frequency
    if rounds < 1 or math.ceil(minibatches / rounds) > max_frequency:
        rounds = as_given
    even = math.ceil(minibatches / rounds)
    if even == frequency:
        return frequency, None
    return even, (f"{minibatches} minibatches per worker per epoch: {rounds} even round(s) of {even} "
                  f"instead of {as_given} of {frequency}")
