#!/usr/bin/env python
"""The torch LeNet on 2 simulated hosts with shaped links: sparkavg's two
masters against pyspark's ``TorchDistributor`` on the same cluster.

Hosts are simulated (:class:`tests.harness.SimulatedCluster`: a driver host
with the Spark master and the driver program, 2 worker hosts x 1 core, each
its own network and mount namespace on this machine, every link shaped both
ways with ``tc tbf``).  Per link speed a fresh cluster runs ONE driver
program that trains the seeds' LeNet written as a torch module
(``sparkavg.torch.zoo:lenet``), Adam(lr=1e-3), 32 examples per worker (or
process) per step, on the first ``--limit-train`` Fashion-MNIST training
examples for ``--epochs`` epochs, three ways, one after the other:

``averaging``
    ``sparkavg.torch.TorchModel`` under ``ParameterAveraging`` at its
    defaults (``averaging_frequency="auto"``, block momentum); the executors
    read the examples from the IDX files themselves
    (``bench_cluster.executor_loaded_rdd``).
``sharing``
    The same under ``GradientSharing(threshold=AdaptiveThreshold(1e-2))``.
``distributor``
    ``TorchDistributor(num_processes=2, local_mode=False)``: its barrier
    tasks on the two worker hosts' executors start ``torchrun``, DDP over
    gloo (``GLOO_SOCKET_IFNAME=eth0``: the host's link), one thread per
    process, each rank reading the files itself
    (``bench_torch._ddp_train``, the function of the local comparison).

Throughput = examples / seconds of the last epoch (sparkavg: the trainer's
epoch, which includes its Spark jobs; TorchDistributor: its training loop
between two ``dist.barrier()``, process start-up apart) and, beside it,
examples x epochs / the wall seconds of the whole call (``fit`` or
``TorchDistributor.run``: start-up included).  Test accuracy on the
10,000 test images after the last epoch.  Bytes on the wire are the hosts'
kernel counters (``bench_cluster.install_counters``), read around each run.

Needs root (namespaces).  Prints JSON (``--out`` writes it)::

    python benchmarks/bench_torch_hosts.py --rates 100mbit --out benchmarks/results/torch_hosts_100mbit.json
    python benchmarks/bench_torch_hosts.py --limit-train 2000 --epochs 1 --rates 1gbit   # a quick check
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(1, REPO)  # tests.harness: the simulated hosts are not part of the installed package

from bench_cluster import BATCH, SEED, THRESHOLD  # noqa: E402  (bench_cluster's run, as a torch module)
from report import emit, subset  # noqa: E402

LR = 1e-3
RUNS = ("averaging", "sharing", "distributor")


# -- the driver program (runs inside the cluster's driver host) ------------------------------

def job(args) -> None:
    """The three runs in one SparkSession, each between a ``ready`` and a
    ``done`` line on stdout, waiting for ``go`` on stdin after each so that
    the benchmark reads the host counters around exactly that run."""
    import numpy as np
    from pyspark import cloudpickle
    from pyspark.ml.torch.distributor import TorchDistributor

    import bench_torch
    from bench_cluster import executor_loaded_rdd, handshake, job_session
    from sparkavg.data.mnist import load_mnist
    from sparkavg.nn import Adam
    from sparkavg.spark import AdaptiveThreshold, GradientSharing, ParameterAveraging, SparkTrainer
    from sparkavg.torch import TorchModel

    # The DDP function travels by value (the executors have no benchmarks/ on their path).
    cloudpickle.register_pickle_by_value(bench_torch)

    spark = job_session(args.conf, "bench-torch-hosts")
    try:
        xt, yt = load_mnist(args.data_dir, "test")
        rdd = executor_loaded_rdd(spark.sparkContext, args.data_dir, args.limit_train, slices=2)
        examples = rdd.map(lambda c: len(c[1])).sum()
        masters = {
            "averaging": ParameterAveraging(batch_size_per_worker=BATCH, workers=2, seed=SEED),
            "sharing": GradientSharing(threshold=AdaptiveThreshold(initial=THRESHOLD), batch_size_per_worker=BATCH,
                                       workers=2, seed=SEED),
        }
        for name in args.runs.split(","):
            handshake({"event": "ready", "run": name})
            if name == "distributor":
                t = time.perf_counter()
                out = TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(
                    bench_torch._ddp_train, args.data_dir, args.limit_train, args.epochs, BATCH, SEED)
                wall = time.perf_counter() - t
                done = {"epoch_seconds": out["epoch_seconds"], "examples": out["examples"],
                        "accuracy": out["accuracy"][-1], "accuracy_per_epoch": out["accuracy"]}
            else:
                model = TorchModel("sparkavg.torch.zoo:lenet", updater=Adam(lr=LR), input_shape=(1, 28, 28),
                                   seed=SEED)
                trainer = SparkTrainer(spark, model, masters[name])
                t = time.perf_counter()
                trainer.fit(rdd, epochs=args.epochs)
                wall = time.perf_counter() - t
                trainer.close()
                pred = np.argmax(np.concatenate([model.output(xt[i:i + 1000]) for i in range(0, len(xt), 1000)]),
                                 axis=1)
                h, c = trainer.history, trainer.stats.counters
                done = {"epoch_seconds": [e["seconds"] for e in h], "examples": int(examples),
                        "accuracy": float(np.mean(pred == yt)), "master": masters[name].to_config(),
                        "averaging_frequency": [e.get("averaging_frequency") for e in h],
                        "rounds": [e.get("rounds") for e in h],
                        "replica_max_abs_diff": max((e.get("replica_max_abs_diff") or 0.0) for e in h),
                        "bytes_sent": float(c.get("bytes_sent", 0.0)),
                        "dense_bytes_equivalent": float(c.get("dense_bytes_equivalent", 0.0)),
                        "phase_totals": trainer.stats.phase_totals()}
            done.update(event="done", run=name, wall_seconds=wall)
            handshake(done)
        rdd.unpersist()
    finally:
        spark.stop()


# -- the benchmark (root namespace) ------------------------------------------------------------

def summarise(done: dict, hosts: dict, epochs: int) -> dict:
    out = {k: v for k, v in done.items() if k not in ("event", "run")}
    last = done["epoch_seconds"][-1]
    out["examples_per_second"] = done["examples"] / last
    out["examples_per_second_with_startup"] = done["examples"] * epochs / done["wall_seconds"]
    out["hosts"] = hosts
    out["busiest_link_bytes"] = max(max(v["tx"], v["rx"]) for v in hosts.values())
    return out


def run_cluster(rate, args) -> dict:
    from bench_cluster import drive_counted, install_counters
    from tests.harness import SimulatedCluster

    started = time.monotonic()
    with SimulatedCluster(workers=2, cores_per_worker=1, memory="1g", rate=rate) as cluster:
        install_counters(cluster)
        conf = {**cluster.spark_conf(), "spark.executorEnv.GLOO_SOCKET_IFNAME": "eth0",
                "spark.executorEnv.OMP_NUM_THREADS": "1"}
        argv = [sys.executable, os.path.abspath(__file__), "--job", "--conf", json.dumps(conf), "--data-dir",
                args.data_dir, "--epochs", str(args.epochs), "--limit-train", str(args.limit_train),
                "--runs", args.runs]
        result = {"rate": rate or "unshaped", "cluster_start_seconds": time.monotonic() - started,
                  "load_average_1min_before": os.getloadavg()[0]}

        def on_done(event, hosts):
            result[event["run"]] = summarise(event, hosts, args.epochs)

        code, log = drive_counted(cluster, argv, on_done)
        missing = [r for r in args.runs.split(",") if r not in result]
        if code != 0 or missing:
            raise RuntimeError(f"the driver program on {result['rate']} exited with {code}, missing {missing}:\n"
                               f"{log[-6000:]}")
        result["worker_ips"] = [h.ip for h in cluster.hosts]
        result["load_average_1min_after"] = os.getloadavg()[0]
    return result


def verdicts(runs: list) -> dict:
    v = {}
    for run in runs:
        rate = run["rate"]
        if "distributor" not in run:
            continue
        ddp = run["distributor"]
        for name in ("averaging", "sharing"):
            if name in run:
                v[f"{name}_over_distributor_{rate}"] = run[name]["examples_per_second"] / ddp["examples_per_second"]
                v[f"{name}_over_distributor_{rate}_with_startup"] = (
                    run[name]["examples_per_second_with_startup"] / ddp["examples_per_second_with_startup"])
                v[f"{name}_accuracy_minus_distributor_points_{rate}"] = 100 * (run[name]["accuracy"]
                                                                              - ddp["accuracy"])
        if rate == "100mbit":
            v["ge_3x_distributor_at_100mbit"] = all(
                v[f"{n}_over_distributor_100mbit"] >= 3 for n in ("averaging", "sharing") if n in run)
    return v


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--limit-train", type=int, default=12000, help="first N training examples (default 12000)")
    p.add_argument("--epochs", type=int, default=2, help="epochs per run; throughput is the last epoch's")
    p.add_argument("--rates", default="1gbit,100mbit", help="link speeds, 'none' = unshaped")
    p.add_argument("--runs", default=",".join(RUNS), help=f"comma-separated subset of {RUNS}, in this order")
    p.add_argument("--out", default=None)
    p.add_argument("--job", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--conf", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.runs = ",".join(subset(p, args.runs, RUNS, "runs"))
    if args.job:
        return job(args)
    from tests.harness import SimulatedCluster

    ok, reason = SimulatedCluster.available()
    if not ok:
        raise SystemExit(f"bench_torch_hosts needs simulated hosts: {reason}")
    import torch

    rates = [None if r.strip() == "none" else r.strip() for r in args.rates.split(",")]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                            text=True).stdout.strip()
    result = {"benchmark": "torch module on simulated hosts", "commit": commit, "torch": torch.__version__,
              "cpus": os.cpu_count(), "hostname": socket.gethostname(), "examples": args.limit_train,
              "epochs": args.epochs, "batch_size_per_worker": BATCH, "workers": "2 hosts x 1 core",
              "threshold": f"AdaptiveThreshold(initial={THRESHOLD})", "runs": []}
    for rate in rates:
        result["runs"].append(run_cluster(rate, args))
    result["verdict"] = verdicts(result["runs"])
    return emit(result, args.out)


if __name__ == "__main__":
    main()
