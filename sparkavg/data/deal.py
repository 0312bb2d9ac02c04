"""Dealing a fit's prepared minibatches to rounds and workers, every epoch.

Each epoch assigns minibatch ids (of a :class:`~sparkavg.spark.sources.MinibatchSource`)
to ``rounds[r][w]``; every id appears exactly once, so every example
trains exactly once per epoch (DL4J's oversized-partition flaw fixed).
Two deals (:class:`~sparkavg.spark.masters.Repartition`):

* :func:`deal` (``balanced``) shuffles all minibatches and deals them
  round-robin: on a cluster about ``(workers - 1) / workers`` of the data
  crosses the network every epoch;
* :func:`deal_shards` (``local``, the default for Spark blocks) cuts the
  minibatches once per fit into one shard per worker along where their
  blocks live (:func:`local_shards`, by host, then partition) and shuffles
  each shard in place every epoch: the shards stay, so an epoch inside one
  stage reads the first epoch's shuffle again and no block moves after it
  (:meth:`~sparkavg.spark.sources.SparkBlocks.sharded`).

The source's ``deal_choice`` picks between them (a recorded decision).  With
``weights`` (workers' measured speeds, :func:`share_choice`, another
recorded decision) the shards are cut in proportion to them
(:func:`weighted_shards`) and every worker's shard is split into the same
number of rounds (:func:`split_rounds`), so a slower worker fits fewer
minibatches per round and no round waits for it; still every id appears
exactly once.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import numpy as np

__all__ = ["deal", "local_shards", "deal_shards", "deal_epoch", "shard_label_skew", "MAX_SHARD_LABEL_SKEW",
           "apportion", "weighted_shards", "split_rounds", "share_choice", "MIN_SPEED_RATIO", "MIN_MEASURED_SECONDS",
           "equal_finish_shares"]


def deal(num_batches: int, workers: int, per_round: int, seed: Optional[int]) -> List[List[List[int]]]:
    """Assign minibatch ids to ``rounds[r][w]``.

    Every id appears exactly once.  Each round holds ``workers * per_round``
    minibatches except the last, whose leftovers are dealt round-robin so
    shards differ by at most one minibatch (nothing is skipped, DL4J's flaw).
    ``seed=None`` keeps the data's order.
    """
    order = np.arange(num_batches)
    if seed is not None:
        np.random.default_rng(seed).shuffle(order)
    step = workers * per_round
    rounds = []
    for start in range(0, num_batches, step):
        chunk = order[start:start + step].tolist()
        rounds.append([chunk[w::workers] for w in range(workers)])
    return rounds


def local_shards(count: int, workers: int, layout: Optional[List[tuple]] = None) -> List[List[int]]:
    """Minibatch ids ``0 .. count-1`` cut into one shard per worker along
    where they live: ordered by ``layout[i]`` (``(host, partition)``; None:
    by id, i.e. partition order), then cut into ``workers`` contiguous
    shards whose sizes differ by at most one, listed by their smallest id.
    With as many hosts' worth of equal data as workers, each shard lies on
    one host."""
    if layout is not None and len(layout) != count:
        raise ValueError(f"Expect a layout entry per minibatch ({count}), got {len(layout)}")
    order = list(range(count)) if layout is None else sorted(range(count), key=lambda i: (*layout[i], i))
    q, extra = divmod(count, workers)
    shards, start = [], 0
    for w in range(workers):
        size = q + (1 if w < extra else 0)
        shards.append(order[start:start + size])
        start += size
    # Canonical order (by first id), not by host name: a fit that resumes on the same partition
    # grouping deals exactly the same epochs whichever host got which partition.
    return sorted(shards, key=lambda s: (not s, min(s) if s else 0))


def deal_shards(shards: List[List[int]], per_round: int, seed: Optional[int]) -> List[List[List[int]]]:
    """``rounds[r][w]``: worker ``w``'s shard, shuffled in place (``seed``;
    None keeps its order), ``per_round`` minibatches per round.  Every id
    appears exactly once; shards differing by at most one minibatch make
    the last round's differ by at most one."""
    rng = None if seed is None else np.random.default_rng(seed)
    dealt = []
    for shard in shards:
        shard = np.asarray(shard, dtype=np.int64)
        dealt.append((rng.permutation(shard) if rng is not None else shard).tolist())
    longest = max((len(s) for s in dealt), default=0)
    return [[s[start:start + per_round] for s in dealt] for start in range(0, longest, per_round)]


def apportion(total: int, weights: Sequence[float]) -> List[int]:
    """``total`` cut into integer parts proportional to ``weights`` (largest
    remainders; ties to the lower index): they sum to ``total``."""
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 1 or not len(w) or not np.all(np.isfinite(w)) or np.any(w <= 0):
        raise ValueError(f"Expect one finite weight > 0 per worker, got {list(weights)!r}")
    exact = total * w / w.sum()
    parts = np.floor(exact).astype(np.int64)
    short = total - int(parts.sum())
    for i in sorted(range(len(w)), key=lambda i: (-(exact[i] - parts[i]), i))[:short]:
        parts[i] += 1
    return parts.tolist()


def weighted_shards(shards: List[List[int]], weights: Sequence[float]) -> List[List[int]]:
    """``shards`` re-cut to sizes proportional to ``weights``, moving as few
    minibatches as possible: a shard over its size gives the ids at its end
    (its last blocks), and the shards under theirs take them in turn, each
    keeping all its own ids.  Every id stays exactly once."""
    if len(weights) != len(shards):
        raise ValueError(f"Expect a weight per shard ({len(shards)}), got {len(weights)}")
    targets = apportion(sum(len(s) for s in shards), weights)
    pool: List[int] = []
    kept = []
    for shard, target in zip(shards, targets):
        kept.append(list(shard[:target]))
        pool.extend(shard[target:])
    for shard, target in zip(kept, targets):
        take = target - len(shard)
        if take > 0:
            shard.extend(pool[:take])
            del pool[:take]
    assert not pool, "apportion sums to the total"
    return kept


def split_rounds(shards: List[List[int]], per_round: int, seed: Optional[int],
                 home: Optional[List[List[int]]] = None) -> List[List[List[int]]]:
    """``rounds[r][w]``: each shard shuffled in place (``seed``; None keeps
    its order) and split into the same number of rounds -- as many as an
    equal deal of the same minibatches has at ``per_round`` (``per_round``
    is then each worker's mean per round: a faster worker's part is larger)
    -- in parts differing by at most one, so that each worker's minibatches
    per round are in proportion to its shard.  Every id appears exactly once.

    Not as many as the largest shard needs at ``per_round``: re-cut shares
    would then add a round to the epoch (e.g. 7 workers at 69 minibatches
    where an equal deal has 64 and ``per_round`` 16: 5 rounds instead of
    4), and a round's fixed cost is what the shares are meant to save.

    With ``home`` (each worker's own shard before the re-cut,
    :func:`weighted_shards`) a shard's foreign minibatches are spread evenly
    over its rounds, not where the shuffle puts them: a round whose part
    were over a fifth foreign would also prefer the foreign blocks' host
    (Spark's reduce locality), and a slow host may then run a fast worker's
    whole part on top of its own."""
    rng = None if seed is None else np.random.default_rng(seed)
    dealt = [(rng.permutation(np.asarray(s, dtype=np.int64)) if rng is not None else np.asarray(s, dtype=np.int64))
             for s in shards]
    total = sum(len(s) for s in dealt)
    if total == 0:
        return []
    rounds = -(-(-(-total // len(dealt))) // per_round)
    if home is not None:
        parts = []
        for s, own in zip(dealt, home):
            mine = np.isin(s, np.asarray(own, dtype=np.int64))
            split = zip(np.array_split(s[mine], rounds), np.array_split(s[~mine][::-1], rounds)[::-1])
            parts.append([np.concatenate(pair) for pair in split])
        return [[parts[w][r].tolist() for w in range(len(dealt))] for r in range(rounds)]
    parts = [np.array_split(s, rounds) for s in dealt]
    return [[parts[w][r].tolist() for w in range(len(dealt))] for r in range(rounds)]


def deal_epoch(count: int, workers: int, per_round: int, seed: Optional[int], local: bool,
               layout: Optional[List[tuple]] = None,
               weights: Optional[Sequence[float]] = None) -> List[List[List[int]]]:
    """The epoch's ``rounds[r][w]``: :func:`deal_shards` over :func:`local_shards`
    when ``local``, else :func:`deal` (both Spark flavours).  With
    ``weights`` (one per worker) the shards are cut in proportion to them
    (:func:`weighted_shards`; balanced: the shuffled ids cut by
    :func:`apportion`) and split by :func:`split_rounds`."""
    if weights is not None:
        if len(weights) != workers:
            raise ValueError(f"Expect a weight per worker ({workers}), got {len(weights)}")
        if local:
            home = local_shards(count, workers, layout)
            return split_rounds(weighted_shards(home, weights), per_round, seed, home)
        order = np.arange(count)
        if seed is not None:
            np.random.default_rng(seed).shuffle(order)
        bounds = np.cumsum([0] + apportion(count, weights))
        return split_rounds([order[bounds[w]:bounds[w + 1]].tolist() for w in range(workers)], per_round, None)
    if local:
        return deal_shards(local_shards(count, workers, layout), per_round, seed)
    return deal(count, workers, per_round, seed)


#: ``auto`` deals locally only while every shard's label mix is within this
#: total-variation distance of the whole data's (IID shards measure ~0.01).
MAX_SHARD_LABEL_SKEW = 0.1


def shard_label_skew(shards: List[List[int]], labels: Optional[np.ndarray]) -> Optional[float]:
    """Largest total-variation distance between a shard's class mix and the
    whole data's (0: alike, 1: disjoint); None without labels."""
    if labels is None or not len(labels):
        return None
    total = labels.sum(axis=0)
    if total.sum() <= 0:
        return None
    whole = total / total.sum()
    skew = 0.0
    for shard in shards:
        counts = labels[shard].sum(axis=0) if shard else None
        if counts is not None and counts.sum() > 0:
            skew = max(skew, 0.5 * float(np.abs(counts / counts.sum() - whole).sum()))
    return skew


#: Shares follow the workers' speeds only when the fastest fits at least
#: this many times as many examples per second as the slowest: below it,
#: the difference is within what one run's timings vary (equal workers).
MIN_SPEED_RATIO = 1.25
#: Speeds from less fitting than this (seconds, per worker, since the last
#: deal) are not trusted: a few milliseconds of steps vary by more than a
#: straggler's factor from one task to the next.
MIN_MEASURED_SECONDS = 0.25


def equal_finish_shares(speeds: Sequence[float], fixed: Sequence[float], round_examples: float,
                        floor: float = 0.05) -> List[float]:
    """Examples per round for each worker so that all finish a round
    together: worker ``w`` takes ``fixed[w]`` seconds whatever its share (its
    task's start, the state, the result) plus ``n_w / speeds[w]``; with
    ``sum(n_w) = round_examples`` every ``fixed[w] + n_w / speeds[w]`` is the
    same ``T``.  A worker whose fixed part alone exceeds ``T`` still gets
    ``floor`` of an equal share (never nothing: its speed stays measured)."""
    s = np.asarray(speeds, dtype=np.float64)
    a = np.asarray(fixed, dtype=np.float64)
    t = (round_examples + float(np.sum(a * s))) / float(np.sum(s))
    n = (t - a) * s
    return np.maximum(n, floor * round_examples / len(s)).tolist()


def share_choice(speeds: Sequence[Optional[float]], local: bool, enabled: bool = True,
                 measured: Optional[Sequence[float]] = None, fixed: Optional[Sequence[float]] = None,
                 round_examples: Optional[float] = None) -> Tuple[Optional[List[float]], str]:
    """``(weights, reason)``: each worker's share of the epoch's minibatches
    (None: equal shares, as always before) from its measured speed
    (examples per second of fitting, ``None`` when not measured) over
    ``measured`` seconds of fitting each (None: enough); with ``fixed``
    (each worker's seconds per task besides fitting) and ``round_examples``
    the shares are :func:`equal_finish_shares`, else proportional to speed.

    A synchronous round ends when its slowest worker does: with equal
    shares, one worker at half speed doubles every round (a persistent
    straggler: a smaller or busier host; a transient one within an epoch
    is not what this answers).  Cut in
    proportion to speed, every worker finishes its round at about the same
    time; every example still trains exactly once per epoch, and averaging
    still weights each worker by the examples it fitted.  Off (equal
    shares) with one worker, without a measurement of every worker (or one
    shorter than :data:`MIN_MEASURED_SECONDS`), when
    the speeds are within :data:`MIN_SPEED_RATIO` (equal workers: re-cutting
    would only chase noise), and when minibatches are not dealt locally
    (a balanced deal binds a worker's index to no host, so a speed measured
    for it says nothing about the next epoch's)."""
    workers = len(speeds)
    if not enabled:
        return None, "preset 'dl4j': equal shares"
    if workers <= 1:
        return None, "one worker: nothing to balance"
    if not local:
        return None, ("minibatches dealt balanced: a worker's index is bound to no host, so its measured speed "
                      "says nothing about its next shard: equal shares")
    missing = [w for w, s in enumerate(speeds) if s is None or not np.isfinite(s) or s <= 0]
    if missing:
        return None, f"no speed measured yet for worker(s) {missing}: equal shares"
    short = [w for w, s in enumerate(measured or ()) if s < MIN_MEASURED_SECONDS]
    if short:
        return None, (f"worker(s) {short} measured over less than {MIN_MEASURED_SECONDS} s of fitting: too little "
                      f"to tell a slow worker from noise: equal shares")
    ratio = max(speeds) / min(speeds)
    if ratio < MIN_SPEED_RATIO:
        return None, (f"workers' speeds within {ratio:.2f}x of each other (< {MIN_SPEED_RATIO}): equal shares")
    slowest = int(np.argmin(speeds))
    weights = [float(s) for s in speeds]
    if fixed is not None and round_examples:
        weights = equal_finish_shares(speeds, fixed, round_examples)
    share = weights[slowest] * workers / sum(weights)
    how = ("speed and fixed seconds per task, so that every worker ends a round together" if fixed is not None
           and round_examples else "speed")
    return weights, (f"worker {slowest} fits {speeds[slowest]:.0f} examples/s, the fastest {max(speeds):.0f} "
                     f"({ratio:.2f}x): shares by measured {how} (worker {slowest} gets {share:.2f} of an equal "
                     f"share), so rounds do not wait for it; every example still trains once per epoch")
