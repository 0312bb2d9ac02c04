#!/usr/bin/env python
"""Epochs on Spark blocks, against an earlier library in the same run: what
an epoch's deal of kept minibatches costs each master's path.

On a cluster without a shared filesystem the prepared minibatches live in
Spark blocks, and every epoch deals them to rounds x workers through a
shuffle (``spark/sources.py``, ``BlocksDeal``).  DL4J's MnistMLP (784-500-
100-10, ``bench_parity.build("mlp")``) fits the first ``--limit-train``
Fashion-MNIST images from a cached Parquet DataFrame kept as Spark blocks
(``DataOptions(placement="spark")``) on ``local[2]``, 16 per worker, for
``--epochs`` epochs, three ways: parameter averaging with its rounds inside
one barrier stage and with a Spark job per round (each forced through the
tests' hook ``sparkavg.test.averaging_path``), and gradient sharing.  Each
fit runs in a fresh process, and the library of ``--baseline REF`` (its
``sparkavg/`` from ``git archive``, with this tree's compiled
``sparkavg_ext``) and this tree's alternate, ``--repeats`` times.  Reports
every epoch's seconds (the first also prepares the models and, for
averaging, runs the probe), the steady epochs' median, and the accuracy.

    python benchmarks/bench_blocks_deal.py --baseline 94cb3d6 --out benchmarks/results/blocks_deal.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

PATHS = {"in_stage": ("averaging", "in_stage"), "jobs": ("averaging", "jobs"), "sharing": ("sharing", None)}

FIT = """
import json, os, sys, tempfile
import numpy as np
from pyspark.sql import SparkSession
from bench_mlp_parquet import write_parquet
from bench_parity import build
from mnist_lenet import evaluate_local
from sparkavg.data import mnist
from sparkavg.spark import GradientSharing, ParameterAveraging, SparkTrainer
from sparkavg.spark.masters import DataOptions
master, path, limit, epochs = {master!r}, {path!r}, {limit}, {epochs}
x, y = mnist.load_mnist({data!r}, "train", limit=limit)
xt, yt = mnist.load_mnist({data!r}, "test")
x, xt = x.reshape(len(x), -1).astype(np.float32), xt.reshape(len(xt), -1).astype(np.float32)
spark = (SparkSession.builder.master("local[2]").config("spark.driver.memory", "4g")
         .config("spark.ui.enabled", "false").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
with tempfile.TemporaryDirectory() as tmp:
    df = spark.read.parquet(write_parquet(tmp, x, y)).cache()
    df.count()
    data = DataOptions(placement="spark")
    kind = ParameterAveraging if master == "averaging" else GradientSharing
    trainer = SparkTrainer(spark, build("mlp", 123), kind(batch_size_per_worker=16, workers=2, seed=123, data=data))
    if path is not None:
        spark.sparkContext.setLocalProperty("sparkavg.test.averaging_path", path)
    trainer.fit(df, epochs=epochs)
    acc = float(evaluate_local(trainer.network, xt, yt).accuracy())
    print("RESULT " + json.dumps({{"epoch_seconds": [h["seconds"] for h in trainer.history], "accuracy": acc,
                                  "paths": [h.get("averaging_path") for h in trainer.history]}}), flush=True)
    trainer.close()
spark.stop()
"""


def fit(library: str, name: str, args) -> dict:
    master, path = PATHS[name]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([library, HERE, os.path.join(ROOT, "examples")]),
           "PYSPARK_PYTHON": sys.executable}
    code = FIT.format(master=master, path=path, limit=args.limit_train, epochs=args.epochs, data=args.data_dir)
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=library)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{name} with {library} failed ({done.returncode}): {done.stderr[-2000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def main(argv=None) -> dict:
    sys.path.insert(0, HERE)
    from report import commit, emit, library_at

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", required=True, help="a git commit whose library alternates with this tree's")
    ap.add_argument("--paths", default=",".join(PATHS), help=f"comma-separated subset of {list(PATHS)}")
    ap.add_argument("--limit-train", type=int, default=30000)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--data-dir", default=None, help="an MNIST-format folder (default: the installed Fashion-MNIST)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    names = [p for p in args.paths.split(",") if p]
    report = {"bench": "blocks_deal", "baseline_commit": commit(args.baseline), "commit": commit(),
              "limit_train": args.limit_train, "epochs": args.epochs, "load_before": os.getloadavg()[0], "runs": {}}
    with tempfile.TemporaryDirectory() as tmp:
        libraries = {"baseline": library_at(args.baseline, tmp), "this": ROOT}
        for name in names:
            for r in range(args.repeats):
                for which, library in libraries.items():
                    out = fit(library, name, args)
                    report["runs"].setdefault(name, {}).setdefault(which, []).append(out)
                    print(f"{name} {which} run {r + 1}: epochs {[round(s, 2) for s in out['epoch_seconds']]} "
                          f"accuracy {out['accuracy']:.4f}", flush=True)
    for name, by in report["runs"].items():
        steady = {w: statistics.median(s for run in runs for s in run["epoch_seconds"][1:]) for w, runs in by.items()}
        report.setdefault("steady_epoch_median_s", {})[name] = steady
        print(f"{name}: steady epoch median {steady['this']:.2f} s against {steady['baseline']:.2f} s "
              f"({steady['this'] / steady['baseline']:.2f}x)", flush=True)
    report["load_after"] = os.getloadavg()[0]
    return emit(report, args.out)


if __name__ == "__main__":
    main()
