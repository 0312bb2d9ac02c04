"""sparkavg.torch.TorchModel without Spark: flat views of the module's
parameters, gradients and buffers, the training step against a bare torch
step, losses, files (no pickle), factories by name and their errors, and
that the core never imports torch."""
import json
import socket
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from sparkavg.configurable import ConfigError
from sparkavg.nn import SGD, Adam, load_model, model_from_json
from sparkavg.nn.model import Model
from sparkavg.torch import FactoryError, TorchModel
from sparkavg.torch.zoo import lenet

from . import torch_models
from .nets import blobs


def _mlp(seed=0, **kw):
    return TorchModel("tests.torch_models:mlp", updater=kw.pop("updater", Adam(lr=0.01)), input_shape=(1, 4, 4),
                      seed=seed, **kw)


def _conv_bn(seed=0):
    return TorchModel("tests.torch_models:conv_bn", updater=Adam(lr=0.01), input_shape=(1, 4, 4), seed=seed)


def test_parameters_and_gradients_are_views_of_the_flat_vectors():
    net = _mlp(seed=1)
    assert isinstance(net, Model) and net.num_params == 16 * 8 + 8 + 8 * 2 + 2
    assert net.spec.single_input().shape == (1, 4, 4) and net.spec.single_output().units == 2
    params = list(net.module.parameters())
    flat = net.state["params"]
    base = flat.ctypes.data
    assert [p.data_ptr() - base for p in params] == [4 * s.start for s in net.param_segments]
    assert [p.grad.data_ptr() - net.flat.grads.ctypes.data for p in params] == [4 * s.start for s in net.param_segments]
    flat[:3] = 7.0  # writes through numpy are the module's weights
    assert params[0].detach().reshape(-1)[:3].tolist() == [7.0, 7.0, 7.0]
    x, y = blobs(32, seed=2)
    net.fit_batch(x, y)
    np.testing.assert_array_equal(np.concatenate([p.detach().reshape(-1).numpy() for p in params]), net.params)
    assert [s.regularized for s in net.param_segments] == [True, False, True, False]  # weights, biases


def test_same_seed_same_module_and_the_global_rng_is_left_alone():
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    a, b, c = _mlp(seed=4), _mlp(seed=4), _mlp(seed=5)
    assert torch.equal(torch.rand(3), expected)
    np.testing.assert_array_equal(a.params, b.params)
    assert not np.array_equal(a.params, c.params)
    torch.manual_seed(4)
    reference = torch_models.mlp()
    np.testing.assert_array_equal(a.params, torch.cat([p.detach().reshape(-1) for p in reference.parameters()]))


def test_training_steps_equal_a_bare_torch_loop_with_the_same_arithmetic():
    """SGD(lr) is torch.optim.SGD(lr): the adapter adds nothing to the arithmetic."""
    x, y = blobs(64, seed=3)
    net = _mlp(seed=6, updater=SGD(lr=0.1))
    torch.manual_seed(6)
    bare = torch_models.mlp()
    opt = torch.optim.SGD(bare.parameters(), lr=0.1)
    for start in range(0, 64, 16):
        xb, yb = x[start:start + 16], y[start:start + 16]
        loss = net.fit_batch(xb, yb)
        opt.zero_grad()
        ref = torch.nn.functional.cross_entropy(bare(torch.from_numpy(xb)), torch.from_numpy(yb))
        ref.backward()
        opt.step()
        assert loss == pytest.approx(ref.item(), rel=1e-6)
    np.testing.assert_allclose(net.params, torch.cat([p.detach().reshape(-1) for p in bare.parameters()]),
                               rtol=1e-6, atol=1e-7)
    assert net.iteration == 4


def test_adam_learns_and_output_is_softmax_probabilities():
    x, y = blobs(128, seed=7)
    net = _mlp(seed=8)
    before = net.score(x, y)
    losses = net.fit(x, y, batch_size=16, epochs=5)
    assert losses[-1] < losses[0] and net.score(x, y) < before and net.epoch == 5
    out = net.output(x)
    assert out.shape == (128, 2) and out.dtype == np.float32
    np.testing.assert_allclose(out.sum(axis=1), 1.0, rtol=1e-6)
    assert (net.predict(x) == y).mean() > 0.95
    assert net.updater_state.shape == (2 * net.num_params,) and np.abs(net.updater_state).sum() > 0
    one_hot = np.eye(2, dtype=np.float32)[y]
    assert net.score(x, one_hot) == pytest.approx(net.score(x, y), rel=1e-6)
    with pytest.raises(ValueError, match=r"Expect class labels in \[0, 2\), got values from 0 to 2"):
        net.fit_batch(x[:4], np.array([0, 1, 2, 1]))
    with pytest.raises(ValueError, match=r"Expect inputs of shape \(batch, 1, 4, 4\) or \(batch, 16\)"):
        net.output(np.zeros((3, 15), np.float32))


def test_batchnorm_running_statistics_are_the_buffers_vector():
    x, y = blobs(64, seed=9)
    net = _conv_bn(seed=10)
    bn = net.module[1]
    # running_mean, running_var (4 each, views) and num_batches_tracked (int64, copied)
    assert net.buffers.shape == (9,) and net.buffers[8] == 0
    assert bn.running_mean.data_ptr() == net.buffers.ctypes.data
    net.fit_batch(x, y)
    net.fit_batch(x, y)
    assert net.buffers[8] == 2 and int(bn.num_batches_tracked) == 2
    np.testing.assert_array_equal(net.buffers[:4], bn.running_mean.numpy())
    assert np.abs(net.buffers[:4]).sum() > 0
    other = _conv_bn(seed=10)
    other.load_state({"params": net.params})
    assert not np.allclose(other.output(x), net.output(x))  # inference uses the running statistics
    other.load_state({"buffers": net.buffers})
    np.testing.assert_array_equal(other.output(x), net.output(x))
    assert int(other.module[1].num_batches_tracked) == 2
    other.fit_batch(x, y)
    assert other.buffers[8] == 3  # counted from the loaded value


def test_model_files_round_trip_without_pickle(tmp_path):
    x, y = blobs(48, seed=11)
    net = _conv_bn(seed=12)
    net.l2 = 1e-3
    net.fit(x, y, batch_size=16, epochs=2)
    path = tmp_path / "net.npz"
    net.save(path)
    with np.load(path, allow_pickle=False) as archive:  # plain arrays only
        config = json.loads(archive["config"].tobytes())
    assert config["type"] == "TorchModel" and config["factory"] == "tests.torch_models:conv_bn"
    assert config["factory_kwargs"] == {} and config["input_shape"] == [1, 4, 4] and config["l2"] == 1e-3
    for back in (load_model(path), TorchModel.load(path)):
        assert isinstance(back, TorchModel) and (back.iteration, back.epoch) == (6, 2)
        for key in ("params", "updater", "buffers"):
            np.testing.assert_array_equal(back.state[key], net.state[key])
        np.testing.assert_array_equal(back.output(x), net.output(x))
        assert back.score(x, y) == pytest.approx(net.score(x, y), rel=1e-6)
    rebuilt = model_from_json(net.to_json())  # a fresh model: the same initial parameters
    np.testing.assert_array_equal(rebuilt.params, _conv_bn(seed=12).params)
    assert rebuilt.fingerprint() == net.fingerprint() != _mlp().fingerprint()


def test_l2_adds_to_the_loss_and_the_weights_gradient_only():
    x, y = blobs(16, seed=13)
    plain, reg = _mlp(seed=14), _mlp(seed=14, l2=0.5, l2_bias=0.0)
    loss0, g0 = plain.gradient(x, y)
    loss1, g1 = reg.gradient(x, y)
    w = [s for s in reg.param_segments if s.regularized]
    penalty = sum(0.5 * 0.5 * float(reg.params[s.start:s.stop] @ reg.params[s.start:s.stop]) for s in w)
    assert loss1 == pytest.approx(loss0 + penalty, rel=1e-5)
    expected = g0.copy()
    for s in w:
        expected[s.start:s.stop] += 0.5 * reg.params[s.start:s.stop]
    np.testing.assert_allclose(g1, expected, rtol=1e-5, atol=1e-7)


def test_regression_custom_losses_and_sequences():
    rng = np.random.default_rng(15)
    x = rng.standard_normal((64, 3)).astype(np.float32)
    t = (x @ np.array([1.0, -2.0, 0.5], np.float32))[:, None]
    reg = TorchModel("tests.torch_models:regressor", loss="mse", updater=Adam(lr=0.05), input_shape=(3,), seed=1)
    assert reg.spec.single_output().loss == "mse"
    reg.fit(x, t, batch_size=16, epochs=30)
    assert reg.score(x, t) < 0.01
    np.testing.assert_allclose(reg.output(x), x @ reg.params[:3].reshape(3, 1) + reg.params[3], rtol=1e-4, atol=1e-5)
    huber = TorchModel("tests.torch_models:regressor", loss="tests.torch_models:huber", targets="values",
                       input_shape=(3,), seed=1)
    assert huber.to_config()["loss"] == "tests.torch_models:huber" and huber.spec.single_output().loss == "mse"
    assert model_from_json(huber.to_json()).score(x, t) == pytest.approx(huber.score(x, t))

    seq = rng.standard_normal((64, 5, 4)).astype(np.float32)
    labels = (seq[:, :, 0].sum(axis=1) > 0).astype(np.int64)
    lstm = TorchModel("tests.torch_models:lstm", updater=Adam(lr=0.02), input_shape=(5, 4), seed=2)
    first = lstm.score(seq, labels)
    lstm.fit(seq, labels, batch_size=16, epochs=15)
    assert lstm.score(seq, labels) < 0.5 * first


def test_callable_factories_by_name_or_in_process_only():
    named = TorchModel(torch_models.mlp, input_shape=(16,), seed=3)
    assert named.to_config()["factory"] == "tests.torch_models:mlp"  # importable: stored by name
    local = TorchModel(lambda: torch.nn.Linear(16, 2), input_shape=(16,), seed=3)
    x, y = blobs(16, seed=1)
    local.fit_batch(x.reshape(16, 16), y)  # trains in this process
    copy = local.clone()
    np.testing.assert_array_equal(copy.params, local.params)
    with pytest.raises(ConfigError, match="factory importable by name to save, checkpoint or ship"):
        local.to_json()
    with pytest.raises(ConfigError, match="importable module"):
        local.save("unused.npz")


def test_factory_errors_name_the_factory_the_host_and_what_to_install():
    host = socket.gethostname()
    with pytest.raises(FactoryError, match=rf"'nosuchpkg.models:net' on host {host} .*No module named 'nosuchpkg'"
                                           r".*install the package that provides it on every executor"):
        TorchModel("nosuchpkg.models:net", input_shape=(4,))
    with pytest.raises(FactoryError, match="has no attribute 'nope'"):
        TorchModel("tests.torch_models:nope", input_shape=(4,))
    with pytest.raises(FactoryError, match=r"Expect the torch module factory as 'package.module:function', got 'mlp'"):
        TorchModel("mlp", input_shape=(4,))
    with pytest.raises(ValueError, match="to return a torch.nn.Module, got str"):
        TorchModel("tests.torch_models:not_a_module", input_shape=(4,))
    with pytest.raises(ValueError, match=r"Expect the module to take inputs of shape \(batch, 3, 4, 4\): .*"
                                         r"RuntimeError: mat1 and mat2"):
        TorchModel("tests.torch_models:mlp", input_shape=(3, 4, 4))
    with pytest.raises(ValueError, match=r"Expect the module to return a \(batch, units\) tensor .* got \(2,\)"):
        TorchModel(lambda: torch.nn.Flatten(0), input_shape=(1,))
    with pytest.raises(ConfigError, match="FactoryError|Cannot import the torch module factory"):
        model_from_json(json.dumps({"type": "TorchModel", "factory": "nosuchpkg:f", "input_shape": [4]}))


def test_set_threads_limits_torch_too():
    from sparkavg.threads import set_threads

    before = torch.get_num_threads()
    try:
        set_threads(1)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_lenet_module_matches_the_native_lenet_layout():
    net = TorchModel(lenet, input_shape=(1, 28, 28), seed=1)
    assert net.num_params == 431_080 and net.units == 10
    assert net.to_config()["factory"] == "sparkavg.torch.zoo:lenet"


def test_resnet_and_lstm_modules_of_the_zoo():
    # The ResNet: examples/mnist_resnet.py's graph less its 144 conv biases (each before a BatchNorm);
    # its 6 BatchNorms' running means and variances (288) and batch counters (6) are the buffers.
    net = TorchModel("sparkavg.torch.zoo:resnet", input_shape=(1, 28, 28), seed=1)
    assert net.num_params == 43_914 - 144 and net.state["buffers"].size == 288 + 6 and net.units == 10
    x, y = np.random.default_rng(0).random((8, 1, 28, 28), dtype=np.float32), np.arange(8) % 10
    before = net.state["buffers"].copy()
    net.fit_batch(x, y)
    assert not np.array_equal(net.state["buffers"], before)  # running statistics moved
    # The LSTM reads an image's rows as 28 time steps of 28 pixels.
    rnn = TorchModel("sparkavg.torch.zoo:lstm", input_shape=(1, 28, 28), seed=1)
    assert rnn.num_params == 4 * 128 * (28 + 128 + 2) + 128 * 10 + 10
    rows = torch.from_numpy(x[:, 0])
    with torch.no_grad():
        steps, _ = rnn.module.lstm(rows)
        expected = torch.softmax(rnn.module.head(steps[:, -1]), 1).numpy()
    np.testing.assert_allclose(rnn.output(x), expected, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="divisible by 4"):
        TorchModel("sparkavg.torch.zoo:resnet", input_shape=(1, 30, 30), factory_kwargs={"size": 30})


def test_the_core_never_imports_torch_and_executors_import_it_by_type():
    code = textwrap.dedent("""
        import json, sys
        import numpy as np
        import sparkavg, sparkavg.nn, sparkavg.spark, sparkavg.ml
        from sparkavg.nn import Dense, Network, Output, model_from_json
        net = Network((4,), [Dense(3), Output(2)])
        net.fit_batch(np.zeros((2, 4), np.float32), np.array([0, 1]))
        before = "torch" in sys.modules
        torch_net = model_from_json(json.dumps({"type": "TorchModel", "factory": "tests.torch_models:mlp",
                                                "input_shape": [16]}))
        print(json.dumps({"before": before, "after": "torch" in sys.modules, "type": type(torch_net).__name__}))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"before": False, "after": True, "type": "TorchModel"}


@pytest.mark.gpu
def test_on_gpu_the_flat_vectors_are_cupy_and_steps_match_the_cpu():
    import cupy

    x, y = blobs(64, seed=16)
    cpu, gpu = _conv_bn(seed=17), _conv_bn(seed=17).to_gpu()
    assert isinstance(gpu.params, cupy.ndarray) and next(gpu.module.parameters()).is_cuda
    for _ in range(3):
        a, b = cpu.fit_batch(x, y), gpu.fit_batch(x, y)
        assert b == pytest.approx(a, rel=1e-4)
    np.testing.assert_allclose(cupy.asnumpy(gpu.params), cpu.params, rtol=1e-3, atol=1e-5)
    np.testing.assert_allclose(cupy.asnumpy(gpu.buffers), cpu.buffers, rtol=1e-3, atol=1e-5)
    np.testing.assert_allclose(cupy.asnumpy(gpu.output(x)), cpu.output(x), rtol=1e-3, atol=1e-5)
    loss = gpu.fit_batch(x, y, sync=False)
    assert isinstance(loss, cupy.ndarray) and loss.shape == ()
    back = gpu.to_cpu()
    assert isinstance(back.params, np.ndarray) and not next(back.module.parameters()).is_cuda
