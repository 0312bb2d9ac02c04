#!/usr/bin/env python
"""DL4J's LeNet example on any MNIST-format folder (Fashion-MNIST by default).

    python examples/mnist_lenet.py --mode local --epochs 1
    python examples/mnist_lenet.py --mode averaging --master local[2] --workers 2
    python examples/mnist_lenet.py --mode sharing --threshold 1e-3 --report out.json
    python examples/mnist_lenet.py --mode local --device gpu

``--mode local`` trains in this process, no Spark; ``averaging`` and
``sharing`` train on Spark with ParameterAveraging or GradientSharing.
After every epoch the test set is evaluated; ``--report`` writes JSON
(``train_seconds`` counts training only, not data loading or evaluation).
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time

import numpy as np

from sparkavg.backend import current_device, to_cpu
from sparkavg.data.batching import minibatches
from sparkavg.data.mnist import default_data_dir, load_mnist
from sparkavg.evaluation import Evaluation
from sparkavg.nn.zoo import lenet
from sparkavg.threads import set_threads

log = logging.getLogger("mnist_lenet")


def averaging_frequency(text: str):
    """``--averaging-frequency``: ``"auto"`` or an int >= 1."""
    if text == "auto":
        return text
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an int >= 1 or 'auto', got {text!r}")
    return value


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", default=None,
                   help="folder with train-/t10k- images/labels IDX files, .gz or raw "
                        "(default: $SPARKAVG_DATA_DIR or /usr/share/datasets/fashion-mnist)")
    p.add_argument("--mode", choices=["local", "averaging", "sharing"], default="averaging")
    p.add_argument("--master", default="local[2]", help="Spark master URL (default local[2])")
    p.add_argument("--workers", type=int, default=2, help="Spark workers per round (default 2)")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=None,
                   help="minibatch size (per worker on Spark); default 64 local, 32 on Spark")
    p.add_argument("--averaging-frequency", type=averaging_frequency, default="auto",
                   help="minibatches per worker between averagings: an int, or 'auto' (default: chosen every "
                        "epoch from the measured round and iteration costs)")
    p.add_argument("--threshold", type=float, default=1e-2,
                   help="gradient sharing: initial tau of DL4J's adaptive algorithm (default 1e-2: Adam's steps "
                        "are about lr=1e-3 per parameter, so tau must be several steps to compress)")
    p.add_argument("--fixed-threshold", action="store_true", help="gradient sharing: keep tau fixed")
    p.add_argument("--simulate-udp-loss", type=float, default=0.0,
                   help="sharing: drop/duplicate/reorder this fraction of datagrams")
    p.add_argument("--threads", type=int, default=None,
                   help="BLAS threads (local mode; default: all cores). Spark workers use their task's cores")
    p.add_argument("--device", choices=["auto", "cpu", "gpu"], default="auto",
                   help="Spark modes: the masters' device (auto: each task's Spark-assigned GPU when it has one "
                        "and CuPy works, else the CPU; gpu: an error without one; cpu). --mode local: gpu trains "
                        "on the current CUDA device with CuPy (an error when unavailable), auto and cpu on the CPU")
    p.add_argument("--seed", type=int, default=123)
    p.add_argument("--limit-train", type=int, default=None, help="use only the first N training examples")
    p.add_argument("--limit-test", type=int, default=None, help="use only the first N test examples")
    p.add_argument("--report", default=None, help="write a JSON report here")
    p.add_argument("--stats-html", default=None, help="write the training-stats HTML page here (Spark modes)")
    p.add_argument("--checkpoint-dir", default=None, help="Spark modes: checkpoint after every epoch")
    p.add_argument("--resume-from", default=None, help="Spark modes: resume from this checkpoint folder")
    p.add_argument("--mlflow", nargs="?", const="", default=None, metavar="TRACKING_URI",
                   help="Spark modes: log the run to MLflow (sparkavg[mlflow]); optional tracking URI "
                        "(default: $MLFLOW_TRACKING_URI / MLflow's own)")
    p.add_argument("--tensorboard", default=None, metavar="LOG_DIR",
                   help="Spark modes: write TensorBoard event files here (sparkavg[tensorboard])")
    args = p.parse_args(argv)
    if args.epochs < 1:
        p.error(f"--epochs must be >= 1, got {args.epochs}")
    if args.batch_size is None:
        args.batch_size = 64 if args.mode == "local" else 32
    return args


def evaluate_local(net, x, y, batch_size=1000) -> Evaluation:
    ev = Evaluation(10)
    for start in range(0, len(x), batch_size):
        ev.eval(y[start:start + batch_size], to_cpu(net.output(x[start:start + batch_size])))
    return ev


def train_local(args, net, train, test):
    set_threads(args.threads or os.cpu_count() or 1)
    if args.device == "gpu":
        try:
            net.to_gpu()
        except RuntimeError as exc:  # CuPy or CUDA unavailable: the backend says how to get it
            raise SystemExit(f"--device gpu: {exc}") from None
    device = "cpu" if net.xp is np else f"gpu:{current_device()}"
    log.info("training on %s", device)
    x, y = train
    detail, train_seconds, examples = [], 0.0, 0
    for epoch in range(args.epochs):
        t0, last_log, seen, loss_sum = time.time(), time.time(), 0, 0.0
        batches = -(-len(x) // args.batch_size)
        for i, (xb, yb) in enumerate(minibatches(x, y, args.batch_size, shuffle=True, seed=args.seed + epoch)):
            loss_sum += net.fit_batch(xb, yb) * len(xb)
            seen += len(xb)
            if time.time() - last_log > 5:
                last_log = time.time()
                log.info("epoch %d: batch %d/%d (%.0f%%), loss %.4f, %.0f ex/s", epoch + 1, i + 1, batches,
                         100.0 * (i + 1) / batches, loss_sum / seen, seen / (last_log - t0))
        seconds = time.time() - t0
        train_seconds += seconds
        examples += seen
        ev = evaluate_local(net, *test)
        detail.append({"epoch": epoch + 1, "accuracy": ev.accuracy(), "seconds": seconds,
                       "examples_per_second": seen / seconds, "loss": loss_sum / seen})
        log.info("epoch %d: test accuracy %.4f, loss %.4f, %.1fs, %.0f examples/s", epoch + 1, ev.accuracy(),
                 loss_sum / seen, seconds, seen / seconds)
    return detail, train_seconds, examples, ev, {"device": device}


def as_minibatch_rdd(sc, x, y, slices, rows_per_record=500):
    """A cached RDD of (x, y) chunks, materialised now (not inside timed epochs).

    Chunks mean far fewer Python objects than one record per example."""
    records = [(x[i:i + rows_per_record], y[i:i + rows_per_record]) for i in range(0, len(x), rows_per_record)]
    rdd = sc.parallelize(records, slices).cache()
    rdd.count()
    return rdd


def spark_session(master: str, app: str):
    """A SparkSession for the example and the benchmarks: sparkavg's
    recommended settings (see sparkavg.spark.recommended_conf)."""
    from pyspark.sql import SparkSession

    from sparkavg.spark import recommended_conf

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.master(master).appName(app).config("spark.driver.memory", "4g")
    for key, value in recommended_conf(master).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


def train_spark(args, net, train, test):
    from sparkavg.spark import AdaptiveThreshold, FixedThreshold, GradientSharing, ParameterAveraging, SparkTrainer

    spark = spark_session(args.master, f"sparkavg-lenet-{args.mode}")
    try:
        sc = spark.sparkContext
        train_rdd = as_minibatch_rdd(sc, *train, slices=args.workers)
        test_rdd = as_minibatch_rdd(sc, *test, slices=args.workers)
        if args.mode == "averaging":
            master = ParameterAveraging(batch_size_per_worker=args.batch_size, workers=args.workers,
                                        averaging_frequency=args.averaging_frequency, seed=args.seed,
                                        device=args.device)
        else:
            threshold = FixedThreshold(args.threshold) if args.fixed_threshold else AdaptiveThreshold(initial=args.threshold)
            master = GradientSharing(threshold=threshold, batch_size_per_worker=args.batch_size,
                                     workers=args.workers, simulate_loss=args.simulate_udp_loss, seed=args.seed,
                                     device=args.device)
        listeners = []
        if args.mlflow is not None:
            from sparkavg.listeners import MLflowListener

            listeners.append(MLflowListener(args.mlflow or None, run_name=f"lenet-{args.mode}"))
        if args.tensorboard:
            from sparkavg.listeners import TensorBoardListener

            listeners.append(TensorBoardListener(args.tensorboard))
        trainer = SparkTrainer(spark, net, master, checkpoint_dir=args.checkpoint_dir, listeners=listeners)
        trainer.fit(train_rdd, epochs=args.epochs, resume_from=args.resume_from, validation_data=test_rdd)
        trainer.close()
        ev = trainer.evaluate(test_rdd)
        detail = [{k: h[k] for k in ("epoch", "accuracy", "seconds", "examples_per_second", "loss") if k in h}
                  for h in trainer.history]
        train_seconds = sum(h["seconds"] for h in trainer.history[-args.epochs:])
        examples = sum(h["examples"] for h in trainer.history[-args.epochs:])
        if args.stats_html:
            trainer.stats.to_html(args.stats_html)
            log.info("training stats page: %s", args.stats_html)
        extra = {"stats_summary": trainer.stats.summary(),  # device: where the workers trained (the last decision)
                 "device": next((d["value"] for d in reversed(trainer.stats.decisions) if d["name"] == "device"),
                                None),
                 "listener_seconds": trainer.listener_seconds}
        if args.mode == "averaging":  # the frequency each epoch used (chosen per epoch with "auto")
            extra["averaging_frequency"] = [h["averaging_frequency"] for h in trainer.history]
        if args.mode == "sharing":
            c = trainer.stats.counters
            extra.update({
                "bytes_sent": int(c.get("bytes_sent", 0)),
                "payload_bytes_sent": int(c.get("payload_bytes_sent", 0)),
                "dense_bytes_equivalent": int(c.get("dense_bytes_equivalent", 0)),
                "compression_ratio": trainer.stats.compression_ratio,
                "replica_max_abs_diff": max(h["replica_max_abs_diff"] for h in trainer.history),
                "datagrams_retransmitted": int(c.get("datagrams_retransmitted", 0)),
                "datagrams_rejected": int(c.get("datagrams_rejected", 0)),
                "messages_sent": int(c.get("messages_sent", 0)),
                "simulated_loss": args.simulate_udp_loss,
                "threshold": args.threshold,
            })
        return detail, train_seconds, examples, ev, extra
    finally:
        spark.stop()


def main(argv=None) -> dict:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    data_dir = args.data_dir or default_data_dir()
    t_load = time.time()
    train = tuple(load_mnist(data_dir, "train", limit=args.limit_train))
    test = tuple(load_mnist(data_dir, "test", limit=args.limit_test))
    log.info("loaded %d training and %d test examples from %s in %.1fs", len(train[0]), len(test[0]), data_dir,
             time.time() - t_load)
    net = lenet(num_classes=10, seed=args.seed)
    if args.mode == "local":
        detail, train_seconds, examples, ev, extra = train_local(args, net, train, test)
    else:
        detail, train_seconds, examples, ev, extra = train_spark(args, net, train, test)
    report = {
        "mode": args.mode,
        "epochs": args.epochs,
        "workers": 1 if args.mode == "local" else args.workers,
        "batch_size": args.batch_size,
        "data_dir": str(data_dir),
        "train_examples": int(len(train[0])),
        "test_examples": int(len(test[0])),
        "test_accuracy": ev.accuracy(),
        "test_f1": ev.f1(),
        "train_seconds": train_seconds,
        "examples_per_second": examples / train_seconds if train_seconds > 0 else None,
        "epochs_detail": detail,
        **extra,
    }
    log.info("\n%s", ev.stats())
    log.info("test accuracy %.4f after %d epoch(s), %.1fs training, %.0f examples/s", report["test_accuracy"],
             args.epochs, train_seconds, report["examples_per_second"] or 0)
    if args.report:
        with open(args.report, "w") as fh:
            json.dump(report, fh, indent=2)
        log.info("report written to %s", args.report)
    return report


if __name__ == "__main__":
    main()
