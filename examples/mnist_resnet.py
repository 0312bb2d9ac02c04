#!/usr/bin/env python
"""A small ResNet (two residual blocks with BatchNorm, a sparkavg.nn.Graph)
on any MNIST-format folder (Fashion-MNIST by default).

    python examples/mnist_resnet.py --mode local --epochs 2
    python examples/mnist_resnet.py --mode averaging --master local[2] --workers 2 --epochs 2
    python examples/mnist_resnet.py --mode sharing --report out.json
    python examples/mnist_resnet.py --mode averaging --session connect
    python examples/mnist_resnet.py --mode averaging --api pipeline
    python examples/mnist_resnet.py --mode averaging --checkpoint-dir ckpt --epochs 1
    python examples/mnist_resnet.py --mode averaging --resume-from ckpt --epochs 2

Copy it for your own graph: build any :class:`sparkavg.nn.Graph` (named
inputs, vertices that name their inputs, Merge/Add/Multiply, BatchNorm)
in :func:`build`; the rest -- flags, local and Spark training, Connect,
the Pipeline, checkpoints, the report -- is ``mnist_example.py``, shared
with ``mnist_lenet.py``.
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from mnist_example import main  # noqa: E402

from sparkavg.nn import Activation, Add, BatchNorm, Conv2D, Graph, MaxPool2D, Output  # noqa: E402
from sparkavg.nn.updaters import Adam  # noqa: E402


def residual_block(name: str, source: str, filters: int) -> list:
    """conv 3x3 -> BatchNorm -> relu -> conv 3x3 -> BatchNorm, plus the skip
    connection from ``source``, then relu."""
    return [
        (f"{name}_conv1", Conv2D(filters, 3, padding=1, weight_init="he"), source),
        (f"{name}_bn1", BatchNorm(), f"{name}_conv1"),
        (f"{name}_relu1", Activation("relu"), f"{name}_bn1"),
        (f"{name}_conv2", Conv2D(filters, 3, padding=1, weight_init="he"), f"{name}_relu1"),
        (f"{name}_bn2", BatchNorm(), f"{name}_conv2"),
        (f"{name}_add", Add(), [f"{name}_bn2", source]),
        (name, Activation("relu"), f"{name}_add"),
    ]


def build(num_classes: int = 10, seed: int = 123, input_shape=(1, 28, 28), width: int = 16) -> Graph:
    """The graph: 43,914 parameters and 288 buffer values (BatchNorm statistics) at width 16."""
    if len(input_shape) != 3 or input_shape[1] % 4 or input_shape[2] % 4:
        raise SystemExit(f"the ResNet takes (C, H, W) images with H and W divisible by 4, got {tuple(input_shape)}")
    vertices = [
        ("stem_conv", Conv2D(width, 3, padding=1, weight_init="he"), "image"),
        ("stem_bn", BatchNorm(), "stem_conv"),
        ("stem", Activation("relu"), "stem_bn"),
        *residual_block("block1", "stem", width),
        ("pool1", MaxPool2D(2), "block1"),
        ("wide_conv", Conv2D(2 * width, 3, padding=1, weight_init="he"), "pool1"),
        ("wide_bn", BatchNorm(), "wide_conv"),
        ("wide", Activation("relu"), "wide_bn"),
        *residual_block("block2", "wide", 2 * width),
        ("pool2", MaxPool2D(2), "block2"),
        ("output", Output(num_classes), "pool2"),
    ]
    return Graph({"image": tuple(input_shape)}, vertices, ["output"], updater=Adam(lr=1e-3), seed=seed)


if __name__ == "__main__":
    main(build, description=__doc__, name="resnet")
