#!/usr/bin/env python
"""What the listener machinery costs a LeNet epoch, with MLflow and TensorBoard both on.

DL4J's LeNet on Fashion-MNIST, ``ParameterAveraging`` at its defaults on
local[2] (the example's setup), one epoch per fit; fits with no listener and
fits with ``MLflowListener`` (a file tracking store in a temporary folder)
plus ``TensorBoardListener`` (with parameter histograms) alternate in one
process.  Reported: each fit's epoch seconds, and -- the robust number --
the seconds the listeners took on the driver per event
(``trainer.listener_seconds``), inside the epoch (``round_end``,
``sharing_progress``, ``checkpoint``, ``epoch_end``) and once per fit
(``fit_start``; ``fit_end``: the stats files and the model logged).

    python benchmarks/bench_listeners.py --out benchmarks/results/listeners.json
"""
from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile

from report import emit

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))

from mnist_lenet import as_minibatch_rdd, spark_session  # noqa: E402

from sparkavg.data.mnist import default_data_dir, load_mnist  # noqa: E402
from sparkavg.nn.zoo import lenet  # noqa: E402

IN_EPOCH = ("round_end", "sharing_progress", "checkpoint", "epoch_end")


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pairs", type=int, default=2, help="(off, on) fit pairs, one epoch each")
    p.add_argument("--limit-train", type=int, default=None)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")

    from sparkavg.listeners import MLflowListener, TensorBoardListener
    from sparkavg.spark import ParameterAveraging, SparkTrainer

    train = load_mnist(default_data_dir(), "train", limit=args.limit_train)
    spark = spark_session("local[2]", "sparkavg-bench-listeners")
    fits = []
    with tempfile.TemporaryDirectory(prefix="sparkavg-bench-listeners-") as folder:
        try:
            rdd = as_minibatch_rdd(spark.sparkContext, *train, slices=2)
            for i in range(args.pairs):
                for on in (False, True):
                    listeners = [MLflowListener(f"file://{folder}/mlruns", run_name=f"fit-{i}"),
                                 TensorBoardListener(os.path.join(folder, "tb", f"fit-{i}"))] if on else []
                    trainer = SparkTrainer(spark, lenet(num_classes=10, seed=123),
                                           ParameterAveraging(batch_size_per_worker=32, workers=2, seed=123),
                                           listeners=listeners, progress=False)
                    trainer.fit(rdd, epochs=1)
                    trainer.close()
                    seconds = trainer.listener_seconds
                    epoch = trainer.history[0]["seconds"]
                    in_epoch = sum(seconds[k] for k in IN_EPOCH)
                    fits.append({"listeners": on, "epoch_seconds": epoch, "rounds": trainer.history[0]["rounds"],
                                 "listener_seconds_in_epoch": in_epoch,
                                 "listener_share_of_epoch": in_epoch / epoch,
                                 "listener_seconds_per_fit": seconds["fit_start"] + seconds["fit_end"],
                                 "listener_seconds": seconds})
                    print(fits[-1], file=sys.stderr)
        finally:
            spark.stop()
    on = [f for f in fits if f["listeners"]]
    off = [f for f in fits if not f["listeners"]]
    result = {
        "fits": fits,
        "median_epoch_seconds_off": statistics.median(f["epoch_seconds"] for f in off),
        "median_epoch_seconds_on": statistics.median(f["epoch_seconds"] for f in on),
        "max_listener_share_of_epoch": max(f["listener_share_of_epoch"] for f in on),
        "median_listener_seconds_per_fit": statistics.median(f["listener_seconds_per_fit"] for f in on),
    }
    return emit(result, args.out)


if __name__ == "__main__":
    main()
