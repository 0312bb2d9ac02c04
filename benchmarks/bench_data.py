#!/usr/bin/env python
"""Preparing a fit's data against Spark's own scan of it (issue 24), same run.

A Parquet frame of 60,000 rows x 784 features (MNIST's shape; random
values) plus a label, written once per feature type -- ``float32`` and
``uint8`` (Parquet stores the latter as UINT_8; Spark reads it as a
``smallint`` array) -- is read on ``local[2]`` by

* **scan**: Spark's own scan of the frame into Python, a ``mapInArrow``
  over the features and label columns that only counts rows -- what any
  Arrow reader of the frame pays;
* **prepare**: what a fit does once before its first step
  (``seam.prepare``: validate, cut into minibatches of 32 and keep them),
  with the minibatches in shared files (``placement="files"``, the
  ``local[N]`` default) and in Spark blocks (``placement="spark"``, the
  cluster default; classic only: a Connect fit keeps them as a cached
  DataFrame -- that is its ``spark`` row).

at the defaults (``DataOptions()``: ``feature_dtype="auto"`` keeps the
uint8 frame's features uint8), and, for the uint8 frame, the same with
an explicit dtype (``files-uint8``, ``spark-uint8``:
``DataOptions(feature_dtype="uint8", scale=1/255)``; ``files-none``,
``spark-none``: ``feature_dtype=None``, float32 minibatches, the default
before ``auto``), with the bytes the prepared
minibatches take (files on disk; a classic session's blocks in memory and
on disk, from Spark's storage status; Connect does not say),
on a classic session and on a Spark Connect server (its own JVM,
``tests.harness.connect``).  Each is timed ``--repeats`` times, alternating,
after one warm-up of each; the figures are medians, the ratio is
prepare rate / scan rate (>= 0.5 is issue 24's must).  MB/s counts the
features' bytes in their source type (60,000 x 784 x 4 or x 1).

    python benchmarks/bench_data.py --out benchmarks/results/data.json
    python benchmarks/bench_data.py --flavours classic --dtypes float32 --repeats 3   # a quick check
    python benchmarks/bench_data.py --profile classic-float32-files   # + cProfile of one executor function
"""
from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(1, REPO)  # tests.harness: the Connect server is not part of the installed package

from report import emit  # noqa: E402

ROWS, WIDTH, BATCH = 60_000, 784, 32


def write_frames(folder: str, rows: int) -> dict:
    """One Parquet folder per feature type (4 files, as a writer of 4 tasks leaves)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(24)
    labels = rng.integers(0, 10, rows)
    out = {}
    for dtype in ("float32", "uint8"):
        x = (rng.random((rows, WIDTH), dtype=np.float32) if dtype == "float32"
             else rng.integers(0, 256, (rows, WIDTH), dtype=np.uint8))
        path = os.path.join(folder, dtype)
        os.makedirs(path)
        for part in range(4):
            lo, hi = part * rows // 4, (part + 1) * rows // 4
            values = pa.array(x[lo:hi].reshape(-1))
            features = pa.ListArray.from_arrays(pa.array(np.arange(0, (hi - lo) * WIDTH + 1, WIDTH, dtype=np.int32)),
                                                values)
            table = pa.table({"features": features, "label": pa.array(labels[lo:hi])})
            pq.write_table(table, os.path.join(path, f"part-{part:05d}.parquet"), row_group_size=8192)
        out[dtype] = {"path": path, "feature_bytes": int(x.nbytes)}
    return out


def count_rows(batches):
    """Spark's scan, seen from Python: rows counted, nothing decoded."""
    import pyarrow as pa

    n = 0
    for batch in batches:
        n += batch.num_rows
    yield pa.RecordBatch.from_pydict({"n": pa.array([n], pa.int64())})


def scan(df) -> int:
    rows = df.select("features", "label").mapInArrow(count_rows, "n long").collect()
    return sum(r[0] for r in rows)


def prepare(seam, df, placement: str):
    """``placement`` is ``files`` or ``spark`` (the defaults), ``-uint8``
    appended for ``DataOptions(feature_dtype="uint8", scale=1/255)``,
    ``-none`` for ``feature_dtype=None`` (float32 minibatches)."""
    from sparkavg.data.validation import DataSpec
    from sparkavg.spark import DataOptions
    from sparkavg.spark.data import resolve_features

    where, _, compact = placement.partition("-")
    extra = ({"feature_dtype": None} if compact == "none" else
             {"feature_dtype": compact, "scale": 1 / 255} if compact else {})
    spec = DataSpec((WIDTH,), 10)
    prepared = seam.prepare(df, spec, BATCH, DataOptions(placement=where, shared_dir=(
        tempfile.mkdtemp(prefix="bench-data-", dir=os.environ.get("BENCH_DATA_TMP")) if where == "files"
        else None), **extra), resolve_features("features", spec), "label")
    return prepared


def stored_bytes(session, prepared) -> dict:
    """What the prepared minibatches take: files' bytes on disk, or a classic
    session's persisted blocks (Spark's storage status: memory and disk);
    Connect does not say (None)."""
    if prepared.description == "shared files":
        return {"disk": sum(os.path.getsize(p) for p in prepared.paths), "memory": 0}
    if getattr(prepared, "rdd", None) is None:
        return {"disk": None, "memory": None}
    rdd_id = prepared.rdd.id()
    for info in session.sparkContext._jsc.sc().getRDDStorageInfo():
        if info.id() == rdd_id:
            return {"disk": int(info.diskSize()), "memory": int(info.memSize())}
    return {"disk": None, "memory": None}


def measure(session, seam, frames: dict, dtypes, placements, repeats: int, flavour: str) -> dict:
    out = {}
    for dtype in dtypes:
        info = frames[dtype]
        df = session.read.parquet(info["path"])
        assert scan(df) == ROWS  # warm-up: the JVM's code paths, the files in the page cache
        stored = {}
        for placement in placements:
            if "-" in placement and dtype != "uint8":
                continue
            prepared = prepare(seam, df, placement)
            stored[placement] = stored_bytes(session, prepared)
            prepared.release()
        placements_here = [p for p in placements if "-" not in p or dtype == "uint8"]
        times = {"scan": []} | {f"prepare_{p}": [] for p in placements_here}
        for _ in range(repeats):
            t0 = time.perf_counter()
            n = scan(df)
            times["scan"].append(time.perf_counter() - t0)
            assert n == ROWS, n
            for placement in placements_here:
                t0 = time.perf_counter()
                prepared = prepare(seam, df, placement)
                times[f"prepare_{placement}"].append(time.perf_counter() - t0)
                assert prepared.examples == ROWS, prepared.examples
                prepared.release()
        entry = {"seconds": times, "stored_bytes": stored}
        med = {k: statistics.median(v) for k, v in times.items()}
        for k, s in med.items():
            entry[k] = {"median_seconds": s, "rows_per_second": ROWS / s,
                        "mb_per_second": info["feature_bytes"] / s / 1e6}
        for placement in placements_here:
            entry[f"prepare_{placement}"]["vs_scan"] = med["scan"] / med[f"prepare_{placement}"]
        out[dtype] = entry
        print(f"{flavour} {dtype}: scan {med['scan']:.2f} s, " + ", ".join(
            f"prepare {p} {med[f'prepare_{p}']:.2f} s ({med['scan'] / med[f'prepare_{p}']:.2f} of scan; "
            f"{stored[p]})" for p in placements_here), file=sys.stderr, flush=True)
    return out


def profile_executor(frames: dict, dtype: str, placement: str) -> str:
    """cProfile of the minibatching ``mapInArrow`` function over one
    partition's record batches, in this process (what an executor runs)."""
    import cProfile
    import io
    import pstats

    import pyarrow.parquet as pq
    from pyspark import TaskContext  # noqa: F401  (imported by the function: not its time)

    from sparkavg.data.validation import DataSpec
    from sparkavg.spark.data import resolve_features
    from sparkavg.spark.executor.arrow import make_minibatcher

    path = frames[dtype]["path"]
    table = pq.read_table(os.path.join(path, sorted(os.listdir(path))[0]))
    batches = table.to_batches(max_chunksize=10_000)  # spark.sql.execution.arrow.maxRecordsPerBatch
    folder = tempfile.mkdtemp(prefix="bench-data-profile-") if placement == "files" else None
    spec = DataSpec((WIDTH,), 10)
    run = make_minibatcher(spec, BATCH, resolve_features("features", spec), "label", folder)
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    for _ in run(iter(batches)):
        pass
    prof.disable()
    seconds = time.perf_counter() - t0
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(15)
    return f"{table.num_rows} rows in {seconds:.3f} s\n" + text.getvalue()


def main(argv=None):
    global ROWS
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--flavours", default="classic,connect")
    p.add_argument("--dtypes", default="float32,uint8")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--placements", default="files,spark,files-uint8,spark-uint8",
                   help="files, spark (the defaults); for the uint8 frame also -uint8 (feature_dtype='uint8', "
                        "scale=1/255) and -none (feature_dtype=None: float32 minibatches)")
    p.add_argument("--rows", type=int, default=60_000, help="rows of the frame (default 60000)")
    p.add_argument("--profile", default=None, metavar="FLAVOUR-DTYPE-PLACEMENT",
                   help="also cProfile the executor's minibatching of one partition (e.g. classic-float32-files)")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    ROWS = args.rows
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from sparkavg.spark import recommended_conf
    from sparkavg.spark.seam import seam_for

    dtypes = [d.strip() for d in args.dtypes.split(",")]
    placements = [p.strip() for p in args.placements.split(",")]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                            text=True).stdout.strip()
    result = {"benchmark": "data", "commit": commit, "cpus": os.cpu_count(), "hostname": socket.gethostname(),
              "rows": ROWS, "width": WIDTH, "batch_size": BATCH, "master": "local[2]",
              "load_before": os.getloadavg()}
    with tempfile.TemporaryDirectory(prefix="bench-data-") as folder:
        os.environ["BENCH_DATA_TMP"] = folder
        frames = write_frames(os.path.join(folder, "frames"), ROWS)
        if args.profile:
            _, dtype, placement = args.profile.split("-")
            result["profile"] = profile_executor(frames, dtype, placement)
            print(result["profile"], file=sys.stderr)
        for flavour in [f.strip() for f in args.flavours.split(",")]:
            conf = {**recommended_conf("local[2]"), "spark.ui.enabled": "false"}
            if flavour == "classic":
                from pyspark.sql import SparkSession

                builder = SparkSession.builder.master("local[2]").appName("bench-data")
                for k, v in conf.items():
                    builder = builder.config(k, v)
                spark = builder.getOrCreate()
                try:
                    result["classic"] = measure(spark, seam_for(spark), frames, dtypes, placements,
                                                args.repeats, flavour)
                finally:
                    spark.stop()
            else:
                from pyspark.sql.connect.session import SparkSession as RemoteSparkSession

                from tests.harness.connect import connect_server

                with connect_server("local[2]", os.path.join(folder, "connect.log"), conf, timeout=180,
                                    cwd=folder) as url:
                    os.environ["SPARK_CONNECT_MODE_ENABLED"] = "1"
                    session = RemoteSparkSession.builder.remote(url).getOrCreate()
                    try:
                        result["connect"] = measure(session, seam_for(session), frames, dtypes, placements,
                                                    args.repeats, flavour)
                    finally:
                        session.stop()
                        os.environ.pop("SPARK_CONNECT_MODE_ENABLED", None)
    result["load_after"] = os.getloadavg()
    ratios = {f"{fl}_{dt}_{k}": v[k]["vs_scan"] for fl in ("classic", "connect") if fl in result
              for dt, v in result[fl].items() for k in v if k.startswith("prepare_")}
    result["verdict"] = {"prepare_vs_scan": ratios, "at_least_half_of_scan": all(r >= 0.5 for r in ratios.values())}
    return emit(result, args.out)


if __name__ == "__main__":
    main()
