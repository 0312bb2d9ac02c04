"""Threshold / bitmap encoding: the fast paths against the numpy reference,
and the wire formats' invariants.

On exactness.  An encoder sets ``r_after[i] = fl32(r_before[i] - s*tau)``
for every sent entry and leaves the others alone, and the decoder adds
``s*tau`` into a zero target.  ``decode(encode(r)) + r_after == r_before``
therefore holds exactly when the float32 subtraction is exact.  We test it
exactly on a dyadic grid (values k/64 with |k| <= 512, tau a power of two:
every difference fits in 10 bits), and for arbitrary finite float32 values
we test what IEEE guarantees: exact where ``|r| <= 2*tau`` (Sterbenz), and
otherwise off by at most half a float32 ulp of ``r_after`` (computed in
float64).  Fast vs reference is compared bit for bit everywhere.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from sparkavg import ops
from sparkavg.ops import reference

pytestmark = pytest.mark.skipif(not ops.have_extension(), reason="sparkavg_ext not built")

# ----------------------------------------------------------------- strategies
lengths = st.integers(min_value=0, max_value=180)  # several 16-value blocks + a tail
general = arrays(
    np.float32,
    lengths,
    elements=st.floats(-100.0, 100.0, width=32, allow_nan=False, allow_infinity=False),
)
general_tau = st.floats(2.0**-10, 50.0, width=32)
grid = arrays(np.float32, lengths, elements=st.integers(-512, 512).map(lambda k: k / 64.0))
grid_tau = st.integers(-4, 2).map(lambda j: 2.0**j)
limits = st.one_of(st.none(), st.integers(0, 200))


def bits(a):
    return np.asarray(a).view(np.uint32)


def same_bits(a, b):
    return a.shape == b.shape and np.array_equal(bits(a), bits(b))


def tau_bits(tau):
    return int(np.float32(tau).view(np.int32))


def dense_from(message, n):
    target = np.zeros(n, np.float32)
    if message is not None:
        ops.decode(message, target)
    return target


def sparse_body(message):
    return message[4:4 + message[0]].astype(np.int64)


# ----------------------------------------------------- fast == reference
@given(general, general_tau, limits)
def test_sparse_fast_equals_reference(r, tau, limit):
    fast, ref = r.copy(), r.copy()
    got = ops.threshold_encode(fast, tau, limit)
    want = reference.threshold_encode(ref, tau, limit)
    assert (got is None) == (want is None)
    if got is not None:
        assert got.dtype == np.int32 and np.array_equal(got, want)
    assert same_bits(fast, ref)


@given(general, general_tau)
def test_bitmap_fast_equals_reference(r, tau):
    fast, ref = r.copy(), r.copy()
    got = ops.bitmap_encode(fast, tau)
    want = reference.bitmap_encode(ref, tau)
    assert got.dtype == np.int32 and np.array_equal(got, want)
    assert same_bits(fast, ref)


@given(general, general_tau, st.booleans())
def test_decode_fast_equals_reference(r, tau, use_bitmap):
    encoder = ops.bitmap_encode if use_bitmap else ops.threshold_encode
    message = encoder(r.copy(), tau)
    assume(message is not None)
    start = r.copy()  # decode onto arbitrary values, not only zeros
    fast, ref = start.copy(), start.copy()
    ops.decode(message, fast)
    (reference.bitmap_decode if use_bitmap else reference.threshold_decode)(message, ref)
    assert same_bits(fast, ref)


@given(general, general_tau)
def test_count_above_fast_equals_reference(r, tau):
    want = int(np.count_nonzero(np.abs(r) >= np.float32(tau)))
    assert ops.count_above(r, tau) == reference.count_above(r, tau) == want


@given(general, general_tau, st.floats(0.5, 8.0))
def test_clip_fast_equals_reference(r, tau, k):
    fast, ref = r.copy(), r.copy()
    ops.clip_residual(fast, tau, k)
    reference.clip_residual(ref, tau, k)
    assert same_bits(fast, ref)
    bound = np.float32(k * float(np.float32(tau)))
    assert np.all(np.abs(fast) <= bound)


def test_clip_keeps_nan():
    r = np.array([np.nan, 10.0, -10.0, 0.1], np.float32)
    ops.clip_residual(r, 1.0, k=2.0)
    assert np.isnan(r[0]) and list(r[1:]) == [2.0, -2.0, np.float32(0.1)]


def test_large_vector_fast_equals_reference():
    rng = np.random.default_rng(7)
    r = (rng.standard_normal(100_003) * 1e-3).astype(np.float32)
    for tau, limit in [(3e-3, None), (1e-3, 500), (5e-3, 10**6)]:
        fast, ref = r.copy(), r.copy()
        assert np.array_equal(ops.threshold_encode(fast, tau, limit),
                              reference.threshold_encode(ref, tau, limit))
        assert same_bits(fast, ref)
        fast, ref = r.copy(), r.copy()
        assert np.array_equal(ops.bitmap_encode(fast, tau), reference.bitmap_encode(ref, tau))
        assert same_bits(fast, ref)


# ----------------------------------------------------------- round trips
@given(grid, grid_tau, st.booleans())
def test_round_trip_exact_on_dyadic_grid(r_before, tau, use_bitmap):
    r = r_before.copy()
    message = ops.bitmap_encode(r, tau) if use_bitmap else ops.threshold_encode(r, tau, len(r) + 2)
    received = dense_from(message, len(r))
    assert np.array_equal(received + r, r_before)
    # Uncapped: every entry at or above tau gave exactly tau of its magnitude.
    if message is not None:
        hot = np.abs(r_before) >= tau
        assert np.array_equal(np.abs(r[hot]), np.abs(r_before[hot]) - np.float32(tau))


@given(general, general_tau, st.booleans())
def test_round_trip_general_floats(r_before, tau, use_bitmap):
    r = r_before.copy()
    message = ops.bitmap_encode(r, tau) if use_bitmap else ops.threshold_encode(r, tau)
    sent = dense_from(message, len(r))
    touched = sent != 0
    assert same_bits(r[~touched], r_before[~touched])
    # Sterbenz: r - tau is exact for tau <= |r| <= 2 tau.
    exact = touched & (np.abs(r_before) <= 2 * np.float32(tau))
    assert np.array_equal((sent + r)[exact], r_before[exact])
    err = np.abs(sent.astype(np.float64) + r.astype(np.float64) - r_before.astype(np.float64))
    half_ulp = np.spacing(np.abs(r)).astype(np.float64) / 2
    assert np.all(err[touched] <= half_ulp[touched])


# ------------------------------------------------------------ format facts
@given(general, general_tau, limits)
def test_sparse_header_indices_and_signs(r_before, tau, limit):
    r = r_before.copy()
    message = ops.threshold_encode(r, tau, limit)
    t32 = np.float32(tau)
    qualifying = np.flatnonzero(np.abs(r_before) >= t32)
    cap = ops.default_limit(len(r)) if limit is None else limit
    if len(qualifying) < 2:
        assert message is None and same_bits(r, r_before)
        return
    count = min(len(qualifying), cap)
    assert message.shape == (4 + count,)
    assert list(message[:4]) == [count, len(r), tau_bits(tau), 0]
    body = sparse_body(message)
    idx = np.abs(body) - 1
    assert np.all(body != 0) and np.all(idx < len(r))
    assert len(np.unique(idx)) == count and np.all(np.diff(idx) > 0)
    assert np.array_equal(idx, qualifying[:count])  # capped: the lowest indices
    assert np.array_equal(np.sign(body), np.where(r_before[idx] > 0, 1, -1))


@given(general, general_tau)
def test_bitmap_header_and_bits(r_before, tau):
    r = r_before.copy()
    message = ops.bitmap_encode(r, tau)
    n = len(r)
    assert message.shape == (n // 16 + 5,)
    assert list(message[:4]) == [n, n, tau_bits(tau), 1]
    words = message[4:].view(np.uint32).astype(np.int64)
    pos = np.arange((n // 16 + 1) * 16)
    has = (words[pos // 16] >> (pos % 16)) & 1
    neg = (words[pos // 16] >> (pos % 16 + 16)) & 1
    t32 = np.float32(tau)
    want_has = np.zeros(len(pos), int)
    want_neg = np.zeros(len(pos), int)
    want_has[:n] = np.abs(r_before) >= t32
    want_neg[:n] = r_before <= -t32
    assert np.array_equal(has, want_has) and np.array_equal(neg, want_neg)
    assert ops.encoded_count(message) == int(want_has.sum())
    assert ops.encoded_nbytes(message) == 4 * (n // 16 + 5)


@given(general, general_tau)
def test_bitmap_and_sparse_send_the_same(r_before, tau):
    r_sparse, r_bitmap = r_before.copy(), r_before.copy()
    sparse = ops.threshold_encode(r_sparse, tau, limit=len(r_before) + 2)
    bitmap = ops.bitmap_encode(r_bitmap, tau)
    if sparse is None:  # fewer than 2 qualify: sparse keeps them for later
        assert ops.encoded_count(bitmap) < 2
        return
    assert ops.encoded_count(sparse) == ops.encoded_count(bitmap)
    assert same_bits(dense_from(sparse, len(r_before)), dense_from(bitmap, len(r_before)))
    assert same_bits(r_sparse, r_bitmap)


# ------------------------------------------------------------- edge cases
def test_empty_vector():
    r = np.zeros(0, np.float32)
    assert ops.threshold_encode(r, 0.5) is None
    message = ops.bitmap_encode(r, 0.5)
    assert list(message) == [0, 0, tau_bits(0.5), 1, 0]
    ops.decode(message, r)
    assert ops.encode(r, 0.5) is None
    assert ops.count_above(r, 0.5) == 0


@pytest.mark.parametrize("values", [[0.1, -0.2, 0.3], [0.1, 5.0, -0.2], [-7.0]])
def test_fewer_than_two_qualify_sends_nothing(values):
    r = np.array(values, np.float32)
    before = r.copy()
    assert ops.threshold_encode(r, 1.0) is None
    assert same_bits(r, before)


@pytest.mark.parametrize("n", [1, 15, 16, 17, 64, 1000])
def test_all_above(n):
    r = np.where(np.arange(n) % 3 == 0, -1.5, 2.0).astype(np.float32)
    before = r.copy()
    message = ops.threshold_encode(r, 1.0)
    cap = max(n // 16, 2)
    if n < 2:
        assert message is None
    else:
        assert message[0] == min(cap, n)
        assert np.array_equal(np.abs(sparse_body(message)) - 1, np.arange(min(cap, n)))
        assert np.array_equal(dense_from(message, n) + r, before)
        assert np.array_equal(r[min(cap, n):], before[min(cap, n):])  # past the cap: kept
    r = before.copy()
    message = ops.bitmap_encode(r, 1.0)
    assert ops.encoded_count(message) == n
    assert np.array_equal(r, np.where(before > 0, 1.0, -0.5).astype(np.float32))


def test_default_limit():
    assert [ops.default_limit(n) for n in (0, 1, 31, 32, 47, 48, 1600)] == [2, 2, 2, 2, 2, 3, 100]


def test_duplicate_indices_add_up():
    message = np.array([3, 4, tau_bits(0.5), 0, 2, 2, -4], np.int32)
    target = np.zeros(4, np.float32)
    ops.threshold_decode(message, target)
    assert list(target) == [0.0, 1.0, 0.0, -0.5]


def test_float64_takes_the_reference_path():
    before = np.random.default_rng(3).standard_normal(200)
    r64, ref = before.copy(), before.copy()
    message = ops.threshold_encode(r64, 0.3)
    assert np.array_equal(message, reference.threshold_encode(ref, 0.3))
    assert np.array_equal(r64, ref)
    # tau travels as float32, so a float64 residual loses exactly float32(0.3).
    body = sparse_body(message)
    idx = np.abs(body) - 1
    assert np.array_equal(r64[idx], before[idx] - np.sign(body) * float(np.float32(0.3)))


def test_pure_numpy_switch(monkeypatch):
    from sparkavg.ops import _cython

    def refuse(*args, **kwargs):
        raise AssertionError("SPARKAVG_PURE_NUMPY=1 must not reach the Cython kernels")

    monkeypatch.setenv("SPARKAVG_PURE_NUMPY", "1")
    monkeypatch.setattr(_cython, "encode_bitmap", refuse)
    r = np.array([0.0, 2.0, -3.0, 0.5], np.float32)
    message = ops.encode(r, 1.0)
    assert list(message) == [4, 4, tau_bits(1.0), 1, 0x00040006]
    assert list(r) == [0.0, 1.0, -2.0, 0.5]


def test_signed_zeros_and_untouched_lanes_keep_their_bits():
    # Bitmap words are applied lane-wise; lanes that send nothing must keep
    # their exact bits (-0.0 stays -0.0), in encoding and decoding alike.
    r = np.full(40, -0.0, np.float32)
    r[[3, 20, 37]] = [2.0, -2.0, 2.0]  # 37 lies in the 8-value tail word
    before = r.copy()
    message = ops.bitmap_encode(r, 1.0)
    assert same_bits(np.delete(r, [3, 20, 37]), np.delete(before, [3, 20, 37]))
    assert list(r[[3, 20, 37]]) == [1.0, -1.0, 1.0]
    target = np.full(40, -0.0, np.float32)
    ops.decode(message, target)
    assert same_bits(np.delete(target, [3, 20, 37]), np.full(37, -0.0, np.float32))
    assert list(target[[3, 20, 37]]) == [1.0, -1.0, 1.0]
