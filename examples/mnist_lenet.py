#!/usr/bin/env python
"""DL4J's LeNet example on any MNIST-format folder (Fashion-MNIST by default).

    python examples/mnist_lenet.py --mode local --epochs 1
    python examples/mnist_lenet.py --mode averaging --master local[2] --workers 2
    python examples/mnist_lenet.py --mode sharing --threshold 1e-3 --report out.json
    python examples/mnist_lenet.py --mode local --device gpu
    python examples/mnist_lenet.py --mode averaging --session connect --api pipeline

``--mode local`` trains in this process, no Spark; ``averaging`` and
``sharing`` train on Spark with ParameterAveraging or GradientSharing.
After every epoch the test set is evaluated; ``--report`` writes JSON
(``train_seconds`` counts training only, not data loading or evaluation).
The flags and the runner are shared with ``mnist_resnet.py``
(``mnist_example.py``).
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from mnist_example import as_minibatch_rdd, evaluate_local, main, spark_session, write_parquet  # noqa: E402

from sparkavg.nn.zoo import lenet  # noqa: E402

__all__ = ["as_minibatch_rdd", "evaluate_local", "spark_session", "write_parquet", "build"]


def build(num_classes: int = 10, seed: int = 123, input_shape=(1, 28, 28)):
    """DL4J's LeNet (its input is 1x28x28)."""
    if tuple(input_shape) != (1, 28, 28):
        raise SystemExit(f"LeNet takes 1x28x28 images, got {tuple(input_shape)} from the data")
    return lenet(num_classes=num_classes, seed=seed)


if __name__ == "__main__":
    main(build, description=__doc__, name="lenet")
