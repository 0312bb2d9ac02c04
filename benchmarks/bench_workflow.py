#!/usr/bin/env python
"""Training the way people train: the workflow issue's figures, each against
a baseline in the same run.

Sections (``--sections``, all by default):

``schedules``
    DL4J's LeNet on Fashion-MNIST (``--limit-train`` examples, default all
    60k), ``--epochs`` (default 2): Adam at a constant 1e-3 against a cosine
    schedule with linear warm-up (peak 2e-3, 5% warm-up, floor 1e-5) and a
    one-cycle schedule (max 3e-3), over the fit's iterations; one 2-thread
    process at batch 64 and parameter averaging at the defaults on
    ``local[2]`` (2 workers x 32: the same examples per update and the same
    iteration count).  Test accuracy after every epoch.
``early_stopping``
    examples/mnist_lstm.py's LSTM under parameter averaging at the defaults:
    a fixed budget of ``--lstm-epochs`` epochs against
    ``EarlyStopping(monitor="val_accuracy", patience=--patience)`` on the same data,
    the validation rows the last 10% of the training set; epochs run,
    the best validation accuracy, and the test accuracy of the model each
    fit ends with (early stopping restores its best epoch).
``example``
    examples/tabular_classification.py at its defaults (one process,
    parameter averaging and gradient sharing): test AUC of each and the
    gap to one process; sparkavg's AUC against scikit-learn's.

    python benchmarks/bench_workflow.py --out benchmarks/results/workflow.json
    python benchmarks/bench_workflow.py --sections schedules --limit-train 6000 --epochs 1   # sanity run
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time

import numpy as np

from report import subset

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "examples"))

log = logging.getLogger("bench_workflow")
SECTIONS = ("schedules", "early_stopping", "example")


def _schedule(name: str, steps: int):
    from sparkavg.nn import CosineSchedule, OneCycleSchedule

    if name == "constant":
        return 1e-3
    if name == "cosine":
        return CosineSchedule(peak=2e-3, steps=steps, warmup=max(1, steps // 20), floor=1e-5)
    return OneCycleSchedule(max_lr=3e-3, total_steps=steps)


def _lenet(schedule, seed):
    from sparkavg.nn import Adam
    from sparkavg.nn.zoo import lenet

    net = lenet(num_classes=10, seed=seed)
    net.updater = Adam(lr=schedule)
    return net


def _accuracy(net, x, y) -> float:
    return float(np.mean(np.asarray(net.predict(x)) == y))


def schedules(args, spark, data) -> dict:
    from mnist_example import as_minibatch_rdd

    from sparkavg.spark import ParameterAveraging, SparkTrainer
    from sparkavg.threads import set_threads

    x, y, xt, yt = data
    steps = args.epochs * -(-len(x) // 64)
    out = {"iterations": steps, "examples": len(x), "epochs": args.epochs}
    rdd = as_minibatch_rdd(spark.sparkContext, x, y, 2)
    try:
        for name in ("constant", "cosine", "one_cycle"):
            cell = {}
            set_threads(2)
            net = _lenet(_schedule(name, steps), args.seed)
            t0, acc = time.perf_counter(), []
            for _ in range(args.epochs):
                net.fit(x, y, batch_size=64, epochs=1)
                acc.append(_accuracy(net, xt, yt))
            cell["local"] = {"accuracy": acc, "seconds": time.perf_counter() - t0, "iterations": net.iteration}
            net = _lenet(_schedule(name, steps), args.seed)
            trainer = SparkTrainer(spark, net, ParameterAveraging(batch_size_per_worker=32, workers=2,
                                                                  seed=args.seed))
            acc = []
            for _ in range(args.epochs):
                trainer.fit(rdd, epochs=1)
                acc.append(_accuracy(net, xt, yt))
            cell["averaging"] = {"accuracy": acc, "seconds": sum(h["seconds"] for h in trainer.history),
                                 "iterations": net.iteration,
                                 "learning_rate": [h.get("learning_rate") for h in trainer.history]}
            log.info("schedules %s: one process %s, averaging %s", name, cell["local"]["accuracy"],
                     cell["averaging"]["accuracy"])
            out[name] = cell
    finally:
        rdd.unpersist()
    return out


def early_stopping(args, spark, data) -> dict:
    from mnist_example import as_minibatch_rdd
    from mnist_lstm import build

    from sparkavg.fitting import EarlyStopping
    from sparkavg.spark import ParameterAveraging, SparkTrainer

    x, y, xt, yt = data
    cut = int(0.9 * len(x))
    train = as_minibatch_rdd(spark.sparkContext, x[:cut], y[:cut], 2)
    val = as_minibatch_rdd(spark.sparkContext, x[cut:], y[cut:], 2)
    out = {"examples": cut, "validation_examples": len(x) - cut, "budget_epochs": args.lstm_epochs,
           "patience": args.patience}
    try:
        for name, stopping in (("fixed", None), ("early", EarlyStopping(monitor="val_accuracy",
                                                                         patience=args.patience))):
            net = build(seed=args.seed)
            trainer = SparkTrainer(spark, net, ParameterAveraging(workers=2, seed=args.seed))
            history = trainer.fit(train, epochs=args.lstm_epochs, validation_data=val, early_stopping=stopping)
            val_acc = [h["val_accuracy"] for h in history.history]
            out[name] = {"epochs_run": len(val_acc), "val_accuracy": val_acc, "best_epoch": history.best_epoch,
                         "best_val_accuracy": max(val_acc), "test_accuracy": _accuracy(net, xt, yt),
                         "seconds": sum(h["seconds"] for h in history.history),
                         "stop_reason": history.stop_reason}
            log.info("early stopping %s: %s", name, out[name])
    finally:
        train.unpersist()
        val.unpersist()
    return out


def example(args) -> dict:
    import tabular_classification

    report = tabular_classification.main(["--session", "classic"])
    out = {"local_auc": report["local"]["auc"]}
    for kind in ("averaging", "sharing"):
        r = report[kind]
        out[kind] = {k: r.get(k) for k in ("auc", "pr_auc", "auc_spark", "auc_sklearn", "pr_auc_sklearn",
                                           "auc_minus_local_points", "best_epoch", "epochs_run", "cv_auc")}
    out["report"] = report
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sections", default=",".join(SECTIONS))
    p.add_argument("--data-dir", default=None)
    p.add_argument("--limit-train", type=int, default=None)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--lstm-epochs", type=int, default=20)
    p.add_argument("--patience", type=int, default=2)
    p.add_argument("--seed", type=int, default=123)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    sections = subset(p, args.sections, SECTIONS, "sections")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    result = {"benchmark": "workflow", "argv": sys.argv[1:] if argv is None else list(argv),
              "cpu_count": os.cpu_count(), "load_1min_before": os.getloadavg()[0]}

    def save():
        if args.out:
            with open(args.out, "w") as fh:
                fh.write(json.dumps(result, indent=2) + "\n")

    if "example" in sections:
        result["example"] = example(args)
        save()
    spark_sections = [s for s in sections if s != "example"]
    if spark_sections:
        from mnist_example import spark_session

        from sparkavg.data.mnist import default_data_dir, load_mnist

        data_dir = args.data_dir or default_data_dir()
        x, y = load_mnist(data_dir, "train")
        xt, yt = load_mnist(data_dir, "test")
        if args.limit_train:
            x, y = x[:args.limit_train], y[:args.limit_train]
        spark = spark_session("local[2]", "bench-workflow")
        try:
            for name in spark_sections:
                result[name] = globals()[name](args, spark, (x, y, xt, yt))
                save()
        finally:
            spark.stop()
    print(json.dumps({k: v for k, v in result.items() if k != "example"} | (
        {"example": {k: v for k, v in result["example"].items() if k != "report"}} if "example" in result else {}),
        indent=2))
    return result


if __name__ == "__main__":
    main()
