# C-level kernels of sparkavg_ext._threshold, for other extension modules.
#
# Wire formats (libnd4j, see sparkavg.ops): sparse ("flexible") messages are
# [count, N, bits(tau), 0, +-(i+1)...]; bitmap messages are
# [N, N, bits(tau), 1, word...] where word k covers elements 16k..16k+15,
# bit b = "sends tau", bit b+16 = "negative".  Raw pointers because the
# wrappers hand over offsets into their own buffers.
from libc.stdint cimport int32_t, uint32_t

# Sparse encoding in one pass: counts every |r| >= tau (the return value);
# for the first `limit` of them writes the signed 1-based index to `body`,
# the old value to `orig`, and subtracts +-tau from r; counts NaN/inf into
# bad[0] with the first such index in bad[1].  `body` takes scratch
# positions up to 64 entries past `limit`.
cdef Py_ssize_t _sparse_encode(
    float* r,                # IN/OUT (n,)
    Py_ssize_t n,
    float tau,
    int32_t* body,           # OUT (limit + 64,)
    float* orig,             # OUT (limit,)
    Py_ssize_t limit,
    Py_ssize_t* bad,         # OUT (2,)
) noexcept nogil

# Put back the old values of the first m encoded entries (exact undo).
cdef void _sparse_undo(
    float* r,                # IN/OUT (n,)
    const int32_t* body,     # IN  (m,)
    const float* orig,       # IN  (m,)
    Py_ssize_t m,
) noexcept nogil

# Pass 1 of bitmap encoding: writes n // 16 + 1 words, returns how many
# values they send; NaN/inf counted into bad as above.  Reads only.
cdef Py_ssize_t _bitmap_collect(
    const float* r,          # IN  (n,)
    Py_ssize_t n,
    float tau,
    int32_t* words,          # OUT (n // 16 + 1,)
    Py_ssize_t* bad,         # OUT (2,)
) noexcept nogil

# Pass 2 of bitmap encoding (sign -1) or bitmap decoding (sign +1):
# r[16k+b] -= sign * (+-tau) for every value bit set.
cdef void _bitmap_apply(
    float* r,                # IN/OUT (n,)
    Py_ssize_t n,
    const int32_t* words,    # IN  (nwords,)
    Py_ssize_t nwords,
    float tau,
    bint subtract,
) noexcept nogil

# First invalid sparse body entry (0 or |v| > n), or -1.
cdef Py_ssize_t _sparse_check(const int32_t* body, Py_ssize_t m, Py_ssize_t n) noexcept nogil

# First invalid bitmap word (sign bit without value bit, or a bit past n), or -1.
cdef Py_ssize_t _bitmap_check(const int32_t* words, Py_ssize_t nwords, Py_ssize_t n) noexcept nogil

# target[|v|-1] += sign(v) * tau for the first m body entries.
cdef void _sparse_add(
    float* t,                # IN/OUT (n,)
    const int32_t* body,     # IN  (m,)
    Py_ssize_t m,
    float tau,
) noexcept nogil

cdef Py_ssize_t _count_above(const float* r, Py_ssize_t n, float tau) noexcept nogil

cdef void _clip(float* r, Py_ssize_t n, float bound) noexcept nogil
