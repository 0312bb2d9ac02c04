#!/usr/bin/env python
"""A cost model of one epoch for both masters and the sharing topologies
(issue 26; TREE, issue 38), with parameter averaging's two paths (issue 37), calibrated from
bench_scale.py's 2-, 4- and 8-host runs and used to predict 16-256 workers
at 1, 10 and 100 Gbit/s.

Pure Python (no Spark; the frequency rule is the library's own,
:mod:`sparkavg.averaging.frequency`).  An epoch of ``N`` examples on ``W``
workers of batch ``b`` gives each worker ``M = ceil(N / (W b))``
minibatches of ``step`` seconds each; ``B`` is a link's bytes per second
and ``l`` its one-way latency.

**The frequency** (:func:`auto_frequency`): ``"auto"``'s rule, the
library's :func:`~sparkavg.averaging.frequency.choose_frequency` -- the
fewest minibatches per round that keep a round's overhead ``o`` at 3% of
the round, ``F = ceil(o (1 - 0.03) / (0.03 step))`` -- under the
local-SGD convergence bound of the epoch
(:func:`~sparkavg.averaging.frequency.convergence_bound`: at least
``max(4, ceil(c ((e + 1) W M)^(1/3)) - ceil(c (e W M)^(1/3)))`` rounds in
epoch ``e``, ``c = 0.75``), at most 400, rounds evened.  Predictions are for the
second epoch (``e = 1``), the calibrated runs' last.

**Parameter averaging, a Spark job per round** (:func:`averaging_epoch`,
path ``"jobs"``): ``R = ceil(M / F)`` rounds; a round costs a fixed
``round_s`` (job launch, task start, the driver's merge), ``task_s`` per
worker (the driver schedules and deserialises every task's result), the
broadcast of the state ``S`` bytes (torrent: about ``S / B`` from the
driver's link) and the results back.  With Spark blocks the round is one
``runJob`` whose ``W`` results all cross the driver's link: ``W S / B``;
with ``treeAggregate`` of depth ``d`` (shared files) the executors merge
first and each level takes ``W^(1/d)`` results: ``d W^(1/d) S / B``::

    epoch = R (round_s + W task_s + S / B + W S / B + 4 l) + M step

**Parameter averaging, rounds inside one barrier stage**
(:func:`averaging_in_stage_epoch`, path ``"in_stage"``, the default): one
stage per epoch, whose ranks meet once (Spark's ``allGather``), connect to
their partners (key agreement and handshake, ``connect_s`` each) and then
all-reduce ``A`` bytes every ``F`` minibatches (``A``: params, updater
state, buffers and, under the moment correction, the first moment's
square).  The all-reduce is :mod:`sparkavg.transport.collective`'s
(issue 37): recursive halving and doubling over ``P = 2^floor(log2 W)``
ranks, the ranks ``>= P`` folded in first and served last.  A rank has
``log2 P`` partners (``+ 1`` with a fold, ``k = log2 P + [W > P]``),
sends and receives ``2 (P - 1) / P`` of ``A`` (bandwidth-optimal, as a
ring; a fold's vector more) in ``2 log2 P`` steps (``+ 2``; a ring: ``2
(W - 1)``); each step is a frame to and from one partner, two threads per
connection: ``peer_s`` per partner per round.  A round also pays
``stage_round_s`` whatever ``W`` (copying, scaling and merging ``A`` on
every rank -- the driver's merge, done by each rank)::

    round = stage_round_s + k peer_s + (2 (P - 1) / P + [W > P]) A / B + (2 log2 P + 2 [W > P]) l
    epoch = launch_s + meeting_s + k connect_s + 2 S / B + R round + M step

(Before issue 37 a full mesh: ``W - 1`` peers and connections, 2 steps;
the calibration fits ``peer_s`` and ``connect_s`` over each run's own
:func:`partners`: ``W - 1`` for result files without a ``collective``
field, which measured the mesh.)

``launch_s`` is the stage's fixed cost per epoch before its tasks meet and
after they end (the deal's shuffle stage, the barrier stage's launch, the
tasks' start, the driver's load of rank 0's result); ``meeting_s`` the
ranks' ``allGather`` (Spark's barrier calls poll once a second); ``2 S /
B`` the state out (broadcast) and rank 0's back.  ``F`` "auto" uses the
in-stage round as its ``o``.

**Gradient sharing** (:func:`sharing_epoch`): one stage per epoch
(``stage_s``, ``join_s`` per rank), then ``M`` iterations of
``max(cpu, out / B, in / B)``: the CPU does the step and applies every
other rank's message (``apply_s`` each, ``W - 1`` per iteration); a rank
receives ``W - 1`` messages of ``m`` bytes per iteration with either
topology; it sends ``W - 1`` (``PLAIN``) or, in the ``MESH`` relay tree of
fan-out 8, a relay with ``k`` neighbours forwards every message to the
``k - 1`` others: ``k + (W - 1)(k - 1)`` sends, so the busiest rank sends
about ``8 (W - 1)`` messages -- MESH bounds a rank's peers, not its bytes.

**TREE** (issue 38, :func:`tree_epoch`): the messages are summed by
recursive doubling (:class:`sparkavg.transport.TreeGroup`): the ``P``
lowest ranks (``P`` the largest power of two <= ``W``) exchange their parts
with rank ``r XOR 2^j`` for ``j < log2 P`` and merge, so all end with the
total; each other rank sends its message to a core rank first and gets the
total back; every rank applies one message per iteration.  With
``staleness=0`` the sums sit on the iteration's critical path:
``step + E hop_s + bytes / B`` with ``E`` the exchanges
(:func:`doubling_exchanges`: ``log2 P``, plus 2 when ``W > P``), ``hop_s``
the calibrated cost of one exchange (receiving, authenticating, merging,
sending: its latency, a rank's CPU and its wake-ups), and the bytes of the
exchanges: at exchange ``j`` the merge of ``2^j W / P`` ranks' messages.
The binary tree it replaced (up a tree of fan-out 2, the total back down:
``step + 2 D hop_s + bytes / B``, ``D`` its depth, :func:`tree_depth`; up,
the merge of ``2^j - 1`` ranks at hop ``j``, down the total ``D`` times) is
:func:`binary_tree_epoch`, predicted with TREE's calibrated costs as
``sharing_binary_tree``: what the same hop costs give on the other schedule
(the result files before issue 38's change measured it).
A merge of ``k`` ranks' messages (each a fraction ``d`` of the ``N``
parameters) carries ``N (1 - (1 - d)^k)`` indices of 5 bytes (index and
int8 count) or, when smaller, ``N`` bytes dense (:func:`merged_bytes`;
independent indices: an upper bound, gradients overlap more).  MESH is no
longer the library's (a saved "mesh" loads as TREE); ``sharing_mesh`` stays
for the result files that measured it.  Both sharing models also pay,
per iteration, ``sync_s`` whatever ``W`` (encode, send) and the lock-step
wait for the slowest of ``W`` ranks' steps, ``lockstep_s log2 W``
(:func:`sync`; both 0 unless calibrated from phase timings).

**Calibration**: the jobs path and sharing fit their overheads to the
measured epochs (relative least squares, non-negative; TREE fits
``stage_s`` and ``hop_s`` on ``[1, E M]``).  The in-stage path
fits its parts apart: the per-round part on ``[1, W - 1]`` to the median
over the last epoch's rounds of the round's wall time minus its slowest
worker's fit and data time (less the modelled bytes and latency); the
meeting and connections on ``[1, W - 1]`` to the ranks' wait before round
1 (the median rank's, less the later rounds' median all-reduce wait);
``launch_s`` to the rest of the epoch outside its rounds (less ``2 S /
B``); its step is the slowest worker's per minibatch.  ``--phases``
calibrates PLAIN and TREE from the ranks' own phase timings instead
(:func:`calibrate_phases`: the loop's time per iteration beyond the step
on ``[1, x]``, ``x`` = ``(W - 1) q`` received messages or ``E`` exchanges;
``stage_s`` the epoch's rest).  Each point's link is its run's
(``--rate``; unshaped: ``--calibration-gbit``).
``--host-speedup k`` divides the step and every calibrated CPU cost by
``k`` for predictions; ``meeting_s`` is kept as measured (Spark's
polling, not CPU).

``--direct-sharing`` takes sharing's per-iteration costs from a run at
full speed (``bench_scale.py --runs topologies --hosts 2 --pin``, each
host a core of its own, or ``--cpu 1.0``, a quota of a core on this
machine's two shared cores: :func:`direct_sharing_costs`) and predicts the
sharing strategies with them as the scenario ``direct_sharing_costs``: the
simulated hosts' 0.2-core quota inflates the loop's waits and sends about
twice as much as the step.  Where the run has the ranks' step spread
(``bench_scale.step_spread``), ``<strategy>_spread`` prices the lock-step
wait from it instead of per doubling (:func:`spread_lockstep`).

**Scenarios** (``--scenario label:field=value,...``) predict the in-stage
path again with some overheads or workload fields changed (what a fix
would buy); ``--allreduce`` takes ``peer_s`` and ``connect_s`` at full
speed measured directly (:func:`direct_peer_costs`: slopes over ``W - 1``
of one rank's CPU seconds in bench_allreduce.py's ``connect`` and round)
as the base of every scenario.

``python benchmarks/cost_model.py benchmarks/results/scale_instage_h{2,4,8}.json``
calibrates, prints the error at each measured point and the predictions
(``scale_scale_h*.json`` files: the jobs path and the sharing strategies;
``scale_topologies_h*.json`` files, no averaging fit: PLAIN, MESH and TREE,
with sharing's own step).
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from dataclasses import asdict, dataclass, replace
from typing import Dict, List, Optional, Sequence

__all__ = ["Workload", "Link", "Overheads", "averaging_epoch", "averaging_in_stage_epoch", "sharing_epoch",
           "auto_frequency", "mesh_sends", "tree_depth", "merged_bytes", "tree_epoch", "doubling_exchanges",
           "binary_tree_epoch", "calibrate",
           "calibrate_phases", "predict", "predict_scenario", "direct_peer_costs", "STRATEGIES", "ALLREDUCE_STEPS"]

STRATEGIES = ("averaging", "averaging_in_stage", "sharing_plain", "sharing_mesh", "sharing_tree")
MESH_FANOUT = 8
TREE_FANOUT = 2  # the binary tree's, before issue 38's recursive doubling
MERGED_HEADER_BYTES = 28
#: Sequential network steps of one all-reduce of :mod:`sparkavg.transport.collective` (reduce-scatter,
#: all-gather; a full mesh, so not ``2 (W - 1)`` as a ring's).
ALLREDUCE_STEPS = 2
#: The epoch (0-based) predictions are for: the calibrated runs' last (the first also runs probe rounds).
STEADY_EPOCH = 1


@dataclass(frozen=True)
class Workload:
    """What one epoch trains."""

    examples: int            # N, per epoch
    batch: int               # b, per worker
    step_s: float            # seconds of one minibatch step on one worker
    state_bytes: float       # S: what averaging ships each way per worker per round (params + updater + buffers)
    message_bytes: float     # m: one encoded sharing update on the wire (mean)
    messages_per_step: float = 1.0  # sharing updates a rank sends per iteration (some iterations send none)
    params: int = 0          # N (TREE: how full a merge of k ranks' messages gets)
    round_bytes: float = 0.0  # A: what one in-stage round all-reduces per rank (0: state_bytes)

    @property
    def allreduced(self) -> float:
        return self.round_bytes or self.state_bytes


@dataclass(frozen=True)
class Link:
    """Every host's link: bandwidth (bit/s, each way) and one-way latency (s)."""

    bits_per_s: float
    latency_s: float = 50e-6

    @property
    def bytes_per_s(self) -> float:
        return self.bits_per_s / 8


@dataclass(frozen=True)
class Overheads:
    """Calibrated costs that are not compute or bytes (seconds)."""

    round_s: float = 0.0     # averaging: per round, fixed
    task_s: float = 0.0      # averaging: per round per worker
    epoch_s: float = 0.0     # averaging: per epoch (the plan: dealing the minibatches)
    stage_s: float = 0.0     # sharing: per epoch (barrier stage, peer group)
    join_s: float = 0.0      # sharing: per epoch per rank
    apply_s: float = 0.0     # sharing: CPU per received message applied
    relay_s: float = 0.0     # sharing MESH: CPU per message a relay forwards
    hop_s: float = 0.0       # sharing TREE: CPU of one hop of the sums (up or down) per iteration
    sync_s: float = 0.0      # sharing: per iteration whatever the world size (encode, send, the wait's rest)
    lockstep_s: float = 0.0  # sharing: per iteration, waiting for the slowest of W steps: lockstep_s x log2 W
    stage_round_s: float = 0.0  # averaging in-stage: per round, fixed (copies, scaling, every rank's merge)
    peer_s: float = 0.0      # averaging in-stage: per round per peer (a frame each way per step, its threads)
    launch_s: float = 0.0    # averaging in-stage: per epoch (the deal's shuffle, the stage's tasks' start, the result)
    meeting_s: float = 0.0   # averaging in-stage: per epoch, the ranks' allGather meeting (Spark polls once a second)
    connect_s: float = 0.0   # averaging in-stage: per epoch per peer (TCP connection, key agreement, handshake)

    #: Costs that are a Spark meeting's latency rather than CPU (kept by ``--host-speedup``).
    NOT_CPU = ("meeting_s",)


def auto_frequency(round_overhead_s: float, step_s: float, per_worker: int, workers: int = 1,
                   epoch: int = STEADY_EPOCH) -> int:
    """ParameterAveraging's "auto" frequency: the library's rule
    (:func:`~sparkavg.averaging.frequency.choose_frequency`: overhead at or
    under 3% of a round, at most 400, rounds evened) under the convergence
    bound of ``epoch`` on ``workers`` workers."""
    from sparkavg.averaging.frequency import (MAX_FREQUENCY, TARGET_OVERHEAD, RoundCosts, choose_frequency,
                                              convergence_bound)

    bound = convergence_bound(max(1, per_worker), max(1, workers), epoch)
    costs = RoundCosts(round_overhead_s, step_s, 1, "the cost model")
    return choose_frequency(costs, TARGET_OVERHEAD, MAX_FREQUENCY, max(1, per_worker), bound)[0]


def _collect_s(workers: int, state: float, link: Link, depth: Optional[int]) -> float:
    if depth is None:  # runJob: every result through the driver's link
        return workers * state / link.bytes_per_s
    fan_in = math.ceil(workers ** (1.0 / depth))
    return depth * fan_in * state / link.bytes_per_s


def averaging_epoch(workers: int, w: Workload, link: Link, o: Overheads, frequency=None,
                    depth: Optional[int] = None) -> Dict[str, float]:
    """Seconds of one averaging epoch (no probe rounds) and its parts.

    ``frequency``: minibatches per round (None: "auto"); ``depth``: the
    ``treeAggregate`` depth of the results, None for Spark blocks' runJob
    (what the library does with data in Spark blocks)."""
    per_worker = math.ceil(w.examples / (workers * w.batch))
    overhead = (o.round_s + workers * o.task_s + w.state_bytes / link.bytes_per_s
                + _collect_s(workers, w.state_bytes, link, depth) + 4 * link.latency_s)
    f = frequency if frequency is not None else auto_frequency(overhead, w.step_s, per_worker, workers)
    rounds = math.ceil(per_worker / f)
    compute = per_worker * w.step_s
    total = o.epoch_s + rounds * overhead + compute
    return {"seconds": total, "rounds": rounds, "frequency": f, "compute_s": compute, "round_overhead_s": overhead,
            "bytes_per_rank": rounds * 2 * w.state_bytes,
            "driver_bytes": rounds * (w.state_bytes + workers * w.state_bytes if depth is None
                                      else w.state_bytes + math.ceil(workers ** (1.0 / depth)) * w.state_bytes)}


def partners(workers: int, collective: str = "halving") -> int:
    """A rank's peers in one all-reduce round (and its connections): ``log2
    P`` (``+ 1`` folding the ranks ``>= P``) for the recursive halving of
    issue 37; ``W - 1`` for the full mesh before it (``collective="mesh"``:
    result files without a ``collective`` field measured the mesh)."""
    if workers <= 1:
        return 0
    if collective == "mesh":
        return workers - 1
    p = 1 << (int(workers).bit_length() - 1)
    return (p.bit_length() - 1) + (1 if workers > p else 0)


def allreduce_s(workers: int, nbytes: float, link: Link) -> float:
    """Seconds of the bytes and latency of one all-reduce of ``nbytes`` per
    rank (:mod:`sparkavg.transport.collective`: recursive halving and
    doubling over ``P = 2^floor(log2 W)`` ranks): ``2 (P - 1) / P`` of them
    each way on a rank's link and ``2 log2 P`` latencies, and where ``W >
    P`` the fold's vector in and out and 2 latencies more."""
    if workers <= 1:
        return 0.0
    p = 1 << (int(workers).bit_length() - 1)
    fold = 1 if workers > p else 0
    steps = 2 * (p.bit_length() - 1) + 2 * fold
    return (2 * (p - 1) / p + fold) * nbytes / link.bytes_per_s + steps * link.latency_s


def two_level(workers: int, nbytes: float, link: Link) -> tuple:
    """A two-level mesh (not what collective.py does; a fix the model
    prices): groups of ``g = ceil(sqrt(W))`` ranks all-reduce inside their
    group, then each rank with its peers of the same position in the other
    groups on its ``1 / g`` chunk.  Returns ``(peers, seconds of bytes and
    latency)``: ``g - 1 + h - 1`` peers (``h`` groups), 4 steps."""
    g = math.ceil(math.sqrt(workers))
    h = math.ceil(workers / g)
    sent = 2 * (g - 1) / g * nbytes + 2 * (h - 1) / h * nbytes / g
    return (g - 1) + (h - 1), sent / link.bytes_per_s + 2 * ALLREDUCE_STEPS * link.latency_s


def averaging_in_stage_epoch(workers: int, w: Workload, link: Link, o: Overheads, frequency=None,
                             epoch: int = STEADY_EPOCH, topology: str = "halving") -> Dict[str, float]:
    """Seconds of one averaging epoch with its rounds inside one barrier
    stage (the module docstring) and its parts; ``frequency`` None: "auto";
    ``topology`` "two_level" prices :func:`two_level`, any other value
    collective.py's recursive halving and doubling (the scenarios pass
    "mesh", their name for it from before issue 37): ``log2 P`` peers per
    round and connections per rank, one more to fold the ranks ``>= P``."""
    per_worker = math.ceil(w.examples / (workers * w.batch))
    p = 1 << (max(1, int(workers)).bit_length() - 1)
    fold = 1 if workers > p else 0
    if topology == "two_level" and workers > 1:
        peers, wire = two_level(workers, w.allreduced, link)
        connections = peers
    else:
        peers = connections = partners(workers)
        wire = allreduce_s(workers, w.allreduced, link)
    overhead = o.stage_round_s + peers * o.peer_s + wire
    f = frequency if frequency is not None else auto_frequency(overhead, w.step_s, per_worker, workers, epoch)
    rounds = math.ceil(per_worker / f)
    compute = per_worker * w.step_s
    stage = o.launch_s + o.meeting_s + connections * o.connect_s + 2 * w.state_bytes / link.bytes_per_s
    total = stage + rounds * overhead + compute
    return {"seconds": total, "rounds": rounds, "frequency": f, "compute_s": compute, "round_overhead_s": overhead,
            "stage_s": stage, "bytes_per_rank": rounds * 2 * (2 * (p - 1) / p + fold) * w.allreduced,
            "driver_bytes": 2 * w.state_bytes}


def mesh_sends(workers: int, fanout: int = MESH_FANOUT) -> int:
    """Messages the busiest rank of the MESH tree sends per update round
    (its own to each neighbour, every other rank's to all neighbours but
    the one it came from)."""
    if workers <= 1:
        return 0
    degree = max(len(([((r - 1) // fanout)] if r else []) + list(range(r * fanout + 1, min(r * fanout + 1 + fanout,
                                                                                               workers))))
                 for r in range(min(workers, 1 + fanout)))
    return degree + (workers - 1) * (degree - 1)


def sync(workers: int, o: Overheads) -> float:
    """Sharing's per-iteration cost beyond the step and the messages: ``sync_s`` and the lock-step wait for
    the slowest of ``W`` ranks' steps, ``lockstep_s log2 W`` (the expected maximum of ``W`` steps grows no
    faster for any spread with a tail lighter than exponential: a bound, not a fit of the tail)."""
    return o.sync_s + o.lockstep_s * math.log2(max(1, workers))


def sharing_epoch(workers: int, w: Workload, link: Link, o: Overheads, topology: str = "plain") -> Dict[str, float]:
    """Seconds of one PLAIN or MESH sharing epoch and its parts (``topology`` "plain" or "mesh"; TREE:
    :func:`tree_epoch`)."""
    iterations = math.ceil(w.examples / (workers * w.batch))
    received = (workers - 1) * w.messages_per_step
    sent = received if topology == "plain" else mesh_sends(workers) * w.messages_per_step
    relayed = 0.0 if topology == "plain" else max(0.0, sent - w.messages_per_step)
    cpu = w.step_s + sync(workers, o) + received * o.apply_s + relayed * o.relay_s
    out_s = sent * w.message_bytes / link.bytes_per_s
    in_s = received * w.message_bytes / link.bytes_per_s
    per_iteration = max(cpu, out_s, in_s)
    total = o.stage_s + workers * o.join_s + iterations * per_iteration
    return {"seconds": total, "iterations": iterations, "cpu_s": cpu, "network_s": max(out_s, in_s),
            "bound": "cpu" if per_iteration == cpu else "network",
            "bytes_per_rank_max": iterations * (sent + received) * w.message_bytes,
            "bytes_per_rank_mean": iterations * 2 * received * w.message_bytes}


def tree_depth(workers: int, fanout: int = TREE_FANOUT) -> int:
    """Hops from the deepest rank to the root."""
    depth, r = 0, workers - 1
    while r > 0:
        r, depth = (r - 1) // fanout, depth + 1
    return depth


def merged_bytes(ranks: int, w: Workload) -> float:
    """Bytes of the merge of ``ranks`` ranks' messages (module doc); one rank's is its own message."""
    if ranks <= 1:
        return w.message_bytes * w.messages_per_step
    density = min(1.0, w.messages_per_step * w.message_bytes / 4 / w.params)  # DL4J sparse: 4 bytes an entry
    filled = w.params * (1 - (1 - density) ** ranks)
    return MERGED_HEADER_BYTES + min(5 * filled, w.params)


def doubling_exchanges(workers: int) -> int:
    """Exchanges on one iteration's critical path by recursive doubling:
    ``log2 P`` (``P`` the largest power of two <= ``W``), plus the extras'
    message in and the total out when ``W > P``."""
    if workers <= 1:
        return 0
    core = 1 << (workers.bit_length() - 1)
    return core.bit_length() - 1 + (2 if workers > core else 0)


def tree_epoch(workers: int, w: Workload, link: Link, o: Overheads, staleness: int = 0) -> Dict[str, float]:
    """Seconds of one TREE sharing epoch (recursive doubling) and its parts.
    At ``staleness`` ``s`` the sums of iteration ``k`` must be back before
    step ``k + s + 1``: an iteration takes ``max(step + E hop_s, (step +
    chain + bytes) / (s + 1))`` (a rank takes part in every exchange: its
    own share is the chain -- an upper bound, the exchanges' latency taken
    as its CPU -- or the chain spread over ``s + 1`` steps)."""
    iterations = math.ceil(w.examples / (workers * w.batch))
    core = 1 << (max(1, workers).bit_length() - 1)
    steps = core.bit_length() - 1
    exchanges = doubling_exchanges(workers)
    extras = workers > core
    # exchange j carries the merge of a block of 2^j core ranks and their extras
    parts = [merged_bytes(min(workers, round(2 ** j * workers / core)), w) for j in range(steps)]
    total = merged_bytes(workers, w)
    inward, outward = (merged_bytes(1, w), total) if extras else (0.0, 0.0)
    network = (inward + sum(parts) + outward) / link.bytes_per_s + exchanges * link.latency_s
    chain = exchanges * o.hop_s
    step = w.step_s + sync(workers, o)
    per_iteration = max(step + chain, (step + chain + network) / (staleness + 1))
    sent = sum(parts)
    return {"seconds": o.stage_s + workers * o.join_s + iterations * per_iteration, "iterations": iterations,
            "cpu_s": w.step_s + chain, "network_s": network, "exchanges": exchanges,
            "bound": "cpu" if chain >= network else "network", "messages_applied_per_iteration": 1,
            # a core rank with an extra: its parts both ways, the extra's message in and the total out
            "bytes_per_rank_max": iterations * (2 * sent + inward + outward),
            "bytes_per_rank_mean": iterations * 2 * sent}


def binary_tree_epoch(workers: int, w: Workload, link: Link, o: Overheads, staleness: int = 0) -> Dict[str, float]:
    """Seconds of one epoch of the binary tree TREE was before issue 38
    (sums up a tree of fan-out 2, the total back down) with the same
    overheads: ``max(step + 2 hop_s, (step + 2 D hop_s + bytes) / (s + 1))``."""
    iterations = math.ceil(w.examples / (workers * w.batch))
    depth = tree_depth(workers)
    total = merged_bytes(workers, w)
    up = sum(merged_bytes(min(workers, 2 ** j - 1), w) for j in range(1, depth + 1))
    network = (up + depth * total) / link.bytes_per_s + 2 * depth * link.latency_s
    chain = 2 * depth * o.hop_s
    step = w.step_s + sync(workers, o)
    per_iteration = max(step + 2 * o.hop_s, (step + chain + network) / (staleness + 1))
    # a relay: its children's merges and the total in, its merge and the total to each child out
    relay = 2 * (TREE_FANOUT + 1) * total if workers > 2 else 2 * total  # an upper bound
    return {"seconds": o.stage_s + workers * o.join_s + iterations * per_iteration, "iterations": iterations,
            "cpu_s": w.step_s + chain, "network_s": network, "depth": depth,
            "bound": "cpu" if chain >= network else "network", "messages_applied_per_iteration": 1,
            "bytes_per_rank_max": iterations * relay, "bytes_per_rank_mean": iterations * 2 * total}


def epoch(strategy: str, workers: int, w: Workload, link: Link, o: Overheads, **kw) -> Dict[str, float]:
    if strategy == "averaging":
        return averaging_epoch(workers, w, link, o, **kw)
    if strategy == "sharing_tree":
        return tree_epoch(workers, w, link, o)
    if strategy == "averaging_in_stage":
        return averaging_in_stage_epoch(workers, w, link, o, **kw)
    return sharing_epoch(workers, w, link, o, topology=strategy.split("_")[1])


# -- calibration ------------------------------------------------------------------------------

def _lstsq(rows: List[List[float]], targets: List[float]) -> List[float]:
    """Non-negative least squares for a few unknowns (enumerates the active sets)."""
    import itertools

    import numpy as np

    a, t = np.asarray(rows, dtype=float), np.asarray(targets, dtype=float)
    best, best_err = None, math.inf
    n = a.shape[1]
    for k in range(n, 0, -1):
        for cols in itertools.combinations(range(n), k):
            x, *_ = np.linalg.lstsq(a[:, cols], t, rcond=None)
            if np.any(x < 0):
                continue
            full = np.zeros(n)
            full[list(cols)] = x
            err = float(np.sum(((a @ full) - t) ** 2 / t ** 2))
            if err < best_err:
                best, best_err = full, err
    return [float(v) for v in best]


_RATE_UNITS = {"bit": 1.0, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9}


def link_of(result: dict, unshaped_gbit: float) -> Link:
    """The link of a bench_scale.py run: its ``rate`` (a tc rate such as
    "1gbit"), or ``unshaped_gbit`` for unshaped veths."""
    rate = str(result.get("rate", "unshaped")).lower()
    for unit in sorted(_RATE_UNITS, key=len, reverse=True):
        if rate.endswith(unit) and rate[:-len(unit)].replace(".", "", 1).isdigit():
            return Link(float(rate[:-len(unit)]) * _RATE_UNITS[unit])
    return Link(unshaped_gbit * 1e9)


def in_stage_rounds(fit: dict) -> dict:
    """The last epoch's rounds of an in-stage fit (bench_scale.py's
    ``round_timeline``): per round its wall, its slowest worker's fit + data
    seconds and that per minibatch; the medians, the epoch's seconds
    outside its rounds (the stage's per-epoch cost) and the ranks' meeting
    (the median rank's wait before round 1)."""
    last = len(fit["epoch_seconds"]) - 1
    rounds = [r for r in fit["round_timeline"] if r["epoch"] == last]
    frequency = fit["averaging_frequency"][-1]
    overheads, iterations, walls, waits = [], [], 0.0, []
    for r in rounds:
        waits.append(statistics.median(t.get("wait", 0.0) for t in r["tasks"]))
        busy = [(t.get("fit", 0.0) + t.get("data_load", 0.0), t.get("minibatches") or frequency) for t in r["tasks"]]
        t, n = max(busy)
        overheads.append(max(0.0, r["seconds"] - t))
        iterations.append(t / n)
        walls += r["seconds"]
    # round 1's recorder holds the task's start: its wait is the meeting plus an all-reduce's wait
    meeting = waits[0] - (statistics.median(waits[1:]) if len(waits) > 1 else 0.0)
    return {"rounds": len(rounds), "round_overhead_s": statistics.median(overheads),
            "iteration_s": statistics.median(iterations), "outside_rounds_s": fit["epoch_seconds"][-1] - walls,
            "meeting_s": max(0.0, meeting)}


def measured_points(results: Sequence[dict], unshaped_gbit: float = 10.0) -> Dict[str, List[dict]]:
    """Per strategy, one point per host count: the last epoch's seconds and
    what the model needs.  ``scale`` runs give ``averaging`` (their one
    averaging fit) and the sharing strategies; ``topologies`` runs, which
    have no averaging fit, the sharing strategies (sharing's own step then;
    TREE's message is PLAIN's); ``instage`` runs give ``averaging`` (their
    ``jobs`` fit) and ``averaging_in_stage``."""
    points: Dict[str, List[dict]] = {s: [] for s in STRATEGIES}
    for r in results:
        fits = r["fits"]
        link = link_of(r, unshaped_gbit)
        names = ({"averaging": "jobs", "averaging_in_stage": "in_stage"} if "in_stage" in fits else
                 {s: s for s in STRATEGIES if s != "averaging_in_stage" and s in fits})
        step = fits[names.get("averaging", "sharing_plain")]["fit_phase"]["mean"]
        for s, name in names.items():
            f = fits[name]
            p = {"workers": r["hosts"], "seconds": f["epoch_seconds"][-1], "examples": f["examples"][-1],
                 "step_s": step, "state_bytes": f["state_bytes"], "batch": r["batch_size_per_worker"],
                 "link_bits_per_s": link.bits_per_s}
            if s.startswith("averaging"):
                p["frequency"] = f["averaging_frequency"][-1]
                p["rounds"] = f["rounds"][-1]
            if s == "averaging_in_stage":
                p["collective"] = r.get("collective", "mesh")
                p.update(in_stage_rounds(f))
                p["step_s"] = p["iteration_s"]  # the round waits for its slowest worker
                p["round_bytes"] = f.get("round_bytes") or f["state_bytes"]
            elif s.startswith("sharing"):
                sp = fits["sharing_plain" if s == "sharing_tree" else name]["sparkavg"]  # TREE: PLAIN's messages
                # one message delivered to one rank (a message goes to W - 1 peers, directly or relayed)
                p["message_bytes"] = sp["bytes_sent"] / max(sp["messages_received"], 1)
                iterations = math.ceil(p["examples"] / (r["hosts"] * p["batch"])) * len(f["epoch_seconds"])
                p["messages_per_step"] = sp["messages_sent"] / max(iterations * r["hosts"], 1)
                # in-run step time of sharing (its own fit phase, same model and quota)
                p["sharing_step_s"] = f["fit_phase"]["mean"]
                if (f.get("step_spread") or {}).get("mean_ms"):  # the last epoch's steps alone (bench_scale)
                    p["last_step_s"] = f["step_spread"]["mean_ms"] / 1e3
                p["params"] = f.get("num_params", 0)
                per = f.get("per_rank_iteration")
                if per:  # sparkavg's own counters: every datagram sent and received, per rank and iteration
                    p["bytes_per_iteration"] = per["bytes_sent"] + per["bytes_received"]
                    # the ranks' loop beyond the step, per iteration (their own phase timings)
                    chain = f.get("exchange_chain") or {}
                    # the loop's waits alone where measured apart (bench_scale.exchange_chain): a rank's first
                    # wait of an epoch (the meeting) and its finish and leave are the epoch's, not an iteration's
                    wait = chain.get("loop_wait_s", per["wait_s"])
                    p["loop_extra_s"] = wait + per["apply_s"] + per["encode_s"] + per["send_s"]
                    p["apply_per_iteration_s"] = per["apply_s"]
                    if "chain_s" in chain:  # the loop's wait told apart: the exchanges, the slower ranks' steps
                        p["chain_s"], p["lockstep_s"] = chain["chain_s"], chain["lockstep_s"]
            points[s].append(p)
    for s in points:
        points[s].sort(key=lambda p: p["workers"])
    return {s: pts for s, pts in points.items() if pts}


def _workload(p: dict, message_bytes=0.0, messages_per_step=1.0) -> Workload:
    return Workload(p["examples"], p["batch"], p.get("sharing_step_s", p["step_s"]), p["state_bytes"],
                    p.get("message_bytes", message_bytes), p.get("messages_per_step", messages_per_step),
                    p.get("params", 0), p.get("round_bytes", 0.0))


def _point_link(p: dict, link: Link) -> Link:
    return Link(p["link_bits_per_s"], link.latency_s) if "link_bits_per_s" in p else link


def fit_overheads(strategy: str, points: List[dict], link: Link, apply_s: float = 0.0) -> Overheads:
    """Least-squares (relative error) overheads of one strategy from its
    points; MESH takes PLAIN's ``apply_s`` (every rank applies every message
    in both) and fits its stage and relay costs; the in-stage path fits its
    per-round and per-epoch parts apart (the module docstring)."""
    if strategy == "averaging_in_stage":
        rows = [[1.0, float(partners(p["workers"], p.get("collective", "mesh")))] for p in points]
        rt = [max(1e-6, p["round_overhead_s"] - allreduce_s(p["workers"], _workload(p).allreduced,
                                                            _point_link(p, link))) for p in points]
        (stage_round_s, peer_s), (meeting_s, connect_s) = _lstsq(rows, rt), _lstsq(rows, [max(1e-6, p["meeting_s"])
                                                                                          for p in points])
        rest = [max(1e-6, p["outside_rounds_s"] - 2 * p["state_bytes"] / _point_link(p, link).bytes_per_s
                    - meeting_s - partners(p["workers"], p.get("collective", "mesh")) * connect_s) for p in points]
        launch_s = _lstsq([[1.0] for _ in points], rest)[0]
        return Overheads(stage_round_s=stage_round_s, peer_s=peer_s, launch_s=launch_s, meeting_s=meeting_s,
                         connect_s=connect_s)
    rows, targets = [], []
    for p in points:
        w, lk = _workload(p), _point_link(p, link)
        if strategy == "averaging":
            base = averaging_epoch(p["workers"], w, lk, Overheads(), frequency=p["frequency"])
            # seconds = base + rounds * round_s + rounds * W * task_s   (epoch_s folded into round_s: R is ~1-3)
            rows.append([base["rounds"], base["rounds"] * p["workers"]])
            targets.append(p["seconds"] - base["seconds"])
        elif strategy == "sharing_tree":
            base = tree_epoch(p["workers"], w, lk, Overheads())
            # seconds = base + stage_s + iterations * E hop_s
            rows.append([1.0, base["iterations"] * base["exchanges"]])
            targets.append(p["seconds"] - base["seconds"])
        else:
            topology = strategy.split("_")[1]
            base = sharing_epoch(p["workers"], w, lk, Overheads(apply_s=apply_s), topology)
            received = (p["workers"] - 1) * w.messages_per_step
            if topology == "plain":
                # seconds = stage_s + iterations * (step + (W - 1) q apply_s)  (CPU-bound here)
                rows.append([1.0, base["iterations"] * received])
                targets.append(p["seconds"] - base["iterations"] * w.step_s)
            else:
                relayed = max(0.0, mesh_sends(p["workers"]) * w.messages_per_step - w.messages_per_step)
                rows.append([1.0, base["iterations"] * relayed])
                targets.append(p["seconds"] - base["seconds"])
    x = _lstsq(rows, targets)
    if strategy == "averaging":
        return Overheads(round_s=x[0], task_s=x[1])
    if strategy == "sharing_plain":
        return Overheads(stage_s=x[0], apply_s=x[1])
    if strategy == "sharing_tree":
        return Overheads(stage_s=x[0], hop_s=x[1])
    return Overheads(stage_s=x[0], apply_s=apply_s, relay_s=x[1])


def model_seconds(strategy: str, p: dict, link: Link, o: Overheads) -> float:
    w, lk = _workload(p), _point_link(p, link)
    if strategy == "averaging":
        return averaging_epoch(p["workers"], w, lk, o, frequency=p["frequency"])["seconds"]
    if strategy == "averaging_in_stage":
        return averaging_in_stage_epoch(p["workers"], w, lk, o, frequency=p["frequency"])["seconds"]
    return epoch(strategy, p["workers"], w, lk, o)["seconds"]


def calibrate(results: Sequence[dict], link: Link) -> dict:
    """Overheads per strategy, the model's error at each measured point
    (fitted on all points) and when each point is left out of the fit
    (``link``: the links of runs that do not say theirs)."""
    points = measured_points(results, link.bits_per_s / 1e9)
    out = {}
    apply_s = 0.0
    for s, pts in points.items():  # PLAIN before MESH: MESH takes PLAIN's apply_s
        if not pts:
            continue
        o = fit_overheads(s, pts, link, apply_s)
        apply_s = o.apply_s if s == "sharing_plain" else apply_s
        errors, loo = [], []
        for i, p in enumerate(pts):
            errors.append({"workers": p["workers"], "measured_s": p["seconds"],
                           "model_s": model_seconds(s, p, link, o),
                           "error": model_seconds(s, p, link, o) / p["seconds"] - 1})
            if "bytes_per_iteration" in p and s != "averaging":  # a check of the bytes the model assumes
                e = epoch(s, p["workers"], _workload(p), _point_link(p, link), o)
                errors[-1].update(measured_bytes_per_iteration=p["bytes_per_iteration"],
                                  model_bytes_per_iteration=e["bytes_per_rank_mean"] / e["iterations"])
            if s == "averaging_in_stage":
                errors[-1].update(measured_round_overhead_s=p["round_overhead_s"],
                                  model_round_overhead_s=averaging_in_stage_epoch(
                                      p["workers"], _workload(p), _point_link(p, link), o,
                                      frequency=p["frequency"])["round_overhead_s"],
                                  measured_outside_rounds_s=p["outside_rounds_s"], measured_meeting_s=p["meeting_s"])
            rest = pts[:i] + pts[i + 1:]
            if len(rest) >= 2:
                o2 = fit_overheads(s, rest, link, apply_s if s == "sharing_mesh" else 0.0)
                loo.append({"workers": p["workers"], "error": model_seconds(s, p, link, o2) / p["seconds"] - 1})
        out[s] = {"overheads": asdict(o), "points": errors, "leave_one_out": loo,
                  "max_abs_error": max(abs(e["error"]) for e in errors)}
    return out


def calibrate_phases(results: Sequence[dict], link: Link) -> dict:
    """Sharing's overheads from the ranks' own phase timings instead of epoch
    seconds alone: per iteration, the loop's time beyond the step (the
    ``wait``, ``apply``, ``encode`` and ``send`` phases per rank and
    iteration, ``bench_scale.py``'s ``per_rank_iteration``; its waits alone,
    not the epoch's meeting, finish and leave, where ``exchange_chain``
    measured them) is ``sync_s + lockstep_s log2 W + x cost`` with ``x``
    the peer messages a rank receives (PLAIN: ``(W - 1) q``, ``cost`` =
    ``apply_s``) or the exchanges of the sums (TREE: ``E``, ``cost`` =
    ``hop_s``).  Where ``exchange_chain`` told the waits apart, the lock-step
    wait and TREE's exchanges are measured, not fitted: ``lockstep_s`` from
    the waits for the slower ranks' steps, ``hop_s`` from the chain of
    exchanges the last rank to publish waits for; else (older files) the
    loop is fitted as ``sync_s + x cost``.  ``stage_s`` is the mean of what
    the epoch took beyond its iterations."""
    points = measured_points(results, link.bits_per_s / 1e9)
    out = {}
    for s in ("sharing_plain", "sharing_tree"):
        pts = [p for p in points.get(s, []) if "loop_extra_s" in p]
        if len(pts) < 2:
            continue
        xs = [float((p["workers"] - 1) * _workload(p).messages_per_step if s == "sharing_plain"
                    else doubling_exchanges(p["workers"])) for p in pts]
        chained = all("lockstep_s" in p for p in pts)
        # the measured waits for slower steps: a part whatever W (into sync_s) and lockstep_s per doubling of W
        base, lockstep = _lstsq([[1.0, math.log2(p["workers"])] for p in pts], [p["lockstep_s"] for p in pts]) \
            if chained else (0.0, 0.0)
        rest = [p["loop_extra_s"] - (p["lockstep_s"] - base if chained else 0.0) for p in pts]
        if chained and s == "sharing_tree":  # the exchanges measured: the chain over E
            cost = _lstsq([[x] for x in xs], [p["chain_s"] for p in pts])[0]
            sync = max(0.0, sum(r - cost * x for r, x in zip(rest, xs)) / len(pts))
        else:
            sync, cost = _lstsq([[1.0, x] for x in xs], rest)
        rests = [p["seconds"] - math.ceil(p["examples"] / (p["workers"] * p["batch"])) * (_workload(p).step_s
                                                                                           + p["loop_extra_s"])
                 for p in pts]
        o = Overheads(stage_s=max(0.0, sum(rests) / len(rests)), sync_s=sync, lockstep_s=lockstep,
                      **{"apply_s" if s == "sharing_plain" else "hop_s": cost})
        errors = [{"workers": p["workers"], "measured_s": p["seconds"], "model_s": model_seconds(s, p, link, o),
                   "error": model_seconds(s, p, link, o) / p["seconds"] - 1,
                   "measured_loop_extra_s": p["loop_extra_s"],
                   "model_loop_extra_s": sync + lockstep * math.log2(p["workers"]) + cost * x}
                  for p, x in zip(pts, xs)]
        out[s] = {"overheads": asdict(o), "points": errors, "leave_one_out": [],
                  "max_abs_error": max(abs(e["error"]) for e in errors)}
    return out


# -- prediction -------------------------------------------------------------------------------

def predict(calibrated: dict, w: Workload, workers: Sequence[int], rates_bits: Sequence[float],
            latency_s: float = 50e-6, examples_per_worker: Optional[int] = None) -> dict:
    """Epoch seconds, throughput and efficiency per strategy, rate and
    worker count.  ``examples_per_worker`` set: weak scaling (each worker
    keeps that many examples); else the epoch is ``w.examples``.
    Efficiency = throughput / (workers x one worker's compute-only throughput)."""
    table = {}
    for rate in rates_bits:
        link = Link(rate, latency_s)
        # averaging_one_round: the jobs path at one round per epoch (the issue-26 model's frequency)
        for s in STRATEGIES + ("averaging_tree", "averaging_one_round", "sharing_tree_staleness1",
                               "sharing_binary_tree"):
            key = {"averaging_tree": "averaging", "averaging_one_round": "averaging",
                   "sharing_tree_staleness1": "sharing_tree", "sharing_binary_tree": "sharing_tree"}.get(s, s)
            if key not in calibrated:
                continue
            o = Overheads(**calibrated[key]["overheads"])
            for n in workers:
                wl = replace(w, examples=examples_per_worker * n) if examples_per_worker else w
                if s == "averaging_tree":
                    e = averaging_epoch(n, wl, link, o, depth=2)
                elif s == "averaging_one_round":
                    e = averaging_epoch(n, wl, link, o, frequency=math.ceil(wl.examples / (n * wl.batch)))
                elif s == "sharing_tree_staleness1":
                    e = tree_epoch(n, wl, link, o, staleness=1)
                elif s == "sharing_binary_tree":  # the schedule before issue 38, at TREE's calibrated costs
                    e = binary_tree_epoch(n, wl, link, o)
                else:
                    e = epoch(s, n, wl, link, o)
                eps = wl.examples / e["seconds"]
                table.setdefault(f"{rate / 1e9:g}gbit", {}).setdefault(s, {})[n] = {
                    **{k: v for k, v in e.items()}, "examples_per_s": eps,
                    "efficiency": eps / (n * wl.batch / wl.step_s)}
    return table


def direct_peer_costs(report: dict) -> Dict[str, float]:
    """``peer_s`` and ``connect_s`` at full speed, measured directly by
    bench_allreduce.py (``--worlds 2 4 8 16``): least squares of one rank's
    CPU seconds of ``connect`` over ``[1, k]`` and of a round of
    ``lenet_round`` over ``[1, k, bytes sent]``, ``k`` its :func:`partners`
    (the report's ``collective``)."""
    import numpy as np

    worlds = sorted(int(k[1:]) for k in report if k.startswith("w") and k[1:].isdigit())
    if len(worlds) < 3:
        raise ValueError(f"Expect bench_allreduce.py runs of at least 3 worlds, got {worlds}")
    collective = report.get("collective", "mesh")
    connect = np.linalg.lstsq(np.array([[1.0, float(partners(w, collective))] for w in worlds]),
                              np.array([report[f"w{w}"]["connect_cpu_ms_per_rank"] for w in worlds]), rcond=None)[0]
    rows = [[1.0, float(partners(w, collective)), report[f"w{w}"]["lenet_round"]["payload_bytes_per_rank"]]
            for w in worlds]
    cpu = [report[f"w{w}"]["lenet_round"]["cpu_ms_per_rank"] for w in worlds]
    x = _lstsq(rows, cpu)
    return {"connect_s": max(0.0, float(connect[1])) / 1e3, "peer_s": x[1] / 1e3, "fixed_s": x[0] / 1e3,
            "per_byte_s": x[2] / 1e3, "worlds": worlds}


def direct_sharing_costs(result: dict, scaled: dict, link: Link) -> Dict[str, dict]:
    """Sharing's per-iteration costs at full speed, measured directly: a
    ``bench_scale.py --runs topologies --hosts 2 --pin`` run (each rank a
    core of its own; ``--cpu 1.0``: a quota of a core, which the two hosts'
    quotas and the driver share on this machine's two cores), for PLAIN and
    TREE.

    At 2 ranks its phase timings give, unscaled: ``sync_s`` (the loop's
    time beyond the step less the lock-step wait and the exchanges: encode,
    send, apply, merge), the lock-step wait, all taken as ``lockstep_s`` --
    growing with ``log2 W`` from there, none of it fixed -- and the
    exchange (TREE's ``hop_s``) or a message's apply (PLAIN's ``apply_s``),
    each the larger of the direct figure and the scaled calibration's; the
    step is the fit's own (its last epoch's mean where the file has it, else
    its fit phase's), and so is ``stage_s``: what its last epoch took
    beyond its iterations at that step (the barrier stage's launch, the deal, the meeting),
    as :func:`calibrate_phases` takes it from the calibration runs.  The
    rest (``join_s``) stays the scaled calibration's (``scaled``: the
    calibrated overheads divided by ``--host-speedup``).
    Returns ``{strategy: {"overheads": ..., "step_s": ..., "measured": ...}}``."""
    points = measured_points([result], link.bits_per_s / 1e9)
    out = {}
    for s in ("sharing_plain", "sharing_tree"):
        pts = [p for p in points.get(s, []) if p["workers"] == 2 and "lockstep_s" in p]
        if not pts or s not in scaled:
            continue
        p = pts[0]
        iterations = math.ceil(p["examples"] / (p["workers"] * p["batch"]))
        # the fit's own step in the epoch measured (else the other strategy's, or another epoch's, steps would go
        # into the stage's cost: a disturbed PLAIN fit's steps once made TREE's stage negative)
        step = p.get("last_step_s", p["sharing_step_s"])
        stage = p["seconds"] - iterations * (step + p["loop_extra_s"])
        base = replace(Overheads(**scaled[s]["overheads"]), stage_s=max(0.0, stage))
        per_message = (p["loop_extra_s"] - p["lockstep_s"] - p["chain_s"]) if s == "sharing_plain" else 0.0
        if s == "sharing_tree":
            hop = max(p["chain_s"] / doubling_exchanges(2), base.hop_s)
            sync_s = p["loop_extra_s"] - p["lockstep_s"] - p["chain_s"]
            o = replace(base, sync_s=sync_s, lockstep_s=p["lockstep_s"], hop_s=hop)
        else:  # PLAIN's one peer message at 2 ranks: its apply is inside the loop's rest
            apply_s = max(base.apply_s, p.get("apply_per_iteration_s", 0.0) / max(_workload(p).messages_per_step, 1))
            o = replace(base, sync_s=max(0.0, per_message - apply_s * _workload(p).messages_per_step),
                        lockstep_s=p["lockstep_s"], apply_s=apply_s)
        out[s] = {"overheads": asdict(o), "step_s": step,
                  "measured": {**{k: p[k] for k in ("loop_extra_s", "lockstep_s", "chain_s", "seconds")},
                               "step_s": step, "stage_s": stage}}
    return out


#: Scenario fields that are neither Overheads' nor Workload's: ``two_level=1`` prices :func:`two_level`;
#: ``one_round=1`` pins one round per epoch (the issue-26 model's frequency, before the convergence bound).
SCENARIO_SWITCHES = ("two_level", "one_round")


def parse_scenario(text: str) -> tuple:
    """``"label:field=value,..."`` -> ``(label, {field: value})``; fields of
    :class:`Overheads` (the in-stage path's, at the predicted hosts' speed),
    :class:`Workload` (e.g. ``round_bytes``) or :data:`SCENARIO_SWITCHES`."""
    label, _, rest = text.partition(":")
    changes = {}
    for part in filter(None, rest.split(",")):
        name, _, value = part.partition("=")
        if (name not in Overheads.__dataclass_fields__ and name not in Workload.__dataclass_fields__
                and name not in SCENARIO_SWITCHES):
            raise ValueError(f"Expect a scenario's fields among Overheads', Workload's and {SCENARIO_SWITCHES}, "
                             f"got {name!r}")
        changes[name] = float(value)
    return label, changes


def predict_scenario(calibrated: dict, w: Workload, changes: Dict[str, float], workers: Sequence[int],
                     rates_bits: Sequence[float], examples_per_worker: int, latency_s: float = 50e-6) -> dict:
    """The in-stage path's predictions with ``changes`` applied to its overheads and the workload."""
    o = replace(Overheads(**calibrated["averaging_in_stage"]["overheads"]),
                **{k: v for k, v in changes.items() if k in Overheads.__dataclass_fields__})
    wl = replace(w, **{k: v for k, v in changes.items() if k in Workload.__dataclass_fields__})
    topology = "two_level" if changes.get("two_level") else "mesh"
    table = {}
    for rate in rates_bits:
        for n in workers:
            per_worker = math.ceil(examples_per_worker / wl.batch)
            e = averaging_in_stage_epoch(n, replace(wl, examples=examples_per_worker * n), Link(rate, latency_s), o,
                                         frequency=per_worker if changes.get("one_round") else None,
                                         topology=topology)
            table.setdefault(f"{rate / 1e9:g}gbit", {})[n] = {
                **e, "efficiency": (examples_per_worker * n / e["seconds"]) / (n * wl.batch / wl.step_s)}
    return {"overheads": asdict(o), "workload": asdict(wl), "predictions": table}


def spread_wait(spread: dict, lockstep_s: float, workers: int) -> Optional[float]:
    """The lock-step wait at ``workers`` ranks from a measured step spread
    (``bench_scale.step_spread``): ``lockstep_s`` measured at 2 ranks plus how
    much the spread's ``wait_at`` (ms, keys as JSON writes them) grows from 2
    to ``workers``; None where the spread has no figure for ``workers``."""
    table = {int(w): v / 1e3 for w, v in spread["wait_at"].items()}
    return lockstep_s + table[workers] - table[2] if workers in table else None


def spread_lockstep(rows: Dict[int, dict], spread: dict, lockstep_s: float, staleness: int = 0) -> Dict[int, dict]:
    """``rows`` (a sharing strategy's predictions at staleness 0) with the
    lock-step wait priced from the ranks' measured step spread instead of
    ``lockstep_s log2 W``: the wait measured at 2 ranks, grown as the mean
    of ``max - mean`` of ``W`` independent draws of the measured steps grows
    from 2 ranks to ``W`` (``bench_scale.step_spread``'s ``wait_at``, ms) --
    what a lock step over ``W`` ranks waits if every rank's steps spread as
    the measured ranks' did, the tail included.  Each iteration's wait is
    part of its time at staleness 0, so an epoch changes by ``iterations x``
    the difference; efficiency scales inversely."""
    if staleness:
        raise ValueError(f"Expect staleness 0 (the lock-step wait on every iteration), got {staleness}")
    out = {}
    for n, row in rows.items():
        wait = spread_wait(spread, lockstep_s, n)
        if wait is None:
            continue
        seconds = row["seconds"] + row["iterations"] * (wait - lockstep_s * math.log2(max(1, n)))
        out[n] = {**row, "seconds": seconds, "lockstep_s": wait,
                  "examples_per_s": row["examples_per_s"] * row["seconds"] / seconds,
                  "efficiency": row["efficiency"] * row["seconds"] / seconds}
    return out


def lockstep_check(small: dict, large: dict) -> Dict[str, dict]:
    """The two lock-step pricings held against a measurement: from a run on
    2 hosts (``small``), the wait for slower ranks' steps predicted at the
    host count of ``large`` (a run at the same speed) per doubling
    (``lockstep_s log2 W``) and from the 2-host steps' spread
    (:func:`spread_lockstep`'s growth), against what ``large`` measured
    (``bench_scale.exchange_chain``'s ``lockstep_s``).  Per sharing strategy
    both files ran; seconds, and each prediction's relative error."""
    if small["hosts"] != 2:
        raise ValueError(f"Expect the small run on 2 hosts, got {small['hosts']}")
    w = large["hosts"]
    out = {}
    for s, f in small["fits"].items():
        g = large["fits"].get(s)
        if not (g and (f.get("exchange_chain") or {}).get("lockstep_s") is not None
                and (f.get("step_spread") or {}).get("wait_at") and (g.get("exchange_chain") or {}).get("lockstep_s")):
            continue
        base, measured = f["exchange_chain"]["lockstep_s"], g["exchange_chain"]["lockstep_s"]
        rule, spread = base * math.log2(w), spread_wait(f["step_spread"], base, w)
        out[s] = {"workers": w, "measured_s": measured, "at_2_s": base, "per_doubling_s": rule, "spread_s": spread,
                  "per_doubling_error": rule / measured - 1, "spread_error": spread / measured - 1}
    return out


def scaling_limit(rows: Dict[int, dict], threshold: float = 0.5) -> Optional[int]:
    """The first worker count whose efficiency falls under ``threshold``, or None."""
    for n in sorted(rows):
        if rows[n]["efficiency"] < threshold:
            return n
    return None


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", nargs="+", help="bench_scale.py --runs scale, --runs topologies or --runs instage "
                                              "JSON files (2, 4, 8 hosts)")
    p.add_argument("--calibration-gbit", type=float, default=10.0,
                   help="the bandwidth of runs on unshaped links (veths: CPU-bound, ~10 Gbit/s); a run with a "
                        "rate has its own")
    p.add_argument("--examples-per-worker", type=int, default=7500,
                   help="predictions: weak scaling, examples per worker (Fashion-MNIST's 60k over 8)")
    p.add_argument("--host-speedup", type=float, default=1.0,
                   help="predictions: hosts this many times faster than the calibrated ones (step and every "
                        "calibrated CPU cost divided by it; bytes, links and the in-stage meeting unchanged), e.g. "
                        "5 for a full core against the 0.2-core quota of bench_scale.py")
    p.add_argument("--allreduce", default=None,
                   help="a bench_allreduce.py --worlds 2 4 8 16 JSON: the in-stage path's per-peer costs at full "
                        "speed measured directly, also predicted as the scenario 'direct_peer_costs'")
    p.add_argument("--scenario", action="append", default=[], metavar="LABEL:FIELD=VALUE,...",
                   help="the in-stage path predicted again with these overheads (at the predicted hosts' speed) or "
                        "workload fields changed, e.g. 'meeting_1s:meeting_s=1.0' (repeatable; applied after "
                        "--allreduce's)")
    p.add_argument("--direct-sharing", default=None, metavar="JSON",
                   help="a bench_scale.py --runs topologies --hosts 2 --pin (or --cpu 1.0) JSON: sharing's "
                        "per-iteration costs at full speed measured directly (direct_sharing_costs), predicted as "
                        "the sharing strategies' scenario 'direct_sharing_costs' (and, where the file has the ranks' "
                        "step spread, '<strategy>_spread': the lock-step wait from that spread, spread_lockstep)")
    p.add_argument("--lockstep-check", nargs=2, default=None, metavar=("TWO_HOSTS", "MORE_HOSTS"),
                   help="two bench_scale.py --runs topologies JSONs at one speed (2 hosts, then more): the wait for "
                        "slower ranks predicted from the first per doubling and from its step spread, against the "
                        "second's measurement (lockstep_check); printed and written into --out")
    p.add_argument("--check", nargs="+", default=[], metavar="JSON",
                   help="runs left out of the calibration: the calibrated model's error at their points")
    p.add_argument("--phases", action="store_true",
                   help="calibrate PLAIN and TREE from the ranks' phase timings per iteration (bench_scale files "
                        "with per_rank_iteration) rather than from epoch seconds alone")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    results = [json.load(open(f)) for f in args.results]
    link = Link(args.calibration_gbit * 1e9)
    cal = calibrate(results, link)
    if args.phases:  # sharing's overheads from the ranks' phase timings (calibrate_phases)
        cal.update(calibrate_phases(results, link))
    points = measured_points(results, args.calibration_gbit)
    k = args.host_speedup
    scaled = {s: {**c, "overheads": {n: v if n in Overheads.NOT_CPU else v / k for n, v in c["overheads"].items()}}
              for s, c in cal.items()}
    # the step: the in-stage rounds' slowest worker per minibatch where measured (what a round waits for); without
    # an averaging fit (--runs topologies), sharing's own
    ref = (points.get("averaging_in_stage") or points.get("averaging") or points["sharing_plain"])[-1]
    sharing = (points.get("sharing_plain") or [{}])[-1]
    w = Workload(examples=0, batch=ref["batch"], step_s=ref["step_s"] / k, state_bytes=ref["state_bytes"],
                 message_bytes=sharing.get("message_bytes", 0.0),
                 messages_per_step=sharing.get("messages_per_step", 1.0), params=sharing.get("params", 0),
                 round_bytes=ref.get("round_bytes", 0.0))
    workers = [2, 4, 8, 16, 32, 64, 128, 256]
    pred = predict(scaled, w, workers, [1e9, 10e9, 100e9], examples_per_worker=args.examples_per_worker)
    limits = {rate: {s: scaling_limit(rows) for s, rows in by.items()} for rate, by in pred.items()}
    at_256 = {rate: {s: round(rows[256]["efficiency"], 3) for s, rows in by.items()} for rate, by in pred.items()}
    scenarios, base = {}, {}
    if args.allreduce:
        direct = direct_peer_costs(json.load(open(args.allreduce)))
        base = {"peer_s": direct["peer_s"], "connect_s": direct["connect_s"]}
        scenarios["direct_peer_costs"] = {"changes": dict(base), "measured": direct}
    for text in args.scenario:
        label, changes = parse_scenario(text)
        scenarios[label] = {"changes": {**base, **changes}}
    for label, sc in scenarios.items():
        if "averaging_in_stage" not in scaled:
            break
        sc.update(predict_scenario(scaled, w, sc["changes"], workers, [1e9, 10e9, 100e9], args.examples_per_worker))
        for rate, rows in sc["predictions"].items():
            at_256[rate][f"averaging_in_stage[{label}]"] = round(rows[256]["efficiency"], 3)
    if args.direct_sharing:
        with open(args.direct_sharing) as fh:
            direct_run = json.load(fh)
        direct = direct_sharing_costs(direct_run, scaled, link)
        preds = {}
        for s_, d in direct.items():
            wd = replace(w, step_s=d["step_s"])
            table = predict({s_: {"overheads": d["overheads"]}}, wd, workers, [1e9, 10e9, 100e9],
                            examples_per_worker=args.examples_per_worker)
            spread = (direct_run["fits"].get(s_) or {}).get("step_spread")
            for rate, by in table.items():
                if spread and spread.get("wait_at"):  # the lock-step wait from the measured steps' spread
                    by[f"{s_}_spread"] = spread_lockstep(by[s_], spread, d["overheads"]["lockstep_s"])
                preds.setdefault(rate, {}).update(by)
                for name, rows in by.items():
                    if 256 in rows:
                        at_256[rate][f"{name}[direct_sharing_costs]"] = round(rows[256]["efficiency"], 3)
        scenarios["direct_sharing_costs"] = {"file": args.direct_sharing, "costs": direct, "predictions": preds,
                                             "efficiency_below_half_at": {r: {n: scaling_limit(rows)
                                                                             for n, rows in by.items()}
                                                                         for r, by in preds.items()}}
    if args.lockstep_check:
        small, large = (json.load(open(f)) for f in args.lockstep_check)
        scenarios["lockstep_check"] = {"files": args.lockstep_check, **lockstep_check(small, large)}
    checked = {}
    if args.check:
        for s_, pts in measured_points([json.load(open(f)) for f in args.check], args.calibration_gbit).items():
            if s_ in cal:
                o = Overheads(**cal[s_]["overheads"])
                checked[s_] = [{"workers": q["workers"], "measured_s": q["seconds"],
                                "model_s": model_seconds(s_, q, link, o),
                                "error": model_seconds(s_, q, link, o) / q["seconds"] - 1} for q in pts]
    out = {"calibration_link_gbit": args.calibration_gbit, "files": args.results, "checked_files": args.check,
           "checked": checked, "calibrated": cal,
           "workload": asdict(w), "host_speedup": k, "steady_epoch": STEADY_EPOCH,
           "examples_per_worker": args.examples_per_worker, "predictions": pred, "scenarios": scenarios,
           "efficiency_below_half_at": limits, "efficiency_at_256": at_256}
    text = json.dumps(out, indent=1, default=float)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text + "\n")
    print(json.dumps({"calibrated": {s: {"overheads": {n: v for n, v in c["overheads"].items() if v},
                                         "errors": [round(e["error"], 3) for e in c["points"]],
                                         "leave_one_out": [round(e["error"], 3) for e in c["leave_one_out"]]}
                                     for s, c in cal.items()},
                      "checked": {s: [round(e["error"], 3) for e in es] for s, es in checked.items()},
                      "efficiency_below_half_at": limits,
                      "efficiency_at_256": at_256}, indent=1))
    return out


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
