"""Per-channel kernels of batch and layer normalisation, float32.

Arrays are rows of channels, (M, C), C-contiguous: a channels-last batch
(N, H, W, C) seen as (N*H*W, C), or a dense batch (N, F).  Each kernel is
one pass over its rows, serial (memory-bound; see _conv.pyx on OpenMP next
to OpenBLAS), with per-channel sums accumulated in double:

- ``channel_stats``  : mean and biased variance of each channel
- ``channel_affine`` : out = x * scale + shift
- ``channel_sums``   : sum(dy) and sum(dy * (x - center)) of each channel
- ``channel_blend``  : out = a * dy + b * (x - center) + shift

A BatchNorm step is stats + affine forward and sums + blend backward: two
reads of x and one write going forward, two reads of dy and x and one
write going back, where numpy's broadcasting (a 16-long inner loop per
row) needs a dozen passes.  ``out`` may be ``dy`` itself (each element is
read before it is written).

Use these through :mod:`sparkavg.ops` (``channel_stats`` ...), which checks
the arguments first and routes numpy float32 here.
"""
from libc.stdlib cimport free, malloc

import numpy as np

cdef enum:
    # Rows summed in float before their sums join the double totals: short
    # enough that float rounding stays near float epsilon, long enough to
    # keep the double additions off the hot loop.
    BLOCK = 64


cdef str _shape(const float[:, ::1] a):
    return f"({a.shape[0]}, {a.shape[1]})"


cdef void _check_vector(str name, const float[::1] v, Py_ssize_t c) except *:
    if v.shape[0] != c:
        raise ValueError(f"Expect {name} of shape ({c},), got ({v.shape[0]},)")


cdef void _check_rows(str name, const float[:, ::1] a, const float[:, ::1] like) except *:
    if a.shape[0] != like.shape[0] or a.shape[1] != like.shape[1]:
        raise ValueError(f"Expect {name} of shape {_shape(like)}, got {_shape(a)}")


cdef double* _zeros(Py_ssize_t n) except NULL:
    cdef double* p = <double*> malloc(max(n, 1) * sizeof(double))
    cdef Py_ssize_t j
    if p == NULL:
        raise MemoryError()
    for j in range(n):
        p[j] = 0
    return p


# ------------------------------------------------------------------- stats
def channel_stats(const float[:, ::1] x, float[::1] mean, float[::1] var):
    """Mean and biased variance of each column of ``x`` (M, C), M >= 1,
    into ``mean`` and ``var`` (C,); returns ``(mean, var)``."""
    cdef Py_ssize_t c = x.shape[1]
    _check_vector("mean", mean, c)
    _check_vector("var", var, c)
    if x.shape[0] < 1:
        raise ValueError("Expect at least one row, got 0")
    cdef double* work = _zeros(4 * c)
    try:
        with nogil:
            _channel_stats(x, work, mean, var)
    finally:
        free(work)
    return np.asarray(mean), np.asarray(var)


cdef void _channel_stats(const float[:, ::1] x,   # IN  (M, C)
                         double* work,             # scratch (4C,), zeroed
                         float[::1] mean,          # OUT (C,)
                         float[::1] var) noexcept nogil:  # OUT (C,)
    # Sums of d = x - x[0] and d^2: one pass, and shifting by a value of the
    # column keeps E[d^2] - E[d]^2 free of cancellation when |mean| >> std.
    # Blocks of BLOCK rows are summed in float (vectorised, 4 lanes per SSE
    # register), the blocks' sums in double.
    cdef Py_ssize_t m = x.shape[0], c = x.shape[1], i, j, start, stop
    cdef double* s1 = work
    cdef double* s2 = work + c
    cdef float* b1 = <float*> (work + 2 * c)
    cdef float* b2 = b1 + c
    cdef const float* row
    cdef const float* first = &x[0, 0]
    cdef float d
    cdef double mu, v
    start = 0
    while start < m:
        stop = start + BLOCK if start + BLOCK < m else m
        for j in range(c):
            b1[j] = 0
            b2[j] = 0
        for i in range(start, stop):
            row = &x[i, 0]
            for j in range(c):
                d = row[j] - first[j]
                b1[j] += d
                b2[j] += d * d
        for j in range(c):
            s1[j] += b1[j]
            s2[j] += b2[j]
        start = stop
    for j in range(c):
        mu = s1[j] / m
        v = s2[j] / m - mu * mu
        mean[j] = <float> (first[j] + mu)
        var[j] = <float> (v if v > 0 else 0.0)


# ------------------------------------------------------------------ affine
def channel_affine(const float[:, ::1] x, const float[::1] scale, const float[::1] shift,
                   float[:, ::1] out):
    """``out = x * scale + shift`` per column; returns ``out`` (M, C)."""
    _check_vector("scale", scale, x.shape[1])
    _check_vector("shift", shift, x.shape[1])
    _check_rows("out", out, x)
    with nogil:
        _channel_affine(x, scale, shift, out)
    return np.asarray(out)


cdef void _channel_affine(const float[:, ::1] x,       # IN  (M, C)
                          const float[::1] scale,       # IN  (C,)
                          const float[::1] shift,       # IN  (C,)
                          float[:, ::1] out) noexcept nogil:  # OUT (M, C)
    cdef Py_ssize_t m = x.shape[0], c = x.shape[1], i, j
    cdef const float* a = &scale[0]
    cdef const float* b = &shift[0]
    cdef const float* src
    cdef float* dst
    for i in range(m):
        src = &x[i, 0]
        dst = &out[i, 0]
        for j in range(c):
            dst[j] = src[j] * a[j] + b[j]


# -------------------------------------------------------------------- sums
def channel_sums(const float[:, ::1] dy, const float[:, ::1] x, const float[::1] center,
                 float[::1] sum_dy, float[::1] sum_dy_x):
    """``sum_dy = sum(dy)`` and ``sum_dy_x = sum(dy * (x - center))`` over
    the rows of (M, C) ``dy`` and ``x``; returns ``(sum_dy, sum_dy_x)``."""
    cdef Py_ssize_t c = dy.shape[1]
    _check_rows("x", x, dy)
    _check_vector("center", center, c)
    _check_vector("sum_dy", sum_dy, c)
    _check_vector("sum_dy_x", sum_dy_x, c)
    cdef double* work = _zeros(4 * c)
    try:
        with nogil:
            _channel_sums(dy, x, center, work, sum_dy, sum_dy_x)
    finally:
        free(work)
    return np.asarray(sum_dy), np.asarray(sum_dy_x)


cdef void _channel_sums(const float[:, ::1] dy,     # IN  (M, C)
                        const float[:, ::1] x,      # IN  (M, C)
                        const float[::1] center,    # IN  (C,)
                        double* work,               # scratch (4C,), zeroed
                        float[::1] sum_dy,          # OUT (C,)
                        float[::1] sum_dy_x) noexcept nogil:  # OUT (C,)
    # Float sums over blocks of BLOCK rows, double across blocks (as stats).
    cdef Py_ssize_t m = dy.shape[0], c = dy.shape[1], i, j, start, stop
    cdef double* s1 = work
    cdef double* s2 = work + c
    cdef float* b1 = <float*> (work + 2 * c)
    cdef float* b2 = b1 + c
    cdef const float* g
    cdef const float* v
    cdef const float* mu = &center[0]
    start = 0
    while start < m:
        stop = start + BLOCK if start + BLOCK < m else m
        for j in range(c):
            b1[j] = 0
            b2[j] = 0
        for i in range(start, stop):
            g = &dy[i, 0]
            v = &x[i, 0]
            for j in range(c):
                b1[j] += g[j]
                b2[j] += g[j] * (v[j] - mu[j])
        for j in range(c):
            s1[j] += b1[j]
            s2[j] += b2[j]
        start = stop
    for j in range(c):
        sum_dy[j] = <float> s1[j]
        sum_dy_x[j] = <float> s2[j]


# ------------------------------------------------------------------- blend
def channel_blend(const float[:, ::1] dy, const float[:, ::1] x, const float[::1] center,
                  const float[::1] a, const float[::1] b, const float[::1] shift,
                  float[:, ::1] out):
    """``out = a * dy + b * (x - center) + shift`` per column; returns
    ``out`` (M, C), which may be ``dy`` itself."""
    cdef Py_ssize_t c = dy.shape[1]
    _check_rows("x", x, dy)
    _check_rows("out", out, dy)
    for name, v in (("center", center), ("a", a), ("b", b), ("shift", shift)):
        _check_vector(name, v, c)
    with nogil:
        _channel_blend(dy, x, center, a, b, shift, out)
    return np.asarray(out)


cdef void _channel_blend(const float[:, ::1] dy,    # IN  (M, C)
                         const float[:, ::1] x,     # IN  (M, C)
                         const float[::1] center,   # IN  (C,)
                         const float[::1] a,        # IN  (C,)
                         const float[::1] b,        # IN  (C,)
                         const float[::1] shift,    # IN  (C,)
                         float[:, ::1] out) noexcept nogil:  # OUT (M, C), may be dy
    cdef Py_ssize_t m = dy.shape[0], c = dy.shape[1], i, j
    cdef const float* g
    cdef const float* v
    cdef float* dst
    for i in range(m):
        g = &dy[i, 0]
        v = &x[i, 0]
        dst = &out[i, 0]
        for j in range(c):
            dst[j] = a[j] * g[j] + b[j] * (v[j] - center[j]) + shift[j]
