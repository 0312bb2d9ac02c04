"""The sequence kernels (sparkavg.ops.sequence): the Cython kernels
(float32) against their numpy twins (hypothesis), the twins against plain
float64 formulas, the tanh approximation's accuracy and NaN, and argument
checks."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sparkavg import ops
from sparkavg.ops import _dispatch, reference

needs_extension = pytest.mark.skipif(not ops.have_extension(), reason="sparkavg_ext not built")

# The Cython kernels' tanh is a rational approximation within ~4e-7 of tanh
# (a few float ulps); a step's outputs are within a few of those.
ATOL = 3e-6
# Backward steps: the AVX2/AVX-512 builds contract a*b + c into FMAs, and
# 1 - t*t of a t near +-1 (a saturated tanh) then differs relatively by up to
# ~1e-4 from the twin's rounded product (the FMA's being the closer one).
BACKWARD_RTOL = 2e-4


@st.composite
def step(draw, gates):
    """Random step inputs for G gates: (N, U, rng) with scale."""
    n = draw(st.integers(0, 9))
    u = draw(st.sampled_from([1, 3, 4, 7, 16, 33]))
    scale = draw(st.sampled_from([0.1, 1.0, 4.0, 20.0]))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)

    def arr(*shape, positive=False, unit=False):
        a = rng.standard_normal(shape) * scale
        if unit:  # activations in (0, 1) / (-1, 1)
            a = np.tanh(a)
        return np.abs(a).astype(np.float32) if positive else a.astype(np.float32)
    return n, u, arr


def _twins(name, *args):
    """``ops.<name>`` (asserted to route to the Cython kernel) on ``args`` and
    ``reference.<name>`` on copies of them (the kernels write into some):
    returns (the kernel's arrays, the twin's), in the order of ``args``."""
    assert _dispatch.route("numpy", np.dtype(np.float32)) == _dispatch.CYTHON
    copies = [a.copy() for a in args]
    getattr(ops, name)(*args)
    getattr(reference, name)(*copies)
    return args, copies


@needs_extension
@given(step(4))
def test_lstm_forward_matches_twin(case):
    n, u, arr = case
    c_prev = arr(n, u)
    got, want = _twins("lstm_forward_step", arr(n, 4 * u), arr(n, 4 * u), c_prev,
                       *(np.full((n, u), np.nan, np.float32) for _ in range(3)))
    # c = f * c_prev + i * g may cancel: absolute error in units of |c_prev|
    atol = ATOL * (1 + float(np.abs(c_prev).max(initial=0)))
    for k in (0, 3, 4, 5):  # z (activated in place), c, tc, h
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=atol)


@needs_extension
@given(step(4))
def test_lstm_backward_matches_twin(case):
    n, u, arr = case
    (a, c_prev, tc, dh, dc, dz), (*_, dc2, dz2) = _twins(
        "lstm_backward_step", arr(n, 4 * u, unit=True), arr(n, u), arr(n, u, unit=True), arr(n, u), arr(n, u),
        np.full((n, 4 * u), np.nan, np.float32))
    tol = 1e-6 * (1 + float(np.abs(dh).max(initial=0) + np.abs(dc2).max(initial=0)) * (1 + np.abs(c_prev).max(initial=0)))
    np.testing.assert_allclose(dz, dz2, rtol=BACKWARD_RTOL, atol=tol)
    np.testing.assert_allclose(dc, dc2, rtol=BACKWARD_RTOL, atol=tol)


@needs_extension
@given(step(3))
def test_gru_forward_matches_twin(case):
    n, u, arr = case
    (z, *_, hn, h), (z2, *_, hn2, h2) = _twins(
        "gru_forward_step", arr(n, 3 * u), arr(n, 3 * u), arr(u), arr(n, u, unit=True),
        np.full((n, u), np.nan, np.float32), np.full((n, u), np.nan, np.float32))
    np.testing.assert_array_equal(hn, hn2)
    for got, want in ((z, z2), (h, h2)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=ATOL)


@needs_extension
@given(step(3))
def test_gru_backward_matches_twin(case):
    n, u, arr = case
    (*_, dh, dz, dzr), (*_, dh2, dz2, dzr2) = _twins(
        "gru_backward_step", arr(n, 3 * u, unit=True), arr(n, u), arr(n, u, unit=True), arr(n, u),
        np.full((n, 3 * u), np.nan, np.float32), np.full((n, 3 * u), np.nan, np.float32))
    for got, want in ((dh, dh2), (dz, dz2), (dzr, dzr2)):
        np.testing.assert_allclose(got, want, rtol=BACKWARD_RTOL, atol=1e-6 * (1 + float(np.abs(want).max(initial=0))))


@needs_extension
@given(st.integers(0, 50), st.integers(1, 40), st.integers(1, 9), st.integers(0, 2**32 - 1))
def test_scatter_add_rows_matches_twin(m, v, d, seed):
    rng = np.random.default_rng(seed)
    index = rng.integers(0, v, m)
    rows = rng.standard_normal((m, d)).astype(np.float32)
    (*_, out), (*_, want) = _twins("scatter_add_rows", index, rows, rng.standard_normal((v, d)).astype(np.float32))
    np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-6)


# ------------------------------------------------- twins against formulas
def _sig(a):
    return 1.0 / (1.0 + np.exp(-a))


def test_lstm_twin_is_the_lstm_formula():
    rng = np.random.default_rng(0)
    n, u = 3, 4
    z, rec, c_prev = rng.standard_normal((n, 4 * u)), rng.standard_normal((n, 4 * u)), rng.standard_normal((n, u))
    a = z + rec
    i, f, g, o = _sig(a[:, :u]), _sig(a[:, u:2 * u]), np.tanh(a[:, 2 * u:3 * u]), _sig(a[:, 3 * u:])
    c, tc, h = (np.empty((n, u)) for _ in range(3))
    reference.lstm_forward_step(z, rec, c_prev, c, tc, h)
    np.testing.assert_allclose(z, np.hstack([i, f, g, o]), rtol=1e-13)
    np.testing.assert_allclose(c, f * c_prev + i * g, rtol=1e-13)
    np.testing.assert_allclose(h, o * np.tanh(f * c_prev + i * g), rtol=1e-13)


def test_gru_twin_is_the_pytorch_formula():
    rng = np.random.default_rng(1)
    n, u = 3, 4
    z, rec, rb, h_prev = (rng.standard_normal((n, 3 * u)), rng.standard_normal((n, 3 * u)),
                          rng.standard_normal(u), rng.standard_normal((n, u)))
    r = _sig(z[:, :u] + rec[:, :u])
    zg = _sig(z[:, u:2 * u] + rec[:, u:2 * u])
    nn = np.tanh(z[:, 2 * u:] + r * (rec[:, 2 * u:] + rb))
    hn, h = np.empty((n, u)), np.empty((n, u))
    reference.gru_forward_step(z.copy(), rec, rb, h_prev, hn, h)
    np.testing.assert_allclose(h, (1 - zg) * nn + zg * h_prev, rtol=1e-13)


@needs_extension
def test_tanh_approximation_accuracy_and_nan():
    from sparkavg_ext import _sequence  # the kernels' tanh, exposed for this test

    x = np.linspace(-30, 30, 600_001).astype(np.float32)
    x = np.concatenate([x, np.float32([0.0, -0.0, 1e-30, -1e-30, np.inf, -np.inf, np.nan])])
    out = np.empty_like(x)
    _sequence.tanh(x, out)
    want = np.tanh(x.astype(np.float64))
    finite = np.isfinite(x)
    assert np.abs(out[finite] - want[finite]).max() < 5e-7
    assert np.all(np.abs(out[finite]) <= 1)
    assert out[-3] == 1 and out[-2] == -1 and np.isnan(out[-1])


@needs_extension
def test_nan_in_a_gate_comes_out_nan():
    z = np.zeros((1, 4), np.float32)
    z[0, 2] = np.nan  # the cell candidate
    c, tc, h = (np.empty((1, 1), np.float32) for _ in range(3))
    ops.lstm_forward_step(z, np.zeros_like(z), np.zeros((1, 1), np.float32), c, tc, h)
    assert np.isnan(c[0, 0]) and np.isnan(h[0, 0])


# ------------------------------------------------------------------ checks
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_checks_name_the_bad_argument(dtype):
    z, s = np.zeros((2, 8), dtype), np.zeros((2, 2), dtype)
    with pytest.raises(ValueError, match=r"Expect z of shape \(N, 4\*units\)"):
        ops.lstm_forward_step(np.zeros((2, 7), dtype), z, s, s.copy(), s.copy(), s.copy())
    with pytest.raises(ValueError, match="Expect h of shape"):
        ops.lstm_forward_step(z, z, s, s.copy(), s.copy(), np.zeros((3, 2), dtype))
    with pytest.raises(TypeError, match="Expect c_prev of dtype"):
        ops.lstm_forward_step(z, z, s.astype(np.float16), s.copy(), s.copy(), s.copy())
    with pytest.raises(ValueError, match="Expect rec of shape"):
        ops.lstm_forward_step(z, s, s, s.copy(), s.copy(), s.copy())
    with pytest.raises(ValueError, match="C-contiguous"):
        ops.gru_backward_step(np.zeros((2, 6), dtype), s, s, np.zeros((2, 4), dtype)[:, ::2], np.zeros((2, 6), dtype),
                              np.zeros((2, 6), dtype))
    out = np.zeros((4, 3), dtype)
    with pytest.raises(ValueError, match=r"Expect index values in \[0, 4\), got 4"):
        ops.scatter_add_rows(np.array([0, 4]), np.ones((2, 3), dtype), out)
    with pytest.raises(TypeError, match="Expect index of dtype int64"):
        ops.scatter_add_rows(np.array([0, 1], np.int32), np.ones((2, 3), dtype), out)
    assert not out.any()
