#!/usr/bin/env python
"""What each of sparkavg's recommended Spark settings buys, measured.

Each configuration runs in its own process (JVM options are fixed when the
JVM starts), one after the other, on local[2]:

- ``defaults``: Spark's defaults.
- ``+uds``: spark.python.unix.domain.socket.enabled.
- ``+uds+direct``: and spark.task.maxDirectResultSize=128m.
- ``+uds+direct+raw-broadcast``: and spark.broadcast.compress=false.
- ``recommended``: ``recommended_conf("local[2]")`` (adds the C1-only JIT).

Per configuration:

1. A trivial 2-task Python job (median of 40): from ``collect()`` to the
   first task running, and the whole job.
2. The same job returning 5.2 MB per task (LeNet's parameters + Adam
   state): from the last task's end to the driver holding the results.
   And a round's shape (median of 30): ``sc.broadcast`` of 5.2 MB on the
   driver, then a job whose tasks read it and return 5.2 MB each.
3. One epoch of LeNet averaging (``--limit`` examples, averaging every
   40 minibatches, 2 workers x 1 thread) right after the session starts:
   its seconds, the median and p95 minibatch fit time on the workers,
   and the CPU time the driver JVM spent JIT-compiling meanwhile (its
   CompilationMXBean): that CPU is taken from the workers in local mode.

Also, once: what PySpark's per-task ``gc.collect()`` costs in a Python
worker that has imported sparkavg, before and after ``gc.freeze()``.

    python benchmarks/bench_spark_session.py --out benchmarks/results/spark_session.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

from report import emit

HERE = os.path.dirname(os.path.abspath(__file__))
RESULT_FLOATS = 431_080 + 2 * 431_080  # LeNet params + Adam's two moments


def configurations():
    from sparkavg.spark import recommended_conf

    uds = {"spark.python.unix.domain.socket.enabled": "true"}
    direct = {"spark.task.maxDirectResultSize": "128m"}
    raw = {"spark.broadcast.compress": "false"}
    return {"defaults": {}, "+uds": uds, "+uds+direct": {**uds, **direct},
            "+uds+direct+raw-broadcast": {**uds, **direct, **raw}, "recommended": recommended_conf("local[2]")}


def _start_times(n):
    """Executor function factory: each task yields (its start time, payload)."""

    def run(it):
        t = time.time()
        list(it)
        yield t, np.ones(n, np.float32) if n else None

    return run


def job_latencies(sc, floats: int, repeats: int = 40):
    rdd = sc.parallelize(range(2), 2)
    f = _start_times(floats)
    start, end, total = [], [], []
    for i in range(repeats + 5):
        t0 = time.time()
        out = rdd.mapPartitions(f).collect()
        t1 = time.time()
        if i >= 5:  # warm-up
            start.append(min(t for t, _ in out) - t0)
            end.append(t1 - max(t for t, _ in out))
            total.append(t1 - t0)
    return {"to_first_task_ms": 1000 * statistics.median(start),
            "last_task_to_driver_ms": 1000 * statistics.median(end),
            "job_ms": 1000 * statistics.median(total)}


def broadcast_rounds(sc, floats: int, repeats: int = 30):
    """Median ms of broadcasting ``floats`` float32s and of the job that reads them."""
    rdd = sc.parallelize(range(2), 2)
    ship, job = [], []
    for i in range(repeats + 5):
        values = np.random.default_rng(i).random(floats, dtype=np.float32)
        t0 = time.perf_counter()
        shipped = sc.broadcast(values)
        t1 = time.perf_counter()
        rdd.mapPartitions(lambda it, b=shipped: [b.value * 2]).collect()
        t2 = time.perf_counter()
        shipped.unpersist()
        if i >= 5:
            ship.append(t1 - t0)
            job.append(t2 - t1)
    return {"broadcast_ms": 1000 * statistics.median(ship), "job_ms": 1000 * statistics.median(job)}


def one_epoch(spark, limit):
    sys.path.insert(0, os.path.join(HERE, "..", "examples"))
    from mnist_lenet import as_minibatch_rdd

    from sparkavg.data.mnist import default_data_dir, load_mnist
    from sparkavg.nn import lenet
    from sparkavg.spark import ParameterAveraging, SparkTrainer

    sc = spark.sparkContext
    x, y = load_mnist(default_data_dir(), "train", limit=limit)
    rdd = as_minibatch_rdd(sc, x, y, 2)
    trainer = SparkTrainer(spark, lenet(seed=1), ParameterAveraging(batch_size_per_worker=64, averaging_frequency=40,
                                                                    workers=2, seed=1))
    jit = sc._jvm.java.lang.management.ManagementFactory.getCompilationMXBean()
    jit_before = jit.getTotalCompilationTime()
    trainer.fit(rdd, epochs=1)
    jit_ms = jit.getTotalCompilationTime() - jit_before
    trainer.close()
    fits = [e.duration for e in trainer.stats.events if e.phase == "fit"]
    seconds = trainer.history[0]["seconds"]
    return {"epoch_s": seconds, "fit_ms_median": 1000 * float(np.median(fits)),
            "fit_ms_p95": 1000 * float(np.percentile(fits, 95)), "jit_compile_ms": int(jit_ms),
            "jit_share_of_one_core": jit_ms / 1000 / seconds}


def gc_costs(sc):
    def probe(_):
        import gc

        import sparkavg.spark.executor.averaging  # noqa: F401  (what a sparkavg task has imported)

        out = {"objects": len(gc.get_objects())}
        for label in ("before_freeze_ms", "after_freeze_ms"):
            times = []
            for _ in range(5):
                t = time.perf_counter()
                gc.collect()
                times.append(1000 * (time.perf_counter() - t))
            out[label] = statistics.median(times)
            gc.freeze()
        yield out

    return sc.parallelize(range(2), 2).mapPartitions(probe).collect()


def child(name: str, limit, with_gc: bool) -> dict:
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.master("local[2]").appName(f"bench-session-{name}")
    builder = builder.config("spark.driver.memory", "4g").config("spark.ui.showConsoleProgress", "false")
    for key, value in configurations()[name].items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    try:
        sc = spark.sparkContext
        out = {"conf": configurations()[name], "trivial": job_latencies(sc, 0),
               "result_5mb": job_latencies(sc, RESULT_FLOATS, repeats=25),
               "round_5mb": broadcast_rounds(sc, RESULT_FLOATS)}
        if with_gc:
            out["worker_gc"] = gc_costs(sc)
        out["fit"] = one_epoch(spark, limit)
        return out
    finally:
        spark.stop()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--limit", type=int, default=None, help="training examples for the fit (default: all)")
    p.add_argument("--out", default=None)
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print("RESULT " + json.dumps(child(args.child, args.limit, args.child == "recommended")))
        return None
    result = {"benchmark": "spark_session", "limit": args.limit, "configurations": {}}
    for name in configurations():
        cmd = [sys.executable, os.path.abspath(__file__), "--child", name]
        if args.limit:
            cmd += ["--limit", str(args.limit)]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
        line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
        result["configurations"][name] = json.loads(line[len("RESULT "):])
    return emit(result, args.out)


if __name__ == "__main__":
    main()
