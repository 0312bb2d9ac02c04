# Bit-level helpers shared by the encoders, as inline C.
#
# Why C here: the encoders' hot loop turns 16 floats into one libnd4j bitmap
# word (bit j: |x_j| >= tau, bit j+16: x_j <= -tau).  GCC does not vectorise
# that from plain C or Cython (it unrolls the 16 lanes and compares them one
# by one; see `cython -a` / -fopt-info-vec), while SSE2 -- the x86-64
# baseline, so no -march flag is needed -- does it with one compare and one
# movemask per 4 lanes.  Other targets get the portable scalar version;
# both give the same bits, which the tests check against the numpy
# reference.
cdef extern from *:
    """
    #include <float.h>
    #if defined(__GNUC__) || defined(__clang__)
    #define sparkavg_ctz32(x) ((int)__builtin_ctz((unsigned int)(x)))
    #define sparkavg_popcount32(x) ((int)__builtin_popcount((unsigned int)(x)))
    #else
    static inline int sparkavg_ctz32(unsigned int x) {
        int n = 0;
        while (!(x & 1u)) { x >>= 1; ++n; }
        return n;
    }
    static inline int sparkavg_popcount32(unsigned int x) {
        int n = 0;
        while (x) { x &= x - 1u; ++n; }
        return n;
    }
    #endif

    #if defined(__SSE2__) || defined(_M_X64)
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
    #else
    #include <math.h>
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
