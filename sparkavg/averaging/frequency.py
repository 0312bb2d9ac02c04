"""How often to average: the frequency from measured costs (the cost model;
:class:`~sparkavg.spark.policies.frequency.AveragingFrequency` decides with it).

A round of parameter averaging costs ``overhead + F * iteration`` seconds:
``overhead`` is what a round pays whatever its length (the Spark job's
latency, shipping the state, the result path back, the driver's merge) and
``iteration`` is what one minibatch costs the slowest worker (its ``fit``
plus waiting for the data).  :func:`choose_frequency` picks the smallest
``F`` whose overhead stays at or under ``target`` of a round::

    overhead / (overhead + F * iteration) <= target
    F = ceil(overhead * (1 - target) / (target * iteration))

clamped to ``[1, max_frequency]`` and to the convergence bound of the
epoch (:func:`convergence_bound`), then evened out over the epoch
(:func:`even_rounds`): no more rounds, and none left short.

Overhead alone ignores statistical efficiency (one round an epoch on small
data loses accuracy against one process).  Local SGD needs a number of rounds that grows with the local steps:
``R >= c * (p * T) ** (1/3)`` rounds suffice for ``T`` local steps on ``p``
workers (Haddadpour et al., NeurIPS 2019).  :func:`convergence_bound`
applies it at every epoch's end (``T`` the steps since the fit's first
epoch), so the first epoch gets the most rounds and later ones fewer
(post-local SGD's schedule, Lin et al. 2020), and never fewer than
:data:`MIN_ROUNDS_PER_EPOCH` rounds an epoch.

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

__all__ = ["TARGET_OVERHEAD", "MAX_FREQUENCY", "MAX_PLAIN_MOMENTUM_FREQUENCY", "RoundCosts", "WorkerBusy",
           "RoundTiming", "round_costs", "rounds_from_events", "busy_from_payloads", "choose_frequency", "even_rounds",
           "convergence_bound", "rounds_needed", "CONVERGENCE_CONSTANT", "MIN_ROUNDS_PER_EPOCH"]

#: ``c`` of the local-SGD bound ``R >= c * (p * T) ** (1/3)`` (rounds over ``T``
#: local steps per worker on ``p`` workers); measured in benchmarks/.
CONVERGENCE_CONSTANT = 0.75
#: Fewest rounds ``"auto"`` splits an epoch into (tiny data never runs one round an epoch).
MIN_ROUNDS_PER_EPOCH = 4
#: The largest share of a round's wall time its fixed overhead may take ("auto").
TARGET_OVERHEAD = 0.03
#: The largest frequency "auto" chooses (the convergence bound binds first on small data).
MAX_FREQUENCY = 400
#: The largest frequency "auto" chooses for an updater with a momentum of its own, averaged
#: plainly (block momentum does not run for it): its replicas drift apart in longer rounds.
MAX_PLAIN_MOMENTUM_FREQUENCY = 32

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


def rounds_needed(steps: int, workers: int, constant: float = CONVERGENCE_CONSTANT) -> int:
    """Rounds the local-SGD bound asks for over ``steps`` local steps per
    worker on ``workers`` workers: ``ceil(constant * (workers * steps) ** (1/3))``
    (0 for no steps)."""
    if steps <= 0:
        return 0
    return max(1, math.ceil(constant * (workers * steps) ** (1.0 / 3.0) - 1e-9))


def convergence_bound(minibatches_per_worker: int, workers: int, epoch: int,
                      constant: float = CONVERGENCE_CONSTANT,
                      min_rounds: int = MIN_ROUNDS_PER_EPOCH) -> Tuple[int, str]:
    """The largest frequency convergence allows in ``epoch`` (0-based), and why.

    By the end of epoch ``e`` a fit has run ``T = (e + 1) * n`` local steps
    per worker (``n`` = ``minibatches_per_worker``); the epoch runs the
    rounds the bound still owes, ``rounds_needed((e + 1) n) - rounds_needed(e n)``,
    at least ``min_rounds`` (and at most ``n``).  The frequency that splits
    ``n`` into that many rounds is the bound.

    Parameters
    ----------
    minibatches_per_worker : int
        Minibatches each worker fits per epoch, >= 1.
    workers : int
        Workers averaged, >= 1.
    epoch : int
        The epoch (0-based) counted from the fit's first.
    constant : float
        ``c`` of the bound, > 0.
    min_rounds : int
        Fewest rounds an epoch runs, >= 1.

    Returns
    -------
    (int, str)
        The bound and a phrase saying how it was reached.
    """
    n = minibatches_per_worker
    for name, value, low in (("minibatches_per_worker", n, 1), ("workers", workers, 1), ("epoch", epoch, 0),
                             ("min_rounds", min_rounds, 1)):
        if not (isinstance(value, int) and not isinstance(value, bool) and value >= low):
            raise ValueError(f"Expect {name} >= {low} (an int), got {value!r}")
    if not (isinstance(constant, (int, float)) and math.isfinite(constant) and constant > 0):
        raise ValueError(f"Expect constant > 0 (a finite float), got {constant!r}")
    before, after = rounds_needed(epoch * n, workers, constant), rounds_needed((epoch + 1) * n, workers, constant)
    owed = after - before
    rounds = min(n, max(owed, min_rounds))
    bound = math.ceil(n / rounds)
    while bound > 1 and math.ceil(n / bound) < rounds:  # 5 minibatches in 4 rounds: 1, not 2 (3 rounds)
        bound -= 1
    steps = (epoch + 1) * n
    why = (f"convergence bound {bound}: local SGD wants >= {constant:g} x ({workers} workers x {steps} steps)^(1/3) "
           f"= {after} rounds by the end of epoch {epoch + 1}")
    if epoch:
        why += f", {before} by its start: {owed} in this epoch"
    if owed < rounds:
        why += f"; at least {rounds} rounds an epoch"
    return bound, why


def choose_frequency(costs: RoundCosts, target: float, max_frequency: int,
                     minibatches_per_worker: Optional[int] = None,
                     bound: Optional[Tuple[int, str]] = None) -> Tuple[int, str]:
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
    bound : (int, str), optional
        The convergence bound (:func:`convergence_bound`) and its reason:
        the frequency is at most this too.

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
    if bound is not None and not (isinstance(bound[0], int) and bound[0] >= 1):
        raise ValueError(f"Expect a convergence bound >= 1 (an int), got {bound[0]!r}")
    cap = max_frequency if bound is None else min(max_frequency, bound[0])
    if t <= 0.0 or not math.isfinite(t) or not math.isfinite(o):
        reason = f"{measured}: no usable iteration time, so the bound {cap}"
        return cap, reason if bound is None else f"{reason}; {bound[1]}"
    exact = o * (1.0 - target) / (target * t)
    wanted = max(1, math.ceil(exact - 1e-9))
    rule = f"ceil({o * 1000:.1f} x {1 - target:.2f} / ({target:.2f} x {t * 1000:.2f})) = {wanted}"
    frequency = min(wanted, cap)
    evened = None
    if minibatches_per_worker is not None and frequency < minibatches_per_worker:
        frequency, evened = even_rounds(minibatches_per_worker, frequency, cap)
    whole_epoch = minibatches_per_worker is not None and frequency >= minibatches_per_worker
    length = min(frequency, minibatches_per_worker) if whole_epoch else frequency
    share = o / (o + length * t) if o + length * t > 0 else 0.0
    if bound is not None and wanted > bound[0] and bound[0] < max_frequency:
        reason = (f"{measured}: {rule} would keep overhead at {100 * target:.0f}% of a round; capped by the "
                  f"{bound[1]}")
    elif wanted > max_frequency:
        reason = (f"{measured}: {rule} would keep overhead at {100 * target:.0f}% of a round; capped at "
                  f"the largest frequency, {max_frequency}")
    else:
        reason = f"{measured}: {rule} (target {100 * target:.0f}%)"
    if bound is not None and not reason.endswith(bound[1]):
        reason += f"; under the convergence bound {bound[0]}"
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
