"""What an epoch's deal of Spark blocks costs: the shuffle against reading the blocks in place.

An epoch on Spark blocks starts behind ``BlocksDeal.shuffle``: every
minibatch is moved to its (round, worker) partition with
``repartitionAndSortWithinPartitions``, even where the deal is local (each
worker keeps its host's minibatches).  This script times, on one session
and the same persisted blocks (``--minibatches`` of 32 x 784 float32, as
the benchmarks' Fashion-MNIST LeNet epochs), in alternating trials:

``in_place``
    a job reading every block once where it is (the floor of any epoch);
``deal``
    the deal's shuffle as the library builds it (a key per block to its
    worker's partition, sorted within it), then reading every block;
``partition_only``
    the same shuffle without the sort;
``reused``
    the shuffle into the workers' partitions made once and read again in
    every trial (Spark skips a map stage whose outputs it still has), each
    partition's blocks put in a fresh random order in the task (as an
    epoch's local deal does from its second epoch on).

    PYSPARK_PYTHON=.venv/bin/python python benchmarks/bench_deal_shuffle.py --out benchmarks/results/deal_shuffle.json
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report import emit  # noqa: E402


def _block(i):
    rng = np.random.default_rng(i)
    return i, (rng.random((32, 784), dtype=np.float32), rng.integers(0, 10, 32))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--master", default="local[2]")
    p.add_argument("--minibatches", type=int, default=1024, help="blocks of 32 x 784 float32 (default: 100 MB)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.master(args.master).config("spark.ui.enabled", "false").getOrCreate()
    sc, workers = spark.sparkContext, args.workers
    try:
        blocks = sc.parallelize(range(args.minibatches), workers).map(_block).persist()
        blocks.count()

        def in_place():
            return blocks.map(lambda kv: kv[1][0].shape[0]).sum()

        def deal():
            dealt = (blocks.map(lambda kv: ((kv[0] % workers, kv[0]), kv[1]))
                     .repartitionAndSortWithinPartitions(workers, partitionFunc=lambda key: key[0]).values())
            return dealt.map(lambda v: v[0].shape[0]).sum()

        def partition_only():
            dealt = blocks.map(lambda kv: (kv[0] % workers, kv[1])).partitionBy(workers, lambda key: key).values()
            return dealt.map(lambda v: v[0].shape[0]).sum()

        sharded = blocks.map(lambda kv: (kv[0] % workers, kv)).partitionBy(workers, lambda key: key).values()
        trial = [0]

        def reused():
            trial[0] += 1
            seed = trial[0]

            def reorder(items):
                held = dict(items)
                order = np.random.default_rng(seed).permutation(sorted(held))
                return (held[k] for k in order)

            return sharded.mapPartitions(reorder).map(lambda v: v[0].shape[0]).sum()

        cases = {"in_place": in_place, "deal": deal, "partition_only": partition_only, "reused": reused}
        times = {name: [] for name in cases}
        for _ in range(args.trials):
            for name, run in cases.items():
                t0 = time.perf_counter()
                assert run() == 32 * args.minibatches
                times[name].append(time.perf_counter() - t0)
    finally:
        spark.stop()
    medians = {name: statistics.median(v[1:] or v) for name, v in times.items()}  # the first trial warms up
    result = {
        "benchmark": "deal_shuffle",
        "master": args.master, "workers": workers, "minibatches": args.minibatches,
        "megabytes": args.minibatches * 32 * 784 * 4 / 1e6,
        "seconds": times, "median_s_after_the_first": medians,
        "deal_over_in_place": medians["deal"] / medians["in_place"],
        "reused_over_in_place": medians["reused"] / medians["in_place"],
        "load_average": os.getloadavg(), "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
    }
    return emit(result, args.out)


if __name__ == "__main__":
    main()
