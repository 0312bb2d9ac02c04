"""Gradient normalisation (sparkavg.nn.clipping): each mode against a direct
numpy computation, on Network, Graph and TorchModel steps (before L2 and the
updater), float64 included; configs and files; a clipped model trains; and
gradient sharing with clipping on a real local[2] Spark."""
import numpy as np
import pytest

from sparkavg.configurable import ConfigError, from_config
from sparkavg.nn import (SGD, ClipElementWise, ClipGlobalNorm, ClipL2PerLayer, ClipL2PerParamType, Dense, Network,
                         Output, RenormalizeL2PerLayer, RenormalizeL2PerParamType, load_model, model_from_json)
from sparkavg.torch import TorchModel

from .nets import blobs, small_graph, small_net

MODES = [ClipElementWise(0.01), ClipL2PerLayer(0.05), ClipL2PerParamType(0.05), RenormalizeL2PerLayer(),
         RenormalizeL2PerParamType(), ClipGlobalNorm(0.1)]


def _groups(segments, per):
    """The (start, stop) groups of a mode, from a model's segments, written out again."""
    if per == "parameter":
        return [(s.start, s.stop) for s in segments]
    if per == "layer":
        layers = {}
        for s in segments:
            layers.setdefault(s.layer, []).append(s)
        return [(min(s.start for s in group), max(s.stop for s in group)) for group in layers.values()]
    return [(0, max(s.stop for s in segments))]


def expected(grads, mode, segments):
    """``mode`` applied to ``grads`` in float64 numpy, by DL4J's definitions."""
    g = np.array(grads, dtype=np.float64)
    if isinstance(mode, ClipElementWise):
        return np.clip(g, -mode.threshold, mode.threshold)
    limit = getattr(mode, "max_norm", None) or getattr(mode, "threshold", None)  # None: renormalise
    for start, stop in _groups(segments, mode.per):
        norm = np.sqrt(np.sum(g[start:stop] ** 2))
        if limit is None and norm > 0:
            g[start:stop] /= norm
        elif limit is not None and norm > limit:
            g[start:stop] *= limit / norm
    return g


def _network(dtype="float32", **kw):
    return Network((1, 4, 4), [Dense(8, activation="relu"), Dense(6, activation="tanh"), Output(2)], seed=2,
                   dtype=dtype, **kw)


def _graph(dtype="float32", **kw):
    args = small_graph(seed=2).config_arguments()
    args.update(dtype=dtype, **kw)
    return type(small_graph())(**args)


def _torch(dtype="float32", **kw):
    return TorchModel("tests.torch_models:mlp", input_shape=(1, 4, 4), seed=2, dtype=dtype, **kw)


@pytest.mark.parametrize("mode", MODES, ids=lambda m: type(m).__name__)
@pytest.mark.parametrize("make", [_network, _graph, _torch], ids=["Network", "Graph", "TorchModel"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_each_mode_normalises_the_loss_gradient_before_l2_and_the_updater(make, mode, dtype):
    """SGD(lr) with L2: the update is ``-lr * (mode(loss gradient) + l2 * W)``."""
    x, y = blobs(16, seed=3)
    plain = make(dtype, updater=SGD(lr=0.5))
    loss_grad = plain.gradient(x, y)[1]  # no L2: the loss gradient alone
    penalised = make(dtype, updater=SGD(lr=0.5), l2=0.3)
    l2_grad = penalised.gradient(x, y)[1] - loss_grad
    net = make(dtype, updater=SGD(lr=0.5), l2=0.3, gradient_normalization=mode)
    normalised = expected(loss_grad, mode, net.param_segments)
    assert np.abs(normalised - loss_grad).max() > 1e-4  # the mode changes this gradient
    out = np.zeros(net.num_params, net.dtype)
    net.compute_update(x, y, out)
    tolerance = dict(rtol=1e-5, atol=1e-6) if dtype == "float32" else dict(rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(out, -0.5 * (normalised + l2_grad), **tolerance)
    np.testing.assert_array_equal(net.gradient(x, y)[1], penalised.gradient(x, y)[1])  # gradient() stays raw
    again = make(dtype, updater=SGD(lr=0.5), l2=0.3, gradient_normalization=mode)
    before = again.params.copy()
    again.fit_batch(x, y)  # fit_batch's own path: the same step
    np.testing.assert_array_equal(again.params, before + out)


def test_a_torch_models_layers_are_its_parameter_tensors():
    net = _torch(gradient_normalization=ClipL2PerLayer(0.05))
    assert net.flat.normalization_groups("layer") == tuple((s.start, s.stop) for s in net.param_segments)
    layered = _network(gradient_normalization=ClipL2PerLayer(0.05))
    assert len(layered.flat.normalization_groups("layer")) == 3 and len(layered.param_segments) == 6


def test_a_zero_gradient_is_left_alone():
    grads = np.zeros(10, np.float32)
    for mode in MODES:
        mode.apply(grads, [(0, 4), (4, 10)])
        assert not grads.any()


def test_configs_files_and_fingerprints(tmp_path):
    net = _network(gradient_normalization=ClipGlobalNorm(1.0))
    config = net.to_config()
    assert config["gradient_normalization"] == {"type": "ClipGlobalNorm", "max_norm": 1.0}
    assert "gradient_normalization" not in _network().to_config()  # configs without it are as they were
    assert net.fingerprint() == _network().fingerprint()  # the state layout is the same
    assert model_from_json(net.to_json()).gradient_normalization == ClipGlobalNorm(1.0)
    for mode in MODES:
        assert from_config(mode.to_config(), kind="gradient_normalization") == mode
    graph = _graph(gradient_normalization=RenormalizeL2PerLayer())
    assert model_from_json(graph.to_json()).gradient_normalization == RenormalizeL2PerLayer()
    assert graph.fingerprint() == _graph().fingerprint()
    torch_model = _torch(gradient_normalization=ClipL2PerParamType(2.0))
    assert torch_model.clone().gradient_normalization == ClipL2PerParamType(2.0)
    torch_model.save(tmp_path / "torch.npz")
    assert load_model(tmp_path / "torch.npz").gradient_normalization == ClipL2PerParamType(2.0)
    assert "gradient_normalization=ClipL2PerParamType(threshold=2.0)" in torch_model.summary()


@pytest.mark.parametrize("make, message", [
    (lambda: ClipGlobalNorm(0), r"Expect max_norm > 0 and finite, got 0"),
    (lambda: ClipL2PerLayer(float("nan")), r"Expect threshold > 0 and finite, got nan"),
    (lambda: ClipElementWise(True), r"Expect threshold > 0 and finite, got True"),
    (lambda: _network(gradient_normalization="clip"),
     r"Expect gradient_normalization as a GradientNormalization \(sparkavg.nn.clipping: ClipGlobalNorm\(1.0\), "
     r"ClipL2PerLayer\(...\), ...\) or None, got 'clip'"),
])
def test_bad_modes_are_refused(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_bad_configs_name_the_field():
    config = _network().to_config()
    config["gradient_normalization"] = {"type": "ClipGlobalNorm", "max_norm": "1"}
    with pytest.raises(ConfigError, match=r"Network.gradient_normalization: Expect ClipGlobalNorm.max_norm to be "
                                          r"float, got str '1'"):
        from_config(config, kind="network")
    config["gradient_normalization"] = {"type": "ClipEverything"}
    with pytest.raises(ConfigError, match=r"Network.gradient_normalization: Expect a gradient_normalization type in "
                                          r"\['ClipElementWise', 'ClipGlobalNorm', .*\], got 'ClipEverything'"):
        from_config(config, kind="network")


def test_a_clipped_model_trains_and_saves(tmp_path):
    x, y = blobs(400, seed=5)
    net = small_net(seed=5)
    net.gradient_normalization = ClipGlobalNorm(0.2)
    losses = net.fit(x, y, batch_size=20, epochs=4)
    assert losses[-1] < 0.5 * losses[0]
    assert np.mean(net.predict(x) == y) > 0.95
    net.save(tmp_path / "net.npz")
    loaded = Network.load(tmp_path / "net.npz")
    assert loaded.gradient_normalization == ClipGlobalNorm(0.2)
    np.testing.assert_array_equal(loaded.params, net.params)


@pytest.mark.spark
def test_gradient_sharing_with_clipping_learns_and_replicas_agree(sc):
    from sparkavg.spark import GradientSharing, SparkTrainer

    x, y = blobs(400, seed=6)
    rdd = sc.parallelize(list(zip(x, y.tolist())), 2)
    net = small_net(seed=6)
    net.gradient_normalization = ClipL2PerLayer(0.5)
    with SparkTrainer(sc, net, GradientSharing(threshold=1e-3, batch_size_per_worker=10, workers=2,
                                               staleness=0)) as trainer:
        trainer.fit(rdd, epochs=2)
        assert max(e["replica_max_abs_diff"] for e in trainer.history) < 1e-5
        assert trainer.evaluate(rdd).accuracy() > 0.9
    assert net.gradient_normalization == ClipL2PerLayer(0.5)
