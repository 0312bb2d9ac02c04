#!/usr/bin/env python
"""Float64 gradient checks as figures: every layer, inside a model, and a
Graph with fan-out and merges, against central differences.

For each case: the largest |back-propagated - central difference| over
(a sample of) all parameters, relative to the largest back-propagated
entry (``tests/test_nn_graph.py``'s ``relative_error``, which the tests
hold below 1e-6).  Prints a table and JSON::

    python benchmarks/bench_gradients.py --out benchmarks/results/gradients.json
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np
from report import emit

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def cases():
    """name -> (model, x, y), float64."""
    from sparkavg.nn import (SGD, Activation, Add, AvgPool2D, BatchNorm, Conv2D, Dense, Flatten,
                             GlobalAvgPool, GlobalMaxPool, Graph, LayerNorm, MaxPool2D, Network, Output, Reshape)
    from tests.test_nn_graph import fan_out_data, fan_out_graph

    rng = np.random.default_rng(0)
    img, vec = (2, 6, 6), (8,)

    def net(shape, hidden, out=None):
        model = Network(shape, [*hidden, out or Output(3)], updater=SGD(0.1), dtype="float64", seed=7)
        model.params = model.params + 0.1 * rng.standard_normal(model.num_params)  # BN gamma away from 1
        units = model.spec.single_output().units
        y = rng.integers(0, units, 5) if out is None else rng.standard_normal((5, units))
        return model, rng.standard_normal((5, *shape)), y

    found = {
        "Conv2D": net(img, [Conv2D(3, 3, padding=1, activation="tanh")]),
        "MaxPool2D": net(img, [Conv2D(2, 1, activation="tanh"), MaxPool2D(2)]),
        "AvgPool2D": net(img, [Conv2D(2, 1, activation="tanh"), AvgPool2D(2)]),
        "Dense": net(vec, [Dense(6, activation="sigmoid")]),
        "Activation": net(vec, [Dense(6, activation="identity"), Activation("tanh")]),
        "BatchNorm (dense)": net(vec, [Dense(6, activation="tanh"), BatchNorm()]),
        "BatchNorm (conv)": net(img, [Conv2D(3, 3, padding=1), BatchNorm()]),
        "LayerNorm (dense)": net(vec, [Dense(6, activation="tanh"), LayerNorm()]),
        "LayerNorm (conv)": net(img, [Conv2D(3, 3, padding=1), LayerNorm()]),
        "GlobalAvgPool": net(img, [Conv2D(3, 3, padding=1, activation="tanh"), GlobalAvgPool()]),
        "GlobalMaxPool": net(img, [Conv2D(3, 3, padding=1, activation="tanh"), GlobalMaxPool()]),
        "Flatten": net(img, [Conv2D(2, 3, padding=1, activation="tanh"), Flatten(), Dense(4, activation="tanh")]),
        "Reshape": net((72,), [Reshape((2, 6, 6)), Conv2D(2, 3, padding=1, activation="tanh")]),
        "Output (mse)": net(vec, [Dense(6, activation="tanh")], Output(2, loss="mse")),
    }
    x, y = fan_out_data()
    found["Graph: fan-out, Add, Merge, Multiply, two outputs"] = (fan_out_graph(l2=1e-3), x, y)
    block = Graph({"image": img},
                  [("c1", Conv2D(3, 3, padding=1), "image"), ("bn1", BatchNorm(), "c1"),
                   ("r1", Activation("relu"), "bn1"), ("c2", Conv2D(3, 3, padding=1), "r1"),
                   ("bn2", BatchNorm(), "c2"), ("res", Add(), ["bn2", "c1"]), ("out", Output(3), "res")],
                  ["out"], updater=SGD(0.1), dtype="float64")
    found["Graph: residual block with BatchNorm"] = (block, rng.standard_normal((5, *img)), rng.integers(0, 3, 5))
    return found


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    from tests.test_nn_graph import relative_error

    rows = []
    for name, (model, x, y) in cases().items():
        err = relative_error(model, x, y)
        rows.append({"case": name, "num_params": int(model.num_params), "relative_error": err,
                     "below_1e-6": err < 1e-6})
        print(f"{name:<55} {model.num_params:>6} params  relative error {err:.2e}", file=sys.stderr)
    return emit({"benchmark": "float64 gradient checks", "bound": 1e-6, "rows": rows,
                 "all_below_bound": all(r["below_1e-6"] for r in rows)}, args.out)


if __name__ == "__main__":
    main()
