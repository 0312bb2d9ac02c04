#!/usr/bin/env python
"""Gradient sharing's algorithm on ``W`` replicas in one process, without Spark
or UDP: a quick way to try threshold rules, update scales and clipping on
the parity models of ``bench_parity.py`` (issue 22).

Each worker owns a replica of the network (its own updater state and
buffers), a :class:`~sparkavg.sharing.SharingState`, and a shard of the
examples (shuffled as one process's, cut in ``W`` equal shards, ``B`` per
minibatch).  Every iteration each worker computes its update on its own
replica, :func:`~sparkavg.sharing.encode_update` s it, applies its own
message at once and its peers' messages ``--delay`` iterations later (0:
the same iteration, as a quiet network; 1: one iteration late, as when a
peer's message arrives while the next minibatch trains).  After the last
iteration every message still in flight is applied (the epoch's flush), so
the replicas agree; buffers are averaged and updater states averaged, as
the sharing runner merges them.

    python benchmarks/sim_sharing.py --model lenet --variants "fixed:1e-3,adaptive:1e-3" --seeds 123

A variant is ``RULE:TAU[:key=value...]``: RULE ``fixed``, ``adaptive``
(``min``, ``max`` sparsity), ``target`` (``target``), or ``exact`` (a control:
the dense update itself is exchanged, no threshold; TAU ignored);
``scale=0.5`` multiplies each worker's update before encoding (0.5 with 2
workers: the default preset's update scale for SGD-like updaters,
:class:`~sparkavg.spark.policies.sharing.UpdateScale`); ``clip=0`` turns residual
clipping off, ``clip=K`` clips at K τ; ``levels=L`` also sends the residual
at τ·2^(L-1) .. τ·2 before τ (several messages an iteration, so no entry is
capped at one τ per step; an experiment, not in the library);
``view=1`` takes each worker's gradient at its own view, the shared
parameters plus its residual (the default preset's local view,
:class:`~sparkavg.spark.policies.sharing.LocalView`; without ``view=1`` the
simulation is sharing before issue 22, as the ``"dl4j"`` preset); ``group=segment|layer`` gives every parameter tensor
(or layer) its own τ and ``out=TAU`` the last layer a fixed τ (experiments);
``mask=m`` clears the first entries of the updater state (Nesterov's
velocity; Adam's first moment) where a message sent the entry (the
default preset's momentum masking for Nesterov, ``MomentumMasking``);
``exact=gamma`` (BatchNorm's gamma and beta), ``exact=unreg`` (every
unregularised vector: biases too) or ``exact=out`` (the last layer), ``exact=conv`` (the convolutions' weights),
``exact=notout`` (all but the last layer) exchanges
those entries densely and thresholds the rest (an experiment: one τ per
message is the library's); ``switch=E`` divides each worker's update by W
from epoch E on (``switch=1``: the default preset's update scale for Adam,
summed in the first epoch only).  ``--trace N`` logs the test accuracy every N
iterations; ``--diagnose`` the residual per tensor and the accuracy with the
residuals flushed into the parameters.  Prints accuracy after the epochs, the payload compression against
dense float32 updates (4 N bytes per peer per iteration), and the same for
one process at batch ``W B`` when ``--local`` is given.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

log = logging.getLogger("sim_sharing")
EXACT = None  # set by parse_variant (option exact=unreg|out|gamma)
SWITCH = 0  # set by parse_variant (option switch=E)
VIEW = 0  # set by parse_variant (option view=1: gradients at params + own residual, the preset's local view)
OUTRULE = None  # set by parse_variant (option out=TAU: the last layer's groups at FixedThreshold(TAU))
TRACE = 0  # set by main (--trace N): test accuracy every N iterations
DIAGNOSE = False  # set by main (--diagnose): the residual per tensor, and accuracy with it flushed
GROUP = None  # set by parse_variant (option group=segment|layer): one τ per group of entries
MASK = None  # set by parse_variant (option mask=m): Adam's first moment cleared where a message sent the entry


def parse_variant(text: str):
    """``(rule, clipping, scale, name)`` from ``RULE:TAU[:key=value...]``."""
    from sparkavg.sharing import AdaptiveThreshold, FixedThreshold, TargetSparsityThreshold
    from sparkavg.sharing.thresholds import CLIP_EVERY

    parts = text.split(":")
    kind, tau = parts[0], float(parts[1])
    opts = dict(p.split("=", 1) for p in parts[2:])
    scale = float(opts.pop("scale", 1.0))
    levels = int(opts.pop("levels", 1))
    global EXACT, SWITCH, GROUP, MASK
    EXACT = opts.pop("exact", None)
    GROUP = opts.pop("group", None)
    MASK = opts.pop("mask", None)
    global VIEW
    VIEW = int(opts.pop("view", 0))
    global OUTRULE
    OUTRULE = opts.pop("out", None)
    SWITCH = int(opts.pop("switch", 0))  # experiment: from this epoch on (when > 0), the update is divided by W
    clip = opts.pop("clip", "5")
    clipping = None if clip == "0" else (CLIP_EVERY, float(clip))  # a SharingState's clip: (every, k)
    if kind == "exact":  # a control: the dense update itself, no encoding
        rule = FixedThreshold(1.0)
        levels = 0
    elif kind == "fixed":
        rule = FixedThreshold(tau)
    elif kind == "adaptive":
        kw = {}
        if "min" in opts:
            kw["min_sparsity"] = float(opts.pop("min"))
        if "max" in opts:
            kw["max_sparsity"] = float(opts.pop("max"))
        rule = AdaptiveThreshold(initial=tau, **kw)
    elif kind == "target":
        rule = TargetSparsityThreshold(initial=tau, target=float(opts.pop("target", 1e-3)))
    else:
        raise ValueError(f"Expect a rule fixed, adaptive or target, got {kind!r}")
    if opts:
        raise ValueError(f"Expect options scale, clip, min, max, target, got {sorted(opts)}")
    return rule, clipping, scale, levels, text


def simulate(model, x, y, xt, yt, batch, workers, epochs, seed, variant, delay):
    from bench_parity import build
    from mnist_lenet import evaluate_local

    from sparkavg import ops
    from sparkavg.sharing import SharingState, apply_message, encode_update, local_view, message_bytes

    rule, clipping, scale, levels, name = variant
    nets = [build(model, seed) for _ in range(workers)]
    n = nets[0].num_params
    def sharing_state(rule, n):
        state = SharingState(rule, n)
        state.clip = clipping
        return state

    states = [sharing_state(rule, n) for _ in range(workers)]
    groups = [(0, n)]
    if GROUP:  # experiment: one SharingState (one τ) per parameter tensor or per layer
        segs = nets[0].param_segments
        if GROUP == "segment":
            groups = [(s.start, s.stop) for s in segs]
        else:
            bounds = {}
            for s in segs:
                lo, hi = bounds.get(s.layer, (s.start, s.stop))
                bounds[s.layer] = (min(lo, s.start), max(hi, s.stop))
            groups = sorted(bounds.values())
        last = max(s.layer for s in segs)
        out_start = min(s.start for s in segs if s.layer == last)
        from sparkavg.sharing import FixedThreshold as _Fixed
        def rule_for(lo):
            return _Fixed(float(OUTRULE)) if OUTRULE and lo >= out_start else rule
        states = [[sharing_state(rule_for(lo), hi - lo) for lo, hi in groups] for _ in range(workers)]
    update = np.zeros(n, np.float32)
    scratch = np.empty(n, np.float32)
    zeros = np.zeros(n, np.float32)
    extra = [ops.EncodingState() for _ in range(workers)]
    for e in extra:
        e.format = ops.SPARSE
    payload, messages, entries, iterations = 0, 0, 0, 0
    pending = []  # (due iteration, sender, bytes)

    def deliver(items) -> None:
        """Each (due, sender, wire) to every replica but its sender: a dense update or a message."""
        for _, sender, wire in items:
            for w, net in enumerate(nets):
                if w != sender:
                    if isinstance(wire, np.ndarray):
                        net.apply_update(wire)
                    elif isinstance(wire, tuple):
                        lo, hi, payload_ = wire
                        apply_message(payload_, net.params[lo:hi])
                    else:
                        apply_message(wire, net.params)
    mask = None
    if EXACT:  # experiment: these segments exchanged densely, the rest thresholded
        mask = np.zeros(n, np.float32)
        segs = nets[0].param_segments
        last = max(s.layer for s in segs)
        for s in segs:
            if (EXACT == "unreg" and not s.regularized) or (EXACT == "out" and s.layer == last) or \
                    (EXACT == "gamma" and s.name in ("gamma", "beta")) or (EXACT == "conv" and len(s.shape) == 4) or \
                    (EXACT == "notout" and s.layer != last):
                mask[s.start:s.stop] = 1.0
    t0 = time.perf_counter()
    for epoch in range(epochs):
        order = np.random.default_rng(seed + epoch).permutation(len(x))
        shards = np.array_split(order, workers)
        steps = min(-(-len(s) // batch) for s in shards)
        for it in range(steps):
            for w, (net, state) in enumerate(zip(nets, states)):
                idx = shards[w][it * batch:(it + 1) * batch]
                if VIEW and not GROUP:  # the library's local view (preset "sparkavg"): the same sums
                    scratch[...] = net.params  # the shared parameters (the replica applies messages to net.params)
                    local_view(state, scratch, net.params)
                    net.compute_update(x[idx], y[idx], update)
                    net.params[...] = scratch
                elif VIEW:
                    own = np.concatenate([g.residual for g in state])
                    scratch[...] = net.params
                    net.params[...] += own
                    net.compute_update(x[idx], y[idx], update)
                    net.params[...] = scratch
                else:
                    net.compute_update(x[idx], y[idx], update)
                if SWITCH and epoch >= SWITCH:
                    update *= 1.0 / workers
                elif scale != 1.0:
                    update *= scale
                out = []
                if mask is not None:
                    dense = update * mask
                    update *= 1.0 - mask
                    net.apply_update(dense)
                    pending.append((iterations + delay, w, dense))
                if levels == 0:
                    net.apply_update(update)
                    pending.append((iterations + delay, w, update.copy()))
                    payload += 4 * n * (workers - 1)
                elif levels > 1:
                    ops.accumulate(state.residual, update)
                    top = float(np.abs(state.residual).max()) / state.tau
                    high = min(levels - 1, int(np.floor(np.log2(top)))) if top >= 2 else 0
                    for level in range(high, 0, -1):
                        out.append(ops.encode(state.residual, state.tau * 2.0 ** level, extra[w]))
                    out.append(encode_update(state, zeros))
                elif GROUP:
                    for (lo, hi), st in zip(groups, state):
                        if MASK:
                            m = net.state["updater"][:n]
                            m[lo:hi][np.abs(st.residual + update[lo:hi]) >= np.float32(st.tau)] = 0.0
                        out.append((lo, hi, encode_update(st, update[lo:hi])))
                else:
                    if MASK:
                        net.state["updater"][:n][np.abs(state.residual + update) >= np.float32(state.tau)] = 0.0
                    out.append(encode_update(state, update))
                for message in out:
                    lo, hi = 0, n
                    if isinstance(message, tuple):
                        lo, hi, message = message
                    if message is None:
                        continue
                    wire = message_bytes(message)
                    payload += (len(wire) + (8 if GROUP else 0)) * (workers - 1)
                    messages += 1
                    entries += ops.encoded_count(message)
                    ops.decode(message, net.params[lo:hi])
                    pending.append((iterations + delay, w, (lo, hi, wire) if GROUP else wire))
            iterations += 1
            if TRACE and iterations % TRACE == 0:
                log.info("trace it %d: accuracy on the first 2000 test images %.4f", iterations,
                         evaluate_local(nets[0], xt[:2000], yt[:2000]).accuracy())
            deliver([p for p in pending if p[0] < iterations])
            pending = [p for p in pending if p[0] >= iterations]
        deliver(pending)  # the epoch's flush
        pending = []
        for vec in ("updater", "buffers"):
            if nets[0].state[vec].size:
                mean = sum(net.state[vec] for net in nets) / workers
                for net in nets:
                    net.load_state({vec: mean.astype(np.float32)})
    seconds = time.perf_counter() - t0
    diff = max(float(np.abs(nets[0].params - net.params).max()) for net in nets)
    accuracy = evaluate_local(nets[0], xt, yt).accuracy()
    extra_acc = {}
    if DIAGNOSE:  # residuals flushed into the parameters, BatchNorm statistics refreshed
        def copy_of(net):
            twin = build(model, seed)
            twin.load_state({k: net.state[k] for k in ("params", "updater", "buffers")})
            return twin
        probe = copy_of(nets[0])
        if not GROUP:
            r = states[0].residual / np.float32(states[0].tau)
            log.info("residual/tau: max %.2f, mean |.| %.3f, frac >0.5 %.3f; params rms %.4f",
                     np.abs(r).max(), np.abs(r).mean(), (np.abs(r) > 0.5).mean(), np.sqrt((nets[0].params ** 2).mean()))
            for sgm in nets[0].param_segments:
                rr = states[0].residual[sgm.start:sgm.stop]
                pp = nets[0].params[sgm.start:sgm.stop]
                log.info("  %d %s %s: |r| mean %.2e, params rms %.2e", sgm.layer, sgm.name, sgm.shape,
                         np.abs(rr).mean(), np.sqrt((pp ** 2).mean()))
        total = sum((st.residual for st in states) if not GROUP else
                    (np.concatenate([g.residual for g in st]) for st in states))
        probe.params[...] += total
        extra_acc["flushed"] = evaluate_local(probe, xt, yt).accuracy()
        half = copy_of(nets[0])
        half.params[...] += total / np.float32(workers)
        extra_acc["flushed_mean"] = evaluate_local(half, xt, yt).accuracy()
        for target, key in ((copy_of(nets[0]), "refreshed"), (probe, "flushed_refreshed")):
            saved = target.params.copy()
            rng = np.random.default_rng(0)
            for _ in range(50):
                idx = rng.choice(len(x), batch * workers, replace=False)
                target.compute_update(x[idx], y[idx], update)
            assert np.array_equal(saved, target.params)
            extra_acc[key] = evaluate_local(target, xt, yt).accuracy()
        log.info("diagnostics: %s", extra_acc)
    dense = 4 * n * (workers - 1) * iterations * workers
    return {"variant": name, "delay": delay, "accuracy": accuracy, "compression_payload": dense / max(payload, 1),
            "entries_per_message": entries / max(iterations * workers, 1), "num_params": n,
            "final_tau": states[0][0].tau if GROUP else states[0].tau,
            "replica_max_abs_diff": diff, "seconds": seconds, "iterations": iterations, **extra_acc}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="lenet")
    p.add_argument("--data", default="12k")
    p.add_argument("--variants", default="fixed:1e-3")
    p.add_argument("--seeds", default="123")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--delay", type=int, default=1)
    p.add_argument("--local", action="store_true", help="also one process at batch W*B")
    p.add_argument("--trace", type=int, default=0, help="log test accuracy (2000 images) every N iterations")
    p.add_argument("--diagnose", action="store_true",
                   help="log the residual per tensor and the accuracy with the residuals flushed into the "
                        "parameters and with BatchNorm's statistics refreshed")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    global TRACE, DIAGNOSE
    TRACE, DIAGNOSE = args.trace, args.diagnose
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    from bench_parity import BATCH, DATA, FLAT, local_run

    from sparkavg.data.mnist import default_data_dir, load_mnist
    from sparkavg.threads import set_threads

    set_threads(1)
    n_ex, epochs = DATA[args.data]
    x, y = load_mnist(default_data_dir(), "train")
    xt, yt = load_mnist(default_data_dir(), "test")
    x, y = x[:n_ex], y[:n_ex]
    if args.model in FLAT:
        x, xt = x.reshape(len(x), -1), xt.reshape(len(xt), -1)
    batch = BATCH[args.model]
    rows = []
    for seed in [int(s) for s in args.seeds.split(",")]:
        if args.local:
            acc, _ = local_run(args.model, x, y, xt, yt, args.workers * batch, epochs, seed, 1)
            rows.append({"variant": "one process", "seed": seed, "accuracy": acc})
            log.info("%s seed %d one process: %.4f", args.model, seed, acc)
        for text in args.variants.split(","):
            r = simulate(args.model, x, y, xt, yt, batch, args.workers, epochs, seed, parse_variant(text), args.delay)
            r["seed"] = seed
            rows.append(r)
            log.info("%s seed %d %s: %.4f, %.0fx payload, %.0f entries/step, tau %.3g, diff %.1e, %.0f s",
                     args.model, seed, text, r["accuracy"], r["compression_payload"], r["entries_per_message"],
                     r["final_tau"], r["replica_max_abs_diff"], r["seconds"])
            if args.out:
                with open(args.out, "w") as fh:
                    json.dump({"argv": sys.argv[1:] if argv is None else argv, "model": args.model,
                               "data": args.data, "rows": rows}, fh, indent=2)
    return rows


if __name__ == "__main__":
    main()
