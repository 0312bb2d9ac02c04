"""Convolution and pooling kernels: the Cython kernels (float32) against
their numpy twins (hypothesis, bit for bit where no sums are reordered),
the twins against plain loops (float64: what gradient checks run), the
adjoint identity <im2col(x), c> = <x, col2im(c)>, and argument checks that
are the same on every path."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sparkavg import ops
from sparkavg.ops import reference

from .strategies import conv_geometry


@st.composite
def geometry(draw, padding=True, dtype=np.float32):
    n = draw(st.integers(0, 3))
    c = draw(st.integers(1, 4))
    kh, kw = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    sh, sw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    ph = draw(st.integers(0, kh - 1)) if padding else 0
    pw = draw(st.integers(0, kw - 1)) if padding else 0
    h = draw(st.integers(max(1, kh - 2 * ph), 9))
    w = draw(st.integers(max(1, kw - 2 * pw), 9))
    seed = draw(st.integers(0, 2**32 - 1))
    x = np.random.default_rng(seed).standard_normal((n, h, w, c)).astype(dtype)
    return x, (kh, kw, sh, sw, ph, pw)


def out_size(size, k, s, p):
    return (size + 2 * p - k) // s + 1


# --------------------------------------------------- plain-loop definitions
def loop_im2col(x, kh, kw, sh, sw, ph, pw):
    n, h, w, c = x.shape
    oh, ow = out_size(h, kh, sh, ph), out_size(w, kw, sw, pw)
    cols = np.zeros((n * oh * ow, kh * kw * c), x.dtype)
    for b in range(n):
        for r in range(oh):
            for q in range(ow):
                for i in range(kh):
                    for j in range(kw):
                        ih, iw = r * sh - ph + i, q * sw - pw + j
                        if 0 <= ih < h and 0 <= iw < w:
                            start = (i * kw + j) * c
                            cols[(b * oh + r) * ow + q, start:start + c] = x[b, ih, iw]
    return cols


def loop_pool(x, kh, kw, sh, sw):
    """(max, first argmax as a flat (H, W, C) index, mean) of every window."""
    n, h, w, c = x.shape
    oh, ow = out_size(h, kh, sh, 0), out_size(w, kw, sw, 0)
    best = np.empty((n, oh, ow, c), x.dtype)
    arg = np.empty((n, oh, ow, c), np.int32)
    mean = np.empty((n, oh, ow, c), x.dtype)
    for b in range(n):
        for r in range(oh):
            for q in range(ow):
                for ch in range(c):
                    cells = [(r * sh + i, q * sw + j) for i in range(kh) for j in range(kw)]
                    values = [x[b, ih, iw, ch] for ih, iw in cells]
                    k = int(np.argmax(values))  # the first maximum
                    best[b, r, q, ch] = values[k]
                    arg[b, r, q, ch] = (cells[k][0] * w + cells[k][1]) * c + ch
                    mean[b, r, q, ch] = np.mean(values)
    return best, arg, mean


# ----------------------------------------------- Cython == numpy twin (f32)
needs_extension = pytest.mark.skipif(not ops.have_extension(), reason="sparkavg_ext not built")


@needs_extension
@given(geometry(), st.booleans())
def test_im2col_matches_twin(case, ones):
    x, (kh, kw, sh, sw, ph, pw) = case
    fast = ops.im2col(x, kh, kw, sh, sw, ph, pw, ones_column=ones)
    slow = reference.im2col(x, kh, kw, sh, sw, ph, pw, ones_column=ones)
    assert fast.dtype == np.float32
    assert fast.shape[1] == kh * kw * x.shape[3] + ones
    np.testing.assert_array_equal(fast, slow)
    if ones:
        assert np.all(fast[:, -1] == 1)


@needs_extension
@given(geometry())
def test_col2im_matches_twin_and_is_adjoint(case):
    x, (kh, kw, sh, sw, ph, pw) = case
    cols = ops.im2col(x, kh, kw, sh, sw, ph, pw)
    c = np.random.default_rng(0).standard_normal(cols.shape).astype(np.float32)
    fast = ops.col2im(c, kh, kw, sh, sw, ph, pw, out=np.full_like(x, np.nan))
    slow = reference.col2im(c, kh, kw, sh, sw, ph, pw, out=np.empty_like(x))
    np.testing.assert_allclose(fast, slow, rtol=1e-5, atol=1e-5)
    lhs = float(np.dot(cols.ravel().astype(np.float64), c.ravel()))
    rhs = float(np.dot(x.ravel().astype(np.float64), fast.ravel()))
    assert lhs == pytest.approx(rhs, rel=1e-4, abs=1e-4)


@needs_extension
@given(geometry(padding=False))
def test_maxpool_matches_twin(case):
    x, (kh, kw, sh, sw, _, _) = case
    out, arg = ops.maxpool_forward(x, kh, kw, sh, sw)
    want_out, want_arg = reference.maxpool_forward(x, kh, kw, sh, sw)
    np.testing.assert_array_equal(out, want_out)
    np.testing.assert_array_equal(arg, want_arg)
    dout = np.random.default_rng(1).standard_normal(out.shape).astype(np.float32)
    dx = ops.maxpool_backward(dout, arg, kh, kw, sh, sw, out=np.full_like(x, np.nan))
    want = reference.maxpool_backward(dout, arg, kh, kw, sh, sw, out=np.empty_like(x))
    np.testing.assert_allclose(dx, want, rtol=1e-6, atol=1e-6)


@needs_extension
@given(geometry(padding=False))
def test_avgpool_matches_twin(case):
    x, (kh, kw, sh, sw, _, _) = case
    out = ops.avgpool_forward(x, kh, kw, sh, sw)
    np.testing.assert_allclose(out, reference.avgpool_forward(x, kh, kw, sh, sw),
                               rtol=1e-5, atol=1e-5)
    dout = np.random.default_rng(1).standard_normal(out.shape).astype(np.float32)
    dx = ops.avgpool_backward(dout, kh, kw, sh, sw, out=np.full_like(x, np.nan))
    want = reference.avgpool_backward(dout, kh, kw, sh, sw, out=np.empty_like(x))
    np.testing.assert_allclose(dx, want, rtol=1e-5, atol=1e-5)


@needs_extension
def test_maxpool_ties_go_to_first_and_nan_is_safe():
    x = np.zeros((1, 2, 2, 1), np.float32)
    out, arg = ops.maxpool_forward(x, 2, 2, 2, 2)
    assert arg.ravel().tolist() == [0]
    x[0, 1, 1, 0] = np.nan
    x[0, 0, 0, 0] = np.nan
    out, arg = ops.maxpool_forward(x, 2, 2, 2, 2)
    assert 0 <= arg.ravel()[0] < 4  # a valid index even when nothing compares equal


# ------------------------------- direct stride-1 convolution == its twin
@st.composite
def direct_case(draw, dtype=np.float32):
    """x, weights, bias (or None), dy and padding of a stride-1 convolution:
    channel counts that fill 16-lane vectors, leave a masked tail or fill
    one lane; widths up to 31 (several pixel tiles and a short last one)."""
    (n, h, w, c), (kh, kw, _, _, ph, pw), seed = draw(conv_geometry(
        batches=(0, 1, 2, 3), channels=(1, 3, 16, 20, 33), max_side=31))
    f = draw(st.sampled_from((1, 5, 16, 20, 32, 33, 50)))
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, h, w, c)).astype(dtype)
    weights = rng.standard_normal((kh, kw, c, f)).astype(dtype)
    bias = rng.standard_normal(f).astype(dtype) if draw(st.booleans()) else None
    oh, ow = out_size(h, kh, 1, ph), out_size(w, kw, 1, pw)
    dy = rng.standard_normal((n, oh, ow, f)).astype(dtype)
    return x, weights, bias, dy, (ph, pw)


def _f64(a):
    return None if a is None else a.astype(np.float64)


@needs_extension
@given(direct_case(), st.sampled_from((1, 2)))
def test_direct_conv_matches_twin(case, n_threads):
    # float32 kernels (direct where the CPU has AVX-512) against the twin in
    # float64; tolerance: float32 rounding of sums of K = KH*KW*C (or N*OH*OW)
    # products of standard normals.
    x, weights, bias, dy, (ph, pw) = case
    kh, kw, c, f = weights.shape
    y = ops.conv2d_forward(x, weights, bias, ph, pw, out=np.full(dy.shape, np.nan, np.float32),
                           n_threads=n_threads)
    want = reference.conv2d_forward(_f64(x), _f64(weights), _f64(bias), ph, pw)
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-5 * kh * kw * c)
    dx = ops.conv2d_backward_data(dy, weights, ph, pw, out=np.full_like(x, np.nan),
                                  n_threads=n_threads)
    want_dx = reference.conv2d_backward_data(_f64(dy), _f64(weights), ph, pw,
                                             out=np.empty(x.shape))
    np.testing.assert_allclose(dx, want_dx, rtol=1e-4, atol=1e-5 * kh * kw * f)
    db = None if bias is None else np.full_like(bias, np.nan)
    dw, got_db = ops.conv2d_backward_weights(x, dy, ph, pw, np.full_like(weights, np.nan), db,
                                             n_threads=n_threads)
    want_dw, want_db = reference.conv2d_backward_weights(
        _f64(x), _f64(dy), ph, pw, np.empty(weights.shape), None if bias is None else np.empty(f))
    rows = dy.shape[0] * dy.shape[1] * dy.shape[2]
    np.testing.assert_allclose(dw, want_dw, rtol=1e-4, atol=1e-5 * max(rows, 1))
    assert got_db is db
    if bias is not None:
        np.testing.assert_allclose(db, want_db, rtol=1e-4, atol=1e-5 * max(rows, 1))


@needs_extension
def test_direct_conv_threads_split_the_batch_alike():
    # Forward and backward data are per sample; backward weights sums
    # groups of samples, then the groups in order: the same bits on any
    # thread count (19 samples: groups of 8, 8 and 3).
    rng = np.random.default_rng(5)
    x = rng.standard_normal((19, 14, 14, 16)).astype(np.float32)
    weights = rng.standard_normal((3, 3, 16, 32)).astype(np.float32)
    dy = rng.standard_normal((19, 14, 14, 32)).astype(np.float32)
    one, two = (ops.conv2d_forward(x, weights, None, 1, 1, n_threads=t) for t in (1, 2))
    np.testing.assert_array_equal(one, two)
    one, two = (ops.conv2d_backward_data(dy, weights, 1, 1, np.empty_like(x), n_threads=t)
                for t in (1, 2))
    np.testing.assert_array_equal(one, two)
    (w1, b1), (w2, b2) = (ops.conv2d_backward_weights(x, dy, 1, 1, np.empty_like(weights),
                                                      np.empty(32, np.float32), n_threads=t)
                          for t in (1, 2))
    np.testing.assert_array_equal(w1, w2)
    np.testing.assert_array_equal(b1, b2)


@given(direct_case(dtype=np.float64))
def test_twin_direct_conv_is_the_loops_and_adjoint(case):
    # forward: the plain-loop im2col times W, plus b; the backward kernels
    # are its adjoints: <conv(x), dy> = <x, dx(dy)> = <W, dW(x, dy)>.
    x, weights, bias, dy, (ph, pw) = case
    kh, kw, c, f = weights.shape
    y = ops.conv2d_forward(x, weights, bias, ph, pw)  # float64: the twin
    want = loop_im2col(x, kh, kw, 1, 1, ph, pw) @ weights.reshape(-1, f)
    if bias is not None:
        want = want + bias
    np.testing.assert_allclose(y.reshape(-1, f), want, rtol=1e-12, atol=1e-12)
    linear = ops.conv2d_forward(x, weights, None, ph, pw)
    dx = ops.conv2d_backward_data(dy, weights, ph, pw, np.empty_like(x))
    dw, db = ops.conv2d_backward_weights(x, dy, ph, pw, np.empty_like(weights), np.empty(f))
    lhs = float(np.dot(linear.ravel(), dy.ravel()))
    assert lhs == pytest.approx(float(np.dot(x.ravel(), dx.ravel())), rel=1e-9, abs=1e-9)
    assert lhs == pytest.approx(float(np.dot(weights.ravel(), dw.ravel())), rel=1e-9, abs=1e-9)
    np.testing.assert_allclose(db, dy.reshape(-1, f).sum(axis=0), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("pure_numpy", ["0", "1"])
def test_direct_conv_bad_arguments_are_rejected_alike(monkeypatch, dtype, pure_numpy):
    monkeypatch.setenv("SPARKAVG_PURE_NUMPY", pure_numpy)
    x = np.zeros((2, 5, 5, 3), dtype)
    weights = np.zeros((3, 3, 3, 4), dtype)
    with pytest.raises(ValueError, match=r"Expect padding < kernel, got kernel=\(3, 3\), "
                                         r"padding=\(3, 0\)"):
        ops.conv2d_forward(x, weights, None, 3, 0)
    with pytest.raises(ValueError, match=r"Expect weights of shape \(KH, KW, 3, F\)"):
        ops.conv2d_forward(x, np.zeros((3, 3, 2, 4), dtype))
    with pytest.raises(ValueError, match=r"Expect bias of shape \(4,\) like x, got \(3,\)"):
        ops.conv2d_forward(x, weights, np.zeros(3, dtype))
    with pytest.raises(ValueError, match=r"Expect out of shape \(2, 3, 3, 4\) like x"):
        ops.conv2d_forward(x, weights, out=np.zeros((2, 5, 5, 4), dtype))
    with pytest.raises(TypeError, match="Expect weights of dtype"):
        ops.conv2d_forward(x, weights.astype(np.float16))
    with pytest.raises(ValueError, match=r"Expect weights of shape \(KH, KW, 3, F\) for out's 3 channels"):
        ops.conv2d_backward_data(np.zeros((2, 3, 3, 4), dtype), np.zeros((3, 3, 2, 4), dtype), 0, 0,
                                 np.empty_like(x))
    with pytest.raises(ValueError, match=r"Expect dy of shape \(2, 5, 5, 4\) like out"):
        ops.conv2d_backward_data(np.zeros((2, 3, 3, 4), dtype), weights, 1, 1, np.empty_like(x))
    with pytest.raises(ValueError, match=r"Expect x of shape \(N, H, W, 3\)"):
        ops.conv2d_backward_weights(np.zeros((2, 5, 5, 2), dtype), np.zeros((2, 3, 3, 4), dtype),
                                    0, 0, np.empty_like(weights))
    with pytest.raises(ValueError, match="C-contiguous"):
        ops.conv2d_backward_weights(x, np.zeros((2, 3, 3, 4), dtype), 0, 0,
                                    np.zeros((3, 3, 3, 8), dtype)[..., ::2])


# --------------------------------- the numpy twins against loops (float64)
@given(geometry(dtype=np.float64), st.booleans())
def test_twin_im2col_and_col2im_are_the_loops(case, ones):
    x, (kh, kw, sh, sw, ph, pw) = case
    want = loop_im2col(x, kh, kw, sh, sw, ph, pw)
    cols = ops.im2col(x, kh, kw, sh, sw, ph, pw, ones_column=ones)  # float64: the twin
    np.testing.assert_array_equal(cols[:, :want.shape[1]], want)
    # col2im is im2col's adjoint: folding the unit columns counts each pixel's uses.
    c = np.random.default_rng(2).standard_normal(want.shape)
    folded = ops.col2im(c, kh, kw, sh, sw, ph, pw, out=np.empty_like(x))
    assert np.dot(want.ravel(), c.ravel()) == pytest.approx(np.dot(x.ravel(), folded.ravel()),
                                                           rel=1e-12, abs=1e-12)


@given(geometry(padding=False, dtype=np.float64))
def test_twin_pooling_is_the_loops(case):
    x, (kh, kw, sh, sw, _, _) = case
    best, arg, mean = loop_pool(x, kh, kw, sh, sw)
    out, got_arg = ops.maxpool_forward(x, kh, kw, sh, sw)
    np.testing.assert_array_equal(out, best)
    np.testing.assert_array_equal(got_arg, arg)
    np.testing.assert_allclose(ops.avgpool_forward(x, kh, kw, sh, sw), mean, rtol=1e-12)
    dout = np.random.default_rng(3).standard_normal(best.shape)
    want = np.zeros_like(x)
    for b in range(x.shape[0]):  # each gradient to its window's maximum
        np.add.at(want[b].reshape(-1), arg[b].reshape(-1), dout[b].reshape(-1))
    dx = ops.maxpool_backward(dout, arg, kh, kw, sh, sw, out=np.full_like(x, np.nan))
    np.testing.assert_allclose(dx, want, rtol=1e-12, atol=1e-15)


# ---------------------------------------------- the same checks everywhere
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("pure_numpy", ["0", "1"])
def test_bad_arguments_are_rejected_alike_on_every_path(monkeypatch, dtype, pure_numpy):
    monkeypatch.setenv("SPARKAVG_PURE_NUMPY", pure_numpy)
    x = np.zeros((2, 5, 5, 3), dtype)
    with pytest.raises(ValueError, match=r"Expect out of shape \(8, 12\) like x, got \(3, 3\)"):
        ops.im2col(x, 2, 2, 2, 2, 0, 0, out=np.empty((3, 3), dtype))
    with pytest.raises(ValueError, match="Expect a kernel that fits the padded input"):
        ops.im2col(x, 7, 7, 1, 1, 0, 0)
    with pytest.raises(ValueError, match=r"Expect integer kernel >= 1.*stride=\(0, 1\)"):
        ops.avgpool_forward(x, 2, 2, 0, 1)
    with pytest.raises(ValueError, match=r"Expect x of shape \(N, H, W, C\), got shape \(5, 5\)"):
        ops.maxpool_forward(x[0, :, :, 0], 2, 2, 2, 2)
    with pytest.raises(TypeError, match="Expect out of dtype"):
        ops.avgpool_forward(x, 2, 2, 2, 2, out=np.empty((2, 2, 2, 3), np.float16))
    with pytest.raises(ValueError, match="C-contiguous"):
        ops.col2im(np.zeros((50, 12), dtype), 2, 2, 1, 1, 0, 0,
                   out=np.zeros((2, 5, 10, 3), dtype)[:, :, ::2])
    with pytest.raises(ValueError, match="both given or both None"):
        ops.maxpool_forward(x, 2, 2, 2, 2, out=np.empty((2, 2, 2, 3), dtype))
    with pytest.raises(TypeError, match="Expect argmax of dtype int32"):
        ops.maxpool_backward(np.zeros((2, 2, 2, 3), dtype), np.zeros((2, 2, 2, 3)),
                             2, 2, 2, 2, out=np.empty_like(x))


def test_strided_inputs_are_copied():
    x = np.random.default_rng(4).standard_normal((2, 6, 6, 4)).astype(np.float32)
    strided = x[:, :, :, ::2]
    assert not strided.flags.c_contiguous
    np.testing.assert_array_equal(ops.im2col(strided, 2, 2, 1, 1, 1, 1),
                                  reference.im2col(np.ascontiguousarray(strided), 2, 2, 1, 1, 1, 1))


@needs_extension
def test_network_step_same_on_the_numpy_path(monkeypatch):
    # The numpy twins are what a float64 network and SPARKAVG_PURE_NUMPY=1
    # run (and, on CuPy arrays, a GPU network); in float32 they must train
    # the network as the Cython kernels do, to rounding.
    from sparkavg.nn import Adam, AvgPool2D, Conv2D, Dense, MaxPool2D, Network, Output

    def make():
        layers = [Conv2D(3, 3, padding=1, activation="relu"), MaxPool2D(2), Conv2D(4, 2, stride=2),
                  AvgPool2D(2, 1), Dense(5, activation="tanh"), Output(3)]
        return Network((2, 10, 10), layers, updater=Adam(1e-2), dtype="float32")

    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((6, 2, 10, 10)).astype(np.float32), rng.integers(0, 3, 6)
    fast = make()
    fast_losses = [fast.fit_batch(x, y) for _ in range(3)]
    monkeypatch.setenv("SPARKAVG_PURE_NUMPY", "1")
    slow = make()
    slow_losses = [slow.fit_batch(x, y) for _ in range(3)]
    np.testing.assert_allclose(fast_losses, slow_losses, rtol=1e-5)
    np.testing.assert_allclose(fast.params, slow.params, rtol=1e-4, atol=1e-6)
    assert not np.array_equal(fast.params, make().params)  # it did train


@needs_extension
def test_network_step_with_direct_convs_same_on_the_numpy_path(monkeypatch):
    # Conv2D layers the direct kernels serve (stride 1, 16/32/20 filters;
    # backward data runs direct only in the second: the first has 3 input
    # channels of 16 lanes, the third unpadded 9x9 images from 7x7
    # gradients, and they take GEMM + col2im) train as the im2col + GEMM
    # twins do, to rounding.
    from sparkavg.nn import Adam, Conv2D, MaxPool2D, Network, Output

    def make():
        layers = [Conv2D(16, 3, padding=1, activation="relu"), Conv2D(32, 3, padding=1),
                  Conv2D(20, 3, activation="relu"), MaxPool2D(2), Output(3)]
        return Network((3, 9, 9), layers, updater=Adam(1e-2), dtype="float32")

    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((5, 3, 9, 9)).astype(np.float32), rng.integers(0, 3, 5)
    fast = make()
    convs = [layer for layer in fast.layers if isinstance(layer, Conv2D)]
    fast_losses = [fast.fit_batch(x, y) for _ in range(3)]
    if ops.have_direct_conv():
        assert all(conv._x is not None for conv in convs)  # forward ran direct
        assert [conv._direct_dx() for conv in convs] == [False, True, False]
    monkeypatch.setenv("SPARKAVG_PURE_NUMPY", "1")
    slow = make()
    slow_losses = [slow.fit_batch(x, y) for _ in range(3)]
    assert all(conv._x is None for conv in slow.layers if isinstance(conv, Conv2D))
    np.testing.assert_allclose(fast_losses, slow_losses, rtol=1e-5)
    np.testing.assert_allclose(fast.params, slow.params, rtol=1e-4, atol=1e-6)
    assert not np.array_equal(fast.params, make().params)  # it did train


@needs_extension
@pytest.mark.skipif(not ops.have_direct_conv(), reason="the direct kernels need AVX-512")
def test_openmp_threads_sleep_soon_after_a_kernel():
    # sparkavg_ext loads libgomp with a short spin count (unless the user
    # set one), so an idle pool does not hold a core the BLAS threads need.
    # A fresh interpreter: libgomp reads it once.  Its CPU time while it
    # sleeps 50 ms after a two-thread kernel stays near zero (libgomp's
    # default spins for milliseconds of a core).
    import os
    import subprocess
    import sys

    script = (
        "import time, numpy as np\n"
        "from sparkavg import ops\n"
        "x = np.ones((8, 14, 14, 16), np.float32); w = np.ones((3, 3, 16, 16), np.float32)\n"
        "burnt = []\n"
        "for _ in range(10):\n"
        "    ops.conv2d_forward(x, w, None, 1, 1, n_threads=2)\n"
        "    t = time.process_time(); time.sleep(0.05); burnt.append(time.process_time() - t)\n"
        "import os; print(sorted(burnt)[5], 'GOMP_SPINCOUNT' in os.environ)\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                         check=True, timeout=120)
    burnt, left_set = out.stdout.split()
    assert float(burnt) < 1e-3, out.stdout
    assert left_set == "False"  # the environment is left as it was
