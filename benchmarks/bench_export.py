#!/usr/bin/env python
"""ONNX export: how far onnxruntime's outputs are from ``model.output``, and
what an export costs.

Each model is trained a few steps from its seed on random inputs (so
BatchNorm's running statistics and the weights are not their initial
values), exported with ``model.export_onnx`` (a TorchModel also with
``export_torchscript``), and run by onnxruntime (CPU provider, its default
threads) on ``--examples`` random inputs against the model's own
``output`` on the same inputs.  Reported per model: the max abs
difference of the outputs (probabilities for the classifiers), the median
export seconds of ``--repeats`` exports (graph built, checked and written),
the file's bytes, and the seconds both take for the examples (informative:
the machine is shared).

Models: the native engine's LeNet (``sparkavg.nn.zoo``), the examples'
ResNet, row LSTM and row GRU (``examples/mnist_resnet.py``,
``examples/mnist_lstm.py``), the tabular Graph (``examples/tabular_embeddings.py``),
an Embedding + Conv1D + GRU network and an Embedding + LSTM network with
``mask_value`` (unrolled in the graph); the torch zoo's LeNet, ResNet and
row LSTM as TorchModels.

    python benchmarks/bench_export.py --out benchmarks/results/export.json
"""
from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import statistics
import sys
import tempfile
import time

import numpy as np

from report import emit

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def _example(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "examples", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _images(rng, n, shape=(1, 28, 28)):
    return rng.random((n,) + shape, dtype=np.float32)


def models(rng):
    """``name -> (build, inputs(n), labels(n))``: each built and trained lazily."""
    from sparkavg.nn import GRU, LSTM, Conv1D, Embedding, GlobalMaxPool, Network, Output, lenet

    tabular = _example("tabular_embeddings")

    def table(n):
        return tabular.model_inputs(tabular.make_table(n, seed=int(rng.integers(1 << 30))))

    def ids(n, t=16, vocab=50):
        x = rng.integers(1, vocab, (n, t)).astype(np.int64)
        lengths = rng.integers(4, t + 1, n)
        x[np.arange(t)[None, :] >= lengths[:, None]] = 0  # right-padded
        return x

    def classes(k):
        return lambda n: rng.integers(0, k, n)

    def torch_model(factory, kwargs, shape):
        from sparkavg.torch import TorchModel

        return lambda: TorchModel(factory, input_shape=shape, factory_kwargs=kwargs)

    return {
        "lenet": (lenet, lambda n: _images(rng, n), classes(10)),
        "resnet": (_example("mnist_resnet").build, lambda n: _images(rng, n), classes(10)),
        "lstm": (_example("mnist_lstm").build, lambda n: _images(rng, n), classes(10)),
        "gru": (lambda: _example("mnist_lstm").build(cell="gru"), lambda n: _images(rng, n), classes(10)),
        "tabular": (lambda: tabular.build(seed=123), table, classes(2)),
        "embedding_conv1d_gru": (
            lambda: Network((16,), [Embedding(50, 16, padding_id=0), Conv1D(32, 3, padding=1, activation="relu"),
                                    GRU(32, return_sequences=True), GlobalMaxPool(), Output(4)]),
            ids, classes(4)),
        "embedding_masked_lstm": (
            lambda: Network((16,), [Embedding(50, 16, padding_id=0), LSTM(32, mask_value=0.0), Output(4)]),
            ids, classes(4)),
        "torch_lenet": (torch_model("sparkavg.torch.zoo:lenet", {}, (1, 28, 28)), lambda n: _images(rng, n),
                        classes(10)),
        "torch_resnet": (torch_model("sparkavg.torch.zoo:resnet", {}, (1, 28, 28)), lambda n: _images(rng, n),
                         classes(10)),
        "torch_lstm": (torch_model("sparkavg.torch.zoo:lstm", {}, (28, 28)), lambda n: _images(rng, n, (28, 28)),
                       classes(10)),
    }


def measure(name, build, inputs, labels, args, folder) -> dict:
    import onnxruntime as ort

    model = build()
    for _ in range(args.steps):
        model.fit_batch(inputs(args.batch), labels(args.batch))
    path = os.path.join(folder, f"{name}.onnx")
    seconds = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        model.export_onnx(path)
        seconds.append(time.perf_counter() - start)
    x = inputs(args.examples)
    feeds = x if isinstance(x, dict) else {model.spec.inputs[0].name: x}
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    start = time.perf_counter()
    got = session.run(None, feeds)[0]
    onnx_seconds = time.perf_counter() - start
    start = time.perf_counter()
    want = model.output(x)
    model_seconds = time.perf_counter() - start
    row = {"params": int(model.num_params), "max_abs_difference": float(np.abs(got - want).max()),
           "export_seconds": statistics.median(seconds), "file_bytes": os.path.getsize(path),
           "onnxruntime_seconds": onnx_seconds, "model_output_seconds": model_seconds}
    if name.startswith("torch_"):
        import torch

        script = os.path.join(folder, f"{name}.pt")
        start = time.perf_counter()
        model.export_torchscript(script)
        row["torchscript_export_seconds"] = time.perf_counter() - start
        with torch.no_grad():
            scripted = torch.jit.load(script)(torch.from_numpy(x)).numpy()
        row["torchscript_max_abs_difference"] = float(np.abs(scripted - want).max())
    print(name, row, file=sys.stderr)
    return row


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--examples", type=int, default=1000, help="inputs compared per model")
    p.add_argument("--steps", type=int, default=3, help="training steps before the export")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3, help="exports timed per model (median)")
    p.add_argument("--models", default=None, help="comma-separated subset")
    p.add_argument("--seed", type=int, default=123)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    import onnxruntime

    rng = np.random.default_rng(args.seed)
    table = models(rng)
    names = args.models.split(",") if args.models else list(table)
    result = {"examples": args.examples, "steps": args.steps, "batch": args.batch, "repeats": args.repeats,
              "onnxruntime": onnxruntime.__version__, "models": {}}
    with tempfile.TemporaryDirectory(prefix="sparkavg-bench-export-") as folder:
        for name in names:
            result["models"][name] = measure(name, *table[name], args, folder)
    result["max_abs_difference"] = max(r["max_abs_difference"] for r in result["models"].values())
    return emit(result, args.out)


if __name__ == "__main__":
    main()
