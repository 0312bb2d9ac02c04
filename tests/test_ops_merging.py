"""The merged format a tree of ranks relays (sparkavg.ops.merging): the sum of
threshold messages at one τ, held to the entry-by-entry reference, to the
sum of the messages decoded one by one, and merged level by level."""
from __future__ import annotations

import contextlib

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from sparkavg import ops
from sparkavg.ops import merging, reference_merging

TAU = 0.25


@st.composite
def rank_messages(draw, max_ranks=9, max_n=200):
    """Messages of 1..max_ranks ranks at one τ, each rank's format its encoder's (sparse, bitmap, or a capped
    sparse one), from residuals on a grid of τ/4."""
    n = draw(st.integers(1, max_n))
    ranks = draw(st.integers(1, max_ranks))
    out = []
    for _ in range(ranks):
        residual = draw(arrays(np.float32, n, elements=st.integers(-12, 12).map(lambda k: k * TAU / 4)))
        how = draw(st.sampled_from(["switching", "sparse", "bitmap", "capped"]))
        if how == "switching":
            state = ops.EncodingState()
            state.format = draw(st.sampled_from([ops.SPARSE, ops.BITMAP]))
            message = ops.encode(residual, TAU, state)
        elif how == "sparse":
            message = ops.threshold_encode(residual, TAU)
        elif how == "capped":
            message = ops.threshold_encode(residual, TAU, limit=draw(st.integers(2, 5)))
        else:
            message = ops.bitmap_encode(residual, TAU)
        out.append(message)
    return n, out


def decoded_one_by_one_as_counts(messages, n):
    """Per index, the integer count of τ the messages carry (each decoded alone into float64 zeros)."""
    total = np.zeros(n, np.float64)
    for m in messages:
        if m is not None:
            target = np.zeros(n, np.float64)
            ops.decode(m, target)
            total += target / np.float64(np.float32(TAU))
    return np.rint(total).astype(np.int64)


@given(rank_messages())
def test_merge_equals_reference_word_for_word_and_the_messages_sum(case):
    n, messages = case
    merged = ops.merge_messages(messages, n)
    present = [m for m in messages if m is not None]
    if not present:
        assert merged is None
        return
    if len(present) == 1:
        assert merged is present[0]  # kept as it is
        return
    expected = reference_merging.merge_messages(present, n)
    assert merged.dtype == np.int32 and np.array_equal(merged, expected)
    assert int(merged[3]) == ops.MERGED_FLAG
    assert ops.encoded_count(merged) == sum(ops.encoded_count(m) for m in present)
    tau, sent, indices, counts = merging.merged_parts(merged, n)
    full = counts if indices is None else np.bincount(indices, counts, minlength=n).astype(np.int64)
    assert np.array_equal(full, decoded_one_by_one_as_counts(present, n))
    width = int(merged[4]) & 0xFF
    assert width == (1 if np.abs(full).max(initial=0) <= 127 else 2)
    nonzero = int(np.count_nonzero(full))
    assert (indices is None) == (nonzero * (4 + width) > n * width)  # dense exactly where it is smaller


@given(rank_messages(), st.data())
def test_merging_level_by_level_gives_the_same_words_as_all_at_once(case, data):
    n, messages = case
    present = [m for m in messages if m is not None]
    if len(present) < 3:
        return
    cut = data.draw(st.integers(1, len(present) - 1))
    left, right = ops.merge_messages(present[:cut], n), ops.merge_messages(present[cut:], n)
    two_level = ops.merge_messages([left, right], n)
    assert np.array_equal(two_level, ops.merge_messages(present, n))
    assert np.array_equal(ops.merge_messages(list(reversed(present)), n), ops.merge_messages(present, n))


@given(rank_messages(), arrays(np.float32, 200, elements=st.floats(-4, 4, width=32)))
def test_decode_adds_count_times_tau_as_the_reference_does(case, start):
    n, messages = case
    present = [m for m in messages if m is not None]
    if len(present) < 2:
        return
    merged = ops.merge_messages(present, n)
    fast, slow = start[:n].copy(), start[:n].copy()
    ops.decode(merged, fast)
    reference_merging.decode_merged(merged, slow)
    assert np.array_equal(fast.view(np.uint32), slow.view(np.uint32))
    # as bytes off the wire, through sharing's own apply
    from sparkavg.sharing import apply_message, message_bytes
    wire = start[:n].copy()
    assert apply_message(message_bytes(merged), wire) == ops.encoded_count(merged)
    assert np.array_equal(wire.view(np.uint32), fast.view(np.uint32))


def test_dense_switch_and_wide_counts():
    n = 40
    residual = np.full(n, 1.0, np.float32)
    messages = [ops.bitmap_encode(residual.copy(), TAU) for _ in range(200)]  # 200 ranks send +τ everywhere
    merged = ops.merge_messages(messages, n)
    tau, sent, indices, counts = merging.merged_parts(merged, n)
    assert indices is None and (int(merged[4]) & 0xFF) == 2 and np.all(counts == 200) and sent == 200 * n
    target = np.zeros(n, np.float32)
    ops.decode(merged, target)
    assert np.all(target == np.float32(200) * np.float32(TAU))


def test_cancelled_entries_still_count_as_sent():
    n = 64
    up, down = np.zeros(n, np.float32), np.zeros(n, np.float32)
    up[[3, 9]], down[[3, 9]] = 1.0, -1.0
    merged = ops.merge_messages([ops.threshold_encode(up, TAU), ops.threshold_encode(down, TAU)], n)
    assert int(merged[0]) == 0 and ops.encoded_count(merged) == 4  # nothing to add, four entries sent
    target = np.full(n, -0.0, np.float32)
    ops.decode(merged, target)
    assert np.all(np.signbit(target))  # untouched: -0.0 stays


def test_merge_names_what_is_wrong():
    n = 32
    r = np.zeros(n, np.float32)
    r[:4] = 1.0
    a = ops.threshold_encode(r.copy(), TAU)
    b = ops.threshold_encode(r.copy(), 0.5)
    with pytest.raises(ValueError, match="one threshold") as info:
        ops.merge_messages([a, b], n)
    assert "0.25" in str(info.value) and "0.5" in str(info.value)
    with pytest.raises(ValueError, match="N = 32"):
        ops.merge_messages([a, a], 33)
    bad = a.copy()
    bad[3] = 7
    with pytest.raises(ValueError, match="Unknown encoding flag 7"):
        ops.merge_messages([a, bad], n)
    merged = ops.merge_messages([a, a], n)
    with pytest.raises(ValueError, match="body words"):
        ops.decode(merged[:-1], np.zeros(n, np.float32))
    target = np.zeros(n + 1, np.float32)
    with pytest.raises(ValueError, match="N = 32"):
        ops.decode(merged, target)
    assert not target.any()


# ------------------------------------------------- the kernels (sparkavg_ext._merging) and the numpy path
PATHS = pytest.mark.parametrize("path", ["kernels", "numpy"])


@contextlib.contextmanager
def through(path):
    """Merging through the kernels or the numpy path (``SPARKAVG_PURE_NUMPY``, the routing rule's switch)."""
    if path == "kernels" and not ops.have_extension():
        pytest.skip("sparkavg_ext is not built")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPARKAVG_PURE_NUMPY", "1" if path == "numpy" else "0")
        yield


@st.composite
def sparse_rank_messages(draw):
    """Sparse messages of 2..9 ranks on a vector long enough that their sums stay sparse (the kernels'
    path), at one τ; some ranks' sends overlap, with either sign."""
    n = draw(st.integers(200, 3000))
    out = []
    for _ in range(draw(st.integers(2, 9))):
        residual = np.zeros(n, np.float32)
        hot = draw(st.lists(st.integers(0, 39), max_size=30, unique=True))  # a shared range: sums and cancels
        cold = draw(st.lists(st.integers(0, n - 1), max_size=20, unique=True))
        for i in hot + cold:
            residual[i] = draw(st.sampled_from([-1.5, 1.5])) * TAU
        out.append(ops.threshold_encode(residual, TAU))
    return n, [m for m in out if m is not None]


@PATHS
@given(sparse_rank_messages(), st.data())
def test_sparse_sums_equal_the_reference_on_either_path(path, case, data):
    n, present = case
    if len(present) < 2:
        return
    with through(path):
        _sums_equal_the_reference(n, present, data)


def _sums_equal_the_reference(n, present, data):
    merged = ops.merge_messages(present, n)
    assert np.array_equal(merged, reference_merging.merge_messages(present, n))
    cut = data.draw(st.integers(1, len(present) - 1))
    left, right = ops.merge_messages(present[:cut], n), ops.merge_messages(present[cut:], n)
    assert np.array_equal(ops.merge_messages([left, right], n), merged)  # merged messages merged again
    start = np.linspace(-1, 1, n, dtype=np.float32)
    fast, slow = start.copy(), start.copy()
    ops.decode(merged, fast)
    reference_merging.decode_merged(merged, slow)
    assert np.array_equal(fast.view(np.uint32), slow.view(np.uint32))


@PATHS
def test_messages_off_the_kernels_path_merge_as_the_reference_does(path):
    """A sparse message whose indices are out of order or repeat (not what the encoder sends, but a valid
    message), a bitmap and a dense merge: the same words as the reference on either path."""
    with through(path):
        _off_the_kernels_path()


def _off_the_kernels_path():
    n, tau_bits = 64, int(np.float32(TAU).view(np.int32))
    unordered = np.array([3, n, tau_bits, 0, 9, -2, 9], np.int32)  # +9 twice, -2 between
    r = np.zeros(n, np.float32)
    r[[1, 8, 20]] = TAU
    sparse = ops.threshold_encode(r.copy(), TAU)
    bitmap = ops.bitmap_encode(r.copy(), TAU)
    dense = ops.merge_messages([ops.bitmap_encode(np.full(n, TAU, np.float32), TAU) for _ in range(3)], n)
    for present in ([unordered, sparse], [sparse, bitmap], [dense, sparse], [unordered, dense, bitmap]):
        assert np.array_equal(ops.merge_messages(present, n), reference_merging.merge_messages(present, n))


@PATHS
def test_a_bad_merged_entry_is_named_and_the_target_untouched(path):
    with through(path):
        _bad_entries()


def _bad_entries():
    n = 300
    r = np.zeros(n, np.float32)
    r[[5, 50, 150]] = TAU
    merged = ops.merge_messages([ops.threshold_encode(r.copy(), TAU), ops.threshold_encode(r.copy(), TAU)], n)
    assert int(merged[0]) == 3 and int(merged[4]) == 1  # sparse, width 1
    descending = merged.copy()
    descending[[7, 8]] = descending[[8, 7]]
    zero = merged.copy()
    zero[10] = 0  # the three int8 counts are the low bytes of word 10
    for bad, match in ((descending, "ascending"), (zero, "zero count")):
        target = np.zeros(n, np.float32)
        with pytest.raises(ValueError, match=match):
            ops.decode(bad, target)
        assert not target.any()
        with pytest.raises(ValueError, match=match):
            ops.merge_messages([bad, merged], n)


@PATHS
def test_the_kernels_run_where_the_routing_rule_says(path, monkeypatch):
    from sparkavg.ops import _cython

    calls = []
    for name in _cython.MERGING:
        original = getattr(_cython, name)
        monkeypatch.setattr(_cython, name, lambda *a, _f=original, _n=name: calls.append(_n) or _f(*a))
    n = 300
    r = np.zeros(n, np.float32)
    r[[5, 50, 150]] = TAU
    sparse = ops.threshold_encode(r, TAU)
    with through(path):
        ops.decode(ops.merge_messages([sparse, sparse], n), np.zeros(n, np.float32))
    assert calls == ([] if path == "numpy" else ["merge_pair", "add_counts"])


@PATHS
def test_sparse_sums_that_turn_dense_or_wide_equal_the_reference(path):
    with through(path):
        n = 64
        a, b = np.zeros(n, np.float32), np.zeros(n, np.float32)
        a[:10], b[20:30] = TAU, -TAU
        present = [ops.threshold_encode(a, TAU, limit=16), ops.threshold_encode(b, TAU, limit=16)]
        dense = ops.merge_messages(present, n)
        assert int(dense[4]) >> 8 == 1  # 20 entries of 5 bytes > 64 dense bytes
        assert np.array_equal(dense, reference_merging.merge_messages(present, n))
        n = 1000
        r = np.zeros(n, np.float32)
        r[[3, 700]] = [TAU, -TAU]
        many = [ops.threshold_encode(r.copy(), TAU) for _ in range(200)]
        wide = ops.merge_messages(many, n)
        assert int(wide[4]) == 2 and int(wide[0]) == 2  # sparse, counts of 16 bits (+-200)
        assert np.array_equal(wide, reference_merging.merge_messages(many, n))
