#!/usr/bin/env python
"""Barrier rounds that read their partition to the end (``sources.read_to_end``),
against the same fit without it, same run: PyTorch's mnist recipe
(``examples/torch_mnist.py``) under ``ParameterAveraging`` at the defaults on
``local[2]`` (2 workers x ``--batch-size``), ``--epochs`` epochs of the first
``--limit-train`` Fashion-MNIST examples, no validation data (so a fresh
worker's start-up lands in the next epoch); each fit on a session of its own
(its start in no figure), variants alternating ``--repeats`` times.  Per fit:
the epochs' seconds, the Python worker processes the session forked, and the
workers' ``model_init`` seconds.

    PYTHONPATH=$PWD python benchmarks/bench_worker_reuse.py --out benchmarks/results/worker_reuse.json
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time

from report import emit

EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples")
sys.path.insert(0, EXAMPLES)


def _python_workers(stop: threading.Event, seen: set) -> None:
    """Collect the pids of this driver's Python workers (the daemon's children) until ``stop``."""
    def children(pid):
        out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
        return [int(p) for p in out.split()]

    while not stop.is_set():
        for jvm in children(os.getpid()):
            for daemon in children(jvm):
                seen.update(children(daemon))
        stop.wait(0.2)


def fit(args, data, read_to_end: bool) -> dict:
    from mnist_example import as_minibatch_rdd, spark_session

    import torch_mnist
    from sparkavg.spark import ParameterAveraging, SparkTrainer, sources

    wrapper = sources.read_to_end
    if not read_to_end:
        sources.read_to_end = lambda task: task  # the library before the change
    spark = spark_session("local[2]", "bench-worker-reuse")
    stop, seen = threading.Event(), set()
    watcher = threading.Thread(target=_python_workers, args=(stop, seen), daemon=True)
    try:
        spark.sparkContext.addPyFile(os.path.join(EXAMPLES, "torch_mnist.py"))
        watcher.start()
        (x, y) = data
        rdd = as_minibatch_rdd(spark.sparkContext, x, y, 2)
        master = ParameterAveraging(batch_size_per_worker=args.batch_size, workers=2, seed=args.seed)
        t = time.perf_counter()
        with SparkTrainer(spark, torch_mnist.build(seed=args.seed), master) as trainer:
            trainer.fit(rdd, epochs=args.epochs)
        wall = time.perf_counter() - t
        h = trainer.history
        return {"read_to_end": read_to_end, "epoch_seconds": [e["seconds"] for e in h], "fit_seconds": wall,
                "python_workers": len(seen),
                "model_init_seconds": trainer.stats.overhead_breakdown().get("model_init", 0.0),
                "load_average_1min": os.getloadavg()[0]}
    finally:
        stop.set()
        sources.read_to_end = wrapper
        spark.stop()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", default=None)
    p.add_argument("--limit-train", type=int, default=6000)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--seed", type=int, default=123)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    from sparkavg.data.mnist import load_mnist

    data = load_mnist(args.data_dir, "train", limit=args.limit_train)
    result = {"examples": int(len(data[0])), "epochs": args.epochs, "batch_size_per_worker": args.batch_size,
              "load_average_1min_before": os.getloadavg()[0], "fits": []}
    for _ in range(args.repeats):
        for variant in (True, False):
            result["fits"].append(fit(args, data, variant))
    for variant in (True, False):
        fits = [f for f in result["fits"] if f["read_to_end"] is variant]
        result["with" if variant else "without"] = {
            "epoch_seconds_sum": [sum(f["epoch_seconds"]) for f in fits],
            "epochs_after_the_first_seconds": [sum(f["epoch_seconds"][1:]) for f in fits],
            "python_workers": [f["python_workers"] for f in fits]}
    w, wo = result["with"], result["without"]
    result["epochs_seconds_ratio_without_over_with"] = sum(wo["epoch_seconds_sum"]) / sum(w["epoch_seconds_sum"])
    result["load_average_1min_after"] = os.getloadavg()[0]
    return emit(result, args.out)


if __name__ == "__main__":
    main()
