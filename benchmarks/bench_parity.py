#!/usr/bin/env python
"""Accuracy parity of the masters against one process, model by model (issue 22).

Every cell trains one model on Fashion-MNIST with one master on ``local[2]``
(2 workers x ``B`` examples per minibatch) and compares the test accuracy
after the same epochs with one 2-thread process at batch ``2 B`` (the same
examples per update), same initial weights, same data.  The one-process run
of a (model, data, seed) is shared by its masters.  Speed: the one process's
training seconds over the master's (``trainer.history`` seconds, epochs
only); NOT an exclusive-lock figure unless the run was (see ``load``).

Models (``--models``):

``lenet``   DL4J's LeNet, Adam(1e-3), 32 per worker.
``mlp``     DL4J's MnistMLP: 784-500-100-10 leaky ReLU, Nesterov(lr=0.05,
            momentum=0.9), L2 1e-4, 16 per worker (DL4J's).
``sgd``     784-256-10 relu MLP with plain SGD(lr=0.1), 32 per worker.
``resnet``  examples/mnist_resnet.py's ``build()`` (Adam), 32 per worker.
``lstm``    examples/mnist_lstm.py's ``build()`` (Adam), 32 per worker.
``torch-resnet``, ``torch-lstm``  issue 21's torch modules
            (``sparkavg.torch.zoo:resnet`` / ``:lstm``) as ``TorchModel`` with
            sparkavg's Adam(1e-3), 32 per worker; the one process is the same
            ``TorchModel`` fitted at 2 x 32 (``bench_torch.py``'s one process
            uses ``torch.optim.Adam`` instead).

Data (``--data``): ``12k`` (the first 12,000 training images, 1 epoch),
``60k`` (all 60,000, 3 epochs), ``12kx2`` (12,000 x 2 epochs, issue 21's
torch cells).  Masters (``--masters``): ``defaults``
(``ParameterAveraging()``), ``dl4j`` (``ParameterAveraging.dl4j()``: DL4J's
behaviour, averaging every 5 minibatches, the unweighted mean, the updater
state averaged plainly, no block momentum, equal shares), ``f5``
(``averaging_frequency=5``, the rest default), ``sharing``
(``GradientSharing()``); also ``f<N>`` / ``auto`` with ``-dl4j`` (the
``dl4j`` preset at that frequency, e.g. ``f32,f32-dl4j`` for what the
default preset's block momentum and moment correction give there).
``sharing-plain`` and ``sharing-tree`` name the topology (issue 38).
``sharing-dl4j`` is ``GradientSharing.dl4j()`` (DL4J's: asynchronous, whole
updates summed, gradients at the shared parameters, no momentum masking).
``sharing-fixed`` is sharing at its defaults before issue 22's sharing work
(``FixedThreshold(1e-3)`` under the ``dl4j`` preset; bounded staleness stays).
``sharing@VARIANT`` is sharing with the threshold rule of a
``sim_sharing.py`` variant, e.g. ``sharing@adaptive:1e-3:max=0.02`` (the
master's residual clipping is always DL4J's and its update scale the
preset's, so a variant may not set ``clip=`` or ``scale=``).
``--seeds 123,124`` runs every cell per seed (the table shows the mean).
``--baseline FILE...`` reuses the one-process runs of earlier ``--out`` files
(same model, data and seed) instead of training them again.  Sharing cells
record ``compression_wire`` (dense float32 bytes over bytes on the wire) and
``replica_max_abs_diff``.

    python benchmarks/bench_parity.py --models lenet,mlp,sgd --data 12k --out benchmarks/results/parity_12k.json
    python benchmarks/bench_parity.py --table benchmarks/results/parity_*.json   # one table from pieces

Prints a table (and the JSON with --out; the file is rewritten after every
cell, so an interrupted run keeps what it measured).
"""
from __future__ import annotations

import argparse
import glob
import json
import logging
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))

MODELS = ("lenet", "mlp", "sgd", "resnet", "lstm", "torch-resnet", "torch-lstm")
DATA = {"12k": (12000, 1), "60k": (60000, 3), "12kx2": (12000, 2)}
BATCH = {"lenet": 32, "mlp": 16, "sgd": 32, "resnet": 32, "lstm": 32, "torch-resnet": 32, "torch-lstm": 32}
FLAT = {"mlp", "sgd"}  # models that take (784,) vectors

log = logging.getLogger("bench_parity")


def build(model: str, seed: int):
    """The network of ``model`` with initial weights from ``seed``."""
    from sparkavg.nn import SGD, Dense, Nesterov, Network, Output

    if model == "lenet":
        from mnist_lenet import build as lenet
        return lenet(seed=seed)
    if model == "resnet":
        from mnist_resnet import build as resnet
        return resnet(seed=seed)
    if model == "lstm":
        from mnist_lstm import build as lstm
        return lstm(seed=seed)
    if model.startswith("torch-"):
        from sparkavg.nn import Adam
        from sparkavg.torch import TorchModel
        return TorchModel(f"sparkavg.torch.zoo:{model[6:]}", updater=Adam(lr=1e-3), input_shape=(1, 28, 28),
                          seed=seed)
    if model == "mlp":
        return Network((784,), [Dense(500, activation="leaky_relu"), Dense(100, activation="leaky_relu"),
                                Output(10, activation="softmax", loss="nll")],
                       updater=Nesterov(lr=0.05, momentum=0.9), l2=1e-4, seed=seed)
    if model == "sgd":
        return Network((784,), [Dense(256, activation="relu"), Output(10, activation="softmax", loss="nll")],
                       updater=SGD(lr=0.1), seed=seed)
    raise ValueError(f"Expect a model in {MODELS}, got {model!r}")


def make_master(spec: str, batch: int, workers: int, seed: int):
    """The master a ``--masters`` entry names."""
    from sparkavg.spark import GradientSharing, ParameterAveraging

    common = {"batch_size_per_worker": batch, "workers": workers, "seed": seed}
    if spec == "defaults":
        return ParameterAveraging(**common)
    if spec == "dl4j":  # DL4J's ParameterAveragingTrainingMaster
        return ParameterAveraging.dl4j(**common)
    if spec == "sharing":
        return GradientSharing(**common)
    if spec in ("sharing-plain", "sharing-tree"):  # issue 38: a topology named, not decided by the worker count
        from sparkavg.spark import Topology

        return GradientSharing(topology=Topology(spec.split("-")[1]), **common)
    if spec == "sharing-dl4j":  # DL4J's SharedTrainingMaster
        return GradientSharing.dl4j(**common)
    if spec == "sharing-fixed":  # before issue 22's sharing work: FixedThreshold(1e-3), updates summed, no view
        from sparkavg.sharing import FixedThreshold

        return GradientSharing.dl4j(threshold=FixedThreshold(1e-3), staleness=0, **common)
    if spec.startswith("sharing@"):  # sharing with a sim_sharing.py variant's rule: sharing@adaptive:1e-3:max=0.05
        from sim_sharing import parse_variant

        from sparkavg.sharing.thresholds import CLIP_EVERY, CLIP_K

        text = spec[len("sharing@"):]
        rule, clipping, scale, _, _ = parse_variant(text)
        if scale != 1.0 or clipping != (CLIP_EVERY, CLIP_K):
            raise ValueError(f"Expect a variant without scale= or clip= (the master's update scale is its preset's "
                             f"and its clipping DL4J's), got {spec!r}")
        return GradientSharing(threshold=rule, **common)
    base, _, variant = spec.partition("-")
    if base == "auto":
        frequency = "auto"
    elif base.startswith("f") and base[1:].isdigit():
        frequency = int(base[1:])
    else:
        raise ValueError(f"Expect a master in defaults, dl4j, sharing, sharing-plain, sharing-tree, sharing-dl4j, "
                         f"sharing-fixed, sharing@VARIANT, f<N>, auto (f<N> and auto with -dl4j), got {spec!r}")
    if variant not in ("", "dl4j"):
        raise ValueError(f"Expect -dl4j or nothing after {base!r}, got {spec!r}")
    return ParameterAveraging(averaging_frequency=frequency, preset="dl4j" if variant else "sparkavg", **common)


def local_run(model, x, y, xt, yt, batch, epochs, seed, threads):
    """One process at ``batch``: (accuracy after the last epoch, training seconds)."""
    from mnist_lenet import evaluate_local

    from sparkavg.data.batching import minibatches
    from sparkavg.threads import limit_threads

    net = build(model, seed)
    seconds = 0.0
    with limit_threads(threads):
        for epoch in range(epochs):
            t = time.perf_counter()
            for xb, yb in minibatches(x, y, batch, shuffle=True, seed=seed + epoch):
                net.fit_batch(xb, yb)
            seconds += time.perf_counter() - t
        accuracy = evaluate_local(net, xt, yt).accuracy()
    return accuracy, seconds


def spark_run(spark, model, spec, rdd, xt, yt, epochs, batch, workers, seed):
    """One master: accuracy, training seconds, frequencies and decisions."""
    from mnist_lenet import evaluate_local

    from sparkavg.spark import SparkTrainer

    master = make_master(spec, batch, workers, seed)
    trainer = SparkTrainer(spark, build(model, seed), master)
    try:
        trainer.fit(rdd, epochs=epochs)
        history = trainer.history
        decisions = [{"name": d["name"], "epoch": d["epoch"], "value": d["value"], "reason": d["reason"]}
                     for d in trainer.stats.decisions
                     if d["name"] in ("averaging_frequency", "block_momentum", "moment_correction")]
        accuracy = evaluate_local(trainer.network, xt, yt).accuracy()
    finally:
        trainer.close()
    return {"accuracy": accuracy, "seconds": sum(h["seconds"] for h in history),
            "epoch_seconds": [h["seconds"] for h in history],
            "averaging_frequency": [h.get("averaging_frequency") for h in history],
            "rounds": [h.get("rounds") for h in history], "decisions": decisions,
            "master_config": master.to_config(), **sharing_figures(trainer.stats)}


def sharing_figures(stats) -> dict:
    """Gradient sharing's bytes against dense float32 updates and replica agreement (empty for averaging)."""
    ratio = stats.compression_ratio
    if ratio is None:
        return {}
    diffs = [p[1] for pts in stats.series_data.get("replica_max_abs_diff", {}).values() for p in pts]
    return {"compression_wire": ratio, "replica_max_abs_diff": max(diffs) if diffs else None}


def baselines(patterns) -> dict:
    """One-process accuracies and seconds by (model, data, seed) from earlier ``--out`` files."""
    found = {}
    for pattern in patterns:
        for path in sorted(glob.glob(pattern)):
            with open(path) as fh:
                for c in json.load(fh).get("cells", []):
                    found[(c["model"], c["data"], c["seed"])] = (c["local_accuracy"], c["local_seconds"])
    return found


def cell_key(c):
    return (c["model"], c["data"], c["master"])


def table(cells) -> str:
    """Mean over seeds per (model, data, master): accuracy gap and speed."""
    groups = {}
    for c in cells:
        groups.setdefault(cell_key(c), []).append(c)
    lines = ["| model | data | master | seeds | one process | master | gap (points) | speed | F per epoch (sharing: bytes) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for (model, data, master), cs in sorted(groups.items(), key=lambda kv: (MODELS.index(kv[0][0]), kv[0][1:])):
        local = statistics.mean(c["local_accuracy"] for c in cs)
        acc = statistics.mean(c["accuracy"] for c in cs)
        speed = statistics.mean(c["local_seconds"] / c["seconds"] for c in cs)
        f = cs[0].get("averaging_frequency") or []
        fs = ",".join("-" if v is None else str(v) for v in f)
        ratios = [c["compression_wire"] for c in cs if c.get("compression_wire")]
        if ratios:  # sharing: its bytes against dense float32 updates instead of a frequency
            fs = f"{statistics.mean(ratios):.0f}x fewer bytes"
        gap = 100 * (acc - local)
        mark = "" if gap >= -0.5 else " **x**"
        lines.append(f"| {model} | {data} | {master} | {len(cs)} | {local:.4f} | {acc:.4f} | {gap:+.2f}{mark} | "
                     f"{speed:.2f}x | {fs} |")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="lenet,mlp,sgd")
    p.add_argument("--data", default="12k")
    p.add_argument("--masters", default="defaults,f5,sharing")
    p.add_argument("--seeds", default="123")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--data-dir", default=None)
    p.add_argument("--out", default=None)
    p.add_argument("--table", nargs="*", default=None, help="print one table from these JSON files and exit")
    p.add_argument("--baseline", nargs="*", default=(),
                   help="reuse the one-process runs of these JSON files (same model, data and seed) instead of "
                        "training them again")
    args = p.parse_args(argv)
    if args.table is not None:
        cells = []
        for pattern in args.table:
            for path in sorted(glob.glob(pattern)):
                with open(path) as fh:
                    cells += json.load(fh)["cells"]
        print(table(cells))
        return cells
    models = [m for m in args.models.split(",") if m]
    datas = [d for d in args.data.split(",") if d]
    masters = [m for m in args.masters.split(",") if m]
    seeds = [int(s) for s in args.seeds.split(",") if s]
    bad = sorted(set(models) - set(MODELS)) + sorted(set(datas) - set(DATA))
    if bad:
        p.error(f"Expect models in {MODELS} and data in {tuple(DATA)}, got {bad}")
    for m in masters:
        make_master(m, 16, args.workers, 1)  # fail on a bad spec before any training
    reused = baselines(args.baseline)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    log.setLevel(logging.INFO)

    from mnist_lenet import as_minibatch_rdd, spark_session

    from sparkavg.data.mnist import default_data_dir, load_mnist

    data_dir = args.data_dir or default_data_dir()
    x_all, y_all = load_mnist(data_dir, "train")
    xt_img, yt = load_mnist(data_dir, "test")
    result = {"benchmark": "parity", "argv": sys.argv[1:] if argv is None else list(argv), "workers": args.workers,
              "cpu_count": os.cpu_count(), "cells": []}

    def save():
        if args.out:
            with open(args.out, "w") as fh:
                fh.write(json.dumps(result, indent=2) + "\n")

    spark = spark_session(f"local[{args.workers}]", "bench-parity")
    sc = spark.sparkContext
    try:
        for data in datas:
            n, epochs = DATA[data]
            for model in models:
                x, y = x_all[:n], y_all[:n]
                xt = xt_img
                if model in FLAT:
                    x, xt = x.reshape(len(x), -1), xt_img.reshape(len(xt_img), -1)
                rdd = as_minibatch_rdd(sc, x, y, args.workers)
                batch = BATCH[model]
                try:
                    for seed in seeds:
                        load = round(os.getloadavg()[0], 2)
                        if (model, data, seed) in reused:
                            local_acc, local_s = reused[(model, data, seed)]
                        else:
                            local_acc, local_s = local_run(model, x, y, xt, yt, args.workers * batch, epochs, seed,
                                                           args.workers)
                        log.info("%s %s seed %d: one process %.4f in %.1f s%s", model, data, seed, local_acc, local_s,
                                 " (reused)" if (model, data, seed) in reused else "")
                        for spec in masters:
                            run = spark_run(spark, model, spec, rdd, xt, yt, epochs, batch, args.workers, seed)
                            cell = {"model": model, "data": data, "examples": n, "epochs": epochs, "master": spec,
                                    "seed": seed, "batch_per_worker": batch,
                                    "local_batch": args.workers * batch, "local_accuracy": local_acc,
                                    "local_seconds": local_s, "load_1min_before": load,
                                    "local_reused": (model, data, seed) in reused, **run,
                                    "gap_points": 100 * (run["accuracy"] - local_acc)}
                            result["cells"].append(cell)
                            save()
                            log.info("%s %s %s seed %d: %.4f (%+.2f points) in %.1f s, F %s, compression %s", model,
                                     data, spec, seed, run["accuracy"], cell["gap_points"], run["seconds"],
                                     run["averaging_frequency"], run.get("compression_wire"))
                finally:
                    rdd.unpersist()
    finally:
        spark.stop()
    print(table(result["cells"]))
    save()
    return result


if __name__ == "__main__":
    main()
