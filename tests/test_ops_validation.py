"""Bad input to sparkavg.ops: clear errors, and nothing written.

In-place arrays (residual, decode target, buffer, params, state) are
rejected when they cannot take the write; read-only operands are converted
when only their layout is off.  NaN/inf in a residual and malformed
messages raise ValueError before anything changes.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from sparkavg import ops
from sparkavg.ops import reference

pytestmark = pytest.mark.skipif(not ops.have_extension(), reason="sparkavg_ext not built")


def tau_bits(tau):
    return int(np.float32(tau).view(np.int32))


def same_bits(a, b):
    return np.array_equal(np.asarray(a).view(np.uint32), np.asarray(b).view(np.uint32))


ENCODERS = {
    "threshold_encode": lambda r: ops.threshold_encode(r, 0.5),
    "bitmap_encode": lambda r: ops.bitmap_encode(r, 0.5),
    "encode": lambda r: ops.encode(r, 0.5),
    "reference.threshold_encode": lambda r: reference.threshold_encode(r, 0.5),
    "reference.bitmap_encode": lambda r: reference.bitmap_encode(r, 0.5),
}


# ------------------------------------------------------------- NaN and inf
@pytest.mark.parametrize("encoder", ENCODERS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_non_finite_residual_rejected_untouched(encoder, dtype):
    r = np.full(40, 2.0, dtype)  # everything qualifies: a one-pass encoder would have written
    r[7] = np.nan
    r[33] = -np.inf
    r[39] = np.inf  # in the 8-value tail
    before = r.copy()
    with pytest.raises(ValueError, match=r"3 non-finite value\(s\).*first at index 7"):
        ENCODERS[encoder](r)
    assert same_bits(r, before)


@given(
    arrays(np.float32, st.integers(1, 100), elements=st.floats(-4, 4, width=32)),
    st.data(),
)
def test_non_finite_anywhere(r, data):
    where = data.draw(st.lists(st.integers(0, len(r) - 1), min_size=1, unique=True))
    bad = data.draw(st.sampled_from([np.nan, np.inf, -np.inf]))
    r[where] = bad
    before = r.copy()
    for encode in (ops.threshold_encode, ops.bitmap_encode):
        with pytest.raises(ValueError, match=rf"{len(where)} non-finite.*index {min(where)}\b"):
            encode(r, 0.25)
        assert same_bits(r, before)


# ---------------------------------------------------------------- thresholds
@pytest.mark.parametrize("tau", [0.0, -1.0, np.nan, np.inf, -np.inf, 1e-50, 1e39])
def test_bad_threshold_value(tau):
    r = np.ones(8, np.float32)
    for call in (ops.threshold_encode, ops.bitmap_encode, ops.encode, ops.count_above,
                 ops.clip_residual):
        with pytest.raises(ValueError, match="threshold"):
            call(r, tau)
    assert np.all(r == 1.0)


@pytest.mark.parametrize("tau", ["0.5", None, True])
def test_bad_threshold_type(tau):
    with pytest.raises(TypeError, match="threshold"):
        ops.threshold_encode(np.ones(8, np.float32), tau)


@pytest.mark.parametrize("limit", [-1, 2.5, True])
def test_bad_limit(limit):
    with pytest.raises((TypeError, ValueError), match="limit"):
        ops.threshold_encode(np.ones(8, np.float32), 0.5, limit)


def test_bad_clip_factor():
    with pytest.raises(ValueError, match="clip factor"):
        ops.clip_residual(np.ones(3, np.float32), 0.5, k=0)


# ------------------------------------------------------------ array layout
@pytest.mark.parametrize("encoder", ["threshold_encode", "bitmap_encode", "encode"])
def test_residual_dtype_and_layout(encoder):
    call = ENCODERS[encoder]
    with pytest.raises(TypeError, match="float32"):
        call(np.ones(8, np.float16))
    with pytest.raises(TypeError, match="float32"):
        call(np.ones(8, np.int32))
    with pytest.raises(TypeError, match="numpy or CuPy array"):
        call([1.0, 2.0])
    with pytest.raises(ValueError, match="C-contiguous"):
        call(np.ones(16, np.float32)[::2])
    with pytest.raises(ValueError, match="1-D"):
        call(np.ones((4, 4), np.float32))
    frozen = np.ones(8, np.float32)
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="writeable"):
        call(frozen)


def test_count_above_converts_strided_input():
    r = np.arange(20, dtype=np.float32)
    assert ops.count_above(r[::2], 10.0) == 5
    assert ops.count_above(r.reshape(4, 5), 10.0) == 10


# ------------------------------------------------------------ bad messages
def _sparse(n=8):
    r = np.zeros(n, np.float32)
    r[[1, 5]] = [1.0, -1.0]
    return ops.threshold_encode(r, 0.5)


def _bitmap(n=40):
    r = np.zeros(n, np.float32)
    r[[1, 5, n - 5]] = [1.0, -1.0, 1.0]
    return ops.bitmap_encode(r, 0.5)


def _edit(message, pos, value):
    m = message.copy()
    m[pos] = value
    return m


# case: (message maker, target length, what the error says)
BAD_MESSAGES = {
    "header N != target": (lambda: _edit(_sparse(), 1, 9), 8, "N = 9"),
    "count past body": (lambda: _edit(_sparse(), 0, 3), 8, "count 3 does not fit"),
    "negative count": (lambda: _edit(_sparse(), 0, -1), 8, "count -1"),
    "index 0": (lambda: _edit(_sparse(), 5, 0), 8, "entry 1 is 0"),
    "index past N": (lambda: _edit(_sparse(), 4, 9), 8, "entry 0 is 9"),
    "index below -N": (lambda: _edit(_sparse(), 5, -9), 8, "entry 1 is -9"),
    "int32 min": (lambda: _edit(_sparse(), 5, -(2**31)), 8, "entry 1 is -2147483648"),
    "unknown flag": (lambda: _edit(_sparse(), 3, 3), 8, "Unknown encoding flag 3"),
    "short": (lambda: _sparse()[:3], 8, "at least 4"),
    "nan tau": (lambda: _edit(_sparse(), 2, 0x7FC00000), 8, "not a finite float32 > 0"),
    "negative tau": (lambda: _edit(_sparse(), 2, tau_bits(-0.5)), 8, "not a finite float32 > 0"),
    "bitmap N != target": (lambda: _edit(_bitmap(), 1, 41), 40, "N = 41"),
    "bitmap word 0": (lambda: _edit(_bitmap(), 0, 3), 40, "words 0 and 1"),
    "bitmap length": (lambda: np.append(_bitmap(), 0).astype(np.int32), 40, "must have 7 words"),
    "sign bit alone": (lambda: _edit(_bitmap(), 4, 1 << 18), 40, "sign bit"),
    "bit past N": (lambda: _edit(_bitmap(), 6, 1 << 9), 40, "past element 39"),
    "spare word": (lambda: _edit(_bitmap(32), 6, 1), 32, "past element 31"),
}


@pytest.mark.parametrize("case", BAD_MESSAGES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_bad_message_rejected_target_untouched(case, dtype):
    make, n, match = BAD_MESSAGES[case]
    target = np.arange(n, dtype=dtype) - 3.5
    before = target.copy()
    with pytest.raises(ValueError, match=match):
        ops.decode(make(), target)
    assert same_bits(target, before)


def test_decoder_checks_flag():
    with pytest.raises(ValueError, match="use bitmap_decode"):
        ops.threshold_decode(_bitmap(), np.zeros(40, np.float32))
    with pytest.raises(ValueError, match="use threshold_decode"):
        ops.bitmap_decode(_sparse(), np.zeros(8, np.float32))


def test_message_dtype_and_target_layout():
    with pytest.raises(TypeError, match="int32"):
        ops.decode(_sparse().astype(np.int64), np.zeros(8, np.float32))
    with pytest.raises(ValueError, match="C-contiguous"):
        ops.decode(_sparse(), np.zeros(16, np.float32)[::2])
    with pytest.raises(TypeError, match="float32"):
        ops.decode(_sparse(), np.zeros(8, np.int32))
    # A strided (read-only) message is converted.
    spread = np.zeros(2 * 6, np.int32)
    spread[::2] = _sparse()
    target = np.zeros(8, np.float32)
    ops.decode(spread[::2], target)
    assert list(np.flatnonzero(target)) == [1, 5]


def test_encoding_state_rejects_bad_limit():
    with pytest.raises(ValueError, match="limit"):
        ops.EncodingState(limit=-3)
