/* Direct (no im2col) stride-1 convolution on channels-last float32 arrays,
 * AVX-512, chosen at run time.
 *
 * Why: a small conv's im2col + GEMM moves KH*KW times the image through
 * memory twice (im2col, col2im) and gives OpenBLAS skinny GEMMs (N = F =
 * 16 or 32 columns) that it runs well below the FMA peak.  Here each
 * output tile is a block of P pixels of one output row times V vectors of
 * 16 output channels, held in P*V zmm registers (P*V <= 28 of the 32)
 * while the loop runs over the taps and input channels: one weight load
 * per V vectors, one broadcast of an input value per pixel, P*V FMAs --
 * the register blocking of oneDNN's direct NHWC kernels.
 *
 *   forward           y[n,r,q,:] = b + sum_{i,j,c} xpad[n,r+i,q+j,c] W[i,j,c,:]
 *   backward data     dx = the same kernel on dy, with W flipped in (i, j),
 *                     its (C, F) axes swapped and padding KH-1-ph, KW-1-pw
 *   backward weights  dW[i,j,c,:] = sum_{n,r,q} xpad[n,r+i,q+j,c] dy[n,r,q,:],
 *                     a block of CB rows (i, j*C+c) times V vectors in
 *                     registers over all pixels of a sample; db = sum dy
 *
 * Each thread copies one sample at a time into a zero-bordered buffer
 * (the padding), so the inner loops have no bounds checks.  F need not be
 * a multiple of 16: the last vector is masked.  OpenMP splits the batch,
 * a sample (or, for backward weights, a group of SA_DW_GROUP samples with
 * its own partial sum, added in group order) at a time to whichever thread
 * is free -- a thread that the scheduler takes away on a loaded machine
 * holds up little -- and the results are the same bits on any thread count.
 *
 * Portability: the AVX-512 code is compiled with a target attribute, so
 * the module needs no -march flag; sparkavg_conv_direct_available() asks
 * the CPU (cpuid) and the caller falls back to im2col + GEMM when it says
 * no (or when built with -DSPARKAVG_NO_SIMD, or not with GCC/clang on
 * x86-64).
 */
#ifndef SPARKAVG_CONV_DIRECT_H
#define SPARKAVG_CONV_DIRECT_H

#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#if (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__) && !defined(SPARKAVG_NO_SIMD)
#define SPARKAVG_HAVE_AVX512_CONV 1
#include <immintrin.h>
#else
#define SPARKAVG_HAVE_AVX512_CONV 0
#endif

typedef ptrdiff_t sa_idx;

/* 1 when the AVX-512 kernels can run on this CPU, else 0. */
static int sparkavg_conv_direct_available(void)
{
#if SPARKAVG_HAVE_AVX512_CONV
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") ? 1 : 0;
#else
    return 0;
#endif
}

/* Copy sample x (h, w, c) into the interior of pad (h + 2ph, w + 2pw, c),
   whose border the caller zeroed once. */
static void sa_pad_sample(const float *x, sa_idx h, sa_idx w, sa_idx c, sa_idx ph, sa_idx pw,
                          float *pad)
{
    sa_idx r, wp = w + 2 * pw;
    for (r = 0; r < h; ++r)
        memcpy(pad + ((r + ph) * wp + pw) * c, x + r * w * c, (size_t)(w * c) * sizeof(float));
}

/* The OpenMP pool's limit (OMP_NUM_THREADS, threadpoolctl), 1 without OpenMP. */
static int sparkavg_omp_max_threads(void)
{
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

static int sa_threads(int n_threads, sa_idx n)
{
    if (n_threads < 1)
        n_threads = 1;
    if ((sa_idx)n_threads > n)
        n_threads = (int)(n < 1 ? 1 : n);
    return n_threads;
}

#if SPARKAVG_HAVE_AVX512_CONV

#define SA_TARGET __attribute__((target("avx512f")))
#define SA_INLINE static inline __attribute__((always_inline))
#define SA_PMAX 14 /* pixels per forward tile */
#define SA_CBMAX1 24 /* dW rows per tile with one vector of F */
#define SA_CBMAX2 12 /* ... with two */
#endif
/* Backward weights sums the batch in groups of this many samples, each
   into its own partial (threads take whole groups), then adds the
   partials in group order: the same bits on any thread count. */
#define SA_DW_GROUP 8
#if SPARKAVG_HAVE_AVX512_CONV

/* One forward tile: P pixels x V vectors of 16 channels.
   xs: the padded sample at the tile's first pixel, tap (0, 0); pixel p, tap
   (i, j), channel c is xs[i*xrow + p*c + j*c + c'] -- (j, c) is one run of kwc.
   wt: W (KH, KW*C, F) at the tile's first channel; out: y at pixel 0. */
SA_TARGET SA_INLINE void sa_fwd_tile(const float *xs, sa_idx xrow, sa_idx c, const float *wt,
                                     sa_idx f, sa_idx kh, sa_idx kwc, const float *bias,
                                     float *out, const int P, const int V, __mmask16 mlast)
{
    __m512 acc[SA_PMAX][2];
    __m512 wv[2];
    sa_idx i, jc;
    int p, v;
#pragma GCC unroll 16
    for (p = 0; p < P; ++p)
#pragma GCC unroll 2
        for (v = 0; v < V; ++v)
            acc[p][v] = bias ? _mm512_maskz_loadu_ps(v == V - 1 ? mlast : 0xFFFF, bias + 16 * v)
                             : _mm512_setzero_ps();
    for (i = 0; i < kh; ++i) {
        const float *xi = xs + i * xrow;
        const float *wi = wt + i * kwc * f;
        for (jc = 0; jc < kwc; ++jc) {
#pragma GCC unroll 2
            for (v = 0; v < V; ++v)
                wv[v] = _mm512_maskz_loadu_ps(v == V - 1 ? mlast : 0xFFFF, wi + jc * f + 16 * v);
#pragma GCC unroll 16
            for (p = 0; p < P; ++p) {
                __m512 b = _mm512_set1_ps(xi[p * c + jc]);
#pragma GCC unroll 2
                for (v = 0; v < V; ++v)
                    acc[p][v] = _mm512_fmadd_ps(b, wv[v], acc[p][v]);
            }
        }
    }
#pragma GCC unroll 16
    for (p = 0; p < P; ++p)
#pragma GCC unroll 2
        for (v = 0; v < V; ++v)
            _mm512_mask_storeu_ps(out + p * f + 16 * v, v == V - 1 ? mlast : 0xFFFF, acc[p][v]);
}

#define SA_FWD_CASE(PP)                                                                   \
    case PP:                                                                              \
        if (V == 2)                                                                       \
            sa_fwd_tile(xs, xrow, c, wt, f, kh, kwc, bias, out, PP, 2, mlast);            \
        else                                                                              \
            sa_fwd_tile(xs, xrow, c, wt, f, kh, kwc, bias, out, PP, 1, mlast);            \
        break;

SA_TARGET static void sa_fwd_tile_any(const float *xs, sa_idx xrow, sa_idx c, const float *wt,
                                      sa_idx f, sa_idx kh, sa_idx kwc, const float *bias,
                                      float *out, int P, int V, __mmask16 mlast)
{
    switch (P) {
        SA_FWD_CASE(1) SA_FWD_CASE(2) SA_FWD_CASE(3) SA_FWD_CASE(4) SA_FWD_CASE(5)
        SA_FWD_CASE(6) SA_FWD_CASE(7) SA_FWD_CASE(8) SA_FWD_CASE(9) SA_FWD_CASE(10)
        SA_FWD_CASE(11) SA_FWD_CASE(12) SA_FWD_CASE(13) SA_FWD_CASE(14)
    default:
        break;
    }
}

/* One padded sample (hp, wp, c) -> y sample (oh, ow, f). */
SA_TARGET static void sa_fwd_sample(const float *pad, sa_idx wp, sa_idx c, const float *w,
                                    const float *bias, sa_idx f, sa_idx kh, sa_idx kw,
                                    sa_idx oh, sa_idx ow, float *y)
{
    sa_idx nvec = (f + 15) / 16, r, v0, q0;
    sa_idx nblocks = (ow + SA_PMAX - 1) / SA_PMAX;
    sa_idx P = (ow + nblocks - 1) / nblocks;
    __mmask16 tail = (f % 16) ? (__mmask16)((1u << (f % 16)) - 1u) : (__mmask16)0xFFFF;
    for (r = 0; r < oh; ++r) {
        for (v0 = 0; v0 < nvec; v0 += 2) {
            int V = (nvec - v0 >= 2) ? 2 : 1;
            __mmask16 mlast = (v0 + V == nvec) ? tail : (__mmask16)0xFFFF;
            for (q0 = 0; q0 < ow; q0 += P) {
                int p = (int)(ow - q0 < P ? ow - q0 : P);
                sa_fwd_tile_any(pad + (r * wp + q0) * c, wp * c, c, w + 16 * v0, f, kh, kw * c,
                                bias ? bias + 16 * v0 : NULL, y + (r * ow + q0) * f + 16 * v0,
                                p, V, mlast);
            }
        }
    }
}

/* One backward-weights tile: CB rows (jc0 .. jc0+CB of tap row i) x V vectors,
   summed over the sample's oh*ow pixels, added into dw (rows of f).
   xs: padded sample at (i, jc0); dy: the sample's dy at vector 0 of the tile. */
SA_TARGET SA_INLINE void sa_dw_tile(const float *xs, sa_idx xrow, sa_idx c, const float *dy,
                                    sa_idx f, sa_idx oh, sa_idx ow, float *dw, const int CB,
                                    const int V, __mmask16 mlast)
{
    __m512 acc[SA_CBMAX1][2];
    __m512 dv[2];
    sa_idx r, q;
    int k, v;
#pragma GCC unroll 24
    for (k = 0; k < CB; ++k)
#pragma GCC unroll 2
        for (v = 0; v < V; ++v)
            acc[k][v] = _mm512_setzero_ps();
    for (r = 0; r < oh; ++r) {
        const float *xr = xs + r * xrow;
        const float *dr = dy + r * ow * f;
        for (q = 0; q < ow; ++q) {
            const float *xq = xr + q * c;
#pragma GCC unroll 2
            for (v = 0; v < V; ++v)
                dv[v] = _mm512_maskz_loadu_ps(v == V - 1 ? mlast : 0xFFFF, dr + q * f + 16 * v);
#pragma GCC unroll 24
            for (k = 0; k < CB; ++k) {
                __m512 b = _mm512_set1_ps(xq[k]);
#pragma GCC unroll 2
                for (v = 0; v < V; ++v)
                    acc[k][v] = _mm512_fmadd_ps(b, dv[v], acc[k][v]);
            }
        }
    }
#pragma GCC unroll 24
    for (k = 0; k < CB; ++k)
#pragma GCC unroll 2
        for (v = 0; v < V; ++v) {
            __mmask16 m = v == V - 1 ? mlast : 0xFFFF;
            float *d = dw + k * f + 16 * v;
            _mm512_mask_storeu_ps(d, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, d), acc[k][v]));
        }
}

#define SA_DW_CASE1(KK)                                                                   \
    case KK:                                                                              \
        sa_dw_tile(xs, xrow, c, dy, f, oh, ow, dw, KK, 1, mlast);                         \
        break;
#define SA_DW_CASE2(KK)                                                                   \
    case KK:                                                                              \
        sa_dw_tile(xs, xrow, c, dy, f, oh, ow, dw, KK, 2, mlast);                         \
        break;

SA_TARGET static void sa_dw_tile_any(const float *xs, sa_idx xrow, sa_idx c, const float *dy,
                                     sa_idx f, sa_idx oh, sa_idx ow, float *dw, int CB, int V,
                                     __mmask16 mlast)
{
    if (V == 2) {
        switch (CB) {
            SA_DW_CASE2(1) SA_DW_CASE2(2) SA_DW_CASE2(3) SA_DW_CASE2(4) SA_DW_CASE2(5)
            SA_DW_CASE2(6) SA_DW_CASE2(7) SA_DW_CASE2(8) SA_DW_CASE2(9) SA_DW_CASE2(10)
            SA_DW_CASE2(11) SA_DW_CASE2(12)
        default:
            break;
        }
    } else {
        switch (CB) {
            SA_DW_CASE1(1) SA_DW_CASE1(2) SA_DW_CASE1(3) SA_DW_CASE1(4) SA_DW_CASE1(5)
            SA_DW_CASE1(6) SA_DW_CASE1(7) SA_DW_CASE1(8) SA_DW_CASE1(9) SA_DW_CASE1(10)
            SA_DW_CASE1(11) SA_DW_CASE1(12) SA_DW_CASE1(13) SA_DW_CASE1(14) SA_DW_CASE1(15)
            SA_DW_CASE1(16) SA_DW_CASE1(17) SA_DW_CASE1(18) SA_DW_CASE1(19) SA_DW_CASE1(20)
            SA_DW_CASE1(21) SA_DW_CASE1(22) SA_DW_CASE1(23) SA_DW_CASE1(24)
        default:
            break;
        }
    }
}

/* dw (kh, kw*c, f) += the sample's contribution. */
SA_TARGET static void sa_dw_sample(const float *pad, sa_idx wp, sa_idx c, const float *dy,
                                   sa_idx f, sa_idx kh, sa_idx kw, sa_idx oh, sa_idx ow, float *dw)
{
    sa_idx nvec = (f + 15) / 16, kwc = kw * c, i, v0, k0;
    __mmask16 tail = (f % 16) ? (__mmask16)((1u << (f % 16)) - 1u) : (__mmask16)0xFFFF;
    for (v0 = 0; v0 < nvec; v0 += 2) {
        int V = (nvec - v0 >= 2) ? 2 : 1;
        __mmask16 mlast = (v0 + V == nvec) ? tail : (__mmask16)0xFFFF;
        sa_idx cbmax = V == 2 ? SA_CBMAX2 : SA_CBMAX1;
        sa_idx nblocks = (kwc + cbmax - 1) / cbmax;
        sa_idx CB = (kwc + nblocks - 1) / nblocks;
        for (i = 0; i < kh; ++i)
            for (k0 = 0; k0 < kwc; k0 += CB) {
                int cb = (int)(kwc - k0 < CB ? kwc - k0 : CB);
                sa_dw_tile_any(pad + i * wp * c + k0, wp * c, c, dy + 16 * v0, f, oh, ow,
                               dw + (i * kwc + k0) * f + 16 * v0, cb, V, mlast);
            }
    }
}

/* db (f) += the sum of dy's m rows (f values each). */
SA_TARGET static void sa_db_sample(const float *dy, sa_idx m, sa_idx f, float *db)
{
    sa_idx nvec = (f + 15) / 16, v, p;
    __mmask16 tail = (f % 16) ? (__mmask16)((1u << (f % 16)) - 1u) : (__mmask16)0xFFFF;
    for (v = 0; v < nvec; ++v) {
        __mmask16 mv = v == nvec - 1 ? tail : (__mmask16)0xFFFF;
        __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
        for (p = 0; p + 1 < m; p += 2) {
            a0 = _mm512_add_ps(a0, _mm512_maskz_loadu_ps(mv, dy + p * f + 16 * v));
            a1 = _mm512_add_ps(a1, _mm512_maskz_loadu_ps(mv, dy + (p + 1) * f + 16 * v));
        }
        if (p < m)
            a0 = _mm512_add_ps(a0, _mm512_maskz_loadu_ps(mv, dy + p * f + 16 * v));
        a0 = _mm512_add_ps(a0, a1);
        _mm512_mask_storeu_ps(db + 16 * v, mv,
                              _mm512_add_ps(_mm512_maskz_loadu_ps(mv, db + 16 * v), a0));
    }
}

#endif /* SPARKAVG_HAVE_AVX512_CONV */

/* y (n, oh, ow, f) = conv(x (n, h, w, c), w (kh, kw, c, f)) + bias (f, or NULL),
   stride 1, zero padding (ph, pw); oh = h + 2ph - kh + 1.  Returns 0, or -1
   when a buffer could not be allocated or the kernels are unavailable. */
static int sparkavg_conv_direct_forward(const float *x, sa_idx n, sa_idx h, sa_idx w, sa_idx c,
                                        const float *wt, const float *bias, sa_idx f,
                                        sa_idx kh, sa_idx kw, sa_idx ph, sa_idx pw, float *y,
                                        int n_threads)
{
#if SPARKAVG_HAVE_AVX512_CONV
    sa_idx hp = h + 2 * ph, wp = w + 2 * pw, oh = hp - kh + 1, ow = wp - kw + 1;
    int failed = 0;
    n_threads = sa_threads(n_threads, n);
#pragma omp parallel num_threads(n_threads) if (n_threads > 1) reduction(| : failed)
    {
        sa_idx s;
        float *pad = (float *)calloc((size_t)(hp * wp * c), sizeof(float));
        if (pad == NULL) {
            failed = 1;
        } else {
#pragma omp for schedule(dynamic, 1)
            for (s = 0; s < n; ++s) {
                sa_pad_sample(x + s * h * w * c, h, w, c, ph, pw, pad);
                sa_fwd_sample(pad, wp, c, wt, bias, f, kh, kw, oh, ow, y + s * oh * ow * f);
            }
            free(pad);
        }
    }
    return failed ? -1 : 0;
#else
    (void)x; (void)n; (void)h; (void)w; (void)c; (void)wt; (void)bias; (void)f; (void)kh;
    (void)kw; (void)ph; (void)pw; (void)y; (void)n_threads;
    return -1;
#endif
}

/* dx (n, h, w, c) = the gradient of the forward above w.r.t. x, given dy
   (n, oh, ow, f); needs ph < kh and pw < kw.  Returns 0 or -1. */
static int sparkavg_conv_direct_backward_data(const float *dy, sa_idx n, sa_idx h, sa_idx w,
                                              sa_idx c, const float *wt, sa_idx f, sa_idx kh,
                                              sa_idx kw, sa_idx ph, sa_idx pw, float *dx,
                                              int n_threads)
{
    sa_idx oh = h + 2 * ph - kh + 1, ow = w + 2 * pw - kw + 1, i, j, cc, ff;
    int status;
    /* wf[i, j, f, c] = wt[kh-1-i, kw-1-j, c, f] */
    float *wf = (float *)malloc((size_t)(kh * kw * c * f) * sizeof(float));
    if (wf == NULL)
        return -1;
    for (i = 0; i < kh; ++i)
        for (j = 0; j < kw; ++j) {
            const float *src = wt + ((kh - 1 - i) * kw + (kw - 1 - j)) * c * f;
            float *dst = wf + (i * kw + j) * f * c;
            for (cc = 0; cc < c; ++cc)
                for (ff = 0; ff < f; ++ff)
                    dst[ff * c + cc] = src[cc * f + ff];
        }
    status = sparkavg_conv_direct_forward(dy, n, oh, ow, f, wf, NULL, c, kh, kw, kh - 1 - ph,
                                          kw - 1 - pw, dx, n_threads);
    free(wf);
    return status;
}

/* dw (kh, kw, c, f) and db (f, or NULL) = the gradients of the forward
   above given x (n, h, w, c) and dy (n, oh, ow, f); both overwritten.
   Returns 0 or -1. */
static int sparkavg_conv_direct_backward_weights(const float *x, sa_idx n, sa_idx h, sa_idx w,
                                                 sa_idx c, const float *dy, sa_idx f,
                                                 sa_idx kh, sa_idx kw, sa_idx ph, sa_idx pw,
                                                 float *dw, float *db, int n_threads)
{
#if SPARKAVG_HAVE_AVX512_CONV
    sa_idx hp = h + 2 * ph, wp = w + 2 * pw, oh = hp - kh + 1, ow = wp - kw + 1;
    sa_idx kf = kh * kw * c * f, stride = kf + f, k, g;
    sa_idx ngroups = (n + SA_DW_GROUP - 1) / SA_DW_GROUP;
    int failed = 0;
    /* Group g's dw (kf) then db (f); group 0's are dw and db themselves. */
    float *partial = NULL;
    if (ngroups > 1) {
        partial = (float *)malloc((size_t)((ngroups - 1) * stride) * sizeof(float));
        if (partial == NULL)
            return -1;
    }
    n_threads = sa_threads(n_threads, ngroups);
#pragma omp parallel num_threads(n_threads) if (n_threads > 1) reduction(| : failed)
    {
        sa_idx grp, s;
        float *pad = (float *)calloc((size_t)(hp * wp * c), sizeof(float));
        if (pad == NULL) {
            failed = 1;
        } else {
#pragma omp for schedule(dynamic, 1)
            for (grp = 0; grp < ngroups; ++grp) {
                float *my_dw = grp == 0 ? dw : partial + (grp - 1) * stride;
                float *my_db = grp == 0 ? db : partial + (grp - 1) * stride + kf;
                sa_idx end = (grp + 1) * SA_DW_GROUP < n ? (grp + 1) * SA_DW_GROUP : n;
                memset(my_dw, 0, (size_t)kf * sizeof(float));
                if (my_db != NULL)
                    memset(my_db, 0, (size_t)f * sizeof(float));
                for (s = grp * SA_DW_GROUP; s < end; ++s) {
                    const float *dys = dy + s * oh * ow * f;
                    sa_pad_sample(x + s * h * w * c, h, w, c, ph, pw, pad);
                    sa_dw_sample(pad, wp, c, dys, f, kh, kw, oh, ow, my_dw);
                    if (db != NULL)
                        sa_db_sample(dys, oh * ow, f, my_db);
                }
            }
            free(pad);
        }
    }
    for (g = 1; g < ngroups; ++g) {
        const float *src = partial + (g - 1) * stride;
        for (k = 0; k < kf; ++k)
            dw[k] += src[k];
        if (db != NULL)
            for (k = 0; k < f; ++k)
                db[k] += src[kf + k];
    }
    free(partial);
    return failed ? -1 : 0;
#else
    (void)x; (void)n; (void)h; (void)w; (void)c; (void)dy; (void)f; (void)kh; (void)kw;
    (void)ph; (void)pw; (void)dw; (void)db; (void)n_threads;
    return -1;
#endif
}

#endif /* SPARKAVG_CONV_DIRECT_H */
