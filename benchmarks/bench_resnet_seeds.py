#!/usr/bin/env python
"""The ResNet of ``examples/mnist_resnet.py`` on Fashion-MNIST, 2 epochs:
one process (``Graph.fit``, batch 64) or ``ParameterAveraging`` at its
defaults (2 workers x 32 on ``local[2]``, the master's ``seed`` deciding the
deal), through the README's own API -- a second sample of each side of the
"averaging within 0.5 points of one process" figure, whose single runs
differ by more than that (issue 19).  Prints one JSON line::

    PYTHONPATH=$PWD python benchmarks/bench_resnet_seeds.py --mode averaging --seed 7
    PYTHONPATH=$PWD python benchmarks/bench_resnet_seeds.py --mode local
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=["local", "averaging"], required=True)
    p.add_argument("--seed", type=int, default=123, help="the master's seed (averaging); the model's is 123")
    p.add_argument("--epochs", type=int, default=2)
    args = p.parse_args(argv)

    from mnist_resnet import build
    from sparkavg.data.mnist import default_data_dir, load_mnist

    x, y = load_mnist(default_data_dir(), "train")
    xt, yt = load_mnist(default_data_dir(), "test")
    net = build(num_classes=10, seed=123, input_shape=(1, 28, 28))
    accuracy = lambda: float(np.mean(np.argmax(net.output(xt), axis=1) == yt))  # noqa: E731
    out = {"mode": args.mode, "seed": args.seed, "accuracy": []}
    if args.mode == "local":
        for _ in range(args.epochs):
            net.fit(x, y, batch_size=64, epochs=1, shuffle=True)
            out["accuracy"].append(accuracy())
    else:
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        from mnist_example import as_minibatch_rdd
        from pyspark.sql import SparkSession

        from sparkavg.spark import ParameterAveraging, SparkTrainer, recommended_conf

        builder = SparkSession.builder.master("local[2]").config("spark.driver.memory", "4g")
        for key, value in recommended_conf("local[2]").items():
            builder = builder.config(key, value)
        spark = builder.getOrCreate()
        rdd = as_minibatch_rdd(spark.sparkContext, x, y, 2)
        with SparkTrainer(spark, net, ParameterAveraging(batch_size_per_worker=32, workers=2, seed=args.seed)) as tr:
            for _ in range(args.epochs):
                tr.fit(rdd, epochs=1)
                out["accuracy"].append(accuracy())
            out["averaging_frequency"] = [h.get("averaging_frequency") for h in tr.history]
        spark.stop()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
