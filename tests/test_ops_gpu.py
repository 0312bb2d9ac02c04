"""The CuPy kernels against the numpy reference (skipped without CUDA).

Same properties as the CPU tests: encoders and decoders agree with the
reference bit for bit (they only add/subtract float32 tau), updaters
closely (nvrtc may contract multiply-adds into FMAs), and bad input is
rejected with the target left alone.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from sparkavg import backend, ops
from sparkavg.ops import reference

pytestmark = pytest.mark.gpu

lengths = st.integers(0, 180)
general = arrays(np.float32, lengths, elements=st.floats(-100, 100, width=32))
taus = st.floats(2.0**-10, 50.0, width=32)
few = settings(max_examples=25)


def gpu(a):
    return backend.to_gpu(a)


def host(a):
    return None if a is None else backend.to_cpu(a)


def same_bits(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


@few
@given(general, taus, st.one_of(st.none(), st.integers(0, 200)))
def test_sparse_encode_matches_reference(r, tau, limit):
    d = gpu(r)
    want_r = r.copy()
    got = ops.threshold_encode(d, tau, limit)
    want = reference.threshold_encode(want_r, tau, limit)
    assert (got is None) == (want is None)
    if got is not None:
        assert backend.is_gpu_array(got) and np.array_equal(host(got), want)
    assert same_bits(host(d), want_r)


@few
@given(general, taus)
def test_bitmap_encode_matches_reference(r, tau):
    d = gpu(r)
    want_r = r.copy()
    got = ops.bitmap_encode(d, tau)
    want = reference.bitmap_encode(want_r, tau)
    assert np.array_equal(host(got), want)
    assert same_bits(host(d), want_r)
    assert ops.encoded_count(got) == ops.encoded_count(want)


@few
@given(general, taus, st.booleans(), st.booleans())
def test_decode_matches_reference(r, tau, use_bitmap, message_on_device):
    message = (reference.bitmap_encode if use_bitmap else reference.threshold_encode)(r.copy(), tau)
    if message is None:
        return
    start = r.copy()
    d = gpu(start)
    ops.decode(gpu(message) if message_on_device else message, d)
    want = start.copy()
    (reference.bitmap_decode if use_bitmap else reference.threshold_decode)(message, want)
    assert same_bits(host(d), want)


@few
@given(arrays(np.float32, lengths, elements=st.integers(-512, 512).map(lambda k: k / 64)),
       st.integers(-4, 2), st.booleans())
def test_round_trip_exact(r0, j, use_bitmap):
    tau = 2.0**j
    d = gpu(r0)
    m = ops.bitmap_encode(d, tau) if use_bitmap else ops.threshold_encode(d, tau, len(r0) + 2)
    received = gpu(np.zeros_like(r0))
    if m is not None:
        ops.decode(m, received)
    assert np.array_equal(host(received) + host(d), r0)


@pytest.mark.parametrize("n", [1, 33, 4097, 1 << 17, (1 << 20) + 5])
@pytest.mark.parametrize("density", [1e-3, 0.05, 0.6])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_encoders_bit_for_bit_at_size(n, density, dtype):
    """Many tiles and warps: messages, counts and residuals equal the reference's."""
    rng = np.random.default_rng(n)
    r = rng.standard_normal(n).astype(dtype)
    tau = float(np.float32(np.quantile(np.abs(r), 1 - density)))
    for limit in (n, max(n // 16, 2)):
        d, want_r = gpu(r), r.copy()
        got = ops.threshold_encode(d, tau, limit)
        want = reference.threshold_encode(want_r, tau, limit)
        assert (got is None) == (want is None)
        if got is not None:
            assert np.array_equal(host(got), want)
        assert same_bits(host(d), want_r)
    d, want_r = gpu(r), r.copy()
    got = ops.bitmap_encode(d, tau)
    want = reference.bitmap_encode(want_r, tau)
    assert np.array_equal(host(got), want) and same_bits(host(d), want_r)
    target, want_t = gpu(r), r.copy()
    ops.decode(got, target)
    reference.bitmap_decode(want, want_t)
    assert same_bits(host(target), want_t)


def test_non_finite_rejected_untouched():
    r = np.full(40, 2.0, np.float32)
    r[[7, 39]] = [np.nan, np.inf]
    d = gpu(r)
    for encode in (ops.threshold_encode, ops.bitmap_encode, ops.encode):
        with pytest.raises(ValueError, match=r"2 non-finite.*index 7"):
            encode(d, 0.5)
        assert same_bits(host(d), r)


@pytest.mark.parametrize("edit, match", [((5, 0), "entry 1 is 0"), ((4, 9), "entry 0 is 9"),
                                         ((1, 9), "N = 9"), ((3, 2), "flag 2")])
def test_bad_sparse_message_rejected(edit, match):
    r = np.zeros(8, np.float32)
    r[[1, 5]] = [1.0, -1.0]
    m = reference.threshold_encode(r, 0.5)
    m[edit[0]] = edit[1]
    target = gpu(np.arange(8, dtype=np.float32))
    with pytest.raises(ValueError, match=match):
        ops.decode(gpu(m), target)
    assert np.array_equal(host(target), np.arange(8, dtype=np.float32))


def test_bad_bitmap_message_rejected():
    m = reference.bitmap_encode(np.zeros(40, np.float32), 0.5)
    target = gpu(np.arange(40, dtype=np.float32))
    for pos, word, match in [(4, 1 << 18, "sign bit"), (6, 1 << 9, "past element 39")]:
        bad = m.copy()
        bad[pos] = word
        with pytest.raises(ValueError, match=match):
            ops.decode(gpu(bad), target)
    assert np.array_equal(host(target), np.arange(40, dtype=np.float32))


@few
@given(general, taus, st.floats(0.5, 8.0))
def test_count_and_clip(r, tau, k):
    assert ops.count_above(gpu(r), tau) == reference.count_above(r, tau)
    d = gpu(r)
    want = r.copy()
    ops.clip_residual(d, tau, k)
    reference.clip_residual(want, tau, k)
    assert same_bits(host(d), want)


# Arrays each elementwise kernel takes, and its scalars.  Looked up for every
# elementwise kernel of the front, so a new one without a case fails at
# collection, with or without a GPU.
ELEMENTWISE_CASES = {
    "accumulate": (2, dict(weight=0.3)),
    "scale": (1, dict(factor=0.7)),
    "sgd_step": (2, dict(lr=0.01)),
    "nesterov_step": (3, dict(lr=0.01, momentum=0.9)),
    "adagrad_step": (3, dict(lr=0.01)),
    "rmsprop_step": (3, dict(lr=0.01)),
    "adam_step": (4, dict(lr=0.01, t=7)),
}
UPDATERS = [(name, *ELEMENTWISE_CASES[name]) for name in ops.KERNELS
            if name in ops.elementwise.__all__]


@pytest.mark.parametrize("name, k, kwargs", UPDATERS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_updaters_match_reference(name, k, kwargs, dtype):
    rng = np.random.default_rng(0)
    arrays_in = [rng.standard_normal(10_001).astype(dtype) for _ in range(k)]
    if k >= 3:
        arrays_in[-1] = np.abs(arrays_in[-1])  # history / cache / v are >= 0
    dev = [gpu(a) for a in arrays_in]
    getattr(ops, name)(*dev, **kwargs)
    getattr(reference, name)(*arrays_in, **kwargs)
    for d, a in zip(dev, arrays_in):
        np.testing.assert_allclose(host(d), a, rtol=1e-5, atol=1e-6)


def test_switching_on_device():
    rng = np.random.default_rng(0)
    r = ((rng.random(1600, dtype=np.float32) - 0.5) * 0.99)
    r[rng.choice(1600, 10, replace=False)] = 1.5
    d = gpu(r)
    state = ops.EncodingState()
    assert int(host(ops.encode(d, 1.0, state))[3]) == 1 and state.format == ops.SPARSE
    d += gpu(r)
    assert int(host(ops.encode(d, 1.0, state))[3]) == 0


def test_mixed_devices_rejected():
    with pytest.raises(TypeError, match="numpy array like buffer"):
        ops.accumulate(np.zeros(4, np.float32), gpu(np.zeros(4, np.float32)))
