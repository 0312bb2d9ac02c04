"""The element-wise work of one LSTM / GRU time step, and the embedding
gradient's scatter-add, float32.

One call is one step for N rows: gate rows (N, G*U) (G blocks of U
columns in PyTorch's gate order) and state rows (N, U), C-contiguous.  The
layer (sparkavg/nn/recurrent.py) does the GEMMs around each call; each
kernel here is one pass over its rows, where the numpy twins
(sparkavg/ops/reference_sequence.py) take 10 to 20 passes:

- ``lstm_forward_step``  : gates' activations of x W + b + h_prev RW, c = f*c_prev + i*g, tanh(c), h
- ``lstm_backward_step`` : dL/d(pre-activations), and dc -> f * (total dc)
- ``gru_forward_step``   : gates' activations, h_prev RW_n + rb, h
- ``gru_backward_step``  : dL/d(x W + b), dL/d(h_prev RW), and dh -> z * dh
- ``scatter_add_rows``   : out[index[k]] += rows[k] (an embedding's gradient)

Why C here: libm's tanhf/expf are scalar calls (GCC vectorises them only
under -ffast-math, which the project does not use), and a step makes five
of them per unit.  ``sparkavg_tanhf`` is Eigen's rational approximation of
tanh (a degree-13/6 odd/even ratio on [-7.9, 7.9], max abs error ~4e-7,
the error of a few float ulps; NaN stays NaN), branch-free, so the row
loops below vectorise (SSE2, 4 lanes, at -O3); sigmoid(x) is
0.5 + 0.5 * tanh(x / 2).  Serial: a step is ~10^4 values, far below what
pays for waking threads (see _parallel.pxd).

Use these through :mod:`sparkavg.ops` (``lstm_forward_step`` ...), which
checks the arguments first and routes numpy float32 here.
"""
from libc.stdint cimport int64_t


cdef extern from *:
    """
    #include <math.h>

    /* -ftrapping-math (GCC's default) keeps GCC from if-converting the
       clamps below, so no loop calling them vectorises; the flag concerns
       FP exception flags only, never values (NaN and inf come out alike). */
    #if defined(__GNUC__) && !defined(__clang__)
    #define SPARKAVG_VECTORISE __attribute__((optimize("no-trapping-math")))
    #else
    #define SPARKAVG_VECTORISE
    #endif

    /* The step kernels are compute-bound (five tanh per unit going forward),
       so the row loops are compiled three times -- AVX-512, AVX2+FMA and the
       SSE2 baseline -- and the loader picks the best the CPU runs (GCC's
       function multi-versioning, an ifunc: x86-64 Linux only).  FMA makes
       results differ from the baseline's in the last bits. */
    #if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11 && defined(__x86_64__) \
        && defined(__linux__) && !defined(SPARKAVG_NO_CLONES)
    #define SPARKAVG_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
    #else
    #define SPARKAVG_CLONES
    #endif

    SPARKAVG_VECTORISE static inline float sparkavg_tanhf(float a) {
        const float clamp = 7.90531110763549805f;
        float x = a > clamp ? clamp : a;   /* NaN: both compares false, NaN stays */
        x = x < -clamp ? -clamp : x;
        const float x2 = x * x;
        float p = x2 * -2.76076847742355e-16f + 2.00018790482477e-13f;
        p = x2 * p + -8.60467152213735e-11f;
        p = x2 * p + 5.12229709037114e-08f;
        p = x2 * p + 1.48572235717979e-05f;
        p = x2 * p + 6.37261928875436e-04f;
        p = x2 * p + 4.89352455891786e-03f;
        p = x * p;
        float q = x2 * 1.19825839466702e-06f + 1.18534705686654e-04f;
        q = x2 * q + 2.26843463243900e-03f;
        q = x2 * q + 4.89352518554385e-03f;
        const float r = p / q;   /* within 1 ulp of a also where |a| < 4e-4 */
        return r;
    }

    SPARKAVG_VECTORISE static inline float sparkavg_sigmoidf(float a) {
        return 0.5f + 0.5f * sparkavg_tanhf(0.5f * a);
    }

    SPARKAVG_CLONES SPARKAVG_VECTORISE static void sparkavg_lstm_fwd_row(
            float *restrict z, const float *restrict rec, const float *restrict cp, float *restrict c,
            float *restrict tc, float *restrict h, Py_ssize_t u) {
        float *restrict zi = z, *restrict zf = z + u, *restrict zg = z + 2 * u, *restrict zo = z + 3 * u;
        const float *restrict ri = rec, *restrict rf = rec + u, *restrict rg = rec + 2 * u, *restrict ro = rec + 3 * u;
        for (Py_ssize_t j = 0; j < u; j++) {
            const float i = sparkavg_sigmoidf(zi[j] + ri[j]);
            const float f = sparkavg_sigmoidf(zf[j] + rf[j]);
            const float g = sparkavg_tanhf(zg[j] + rg[j]);
            const float o = sparkavg_sigmoidf(zo[j] + ro[j]);
            const float cj = f * cp[j] + i * g;
            const float t = sparkavg_tanhf(cj);
            zi[j] = i; zf[j] = f; zg[j] = g; zo[j] = o;
            c[j] = cj; tc[j] = t; h[j] = o * t;
        }
    }

    SPARKAVG_CLONES SPARKAVG_VECTORISE static void sparkavg_lstm_bwd_row(const float *restrict a, const float *restrict cp,
                                      const float *restrict tc, const float *restrict dh,
                                      float *restrict dc, float *restrict dz, Py_ssize_t u) {
        const float *restrict ai = a, *restrict af = a + u, *restrict ag = a + 2 * u, *restrict ao = a + 3 * u;
        float *restrict di = dz, *restrict df = dz + u, *restrict dg = dz + 2 * u, *restrict dout = dz + 3 * u;
        for (Py_ssize_t j = 0; j < u; j++) {
            const float i = ai[j], f = af[j], g = ag[j], o = ao[j], t = tc[j], d = dh[j];
            const float dct = dc[j] + d * o * (1.0f - t * t);
            di[j] = dct * g * i * (1.0f - i);
            df[j] = dct * cp[j] * f * (1.0f - f);
            dg[j] = dct * i * (1.0f - g * g);
            dout[j] = d * t * o * (1.0f - o);
            dc[j] = dct * f;
        }
    }

    SPARKAVG_CLONES SPARKAVG_VECTORISE static void sparkavg_gru_fwd_row(float *restrict z, const float *restrict rec, const float *restrict rb,
                                     const float *restrict hp, float *restrict hn, float *restrict h,
                                     Py_ssize_t u) {
        float *restrict zr = z, *restrict zz = z + u, *restrict zn = z + 2 * u;
        const float *restrict rr = rec, *restrict rz = rec + u, *restrict rn = rec + 2 * u;
        for (Py_ssize_t j = 0; j < u; j++) {
            const float r = sparkavg_sigmoidf(zr[j] + rr[j]);
            const float zg = sparkavg_sigmoidf(zz[j] + rz[j]);
            const float m = rn[j] + rb[j];
            const float n = sparkavg_tanhf(zn[j] + r * m);
            zr[j] = r; zz[j] = zg; zn[j] = n;
            hn[j] = m;
            h[j] = n + zg * (hp[j] - n);
        }
    }

    SPARKAVG_CLONES SPARKAVG_VECTORISE static void sparkavg_gru_bwd_row(const float *restrict a, const float *restrict hn,
                                     const float *restrict hp, float *restrict dh, float *restrict dz,
                                     float *restrict dzr, Py_ssize_t u) {
        const float *restrict ar = a, *restrict az = a + u, *restrict an = a + 2 * u;
        for (Py_ssize_t j = 0; j < u; j++) {
            const float r = ar[j], zg = az[j], n = an[j], d = dh[j];
            const float dn = d * (1.0f - zg) * (1.0f - n * n);
            const float dr = dn * hn[j] * r * (1.0f - r);
            const float dzg = d * (hp[j] - n) * zg * (1.0f - zg);
            dz[j] = dr; dz[u + j] = dzg; dz[2 * u + j] = dn;
            dzr[j] = dr; dzr[u + j] = dzg; dzr[2 * u + j] = dn * r;
            dh[j] = zg * d;
        }
    }
    """
    void sparkavg_lstm_fwd_row(float* z, const float* rec, const float* cp, float* c, float* tc, float* h,
                               Py_ssize_t u) noexcept nogil
    void sparkavg_lstm_bwd_row(const float* a, const float* cp, const float* tc, const float* dh,
                               float* dc, float* dz, Py_ssize_t u) noexcept nogil
    void sparkavg_gru_fwd_row(float* z, const float* rec, const float* rb, const float* hp, float* hn,
                              float* h, Py_ssize_t u) noexcept nogil
    void sparkavg_gru_bwd_row(const float* a, const float* hn, const float* hp, float* dh, float* dz,
                              float* dzr, Py_ssize_t u) noexcept nogil
    float sparkavg_tanhf(float a) noexcept nogil


cdef void _check(str name, Py_ssize_t rows, Py_ssize_t cols, Py_ssize_t want_rows,
                 Py_ssize_t want_cols) except *:
    if rows != want_rows or cols != want_cols:
        raise ValueError(f"Expect {name} of shape ({want_rows}, {want_cols}), got ({rows}, {cols})")


cdef Py_ssize_t _units(str name, Py_ssize_t cols, Py_ssize_t gates) except -1:
    if cols % gates or cols == 0:
        raise ValueError(f"Expect {name} of shape (N, {gates}*units), got {cols} columns")
    return cols // gates


def tanh(const float[::1] x, float[::1] out):
    """``out = tanh(x)`` with the kernels' approximation (for tests)."""
    cdef Py_ssize_t j
    if out.shape[0] != x.shape[0]:
        raise ValueError(f"Expect out of shape ({x.shape[0]},), got ({out.shape[0]},)")
    with nogil:
        for j in range(x.shape[0]):
            out[j] = sparkavg_tanhf(x[j])


def lstm_forward_step(float[:, ::1] z, const float[:, ::1] rec, const float[:, ::1] c_prev, float[:, ::1] c,
                      float[:, ::1] tc, float[:, ::1] h):
    """z (N, 4U) IN x W + b, OUT activations; rec (N, 4U) IN h_prev RW; c_prev IN; c, tc, h OUT (N, U)."""
    cdef Py_ssize_t n = z.shape[0], u = _units("z", z.shape[1], 4), i
    _check("rec", rec.shape[0], rec.shape[1], n, 4 * u)
    _check("c_prev", c_prev.shape[0], c_prev.shape[1], n, u)
    _check("c", c.shape[0], c.shape[1], n, u)
    _check("tc", tc.shape[0], tc.shape[1], n, u)
    _check("h", h.shape[0], h.shape[1], n, u)
    if n == 0:
        return
    with nogil:
        for i in range(n):
            sparkavg_lstm_fwd_row(&z[i, 0], &rec[i, 0], &c_prev[i, 0], &c[i, 0], &tc[i, 0], &h[i, 0], u)


def lstm_backward_step(const float[:, ::1] a, const float[:, ::1] c_prev, const float[:, ::1] tc,
                       const float[:, ::1] dh, float[:, ::1] dc, float[:, ::1] dz):
    """a (N, 4U), c_prev, tc, dh (N, U) IN; dc (N, U) IN/OUT; dz (N, 4U) OUT."""
    cdef Py_ssize_t n = a.shape[0], u = _units("a", a.shape[1], 4), i
    _check("c_prev", c_prev.shape[0], c_prev.shape[1], n, u)
    _check("tc", tc.shape[0], tc.shape[1], n, u)
    _check("dh", dh.shape[0], dh.shape[1], n, u)
    _check("dc", dc.shape[0], dc.shape[1], n, u)
    _check("dz", dz.shape[0], dz.shape[1], n, 4 * u)
    if n == 0:
        return
    with nogil:
        for i in range(n):
            sparkavg_lstm_bwd_row(&a[i, 0], &c_prev[i, 0], &tc[i, 0], &dh[i, 0], &dc[i, 0], &dz[i, 0], u)


def gru_forward_step(float[:, ::1] z, const float[:, ::1] rec, const float[::1] rb, const float[:, ::1] h_prev,
                     float[:, ::1] hn, float[:, ::1] h):
    """z (N, 3U) IN x W + b, OUT activations; rec (N, 3U), rb (U,), h_prev IN; hn, h OUT (N, U)."""
    cdef Py_ssize_t n = z.shape[0], u = _units("z", z.shape[1], 3), i
    _check("rec", rec.shape[0], rec.shape[1], n, 3 * u)
    _check("rb", 1, rb.shape[0], 1, u)
    _check("h_prev", h_prev.shape[0], h_prev.shape[1], n, u)
    _check("hn", hn.shape[0], hn.shape[1], n, u)
    _check("h", h.shape[0], h.shape[1], n, u)
    if n == 0:
        return
    with nogil:
        for i in range(n):
            sparkavg_gru_fwd_row(&z[i, 0], &rec[i, 0], &rb[0], &h_prev[i, 0], &hn[i, 0], &h[i, 0], u)


def gru_backward_step(const float[:, ::1] a, const float[:, ::1] hn, const float[:, ::1] h_prev,
                      float[:, ::1] dh, float[:, ::1] dz, float[:, ::1] dz_rec):
    """a (N, 3U), hn, h_prev (N, U) IN; dh (N, U) IN/OUT; dz, dz_rec (N, 3U) OUT."""
    cdef Py_ssize_t n = a.shape[0], u = _units("a", a.shape[1], 3), i
    _check("hn", hn.shape[0], hn.shape[1], n, u)
    _check("h_prev", h_prev.shape[0], h_prev.shape[1], n, u)
    _check("dh", dh.shape[0], dh.shape[1], n, u)
    _check("dz", dz.shape[0], dz.shape[1], n, 3 * u)
    _check("dz_rec", dz_rec.shape[0], dz_rec.shape[1], n, 3 * u)
    if n == 0:
        return
    with nogil:
        for i in range(n):
            sparkavg_gru_bwd_row(&a[i, 0], &hn[i, 0], &h_prev[i, 0], &dh[i, 0], &dz[i, 0], &dz_rec[i, 0], u)


def scatter_add_rows(const int64_t[::1] index, const float[:, ::1] rows, float[:, ::1] out):
    """``out[index[k]] += rows[k]``; index (M,) int64 in [0, V), rows (M, D), out (V, D)."""
    cdef Py_ssize_t m = index.shape[0], d = out.shape[1], v = out.shape[0], k, j
    cdef float* dst
    cdef const float* src
    _check("rows", rows.shape[0], rows.shape[1], m, d)
    for k in range(m):
        if index[k] < 0 or index[k] >= v:
            raise ValueError(f"Expect index values in [0, {v}), got {index[k]} at {k}")
    with nogil:
        for k in range(m):
            dst = &out[index[k], 0]
            src = &rows[k, 0]
            for j in range(d):
                dst[j] += src[j]
