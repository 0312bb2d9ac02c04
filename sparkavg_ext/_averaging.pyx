"""Parameter averaging on flat float32 vectors: buffer += w * x and
buffer *= f, in place, one pass, no temporaries.

The ``def`` wrappers take C-contiguous float32 1-D memoryviews (anything
else is rejected by the memoryview itself; :mod:`sparkavg.ops` gives the
readable error first).  ``n_threads > 1`` splits the vector into up to that
many contiguous chunks under OpenMP, each at least ``MIN_PER_THREAD``
values (_parallel.pxd); one thread runs the plain loop, without a parallel
region.
"""
from cython.parallel cimport prange

from ._parallel cimport threads_for

__all__ = ["accumulate", "scale"]


cdef void _accumulate(float* buf,           # IN/OUT (n,)
                      const float* x,       # IN     (n,)
                      float w, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i
    if w == 1.0:
        for i in range(n):
            buf[i] += x[i]
    else:
        for i in range(n):
            buf[i] += w * x[i]


cdef void _scale(float* buf,                # IN/OUT (n,)
                 float f, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i
    for i in range(n):
        buf[i] *= f


def accumulate(float[::1] buffer, const float[::1] x, float weight=1.0,
               int n_threads=1):
    """buffer += weight * x, in place; returns nothing."""
    cdef Py_ssize_t n = buffer.shape[0]
    cdef Py_ssize_t c, lo, hi
    cdef int nt
    if x.shape[0] != n:
        raise ValueError(f"Expect x of length {n} like the buffer, got {x.shape[0]}")
    if n == 0:
        return
    nt = threads_for(n, n_threads)
    with nogil:
        if nt <= 1:
            _accumulate(&buffer[0], &x[0], weight, n)
        else:
            for c in prange(nt, num_threads=nt, schedule="static"):
                lo = c * n // nt
                hi = (c + 1) * n // nt
                _accumulate(&buffer[0] + lo, &x[0] + lo, weight, hi - lo)


def scale(float[::1] buffer, float factor, int n_threads=1):
    """buffer *= factor, in place; returns nothing."""
    cdef Py_ssize_t n = buffer.shape[0]
    cdef Py_ssize_t c, lo, hi
    cdef int nt
    if n == 0:
        return
    nt = threads_for(n, n_threads)
    with nogil:
        if nt <= 1:
            _scale(&buffer[0], factor, n)
        else:
            for c in prange(nt, num_threads=nt, schedule="static"):
                lo = c * n // nt
                hi = (c + 1) * n // nt
                _scale(&buffer[0] + lo, factor, hi - lo)
