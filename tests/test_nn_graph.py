"""Graph: float64 gradient checks under fan-out and merges, the Network
equivalence of a chain, configuration round trips, data by name, and the
errors a wrong wiring gets."""
from __future__ import annotations

import numpy as np
import pytest

from sparkavg.configurable import ConfigError
from sparkavg.nn import (SGD, Activation, Adam, Add, Conv2D, Dense, Dropout, Graph, MaxPool2D, Merge, Model,
                         Multiply, Network, Output, Vertex, load_model, model_from_json)

from .gradients import parameter_central


def relative_error(model, x, y, max_params=600, seed=0):
    """max |analytic - numeric| / max |analytic| over (a sample of) all parameters."""
    _, grad = model.gradient(x, y)
    rng = np.random.default_rng(seed)
    n = model.num_params
    idx = np.arange(n) if n <= max_params else rng.choice(n, max_params, replace=False)
    numeric = parameter_central(model, lambda: model.gradient(x, y)[0], idx)
    analytic = grad[idx]
    assert np.abs(analytic).max() > 1e-6, "gradient is all zero: the check is vacuous"
    return float(np.abs(analytic - numeric).max() / np.abs(analytic).max())


def fan_out_graph(**kw):
    """Two inputs; c1 fans out to c2 and a residual Add; d1 fans out to a Merge (twice) and a
    Multiply; two outputs with weights."""
    return Graph(inputs={"image": (2, 6, 6), "extra": (4,)},
                 vertices=[("c1", Conv2D(3, 3, padding=1, activation="tanh"), "image"),
                           ("c2", Conv2D(3, 3, padding=1, activation="leaky_relu"), "c1"),
                           ("res", Add(), ["c1", "c2"]),
                           ("pool", MaxPool2D(2), "res"),
                           ("d1", Dense(5, activation="tanh"), "pool"),
                           ("d2", Dense(5, activation="sigmoid"), "extra"),
                           ("cat", Merge(), ["d1", "d2", "d1"]),
                           ("gate", Multiply(), ["d1", "d2"]),
                           ("cls", Output(3), "cat"),
                           ("reg", Output(2, loss="mse"), "gate")],
                 outputs=["cls", "reg"], loss_weights={"reg": 0.5}, updater=SGD(0.1), dtype="float64", **kw)


def fan_out_data(n=5, seed=1):
    rng = np.random.default_rng(seed)
    x = {"image": rng.standard_normal((n, 2, 6, 6)), "extra": rng.standard_normal((n, 4))}
    y = {"cls": rng.integers(0, 3, n), "reg": rng.standard_normal((n, 2))}
    return x, y


def test_gradient_of_a_graph_with_fan_out_merge_add_multiply_and_two_outputs():
    g = fan_out_graph(l2=1e-3)
    x, y = fan_out_data()
    assert relative_error(g, x, y) < 1e-6


def test_gradient_of_an_input_merged_with_itself_and_conv_channel_merge():
    g = Graph(inputs={"x": (1, 5, 5)},
              vertices=[("a", Conv2D(2, 3, padding=1, activation="sigmoid"), "x"),
                        ("b", Conv2D(3, 1, activation="relu"), "x"),
                        ("cat", Merge(), ["a", "b", "a"]),
                        ("sq", Multiply(), ["cat", "cat"]),
                        ("out", Output(2), "sq")],
              outputs=["out"], updater=SGD(0.1), dtype="float64")
    assert g.spec.single_output().units == 2
    rng = np.random.default_rng(3)
    assert relative_error(g, rng.standard_normal((4, 1, 5, 5)), rng.integers(0, 2, 4)) < 1e-6


def test_a_chain_graph_equals_the_network_bit_for_bit():
    layers = [Conv2D(4, 3, activation="relu"), MaxPool2D(2), Dense(8), Dropout(0.25), Output(3)]
    net = Network((1, 8, 8), layers, updater=Adam(1e-2), seed=5, l2=1e-4)
    names = ["c", "p", "d", "drop", "out"]
    g = Graph({"input": (1, 8, 8)}, [(n, layer, prev) for n, layer, prev in zip(names, layers, ["input"] + names)],
              ["out"], updater=Adam(1e-2), seed=5, l2=1e-4)
    assert g.num_params == net.num_params
    np.testing.assert_array_equal(g.params, net.params)
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((16, 1, 8, 8)).astype(np.float32), rng.integers(0, 3, 16)
    for _ in range(3):
        assert g.fit_batch(x, y) == net.fit_batch(x, y)
    np.testing.assert_array_equal(g.params, net.params)
    np.testing.assert_array_equal(g.updater_state, net.updater_state)
    np.testing.assert_array_equal(g.output(x), net.output(x))


def test_vertices_in_any_order_and_the_config_round_trip():
    g = fan_out_graph()
    shuffled = Graph(g.inputs, list(reversed(g.config_arguments()["vertices"])), g.outputs,
                     loss_weights=g.loss_weights, updater=g.updater, dtype="float64")
    np.testing.assert_array_equal(shuffled.params, g.params)
    again = model_from_json(g.to_json())
    assert isinstance(again, Graph) and isinstance(again, Model)
    assert again.to_config() == g.to_config()
    assert again.fingerprint() == g.fingerprint()
    np.testing.assert_array_equal(again.params, g.params)
    assert g.spec.inputs[0].name == "image" and g.spec.inputs[1].shape == (4,)
    assert [(o.name, o.units, o.loss, o.weight) for o in g.spec.outputs] == [("cls", 3, "nll", 1.0),
                                                                             ("reg", 2, "mse", 0.5)]


def test_fit_output_score_by_name_and_save_load(tmp_path):
    g = fan_out_graph()
    x, y = fan_out_data(n=32)
    losses = g.fit(x, y, batch_size=8, epochs=3)
    assert losses[-1] < losses[0]
    out = g.output(x)
    assert set(out) == {"cls", "reg"} and out["cls"].shape == (32, 3) and out["reg"].shape == (32, 2)
    np.testing.assert_allclose(out["cls"].sum(axis=1), 1.0)
    listed = g.output([x["image"], x["extra"]])  # a list in input order
    np.testing.assert_array_equal(listed["reg"], out["reg"])
    assert np.isfinite(g.score(x, y))
    g.save(tmp_path / "g.npz")
    loaded = load_model(tmp_path / "g.npz")
    assert isinstance(loaded, Graph) and loaded.iteration == g.iteration and loaded.epoch == 3
    np.testing.assert_array_equal(loaded.params, g.params)
    np.testing.assert_array_equal(loaded.updater_state, g.updater_state)
    assert Graph.load(tmp_path / "g.npz").to_config() == g.to_config()


@pytest.mark.parametrize("build, message", [
    (lambda: Graph({"x": (3,)}, [("a", Dense(2), "b"), ("o", Output(2), "a")], ["o"]),
     r"inputs among the graph's inputs and vertices, got unknown \['b'\]"),
    (lambda: Graph({"x": (3,)}, [("a", Dense(2), "c"), ("c", Dense(2), "a"), ("o", Output(2), "c")], ["o"]),
     r"acyclic graph, got the cycle"),
    (lambda: Graph({"x": (3,)}, [("a", Dense(2), "x"), ("b", Dense(2), "x"), ("o", Output(2), "a")], ["o"]),
     r"every input and vertex to lead to an output, got unused \['b'\]"),
    (lambda: Graph({"x": (3,)}, [("a", Dense(2), "x")], ["a"]),
     r"output vertex 'a' to be an Output layer, got Dense"),
    (lambda: Graph({"x": (3,)}, [("a", Dense(2), ["x", "x"]), ("o", Output(2), "a")], ["o"]),
     r"one input to layer vertex 'a'"),
    (lambda: Graph({"x": (3,), "y": (4,)}, [("s", Add(), ["x", "y"]), ("o", Output(2), "s")], ["o"]),
     r"Vertex 's' \(Add\): Expect inputs of one shape"),
    (lambda: Graph({"x": (3,)}, [("x", Dense(2), "x"), ("o", Output(2), "x")], ["o"]),
     r"unique vertex and input names, got \['x'\]"),
    (lambda: Graph({"x": (3,)}, [("o", Output(2), "x")], ["o"], loss_weights={"p": 1.0}),
     r"loss_weights for outputs among \['o'\], got 'p'"),
])
def test_wiring_errors_name_what_is_wrong(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def test_data_errors_name_inputs_and_outputs():
    g = fan_out_graph()
    x, y = fan_out_data()
    with pytest.raises(ValueError, match=r"inputs keyed by \['image', 'extra'\], got keys \['image'\]"):
        g.fit_batch({"image": x["image"]}, y)
    with pytest.raises(ValueError, match=r"same number of examples"):
        g.fit_batch({"image": x["image"], "extra": x["extra"][:3]}, y)
    with pytest.raises(ValueError, match=r"labels keyed by \['cls', 'reg'\]"):
        g.fit_batch(x, {"cls": y["cls"]})
    with pytest.raises(ConfigError):
        model_from_json('{"type": "Graph", "inputs": {"x": [3]}, "vertices": [], "outputs": ["o"]}')


def test_backward_of_a_branch_does_not_corrupt_the_other():
    """An Add hands one gradient to two branches whose layers overwrite what they receive
    (an activation's backward works in place): the gradient check only passes with copies."""
    g = Graph({"x": (6,)}, [("d", Dense(6, activation="tanh"), "x"),
                            ("r1", Activation("sigmoid"), "d"), ("r2", Activation("tanh"), "d"),
                            ("s", Add(), ["r1", "r2", "d"]),
                            ("o", Output(3), "s")], ["o"], updater=SGD(0.1), dtype="float64")
    rng = np.random.default_rng(4)
    assert relative_error(g, rng.standard_normal((5, 6)), rng.integers(0, 3, 5)) < 1e-6


def test_vertex_validates_its_fields():
    with pytest.raises(ValueError, match="non-empty str"):
        Vertex("", Dense(2), "x")
    with pytest.raises(ValueError, match="Layer or a combining vertex"):
        Vertex("a", "Dense", "x")


def test_gradient_of_a_residual_block_with_batchnorm_and_the_new_layers():
    from sparkavg.nn import BatchNorm, Flatten, GlobalAvgPool, LayerNorm, Reshape

    g = Graph({"flat": (32,)},
              [("img", Reshape((2, 4, 4)), "flat"),
               ("c1", Conv2D(3, 3, padding=1), "img"),
               ("bn1", BatchNorm(), "c1"),
               ("r1", Activation("relu"), "bn1"),
               ("c2", Conv2D(3, 3, padding=1), "r1"),
               ("bn2", BatchNorm(), "c2"),
               ("res", Add(), ["bn2", "c1"]),
               ("ln", LayerNorm(), "res"),
               ("gap", GlobalAvgPool(), "ln"),
               ("fl", Flatten(), "res"),
               ("d", Dense(4, activation="tanh"), "fl"),
               ("dbn", BatchNorm(), "d"),
               ("cat", Merge(), ["gap", "dbn"]),
               ("out", Output(3), "cat")], ["out"], updater=SGD(0.1), dtype="float64")
    assert g.buffers.size == 2 * (3 + 3 + 4)
    rng = np.random.default_rng(8)
    g.params = g.params + 0.1 * rng.standard_normal(g.num_params)  # gamma away from 1, beta from 0
    buffers = g.buffers.copy()
    x, y = rng.standard_normal((6, 32)), rng.integers(0, 3, 6)
    assert relative_error(g, x, y) < 1e-6
    assert not np.array_equal(g.buffers, buffers)  # training forwards moved the running statistics


def test_a_network_with_batchnorm_saves_its_buffers(tmp_path):
    from sparkavg.nn import BatchNorm

    net = Network((6,), [Dense(5), BatchNorm(), Output(2)], seed=3)
    rng = np.random.default_rng(0)
    net.fit(rng.standard_normal((40, 6)).astype(np.float32), rng.integers(0, 2, 40), batch_size=8)
    assert net.buffers.size == 10 and not np.allclose(net.buffers[:5], 0)
    net.save(tmp_path / "n.npz")
    loaded = load_model(tmp_path / "n.npz")
    np.testing.assert_array_equal(loaded.buffers, net.buffers)
    x = rng.standard_normal((7, 6)).astype(np.float32)
    np.testing.assert_array_equal(loaded.output(x), net.output(x))  # inference uses the saved statistics


def test_steps_dominated_by_openmp_kernels_run_blas_on_one_thread():
    from threadpoolctl import threadpool_info

    from sparkavg import ops
    from sparkavg.nn import lenet
    from sparkavg.threads import limit_threads

    if not ops.have_direct_conv():
        pytest.skip("the direct convolution kernels need AVX-512 on this CPU")

    def blas_width():
        return max(i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas")

    convs = Graph({"x": (1, 12, 12)}, [("c1", Conv2D(16, 3, padding=1), "x"), ("c2", Conv2D(16, 3, padding=1), "c1"),
                                       ("out", Output(3), "c2")], ["out"])
    rng = np.random.default_rng(0)
    with limit_threads(2):
        # the convolutions carry > 90% of this graph's multiply-adds; LeNet's dense layers ~18% of its
        for model, inside in ((convs, 1), (lenet(), 2)):
            with model.step_threads():
                assert blas_width() == inside, type(model).__name__
            assert blas_width() == 2  # restored
            x = rng.random((4, *model.spec.single_input().shape), dtype=np.float32)
            assert np.isfinite(model.fit_batch(x, rng.integers(0, 3, 4)))
            assert blas_width() == 2
