"""The per-channel normalisation kernels (sparkavg.ops.norm): the Cython
kernels (float32) against their numpy twins (hypothesis), the twins against
plain float64 formulas, double-precision sums on data far from zero,
``out`` over ``dy``, and argument checks that are the same on every path."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sparkavg import ops
from sparkavg.ops import _cython, _dispatch, reference

needs_extension = pytest.mark.skipif(not ops.have_extension(), reason="sparkavg_ext not built")


@st.composite
def rows(draw, dtype=np.float32, min_rows=1):
    """(M, C) arrays plus per-channel vectors: ``(x, dy, v1, v2, v3, v4)``."""
    m = draw(st.integers(min_rows, 300))
    c = draw(st.sampled_from([1, 2, 3, 16, 33]))
    offset = draw(st.sampled_from([0.0, 3.0, -50.0]))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    x = (offset + rng.standard_normal((m, c)) * rng.uniform(0.1, 5.0, c)).astype(dtype)
    dy = rng.standard_normal((m, c)).astype(dtype)
    vectors = [rng.standard_normal(c).astype(dtype) for _ in range(4)]
    return (x, dy, *vectors)


def cython_path():
    assert _dispatch.route("numpy", np.dtype(np.float32)) == _dispatch.CYTHON


# ------------------------------------------------- Cython against the twins
@needs_extension
@given(rows())
def test_stats_match_twin(case):
    cython_path()
    x = case[0]
    mean, var = ops.channel_stats(x)
    want_mean, want_var = reference.channel_stats(x)
    scale = np.abs(x).max(axis=0) + 1.0
    np.testing.assert_allclose(mean, want_mean, rtol=0, atol=float(np.max(scale)) * 1e-6)
    np.testing.assert_allclose(var, want_var, rtol=2e-5, atol=float(np.max(scale)) ** 2 * 1e-6)


@needs_extension
@given(rows())
def test_affine_matches_twin_bit_for_bit(case):
    x, _, scale, shift = case[:4]
    out = np.full_like(x, np.nan)
    assert ops.channel_affine(x, scale, shift, out=out) is out
    np.testing.assert_array_equal(out, reference.channel_affine(x, scale, shift))


@needs_extension
@given(rows())
def test_sums_match_twin(case):
    x, dy, center = case[:3]
    sum_dy, sum_dy_x = ops.channel_sums(dy, x, center)
    want_dy, want_dy_x = reference.channel_sums(dy, x, center)
    bound = np.abs(dy).sum(axis=0) * (np.abs(x - center).max(axis=0) + 1.0)
    assert np.all(np.abs(sum_dy - want_dy) <= 1e-6 * np.abs(dy).sum(axis=0) + 1e-6)
    assert np.all(np.abs(sum_dy_x - want_dy_x) <= 1e-6 * bound + 1e-6)


@needs_extension
@given(rows())
def test_blend_matches_twin_and_may_write_over_dy(case):
    x, dy, center, a, b, shift = case
    want = reference.channel_blend(dy, x, center, a, b, shift)
    got = ops.channel_blend(dy, x, center, a, b, shift)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-5)
    over = dy.copy()
    assert ops.channel_blend(over, x, center, a, b, shift, out=over) is over
    np.testing.assert_array_equal(over, got)


@needs_extension
def test_float32_stats_and_sums_accumulate_in_double():
    """A ResNet-sized (50176, 16) batch far from zero: float32 running sums
    would drift by ~1e-3 relative; the kernels stay at float32 rounding."""
    rng = np.random.default_rng(0)
    x = (100.0 + rng.standard_normal((64 * 28 * 28, 16))).astype(np.float32)
    dy = (1.0 + rng.standard_normal(x.shape)).astype(np.float32)
    x64, dy64 = x.astype(np.float64), dy.astype(np.float64)
    mean, var = ops.channel_stats(x)
    np.testing.assert_allclose(mean, x64.mean(axis=0), rtol=1e-7)
    np.testing.assert_allclose(var, x64.var(axis=0), rtol=1e-5)
    center = mean.copy()
    sum_dy, sum_dy_x = ops.channel_sums(dy, x, center)
    np.testing.assert_allclose(sum_dy, dy64.sum(axis=0), rtol=1e-6)
    np.testing.assert_allclose(sum_dy_x, (dy64 * (x64 - center)).sum(axis=0), rtol=1e-4)


# --------------------------------------------- the twins are the formulas
@given(rows(dtype=np.float64))
def test_twins_are_the_formulas(case):
    x, dy, center, a, b, shift = case
    mean, var = reference.channel_stats(x)
    np.testing.assert_allclose(mean, x.mean(axis=0), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(var, x.var(axis=0), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(reference.channel_affine(x, a, shift), x * a + shift, rtol=1e-15)
    sum_dy, sum_dy_x = reference.channel_sums(dy, x, center)
    np.testing.assert_allclose(sum_dy, dy.sum(axis=0), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(sum_dy_x, (dy * (x - center)).sum(axis=0), rtol=1e-12, atol=1e-9)
    np.testing.assert_allclose(reference.channel_blend(dy, x, center, a, b, shift),
                               a * dy + b * (x - center) + shift, rtol=1e-12, atol=1e-12)


def test_one_row_has_zero_variance():
    for dtype in (np.float32, np.float64):
        x = np.array([[1.5, -2.0, 7.0]], dtype)
        mean, var = ops.channel_stats(x)
        np.testing.assert_array_equal(mean, x[0])
        np.testing.assert_array_equal(var, np.zeros(3, dtype))


# ---------------------------------------------- the same checks everywhere
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("pure_numpy", ["0", "1"])
def test_bad_arguments_are_rejected_alike_on_every_path(monkeypatch, dtype, pure_numpy):
    monkeypatch.setenv("SPARKAVG_PURE_NUMPY", pure_numpy)
    x, v = np.zeros((5, 3), dtype), np.zeros(3, dtype)
    with pytest.raises(ValueError, match=r"Expect x of shape \(M, C\), got shape \(2, 5, 3\)"):
        ops.channel_stats(np.zeros((2, 5, 3), dtype))
    with pytest.raises(ValueError, match=r"Expect x with at least one row, got shape \(0, 3\)"):
        ops.channel_stats(np.zeros((0, 3), dtype))
    with pytest.raises(ValueError, match="Expect mean and var both given or both None, got only mean"):
        ops.channel_stats(x, mean=v.copy())
    with pytest.raises(ValueError, match=r"Expect scale of shape \(3,\) like x, got \(4,\)"):
        ops.channel_affine(x, np.zeros(4, dtype), v)
    with pytest.raises(TypeError, match="Expect shift of dtype"):
        ops.channel_affine(x, v, np.zeros(3, np.float16))
    with pytest.raises(ValueError, match=r"Expect out of shape \(5, 3\) like x, got \(5, 2\)"):
        ops.channel_affine(x, v, v, out=np.zeros((5, 2), dtype))
    with pytest.raises(ValueError, match="C-contiguous"):
        ops.channel_blend(x, x, v, v, v, v, out=np.zeros((5, 6), dtype)[:, ::2])
    with pytest.raises(ValueError, match=r"Expect x of shape \(5, 3\) like dy, got \(4, 3\)"):
        ops.channel_sums(x, np.zeros((4, 3), dtype), v)
    with pytest.raises(TypeError, match="Expect sum_dy of dtype"):
        ops.channel_sums(x, x, v, sum_dy=np.zeros(3, np.int32), sum_dy_x=v.copy())


def test_strided_inputs_are_copied():
    x = np.random.default_rng(4).standard_normal((6, 8)).astype(np.float32)
    strided = x[:, ::2]
    mean, var = ops.channel_stats(strided)
    want_mean, want_var = reference.channel_stats(np.ascontiguousarray(strided))
    np.testing.assert_allclose(mean, want_mean, rtol=1e-6)
    np.testing.assert_allclose(var, want_var, rtol=1e-5, atol=1e-7)


@needs_extension
def test_cython_backend_is_the_extension():
    assert _cython._norm is not None and _cython.error is None


@needs_extension
def test_extension_wrappers_check_their_own_arguments():
    from sparkavg_ext import _norm

    x, v = np.zeros((4, 3), np.float32), np.zeros(3, np.float32)
    with pytest.raises(ValueError, match=r"Expect var of shape \(3,\), got \(2,\)"):
        _norm.channel_stats(x, v, np.zeros(2, np.float32))
    with pytest.raises(ValueError, match="Expect at least one row, got 0"):
        _norm.channel_stats(np.zeros((0, 3), np.float32), v, v.copy())
    with pytest.raises(ValueError, match=r"Expect out of shape \(4, 3\), got \(3, 3\)"):
        _norm.channel_affine(x, v, v, np.zeros((3, 3), np.float32))
    with pytest.raises(ValueError, match=r"Expect x of shape \(4, 3\), got \(4, 2\)"):
        _norm.channel_blend(x, np.zeros((4, 2), np.float32), v, v, v, v, x)
    with pytest.raises(ValueError):  # float64: the front routes it to the twins
        _norm.channel_sums(np.zeros((4, 3)), np.zeros((4, 3)), np.zeros(3), np.zeros(3), np.zeros(3))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("m", [1, 7])
def test_batchnorm_coefficients_are_the_layers_arithmetic_bit_for_bit(dtype, m):
    """One pass, the same roundings as BatchNorm's own vector operations had: 1 / sqrt(var + eps), gamma *
    inv_std, beta - mean * scale, the running statistics' exponential averages (the variance's unbiased, none
    for one value per channel)."""
    rng = np.random.default_rng(m)
    mean, var, gamma, beta = (rng.standard_normal(5).astype(dtype) for _ in range(4))
    var = np.abs(var)
    running_mean, running_var = rng.standard_normal(5).astype(dtype), np.abs(rng.standard_normal(5)).astype(dtype)
    eps, mom = 1e-5, 0.9
    factor = (1.0 - mom) * m / (m - 1) if m > 1 else 0.0
    out = [np.full(5, np.nan, dtype) for _ in range(3)]
    rm, rv = running_mean.copy(), running_var.copy()
    ops.batchnorm_coefficients(mean, var, gamma, beta, eps, mom, factor, rm, rv, *out)
    inv_std = 1.0 / np.sqrt(var + eps)
    scale = gamma * inv_std
    want_rm, want_rv = running_mean.copy(), running_var.copy()
    want_rm *= mom
    want_rm += (1.0 - mom) * mean
    if m > 1:
        want_rv *= mom
        want_rv += factor * var
    for got, want in zip((*out, rm, rv), (scale, beta - mean * scale, inv_std, want_rm, want_rv)):
        assert got.dtype == dtype and got.tobytes() == want.tobytes()
    with pytest.raises(TypeError, match="Expect var of dtype"):
        ops.batchnorm_coefficients(mean, var.astype(np.float16), gamma, beta, eps, mom, factor, rm, rv, *out)
