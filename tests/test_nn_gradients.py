"""float64 central-difference gradient checks for every layer type, the
losses, L2, and a small LeNet-shaped network."""
from __future__ import annotations

import numpy as np
import pytest

from sparkavg.nn import (SGD, Activation, AvgPool2D, Conv2D, Dense, Dropout, MaxPool2D, Network,
                         Output)

from .gradients import parameter_central


def _loss(net, x, y, dropout_seed=None):
    """Training-mode loss at the current params (dropout masks replayed)."""
    if dropout_seed is not None:
        for layer in net.layers:
            if isinstance(layer, Dropout):
                layer.reseed(dropout_seed)
    return net.gradient(x, y)[0]


def check_gradient(net, x, y, dropout_seed=None, max_params=400, seed=0):
    """Compare back-propagation with central differences on (a sample of) all params."""
    loss, grad = (lambda: (_loss(net, x, y, dropout_seed), net.flat.grads.copy()))()
    n = net.num_params
    rng = np.random.default_rng(seed)
    idx = np.arange(n) if n <= max_params else rng.choice(n, max_params, replace=False)
    numeric = parameter_central(net, lambda: _loss(net, x, y, dropout_seed), idx)
    analytic = grad[idx]
    assert np.isfinite(loss)
    assert np.abs(analytic).max() > 1e-6, "gradient is all zero: check is vacuous"
    np.testing.assert_allclose(analytic, numeric, rtol=1e-5, atol=1e-8,
                               err_msg="back-propagated gradient disagrees with central differences")


def _data(shape, n=4, classes=3, seed=1):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, *shape)), rng.integers(0, classes, n)


def _net(input_shape, hidden, out=None, **kw):
    out = out or Output(3)
    return Network(input_shape, [*hidden, out], updater=SGD(0.1), dtype="float64", seed=7, **kw)


@pytest.mark.parametrize("activation", ["identity", "relu", "leaky_relu", "tanh", "sigmoid"])
def test_dense_gradient(activation):
    x, y = _data((6,))
    check_gradient(_net((6,), [Dense(5, activation=activation)]), x, y)


@pytest.mark.parametrize("stride,padding,activation", [(1, 0, "identity"), (2, 1, "tanh"), ((1, 2), (0, 1), "relu")])
def test_conv2d_gradient(stride, padding, activation):
    x, y = _data((2, 7, 6))
    net = _net((2, 7, 6), [Conv2D(3, (3, 2), stride=stride, padding=padding, activation=activation),
                           Conv2D(2, 2, activation="sigmoid")])
    check_gradient(net, x, y)


def test_wide_conv_gradient():
    """Many filters for a small patch (K+1 < 2F): the untransposed dW GEMM path."""
    x, y = _data((1, 6, 6))
    net = _net((1, 6, 6), [Conv2D(8, 2, activation="tanh"), Conv2D(20, 2, activation="tanh")])
    assert [(layer._dWb.shape[0] < 2 * layer._dWb.shape[1]) for layer in net.layers[:2]] == [True, True]
    check_gradient(net, x, y)


def test_pointwise_conv_gradient():
    x, y = _data((3, 4, 4))
    check_gradient(_net((3, 4, 4), [Conv2D(2, 1), Conv2D(2, 3)]), x, y)


@pytest.mark.parametrize("pool_size,stride", [(2, None), (3, 1), ((2, 3), (1, 2))])
def test_maxpool_gradient(pool_size, stride):
    x, y = _data((2, 7, 7))
    net = _net((2, 7, 7), [Conv2D(2, 2, activation="tanh"), MaxPool2D(pool_size, stride)])
    check_gradient(net, x, y)


@pytest.mark.parametrize("pool_size,stride", [(2, None), (3, 2)])
def test_avgpool_gradient(pool_size, stride):
    x, y = _data((2, 7, 7))
    net = _net((2, 7, 7), [Conv2D(2, 2, activation="tanh"), AvgPool2D(pool_size, stride)])
    check_gradient(net, x, y)


@pytest.mark.parametrize("name", ["identity", "relu", "leaky_relu", "tanh", "sigmoid", "softmax"])
def test_activation_layer_gradient(name):
    x, y = _data((5,))
    check_gradient(_net((5,), [Dense(4, activation="identity"), Activation(name)]), x, y)


def test_dropout_gradient_with_fixed_mask():
    x, y = _data((6,), n=8)
    net = _net((6,), [Dense(8, activation="tanh"), Dropout(0.4), Dense(5, activation="tanh")])
    check_gradient(net, x, y, dropout_seed=3)


def test_output_nll_one_hot_and_soft_labels():
    x, y = _data((5,))
    net = _net((5,), [Dense(4, activation="tanh")])
    check_gradient(net, x, np.eye(3)[y])
    soft = np.random.default_rng(2).dirichlet(np.ones(3), size=4)
    check_gradient(net, x, soft)


@pytest.mark.parametrize("activation", ["identity", "tanh", "sigmoid"])
def test_output_mse_gradient(activation):
    x, _ = _data((5,))
    target = np.random.default_rng(3).standard_normal((4, 2))
    net = _net((5,), [Dense(4, activation="relu")], out=Output(2, activation=activation, loss="mse"))
    check_gradient(net, x, target)


def test_l2_and_l2_bias_gradient():
    x, y = _data((2, 6, 6))
    net = _net((2, 6, 6), [Conv2D(2, 3, activation="tanh"), Dense(4, activation="tanh")],
               l2=0.3, l2_bias=0.2)
    check_gradient(net, x, y)
    # The penalty is in the loss: zero l2 gives a smaller loss on the same params.
    plain = _net((2, 6, 6), [Conv2D(2, 3, activation="tanh"), Dense(4, activation="tanh")])
    plain.params = net.params
    assert net.score(x, y) > plain.score(x, y)


def test_small_lenet_shaped_network_gradient():
    x, y = _data((1, 12, 12), n=3, classes=4)
    net = _net((1, 12, 12), [Conv2D(4, 3), MaxPool2D(2), Conv2D(5, 3, padding=1), MaxPool2D(2),
                             Dense(8, activation="relu")], out=Output(4), l2=1e-2)
    check_gradient(net, x.reshape(3, 144), y)  # flat inputs, as a loader delivers them


def test_multichannel_nchw_input_gradient():
    # C > 1: the NCHW -> channels-last transpose must be consistent with the gradient.
    x, y = _data((3, 5, 4))
    check_gradient(_net((3, 5, 4), [Conv2D(2, 2, activation="tanh"), Dense(3, activation="tanh")]), x, y)
