#!/usr/bin/env python
"""The cost of one averaging round in milliseconds: rounds inside one
barrier stage against a Spark job per round (issue 37), on ``local[2]`` or
(``--rates``) on 2 simulated hosts with shaped links, same run.

For DL4J's LeNet (Fashion-MNIST, 32 examples per worker, from the
examples' RDD of chunks) and DL4J's MnistMLP (from a Parquet DataFrame, 16
examples per worker; ``bench_averaging.mnist_mlp``): one epoch of
``--examples`` examples at a pinned ``averaging_frequency`` (``--frequency``)
per path, the two paths alternated ``--repeats`` times (the path forced
through the tests' hook ``sparkavg.test.averaging_path``).  Per round, read
off ``trainer.stats`` the way the cost model reads it
(``rounds_from_events``): its wall time and its overhead -- the round minus
the slowest worker's fit and data time; medians over the epoch's rounds
(the first of each fit, which builds the workers' networks, left out).
The two paths end with the same parameters (``tests/test_instage.py``):
their SHA-256 is reported too.

    python benchmarks/bench_instage.py --out benchmarks/results/instage_round_cost.json

With ``--rates 1gbit,100mbit`` the same comparison runs once per rate on a
fresh :class:`tests.harness.SimulatedCluster` of 2 worker hosts x 1 core
(and a driver host), every link -- the driver's included -- shaped both
ways with ``tc tbf`` to that rate; the driver program runs in the driver
host, the MnistMLP's Parquet files lie in a folder every host sees.  Needs
root::

    python benchmarks/bench_instage.py --rates 1gbit,100mbit --out benchmarks/results/instage_round_cost_hosts.json
"""
from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(1, os.path.join(HERE, "..", "examples"))
sys.path.insert(2, os.path.join(HERE, ".."))  # tests.harness
REPO = os.path.dirname(HERE)

from report import emit  # noqa: E402

PATHS = ("jobs", "in_stage")


def one_epoch(spark, data, make, master, path: str) -> dict:
    """One epoch on ``path``: per-round wall and overhead (ms, the fit's first round left out)."""
    from sparkavg.spark import SparkTrainer
    from sparkavg.spark.executor.hooks import AVERAGING_PATH
    from sparkavg.spark.policies.frequency import rounds_from_events

    sc = spark.sparkContext
    trainer = SparkTrainer(spark, make(), master)
    sc.setLocalProperty(AVERAGING_PATH, path)
    try:
        trainer.fit(data, epochs=1)
    finally:
        sc.setLocalProperty(AVERAGING_PATH, None)
        trainer.close()
    assert trainer.history[0]["averaging_path"] == path, trainer.history[0]
    rounds = rounds_from_events(trainer.stats.events, 0)[1:]
    walls = [wall for wall, _ in rounds]
    overheads = [max(0.0, wall - max(t for t, _ in busy)) for wall, busy in rounds if busy]
    return {"rounds": len(rounds) + 1, "epoch_seconds": trainer.history[0]["seconds"],
            "round_ms_median": 1e3 * statistics.median(walls), "overhead_ms_median": 1e3 * statistics.median(overheads),
            "params_sha256": hashlib.sha256(trainer.network.state["params"].tobytes()).hexdigest()}


def compare(spark, data, make, master, repeats: int) -> dict:
    runs = {p: [] for p in PATHS}
    for _ in range(repeats):
        for path in PATHS:
            runs[path].append(one_epoch(spark, data, make, master, path))
            logging.info("%s: %s", path, runs[path][-1])
    out = {p: {"runs": r, "round_ms": statistics.median(x["round_ms_median"] for x in r),
               "overhead_ms": statistics.median(x["overhead_ms_median"] for x in r)} for p, r in runs.items()}
    out["overhead_ratio_jobs_over_in_stage"] = out["jobs"]["overhead_ms"] / max(out["in_stage"]["overhead_ms"], 1e-6)
    out["round_ratio_jobs_over_in_stage"] = out["jobs"]["round_ms"] / out["in_stage"]["round_ms"]
    out["same_parameters"] = len({x["params_sha256"] for r in runs.values() for x in r}) == 1
    return out


def measure(spark, args, folder: str) -> dict:
    """Both models' comparison in ``spark`` (``folder``: where the MnistMLP's Parquet goes)."""
    from bench_averaging import mnist_mlp, write_parquet
    from mnist_example import as_minibatch_rdd

    from sparkavg.data.mnist import default_data_dir, load_mnist
    from sparkavg.nn.zoo import lenet
    from sparkavg.spark import ParameterAveraging

    x, y = load_mnist(args.data_dir or default_data_dir(), "train", limit=args.examples)
    result = {"examples": int(len(x)), "averaging_frequency": args.frequency, "repeats": args.repeats,
              "load_before": os.getloadavg()[0]}
    models = args.models.split(",")
    if "lenet" in models:
        rdd = as_minibatch_rdd(spark.sparkContext, x, y, slices=2).cache()
        master = ParameterAveraging(batch_size_per_worker=32, workers=2, seed=args.seed,
                                    averaging_frequency=args.frequency)
        result["lenet"] = compare(spark, rdd, lambda: lenet(num_classes=10, seed=args.seed), master, args.repeats)
        result["lenet"]["parameters"] = int(lenet(num_classes=10, seed=args.seed).num_params)
        rdd.unpersist()
    if "mlp" in models:
        df = spark.read.parquet(write_parquet(x, y, os.path.join(folder, "mlp"), files=4)).cache()
        df.count()
        master = ParameterAveraging(batch_size_per_worker=16, workers=2, seed=args.seed,
                                    averaging_frequency=args.frequency)
        result["mlp"] = compare(spark, df, lambda: mnist_mlp(args.seed), master, args.repeats)
        result["mlp"]["parameters"] = int(mnist_mlp(args.seed).num_params)
        df.unpersist()
    result["load_after"] = os.getloadavg()[0]
    return result


def job(args) -> None:
    """The driver program on the simulated cluster: :func:`measure`, one JSON line on stdout."""
    from bench_cluster import job_session

    spark = job_session(args.conf, "bench-instage")
    spark.sparkContext.setLogLevel("ERROR")
    try:
        # the executors' sparkavg: this checkout's, not another one on the venv's path
        where = spark.sparkContext.parallelize([0], 1).map(lambda _: __import__("sparkavg").__file__).first()
        result = measure(spark, args, args.shared_dir)
        result["executor_sparkavg"] = where
    finally:
        spark.stop()
    print(json.dumps(result), flush=True)


def on_hosts(rate: str, args) -> dict:
    """One rate: a fresh cluster of 2 worker hosts, every link shaped to ``rate``, the driver program in it."""
    from tests.harness import SimulatedCluster
    from tests.harness.driving import drive

    started = time.monotonic()
    shared = tempfile.mkdtemp(prefix=".bench-instage-", dir=REPO)  # seen by every host (/tmp is each host's own)
    try:
        with SimulatedCluster(workers=2, cores_per_worker=1, memory="1g", rate=rate) as cluster:
            conf = {**cluster.spark_conf(), "spark.ui.enabled": "false"}
            argv = [sys.executable, os.path.abspath(__file__), "--job", "--conf", json.dumps(conf), "--shared-dir",
                    shared, "--examples", str(args.examples), "--frequency", str(args.frequency), "--repeats",
                    str(args.repeats), "--models", args.models, "--seed", str(args.seed)]
            if args.data_dir:
                argv += ["--data-dir", args.data_dir]
            began = time.monotonic()
            code, last, log = drive(cluster, argv, lambda event, program: None, cwd=REPO, timeout=120)
            if code != 0 or last is None:
                raise RuntimeError(f"the driver program at {rate} exited with {code}:\n{log[-6000:]}")
            return {"rate": rate, "master": f"2 simulated hosts x 1 core, {cluster.master_url}",
                    "cluster_start_seconds": began - started, "driver_program_seconds": time.monotonic() - began,
                    **last}
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", default=None)
    p.add_argument("--examples", type=int, default=6400)
    p.add_argument("--frequency", type=int, default=8)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--models", default="lenet,mlp")
    p.add_argument("--seed", type=int, default=123)
    p.add_argument("--rates", default=None,
                   help="run on 2 simulated hosts, once per comma-separated tc rate (e.g. 1gbit,100mbit); "
                        "default: local[2]")
    p.add_argument("--out", default=None)
    p.add_argument("--job", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--conf", default=None, help=argparse.SUPPRESS)
    p.add_argument("--shared-dir", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("sparkavg").setLevel(logging.WARNING)
    if args.job:
        job(args)
        return 0
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                            text=True).stdout.strip()
    if args.rates:
        from tests.harness import SimulatedCluster

        ok, reason = SimulatedCluster.available()
        if not ok:
            raise SystemExit(f"bench_instage --rates needs simulated hosts: {reason}")
        result = {"bench": "instage_round_cost_hosts", "commit": commit, "machine": f"{os.cpu_count()} CPUs",
                  "hostname": socket.gethostname(), "load_before": os.getloadavg(), "runs": []}
        for rate in args.rates.split(","):
            result["runs"].append(on_hosts(rate.strip(), args))
            logging.info("%s done", rate)
        result["load_after"] = os.getloadavg()
        emit(result, args.out)
        return 0

    from mnist_example import spark_session

    spark = spark_session("local[2]", "bench-instage")
    spark.sparkContext.setLogLevel("ERROR")
    result = {"bench": "instage_round_cost", "commit": commit, "machine": f"{os.cpu_count()} CPUs",
              "master": "local[2]"}
    folder = tempfile.mkdtemp(prefix="sparkavg-instage-")
    try:
        result.update(measure(spark, args, folder))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        spark.stop()
    emit(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
