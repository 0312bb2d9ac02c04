"""Fused updater steps on flat float32 vectors: one pass over params,
grads and state, in place.

Formulas are those of :mod:`sparkavg.ops.reference`, evaluated in the same
order with the same float32 constants (:mod:`sparkavg.ops` computes them in
double precision as the reference does; the ``float`` arguments round them
once), so without FMA contraction the results match the numpy reference to
the last bit; the tests allow a few ulps for builds that contract.
``n_threads > 1`` splits the vectors into up to that many contiguous chunks
under OpenMP (at least ``MIN_PER_THREAD`` values each, _parallel.pxd).

Adagrad, RMSProp and Adam run in blocks of BLOCK values: a vectorised loop
updates the state and writes the values to take the root of into a stack
buffer, ``sparkavg_sqrt_inplace`` (SIMD, see _simd.pxd) takes the roots,
and a second vectorised loop updates params while the block is still in L1.
"""
from cython.parallel cimport prange

from ._parallel cimport threads_for
from ._simd cimport sparkavg_sqrt_inplace

__all__ = ["sgd_step", "nesterov_step", "adagrad_step", "rmsprop_step", "adam_step"]


cdef enum:
    BLOCK = 512     # floats per block: 2 KiB of roots, with 4-5 streams in L1


# ------------------------------------------------------------------ kernels
cdef void _sgd(float* p,                    # IN/OUT (n,)
               const float* g,              # IN     (n,)
               float lr, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i
    for i in range(n):
        p[i] -= lr * g[i]


cdef void _nesterov(float* p,               # IN/OUT (n,)
                    const float* g,         # IN     (n,)
                    float* v,               # IN/OUT (n,)
                    float lr, float mu, float neg_mu, float one_plus_mu,
                    Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i
    cdef float v_prev, v_new
    for i in range(n):
        v_prev = v[i]
        v_new = mu * v_prev - lr * g[i]
        v[i] = v_new
        p[i] += neg_mu * v_prev + one_plus_mu * v_new


cdef void _adagrad(float* p,                # IN/OUT (n,)
                   const float* g,          # IN     (n,)
                   float* h,                # IN/OUT (n,)
                   float lr, float eps, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t b, lo, i, j, m
    cdef float gi
    cdef float root[BLOCK]
    for b in range((n + BLOCK - 1) // BLOCK):
        lo = b * BLOCK
        m = min(BLOCK, n - lo)
        for j in range(m):
            i = lo + j
            gi = g[i]
            root[j] = h[i] + gi * gi
            h[i] = root[j]
        sparkavg_sqrt_inplace(root, m)
        for j in range(m):
            i = lo + j
            p[i] -= lr * g[i] / (root[j] + eps)


cdef void _rmsprop(float* p,                # IN/OUT (n,)
                   const float* g,          # IN     (n,)
                   float* c,                # IN/OUT (n,)
                   float lr, float decay, float one_minus_decay, float eps,
                   Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t b, lo, i, j, m
    cdef float gi
    cdef float root[BLOCK]
    for b in range((n + BLOCK - 1) // BLOCK):
        lo = b * BLOCK
        m = min(BLOCK, n - lo)
        for j in range(m):
            i = lo + j
            gi = g[i]
            root[j] = decay * c[i] + one_minus_decay * gi * gi
            c[i] = root[j]
        sparkavg_sqrt_inplace(root, m)
        for j in range(m):
            i = lo + j
            p[i] -= lr * g[i] / (root[j] + eps)


cdef void _adam(float* p,                   # IN/OUT (n,)
                const float* g,             # IN     (n,)
                float* m,                   # IN/OUT (n,)
                float* v,                   # IN/OUT (n,)
                float b1, float one_minus_b1, float b2, float one_minus_b2,
                float alpha, float eps, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t b, lo, i, j, k
    cdef float gi
    cdef float root[BLOCK]
    # Three loops, not two: fewer streams per loop, so fewer chances that a
    # load trails a store by a multiple of 4 KiB (m and v are often halves
    # of one state vector), which stalls the loads (halved throughput in
    # some runs here).
    for b in range((n + BLOCK - 1) // BLOCK):
        lo = b * BLOCK
        k = min(BLOCK, n - lo)
        for j in range(k):
            i = lo + j
            gi = g[i]
            root[j] = b2 * v[i] + one_minus_b2 * gi * gi
            v[i] = root[j]
        sparkavg_sqrt_inplace(root, k)
        for j in range(k):
            i = lo + j
            m[i] = b1 * m[i] + one_minus_b1 * g[i]
        for j in range(k):
            i = lo + j
            p[i] -= alpha * m[i] / (root[j] + eps)


# ----------------------------------------------------------------- wrappers
cdef inline void _check_len(str name, Py_ssize_t got, Py_ssize_t n) except *:
    if got != n:
        raise ValueError(f"Expect {name} of length {n} like params, got {got}")


def sgd_step(float[::1] params, const float[::1] grads, float lr, int n_threads=1):
    """params -= lr * grads."""
    cdef Py_ssize_t n = params.shape[0]
    cdef Py_ssize_t c, lo, hi
    cdef int nt
    _check_len("grads", grads.shape[0], n)
    if n == 0:
        return
    nt = threads_for(n, n_threads)
    with nogil:
        if nt <= 1:
            _sgd(&params[0], &grads[0], lr, n)
        else:
            for c in prange(nt, num_threads=nt, schedule="static"):
                lo = c * n // nt
                hi = (c + 1) * n // nt
                _sgd(&params[0] + lo, &grads[0] + lo, lr, hi - lo)


def nesterov_step(float[::1] params, const float[::1] grads, float[::1] velocity,
                  float lr, float mu, float neg_mu, float one_plus_mu,
                  int n_threads=1):
    """v' = mu*v - lr*g; params += -mu*v + (1+mu)*v'."""
    cdef Py_ssize_t n = params.shape[0]
    cdef Py_ssize_t c, lo, hi
    cdef int nt
    _check_len("grads", grads.shape[0], n)
    _check_len("velocity", velocity.shape[0], n)
    if n == 0:
        return
    nt = threads_for(n, n_threads)
    with nogil:
        if nt <= 1:
            _nesterov(&params[0], &grads[0], &velocity[0], lr, mu, neg_mu, one_plus_mu, n)
        else:
            for c in prange(nt, num_threads=nt, schedule="static"):
                lo = c * n // nt
                hi = (c + 1) * n // nt
                _nesterov(&params[0] + lo, &grads[0] + lo, &velocity[0] + lo,
                          lr, mu, neg_mu, one_plus_mu, hi - lo)


def adagrad_step(float[::1] params, const float[::1] grads, float[::1] history,
                 float lr, float eps, int n_threads=1):
    """h += g*g; params -= lr*g / (sqrt(h) + eps)."""
    cdef Py_ssize_t n = params.shape[0]
    cdef Py_ssize_t c, lo, hi
    cdef int nt
    _check_len("grads", grads.shape[0], n)
    _check_len("history", history.shape[0], n)
    if n == 0:
        return
    nt = threads_for(n, n_threads)
    with nogil:
        if nt <= 1:
            _adagrad(&params[0], &grads[0], &history[0], lr, eps, n)
        else:
            for c in prange(nt, num_threads=nt, schedule="static"):
                lo = c * n // nt
                hi = (c + 1) * n // nt
                _adagrad(&params[0] + lo, &grads[0] + lo, &history[0] + lo, lr, eps, hi - lo)


def rmsprop_step(float[::1] params, const float[::1] grads, float[::1] cache,
                 float lr, float decay, float one_minus_decay, float eps,
                 int n_threads=1):
    """c = decay*c + (1-decay)*g*g; params -= lr*g / (sqrt(c) + eps)."""
    cdef Py_ssize_t n = params.shape[0]
    cdef Py_ssize_t c, lo, hi
    cdef int nt
    _check_len("grads", grads.shape[0], n)
    _check_len("cache", cache.shape[0], n)
    if n == 0:
        return
    nt = threads_for(n, n_threads)
    with nogil:
        if nt <= 1:
            _rmsprop(&params[0], &grads[0], &cache[0], lr, decay, one_minus_decay, eps, n)
        else:
            for c in prange(nt, num_threads=nt, schedule="static"):
                lo = c * n // nt
                hi = (c + 1) * n // nt
                _rmsprop(&params[0] + lo, &grads[0] + lo, &cache[0] + lo,
                         lr, decay, one_minus_decay, eps, hi - lo)


def adam_step(float[::1] params, const float[::1] grads, float[::1] m, float[::1] v,
              float b1, float one_minus_b1, float b2, float one_minus_b2,
              float alpha, float eps, int n_threads=1):
    """m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g*g; params -= alpha*m / (sqrt(v) + eps)."""
    cdef Py_ssize_t n = params.shape[0]
    cdef Py_ssize_t c, lo, hi
    cdef int nt
    _check_len("grads", grads.shape[0], n)
    _check_len("m", m.shape[0], n)
    _check_len("v", v.shape[0], n)
    if n == 0:
        return
    nt = threads_for(n, n_threads)
    with nogil:
        if nt <= 1:
            _adam(&params[0], &grads[0], &m[0], &v[0], b1, one_minus_b1, b2, one_minus_b2,
                  alpha, eps, n)
        else:
            for c in prange(nt, num_threads=nt, schedule="static"):
                lo = c * n // nt
                hi = (c + 1) * n // nt
                _adam(&params[0] + lo, &grads[0] + lo, &m[0] + lo, &v[0] + lo,
                      b1, one_minus_b1, b2, one_minus_b2, alpha, eps, hi - lo)
