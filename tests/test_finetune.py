"""Fine-tuning in the native engine: frozen layers stay bit-identical (one
process, parameter averaging, gradient sharing), a layer's learning-rate
multiplier is its step at that rate, layers initialised from another model
by name, and the messages of bad names."""
from __future__ import annotations

import numpy as np
import pytest

from sparkavg.nn import (SGD, Adam, BatchNorm, Conv2D, Dense, FineTuning, Flatten, Graph, Network, Output,
                         load_model, model_from_config, transfer)

from .nets import blobs


def _net(fine_tuning=None, updater=None, seed=0):
    return Network((1, 4, 4), [Conv2D(2, 3, padding=1, activation="relu"), BatchNorm(), Flatten(),
                               Dense(8, activation="relu"), Output(2)],
                   updater=updater or Adam(lr=0.01), seed=seed, fine_tuning=fine_tuning)


def _ranges(net, name):
    index = net.layer_names().index(name)
    return [(s.start, s.stop) for s in net.param_segments if s.layer == index]


def test_a_frozen_layer_never_moves_while_the_others_train():
    x, y = blobs(64, seed=1)
    net = _net(FineTuning(frozen=["0", 3]))
    before, state_before = net.params.copy(), net.updater_state.copy()
    net.fit(x, y, batch_size=16, epochs=2)
    n = net.num_params
    for name in ("0", "3"):
        for a, b in _ranges(net, name):
            np.testing.assert_array_equal(net.params[a:b], before[a:b])
            for j in range(net.updater_state.size // n):
                np.testing.assert_array_equal(net.updater_state[j * n + a:j * n + b],
                                              state_before[j * n + a:j * n + b])
    a, b = _ranges(net, "4")[0]
    assert not np.array_equal(net.params[a:b], before[a:b])
    blocks = [(_ranges(net, k)[0][0], _ranges(net, k)[-1][1]) for k in ("0", "3")]
    assert net.frozen_ranges == blocks


def test_a_learning_rate_multiplier_is_the_step_at_that_rate():
    x, y = blobs(32, seed=2)
    scaled = _net(FineTuning(lr_multipliers={"3": 0.25}), updater=Adam(lr=0.01))
    slow = _net(updater=Adam(lr=0.0025))
    fast = _net(updater=Adam(lr=0.01))
    for start in range(0, 32, 8):
        for net in (scaled, slow, fast):
            net.fit_batch(x[start:start + 8], y[start:start + 8])
    # one step: layer 3 moves as at lr * 0.25, the rest as at lr (the gradients agree at the first step)
    scaled1, slow1, fast1 = (_net(FineTuning(lr_multipliers={"3": 0.25})), _net(updater=Adam(lr=0.0025)), _net())
    for net in (scaled1, slow1, fast1):
        net.fit_batch(x[:8], y[:8])
    for a, b in _ranges(scaled1, "3"):
        np.testing.assert_allclose(scaled1.params[a:b], slow1.params[a:b], rtol=1e-6, atol=1e-7)
    for a, b in _ranges(scaled1, "4"):
        np.testing.assert_array_equal(scaled1.params[a:b], fast1.params[a:b])
    assert not np.array_equal(scaled.params, fast.params)


def test_the_multiplier_scales_sgds_step_exactly():
    x, y = blobs(8, seed=3)
    base, half = _net(updater=SGD(0.1)), _net(FineTuning(lr_multipliers={"4": 0.5}), updater=SGD(0.1))
    full, scaled = np.empty(base.num_params, np.float32), np.empty(base.num_params, np.float32)
    base.compute_update(x, y, full)
    half.compute_update(x, y, scaled)
    a, b = _ranges(base, "4")[0][0], _ranges(base, "4")[-1][1]
    np.testing.assert_array_equal(scaled[a:b], np.float32(0.5) * full[a:b])
    np.testing.assert_array_equal(scaled[:a], full[:a])
    assert np.abs(full[a:b]).max() > 0


def test_fine_tuning_is_saved_with_the_model(tmp_path):
    net = _net(FineTuning(frozen=["0"], lr_multipliers={"4": 0.1}))
    again = model_from_config(net.to_config())
    assert again.fine_tuning == net.fine_tuning and again.frozen_ranges == net.frozen_ranges
    assert again.fingerprint() == _net().fingerprint()  # the layout, not the training options
    net.save(tmp_path / "m.npz")
    assert load_model(tmp_path / "m.npz").fine_tuning == net.fine_tuning
    graph = Graph({"image": (1, 4, 4)}, [("flat", Flatten(), "image"), ("hidden", Dense(4), "flat"),
                                         ("out", Output(2), "hidden")], ["out"],
                  fine_tuning=FineTuning(frozen=["hidden"]))
    assert graph.layer_names() == ["flat", "hidden", "out"]
    assert model_from_config(graph.to_config()).frozen_ranges == graph.frozen_ranges != []


@pytest.mark.parametrize("kwargs, message", [
    (dict(frozen=["nine"]), r"layer names among \['0', '1', '2', '3', '4'\], got \['nine'\]"),
    (dict(lr_multipliers={"3": 0.0}), "finite and > 0 for layer '3'"),
    (dict(lr_multipliers={"3": float("inf")}), "finite and > 0"),
    (dict(frozen=["3"], lr_multipliers={"3": 0.5}), r"either frozen or with a learning-rate multiplier, got both"),
    (dict(frozen=[1.5]), "Expect a layer name"),
])
def test_bad_fine_tuning_is_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        _net(FineTuning(**kwargs))


def test_layers_initialised_from_another_model_by_name(tmp_path):
    x, y = blobs(64, seed=4)
    trained = _net(seed=5)
    trained.fit(x, y, batch_size=16, epochs=1)
    trained.save(tmp_path / "trained.npz")
    fresh = _net(seed=6)
    copied = transfer(tmp_path / "trained.npz", fresh, layers=["0", "1"])
    assert copied == ["0", "1"]
    for name in ("0", "1"):
        for a, b in _ranges(fresh, name):
            np.testing.assert_array_equal(fresh.params[a:b], trained.params[a:b])
    np.testing.assert_array_equal(fresh.buffers, trained.buffers)  # BatchNorm's statistics came along
    a, b = _ranges(fresh, "3")[0]
    assert not np.array_equal(fresh.params[a:b], trained.params[a:b])
    other = Network((1, 4, 4), [Conv2D(3, 3, padding=1), Flatten(), Output(2)])
    with pytest.raises(ValueError, match=r"same tensors \(name and shape\).*0: "):
        transfer(trained, other, layers=["0"])
    with pytest.raises(ValueError, match=r"layers both models have, got \['7'\]"):
        transfer(trained, fresh, layers=["7"])


@pytest.mark.slow
@pytest.mark.parametrize("master", ["averaging", "sharing"])
def test_frozen_layers_stay_bit_identical_under_both_masters(spark, master):
    from sparkavg.spark import GradientSharing, ParameterAveraging, SparkTrainer

    x, y = blobs(256, seed=7)
    rdd = spark.sparkContext.parallelize(list(zip(x, y)), 2)
    net = _net(FineTuning(frozen=["0", "1"]))
    before = net.params.copy()
    strategy = (ParameterAveraging(batch_size_per_worker=16, averaging_frequency=3) if master == "averaging"
                else GradientSharing(batch_size_per_worker=16))
    SparkTrainer(spark, net, strategy).fit(rdd, epochs=2)
    for name in ("0", "1"):
        for a, b in _ranges(net, name):
            np.testing.assert_array_equal(net.params[a:b], before[a:b])
    a, b = _ranges(net, "4")[0]
    assert not np.array_equal(net.params[a:b], before[a:b])
