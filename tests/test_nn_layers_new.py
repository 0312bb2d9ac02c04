"""BatchNorm, LayerNorm, Flatten, Reshape and the global poolings, standalone
(no Network, no Spark): float64 central-difference gradient checks of the
input and every parameter, BatchNorm's running statistics and modes, the
NCHW order of Flatten / Reshape, config round trips, argument and build
errors, the ownership rules, and (marked ``gpu``) CuPy against numpy."""
from __future__ import annotations

import math
import re

import numpy as np
import pytest

from sparkavg import backend
from sparkavg.configurable import from_config
from sparkavg.nn import BatchNorm, Flatten, GlobalAvgPool, GlobalMaxPool, LayerNorm, Reshape
from sparkavg.nn.layers import _internal_shape

from .gradients import central, relative_error

MAX_REL_ERROR = 1e-6


def bound(layer, input_shape, dtype=np.float64, seed=0, noise=0.3):
    """Build ``layer`` and bind fresh flat params / grads / buffers to it
    (params: initial values plus noise, so that gamma != 1)."""
    layer.build(input_shape)
    rng = np.random.default_rng(seed)
    pieces = [layer.initial_value(s, rng) + noise * rng.standard_normal(s.shape) for s in layer.param_specs()]
    params = np.concatenate([p.ravel() for p in pieces]).astype(dtype) if pieces else np.zeros(0, dtype)
    grads = np.zeros_like(params)
    bufs = [layer.initial_buffer(s) for s in layer.buffer_specs()]
    buffers = np.concatenate([b.ravel() for b in bufs]).astype(dtype) if bufs else np.zeros(0, dtype)
    assert params.size == sum(math.prod(s.shape) for s in layer.param_specs())
    layer.bind(params, grads)
    layer.bind_buffers(buffers)
    return params, grads, buffers


def check_gradients(layer, input_shape, n=3, seed=1, training=True):
    """loss = sum(R * forward(x, training)): back-propagated dL/dx and
    dL/dparams against central differences (buffers restored before each
    forward, since BatchNorm's running statistics move on every one)."""
    params, grads, buffers = bound(layer, input_shape, seed=seed)
    if not training:  # statistics as a trained layer's, not the initial 0 and 1
        buffers[:] = np.linspace(0.5, 2.0, buffers.size)
    rng = np.random.default_rng(seed + 1)
    x = rng.standard_normal((n, *_internal_shape(input_shape)))
    saved = buffers.copy()
    R = rng.standard_normal(layer.forward(x, training).shape)

    def loss(xv):
        buffers[...] = saved
        return float(np.sum(R * layer.forward(xv, training)))

    loss(x)
    dx = layer.backward(R.copy(), need_dx=True).copy()
    dparams = grads.copy()
    assert dx.shape == x.shape

    numeric_dx = central(lambda: loss(x), x)
    assert np.abs(dx).max() > 1e-6, "input gradient all zero: the check is vacuous"
    err = relative_error(dx.reshape(-1), numeric_dx)
    assert err < MAX_REL_ERROR, f"input gradient: relative error {err:.2e}"

    numeric_dp = central(lambda: loss(x), params)
    if params.size:
        err = relative_error(dparams, numeric_dp)
        assert err < MAX_REL_ERROR, f"parameter gradient: relative error {err:.2e}"

    # need_dx=False: the same parameter gradients, no input gradient.
    grads[...] = 0
    loss(x)
    assert layer.backward(R.copy(), need_dx=False) is None
    np.testing.assert_allclose(grads, dparams, rtol=1e-12, atol=1e-14)


CASES = [
    (BatchNorm, (5,)),
    (BatchNorm, (3, 4, 5)),
    (LayerNorm, (6,)),
    (LayerNorm, (3, 4, 5)),
    (Flatten, (6,)),
    (Flatten, (3, 4)),
    (Flatten, (3, 4, 5)),
    (lambda: Reshape((1, 4, 6)), (24,)),
    (lambda: Reshape((3, 8)), (2, 3, 4)),
    (lambda: Reshape((2, -1, 3)), (4, 3, 2)),
    (lambda: Reshape(60), (3, 4, 5)),
    (GlobalAvgPool, (3, 4, 5)),
    (GlobalAvgPool, (5, 3)),
    (GlobalMaxPool, (3, 4, 5)),
    (GlobalMaxPool, (5, 3)),
]


def _case_id(case):
    make, shape = case
    return f"{make().__class__.__name__}-{'x'.join(map(str, shape))}"


@pytest.mark.parametrize("make,input_shape", CASES, ids=[_case_id(c) for c in CASES])
def test_gradients_match_central_differences(make, input_shape):
    check_gradients(make(), input_shape)


def test_batchnorm_gradient_with_small_batch_and_momentum_zero():
    check_gradients(BatchNorm(momentum=0.0, eps=1e-3), (4,), n=2)


@pytest.mark.parametrize("input_shape", [(5,), (3, 4, 5)])
def test_batchnorm_gradient_in_inference_mode_treats_the_running_statistics_as_constants(input_shape):
    """A frozen BatchNorm fine-tuned through (forward with training=False):
    dx = gamma * dy / sqrt(running_var + eps), and gamma's and beta's
    gradients of the affine map with the running statistics."""
    check_gradients(BatchNorm(), input_shape, training=False)


# ------------------------------------------------------------- BatchNorm
def _normalised(x, mean, var, gamma, beta, eps):
    return gamma * (x - mean) / np.sqrt(var + eps) + beta


@pytest.mark.parametrize("input_shape", [(4,), (3, 5, 2)])
def test_batchnorm_running_statistics_are_the_exponential_average(input_shape):
    layer = BatchNorm(momentum=0.8)
    _, _, buffers = bound(layer, input_shape)
    c = input_shape[0]
    np.testing.assert_array_equal(buffers, np.r_[np.zeros(c), np.ones(c)])
    rng = np.random.default_rng(3)
    mean, var = np.zeros(c), np.ones(c)
    for step in range(4):
        x = 2.0 + 3.0 * rng.standard_normal((5 + step, *_internal_shape(input_shape)))
        y = layer.forward(x, True)
        rows = x.reshape(-1, c)
        mean = 0.8 * mean + 0.2 * rows.mean(axis=0)
        var = 0.8 * var + 0.2 * rows.var(axis=0, ddof=1)
        # training mode normalises with the batch's (biased) statistics
        want = _normalised(rows, rows.mean(axis=0), rows.var(axis=0), layer.gamma, layer.beta, layer.eps)
        np.testing.assert_allclose(y.reshape(-1, c), want, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(layer.running_mean, mean, rtol=1e-12)
    np.testing.assert_allclose(layer.running_var, var, rtol=1e-12)
    np.testing.assert_array_equal(buffers, np.r_[layer.running_mean, layer.running_var])  # views of the buffers

    x = rng.standard_normal((6, *_internal_shape(input_shape)))
    before = buffers.copy()
    y_eval = layer.forward(x, False).copy()
    np.testing.assert_array_equal(buffers, before)  # inference leaves the statistics alone
    want = _normalised(x.reshape(-1, c), mean, var, layer.gamma, layer.beta, layer.eps)
    np.testing.assert_allclose(y_eval.reshape(-1, c), want, rtol=1e-10, atol=1e-12)
    y_train = layer.forward(x, True)
    assert np.abs(y_train - y_eval).max() > 1e-3, "training mode must use the batch statistics"


def test_batchnorm_single_value_per_channel_keeps_the_running_variance():
    layer = BatchNorm()
    bound(layer, (3,))
    x = np.array([[1.0, 2.0, 3.0]])
    y = layer.forward(x, True)
    np.testing.assert_allclose(y[0], layer.beta)
    np.testing.assert_allclose(layer.running_mean, 0.1 * x[0])
    np.testing.assert_array_equal(layer.running_var, np.ones(3))


def test_batchnorm_float32_statistics_are_accurate():
    """A ResNet-sized float32 batch (64, 28, 28, 16) off zero: the float32
    sums still give the float64 result to float32 precision."""
    layer = BatchNorm()
    bound(layer, (16, 28, 28), dtype=np.float32)
    x = (5.0 + np.random.default_rng(0).standard_normal((64, 28, 28, 16))).astype(np.float32)
    y = layer.forward(x, True)
    rows = x.reshape(-1, 16).astype(np.float64)
    want = _normalised(rows, rows.mean(axis=0), rows.var(axis=0), layer.gamma.astype(np.float64),
                       layer.beta.astype(np.float64), layer.eps)
    assert y.dtype == np.float32
    np.testing.assert_allclose(y.reshape(-1, 16), want, atol=2e-4)


@pytest.mark.parametrize("make", [BatchNorm, LayerNorm])
@pytest.mark.parametrize("input_shape", [(7,), (4, 5, 6)])
def test_float32_kernels_agree_with_the_float64_path(make, input_shape):
    """float32 runs the Cython kernels (when built), float64 the numpy twins
    the gradient checks verified: forward, backward and running statistics agree."""
    rng = np.random.default_rng(11)
    x = (2.0 + rng.standard_normal((6, *_internal_shape(input_shape)))).astype(np.float32)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    results = []
    for dtype in (np.float32, np.float64):
        layer = make()
        _, grads, buffers = bound(layer, input_shape, dtype=dtype, seed=4)
        y = layer.forward(x.astype(dtype), True).copy()
        dx = layer.backward(dy.astype(dtype), need_dx=True).copy()
        y_eval = layer.forward(x.astype(dtype), False).copy()
        results.append((y, dx, grads.copy(), buffers.copy(), y_eval))
    for what, a, b in zip(("output", "input gradient", "parameter gradient", "buffers", "eval output"),
                          *results):
        assert a.dtype == np.float32
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-5, err_msg=what)


# ------------------------------------------------------------- LayerNorm
def test_layernorm_normalises_each_example_over_all_its_values():
    layer = LayerNorm()
    bound(layer, (3, 4, 5))
    x = 1.0 + 2.0 * np.random.default_rng(4).standard_normal((2, 4, 5, 3))
    y = layer.forward(x, True)
    rows = x.reshape(2, -1)
    xhat = (rows - rows.mean(axis=1, keepdims=True)) / np.sqrt(rows.var(axis=1, keepdims=True) + layer.eps)
    want = xhat.reshape(x.shape) * layer.gamma + layer.beta  # per channel (channels last)
    np.testing.assert_allclose(y, want, rtol=1e-10, atol=1e-12)
    np.testing.assert_array_equal(layer.forward(x, False), y)  # no running statistics
    assert layer.buffer_specs() == []


# ------------------------------------------------------ Flatten / Reshape
def test_flatten_orders_values_as_nchw():
    layer = Flatten()
    assert layer.build((3, 4, 5)) == (60,)
    x = np.random.default_rng(5).standard_normal((2, 3, 4, 5))  # users' NCHW
    y = layer.forward(np.ascontiguousarray(x.transpose(0, 2, 3, 1)), True)
    np.testing.assert_array_equal(y, x.reshape(2, 60))


def test_reshape_turns_a_flat_input_into_an_image_and_flatten_inverts_it():
    images = np.random.default_rng(6).standard_normal((2, 3, 4, 5))  # NCHW
    flat = images.reshape(2, 60)
    to_image, back = Reshape((3, 4, 5)), Flatten()
    assert to_image.build((60,)) == (3, 4, 5) and back.build((3, 4, 5)) == (60,)
    inside = to_image.forward(flat, True)
    np.testing.assert_array_equal(inside, images.transpose(0, 2, 3, 1))  # channels last inside
    np.testing.assert_array_equal(back.forward(inside, True), flat)

    mnist = Reshape((1, 28, 28))
    assert mnist.build((784,)) == (1, 28, 28)
    x = np.arange(2 * 784, dtype=np.float64).reshape(2, 784)
    np.testing.assert_array_equal(mnist.forward(x, True), x.reshape(2, 28, 28, 1))


def test_reshape_infers_minus_one_and_reshapes_images_in_nchw_order():
    layer = Reshape((2, -1, 3))
    assert layer.build((4, 3, 2)) == (2, 4, 3)
    x = np.random.default_rng(7).standard_normal((2, 4, 3, 2))  # NCHW
    y = layer.forward(np.ascontiguousarray(x.transpose(0, 2, 3, 1)), True)
    np.testing.assert_array_equal(y, x.reshape(2, 2, 4, 3).transpose(0, 2, 3, 1))


# --------------------------------------------------------- global pooling
def test_global_pools_reduce_over_space_and_time():
    rng = np.random.default_rng(8)
    x = rng.standard_normal((2, 3, 4, 5))  # NCHW
    inside = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    avg, mx = GlobalAvgPool(), GlobalMaxPool()
    assert avg.build((3, 4, 5)) == (3,) and mx.build((3, 4, 5)) == (3,)
    np.testing.assert_allclose(avg.forward(inside, True), x.mean(axis=(2, 3)), rtol=1e-12)
    np.testing.assert_array_equal(mx.forward(inside, True), x.max(axis=(2, 3)))
    seq = rng.standard_normal((2, 6, 4))  # (N, T, F)
    assert avg.build((6, 4)) == (4,) and mx.build((6, 4)) == (4,)
    np.testing.assert_allclose(avg.forward(seq, True), seq.mean(axis=1), rtol=1e-12)
    np.testing.assert_array_equal(mx.forward(seq, True), seq.max(axis=1))


def test_global_max_pool_gradient_goes_to_the_first_maximum():
    layer = GlobalMaxPool()
    layer.build((4, 2))  # (T, F)
    x = np.array([[[1.0, 5.0], [3.0, 5.0], [3.0, 2.0], [0.0, 5.0]]])
    np.testing.assert_array_equal(layer.forward(x, True), [[3.0, 5.0]])
    dx = layer.backward(np.array([[10.0, 20.0]]), need_dx=True)
    np.testing.assert_array_equal(dx, [[[0.0, 20.0], [10.0, 0.0], [0.0, 0.0], [0.0, 0.0]]])


# --------------------------------------------------------- configuration
ALL = [BatchNorm(momentum=0.99, eps=1e-3), LayerNorm(eps=1e-4), Flatten(), Reshape((1, 28, 28)),
       Reshape((4, -1)), GlobalAvgPool(), GlobalMaxPool()]


@pytest.mark.parametrize("layer", ALL, ids=repr)
def test_config_round_trip(layer):
    config = layer.to_config()
    again = from_config(config, kind="layer")
    assert type(again) is type(layer) and again.to_config() == config
    assert again.config_arguments() == layer.config_arguments()


@pytest.mark.parametrize("make,message", [
    (lambda: BatchNorm(momentum=1.0), "Expect momentum with 0 <= momentum < 1, got 1.0"),
    (lambda: BatchNorm(momentum=-0.1), "Expect momentum with 0 <= momentum < 1, got -0.1"),
    (lambda: BatchNorm(momentum="0.9"), "Expect momentum"),
    (lambda: BatchNorm(momentum=True), "Expect momentum"),
    (lambda: BatchNorm(eps=0.0), "Expect eps as a finite float > 0, got 0.0"),
    (lambda: BatchNorm(eps=float("inf")), "Expect eps as a finite float > 0, got inf"),
    (lambda: LayerNorm(eps=-1e-5), "Expect eps as a finite float > 0, got -1e-05"),
    (lambda: LayerNorm(eps=None), "Expect eps as a finite float > 0, got None"),
    (lambda: Reshape((0, 4)), "Expect shape as 1 to 3 ints >= 1 (at most one -1), got (0, 4)"),
    (lambda: Reshape((1, 2, 3, 4)), "Expect shape as 1 to 3 ints >= 1"),
    (lambda: Reshape((-1, -1)), "Expect shape as 1 to 3 ints >= 1 (at most one -1), got (-1, -1)"),
    (lambda: Reshape((2.5,)), "Expect shape as 1 to 3 ints >= 1"),
    (lambda: Reshape("12"), "Expect shape as 1 to 3 ints >= 1"),
    (lambda: Reshape((True,)), "Expect shape as 1 to 3 ints >= 1"),
    (lambda: Reshape(()), "Expect shape as 1 to 3 ints >= 1"),
])
def test_bad_arguments_are_named(make, message):
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        make()


@pytest.mark.parametrize("layer,input_shape,message", [
    (BatchNorm(), (3, 4), "Expect a (features,) or (C, H, W) input to BatchNorm, got shape (3, 4)"),
    (LayerNorm(), (1, 2, 3, 4), "Expect a (features,) or (C, H, W) input to LayerNorm, got shape (1, 2, 3, 4)"),
    (Flatten(), (1, 2, 3, 4), "Expect a (features,), (T, F) or (C, H, W) input to Flatten, got shape"),
    (Reshape((5,)), (4,), "Expect an input of 1 to 3 dims with the size of shape (5,), got shape (4,) (size 4)"),
    (Reshape((-1, 3)), (4,), "Expect an input of 1 to 3 dims with the size of shape (-1, 3), got shape (4,)"),
    (Reshape((4,)), (1, 1, 2, 2), "Expect an input of 1 to 3 dims"),
    (GlobalAvgPool(), (5,), "Expect a (C, H, W) or (T, F) input to GlobalAvgPool, got shape (5,)"),
    (GlobalMaxPool(), (1, 2, 3, 4), "Expect a (C, H, W) or (T, F) input to GlobalMaxPool, got shape"),
])
def test_build_rejects_wrong_input_ranks(layer, input_shape, message):
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        layer.build(input_shape)


# ------------------------------------------------------------- ownership
@pytest.mark.parametrize("make,input_shape", CASES, ids=[_case_id(c) for c in CASES])
def test_forward_and_backward_leave_the_input_alone(make, input_shape):
    """forward never writes into x, and backward (which may overwrite the dy
    it is handed) never writes into the x of the forward pass either."""
    layer = make()
    bound(layer, input_shape)
    rng = np.random.default_rng(9)
    x = rng.standard_normal((4, *_internal_shape(input_shape)))
    x_before = x.copy()
    y = layer.forward(x, True)
    np.testing.assert_array_equal(x, x_before)
    y_before = y.copy()
    layer.backward(rng.standard_normal(y.shape), need_dx=True)
    np.testing.assert_array_equal(x, x_before)
    np.testing.assert_array_equal(y, y_before)
    layer.forward(x, False)
    np.testing.assert_array_equal(x, x_before)


# ------------------------------------------------------------------ CuPy
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("make,input_shape", CASES, ids=[_case_id(c) for c in CASES])
def test_cupy_matches_numpy(make, input_shape, training, dtype):
    rng = np.random.default_rng(10)
    x = rng.standard_normal((5, *_internal_shape(input_shape))).astype(dtype)
    probe = make()
    probe.build(input_shape)
    dy = rng.standard_normal((5, *_internal_shape(probe.output_shape))).astype(dtype)
    results = {}
    for name, to_device in (("numpy", np.asarray), ("cupy", backend.to_gpu)):
        layer = make()
        params, grads, buffers = bound(layer, input_shape, dtype=dtype, seed=2)
        params, grads, buffers = to_device(params), to_device(grads), to_device(buffers)
        layer.bind(params, grads)
        layer.bind_buffers(buffers)
        y = layer.forward(to_device(x), training)
        assert backend.is_gpu_array(y) == (name == "cupy")
        y = backend.to_cpu(y).copy()
        dx = backend.to_cpu(layer.backward(to_device(dy.copy()), need_dx=True))
        results[name] = (y, dx, backend.to_cpu(grads), backend.to_cpu(buffers))
    tol = dict(rtol=1e-9, atol=1e-10) if dtype == np.float64 else dict(rtol=1e-4, atol=1e-4)
    for what, a, b in zip(("output", "input gradient", "parameter gradient", "buffers"),
                          results["numpy"], results["cupy"]):
        np.testing.assert_allclose(b, a, err_msg=what, **tol)
