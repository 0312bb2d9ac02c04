# SIMD helpers shared by the kernels, as inline C.
#
# Why C here (1): the encoders' hot loop turns 16 floats into one libnd4j bitmap
# word (bit j: |x_j| >= tau, bit j+16: x_j <= -tau).  GCC does not vectorise
# that from plain C or Cython (it unrolls the 16 lanes and compares them one
# by one; see `cython -a` / -fopt-info-vec), while SSE2 -- the x86-64
# baseline, so no -march flag is needed -- does it with one compare and one
# movemask per 4 lanes.  Other targets get the portable scalar version;
# both give the same bits, which the tests check against the numpy
# reference (build with CFLAGS=-DSPARKAVG_NO_SIMD to test the portable one).
#
# The same 16-lane view serves applying a bitmap word (sparkavg_apply16):
# expanding the bits into lane masks beats a branchy loop over the set bits.
#
# Why C here (2): sqrtf must set errno for negative input, so GCC wraps each
# call in a branch to libm and will not vectorise a loop that calls it --
# and #pragma GCC optimize("no-math-errno") does not help, since builtins'
# attributes follow the command line.  sparkavg_sqrt_inplace uses the SSE2
# sqrt instruction (correctly rounded, as sqrtf), 4 lanes at a time; the
# updaters call it on L1-sized blocks between two vectorised loops.
cdef extern from *:
    """
    #include <float.h>
    #if defined(__GNUC__) || defined(__clang__)
    #define sparkavg_ctz32(x) ((int)__builtin_ctz((unsigned int)(x)))
    #else
    static inline int sparkavg_ctz32(unsigned int x) {
        int n = 0;
        while (!(x & 1u)) { x >>= 1; ++n; }
        return n;
    }
    #endif
    #if defined(__POPCNT__)
    #define sparkavg_popcount32(x) ((int)__builtin_popcount((unsigned int)(x)))
    #else
    /* Without -mpopcnt (not in the x86-64 baseline) __builtin_popcount is a
       libgcc call; this branch-free count is a handful of instructions. */
    static inline int sparkavg_popcount32(unsigned int x) {
        x = x - ((x >> 1) & 0x55555555u);
        x = (x & 0x33333333u) + ((x >> 2) & 0x33333333u);
        x = (x + (x >> 4)) & 0x0F0F0F0Fu;
        return (int)((x * 0x01010101u) >> 24);
    }
    #endif

    #if (defined(__SSE2__) || defined(_M_X64)) && !defined(SPARKAVG_NO_SIMD)
    #include <emmintrin.h>
    #define SPARKAVG_MM4(cmp, a0, a1, a2, a3) \
        ((unsigned int)_mm_movemask_ps(cmp(a0)) \
         | ((unsigned int)_mm_movemask_ps(cmp(a1)) << 4) \
         | ((unsigned int)_mm_movemask_ps(cmp(a2)) << 8) \
         | ((unsigned int)_mm_movemask_ps(cmp(a3)) << 12))
    static inline unsigned int sparkavg_scan16(const float *x, float tau,
                                               unsigned int *bad) {
        const __m128 absmask = _mm_castsi128_ps(_mm_set1_epi32(0x7fffffff));
        const __m128 vt = _mm_set1_ps(tau);
        const __m128 vmax = _mm_set1_ps(FLT_MAX);
        __m128 x0 = _mm_loadu_ps(x), x1 = _mm_loadu_ps(x + 4);
        __m128 x2 = _mm_loadu_ps(x + 8), x3 = _mm_loadu_ps(x + 12);
        __m128 a0 = _mm_and_ps(x0, absmask), a1 = _mm_and_ps(x1, absmask);
        __m128 a2 = _mm_and_ps(x2, absmask), a3 = _mm_and_ps(x3, absmask);
        unsigned int val, neg;
        /* not (|x| < tau): values to send, inf and NaN (unordered -> true) */
        #define SPARKAVG_BUSY(a) _mm_cmpnlt_ps(a, vt)
        if (!SPARKAVG_MM4(SPARKAVG_BUSY, a0, a1, a2, a3)) { *bad = 0; return 0u; }
        #undef SPARKAVG_BUSY
        #define SPARKAVG_VAL(a) _mm_cmpge_ps(a, vt)
        val = SPARKAVG_MM4(SPARKAVG_VAL, a0, a1, a2, a3);
        #undef SPARKAVG_VAL
        #define SPARKAVG_ID(a) (a)
        neg = SPARKAVG_MM4(SPARKAVG_ID, x0, x1, x2, x3) & val;   /* sign bits */
        #undef SPARKAVG_ID
        #define SPARKAVG_BAD(a) _mm_cmpnle_ps(a, vmax)
        *bad = SPARKAVG_MM4(SPARKAVG_BAD, a0, a1, a2, a3);
        #undef SPARKAVG_BAD
        return val | (neg << 16);
    }
    /* 1 when any of x[0:16] is not strictly inside (-tau, tau) (a value to
       send, inf or NaN), else 0; no branch. */
    static inline int sparkavg_busy16(const float *x, float tau) {
        const __m128 absmask = _mm_castsi128_ps(_mm_set1_epi32(0x7fffffff));
        const __m128 vt = _mm_set1_ps(tau);
        __m128 a0 = _mm_and_ps(_mm_loadu_ps(x), absmask);
        __m128 a1 = _mm_and_ps(_mm_loadu_ps(x + 4), absmask);
        __m128 a2 = _mm_and_ps(_mm_loadu_ps(x + 8), absmask);
        __m128 a3 = _mm_and_ps(_mm_loadu_ps(x + 12), absmask);
        __m128 any = _mm_or_ps(_mm_or_ps(_mm_cmpnlt_ps(a0, vt), _mm_cmpnlt_ps(a1, vt)),
                               _mm_or_ps(_mm_cmpnlt_ps(a2, vt), _mm_cmpnlt_ps(a3, vt)));
        return _mm_movemask_ps(any) != 0;
    }
    /* x[j] -= (bit j of w ? (bit j+16 of w ? -step : step) : +0.0f), j < 16.
       Subtracting +0.0 leaves every value (-0.0 included) as it was, and
       x - (-step) is x + step to the last bit, so this equals the per-bit
       loop. */
    static inline void sparkavg_apply16(float *x, unsigned int w, float step) {
        const __m128i sel = _mm_set_epi32(8, 4, 2, 1);
        const __m128 vstep = _mm_set1_ps(step);
        const __m128 sign = _mm_set1_ps(-0.0f);
        int q;
        for (q = 0; q < 4; ++q) {
            __m128i has = _mm_set1_epi32((int)((w >> (4 * q)) & 0xFu));
            __m128i neg = _mm_set1_epi32((int)((w >> (16 + 4 * q)) & 0xFu));
            __m128 mh = _mm_castsi128_ps(_mm_cmpeq_epi32(_mm_and_si128(has, sel), sel));
            __m128 mn = _mm_castsi128_ps(_mm_cmpeq_epi32(_mm_and_si128(neg, sel), sel));
            __m128 d = _mm_xor_ps(_mm_and_ps(mh, vstep), _mm_and_ps(mn, sign));
            _mm_storeu_ps(x + 4 * q, _mm_sub_ps(_mm_loadu_ps(x + 4 * q), d));
        }
    }
    static inline void sparkavg_sqrt_inplace(float *x, Py_ssize_t n) {
        Py_ssize_t i = 0;
        for (; i + 4 <= n; i += 4)
            _mm_storeu_ps(x + i, _mm_sqrt_ps(_mm_loadu_ps(x + i)));
        for (; i < n; ++i)
            x[i] = _mm_cvtss_f32(_mm_sqrt_ss(_mm_set_ss(x[i])));
    }
    #else
    #include <math.h>
    static inline int sparkavg_busy16(const float *x, float tau) {
        int j, c = 0;
        for (j = 0; j < 16; ++j)
            c |= !(fabsf(x[j]) < tau);
        return c;
    }
    static inline void sparkavg_apply16(float *x, unsigned int w, float step) {
        int j;
        for (j = 0; j < 16; ++j)
            if ((w >> j) & 1u)
                x[j] -= ((w >> (j + 16)) & 1u) ? -step : step;
    }
    static inline void sparkavg_sqrt_inplace(float *x, Py_ssize_t n) {
        Py_ssize_t i;
        for (i = 0; i < n; ++i)
            x[i] = sqrtf(x[i]);
    }
    static inline unsigned int sparkavg_scan16(const float *x, float tau,
                                               unsigned int *bad) {
        unsigned int w = 0u, b = 0u;
        int j;
        for (j = 0; j < 16; ++j) {
            float a = fabsf(x[j]);
            w |= (unsigned int)(a >= tau) << j;
            w |= (unsigned int)(x[j] <= -tau) << (j + 16);
            b |= (unsigned int)(!(a <= FLT_MAX)) << j;
        }
        *bad = b;
        return w;
    }
    #endif
    """
    # ctz of 0 is undefined: callers test the word first.
    int sparkavg_ctz32(unsigned int x) noexcept nogil
    int sparkavg_popcount32(unsigned int x) noexcept nogil
    # libnd4j word of x[0:16] (bit j: |x_j| >= tau, bit j+16: x_j <= -tau);
    # bad receives the mask of NaN/inf lanes.  Reads exactly 16 floats.
    unsigned int sparkavg_scan16(const float* x, float tau, unsigned int* bad) noexcept nogil
    # 1 when x[0:16] holds a value to send, inf or NaN, else 0 (branch-free).
    int sparkavg_busy16(const float* x, float tau) noexcept nogil
    # x[j] -= +-step for each value bit j of w (sign bit j+16: -step);
    # reads and writes all 16 floats, so only for words inside the vector.
    void sparkavg_apply16(float* x, unsigned int w, float step) noexcept nogil
    # x[i] = sqrt(x[i]) for i < n, correctly rounded.
    void sparkavg_sqrt_inplace(float* x, Py_ssize_t n) noexcept nogil
