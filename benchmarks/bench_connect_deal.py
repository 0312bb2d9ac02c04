#!/usr/bin/env python
"""What an epoch's deal of Spark blocks costs on Spark Connect: a dealt frame per epoch against one kept
partitioning sorted into each epoch's order.

On a Connect session (``SparkSession.builder.remote("local[2]")``, the local server pyspark starts),
``--minibatches`` persisted rows of ``(id, x, y)`` with ``x`` a 32 x 784 float32 minibatch as bytes (100 MB
by default, as the benchmarks' Fashion-MNIST epochs), dealt locally to 2 workers with a fresh seed every
trial, the library's own seam calls (``ConnectSpark``), then every row read once by a ``mapInArrow``
summing its bytes.  Alternating trials:

``in_place``
    the persisted rows read where they are (the floor of any epoch);
``dealt``
    ``dealt_frame`` every epoch, as an epoch of several rounds (and every epoch before) does: a join, a
    repartition by worker, a sort within partitions, persisted and counted, then read;
``kept``
    one ``dealt_frame`` of one round made before the trials (what ``ConnectBlocks.sharded`` keeps), then
    each epoch's ``in_deal_order`` (a broadcast join of the positions, a sort within partitions) read.

    PYSPARK_PYTHON=$PWD/.venv/bin/python python benchmarks/bench_connect_deal.py --out benchmarks/results/connect_deal.json
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


def _bytes_read(batches):
    import pyarrow as pa

    total = 0
    for batch in batches:
        total += sum(len(v) for v in batch.column(batch.schema.get_field_index("x")).to_pylist())
    yield pa.RecordBatch.from_pydict({"n": [total]})


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--master", default="local[2]")
    p.add_argument("--minibatches", type=int, default=1024, help="rows of 32 x 784 float32 (default: 100 MB)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    import pyarrow as pa
    from pyspark.sql import SparkSession

    from sparkavg.data.deal import deal_epoch
    from sparkavg.spark.connect import ConnectSpark

    spark = SparkSession.builder.remote(args.master).getOrCreate()
    n, workers = args.minibatches, args.workers
    try:
        rng = np.random.default_rng(0)
        block = rng.random((32, 784), dtype=np.float32).tobytes()
        frame = spark.createDataFrame(pa.table({"id": pa.array(np.arange(n), pa.int64()),
                                                "x": pa.array([block] * n, pa.binary()),
                                                "y": pa.array([b"y"] * n, pa.binary())})).repartition(workers).persist()
        frame.count()
        seam, ids = ConnectSpark(spark), np.arange(n)

        def read(df):
            return df.mapInArrow(_bytes_read, "n long").groupBy().sum("n").first()[0]

        def shards(seed):
            return deal_epoch(n, workers, n, seed, True)  # a local deal, one round

        kept = seam.dealt_frame(frame, ids, shards(0), workers)
        seed = [0]

        def in_place():
            return read(frame)

        def dealt():
            seed[0] += 1
            df = seam.dealt_frame(frame, ids, shards(seed[0]), workers)
            try:
                return read(df)
            finally:
                df.unpersist()

        def kept_sorted():
            seed[0] += 1
            return read(seam.in_deal_order(kept, ids, shards(seed[0])[0]))

        cases = {"in_place": in_place, "dealt": dealt, "kept": kept_sorted}
        times = {name: [] for name in cases}
        for _ in range(args.trials):
            for name, run in cases.items():
                t0 = time.perf_counter()
                assert run() == n * len(block)
                times[name].append(time.perf_counter() - t0)
    finally:
        spark.stop()
    medians = {name: statistics.median(v[1:] or v) for name, v in times.items()}  # the first trial warms up
    return emit({
        "benchmark": "connect_deal", "master": args.master, "workers": workers, "minibatches": n,
        "megabytes": n * 32 * 784 * 4 / 1e6, "seconds": times, "median_s_after_the_first": medians,
        "dealt_over_kept": medians["dealt"] / medians["kept"], "kept_over_in_place": medians["kept"] / medians["in_place"],
        "load_average": os.getloadavg(), "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
    }, args.out)


if __name__ == "__main__":
    main()
