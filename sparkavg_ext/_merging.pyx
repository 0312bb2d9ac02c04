"""Sums of threshold messages in the merged format (:mod:`sparkavg.ops.merging`).

:func:`merge_pair` sums two messages (sparse, or sparse merged) into the
merged message's words in one call -- headers read, entries checked
(ascending, in ``[0, N)``, no zero count), the two ascending lists merged
(the counts of an index both carry summed, the sums that cancel dropped),
the result packed -- with no numpy call per step: a rank of ``Topology.TREE``
merges once per exchange, on the critical path of every iteration.
:func:`add_counts` / :func:`add_dense_counts` add ``count * τ`` into a
float32 target.  A fault is reported, not raised (None, or the first bad
entry): the caller then takes the numpy path, which names what is wrong.

The merge is branch-free per entry (which list's head is smaller is a
compare, not a jump): with the two lists' indices interleaved at random a
branch would mispredict about every other entry.
"""
from libc.stdint cimport int8_t, int16_t, int32_t, int64_t, uint32_t

import numpy as np

__all__ = ["merge_pair", "add_counts", "add_dense_counts"]

ctypedef fused count_a:
    int8_t
    int16_t
    int32_t


cdef Py_ssize_t _check_sorted(const int32_t* idx, const count_a* cnt, Py_ssize_t m,
                              Py_ssize_t n) noexcept nogil:
    """The first entry that is not ascending, out of [0, n) or a zero count, or -1."""
    cdef Py_ssize_t k
    cdef int32_t prev = -1
    for k in range(m):
        if idx[k] <= prev or cnt[k] == 0:
            return k
        prev = idx[k]
    if m and idx[m - 1] >= n:
        return m - 1
    return -1


cdef enum:
    HEADER = 4               # a libnd4j message's header words
    MERGED_HEADER = 7        # a merged message's
    SPARSE_FLAG = 0
    MERGED_FLAG = 2
    MAX_COUNT_1 = 127
    MAX_COUNT_2 = 32767


cdef struct Entries:
    # One message's entries as the merge reads them: a sparse message's signed 1-based words, or a merged
    # message's ascending indices and int8/int16 counts.
    const int32_t* words     # sparse: the body; merged: the indices
    const void* counts       # merged: the packed counts
    Py_ssize_t m
    int width                # 0: sparse (count = the word's sign), 1 or 2: merged
    int64_t sent


cdef int _read(const int32_t* w, Py_ssize_t size, Py_ssize_t n, int32_t* bits, Entries* e) noexcept nogil:
    """Fill ``e`` from the words of one message; 0, or -1 when it is not a
    sparse / sparse merged message for N = ``n`` with a body of its length."""
    cdef Py_ssize_t count
    cdef int layout
    if size < HEADER or w[1] != n:
        return -1
    count = w[0]
    bits[0] = w[2]
    if w[3] == SPARSE_FLAG:
        if count < 0 or count > size - HEADER:
            return -1
        e.words, e.counts, e.m, e.width, e.sent = w + HEADER, NULL, count, 0, count
        return 0
    if w[3] != MERGED_FLAG or size < MERGED_HEADER:
        return -1
    layout = w[4]
    if (layout >> 8) != 0 or (layout & 0xFF) not in (1, 2) or count < 0:
        return -1           # dense, or a bad layout
    e.width = layout & 0xFF
    if (size - MERGED_HEADER) * 4 != count * 4 + (count * e.width + 3) // 4 * 4:
        return -1
    e.words, e.counts, e.m = w + MERGED_HEADER, w + MERGED_HEADER + count, count
    e.sent = <int64_t>(<uint32_t>w[5]) | (<int64_t>(<uint32_t>w[6]) << 32)
    return 0


cdef inline int32_t _index(const Entries* e, Py_ssize_t k) noexcept nogil:
    cdef int32_t v
    if e.width == 0:
        v = e.words[k]
        return (v if v > 0 else -v) - 1      # INT32_MIN stays negative: refused as out of order
    return e.words[k]


cdef inline int32_t _count(const Entries* e, Py_ssize_t k) noexcept nogil:
    if e.width == 0:
        return 1 if e.words[k] > 0 else -1
    if e.width == 1:
        return (<const int8_t*>e.counts)[k]
    return (<const int16_t*>e.counts)[k]


cdef Py_ssize_t _check(const Entries* e, Py_ssize_t n) noexcept nogil:
    """The first entry not ascending, out of [0, n) or with a zero count, or -1."""
    cdef Py_ssize_t k
    cdef int32_t prev = -1, i
    for k in range(e.m):
        i = _index(e, k)
        if i <= prev or _count(e, k) == 0:
            return k
        prev = i
    if e.m and prev >= n:
        return e.m - 1
    return -1


cdef Py_ssize_t _merge(const Entries* a, const Entries* b,
                       int32_t* oi,          # OUT (a.m + b.m,)
                       int32_t* oc,          # OUT (a.m + b.m,)
                       int32_t* top,         # OUT the largest |count|
                       ) noexcept nogil:
    """Merge two checked lists; returns how many entries were written."""
    cdef Py_ssize_t ka = 0, kb = 0, m = 0, k
    cdef int32_t x, y, c, t = 0
    cdef bint take_a, take_b
    while ka < a.m and kb < b.m:
        x = _index(a, ka)
        y = _index(b, kb)
        take_a = x <= y
        take_b = y <= x
        c = (_count(a, ka) if take_a else 0) + (_count(b, kb) if take_b else 0)
        oi[m] = x if take_a else y
        oc[m] = c
        m += c != 0             # a cancelled sum is overwritten by the next entry
        ka += take_a
        kb += take_b
    while ka < a.m:
        oi[m] = _index(a, ka)
        oc[m] = _count(a, ka)
        ka += 1
        m += 1
    while kb < b.m:
        oi[m] = _index(b, kb)
        oc[m] = _count(b, kb)
        kb += 1
        m += 1
    for k in range(m):
        c = oc[k] if oc[k] >= 0 else -oc[k]
        t = c if c > t else t
    top[0] = t
    return m


cdef void _pack(const int32_t* counts, Py_ssize_t m, int width, void* out) noexcept nogil:
    """The first ``m`` counts as ``width``-byte integers, zero-padded to a whole word."""
    cdef Py_ssize_t k
    cdef int8_t* o1 = <int8_t*>out
    cdef int16_t* o2 = <int16_t*>out
    if width == 1:
        for k in range(m):
            o1[k] = <int8_t>counts[k]
        for k in range(m, (m + 3) // 4 * 4):
            o1[k] = 0
    else:
        for k in range(m):
            o2[k] = <int16_t>counts[k]
        if m % 2:
            o2[m] = 0


def merge_pair(const int32_t[::1] a, const int32_t[::1] b, Py_ssize_t n):
    """The merged message of two messages -- each a sparse or sparse merged
    message at one τ (:mod:`sparkavg.ops.merging`'s format) -- as int32 words.

    Returns None when either is another format (bitmap, dense merged), a
    header is not right for N = ``n``, their τ differ, an entry is not
    ascending, in range and nonzero, or a sum is wider than 16 bits: the
    numpy path then merges them, or names the fault.  The words are those
    of ``merging.merged_message`` for the same sum (dense where smaller).
    """
    cdef Entries ea, eb
    cdef int32_t bits_a = 0, bits_b = 0, top = 0
    cdef Py_ssize_t m, bad = 0, total = 0, width, words, k
    cdef int64_t sent
    cdef bint dense
    if a.shape[0] == 0 or b.shape[0] == 0:
        return None
    if _read(&a[0], a.shape[0], n, &bits_a, &ea) < 0 or _read(&b[0], b.shape[0], n, &bits_b, &eb) < 0:
        return None
    if bits_a != bits_b:
        return None
    merged_i = np.empty(max(ea.m + eb.m, 1), dtype=np.int32)
    merged_c = np.empty(max(ea.m + eb.m, 1), dtype=np.int32)
    cdef int32_t[::1] oi = merged_i
    cdef int32_t[::1] oc = merged_c
    with nogil:
        bad = _check(&ea, n)
        if bad < 0:
            bad = _check(&eb, n)
        if bad < 0:
            m = _merge(&ea, &eb, &oi[0], &oc[0], &top)
    if bad >= 0 or top > MAX_COUNT_2:
        return None
    width = 1 if top <= MAX_COUNT_1 else 2
    dense = m * (4 + width) > n * width
    sent = ea.sent + eb.sent
    words = MERGED_HEADER + ((n * width + 3) // 4 if dense else m + (m * width + 3) // 4)
    out = np.empty(words, dtype=np.int32)
    cdef int32_t[::1] o = out
    o[0] = <int32_t>(n if dense else m)
    o[1] = <int32_t>n
    o[2] = bits_a
    o[3] = MERGED_FLAG
    o[4] = <int32_t>(width | (dense << 8))
    o[5] = <int32_t>(<uint32_t>sent)  # the low 32 bits
    o[6] = <int32_t>(<uint32_t>(sent >> 32))
    with nogil:
        if dense:
            for k in range(MERGED_HEADER, words):
                o[k] = 0
            for k in range(m):
                if width == 1:
                    (<int8_t*>&o[MERGED_HEADER])[oi[k]] = <int8_t>oc[k]
                else:
                    (<int16_t*>&o[MERGED_HEADER])[oi[k]] = <int16_t>oc[k]
        else:
            for k in range(m):
                o[MERGED_HEADER + k] = oi[k]
            _pack(&oc[0], m, width, &o[MERGED_HEADER + m])
    return out


def add_counts(const int32_t[::1] indices, const count_a[::1] counts, float tau, float[::1] target):
    """``target[indices[k]] += float32(counts[k]) * tau`` in place, after checking
    every index (ascending, in range) and count (nonzero); returns -1, or the
    first bad entry (the target then untouched)."""
    cdef Py_ssize_t m = indices.shape[0], n = target.shape[0], k, bad
    cdef float v
    if counts.shape[0] != m:
        raise ValueError(f"Expect as many counts as indices, got {counts.shape[0]} and {m}")
    if m == 0:
        return -1
    with nogil:
        bad = _check_sorted(&indices[0], &counts[0], m, n)
        if bad < 0:
            for k in range(m):
                v = <float>counts[k] * tau   # rounded to float32 before the add, as numpy's two passes
                target[indices[k]] += v
    return bad


def add_dense_counts(const count_a[::1] counts, float tau, float[::1] target):
    """``target[i] += float32(counts[i]) * tau`` for every nonzero count (adding
    0 would turn -0.0 into +0.0), in place; ``counts`` as long as ``target``."""
    cdef Py_ssize_t n = target.shape[0], i
    cdef float v
    if counts.shape[0] != n:
        raise ValueError(f"Expect {n} dense counts, got {counts.shape[0]}")
    with nogil:
        for i in range(n):
            if counts[i] != 0:
                v = <float>counts[i] * tau
                target[i] += v
    return target
