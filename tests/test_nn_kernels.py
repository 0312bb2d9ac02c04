"""The Cython im2col / col2im / pooling kernels against their xp-generic
twins (hypothesis), and the adjoint identity <im2col(x), c> = <x, col2im(c)>."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sparkavg.nn import kernels

pytestmark = pytest.mark.skipif(not kernels.extension_available(),
                                reason="sparkavg_ext._conv not built")


@st.composite
def geometry(draw, padding=True):
    n = draw(st.integers(0, 3))
    c = draw(st.integers(1, 4))
    kh, kw = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    sh, sw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    ph = draw(st.integers(0, kh - 1)) if padding else 0
    pw = draw(st.integers(0, kw - 1)) if padding else 0
    h = draw(st.integers(max(1, kh - 2 * ph), 9))
    w = draw(st.integers(max(1, kw - 2 * pw), 9))
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    seed = draw(st.integers(0, 2**32 - 1))
    x = np.random.default_rng(seed).standard_normal((n, h, w, c)).astype(dtype)
    return x, (kh, kw, sh, sw, ph, pw)


def _generic(monkeypatch):
    """Force the xp-generic path for the duration of a `with` block."""
    monkeypatch.setattr(kernels, "_ext", None)


@given(geometry(), st.booleans())
def test_im2col_matches_generic(case, ones):
    x, (kh, kw, sh, sw, ph, pw) = case
    fast = kernels.im2col(x, kh, kw, sh, sw, ph, pw, ones_column=ones)
    with pytest.MonkeyPatch.context() as mp:
        _generic(mp)
        slow = kernels.im2col(x, kh, kw, sh, sw, ph, pw, ones_column=ones)
    assert fast.dtype == x.dtype
    assert fast.shape[1] == kh * kw * x.shape[3] + ones
    np.testing.assert_array_equal(fast, slow)
    if ones:
        assert np.all(fast[:, -1] == 1)


@given(geometry())
def test_col2im_matches_generic_and_is_adjoint(case):
    x, (kh, kw, sh, sw, ph, pw) = case
    rng = np.random.default_rng(0)
    cols = kernels.im2col(x, kh, kw, sh, sw, ph, pw)
    c = rng.standard_normal(cols.shape).astype(x.dtype)
    fast = kernels.col2im(c, kh, kw, sh, sw, ph, pw, out=np.full_like(x, np.nan))
    with pytest.MonkeyPatch.context() as mp:
        _generic(mp)
        slow = kernels.col2im(c, kh, kw, sh, sw, ph, pw, out=np.empty_like(x))
    tol = 1e-5 if x.dtype == np.float32 else 1e-12
    np.testing.assert_allclose(fast, slow, rtol=tol, atol=tol)
    lhs = float(np.dot(cols.ravel().astype(np.float64), c.ravel()))
    rhs = float(np.dot(x.ravel().astype(np.float64), fast.ravel()))
    assert lhs == pytest.approx(rhs, rel=1e-4, abs=1e-4)


@given(geometry(padding=False))
def test_maxpool_matches_generic(case):
    x, (kh, kw, sh, sw, _, _) = case
    out, arg = kernels.maxpool_forward(x, kh, kw, sh, sw)
    dout = np.random.default_rng(1).standard_normal(out.shape).astype(x.dtype)
    dx = kernels.maxpool_backward(dout, arg, kh, kw, sh, sw, out=np.full_like(x, np.nan))
    with pytest.MonkeyPatch.context() as mp:
        _generic(mp)
        out2, arg2 = kernels.maxpool_forward(x, kh, kw, sh, sw)
        dx2 = kernels.maxpool_backward(dout, arg2, kh, kw, sh, sw, out=np.empty_like(x))
    np.testing.assert_array_equal(out, out2)
    np.testing.assert_array_equal(arg, arg2)
    np.testing.assert_allclose(dx, dx2, rtol=1e-6, atol=1e-6)


@given(geometry(padding=False))
def test_avgpool_matches_generic(case):
    x, (kh, kw, sh, sw, _, _) = case
    out = kernels.avgpool_forward(x, kh, kw, sh, sw)
    dout = np.random.default_rng(1).standard_normal(out.shape).astype(x.dtype)
    dx = kernels.avgpool_backward(dout, kh, kw, sh, sw, out=np.full_like(x, np.nan))
    with pytest.MonkeyPatch.context() as mp:
        _generic(mp)
        out2 = kernels.avgpool_forward(x, kh, kw, sh, sw)
        dx2 = kernels.avgpool_backward(dout, kh, kw, sh, sw, out=np.empty_like(x))
    tol = 1e-5 if x.dtype == np.float32 else 1e-12
    np.testing.assert_allclose(out, out2, rtol=tol, atol=tol)
    np.testing.assert_allclose(dx, dx2, rtol=tol, atol=tol)


def test_maxpool_ties_go_to_first_and_nan_is_safe():
    x = np.zeros((1, 2, 2, 1), np.float32)
    out, arg = kernels.maxpool_forward(x, 2, 2, 2, 2)
    assert arg.ravel().tolist() == [0]
    x[0, 1, 1, 0] = np.nan
    x[0, 0, 0, 0] = np.nan
    out, arg = kernels.maxpool_forward(x, 2, 2, 2, 2)
    assert 0 <= arg.ravel()[0] < 4  # a valid index even when nothing compares equal


def test_bad_shapes_are_rejected_with_expected_and_got():
    x = np.zeros((2, 5, 5, 3), np.float32)
    with pytest.raises(ValueError, match=r"Expect out of shape \(8, 12\), got \(3, 3\)"):
        kernels.im2col(x, 2, 2, 2, 2, 0, 0, out=np.empty((3, 3), np.float32))
    with pytest.raises(ValueError, match="Expect a kernel that fits"):
        kernels.im2col(x, 7, 7, 1, 1, 0, 0)


def test_network_step_same_on_generic_path(monkeypatch):
    # The xp-generic kernels are what a CuPy network runs; on numpy they must
    # train the same network to the same parameters as the Cython path.
    from sparkavg.nn import Adam, AvgPool2D, Conv2D, Dense, MaxPool2D, Network, Output

    def make():
        layers = [Conv2D(3, 3, padding=1, activation="relu"), MaxPool2D(2), Conv2D(4, 2, stride=2),
                  AvgPool2D(2, 1), Dense(5, activation="tanh"), Output(3)]
        return Network((2, 10, 10), layers, updater=Adam(1e-2), dtype="float64")

    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((6, 2, 10, 10)), rng.integers(0, 3, 6)
    fast = make()
    fast_losses = [fast.fit_batch(x, y) for _ in range(3)]
    monkeypatch.setenv("SPARKAVG_PURE_NUMPY", "1")
    slow = make()
    slow_losses = [slow.fit_batch(x, y) for _ in range(3)]
    np.testing.assert_allclose(fast_losses, slow_losses, rtol=1e-12)
    np.testing.assert_allclose(fast.params, slow.params, rtol=1e-10, atol=1e-13)
