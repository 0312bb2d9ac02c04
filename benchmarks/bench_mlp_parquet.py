#!/usr/bin/env python
"""DL4J's MnistMLP from a cached Parquet DataFrame: the whole fit against one process (issue 24).

What a new user does: Fashion-MNIST's 60,000 training images written as
Parquet (``features`` an array of 784 floats in [0, 1], ``label`` an int),
read back, cached and counted; then ``SparkTrainer(spark, mlp,
ParameterAveraging(batch_size_per_worker=16)).fit(df, epochs=2)`` on
``local[2]`` -- the library's defaults otherwise.  Timed from the call to
``fit`` to its return (preparation of the minibatches included), and split
into the epochs' own seconds (``trainer.history``) and the rest (preparing
the minibatches, planning, starting: everything before the first step and
between epochs).  Baseline, same run: one 2-thread process training the
same network from numpy at batch 32 (the same examples per update) for the
same epochs.  Test accuracy of both on the 10,000 test images.

Two bounds of the same run say what any data-parallel fit on this machine
could reach: the **ceiling**, two single-thread processes at once, each
fitting its half at 16 per step for the same epochs (the workers' compute
with nothing else: no Spark, no averaging), and the **cold start**, what
the session's first Python job costs more than the same job again (Spark
starting its Python workers; the fit is the session's first Python job).

The network is DL4J's MnistMLP (784-500-100-10 leaky ReLU,
Nesterov(lr=0.05, momentum=0.9), L2 1e-4), ``bench_parity.build("mlp")``.

    python benchmarks/bench_mlp_parquet.py --out benchmarks/results/mlp_parquet.json
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(1, os.path.join(HERE, "..", "examples"))

from report import emit  # noqa: E402


def write_parquet(folder: str, x, y) -> str:
    """The training set as a user keeps it: Parquet, features an array of floats."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = os.path.join(folder, "train.parquet")
    features = pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1), pa.float32()), x.shape[1])
    table = pa.table({"features": pa.ListArray.from_arrays(
        pa.array(range(0, x.shape[0] * x.shape[1] + 1, x.shape[1]), pa.int32()), features.flatten()),
        "label": pa.array(y.astype("int64"))})
    os.makedirs(path)
    for i, start in enumerate(range(0, len(y), len(y) // 4)):  # 4 files, as a writer of 4 tasks leaves
        pq.write_table(table.slice(start, len(y) // 4), os.path.join(path, f"part-{i}.parquet"))
    return path


def ceiling_worker(data_dir, half: int, epochs: int, seed: int) -> float:
    """One of the ceiling's two processes: its half of the training set, 1 thread, 16 per step."""
    import numpy as np
    from bench_parity import build

    from sparkavg.data import mnist
    from sparkavg.data.batching import minibatches
    from sparkavg.threads import limit_threads

    x, y = mnist.load_mnist(data_dir, "train")
    x = x.reshape(len(x), -1).astype(np.float32)[half::2]
    y = y[half::2]
    net = build("mlp", seed)
    with limit_threads(1):
        t = time.perf_counter()
        for epoch in range(epochs):
            for xb, yb in minibatches(x, y, 16, shuffle=True, seed=seed + epoch):
                net.fit_batch(xb, yb)
        return time.perf_counter() - t


def ceiling(data_dir, epochs: int, seed: int) -> float:
    """Seconds of the slower of two single-thread processes fitting half each, at once."""
    import json
    import subprocess

    code = ("import json, sys; sys.path[:0] = {paths!r}; from bench_mlp_parquet import ceiling_worker; "
            "print(json.dumps(ceiling_worker({d!r}, {h}, {e}, {s})))")
    procs = [subprocess.Popen([sys.executable, "-c", code.format(paths=[HERE, os.path.join(HERE, "..", "examples")],
                                                                  d=data_dir, h=h, e=epochs, s=seed)],
                              stdout=subprocess.PIPE, text=True) for h in (0, 1)]
    return max(json.loads(p.communicate()[0].strip().splitlines()[-1]) for p in procs)


def cold_start(spark, df) -> float:
    """What a fresh session's first Python job costs more than the same job again."""
    def job():
        t = time.perf_counter()
        df.mapInArrow(lambda batches: (b.slice(0, 0) for b in batches), df.schema).count()
        return time.perf_counter() - t

    first = job()
    return first - job()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", default=None, help="an MNIST-format folder (default: the installed Fashion-MNIST)")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--seed", type=int, default=123)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)

    import numpy as np
    from bench_parity import build, local_run
    from mnist_lenet import evaluate_local
    from pyspark.sql import SparkSession

    from sparkavg.data import mnist
    from sparkavg.spark import ParameterAveraging, SparkTrainer

    x, y = mnist.load_mnist(args.data_dir, "train")
    xt, yt = mnist.load_mnist(args.data_dir, "test")
    x, xt = x.reshape(len(x), -1).astype(np.float32), xt.reshape(len(xt), -1).astype(np.float32)

    local_acc, local_s = local_run("mlp", x, y, xt, yt, 32, args.epochs, args.seed, threads=2)
    print(f"one process (2 threads, batch 32): {args.epochs} epochs in {local_s:.2f} s, accuracy {local_acc:.4f}",
          flush=True)

    spark = (SparkSession.builder.master("local[2]").appName("bench_mlp_parquet")
             .config("spark.driver.memory", "4g").config("spark.ui.enabled", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    with tempfile.TemporaryDirectory() as tmp:
        df = spark.read.parquet(write_parquet(tmp, x, y)).cache()
        assert df.count() == len(y)
        trainer = SparkTrainer(spark, build("mlp", args.seed), ParameterAveraging(batch_size_per_worker=16,
                                                                                  workers=2, seed=args.seed))
        try:
            t = time.perf_counter()
            trainer.fit(df, epochs=args.epochs)
            fit_s = time.perf_counter() - t
            epochs_s = [h["seconds"] for h in trainer.history]
            frequencies = [h.get("averaging_frequency") for h in trainer.history]
            acc = evaluate_local(trainer.network, xt, yt).accuracy()
        finally:
            trainer.close()
        spark.stop()
        ceiling_s = ceiling(args.data_dir, args.epochs, args.seed)
        spark = (SparkSession.builder.master("local[2]").appName("bench_mlp_parquet_cold")
                 .config("spark.driver.memory", "4g").config("spark.ui.enabled", "false").getOrCreate())
        df = spark.read.parquet(os.path.join(tmp, "train.parquet")).cache()
        df.count()
        cold_s = cold_start(spark, df)
    spark.stop()
    rest = fit_s - sum(epochs_s)
    print(f"averaging at the defaults from Parquet: fit {fit_s:.2f} s = epochs {sum(epochs_s):.2f} s "
          f"({', '.join(f'{s:.2f}' for s in epochs_s)}; F {frequencies}) + {rest:.2f} s else "
          f"(preparation, planning, starting); accuracy {acc:.4f}", flush=True)
    print(f"whole fit: {local_s / fit_s:.2f}x one process; epochs alone {local_s / sum(epochs_s):.2f}x; "
          f"accuracy {100 * (acc - local_acc):+.2f} points", flush=True)
    print(f"bounds: two single-thread processes at once {ceiling_s:.2f} s ({local_s / ceiling_s:.2f}x one process: "
          f"the ceiling of any 2-worker fit here); a session's first Python job {cold_s:.2f} s more than again",
          flush=True)
    emit({"bench": "mlp_parquet", "epochs": args.epochs, "seed": args.seed, "load": os.getloadavg()[0],
          "local": {"seconds": local_s, "accuracy": local_acc},
          "averaging": {"fit_seconds": fit_s, "epoch_seconds": epochs_s, "other_seconds": rest,
                        "averaging_frequency": frequencies, "accuracy": acc},
          "whole_fit_speedup": local_s / fit_s,
          "ceiling": {"seconds": ceiling_s, "speedup": local_s / ceiling_s}, "cold_start_seconds": cold_s}, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
