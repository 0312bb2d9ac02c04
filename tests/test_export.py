"""Exported models against the models themselves: every ONNX graph is run by
onnxruntime and gives ``model.output`` within 1e-5 (float32), for batches of
other sizes than any seen at export (the batch axis is dynamic).

- the native engine (``sparkavg.export.onnx``): LeNet, the examples' ResNet,
  row LSTM and GRU and tabular Graph, a GRU + Embedding + Conv1D network,
  recurrent layers with ``mask_value`` (padding in the middle and at the end
  of sequences), a Graph of three inputs and three outputs over every other
  layer and vertex type, trained a few steps so BatchNorm's running
  statistics are not their initial values; every type registered as a
  layer or vertex has an exporter;
- the fit's input encoding inside the graph (what the MLflow pyfunc takes),
  float64 models, a merge of sequences, and the refusals (a user's own
  layer without an exporter, no onnx);
- TorchModels (``tests.torch_models`` and ``sparkavg.torch.zoo``) through
  ``torch.onnx`` and TorchScript, and a module torch cannot export;
- ``MLflowListener`` logs ``model.onnx`` beside the pyfunc (a real SQLite
  store under tmp_path), or the pyfunc alone for a model ONNX cannot express.
"""
from __future__ import annotations

import importlib.util
import json
import logging
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from sparkavg.configurable import register, registered  # noqa: E402
from sparkavg.data.transforms import encode_inputs  # noqa: E402
from sparkavg.export import ExportError, to_onnx  # noqa: E402
from sparkavg.export.onnx import EXPORTERS  # noqa: E402
from sparkavg.nn import (GRU, LSTM, Activation, Add, AvgPool2D, BatchNorm, Conv1D, Conv2D, Dense, Dropout,  # noqa: E402
                         Embedding, Flatten, GlobalAvgPool, GlobalMaxPool, Graph, LayerNorm, MaxPool2D, Merge,
                         Multiply, Network, Output, Reshape, lenet)

from .test_listeners import mlflow_store  # noqa: E402,F401  (the fixture)

ROOT = Path(__file__).resolve().parents[1]
TOL = 1e-5


def _encode(model, x, encoding):
    """Features as the model takes them (a one-input model's bare array as a mapping of one)."""
    return encode_inputs(x if isinstance(x, dict) else {model.spec.inputs[0].name: x}, encoding)


def example(name: str):
    """``examples/<name>.py`` as a module (the examples put their own folder on sys.path)."""
    spec = importlib.util.spec_from_file_location(f"examples_{name}", ROOT / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_onnx(proto, feeds: dict) -> dict:
    """The graph's outputs by name, run by onnxruntime on the CPU."""
    data = proto if isinstance(proto, (str, bytes)) else proto.SerializeToString()
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))


def onnx_error(model, x, encoding=None) -> dict:
    """Max abs difference between onnxruntime's outputs and ``model.output``, by output name."""
    feeds = x if isinstance(x, dict) else {model.spec.inputs[0].name: x}
    got = run_onnx(to_onnx(model, encoding), feeds)
    want = model.output(_encode(model, x, encoding))
    want = want if isinstance(want, dict) else {model.spec.outputs[0].name: want}
    assert set(got) == set(want), (sorted(got), sorted(want))
    for name in got:
        assert got[name].shape == want[name].shape and got[name].dtype == np.float32, name
    return {name: float(np.abs(got[name] - want[name]).max()) for name in got}


def trained(model, x, y, steps=3):
    for _ in range(steps):
        model.fit_batch(x, y)
    return model


RNG = np.random.default_rng(0)


def images(n, shape=(1, 28, 28)):
    return RNG.random((n,) + shape, dtype=np.float32)


# ------------------------------------------------------------------ registry
@register("layer")
class UserDense(Dense):
    """A user's own layer: registered, so its models save and load, but ONNX export knows no exporter for it."""


def _user_graph():
    return Graph({"a": (3, 4)}, [("mine", UserDense(5), "a"), ("flat", Flatten(), "mine"),
                                 ("output", Output(2), "flat")], ["output"])


def test_every_registered_layer_and_vertex_type_has_an_exporter():
    types = sorted({name for kind in ("layer", "combine") for name, cls in registered(kind).items()
                    if cls.__module__.startswith("sparkavg.")})
    assert {"Dense", "LSTM", "Merge"} <= set(types)
    missing = [name for name in types if name not in EXPORTERS]
    assert missing == [], f"layer or vertex types without an ONNX exporter in sparkavg.export.onnx: {missing}"


# ------------------------------------------------------------ the engine's models
def _lenet():
    return trained(lenet(), images(8), RNG.integers(0, 10, 8), steps=2), images


def _resnet():
    return trained(example("mnist_resnet").build(), images(8), RNG.integers(0, 10, 8)), images


def _row_lstm():
    return trained(example("mnist_lstm").build(), images(8), RNG.integers(0, 10, 8), steps=2), images


def _row_gru():
    return trained(example("mnist_lstm").build(cell="gru"), images(8), RNG.integers(0, 10, 8), steps=2), images


def _tabular_inputs(n):
    module = example("tabular_embeddings")
    return module.model_inputs(module.make_table(n, seed=int(RNG.integers(1000))))


def _tabular():
    model = example("tabular_embeddings").build(seed=3)
    table = _tabular_inputs(32)
    return trained(model, table, RNG.integers(0, 2, 32)), _tabular_inputs


@pytest.mark.parametrize("build", [_lenet, _resnet, _row_lstm, _row_gru, _tabular],
                         ids=["lenet", "resnet", "lstm", "gru", "tabular"])
def test_the_examples_models_run_in_onnxruntime_as_they_do_here(build):
    model, inputs = build()
    for n in (5, 1):
        errors = onnx_error(model, inputs(n))
        assert max(errors.values()) <= TOL, errors


def test_a_gru_over_embeddings_and_a_conv1d_runs_as_here():
    net = Network((12,), [Embedding(20, 6, padding_id=0), Conv1D(5, 3, stride=2, padding=1, activation="relu"),
                          GRU(7, return_sequences=True), LSTM(4, return_sequences=True), GlobalMaxPool(),
                          Dense(6, activation="leaky_relu"), Output(3)], seed=4)
    ids = RNG.integers(0, 20, (16, 12)).astype(np.int64)
    trained(net, ids, RNG.integers(0, 3, 16))
    assert net.spec.inputs[0].dtype == "int64"
    errors = onnx_error(net, RNG.integers(0, 20, (9, 12)).astype(np.int64))
    assert errors["output"] <= TOL, errors


@pytest.mark.parametrize("cell", [LSTM, GRU])
def test_recurrent_layers_with_mask_value_skip_the_steps_the_engine_skips(cell):
    net = Network((7,), [Embedding(9, 4, padding_id=0), cell(5, return_sequences=True, mask_value=0.0),
                         cell(3, mask_value=0.0), Output(2)], seed=5)
    ids = RNG.integers(1, 9, (6, 7)).astype(np.int64)
    ids[0, 4:] = 0  # right-padded
    ids[1, 2:4] = 0  # padding inside the sequence: the state is carried through it
    ids[2, :3] = 0  # left-padded
    ids[3, :] = 0  # nothing but padding: the output of the zero state
    trained(net, ids, RNG.integers(0, 2, 6))
    errors = onnx_error(net, ids)
    assert errors["output"] <= TOL, errors
    masked = net.output(ids)
    net.layers[1].mask_value = None  # the same weights without the mask: another answer, so the mask counted
    assert np.abs(net.output(ids) - masked).max() > 1e-3


def three_input_graph(seed=6):
    """Every other layer and vertex type: images, features and ids in; a
    softmax, a sigmoid and a regression output."""
    return Graph(
        {"image": (2, 8, 8), "nums": (5,), "ids": (1,)},
        [("conv", Conv2D(4, 3, padding=1, activation="relu"), "image"),
         ("conv_bn", BatchNorm(), "conv"),
         ("conv2", Conv2D(4, 3, stride=1, padding=1, activation="tanh"), "image"),
         ("sum", Add(), ["conv_bn", "conv2", "conv"]),
         ("gate", Multiply(), ["sum", "conv2"]),
         ("channels", Merge(), ["gate", "image"]),
         ("pool", MaxPool2D(2), "channels"),
         ("ln", LayerNorm(), "pool"),
         ("avg", AvgPool2D(2, stride=1), "ln"),
         ("dense_img", Dense(8, activation="sigmoid"), "avg"),  # a (C, H, W) input: rows in (H, W, C) order
         ("gap", GlobalAvgPool(), "ln"),
         ("gmp", GlobalMaxPool(), "pool"),
         ("flat", Flatten(), "pool"),
         ("seq", Reshape((6, 16)), "flat"),
         ("seq_pool", GlobalAvgPool(), "seq"),
         ("num_bn", BatchNorm(momentum=0.5), "nums"),
         ("num_ln", LayerNorm(), "num_bn"),
         ("num_dense", Dense(8, activation="identity"), "num_ln"),
         ("num_act", Activation("leaky_relu"), "num_dense"),
         ("embed", Embedding(7, 3), "ids"),
         ("features", Merge(), ["dense_img", "gap", "gmp", "seq_pool", "num_act", "embed"]),
         ("drop", Dropout(0.3), "features"),
         ("hidden", Dense(12, activation="relu"), "drop"),
         ("probs", Activation("softmax"), "hidden"),
         ("classes", Output(3), "hidden"),
         ("flag", Output(1, loss="bce"), "probs"),
         ("value", Output(2, loss="huber", activation="tanh"), "drop")],
        ["classes", "flag", "value"], seed=seed)


def _three_inputs(n):
    return {"image": RNG.standard_normal((n, 2, 8, 8)).astype(np.float32),
            "nums": (3 + 2 * RNG.standard_normal((n, 5))).astype(np.float32),
            "ids": RNG.integers(0, 7, (n, 1)).astype(np.int64)}


def test_a_graph_of_three_inputs_and_outputs_runs_as_here_with_trained_running_statistics():
    graph = three_input_graph()
    x = _three_inputs(16)
    y = {"classes": RNG.integers(0, 3, 16), "flag": RNG.integers(0, 2, 16).astype(np.float32),
         "value": RNG.standard_normal((16, 2)).astype(np.float32)}
    trained(graph, x, y, steps=4)
    stats = [s for s in graph.buffer_segments if s.name == "mean"]
    assert len(stats) == 2 and all(np.abs(graph.buffers[s.start:s.stop]).max() > 0.1 for s in stats)
    errors = onnx_error(graph, _three_inputs(7))
    assert set(errors) == {"classes", "flag", "value"} and max(errors.values()) <= TOL, errors


def test_a_tabular_dense_model_with_a_binary_output_runs_as_here():
    net = Network((10,), [BatchNorm(), Dense(16), Dropout(0.2), Dense(8, activation="tanh"),
                          Output(1, loss="bce")], seed=7)
    x = RNG.standard_normal((32, 10)).astype(np.float32) * 3 + 1
    trained(net, x, RNG.integers(0, 2, 32).astype(np.float32), steps=5)
    errors = onnx_error(net, RNG.standard_normal((11, 10)).astype(np.float32) * 3 + 1)
    assert errors["output"] <= TOL, errors


def test_the_graph_takes_what_the_pyfunc_takes_with_the_fits_input_encoding(tmp_path):
    net = trained(lenet(), images(4), RNG.integers(0, 10, 4), steps=1)
    encoding = {"scale": 1 / 255, "normalize": [0.5, 0.25]}
    pixels = np.round(images(6) * 255).astype(np.float32)  # raw 0..255 values, converted to float32
    path = tmp_path / "deep" / "lenet.onnx"
    net.export_onnx(path, encoding=encoding)
    proto = onnx.load(str(path))
    got = run_onnx(str(path), {"input": pixels})["output"]
    np.testing.assert_allclose(got, net.output(_encode(net, pixels, encoding)), atol=TOL, rtol=0)
    assert np.abs(got - net.output(pixels)).max() > 1e-3  # the encoding is in the graph
    props = {p.key: p.value for p in proto.metadata_props}
    assert json.loads(props["sparkavg.input_encoding"]) == encoding
    assert [d.dim_param for d in proto.graph.input[0].type.tensor_type.shape.dim][:1] == ["batch"]


def test_a_float64_model_exports_as_float32():
    net = Network((6,), [Dense(5, activation="tanh"), Output(3)], dtype="float64", seed=8)
    x = RNG.standard_normal((4, 6))
    got = run_onnx(to_onnx(net), {"input": x.astype(np.float32)})["output"]
    np.testing.assert_allclose(got, net.output(x), atol=TOL, rtol=0)


def test_bad_encoding_is_refused_naming_it():
    with pytest.raises(ValueError, match="normalize"):
        to_onnx(lenet(), {"scale": None, "normalize": [0.5, -1.0]})


def test_a_merge_of_sequences_joins_their_features_and_runs_as_here():
    graph = Graph({"a": (3, 4), "b": (3, 2)}, [("seqs", Merge(), ["a", "b"]), ("lstm", LSTM(5), "seqs"),
                                               ("output", Output(2), "lstm")], ["output"], seed=4)
    assert {name: op for name, op, _ in graph._wiring()[1]}["seqs"].output_shape == (3, 6)
    x = {"a": RNG.standard_normal((8, 3, 4)).astype(np.float32), "b": RNG.standard_normal((8, 3, 2)).astype(np.float32)}
    trained(graph, x, RNG.integers(0, 2, 8), steps=2)
    errors = onnx_error(graph, {k: v[:5] for k, v in x.items()})
    assert errors["output"] <= TOL, errors


def test_a_merge_of_sequences_of_different_lengths_is_refused_naming_the_shapes():
    with pytest.raises(ValueError, match=r"steps T of \(T, F\) sequences agree, got \[\(3, 4\), \(2, 4\)\]"):
        Graph({"a": (3, 4), "b": (2, 4)}, [("seqs", Merge(), ["a", "b"]), ("flat", Flatten(), "seqs"),
                                           ("output", Output(2), "flat")], ["output"])


def test_a_users_own_layer_is_refused_naming_the_vertex(tmp_path):
    with pytest.raises(ExportError, match="Vertex 'mine'") as info:
        _user_graph().export_onnx(tmp_path / "g.onnx")
    assert "UserDense" in str(info.value) and not (tmp_path / "g.onnx").exists()


def test_without_onnx_the_export_says_what_to_install():
    code = textwrap.dedent("""
        import json, sys
        sys.modules["onnx"] = None
        from sparkavg.nn import lenet
        try:
            lenet().export_onnx("never.onnx")
        except ImportError as exc:
            print(json.dumps({"error": str(exc)}))
    """)
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "sparkavg[onnx]" in json.loads(done.stdout.strip().splitlines()[-1])["error"]


# --------------------------------------------------------------- TorchModels
TORCH_CASES = {
    "mlp": ("tests.torch_models:mlp", {}, (16,), "cross_entropy"),
    "conv_bn": ("tests.torch_models:conv_bn", {}, (1, 4, 4), "cross_entropy"),
    "lstm": ("tests.torch_models:lstm", {}, (5, 4), "cross_entropy"),
    "regressor": ("tests.torch_models:regressor", {}, (3,), "mse"),
    "binary": ("tests.torch_models:mlp", {"outputs": 1}, (16,), "bce"),
    "zoo_lenet": ("sparkavg.torch.zoo:lenet", {}, (1, 28, 28), "cross_entropy"),
    "zoo_resnet": ("sparkavg.torch.zoo:resnet", {"width": 4}, (1, 28, 28), "cross_entropy"),
    "zoo_lstm": ("sparkavg.torch.zoo:lstm", {"units": 16}, (28, 28), "cross_entropy"),
}


def _torch_model(case):
    from sparkavg.torch import TorchModel

    factory, kwargs, shape, loss = TORCH_CASES[case]
    model = TorchModel(factory, loss, input_shape=shape, factory_kwargs=kwargs)
    x = RNG.random((6,) + shape, dtype=np.float32)
    if loss == "cross_entropy":
        y = RNG.integers(0, model.units, 6)
    elif loss == "bce":
        y = RNG.integers(0, 2, (6, 1)).astype(np.float32)
    else:
        y = RNG.random((6, model.units)).astype(np.float32)
    return trained(model, x, y, steps=2), x, y


@pytest.mark.parametrize("case", sorted(TORCH_CASES))
def test_torch_models_export_to_onnx_and_torchscript_as_their_output(case, tmp_path):
    torch = pytest.importorskip("torch")
    model, x, y = _torch_model(case)
    twin = model.clone()
    model.export_onnx(tmp_path / "m.onnx")
    model.export_torchscript(tmp_path / "m.pt")
    for n in (9, 1):
        x2 = RNG.random((n,) + model.input_shape, dtype=np.float32)
        want = model.output(x2)
        got = run_onnx(str(tmp_path / "m.onnx"), {"input": x2})["output"]
        np.testing.assert_allclose(got, want, atol=TOL, rtol=0)
        scripted = torch.jit.load(str(tmp_path / "m.pt"))(torch.from_numpy(x2)).detach().numpy()
        np.testing.assert_allclose(scripted, want, atol=TOL, rtol=0)
    # Exporting leaves training as it was: the next step is the twin's, bit for bit.
    model.fit_batch(x, y)
    twin.fit_batch(x, y)
    np.testing.assert_array_equal(model.params, twin.params)
    np.testing.assert_array_equal(model.buffers, twin.buffers)


def test_a_torch_models_files_take_the_fits_input_encoding(tmp_path):
    torch = pytest.importorskip("torch")
    model, _, _ = _torch_model("zoo_lenet")
    encoding = {"scale": 1 / 255, "normalize": None}
    pixels = np.round(images(5) * 255).astype(np.float32)
    model.export_onnx(tmp_path / "m.onnx", encoding=encoding)
    model.export_torchscript(tmp_path / "m.pt", encoding=encoding)
    want = model.output(_encode(model, pixels, encoding))
    np.testing.assert_allclose(run_onnx(str(tmp_path / "m.onnx"), {"input": pixels})["output"], want,
                               atol=TOL, rtol=0)
    np.testing.assert_allclose(torch.jit.load(str(tmp_path / "m.pt"))(torch.from_numpy(pixels)).detach().numpy(), want,
                               atol=TOL, rtol=0)


def _svd_head():
    from torch import nn

    class SingularValues(nn.Module):
        def __init__(self):
            super().__init__()
            self.dense = nn.Linear(4, 2)

        def forward(self, x):
            import torch

            return self.dense(x * torch.linalg.svdvals(x[:, :, None] * x[:, None, :])[:, :1])

    return SingularValues()


def test_a_module_torch_cannot_export_is_refused_naming_it(tmp_path):
    pytest.importorskip("torch")
    from sparkavg.torch import TorchModel

    model = TorchModel(_svd_head, input_shape=(4,))
    with pytest.raises(ExportError, match="svdvals") as info:
        model.export_onnx(tmp_path / "m.onnx")
    assert "_svd_head" in str(info.value)  # the factory


# ------------------------------------------------------------------ MLflow

def _fit_end(mlflow, model, data):
    """A listener driven with the payloads of a fit of ``model`` (no Spark)."""
    from sparkavg.listeners import MLflowListener
    from sparkavg.spark import ParameterAveraging, TrainingStats

    master = ParameterAveraging(workers=2, data=data)
    trainer = SimpleNamespace(stats=TrainingStats(), network=model, features_col="features", master=master)
    start = {"run_id": "abc", "epochs": 1, "epochs_done": 0, "resumed": False, "workers": 2,
             "master": master.to_config(), "network": model.to_config(), "num_params": model.num_params,
             "examples": 10, "minibatches": 2}
    listener = MLflowListener(log_stats=False)
    listener.on_fit_start(trainer, start)
    listener.on_fit_end(trainer, {})
    return listener, mlflow.tracking.MlflowClient()


def test_the_mlflow_listener_logs_model_onnx_beside_the_pyfunc(mlflow_store, tmp_path):
    import pandas as pd

    from sparkavg.spark import DataOptions

    mlflow = mlflow_store
    net = trained(lenet(), images(4), RNG.integers(0, 10, 4), steps=1)
    listener, client = _fit_end(mlflow, net, DataOptions(scale=1 / 255, normalize=(0.5, 0.25)))
    assert "model.onnx" in {a.path for a in client.list_artifacts(listener.run_id)}
    path = client.download_artifacts(listener.run_id, "model.onnx", str(tmp_path))
    pixels = np.round(images(6) * 255).astype(np.float32)
    pyfunc = mlflow.pyfunc.load_model(listener.model_uri).predict(pd.DataFrame({"features": list(pixels.reshape(6, -1))}))
    got = run_onnx(path, {"input": pixels})["output"]
    np.testing.assert_allclose(got, np.stack(pyfunc["probability"]), atol=TOL, rtol=0)


def test_the_mlflow_listener_logs_the_pyfunc_alone_for_a_model_onnx_cannot_express(mlflow_store, caplog):
    from sparkavg.spark import DataOptions

    with caplog.at_level(logging.WARNING, logger="sparkavg.listeners.mlflow_listener"):
        listener, client = _fit_end(mlflow_store, _user_graph(), DataOptions())
    assert listener.model_uri is not None  # the pyfunc
    assert "model.onnx" not in {a.path for a in client.list_artifacts(listener.run_id)}
    assert any("'mine'" in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
