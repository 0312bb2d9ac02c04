/* One kernel body, two targets.
 *
 * Every kernel in this folder is written against the macros below.  Under a
 * CUDA compiler (nvrtc through cupy.RawModule, or nvcc) they expand to
 * extern "C" __global__ kernels with grid-stride loops and warp intrinsics;
 * under a plain C compiler they expand to serial loops, so that
 * tests/test_cuda_sources.py can run the very same bodies on the CPU and
 * hold them to the numpy reference.
 *
 * The includer defines two types first: T (float or double, the array
 * element) and I (int or long long, the flat index).
 *
 * Warp discipline (what makes the serial emulation exact):
 *   - SPK_FOR_WARPS loops are warp-uniform: every lane runs every iteration.
 *   - A value that differs between lanes lives only inside a ballot
 *     expression or an SPK_LANES section; everything else is warp-uniform
 *     (computed from ballots).  The C target runs a ballot's expression for
 *     lanes 0..31 in turn and an SPK_LANES section once per lane.
 *   - Ballot expressions only read memory that no lane writes in the same
 *     chunk (the same group of chunks, for SPK_BALLOTS) before the ballot.
 */
#ifndef SPK_CUH
#define SPK_CUH

#if defined(__CUDACC__)

#define SPK_KERNEL extern "C" __global__ void
#define SPK_DEV static __device__ __forceinline__
#define SPK_RESTRICT __restrict__
#define SPK_FULL_MASK 0xffffffffu
/* Flat thread index i over [0, total), grid-stride. */
#define SPK_FOR(i, total)                                                     \
    for (I i = (I)blockIdx.x * (I)blockDim.x + (I)threadIdx.x; i < (I)(total); \
         i += (I)blockDim.x * (I)gridDim.x)
/* Warp index w over [0, count), grid-stride; blockDim.x is a multiple of 32. */
#define SPK_FOR_WARPS(w, count)                                               \
    for (I w = ((I)blockIdx.x * (I)blockDim.x + (I)threadIdx.x) >> 5;         \
         w < (I)(count); w += ((I)blockDim.x * (I)gridDim.x) >> 5)
/* A section each lane L of the warp runs for itself. */
#define SPK_LANES(L)                                                          \
    for (int L = (int)(threadIdx.x & 31u), spk_once_ = 1; spk_once_; spk_once_ = 0)
/* Ballots over bit 0 (and 1, 2) of expr, an int computed by every lane L. */
#define SPK_BALLOT(m0, L, expr)                                               \
    unsigned m0;                                                              \
    {                                                                         \
        const int L = (int)(threadIdx.x & 31u);                               \
        m0 = __ballot_sync(SPK_FULL_MASK, (expr) & 1);                        \
    }
#define SPK_BALLOT2(m0, m1, L, expr)                                          \
    unsigned m0, m1;                                                          \
    {                                                                         \
        const int L = (int)(threadIdx.x & 31u);                               \
        const int spk_v_ = (expr);                                            \
        m0 = __ballot_sync(SPK_FULL_MASK, spk_v_ & 1);                        \
        m1 = __ballot_sync(SPK_FULL_MASK, spk_v_ & 2);                        \
    }
#define SPK_BALLOT3(m0, m1, m2, L, expr)                                      \
    unsigned m0, m1, m2;                                                      \
    {                                                                         \
        const int L = (int)(threadIdx.x & 31u);                               \
        const int spk_v_ = (expr);                                            \
        m0 = __ballot_sync(SPK_FULL_MASK, spk_v_ & 1);                        \
        m1 = __ballot_sync(SPK_FULL_MASK, spk_v_ & 2);                        \
        m2 = __ballot_sync(SPK_FULL_MASK, spk_v_ & 4);                        \
    }
/* The ballots of NJ chunks at once: expr, an int of lane L and chunk J in
 * [0, NJ), is computed for every chunk before any ballot, so that the
 * chunks' loads can be in flight together.  m0[J] (m1[J]) holds bit 0 (1)
 * of chunk J's values. */
#define SPK_BALLOTS(m0, J, NJ, L, expr)                                       \
    unsigned m0[NJ];                                                          \
    {                                                                         \
        const int L = (int)(threadIdx.x & 31u);                               \
        int spk_v_[NJ];                                                       \
        _Pragma("unroll") for (int J = 0; J < (NJ); ++J) spk_v_[J] = (expr);  \
        _Pragma("unroll") for (int J = 0; J < (NJ); ++J)                      \
            m0[J] = __ballot_sync(SPK_FULL_MASK, spk_v_[J] & 1);              \
    }
#define SPK_BALLOTS2(m0, m1, J, NJ, L, expr)                                  \
    unsigned m0[NJ], m1[NJ];                                                  \
    {                                                                         \
        const int L = (int)(threadIdx.x & 31u);                               \
        int spk_v_[NJ];                                                       \
        _Pragma("unroll") for (int J = 0; J < (NJ); ++J) spk_v_[J] = (expr);  \
        _Pragma("unroll") for (int J = 0; J < (NJ); ++J) {                    \
            m0[J] = __ballot_sync(SPK_FULL_MASK, spk_v_[J] & 1);              \
            m1[J] = __ballot_sync(SPK_FULL_MASK, spk_v_[J] & 2);              \
        }                                                                     \
    }
/* Runs once per warp (lane 0). */
#define SPK_WARP_LEADER if ((threadIdx.x & 31u) == 0u)
/* Runs once per launch. */
#define SPK_ONCE if (blockIdx.x == 0 && threadIdx.x == 0)
#define SPK_POPC(x) __popc(x)
#define SPK_CTZ(x) (__ffs((int)(x)) - 1)
#define SPK_ATOMIC_ADD(p, v) atomicAdd((p), (v))
#define SPK_ATOMIC_ADD64(p, v) atomicAdd((unsigned long long *)(p), (unsigned long long)(v))
#define SPK_ATOMIC_MAX64(p, v) atomicMax((long long *)(p), (long long)(v))

#else /* plain C: the serial emulation */

#define SPK_KERNEL void
#define SPK_DEV static inline
#define SPK_RESTRICT restrict
#define SPK_FOR(i, total) for (I i = 0; i < (I)(total); ++i)
#define SPK_FOR_WARPS(w, count) for (I w = 0; w < (I)(count); ++w)
#define SPK_LANES(L) for (int L = 0; L < 32; ++L)
#define SPK_BALLOT(m0, L, expr)                                               \
    unsigned m0 = 0u;                                                         \
    for (int L = 0; L < 32; ++L) m0 |= (unsigned)((expr) & 1) << L;
#define SPK_BALLOT2(m0, m1, L, expr)                                          \
    unsigned m0 = 0u, m1 = 0u;                                                \
    for (int L = 0; L < 32; ++L) {                                            \
        const int spk_v_ = (expr);                                            \
        m0 |= (unsigned)(spk_v_ & 1) << L;                                    \
        m1 |= (unsigned)((spk_v_ >> 1) & 1) << L;                             \
    }
#define SPK_BALLOT3(m0, m1, m2, L, expr)                                      \
    unsigned m0 = 0u, m1 = 0u, m2 = 0u;                                       \
    for (int L = 0; L < 32; ++L) {                                            \
        const int spk_v_ = (expr);                                            \
        m0 |= (unsigned)(spk_v_ & 1) << L;                                    \
        m1 |= (unsigned)((spk_v_ >> 1) & 1) << L;                             \
        m2 |= (unsigned)((spk_v_ >> 2) & 1) << L;                             \
    }
#define SPK_BALLOTS(m0, J, NJ, L, expr)                                       \
    unsigned m0[NJ];                                                          \
    for (int J = 0; J < (NJ); ++J) {                                          \
        m0[J] = 0u;                                                           \
        for (int L = 0; L < 32; ++L) m0[J] |= (unsigned)((expr) & 1) << L;    \
    }
#define SPK_BALLOTS2(m0, m1, J, NJ, L, expr)                                  \
    unsigned m0[NJ], m1[NJ];                                                  \
    for (int J = 0; J < (NJ); ++J) {                                          \
        m0[J] = m1[J] = 0u;                                                   \
        for (int L = 0; L < 32; ++L) {                                        \
            const int spk_v_ = (expr);                                        \
            m0[J] |= (unsigned)(spk_v_ & 1) << L;                             \
            m1[J] |= (unsigned)((spk_v_ >> 1) & 1) << L;                      \
        }                                                                     \
    }
#define SPK_WARP_LEADER if (1)
#define SPK_ONCE if (1)
#define SPK_POPC(x) __builtin_popcount(x)
#define SPK_CTZ(x) __builtin_ctz(x)
#define SPK_ATOMIC_ADD(p, v) (*(p) += (v))
#define SPK_ATOMIC_ADD64(p, v) (*(p) += (long long)(v))
#define SPK_ATOMIC_MAX64(p, v)                                                \
    do {                                                                      \
        long long spk_m_ = (long long)(v);                                    \
        if (spk_m_ > *(p)) *(p) = spk_m_;                                     \
    } while (0)

#endif

/* Finite without <math.h> (nvrtc) and without fast-math folding: inf - inf
 * and NaN - NaN are NaN, which compares unequal to 0. */
#define SPK_ISFINITE(x) (((x) - (x)) == (T)0)

#endif /* SPK_CUH */
