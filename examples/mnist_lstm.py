#!/usr/bin/env python
"""An LSTM reading each image row by row -- 28 time steps of 28 pixels --
on any MNIST-format folder (Fashion-MNIST by default): LSTM(128), its last
output to a softmax layer.

    python examples/mnist_lstm.py --mode local --epochs 2
    python examples/mnist_lstm.py --mode averaging --master local[2] --workers 2 --epochs 2
    python examples/mnist_lstm.py --mode sharing --report out.json
    python examples/mnist_lstm.py --mode averaging --session connect --api pipeline
    python examples/mnist_lstm.py --cell gru --mode local --epochs 2    # GRU(128) in place of the LSTM

Copy it for your own sequences: a model's input of shape (T, F) is a
sequence of T steps of F features (here the images arrive as (1, 28, 28)
and a Reshape makes them (28, 28)); LSTM, GRU, Conv1D and the global
poolings take it, and ``LSTM(..., mask_value=0.0)`` skips padding steps
of variable-length sequences.  The flags, local and Spark training, the
Pipeline and the report are ``mnist_example.py``, shared with
``mnist_lenet.py`` and ``mnist_resnet.py``.
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from mnist_example import main  # noqa: E402

from sparkavg.nn import GRU, LSTM, Network, Output, Reshape  # noqa: E402
from sparkavg.nn.updaters import Adam  # noqa: E402


def build(num_classes: int = 10, seed: int = 123, input_shape=(1, 28, 28), units: int = 128,
          cell: str = "lstm") -> Network:
    """The network: 81,674 parameters for 28x28 images at 128 units (``cell="gru"``: a GRU, 61,706)."""
    if len(input_shape) != 3 or input_shape[0] != 1:
        raise SystemExit(f"the row LSTM takes one-channel (1, H, W) images, got {tuple(input_shape)}")
    _, rows, cols = input_shape
    layers = [
        Reshape((rows, cols)),  # (1, H, W) -> H steps of W pixels
        GRU(units) if cell == "gru" else LSTM(units),
        Output(num_classes),
    ]
    return Network(tuple(input_shape), layers, updater=Adam(lr=1e-3), seed=seed)


if __name__ == "__main__":
    import argparse
    import functools

    cells = argparse.ArgumentParser(add_help=False)
    cells.add_argument("--cell", choices=["lstm", "gru"], default="lstm")
    known, rest = cells.parse_known_args()
    main(functools.partial(build, cell=known.cell), argv=rest, description=__doc__, name=known.cell)
