"""encode()/decode(): libnd4j's switching between bitmap and sparse.

Rule: start with a bitmap; after a bitmap carrying fewer than
(N // 16 + 5) // 2 values, try sparse next; a sparse attempt that would
reach the cap (count >= limit) is sent as a bitmap instead, in the same
call, without losing what the sparse pass found.
"""
from __future__ import annotations

import pickle

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from sparkavg import ops

pytestmark = pytest.mark.skipif(not ops.have_extension(), reason="sparkavg_ext not built")

N = 1600  # bitmap length N // 16 + 5 = 105 words; switch-to-sparse below 52 values; cap 100


def residual_with(count, n=N, seed=0):
    """n values in (-0.5, 0.5) with exactly `count` of them set to +-1.5."""
    rng = np.random.default_rng(seed)
    r = (rng.random(n, dtype=np.float32) - 0.5) * 0.99
    hot = rng.choice(n, count, replace=False)
    r[hot] = np.where(rng.random(count) < 0.5, -1.5, 1.5)
    return r


def flag(message):
    return None if message is None else int(message[3])


def test_starts_with_bitmap_and_switches_to_sparse_when_few():
    state = ops.EncodingState()
    assert state.format == ops.BITMAP
    m = ops.encode(residual_with(51), 1.0, state)  # 51 < 105 // 2 = 52
    assert flag(m) == 1 and state.last_format == ops.BITMAP and state.format == ops.SPARSE
    m = ops.encode(residual_with(51), 1.0, state)
    assert flag(m) == 0 and m[0] == 51 and state.format == ops.SPARSE


def test_bitmap_stays_when_dense_enough():
    state = ops.EncodingState()
    ops.encode(residual_with(52), 1.0, state)
    assert state.format == ops.BITMAP
    ops.encode(residual_with(400), 1.0, state)
    assert state.format == ops.BITMAP and state.bitmap_messages == 2


@pytest.mark.parametrize("count", [100, 101, 900])
def test_sparse_reaching_the_cap_is_sent_as_bitmap(count):
    state = ops.EncodingState()
    state.format = ops.SPARSE
    r = residual_with(count)
    before = r.copy()
    m = ops.encode(r, 1.0, state)
    assert flag(m) == 1 and state.format == ops.BITMAP and state.last_format == ops.BITMAP
    assert ops.encoded_count(m) == count  # nothing was dropped or subtracted twice
    target = np.zeros(N, np.float32)
    ops.decode(m, target)
    assert np.array_equal(target + r, before)


def test_sparse_below_the_cap_stays_sparse():
    state = ops.EncodingState()
    state.format = ops.SPARSE
    m = ops.encode(residual_with(99), 1.0, state)
    assert flag(m) == 0 and m[0] == 99 and state.format == ops.SPARSE


def test_user_limit():
    state = ops.EncodingState(limit=10)
    state.format = ops.SPARSE
    assert flag(ops.encode(residual_with(9), 1.0, state)) == 0
    assert flag(ops.encode(residual_with(10), 1.0, state)) == 1


def test_nothing_to_send():
    state = ops.EncodingState()
    r = residual_with(0)
    before = r.copy()
    assert ops.encode(r, 1.0, state) is None  # an empty bitmap is not sent
    assert state.format == ops.SPARSE and state.skipped == 1 and state.messages == 0
    r[3] = 2.0
    before = r.copy()
    assert ops.encode(r, 1.0, state) is None  # sparse: fewer than 2 qualify
    assert np.array_equal(r, before) and state.last_count == 1 and state.format == ops.SPARSE


def test_statistics_and_pickling():
    state = ops.EncodingState()
    m1 = ops.encode(residual_with(10), 1.0, state)
    m2 = ops.encode(residual_with(10, seed=1), 1.0, state)
    assert state.messages == 2 and state.bitmap_messages == 1 and state.sparse_messages == 1
    assert state.values_sent == 20
    assert state.bytes_sent == ops.encoded_nbytes(m1) + ops.encoded_nbytes(m2) == 4 * (105 + 14)
    assert state.dense_bytes == 2 * N * 4
    assert state.compression_ratio == pytest.approx(2 * N * 4 / (4 * 119))
    clone = pickle.loads(pickle.dumps(state))
    assert clone.as_dict() == state.as_dict()
    assert "format='sparse'" in repr(state)
    state.reset()
    assert state.messages == 0 and state.format == ops.BITMAP


def test_without_state_each_call_starts_with_bitmap():
    assert flag(ops.encode(residual_with(5), 1.0)) == 1


@given(
    arrays(np.float32, st.integers(0, 300), elements=st.integers(-256, 256).map(lambda k: k / 64)),
    st.integers(1, 6),
)
def test_many_rounds_lose_nothing(r0, rounds):
    """Residual + everything ever sent == everything ever added (dyadic grid: exact)."""
    state = ops.EncodingState()
    r = r0.copy()
    received = np.zeros_like(r)
    added = r0.astype(np.float64)
    for k in range(rounds):
        m = ops.encode(r, 0.5, state)
        if m is not None:
            ops.decode(m, received)
        step = np.roll(r0, k)  # keep feeding updates, as training does
        r += step
        added += step
    assert np.array_equal(received.astype(np.float64) + r, added)
    assert state.messages + state.skipped == rounds
