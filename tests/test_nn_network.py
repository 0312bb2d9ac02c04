"""The Network API: flat vectors, updaters, compute/apply update, config and
model files, determinism, validation, LeNet, and the GPU path."""
from __future__ import annotations

import io
import json
import math
import zipfile

import numpy as np
import pytest

from sparkavg import backend
from sparkavg.configurable import ConfigError, from_config
from sparkavg.nn import (SGD, Adagrad, Adam, Conv2D, Dense, Dropout, MaxPool2D, ModelFileError, Nadam,
                         Nesterov, Network, Output, RMSProp, lenet)


def small_net(updater=None, dtype="float32", seed=5, **kw):
    layers = [Conv2D(3, 3, activation="relu"), MaxPool2D(2), Dense(6, activation="tanh"), Output(4)]
    return Network((1, 8, 8), layers, updater=updater or Adam(1e-2), dtype=dtype, seed=seed, **kw)


def batch(n=5, seed=0, classes=4):
    rng = np.random.default_rng(seed)
    return rng.random((n, 64), dtype=np.float32), rng.integers(0, classes, n)


# ------------------------------------------------------------------ layout
def test_lenet_has_431080_params_and_views_share_the_flat_vector():
    net = lenet()
    assert net.num_params == 431_080
    assert net.params.shape == (431_080,) and net.params.dtype == np.float32
    assert net.updater_state.shape == (2 * 431_080,)  # Adam: [m | v]
    conv1 = net.layers[0]
    assert np.shares_memory(conv1.W, net.params) and np.shares_memory(conv1.dW, net.flat.grads)
    net.params[:] = 0.5
    assert float(conv1.W[0, 0, 0, 0]) == 0.5 and float(net.layers[-1].b[-1]) == 0.5


@pytest.mark.parametrize("updater,size", [(SGD(0.1), 0), (Nesterov(0.1), 1), (Adagrad(0.1), 1),
                                          (RMSProp(0.1), 1), (Adam(), 2), (Nadam(), 2)])
def test_updater_state_sizes(updater, size):
    net = small_net(updater)
    assert net.updater_state.shape == (size * net.num_params,)


def test_xavier_init_scale_and_zero_biases():
    net = Network((400,), [Dense(600, activation="relu"), Output(10)], seed=1)
    w = net.layers[0].W
    assert float(w.std()) == pytest.approx(math.sqrt(2.0 / (400 + 600)), rel=0.02)
    assert not net.layers[0].b.any()


# ---------------------------------------------------------------- updaters
G = np.array([0.5, -2.0, 1e-3, 0.0])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_updaters_match_hand_computed_steps(dtype):
    g = G.astype(dtype)
    tol = dict(rtol=1e-5 if dtype == np.float32 else 1e-12, atol=1e-9)

    def run(updater, steps=2):
        state = np.zeros(updater.state_size(4), dtype)
        ups = []
        for t in range(steps):
            u = np.zeros(4, dtype)
            updater.apply(u, g, state, t)
            ups.append(u)
        return ups

    gg = G.astype(np.float64)
    np.testing.assert_allclose(run(SGD(0.1))[1], -0.1 * gg, **tol)
    # Nesterov (DL4J): v1 = -lr g; u1 = (1+mu) v1. v2 = mu v1 - lr g; u2 = -mu v1 + (1+mu) v2.
    v1 = -0.1 * gg
    v2 = 0.9 * v1 - 0.1 * gg
    u1, u2 = run(Nesterov(0.1, 0.9))
    np.testing.assert_allclose(u1, 1.9 * v1, **tol)
    np.testing.assert_allclose(u2, -0.9 * v1 + 1.9 * v2, **tol)
    # Adagrad: h = g^2, 2 g^2.
    u1, u2 = run(Adagrad(0.1, 1e-6))
    np.testing.assert_allclose(u2, -0.1 * gg / (np.sqrt(2 * gg**2) + 1e-6), **tol)
    # RMSProp: c1 = 0.05 g^2.
    u1, _ = run(RMSProp(0.1, 0.95, 1e-8))
    np.testing.assert_allclose(u1, -0.1 * gg / (np.sqrt(0.05 * gg**2) + 1e-8), **tol)
    # Adam, two steps with bias correction.
    m1, v1 = 0.1 * gg, 0.001 * gg**2
    m2, v2 = 0.9 * m1 + 0.1 * gg, 0.999 * v1 + 0.001 * gg**2
    a1 = 1e-3 * math.sqrt(1 - 0.999) / (1 - 0.9)
    a2 = 1e-3 * math.sqrt(1 - 0.999**2) / (1 - 0.9**2)
    u1, u2 = run(Adam(1e-3))
    np.testing.assert_allclose(u1, -a1 * m1 / (np.sqrt(v1) + 1e-8), **tol)
    np.testing.assert_allclose(u2, -a2 * m2 / (np.sqrt(v2) + 1e-8), **tol)
    # Nadam, first step.
    numer = 0.9 * m1 / (1 - 0.9**2) + 0.1 * gg / (1 - 0.9)
    expect = -1e-3 * numer / (np.sqrt(v1 / (1 - 0.999)) + 1e-8)
    np.testing.assert_allclose(run(Nadam(1e-3), 1)[0], expect, **tol)


def test_updater_validation_and_config_round_trip():
    with pytest.raises(ValueError, match="Expect lr > 0, got -1"):
        SGD(-1)
    with pytest.raises(ValueError, match="Expect 0 <= momentum < 1, got 1.5"):
        Nesterov(0.1, momentum=1.5)
    for u in (SGD(0.3), Nesterov(0.2, 0.8), Adagrad(0.1, 1e-5), RMSProp(0.1, 0.9, 1e-7), Adam(2e-3), Nadam()):
        assert from_config(json.loads(json.dumps(u.to_config())), kind="updater") == u
    with pytest.raises(ConfigError, match="unknown"):
        from_config({"type": "Adam", "lr": 1e-3, "momentum": 0.9}, kind="updater")


def test_sgd_fit_batch_moves_params_by_minus_lr_grad():
    net = small_net(SGD(0.05), dtype="float64")
    x, y = batch()
    p0 = net.params.copy()
    _, g = net.gradient(x, y)
    net.fit_batch(x, y)
    np.testing.assert_allclose(net.params, p0 - 0.05 * g, rtol=1e-12, atol=1e-15)


# --------------------------------------------------------- compute / apply
@pytest.mark.parametrize("updater", [Adam(1e-2), Nesterov(0.05), RMSProp(0.01), Nadam(1e-2)])
def test_fit_batch_equals_compute_update_plus_apply_update_exactly(updater):
    a = small_net(updater, l2=1e-3, weight_decay=1e-2)
    b = a.clone()
    out = np.empty(a.num_params, np.float32)
    for s in range(3):
        x, y = batch(seed=s)
        la = a.fit_batch(x, y)
        lb = b.compute_update(x, y, out)
        b.apply_update(out)
        assert la == lb
    assert a.iteration == b.iteration == 3
    assert np.array_equal(a.params, b.params)
    assert np.array_equal(a.updater_state, b.updater_state)


def test_compute_update_does_not_touch_params_and_zeroes_out():
    net = small_net()
    p0 = net.params.copy()
    out = np.full(net.num_params, 7.0, np.float32)
    net.compute_update(*batch(), out)
    assert np.array_equal(net.params, p0)
    assert net.iteration == 1 and np.all(np.abs(out) < 1)
    with pytest.raises(ValueError, match=rf"Expect out of shape \({net.num_params},\), got \(3,\)"):
        net.compute_update(*batch(), np.zeros(3, np.float32))
    with pytest.raises(ValueError, match="Expect out of dtype float32, got float64"):
        net.compute_update(*batch(), np.zeros(net.num_params))


def test_params_and_state_setters_copy_and_check():
    net = small_net()
    new = np.arange(net.num_params, dtype=np.float32)
    net.params = new
    new[0] = -1
    assert net.params[0] == 0  # copied in, not aliased
    with pytest.raises(ValueError, match=rf"Expect params of shape \({net.num_params},\), got \(2,\)"):
        net.params = np.zeros(2, np.float32)
    with pytest.raises(ValueError, match="Expect params of dtype float32, got float64"):
        net.params = np.zeros(net.num_params)
    with pytest.raises(ValueError, match="Expect updater_state of shape"):
        net.updater_state = np.zeros(net.num_params, np.float32)


# ------------------------------------------------------------ determinism
def test_same_seed_gives_bit_identical_networks_and_training():
    a, b = small_net(seed=11), small_net(seed=11)
    assert np.array_equal(a.params, b.params)
    assert not np.array_equal(a.params, small_net(seed=12).params)
    for s in range(4):
        a.fit_batch(*batch(seed=s))
        b.fit_batch(*batch(seed=s))
    assert np.array_equal(a.params, b.params)


def test_dropout_is_active_in_training_only_and_seeded():
    layers = [Dense(32, activation="relu"), Dropout(0.5), Output(3)]
    net = Network((10,), layers, seed=3)
    x = np.random.default_rng(0).random((8, 10), dtype=np.float32)
    y = np.zeros(8, np.int64)
    assert np.array_equal(net.output(x), net.output(x))  # inference: deterministic, no masks
    g1, g2 = net.gradient(x, y)[1], net.gradient(x, y)[1]
    assert not np.array_equal(g1, g2)  # fresh masks each training step
    twin = Network((10,), layers, seed=3)
    assert np.array_equal(twin.gradient(x, y)[1], g1)  # ... from a seeded generator
    plain = Network((10,), [layers[0], layers[2]], seed=3)
    assert np.allclose(plain.output(x), net.output(x))  # dropout is the identity at inference


# ------------------------------------------------------- inputs and labels
def test_inputs_flat_or_shaped_and_bad_shapes_rejected():
    net = small_net()
    x, y = batch()
    assert np.array_equal(net.output(x), net.output(x.reshape(5, 1, 8, 8)))
    with pytest.raises(ValueError, match=r"Expect inputs of shape \(batch, 1, 8, 8\) or \(batch, 64\), got \(5, 63\)"):
        net.output(x[:, :63])
    with pytest.raises(ValueError, match="got 0 examples"):
        net.fit_batch(x[:0], y[:0])


def test_int_and_one_hot_labels_agree_and_bad_labels_rejected():
    net = small_net(dtype="float64")
    x, y = batch()
    assert net.score(x, y) == pytest.approx(net.score(x, np.eye(4)[y]), rel=1e-12)
    assert net.score(x, y.astype(np.float32)) == pytest.approx(net.score(x, y), rel=1e-12)
    with pytest.raises(ValueError, match=r"Expect labels of shape \(5,\) class indices or \(5, 4\) one-hot rows, got \(5, 3\)"):
        net.fit_batch(x, np.zeros((5, 3)))
    with pytest.raises(ValueError, match=r"Expect x and y with the same number of examples, "
                                         r"got x \(5, 64\) and y \(4,\)"):
        net.fit_batch(x, y[:4])
    with pytest.raises(ValueError, match=r"got x \(5, 1, 8, 8\) and y \(6,\)"):
        net.score(x.reshape(5, 1, 8, 8), np.zeros(6, np.int64))
    with pytest.raises(ValueError, match=r"got x \(5, 64\) and y \(4,\)"):
        net.fit(x, y[:4])
    with pytest.raises(ValueError, match=r"Expect class labels in \[0, 4\), got values from 0 to 4"):
        net.fit_batch(x, np.array([0, 1, 2, 3, 4]))
    with pytest.raises(ValueError, match="non-integral"):
        net.fit_batch(x, np.array([0.5, 1, 2, 3, 0]))


def test_mse_regression_learns():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 3)).astype(np.float32)
    target = x @ np.array([[1.0], [-2.0], [0.5]], np.float32)
    net = Network((3,), [Dense(16, activation="tanh"), Output(1, loss="mse")], updater=Adam(1e-2))
    first = net.score(x, target[:, 0])
    for _ in range(200):
        net.fit_batch(x, target)
    assert net.score(x, target) < 0.05 * first


def test_invalid_configurations_rejected_clearly():
    with pytest.raises(ValueError, match="Expect the last layer to be an Output layer, got Dense"):
        Network((4,), [Dense(3)])
    with pytest.raises(ValueError, match=r"Layer 0 \(Conv2D\): Expect a \(C, H, W\) input"):
        Network((4,), [Conv2D(2, 2), Output(2)])
    with pytest.raises(ValueError, match="Expect activation 'softmax' with loss 'nll', got 'relu'"):
        Output(3, activation="relu")
    with pytest.raises(ValueError, match="Expect weight_init in"):
        Dense(3, weight_init="glorot")
    with pytest.raises(ValueError, match="Expect a dropout rate"):
        Dropout(1.0)


# -------------------------------------------------------------- config/json
def test_json_round_trip_gives_equal_config_and_initial_params():
    net = small_net(Nesterov(0.05, 0.8), l2=1e-4, l2_bias=1e-5, weight_decay=0.0, seed=9)
    text = net.to_json()
    again = Network.from_json(text)
    assert again.to_json() == text and again.to_config() == net.to_config()
    assert np.array_equal(again.params, net.params)
    assert json.loads(text)["layers"][0] == {"type": "Conv2D", "filters": 3, "kernel_size": [3, 3],
                                             "stride": [1, 1], "padding": [0, 0], "activation": "relu",
                                             "weight_init": "xavier"}
    with pytest.raises(ConfigError, match="Expect a layer type in"):
        Network.from_json(text.replace('"Conv2D"', '"Conv3D"'))
    assert json.loads(text)["type"] == "Network"


def test_config_values_of_the_wrong_json_type_name_the_field():
    config = small_net().to_config()
    config["updater"] = {"type": "Adam", "lr": "0.001"}
    with pytest.raises(ConfigError, match=r"Network.updater: Expect Adam.lr to be float or a Schedule config, got str '0.001'"):
        Network.from_json(json.dumps(config))
    config = small_net().to_config()
    config["layers"][2]["units"] = "10"
    with pytest.raises(ConfigError, match=r"Network.layers\[2\]: Expect Dense.units to be int, got str '10'"):
        from_config(config, kind="network")
    with pytest.raises(ConfigError, match="Expect a JSON network configuration"):
        Network.from_json("{not json")


def test_version_1_config_still_builds_the_same_network():
    net = small_net(Nesterov(0.05, 0.8), l2=1e-4, seed=9)
    old = {k: v for k, v in net.to_config().items() if k != "type"}
    old.update(format="sparkavg.nn.Network", version=1)
    again = Network.from_json(json.dumps(old))
    assert again.to_json() == net.to_json() and np.array_equal(again.params, net.params)
    with pytest.raises(ConfigError, match="version 1"):
        Network.from_json(json.dumps({**old, "version": 2}))


def test_clone_is_independent():
    net = small_net()
    net.fit_batch(*batch())
    twin = net.clone()
    assert twin.iteration == 1 and np.array_equal(twin.params, net.params)
    twin.fit_batch(*batch(seed=1))
    assert not np.array_equal(twin.params, net.params)


# ------------------------------------------------------------ model files
def test_save_load_round_trip_is_bit_exact(tmp_path):
    net = small_net(Adam(1e-2), l2=1e-4)
    for s in range(3):
        net.fit_batch(*batch(seed=s))
    net.epoch = 2
    path = tmp_path / "model.bin"  # the exact path, no '.npz' appended
    net.save(path)
    back = Network.load(path)
    assert back.to_json() == net.to_json()
    assert np.array_equal(back.params, net.params)
    assert np.array_equal(back.updater_state, net.updater_state)
    assert (back.iteration, back.epoch) == (3, 2)
    x, y = batch(seed=9)
    assert back.fit_batch(x, y) == net.fit_batch(x, y)
    assert np.array_equal(back.params, net.params)


def _members(path):
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def _write(path, members):
    with open(path, "wb") as fh:
        np.savez(fh, **members)


@pytest.fixture()
def saved(tmp_path):
    net = small_net()
    net.fit_batch(*batch())
    path = tmp_path / "m.npz"
    net.save(path)
    return net, path


def test_truncated_file_rejected(saved):
    _, path = saved
    data = path.read_bytes()
    for cut in (len(data) // 2, len(data) - 10, 20):
        path.write_bytes(data[:cut])
        with pytest.raises(ModelFileError, match=str(path)):
            Network.load(path)


def test_tampered_params_rejected_by_checksum(saved):
    _, path = saved
    m = _members(path)
    m["params"] = m["params"].copy()
    m["params"][0] += 1e-3
    _write(path, m)
    with pytest.raises(ModelFileError, match="SHA-256 mismatch"):
        Network.load(path)


def test_flipped_byte_rejected(saved):
    _, path = saved
    data = bytearray(path.read_bytes())
    data[len(data) // 3] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(ModelFileError, match=str(path)):
        Network.load(path)


def test_wrong_shape_rejected_even_with_valid_checksum(saved):
    from sparkavg.nn.serialization import _digest

    _, path = saved
    m = _members(path)
    m["params"] = m["params"][:-1]
    vectors = [m[k] for k in ("params", "updater_state", "buffers") if k in m]
    m["sha256"] = _digest(m["config"].tobytes(), (*vectors, m["counters"]))
    _write(path, m)
    with pytest.raises(ModelFileError, match=r"params should be float32 of shape \(\d+,\) for this configuration, got float32 of shape"):
        Network.load(path)


def test_pickle_in_model_file_rejected(saved):
    _, path = saved
    m = _members(path)
    m["params"] = np.array([{"evil": "payload"}], dtype=object)
    buf = io.BytesIO()
    np.savez(buf, **m)  # savez pickles object arrays
    path.write_bytes(buf.getvalue())
    with pytest.raises(ModelFileError, match="pickled object array"):
        Network.load(path)


def test_missing_member_and_non_archive_rejected(saved, tmp_path):
    _, path = saved
    m = _members(path)
    del m["updater_state"]
    _write(path, m)
    with pytest.raises(ModelFileError, match=r"missing \['updater_state'\]"):
        Network.load(path)
    npy = tmp_path / "plain.npy"
    np.save(npy, np.zeros(3))
    with pytest.raises(ModelFileError, match="expected an .npz model archive"):
        Network.load(npy)
    junk = tmp_path / "junk.npz"
    junk.write_bytes(b"definitely not a zip")
    with pytest.raises(ModelFileError, match="junk.npz"):
        Network.load(junk)


def test_model_file_is_a_plain_zip_of_npy(saved):
    _, path = saved
    with zipfile.ZipFile(path) as z:
        assert sorted(z.namelist()) == sorted(f"{k}.npy" for k in
                                              ("config", "params", "updater_state", "buffers", "counters", "sha256"))


# ------------------------------------------------------------------- GPU
@pytest.mark.gpu
def test_gpu_step_matches_cpu():
    cpu = small_net(Adam(1e-2), dtype="float64")
    gpu = cpu.clone().to_gpu()
    assert backend.is_gpu_array(gpu.params)
    x, y = batch()
    for _ in range(3):
        lc, lg = cpu.fit_batch(x, y), gpu.fit_batch(x, y)
        assert lg == pytest.approx(lc, rel=1e-9)
    np.testing.assert_allclose(backend.to_cpu(gpu.params), cpu.params, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(backend.to_cpu(gpu.output(x)), cpu.output(x), rtol=1e-9, atol=1e-12)
    out = gpu.xp.zeros(gpu.num_params, dtype=gpu.dtype)
    gpu.compute_update(x, y, out)
    assert backend.is_gpu_array(out)
    assert np.array_equal(backend.to_cpu(gpu.to_cpu().params), backend.to_cpu(gpu.params))


@pytest.mark.gpu
def test_gpu_lenet_save_load(tmp_path):
    net = lenet().to_gpu()
    x = np.random.default_rng(0).random((8, 784), dtype=np.float32)
    net.fit_batch(x, np.arange(8))
    net.save(tmp_path / "gpu.npz")
    back = Network.load(tmp_path / "gpu.npz")
    assert np.array_equal(back.params, backend.to_cpu(net.params))


# ------------------------------------------------------------- learning
def _idx(path, offset):
    import gzip

    with gzip.open(path) as fh:
        return np.frombuffer(fh.read(), np.uint8, offset=offset)


@pytest.mark.slow
def test_lenet_learns_fashion_mnist_subset(fashion_dir):
    # A smoke test of learning (the full 1- and 5-epoch figures are in
    # benchmarks/history/models.md): 6,000 examples, one epoch at batch 64.
    x = _idx(fashion_dir / "train-images-idx3-ubyte.gz", 16).reshape(-1, 784)[:6000] / np.float32(255)
    y = _idx(fashion_dir / "train-labels-idx1-ubyte.gz", 8)[:6000]
    xt = _idx(fashion_dir / "t10k-images-idx3-ubyte.gz", 16).reshape(-1, 784)[:2000] / np.float32(255)
    yt = _idx(fashion_dir / "t10k-labels-idx1-ubyte.gz", 8)[:2000]
    net = lenet()
    losses = net.fit(x.astype(np.float32), y, batch_size=64, epochs=1)
    assert net.epoch == 1 and losses[0] < 1.0
    assert float((net.predict(xt.astype(np.float32)) == yt).mean()) > 0.70  # 0.77 measured
