"""sparkavg_ext called directly: the wrappers' own checks.

sparkavg.ops validates before it calls these, but the wrappers still refuse
what would read or write out of bounds (they run with bounds checks off).
"""
from __future__ import annotations

import numpy as np
import pytest

from sparkavg import ops

pytestmark = pytest.mark.skipif(not ops.have_extension(), reason="sparkavg_ext not built")

if ops.have_extension():
    from sparkavg_ext import _conv, _elementwise, _threshold


def test_decoders_refuse_headers_that_would_overrun():
    target = np.zeros(8, np.float32)
    with pytest.raises(ValueError, match="header"):
        _threshold.sparse_decode(np.array([5, 8, 0, 0, 1], np.int32), target)  # count > body
    with pytest.raises(ValueError, match="header"):
        _threshold.sparse_decode(np.array([1, 9, 0, 0, 1], np.int32), target)  # N != len
    with pytest.raises(ValueError, match="fewer than its 4-word header"):
        _threshold.sparse_decode(np.array([0, 8], np.int32), target)
    with pytest.raises(ValueError, match="expected 5 words"):
        _threshold.bitmap_decode(np.array([8, 8, 0, 1], np.int32), target)
    assert not target.any()


def test_memoryviews_reject_wrong_dtype_and_layout():
    with pytest.raises(ValueError):
        _threshold.sparse_encode(np.zeros(8), 0.5, 2)  # float64
    with pytest.raises(ValueError):
        _threshold.bitmap_encode(np.zeros(16, np.float32)[::2], 0.5)
    with pytest.raises(ValueError, match="Expect x of length 8 like buffer, got 7"):
        _elementwise.accumulate(np.zeros(8, np.float32), np.zeros(7, np.float32), 1.0)
    with pytest.raises(ValueError, match="Expect grads of length 8 like params, got 7"):
        _elementwise.sgd_step(np.zeros(8, np.float32), np.zeros(7, np.float32), 0.1)
    z = np.zeros(8, np.float32)
    with pytest.raises(ValueError, match="Expect v of length 8 like params, got 9"):
        _elementwise.adam_step(z, z.copy(), z.copy(), np.zeros(9, np.float32),
                               0.9, 0.1, 0.999, 0.001, 0.01, 1e-8)
    with pytest.raises(ValueError):
        _conv.im2col_nhwc(np.zeros((1, 4, 4, 1)), 2, 2, 1, 1, 0, 0)  # float64: ops' job


def test_capped_message_not_applied_when_asked():
    r = np.full(64, 3.0, np.float32)
    message, total = _threshold.sparse_encode(r, 1.0, 4, False)
    assert message is None and total == 64 and np.all(r == 3.0)
    message, total = _threshold.sparse_encode(r, 1.0, 4, True)
    assert list(message) == [4, 64, int(np.float32(1.0).view(np.int32)), 0, 1, 2, 3, 4]
    assert total == 64 and np.all(r[:4] == 2.0) and np.all(r[4:] == 3.0)


@pytest.mark.parametrize("n", [0, 1, 15, 16, 17, 63, 64, 65, 4095, 4096, 4097, 8256, 70_000])
def test_every_length_and_block_boundary(n):
    """Sparse encoding's 4096-value chunks and 64-value groups, the bitmap's
    16-value words, and the tails: the sparse and bitmap encoders agree with
    a plain loop at every boundary."""
    rng = np.random.default_rng(n)
    r = rng.standard_normal(n).astype(np.float32)
    hot = np.abs(r) >= np.float32(1.5)
    want_idx = np.flatnonzero(hot)
    sparse_r, bitmap_r = r.copy(), r.copy()
    message, total = _threshold.sparse_encode(sparse_r, 1.5, n + 2)
    assert total == len(want_idx)
    if total >= 2:
        body = message[4:]
        assert np.array_equal(np.abs(body) - 1, want_idx)
        assert np.array_equal(body < 0, r[want_idx] < 0)
    words, count = _threshold.bitmap_encode(bitmap_r, 1.5)
    assert count == len(want_idx) and len(words) == n // 16 + 5
    if total >= 2:
        assert np.array_equal(sparse_r, bitmap_r)


@pytest.mark.parametrize("cap", [2, 3, 63, 64, 65, 500, 4096, 10**6])
def test_cap_inside_groups_and_chunks(cap):
    """Positions run up to 64 past the cap; only the first `cap` are sent and
    subtracted, and the total counts them all."""
    rng = np.random.default_rng(cap)
    r = rng.standard_normal(3 * 4096 + 77).astype(np.float32)
    want_idx = np.flatnonzero(np.abs(r) >= np.float32(1.0))
    sent = want_idx[:cap]
    before = r.copy()
    message, total = _threshold.sparse_encode(r, 1.0, cap)
    assert total == len(want_idx)
    assert list(message[:2]) == [len(sent), len(r)] and len(message) == 4 + len(sent)
    assert np.array_equal(np.abs(message[4:]) - 1, sent)
    expected = before.copy()
    expected[sent] -= np.where(before[sent] > 0, np.float32(1.0), np.float32(-1.0))
    assert np.array_equal(r, expected)


@pytest.mark.parametrize("where", [[5], [4100], [3 * 4096 + 70], [9000, 20], [12000]])
@pytest.mark.parametrize("cap", [4, 10**6])
def test_non_finite_in_any_chunk_or_past_the_cap(where, cap):
    """NaN/inf in a later chunk, in the tail, or after the cap is reached
    (where only the count goes on) is still found; the residual is restored."""
    r = np.random.default_rng(1).standard_normal(3 * 4096 + 77).astype(np.float32)
    for k, i in enumerate(where):
        r[i] = [np.nan, -np.inf][k % 2]
    before = r.copy()
    with pytest.raises(ValueError, match=rf"{len(where)} non-finite.*index {min(where)};"):
        _threshold.sparse_encode(r, 1.0, cap)
    assert np.array_equal(r.view(np.uint32), before.view(np.uint32))
