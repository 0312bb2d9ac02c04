"""Sums of threshold messages in the merged format (:mod:`sparkavg.ops.merging`).

A message is read as two arrays: ascending int32 indices and their nonzero
counts (int8, int16 or int32: the merged format's widths, and a sparse
message's signs).  :func:`merge_sorted` merges two such lists into one,
summing the counts of an index both carry and dropping the sums that cancel;
:func:`add_counts` / :func:`add_dense_counts` add ``count * τ`` into a float32
target.  Each checks its inputs in the loop that reads them (ascending, in
``[0, N)``, no zero count) and reports the first bad entry instead of
raising: the caller then takes the numpy path, which names what is wrong.

The merge is branch-free per entry (which list's head is smaller is a
compare, not a jump): with the two lists' indices interleaved at random a
branch would mispredict about every other entry.
"""
from libc.stdint cimport int8_t, int16_t, int32_t, INT32_MAX

import numpy as np

__all__ = ["merge_sorted", "add_counts", "add_dense_counts"]

ctypedef fused count_a:
    int8_t
    int16_t
    int32_t

ctypedef fused count_b:
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


cdef Py_ssize_t _merge_sorted(const int32_t* ia, const count_a* ca, Py_ssize_t na,
                              const int32_t* ib, const count_b* cb, Py_ssize_t nb,
                              int32_t* oi,           # OUT (na + nb,)
                              int32_t* oc,           # OUT (na + nb,)
                              ) noexcept nogil:
    """Merge two checked lists; returns how many entries were written."""
    cdef Py_ssize_t a = 0, b = 0, m = 0
    cdef int32_t x, y, c
    cdef bint take_a, take_b
    while a < na and b < nb:
        x = ia[a]
        y = ib[b]
        take_a = x <= y
        take_b = y <= x
        c = (<int32_t>ca[a] if take_a else 0) + (<int32_t>cb[b] if take_b else 0)
        oi[m] = x if take_a else y
        oc[m] = c
        m += c != 0             # a cancelled sum is overwritten by the next entry
        a += take_a
        b += take_b
    while a < na:
        oi[m] = ia[a]
        oc[m] = ca[a]
        a += 1
        m += 1
    while b < nb:
        oi[m] = ib[b]
        oc[m] = cb[b]
        b += 1
        m += 1
    return m


def merge_sorted(const int32_t[::1] ia, const count_a[::1] ca, const int32_t[::1] ib, const count_b[::1] cb,
                 Py_ssize_t n):
    """The sum of two (index, count) lists of a vector of ``n`` values.

    Parameters
    ----------
    ia, ib : int32[m_a], int32[m_b]
        Ascending indices in ``[0, n)``.
    ca, cb : int8, int16 or int32, same lengths
        Their counts, none zero.

    Returns
    -------
    (indices, counts) : int32[m] and int32[m], ascending, no zero count; or
    None when an input breaks the rules above (nothing is raised: the
    caller's numpy path names the fault).
    """
    cdef Py_ssize_t na = ia.shape[0], nb = ib.shape[0], m, bad
    if ca.shape[0] != na or cb.shape[0] != nb:
        raise ValueError(f"Expect as many counts as indices, got {ca.shape[0]} for {na} and {cb.shape[0]} for {nb}")
    out_i = np.empty(na + nb, dtype=np.int32)
    out_c = np.empty(na + nb, dtype=np.int32)
    cdef int32_t[::1] oi = out_i
    cdef int32_t[::1] oc = out_c
    cdef int32_t dummy_i = 0
    cdef int32_t dummy_c = 0
    cdef const int32_t* pia = &ia[0] if na else &dummy_i
    cdef const int32_t* pib = &ib[0] if nb else &dummy_i
    cdef const count_a* pca = &ca[0] if na else <const count_a*>&dummy_c
    cdef const count_b* pcb = &cb[0] if nb else <const count_b*>&dummy_c
    cdef int32_t* poi = &oi[0] if na + nb else &dummy_i
    cdef int32_t* poc = &oc[0] if na + nb else &dummy_c
    with nogil:
        bad = _check_sorted(pia, pca, na, n)
        if bad < 0:
            bad = _check_sorted(pib, pcb, nb, n)
        if bad < 0:
            m = _merge_sorted(pia, pca, na, pib, pcb, nb, poi, poc)
    if bad >= 0:
        return None
    return out_i[:m], out_c[:m]


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
