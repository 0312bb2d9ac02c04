#!/usr/bin/env python
"""A cost model of one epoch for both masters and both sharing topologies
(issue 26), calibrated from bench_scale.py's 2-, 4- and 8-host runs and
used to predict 16-256 workers at 1, 10 and 100 Gbit/s.

Pure Python (no Spark).  An epoch of ``N`` examples on ``W`` workers of
batch ``b`` gives each worker ``M = ceil(N / (W b))`` minibatches of
``step`` seconds each.

**Parameter averaging** (:func:`averaging_epoch`): ``R = ceil(M / F)``
rounds of ``F`` minibatches; a round costs a fixed ``round_s`` (job
launch, task start, the driver's merge), ``task_s`` per worker (the
driver schedules and deserialises every task's result), the broadcast of
the state ``S`` bytes (torrent: about ``S / B`` from the driver's link)
and the results back.  With Spark blocks (the default) the round is one
``runJob`` whose ``W`` results all cross the driver's link: ``W S / B``;
with ``treeAggregate`` of depth ``d`` (shared files) the executors merge
first and each level takes ``W^(1/d)`` results: ``d W^(1/d) S / B``.
``F`` "auto" keeps the round overhead at ``target`` (3%) of a round, at
most 400 and at most ``M`` (ParameterAveraging's rule, approximately).

**Gradient sharing** (:func:`sharing_epoch`): one stage per epoch
(``stage_s``, ``join_s`` per rank), then ``M`` iterations of
``max(cpu, out / B, in / B)``: the CPU does the step and applies every
other rank's message (``apply_s`` each, ``W - 1`` per iteration); a rank
receives ``W - 1`` messages of ``m`` bytes per iteration with either
topology; it sends ``W - 1`` (``PLAIN``) or, in the ``MESH`` relay tree of
fan-out 8, a relay with ``k`` neighbours forwards every message to the
``k - 1`` others: ``k + (W - 1)(k - 1)`` sends, so the busiest rank sends
about ``8 (W - 1)`` messages -- MESH bounds a rank's peers, not its bytes.

**TREE** (issue 38, :func:`tree_epoch`): the messages are summed up a binary
tree and the total comes back down; every rank applies one message per
iteration.  With ``staleness=0`` the sums sit on the iteration's critical
path: ``step + 2 D hop_s + bytes / B`` with ``D`` the tree's depth
(:func:`tree_depth`), ``hop_s`` the calibrated CPU of one hop (receiving,
merging, forwarding), and the bytes of the deepest path: up, the merged
message of ``2^j - 1`` ranks at hop ``j``; down, the total, ``D`` times.
A merge of ``k`` ranks' messages (each a fraction ``d`` of the ``N``
parameters) carries ``N (1 - (1 - d)^k)`` indices of 5 bytes (index and
int8 count) or, when smaller, ``N`` bytes dense (:func:`merged_bytes`;
independent indices: an upper bound, gradients overlap more).

``python benchmarks/cost_model.py benchmarks/results/scale_scale_h{2,4,8}.json``
calibrates, prints the error at each measured point and the predictions.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass, replace
from typing import Dict, List, Optional, Sequence

__all__ = ["Workload", "Link", "Overheads", "averaging_epoch", "sharing_epoch", "auto_frequency", "mesh_sends",
           "tree_depth", "merged_bytes", "tree_epoch", "calibrate", "predict", "STRATEGIES"]

STRATEGIES = ("averaging", "sharing_plain", "sharing_mesh", "sharing_tree")
MESH_FANOUT = 8
TREE_FANOUT = 2  # sparkavg.transport.limits.TREE_FANOUT
MERGED_HEADER_BYTES = 28


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
    sync_s: float = 0.0      # sharing: per iteration whatever the world size (the lock-step wait, encode, send)


def auto_frequency(round_overhead_s: float, step_s: float, per_worker: int, target: float = 0.03,
                   bound: int = 400) -> int:
    """ParameterAveraging's "auto" frequency, approximately: the fewest
    minibatches per round that keep ``round_overhead_s`` at or under
    ``target`` of a round, at most ``bound`` and ``per_worker``; rounds evened."""
    need = math.ceil(round_overhead_s * (1 - target) / (target * step_s)) if step_s > 0 else bound
    f = max(1, min(bound, per_worker, need))
    rounds = math.ceil(per_worker / f)
    return math.ceil(per_worker / rounds)


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
    f = frequency if frequency is not None else auto_frequency(overhead, w.step_s, per_worker)
    rounds = math.ceil(per_worker / f)
    compute = per_worker * w.step_s
    total = o.epoch_s + rounds * overhead + compute
    return {"seconds": total, "rounds": rounds, "frequency": f, "compute_s": compute, "round_overhead_s": overhead,
            "bytes_per_rank": rounds * 2 * w.state_bytes,
            "driver_bytes": rounds * (w.state_bytes + workers * w.state_bytes if depth is None
                                      else w.state_bytes + math.ceil(workers ** (1.0 / depth)) * w.state_bytes)}


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


def sharing_epoch(workers: int, w: Workload, link: Link, o: Overheads, topology: str = "plain") -> Dict[str, float]:
    """Seconds of one sharing epoch and its parts (``topology`` "plain" or "mesh")."""
    iterations = math.ceil(w.examples / (workers * w.batch))
    received = (workers - 1) * w.messages_per_step
    sent = received if topology == "plain" else mesh_sends(workers) * w.messages_per_step
    relayed = 0.0 if topology == "plain" else max(0.0, sent - w.messages_per_step)
    cpu = w.step_s + o.sync_s + received * o.apply_s + relayed * o.relay_s
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


def tree_epoch(workers: int, w: Workload, link: Link, o: Overheads, staleness: int = 0) -> Dict[str, float]:
    """Seconds of one TREE sharing epoch and its parts.  At ``staleness``
    ``s`` the sums of iteration ``k`` must be back before step ``k + s + 1``:
    an iteration takes ``max(step + 2 hop_s, (step + chain + bytes) / (s + 1))``
    (a rank's own share of the hops, or the chain spread over ``s + 1`` steps)."""
    iterations = math.ceil(w.examples / (workers * w.batch))
    depth = tree_depth(workers)
    total = merged_bytes(workers, w)
    up = sum(merged_bytes(min(workers, 2 ** j - 1), w) for j in range(1, depth + 1))
    network = (up + depth * total) / link.bytes_per_s + 2 * depth * link.latency_s
    chain = 2 * depth * o.hop_s
    step = w.step_s + o.sync_s
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
    return sharing_epoch(workers, w, link, o, topology=strategy.split("_")[1])


# -- calibration ------------------------------------------------------------------------------

def _lstsq(rows: List[List[float]], targets: List[float]) -> List[float]:
    """Non-negative least squares for 1-2 unknowns (enumerates the active sets)."""
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


def measured_points(results: Sequence[dict]) -> Dict[str, List[dict]]:
    """Per strategy, one point per host count: the last epoch's seconds and what the model needs
    (``bench_scale.py --runs topologies`` files have no averaging fit: sharing's own step then)."""
    points: Dict[str, List[dict]] = {s: [] for s in STRATEGIES}
    for r in results:
        fits = r["fits"]
        avg = fits.get("averaging") or fits["sharing_plain"]
        step = avg["fit_phase"]["mean"]
        for s in STRATEGIES:
            if s not in fits:
                continue
            f = fits[s]
            p = {"workers": r["hosts"], "seconds": f["epoch_seconds"][-1], "examples": f["examples"][-1],
                 "step_s": step, "state_bytes": f["state_bytes"], "batch": r["batch_size_per_worker"]}
            if s == "averaging":
                p["frequency"] = f["averaging_frequency"][-1]
                p["rounds"] = f["rounds"][-1]
            else:
                sp = fits["sharing_plain" if s == "sharing_tree" else s]["sparkavg"]  # TREE: PLAIN's messages
                # one message delivered to one rank (a message goes to W - 1 peers, directly or relayed)
                p["message_bytes"] = sp["bytes_sent"] / max(sp["messages_received"], 1)
                iterations = math.ceil(p["examples"] / (r["hosts"] * p["batch"])) * len(f["epoch_seconds"])
                p["messages_per_step"] = sp["messages_sent"] / max(iterations * r["hosts"], 1)
                # in-run step time of sharing (its own fit phase, same model and quota)
                p["sharing_step_s"] = f["fit_phase"]["mean"]
                p["params"] = f.get("num_params", 0)
                per = f.get("per_rank_iteration")
                if per:  # sparkavg's own counters: every datagram sent and received, per rank and iteration
                    p["bytes_per_iteration"] = per["bytes_sent"] + per["bytes_received"]
                    # the ranks' loop beyond the step, per iteration (their own phase timings)
                    p["loop_extra_s"] = per["wait_s"] + per["apply_s"] + per["encode_s"] + per["send_s"]
            points[s].append(p)
    for s in points:
        points[s].sort(key=lambda p: p["workers"])
    return points


def _workload(p: dict, message_bytes=0.0, messages_per_step=1.0) -> Workload:
    return Workload(p["examples"], p["batch"], p.get("sharing_step_s", p["step_s"]), p["state_bytes"],
                    p.get("message_bytes", message_bytes), p.get("messages_per_step", messages_per_step),
                    p.get("params", 0))


def fit_overheads(strategy: str, points: List[dict], link: Link, apply_s: float = 0.0) -> Overheads:
    """Least-squares (relative error) overheads of one strategy from its
    points; MESH takes PLAIN's ``apply_s`` (every rank applies every message
    in both) and fits its stage and relay costs."""
    rows, targets = [], []
    for p in points:
        w = _workload(p)
        if strategy == "averaging":
            base = averaging_epoch(p["workers"], w, link, Overheads(), frequency=p["frequency"])
            # seconds = base + rounds * round_s + rounds * W * task_s   (epoch_s folded into round_s: R is ~1-3)
            rows.append([base["rounds"], base["rounds"] * p["workers"]])
            targets.append(p["seconds"] - base["seconds"])
        elif strategy == "sharing_tree":
            base = tree_epoch(p["workers"], w, link, Overheads())
            # seconds = base + stage_s + iterations * 2 D hop_s
            rows.append([1.0, base["iterations"] * 2 * base["depth"]])
            targets.append(p["seconds"] - base["seconds"])
        else:
            topology = strategy.split("_")[1]
            base = sharing_epoch(p["workers"], w, link, Overheads(apply_s=apply_s), topology)
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
    w = _workload(p)
    if strategy == "averaging":
        return averaging_epoch(p["workers"], w, link, o, frequency=p["frequency"])["seconds"]
    return epoch(strategy, p["workers"], w, link, o)["seconds"]


def calibrate(results: Sequence[dict], link: Link) -> dict:
    """Overheads per strategy, the model's error at each measured point
    (fitted on all points) and when each point is left out of the fit."""
    points = measured_points(results)
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
                e = epoch(s, p["workers"], _workload(p), link, o)
                errors[-1].update(measured_bytes_per_iteration=p["bytes_per_iteration"],
                                  model_bytes_per_iteration=e["bytes_per_rank_mean"] / e["iterations"])
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
    iteration, ``bench_scale.py``'s ``per_rank_iteration``) is fitted as
    ``sync_s + x cost`` with ``x`` the peer messages a rank receives
    (PLAIN: ``(W - 1) q``, ``cost`` = ``apply_s``) or the hops of the sums
    (TREE: ``2 D``, ``cost`` = ``hop_s``); ``stage_s`` is the mean of what
    the epoch took beyond its iterations.  The per-epoch and per-iteration
    costs are then measured apart rather than told apart by a fit of three
    epoch times, which a loaded machine's noise defeats."""
    points = measured_points(results)
    out = {}
    for s in ("sharing_plain", "sharing_tree"):
        pts = [p for p in points[s] if "loop_extra_s" in p]
        if len(pts) < 2:
            continue
        rows, targets, rests = [], [], []
        for p in pts:
            w = _workload(p)
            x = ((p["workers"] - 1) * w.messages_per_step if s == "sharing_plain"
                 else 2 * tree_depth(p["workers"]))
            rows.append([1.0, x])
            targets.append(p["loop_extra_s"])
            iterations = math.ceil(p["examples"] / (p["workers"] * p["batch"]))
            rests.append(p["seconds"] - iterations * (w.step_s + p["loop_extra_s"]))
        sync, cost = _lstsq(rows, targets)
        stage = max(0.0, sum(rests) / len(rests))
        o = (Overheads(stage_s=stage, sync_s=sync, apply_s=cost) if s == "sharing_plain"
             else Overheads(stage_s=stage, sync_s=sync, hop_s=cost))
        errors = [{"workers": p["workers"], "measured_s": p["seconds"], "model_s": model_seconds(s, p, link, o),
                   "error": model_seconds(s, p, link, o) / p["seconds"] - 1,
                   "measured_loop_extra_s": p["loop_extra_s"], "model_loop_extra_s": sync + cost * row[1]}
                  for p, row in zip(pts, rows)]
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
        for s in STRATEGIES + ("averaging_tree", "sharing_tree_staleness1"):
            key = {"averaging_tree": "averaging", "sharing_tree_staleness1": "sharing_tree"}.get(s, s)
            if key not in calibrated:
                continue
            o = Overheads(**calibrated[key]["overheads"])
            for n in workers:
                wl = replace(w, examples=examples_per_worker * n) if examples_per_worker else w
                if s == "averaging_tree":
                    e = averaging_epoch(n, wl, link, o, depth=2)
                elif s == "sharing_tree_staleness1":
                    e = tree_epoch(n, wl, link, o, staleness=1)
                else:
                    e = epoch(s, n, wl, link, o)
                eps = wl.examples / e["seconds"]
                table.setdefault(f"{rate / 1e9:g}gbit", {}).setdefault(s, {})[n] = {
                    **{k: v for k, v in e.items()}, "examples_per_s": eps,
                    "efficiency": eps / (n * wl.batch / wl.step_s)}
    return table


def scaling_limit(rows: Dict[int, dict], threshold: float = 0.5) -> Optional[int]:
    """The first worker count whose efficiency falls under ``threshold``, or None."""
    for n in sorted(rows):
        if rows[n]["efficiency"] < threshold:
            return n
    return None


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", nargs="+", help="bench_scale.py --runs scale JSON files (2, 4, 8 hosts)")
    p.add_argument("--calibration-gbit", type=float, default=10.0,
                   help="the simulated links' bandwidth for calibration (unshaped veths: CPU-bound, ~10 Gbit/s)")
    p.add_argument("--examples-per-worker", type=int, default=7500,
                   help="predictions: weak scaling, examples per worker (Fashion-MNIST's 60k over 8)")
    p.add_argument("--host-speedup", type=float, default=1.0,
                   help="predictions: hosts this many times faster than the calibrated ones (step and every "
                        "calibrated CPU cost divided by it; bytes and links unchanged), e.g. 5 for a full core "
                        "against the 0.2-core quota of bench_scale.py")
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
    points = measured_points(results)
    ref = points["sharing_plain"][-1]
    k = args.host_speedup
    scaled = {s: {**c, "overheads": {n: v / k for n, v in c["overheads"].items()}} for s, c in cal.items()}
    step = (points["averaging"] or points["sharing_plain"])[-1]["step_s"]
    w = Workload(examples=0, batch=ref["batch"], step_s=step / k,
                 state_bytes=ref["state_bytes"], message_bytes=ref["message_bytes"],
                 messages_per_step=ref["messages_per_step"], params=ref.get("params", 0))
    workers = [2, 4, 8, 16, 32, 64, 128, 256]
    pred = predict(scaled, w, workers, [1e9, 10e9, 100e9], examples_per_worker=args.examples_per_worker)
    limits = {rate: {s: scaling_limit(rows) for s, rows in by.items()} for rate, by in pred.items()}
    out = {"calibration_link_gbit": args.calibration_gbit, "calibrated": cal, "workload": asdict(w),
           "host_speedup": k,
           "examples_per_worker": args.examples_per_worker, "predictions": pred,
           "efficiency_below_half_at": limits}
    text = json.dumps(out, indent=1, default=float)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text + "\n")
    print(json.dumps({"calibrated": {s: {"overheads": c["overheads"], "errors": [round(e["error"], 3) for e in
                                                                                   c["points"]],
                                         "leave_one_out": [round(e["error"], 3) for e in c["leave_one_out"]]}
                                     for s, c in cal.items()}, "efficiency_below_half_at": limits}, indent=1))
    return out


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
