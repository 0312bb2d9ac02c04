#!/usr/bin/env python
"""Data larger than memory (issue 24): one epoch streamed from a Parquet
dataset that the executors' storage memory cannot hold, against the same
model on a small in-memory dataset, same run.

Fashion-MNIST's 60,000 training images (uint8, 784 B each) are written
as Parquet under ``--tmp`` (``list<uint8>``, Spark reads ``smallint``
arrays) twice: once as they are (the in-memory dataset) and replicated to
``--gb`` GB of pixels (the large one, deleted afterwards).  On a
``local-cluster[2,1,--executor-mb]`` (two executor JVMs, one core each)
the same MLP and master (parameter averaging,
``DataOptions(placement="spark")``: Spark blocks, the cluster default --
``local-cluster`` counts as local and would keep shared files on this
machine's disk --, storage ``auto``) fit

* **memory**: the small set, 2 epochs (prepared once, kept as Spark
  blocks: ``data_storage`` = ``memory``); its throughput is the second
  epoch's;
* **stream**: the large set, 1 epoch (``auto`` finds the blocks would not
  fit the executors' storage memory: ``data_storage`` = ``stream``).

Throughput is examples / epoch seconds; the ratio stream / memory is the
issue's figure (>= 0.8).  Peak RSS of the driver (this process and its
JVM), the executor JVMs and the Python workers is sampled from ``/proc``
every 0.25 s (``VmRSS``), and each process's ``VmHWM`` is read at its
last sample.

    PYSPARK_PYTHON=/work/main/.venv/bin/python python benchmarks/bench_stream.py --gb 4 --out benchmarks/results/stream.json
"""
from __future__ import annotations

import argparse
import glob
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(1, REPO)

from report import emit  # noqa: E402

FASHION = "/usr/share/datasets/fashion-mnist"


def write_parquet(folder: str, x, y, copies: int, rows_per_file: int) -> dict:
    """``copies`` x (x, y) as Parquet files of ``rows_per_file`` rows
    (files of whole repeats of (x, y) are written once and copied)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(folder)
    n, width = x.shape[0], x.shape[1] * x.shape[2] if x.ndim == 3 else x.shape[1]
    flat = x.reshape(n, -1)
    total = n * copies
    written, f = 0, 0
    first = None
    while written < total:
        rows = min(rows_per_file, total - written)
        path = os.path.join(folder, f"part-{f:05d}.parquet")
        if first is not None and rows == rows_per_file and rows_per_file % n == 0:
            shutil.copyfile(first, path)  # the same rows again: a copy of the first file
            written += rows
            f += 1
            continue
        idx = (np.arange(written, written + rows) % n)
        values = pa.array(flat[idx].reshape(-1))
        offsets = pa.array(np.arange(0, rows * width + 1, width, dtype=np.int32))
        table = pa.table({"features": pa.ListArray.from_arrays(offsets, values),
                          "label": pa.array(y[idx].astype(np.int64))})
        pq.write_table(table, path, row_group_size=16384)
        if first is None and rows == rows_per_file:
            first = path
        written += rows
        f += 1
    size = sum(os.path.getsize(p) for p in glob.glob(os.path.join(folder, "*.parquet")))
    return {"path": folder, "rows": total, "files": f, "pixel_bytes": total * width, "file_bytes": size}


# ----------------------------------------------------------------- RSS
def _status(pid: int) -> dict:
    out = {}
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith(("VmRSS:", "VmHWM:", "PPid:")):
                    k, v = line.split(":", 1)
                    out[k] = int(v.split()[0])
    except OSError:
        return {}
    return out


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


class RssSampler:
    """Peak RSS per process of this run (this process and its descendants),
    grouped: driver (this process, its JVM), executor JVMs, Python workers
    (daemons and their forks)."""

    def __init__(self, every: float = 0.25):
        self.every, self.me = every, os.getpid()
        self.peak: dict = {}  # pid -> [group, peak VmRSS kB, last VmHWM kB]
        self.group_peak: dict = {}  # group -> peak of the group's summed VmRSS kB
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _group(self, pid: int, cmd: str) -> str:
        if pid == self.me:
            return "driver_python"
        if "CoarseGrainedExecutorBackend" in cmd:
            return "executor_jvm"
        if "pyspark.daemon" in cmd or "pyspark/daemon" in cmd or "pyspark.worker" in cmd:
            return "python_workers"
        if "org.apache.spark.deploy.SparkSubmit" in cmd:
            return "driver_jvm"
        return ""

    def _descendants(self) -> list:
        """This process and every process below it (the driver JVM, the
        executor JVMs it starts, their Python workers): not other runs'."""
        parent = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/stat") as fh:
                        parent[int(entry)] = int(fh.read().rsplit(")", 1)[1].split()[1])
                except (OSError, IndexError, ValueError):
                    pass
        mine, grew = {self.me}, True
        while grew:
            grew = False
            for pid, pp in parent.items():
                if pp in mine and pid not in mine:
                    mine.add(pid)
                    grew = True
        return sorted(mine)

    def sample(self) -> None:
        sums: dict = {}
        for pid in self._descendants():
            if pid not in self.peak:
                group = self._group(pid, _cmdline(pid))
                if not group:
                    continue
                self.peak[pid] = [group, 0, 0]
            st = _status(pid)
            if not st:
                continue
            rec = self.peak[pid]
            rec[1] = max(rec[1], st.get("VmRSS", 0))
            rec[2] = max(rec[2], st.get("VmHWM", 0))
            sums[rec[0]] = sums.get(rec[0], 0) + st.get("VmRSS", 0)
        for g, v in sums.items():
            self.group_peak[g] = max(self.group_peak.get(g, 0), v)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.every)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.sample()

    def report(self) -> dict:
        out = {}
        for pid, (group, rss, hwm) in sorted(self.peak.items()):
            g = out.setdefault(group, {"processes": 0, "max_peak_rss_mb": 0.0, "max_vmhwm_mb": 0.0})
            g["processes"] += 1
            g["max_peak_rss_mb"] = max(g["max_peak_rss_mb"], rss / 1024)
            g["max_vmhwm_mb"] = max(g["max_vmhwm_mb"], hwm / 1024)
        for group, v in self.group_peak.items():
            out.setdefault(group, {})["peak_sum_rss_mb"] = v / 1024
        return out


# ----------------------------------------------------------------- fits
def build(hidden: int, seed: int = 1):
    from sparkavg.nn import Adam, Dense, Network, Output

    layers = [Dense(h, activation="relu") for h in hidden] + [Output(10)]
    return Network((784,), layers, updater=Adam(lr=1e-3), seed=seed)


def fit(spark, df, epochs: int, hidden, frequency: int, batch: int):
    from sparkavg.spark import DataOptions, ParameterAveraging, SparkTrainer

    # Spark blocks, the cluster default (local-cluster counts as local: shared files in a temp folder otherwise).
    master = ParameterAveraging(workers=2, batch_size_per_worker=batch, averaging_frequency=frequency, seed=3,
                                data=DataOptions(placement="spark"))
    net = build(hidden)
    t0 = time.perf_counter()
    with SparkTrainer(spark, net, master, progress=False) as trainer:
        trainer.fit(df, epochs=epochs)
        total = time.perf_counter() - t0
        decisions = [d for d in trainer.stats.decisions if d["name"] == "data_storage"]
        history = [{k: h[k] for k in ("epoch", "seconds", "examples", "examples_per_second", "loss", "rounds")}
                   for h in trainer.history]
    return {"fit_seconds": total, "history": history, "data_storage": decisions}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gb", type=float, default=4.0, help="GB (1e9) of uint8 pixels in the large set")
    p.add_argument("--executor-mb", type=int, default=1024)
    p.add_argument("--driver-memory", default="1g")
    p.add_argument("--hidden", default="256,128", help="the MLP's hidden layer widths")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--frequency", type=int, default=400, help="averaging_frequency (memory mode; a streamed "
                                                              "round is one source partition)")
    p.add_argument("--partition-mb", type=int, default=32, help="spark.sql.files.maxPartitionBytes in MB")
    p.add_argument("--tmp", default="/tmp")
    p.add_argument("--skip", default="", help="comma list of fits to skip: memory,stream")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    for name in ("py4j", "pyspark"):
        logging.getLogger(name).setLevel(logging.WARNING)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ["PYTHONPATH"] = os.pathsep.join(x for x in (REPO, os.environ.get("PYTHONPATH", "")) if x)
    hidden = [int(h) for h in args.hidden.split(",") if h]
    skip = set(filter(None, args.skip.split(",")))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                            text=True).stdout.strip()
    master = f"local-cluster[2,1,{args.executor_mb}]"
    result = {"benchmark": "stream", "commit": commit, "cpus": os.cpu_count(), "hostname": socket.gethostname(),
              "master": master, "driver_memory": args.driver_memory, "hidden": hidden, "batch": args.batch,
              "frequency": args.frequency, "partition_mb": args.partition_mb, "load_before": os.getloadavg()}
    from sparkavg.data.idx import read_idx

    x = read_idx(os.path.join(FASHION, "train-images-idx3-ubyte.gz"))
    y = read_idx(os.path.join(FASHION, "train-labels-idx1-ubyte.gz"))
    folder = tempfile.mkdtemp(prefix="sparkavg-stream-", dir=args.tmp)
    try:
        t0 = time.perf_counter()
        small = write_parquet(os.path.join(folder, "small"), x, y, 1, 15_000)
        copies = max(1, round(args.gb * 1e9 / x.nbytes))
        large = write_parquet(os.path.join(folder, "large"), x, y, copies, 120_000) if "stream" not in skip else None
        result["write_seconds"] = time.perf_counter() - t0
        result["small"], result["large"] = small, large
        print(f"wrote {small} and {large} in {result['write_seconds']:.0f} s", file=sys.stderr, flush=True)
        from pyspark.sql import SparkSession

        from sparkavg.spark import recommended_conf

        builder = SparkSession.builder.master(master).appName("bench-stream")
        for k, v in recommended_conf(master).items():
            builder = builder.config(k, v)
        spark = (builder.config("spark.driver.memory", args.driver_memory)
                 .config("spark.ui.enabled", "false")
                 .config("spark.sql.files.maxPartitionBytes", f"{args.partition_mb}m")
                 .config("spark.executorEnv.PYTHONPATH", os.environ["PYTHONPATH"])
                 .getOrCreate())
        spark.sparkContext.setLogLevel("WARN")
        try:
            deadline = time.monotonic() + 60
            while spark.sparkContext._jsc.sc().getExecutorIds().size() < 2 and time.monotonic() < deadline:
                time.sleep(0.5)  # both executors registered: the storage memory auto compares with
            with RssSampler() as rss:
                if "memory" not in skip:
                    df = spark.read.parquet(small["path"])
                    result["memory"] = fit(spark, df, 2, hidden, args.frequency, args.batch)
                    print(f"memory: {result['memory']}", file=sys.stderr, flush=True)
                result["rss_after_memory"] = rss.report()
                if "stream" not in skip:
                    df = spark.read.parquet(large["path"])
                    result["stream"] = fit(spark, df, 1, hidden, args.frequency, args.batch)
                    print(f"stream: {result['stream']}", file=sys.stderr, flush=True)
            result["rss"] = rss.report()
        finally:
            spark.stop()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    result["load_after"] = os.getloadavg()
    if "memory" in result and "stream" in result:
        mem = result["memory"]["history"][-1]["examples_per_second"]
        st = result["stream"]["history"][-1]["examples_per_second"]
        result["verdict"] = {"memory_examples_per_second": mem, "stream_examples_per_second": st,
                             "stream_vs_memory": st / mem, "at_least_0_8": st / mem >= 0.8}
    return emit(result, args.out)


if __name__ == "__main__":
    main()
