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
# Sparse encoding selects instead (sparkavg_select): 64 values become one
# 64-bit mask (int32 compares on the bits of |x|, packed to one byte mask),
# and the mask becomes a list of positions without a branch per position --
# 8 (or, at low densities, 2) are always written, as in Lemire's bitset
# decoding, and the rare group holding more loops on -- so branches depend
# on groups of 64 values, not on each value sent.
#
# Why C here (2): sqrtf must set errno for negative input, so GCC wraps each
# call in a branch to libm and will not vectorise a loop that calls it --
# and #pragma GCC optimize("no-math-errno") does not help, since builtins'
# attributes follow the command line.  sparkavg_sqrt_inplace uses the SSE2
# sqrt instruction (correctly rounded, as sqrtf), 4 lanes at a time; the
# updaters call it on L1-sized blocks between two vectorised loops.
from libc.stdint cimport int32_t, uint64_t


cdef extern from *:
    """
    #include <float.h>
    #include <math.h>
    #include <stdint.h>
    #include <string.h>
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
    #if defined(__GNUC__) || defined(__clang__)
    #define sparkavg_ctz64(x) ((int)__builtin_ctzll((unsigned long long)(x)))
    #else
    static inline int sparkavg_ctz64(uint64_t x) {
        int n = 0;
        while (!(x & 1u)) { x >>= 1; ++n; }
        return n;
    }
    #endif
    static inline int sparkavg_popcount64(uint64_t x) {
        return sparkavg_popcount32((unsigned int)x) + sparkavg_popcount32((unsigned int)(x >> 32));
    }
    /* Positions base + j of the set bits j of m, ascending, into out;
       returns how many.  Writes 8 entries whatever the count (garbage past
       it: the sentinel bit 63 stands in for an exhausted mask, so ctz is
       always defined) and loops on for the rare ninth and later, so out
       needs room for 64. */
    static inline int sparkavg_positions64(uint64_t m, int32_t base, int32_t *out) {
        const uint64_t sentinel = 1ULL << 63;
        int t, cnt = sparkavg_popcount64(m);
        for (t = 0; t < 8; ++t) {
            out[t] = base + sparkavg_ctz64(m | sentinel);
            m &= m - 1u;
        }
        for (t = 8; m; ++t) {
            out[t] = base + sparkavg_ctz64(m);
            m &= m - 1u;
        }
        return cnt;
    }
    /* The same for masks with few bits (low densities): 2 entries always
       written, a loop for the third and later, and no popcount. */
    static inline int sparkavg_positions_few(uint64_t m, int32_t base, int32_t *out) {
        const uint64_t sentinel = 1ULL << 63;
        uint64_t m1 = m & (m - 1u), rest = m1 & (m1 - 1u);
        int cnt = (m != 0) + (m1 != 0);
        out[0] = base + sparkavg_ctz64(m | sentinel);
        out[1] = base + sparkavg_ctz64(m1 | sentinel);
        for (; rest; rest &= rest - 1u)
            out[cnt++] = base + sparkavg_ctz64(rest);
        return cnt;
    }

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
    /* Bit j of the result: |x[j]| >= tau (or x[j] is NaN), j < 64.  On
       the bits of |x| as int32, |x| >= tau is bits > bits(tau) - 1 (NaN's
       bits are above inf's), and 16 int32 compares pack into one byte
       mask.  acc keeps the int16 maximum of the bits of |x|: its high halves
       reach 0x7f80 (exponent all ones) only for NaN or inf. */
    typedef __m128i sparkavg_acc;
    typedef struct {
        __m128i bits;   /* bits(tau) - 1 in every int32 lane */
        __m128i high;   /* the high half of bits(tau) in every int16 lane */
    } sparkavg_tau;
    static inline sparkavg_acc sparkavg_acc_init(void) { return _mm_setzero_si128(); }
    static inline sparkavg_tau sparkavg_tau_init(float tau) {
        sparkavg_tau t;
        int32_t bits;
        memcpy(&bits, &tau, 4);
        t.bits = _mm_set1_epi32(bits - 1);
        t.high = _mm_set1_epi16((short)(bits >> 16));
        return t;
    }
    static inline int sparkavg_acc_nonfinite(sparkavg_acc acc) {
        __m128i high = _mm_cmpgt_epi16(acc, _mm_set1_epi16(0x7f7f));
        return (_mm_movemask_epi8(high) & 0xCCCC) != 0;   /* the high int16 halves */
    }
    static inline uint64_t sparkavg_mask64(const float *x, sparkavg_tau t,
                                           sparkavg_acc *acc) {
        const __m128i absmask = _mm_set1_epi32(0x7fffffff);
        const __m128i tbits = t.bits;
        uint64_t m = 0;
        int b;
        for (b = 0; b < 4; ++b) {
            const __m128i *v = (const __m128i *)(x + 16 * b);
            __m128i a0 = _mm_and_si128(_mm_loadu_si128(v), absmask);
            __m128i a1 = _mm_and_si128(_mm_loadu_si128(v + 1), absmask);
            __m128i a2 = _mm_and_si128(_mm_loadu_si128(v + 2), absmask);
            __m128i a3 = _mm_and_si128(_mm_loadu_si128(v + 3), absmask);
            __m128i c01 = _mm_packs_epi32(_mm_cmpgt_epi32(a0, tbits), _mm_cmpgt_epi32(a1, tbits));
            __m128i c23 = _mm_packs_epi32(_mm_cmpgt_epi32(a2, tbits), _mm_cmpgt_epi32(a3, tbits));
            m |= (uint64_t)(unsigned int)_mm_movemask_epi8(_mm_packs_epi16(c01, c23)) << (16 * b);
            *acc = _mm_max_epi16(*acc, _mm_max_epi16(_mm_max_epi16(a0, a1), _mm_max_epi16(a2, a3)));
        }
        return m;
    }
    /* 0 when no |x[j]| >= tau (nor NaN) can be among x[0:64]: the high
       halves of the bits of |x| all fall below tau's.  Updates acc as
       sparkavg_mask64, and is cheaper: no compares per value. */
    static inline int sparkavg_busy64(const float *x, sparkavg_tau t,
                                      sparkavg_acc *acc) {
        const __m128i absmask = _mm_set1_epi32(0x7fffffff);
        const __m128i *v = (const __m128i *)x;
        __m128i mx = _mm_and_si128(_mm_loadu_si128(v), absmask);
        int q;
        for (q = 1; q < 16; ++q)
            mx = _mm_max_epi16(mx, _mm_and_si128(_mm_loadu_si128(v + q), absmask));
        *acc = _mm_max_epi16(*acc, mx);
        /* busy unless tau's high half exceeds every high half of mx (the
           low int16 lanes are ignored) */
        return (_mm_movemask_epi8(_mm_cmpgt_epi16(t.high, mx)) & 0xCCCC) != 0xCCCC;
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
    typedef unsigned int sparkavg_acc;
    typedef float sparkavg_tau;
    static inline sparkavg_acc sparkavg_acc_init(void) { return 0u; }
    static inline sparkavg_tau sparkavg_tau_init(float tau) { return tau; }
    static inline int sparkavg_acc_nonfinite(sparkavg_acc acc) { return acc != 0u; }
    static inline uint64_t sparkavg_mask64(const float *x, sparkavg_tau tau,
                                           sparkavg_acc *acc) {
        uint64_t m = 0;
        int j;
        for (j = 0; j < 64; ++j) {
            float a = fabsf(x[j]);
            m |= (uint64_t)(a >= tau) << j;
            *acc |= !(a <= FLT_MAX);
        }
        return m;
    }
    static inline int sparkavg_busy64(const float *x, sparkavg_tau tau,
                                      sparkavg_acc *acc) {
        int j, c = 0;
        for (j = 0; j < 64; ++j) {
            float a = fabsf(x[j]);
            c |= !(a < tau);            /* to send, or NaN */
            *acc |= !(a <= FLT_MAX);
        }
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

    /* Sparse-encoding selection over x[0:64 * ngroups]: writes base + j for
       each |x[j]| >= tau, ascending, to out while fewer than `room` are
       written (up to 64 more past it, see sparkavg_positions64); returns how
       many qualify in all.  *nonfinite = 1 when some x[j] is NaN or inf
       (the caller rejects the vector then; NaN may have been selected).

       Two loops, chosen by the caller from the last span's density: where
       groups hold a value or more on average (`dense`), every group gets a
       mask and 8 positions written; below, a cheaper test skips the groups
       that hold nothing (a branch, well predicted there) and the others
       get 2 positions written.  Either way no branch depends on each value
       sent, only on the rare group holding more than 8 (or 2). */
    static inline Py_ssize_t sparkavg_select(const float *x, Py_ssize_t ngroups, float tau,
                                             int32_t base, int32_t *out, Py_ssize_t room,
                                             int dense, int *nonfinite) {
        sparkavg_acc acc = sparkavg_acc_init();
        sparkavg_tau t = sparkavg_tau_init(tau);
        Py_ssize_t g, count = 0;
        uint64_t m;
        if (dense) {
            for (g = 0; g < ngroups; ++g) {
                m = sparkavg_mask64(x + 64 * g, t, &acc);
                if (count < room)
                    count += sparkavg_positions64(m, base + (int32_t)(64 * g), out + count);
                else
                    count += sparkavg_popcount64(m);
            }
        } else {
            for (g = 0; g < ngroups; ++g) {
                if (!sparkavg_busy64(x + 64 * g, t, &acc))
                    continue;
                m = sparkavg_mask64(x + 64 * g, t, &acc);
                if (count < room)
                    count += sparkavg_positions_few(m, base + (int32_t)(64 * g), out + count);
                else
                    count += sparkavg_popcount64(m);
            }
        }
        *nonfinite = sparkavg_acc_nonfinite(acc);
        return count;
    }
    """
    # ctz of 0 is undefined: callers test the word first.
    int sparkavg_ctz32(unsigned int x) noexcept nogil
    int sparkavg_popcount32(unsigned int x) noexcept nogil
    # libnd4j word of x[0:16] (bit j: |x_j| >= tau, bit j+16: x_j <= -tau);
    # bad receives the mask of NaN/inf lanes.  Reads exactly 16 floats.
    unsigned int sparkavg_scan16(const float* x, float tau, unsigned int* bad) noexcept nogil
    # Sparse-encoding selection over x[0:64 * ngroups]: writes base + j for
    # each |x_j| >= tau, ascending, to out while fewer than `room` are
    # written (and up to 64 entries past that: out needs room + 64); returns
    # how many qualify in all; nonfinite[0] = 1 when some x_j is NaN or inf
    # (a NaN may then have been selected: the caller rejects the vector).
    # `dense`: 1 where the values sent average one per 64 or more (speed only).
    Py_ssize_t sparkavg_select(const float* x, Py_ssize_t ngroups, float tau, int32_t base,
                               int32_t* out, Py_ssize_t room, int dense,
                               int* nonfinite) noexcept nogil
    # x[j] -= +-step for each value bit j of w (sign bit j+16: -step);
    # reads and writes all 16 floats, so only for words inside the vector.
    void sparkavg_apply16(float* x, unsigned int w, float step) noexcept nogil
    # x[i] = sqrt(x[i]) for i < n, correctly rounded.
    void sparkavg_sqrt_inplace(float* x, Py_ssize_t n) noexcept nogil
