#!/usr/bin/env python
"""Gradient sharing against parameter averaging, same data, epochs and
workers, same run: compression ratio (dense bytes / bytes on the wire),
accuracy, epoch throughput; and sharing again with simulated datagram loss
(accuracy, replica agreement, retransmissions; the transport's
fault-injection hook ``sparkavg.test.udp_loss``).

Prints JSON (and writes it with --out).

    python benchmarks/bench_sharing.py --epochs 2
    python benchmarks/bench_sharing.py --also-staleness none,2 --skip-loss-run   # what waiting costs
    python benchmarks/bench_sharing.py --also-dl4j --skip-loss-run   # the default preset against DL4J's
"""
from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys

from report import emit

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))


def run(spark, master, rdd, test, epochs, seed):
    from sparkavg.nn import lenet
    from sparkavg.spark import SparkTrainer

    trainer = SparkTrainer(spark, lenet(seed=seed), master)
    trainer.fit(rdd, epochs=epochs, validation_data=test)
    trainer.close()
    c = trainer.stats.counters
    h = trainer.history
    out = {
        "accuracy": [e["accuracy"] for e in h],
        "epoch_seconds": [e["seconds"] for e in h],
        "examples_per_second": h[-1]["examples"] / statistics.median(e["seconds"] for e in h),
        "summary": trainer.stats.summary(),
    }
    if "bytes_sent" in c:
        out.update({
            "bytes_sent": int(c["bytes_sent"]),
            "payload_bytes_sent": int(c["payload_bytes_sent"]),
            "dense_bytes_equivalent": int(c["dense_bytes_equivalent"]),
            "compression_ratio": c["dense_bytes_equivalent"] / c["bytes_sent"],
            "payload_compression_ratio": c["dense_bytes_equivalent"] / c["payload_bytes_sent"],
            "messages_sent": int(c["messages_sent"]),
            "mean_entries_per_message": c["entries_sent"] / max(c["messages_sent"], 1),
            "replica_max_abs_diff": max(e["replica_max_abs_diff"] for e in h),
            "datagrams_sent": int(c["datagrams_sent"]),
            "datagrams_retransmitted": int(c["datagrams_retransmitted"]),
            "datagrams_rejected": int(c["datagrams_rejected"]),
            "datagrams_forged": int(c["datagrams_forged"]),
        })
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", default=None)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--averaging-frequency", type=int, default=5)
    p.add_argument("--threshold", type=float, default=1e-2, help="initial tau of the adaptive algorithm")
    p.add_argument("--fixed", action="store_true", help="use FixedThreshold(--threshold) instead of Adaptive")
    p.add_argument("--loss", type=float, default=0.2, help="simulated datagram loss of the lossy run")
    p.add_argument("--limit-train", type=int, default=None)
    p.add_argument("--seed", type=int, default=123)
    p.add_argument("--skip-loss-run", action="store_true")
    p.add_argument("--also-staleness", default="",
                   help="comma-separated GradientSharing.staleness values ('none': fully asynchronous) to run "
                        "sharing at as well, after the default (0): the cost of waiting for the peers")
    p.add_argument("--also-dl4j", action="store_true",
                   help="also sharing with DL4J's preset (GradientSharing.dl4j at staleness 0: whole updates summed, "
                        "no local view, no momentum masking), then the default again (what the default's policies "
                        "cost and give)")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)

    from mnist_lenet import as_minibatch_rdd, spark_session

    from sparkavg.data.mnist import default_data_dir, load_mnist
    from sparkavg.spark import AdaptiveThreshold, FixedThreshold, GradientSharing, ParameterAveraging
    from sparkavg.spark.executor.hooks import RETRANSMIT_TIMEOUT, UDP_LOSS

    data_dir = args.data_dir or default_data_dir()
    x, y = load_mnist(data_dir, "train", limit=args.limit_train)
    xt, yt = load_mnist(data_dir, "test")
    spark = spark_session(f"local[{args.workers}]", "bench-sharing")
    threshold = FixedThreshold(args.threshold) if args.fixed else AdaptiveThreshold(initial=args.threshold)
    result = {"benchmark": "sharing", "examples": int(len(x)), "epochs": args.epochs, "workers": args.workers,
              "batch_size": args.batch_size, "threshold": repr(threshold)}
    try:
        sc = spark.sparkContext
        rdd, test = as_minibatch_rdd(sc, x, y, args.workers), as_minibatch_rdd(sc, xt, yt, args.workers)
        result["averaging"] = run(spark, ParameterAveraging(batch_size_per_worker=args.batch_size, workers=args.workers,
                                                            averaging_frequency=args.averaging_frequency,
                                                            seed=args.seed), rdd, test, args.epochs, args.seed)
        sharing = dict(threshold=threshold, batch_size_per_worker=args.batch_size, workers=args.workers, seed=args.seed)
        result["sharing"] = run(spark, GradientSharing(**sharing), rdd, test, args.epochs, args.seed)
        for value in filter(None, args.also_staleness.split(",")):
            staleness = None if value.strip().lower() == "none" else int(value)
            run_ = run(spark, GradientSharing(**sharing, staleness=staleness), rdd, test, args.epochs, args.seed)
            run_["staleness"] = staleness
            run_["throughput_over_default"] = run_["examples_per_second"] / result["sharing"]["examples_per_second"]
            result[f"sharing_staleness_{value.strip().lower()}"] = run_
        if args.also_dl4j:  # DL4J's preset between two runs of the default: the machine's drift shows
            run_ = run(spark, GradientSharing.dl4j(staleness=0, **sharing), rdd, test, args.epochs, args.seed)
            again = run(spark, GradientSharing(**sharing), rdd, test, args.epochs, args.seed)
            default = statistics.mean([result["sharing"]["examples_per_second"], again["examples_per_second"]])
            run_["throughput_default_over_dl4j"] = default / run_["examples_per_second"]
            result["sharing_dl4j_preset"] = run_
            result["sharing_again"] = again
        if not args.skip_loss_run:  # fault injection: the transport's test hooks, read per job from local properties
            hooks = {UDP_LOSS: str(args.loss), RETRANSMIT_TIMEOUT: "0.05"}
            try:
                for key, value in hooks.items():
                    sc.setLocalProperty(key, value)
                result["sharing_lossy"] = run(spark, GradientSharing(**sharing), rdd, test, args.epochs, args.seed)
            finally:
                for key in hooks:
                    sc.setLocalProperty(key, None)
            result["sharing_lossy"]["simulated_loss"] = args.loss
    finally:
        spark.stop()
    s, a = result["sharing"], result["averaging"]
    result["verdict"] = {
        "compression_ratio": s["compression_ratio"],
        "compression_must_ge_100": s["compression_ratio"] >= 100,
        "compression_aim_ge_1000": s["compression_ratio"] >= 1000,
        "accuracy_gap_points": 100 * (a["accuracy"][-1] - s["accuracy"][-1]),
        "accuracy_must_within_1.5": 100 * (a["accuracy"][-1] - s["accuracy"][-1]) <= 1.5,
        "throughput_ratio_sharing_over_averaging": s["examples_per_second"] / a["examples_per_second"],
    }
    return emit(result, args.out)


if __name__ == "__main__":
    main()
