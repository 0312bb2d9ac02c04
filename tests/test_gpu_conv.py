"""The raw CUDA conv/pool kernels on the device (skipped without CUDA).

Through the front (``sparkavg.ops`` routes CuPy arrays to
:mod:`sparkavg.ops._cuda_conv`): im2col and max pooling equal the numpy
reference bit for bit; the sums (col2im, pool backward, average pooling)
equal the Cython kernels bit for bit in float32 (same order of additions,
no FMA) and the reference closely; float64 runs too.  The same kernel
bodies are checked without a GPU by tests/test_cuda_sources.py.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkavg import backend, ops
from sparkavg.ops import _cython, reference

from .strategies import conv_geometry

pytestmark = pytest.mark.gpu

some = settings(max_examples=40, deadline=None)


def geometry(padding=True):
    return conv_geometry(padding=padding, batches=(0, 1, 2, 3), max_side=13)


def host(a):
    return backend.to_cpu(a)


def gpu(a):
    return backend.to_gpu(a)


def same_bits(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def rand(shape, seed, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


@some
@given(geometry(), st.booleans(), st.sampled_from([np.float32, np.float64]))
def test_im2col_col2im(case, ones, dtype):
    shape, g, seed = case
    x = rand(shape, seed, dtype)
    cols = ops.im2col(gpu(x), *g, ones_column=ones)
    assert backend.is_gpu_array(cols)
    assert same_bits(host(cols), reference.im2col(x, *g, ones_column=ones))
    k = g[0] * g[1] * shape[3]
    c = rand((cols.shape[0], k), seed + 1, dtype)
    got = host(ops.col2im(gpu(c), *g, out=gpu(np.full(shape, np.nan, dtype))))
    np.testing.assert_allclose(got, reference.col2im(c, *g, out=np.empty(shape, dtype)),
                               rtol=1e-5, atol=1e-5)
    if dtype == np.float32:
        assert same_bits(got, _cython.col2im(c, *g, np.empty(shape, dtype)))


@some
@given(geometry(padding=False), st.sampled_from([np.float32, np.float64]))
def test_pooling(case, dtype):
    shape, (kh, kw, sh, sw, _, _), seed = case
    x = rand(shape, seed, dtype)
    x[..., 0] = np.round(x[..., 0])  # ties
    out, arg = ops.maxpool_forward(gpu(x), kh, kw, sh, sw)
    want_out, want_arg = reference.maxpool_forward(x, kh, kw, sh, sw)
    assert same_bits(host(out), want_out) and same_bits(host(arg), want_arg)
    dout = rand(want_out.shape, seed + 1, dtype)
    dx = host(ops.maxpool_backward(gpu(dout), arg, kh, kw, sh, sw,
                                   out=gpu(np.full(shape, np.nan, dtype))))
    np.testing.assert_allclose(
        dx, reference.maxpool_backward(dout, want_arg, kh, kw, sh, sw, out=np.empty(shape, dtype)),
        rtol=1e-6, atol=1e-6)
    avg = host(ops.avgpool_forward(gpu(x), kh, kw, sh, sw))
    np.testing.assert_allclose(avg, reference.avgpool_forward(x, kh, kw, sh, sw),
                               rtol=1e-5, atol=1e-6)
    davg = host(ops.avgpool_backward(gpu(dout), kh, kw, sh, sw,
                                     out=gpu(np.full(shape, np.nan, dtype))))
    np.testing.assert_allclose(
        davg, reference.avgpool_backward(dout, kh, kw, sh, sw, out=np.empty(shape, dtype)),
        rtol=1e-5, atol=1e-6)
    if dtype == np.float32 and shape[0]:
        assert same_bits(dx, _cython.maxpool_backward(dout, want_arg, kh, kw, sh, sw,
                                                      np.empty(shape, dtype)))
        assert same_bits(avg, _cython.avgpool_forward(x, kh, kw, sh, sw))
        assert same_bits(davg, _cython.avgpool_backward(dout, kh, kw, sh, sw,
                                                        np.empty(shape, dtype)))


@pytest.mark.parametrize("batch", [1, 64, 1024])
def test_lenet_layer_shapes(batch):
    """LeNet's two conv + pool stages at the benchmark's batch sizes."""
    x = rand((batch, 28, 28, 1), batch)
    for c_in, c_out in ((1, 20), (20, 50)):
        if c_in == 20:
            x = rand((batch, 12, 12, 20), batch + 1)
        cols = ops.im2col(gpu(x), 5, 5, 1, 1, 0, 0, ones_column=True)
        assert same_bits(host(cols), _cython.im2col(x, 5, 5, 1, 1, 0, 0, None, True))
        n, h, w, _ = x.shape
        conv = rand((n, h - 4, w - 4, c_out), batch + 2)
        out, arg = ops.maxpool_forward(gpu(conv), 2, 2, 2, 2)
        want_out, want_arg = _cython.maxpool_forward(conv, 2, 2, 2, 2)
        assert same_bits(host(out), want_out) and same_bits(host(arg), want_arg)
        dout = rand(want_out.shape, batch + 3)
        dx = ops.maxpool_backward(gpu(dout), arg, 2, 2, 2, 2, out=gpu(np.empty_like(conv)))
        assert same_bits(host(dx), _cython.maxpool_backward(dout, want_arg, 2, 2, 2, 2,
                                                            np.empty_like(conv)))
        dcols = rand((cols.shape[0], cols.shape[1] - 1), batch + 4)
        back = ops.col2im(gpu(dcols), 5, 5, 1, 1, 0, 0, out=gpu(np.empty_like(x)))
        assert same_bits(host(back), _cython.col2im(dcols, 5, 5, 1, 1, 0, 0, np.empty_like(x)))


def test_kernels_run_on_the_current_stream():
    """Launched on the current (here non-blocking) stream: ordered after the
    upload queued on it, done once that stream is synchronised."""
    cp = backend.cupy()
    x = rand((8, 28, 28, 1), 3)
    with cp.cuda.Stream(non_blocking=True) as stream:
        d = gpu(x)
        cols = ops.im2col(d, 5, 5, 1, 1, 0, 0)
        _, arg = ops.maxpool_forward(d, 2, 2, 2, 2)
        stream.synchronize()
    assert same_bits(host(cols), _cython.im2col(x, 5, 5, 1, 1, 0, 0))
    assert same_bits(host(arg), _cython.maxpool_forward(x, 2, 2, 2, 2)[1])


def test_network_step_on_device_matches_host():
    """A LeNet step on the GPU lands where the CPU's does (GEMMs differ in
    rounding: close, not equal)."""
    from sparkavg.nn import Adam, lenet

    rng = np.random.default_rng(0)
    x = rng.random((16, 1, 28, 28), dtype=np.float32)
    y = rng.integers(0, 10, size=16)
    cpu = lenet(seed=5, updater=Adam(lr=1e-3))
    dev = lenet(seed=5, updater=Adam(lr=1e-3)).to_gpu()
    for _ in range(3):
        loss_cpu = cpu.fit_batch(x, y)
        loss_dev = dev.fit_batch(gpu(x), gpu(y))
    assert loss_dev == pytest.approx(loss_cpu, rel=1e-3)
    np.testing.assert_allclose(host(dev.params), cpu.params, rtol=1e-3, atol=1e-4)
