"""Threshold (sparse) and bitmap encoding of residuals, after libnd4j.

The public ``def`` functions take float32 / int32 contiguous 1-D buffers
(typed memoryviews reject anything else) and assume :mod:`sparkavg.ops`
validated the threshold and message headers; they re-check what would
otherwise read or write out of bounds.

A residual holding NaN or inf is rejected and left bit-for-bit unchanged:

- the bitmap encoder works in two passes: pass 1 only reads (bitmap words,
  counts, non-finite values), pass 2 touches only the entries selected;
- the sparse encoder works in one pass over the residual that subtracts
  as it selects, chunk by chunk while the chunk is in L1, and keeps every
  selected entry's old value; when the message is not sent (NaN/inf, fewer
  than 2 entries, or capped with ``apply_when_capped=False``) it writes
  those values back.  (Two passes over the whole vector re-fetch memory.)

The bitmap encoder looks at blocks of 16 values (one bitmap word) through
SIMD masks (_simd.pxd).  The sparse encoder turns each 64 values into a
64-bit mask and the mask into positions with no branch per position
(``sparkavg_select``), written straight into the message; a second loop
over the chunk's positions then writes the signed indices and subtracts.
The former encoder branched per value sent (a loop over the set bits of
each busy 16-value block), which mispredicts whenever the count per block
varies: on 8M values at densities of 4.6-6.25% it ran at 0.37-0.46 of the
copy read rate, this one at 0.75-0.9, and no slower at lower densities
(benchmarks/bench_kernels.py ``--sweep-only``, 2-core VM under load).
"""
from libc.float cimport FLT_MAX
from libc.math cimport fabsf
from libc.stdint cimport int32_t, uint32_t
from libc.string cimport memcpy

import numpy as np

from ._simd cimport (
    sparkavg_apply16,
    sparkavg_ctz32,
    sparkavg_popcount32,
    sparkavg_scan16,
    sparkavg_select,
)

__all__ = [
    "sparse_encode",
    "sparse_decode",
    "bitmap_encode",
    "bitmap_decode",
    "count_above",
    "clip",
]

cdef enum:
    BLOCK = 16      # values per bitmap word
    GROUP = 64      # values per selection mask in sparse encoding
    CHUNK = 4096    # values per select-then-take pass in sparse encoding (16 KiB)


# ------------------------------------------------------------------ helpers
cdef inline void _note_bad(unsigned int mask, Py_ssize_t base,
                           Py_ssize_t* bad) noexcept nogil:
    """Count the NaN/inf lanes of one block into bad[0]; first index into bad[1]."""
    if bad[0] == 0:
        bad[1] = base + sparkavg_ctz32(mask)
    bad[0] += sparkavg_popcount32(mask)


cdef inline unsigned int _scan_tail(const float* x, int rest, float tau,
                                    unsigned int* badmask) noexcept nogil:
    """sparkavg_scan16 of the last n % 16 values, zero padded (0 < tau
    never sends)."""
    cdef float pad[BLOCK]
    cdef int j
    for j in range(BLOCK):
        pad[j] = x[j] if j < rest else 0.0
    return sparkavg_scan16(pad, tau, badmask)


cdef inline void _take(float* r, int32_t* body, float* orig, Py_ssize_t lo,
                       Py_ssize_t hi, float tau) noexcept nogil:
    """Turn the positions body[lo:hi] into signed 1-based indices, keep
    r's values in orig (for an exact undo) and subtract +-tau from r."""
    cdef Py_ssize_t k
    cdef int32_t p, s
    cdef float x
    cdef float step[2]
    step[0] = tau
    step[1] = -tau           # x - (-tau) is x + tau to the last bit
    for k in range(lo, hi):
        p = body[k]
        x = r[p]
        s = -<int32_t>(x < 0)                   # 0 or -1 (|x| >= tau > 0)
        body[k] = ((p + 1) ^ s) - s
        orig[k] = x
        r[p] = x - step[-s]


cdef void _count_bad(const float* r, Py_ssize_t n, Py_ssize_t base,
                     Py_ssize_t* bad) noexcept nogil:
    """Count the NaN/inf values of r[0:n] into bad[0]; first index into bad[1]."""
    cdef Py_ssize_t i
    for i in range(n):
        if not (fabsf(r[i]) <= FLT_MAX):
            if bad[0] == 0:
                bad[1] = base + i
            bad[0] += 1


# ------------------------------------------------------------------ kernels
cdef Py_ssize_t _sparse_encode(float* r, Py_ssize_t n, float tau,
                               int32_t* body, float* orig, Py_ssize_t limit,
                               Py_ssize_t* bad) noexcept nogil:
    cdef Py_ssize_t c, hi, full, first, count = 0
    cdef int j, rest, nonfinite
    cdef bint dense = False
    cdef float pad[GROUP]
    # Per chunk of CHUNK values (in L1): select the positions to send,
    # written straight into body without a branch per position
    # (sparkavg_select); then, while the chunk is still in L1, turn them
    # into signed indices and subtract.  Past the cap only the count goes on.
    c = 0
    while c < n:
        hi = min(c + CHUNK, n)
        full = (hi - c) // GROUP
        first = count
        count += sparkavg_select(r + c, full, tau, <int32_t>c, body + count,
                                 max(limit - count, 0), dense, &nonfinite)
        rest = <int>(hi - c - full * GROUP)
        if rest:         # the last n % 64 values, zero padded (0 < tau)
            for j in range(GROUP):
                pad[j] = r[hi - rest + j] if j < rest else 0.0
            count += sparkavg_select(pad, 1, tau, <int32_t>(hi - rest), body + count,
                                     max(limit - count, 0), dense, &j)
            nonfinite |= j
        if nonfinite:
            _count_bad(r + c, hi - c, c, bad)
        if first < limit:
            _take(r, body, orig, first, min(count, limit), tau)
        dense = count - first >= full    # this chunk's density sets the next one's loop
        c = hi
    return count


cdef void _sparse_undo(float* r, const int32_t* body, const float* orig,
                       Py_ssize_t m) noexcept nogil:
    cdef Py_ssize_t k
    cdef int32_t v, s
    for k in range(m):
        v = body[k]
        s = v >> 31
        r[((v ^ s) - s) - 1] = orig[k]


cdef Py_ssize_t _bitmap_collect(const float* r, Py_ssize_t n, float tau,
                                int32_t* words, Py_ssize_t* bad) noexcept nogil:
    cdef Py_ssize_t k, count = 0
    cdef Py_ssize_t nfull = n // BLOCK
    cdef int rest = <int>(n - nfull * BLOCK)
    cdef unsigned int w, badmask
    for k in range(nfull):
        w = sparkavg_scan16(r + k * BLOCK, tau, &badmask)
        words[k] = <int32_t>w
        if w:
            count += sparkavg_popcount32(w & 0xFFFFu)
        if badmask:
            _note_bad(badmask, k * BLOCK, bad)
    # The last word covers the n % 16 trailing values (none when 16 | n, as
    # libnd4j's length n // 16 + 5 leaves one spare word then).
    w = 0
    if rest:
        w = _scan_tail(r + nfull * BLOCK, rest, tau, &badmask)
        if badmask:
            _note_bad(badmask, nfull * BLOCK, bad)
    words[nfull] = <int32_t>w
    count += sparkavg_popcount32(w & 0xFFFFu)
    return count


cdef void _bitmap_apply(float* r, Py_ssize_t n, const int32_t* words,
                        Py_ssize_t nwords, float tau, bint subtract) noexcept nogil:
    cdef Py_ssize_t k, base
    cdef Py_ssize_t nfull = n // BLOCK
    cdef uint32_t w, vals, neg
    cdef int j
    # Encoding subtracts what is sent (r -= +-tau), decoding adds it; in
    # both cases r - (-x) equals r + x to the last bit, so one subtraction
    # of step[sign] serves, without a branch on the sign.
    cdef float step[2]
    step[0] = tau if subtract else -tau      # value bit alone: +tau sent
    step[1] = -step[0]                       # with the sign bit: -tau sent
    for k in range(nwords):
        w = <uint32_t>words[k]
        if w == 0:
            continue
        base = k * BLOCK
        if k < nfull:
            # Lane-wise even for one bit: measured faster than the bit loop
            # at every density (no sign branch, no loop-exit mispredicts).
            sparkavg_apply16(r + base, w, step[0])
            continue
        vals = w & 0xFFFFu
        neg = w >> 16
        while vals:
            j = sparkavg_ctz32(vals)
            r[base + j] -= step[(neg >> j) & 1u]
            vals &= vals - 1u


cdef Py_ssize_t _sparse_check(const int32_t* body, Py_ssize_t m,
                              Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t k
    cdef int32_t v
    for k in range(m):
        v = body[k]
        if v == 0 or v > n or v < -n:
            return k
    return -1


cdef Py_ssize_t _bitmap_check(const int32_t* words, Py_ssize_t nwords,
                              Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t k, valid
    cdef uint32_t w
    for k in range(nwords):
        w = <uint32_t>words[k]
        if (w >> 16) & ~w & 0xFFFFu:
            return k            # sign bit without its value bit
        valid = n - k * BLOCK
        if valid < BLOCK:
            if valid <= 0:
                if w != 0:
                    return k    # a word entirely past the end
            elif (w & 0xFFFFu) >> valid:
                return k        # a bit past the end
    return -1


cdef void _sparse_add(float* t, const int32_t* body, Py_ssize_t m,
                      float tau) noexcept nogil:
    cdef Py_ssize_t k
    cdef int32_t v, s
    cdef float step[2]
    step[0] = -tau          # t - (-tau) == t + tau: a positive index adds tau
    step[1] = tau
    for k in range(m):
        v = body[k]
        s = v >> 31
        t[((v ^ s) - s) - 1] -= step[-s]


cdef Py_ssize_t _count_above(const float* r, Py_ssize_t n,
                             float tau) noexcept nogil:
    cdef Py_ssize_t i, c = 0
    for i in range(n):
        c += fabsf(r[i]) >= tau
    return c


cdef void _clip(float* r, Py_ssize_t n, float bound) noexcept nogil:
    cdef Py_ssize_t i
    cdef float x
    cdef float lo = -bound
    for i in range(n):
        x = r[i]
        # NaN compares false both ways and stays NaN, as numpy.clip.  Every entry is
        # stored (select, not branch): the loop vectorises to compares and blends.
        x = bound if x > bound else x
        r[i] = lo if x < lo else x


# ----------------------------------------------------------------- wrappers
cdef inline int32_t _float_bits(float x) noexcept nogil:
    cdef int32_t i
    memcpy(&i, &x, 4)
    return i


cdef inline float _bits_float(int32_t i) noexcept nogil:
    cdef float x
    memcpy(&x, &i, 4)
    return x


def _raise_non_finite(Py_ssize_t n_bad, Py_ssize_t first):
    raise ValueError(
        f"residual holds {n_bad} non-finite value(s) (NaN or inf), the first at "
        f"index {first}; nothing was encoded and the residual is unchanged"
    )


def sparse_encode(float[::1] residual, float tau, Py_ssize_t limit,
                  bint apply_when_capped=True):
    """Sparse ("flexible") encoding of ``residual`` in place.

    Parameters
    ----------
    residual : float32[N], C-contiguous, writable
    tau : float, > 0 and finite (validated by the caller)
    limit : int >= 0, most indices one message carries
    apply_when_capped : if False and ``total >= limit``, send nothing and
        leave ``residual`` untouched (``encode`` then uses a bitmap)

    Returns
    -------
    (message, total) : int32[4 + count] or None, and how many entries had
        ``|r| >= tau`` (before the cap).  None when total < 2.

    One pass subtracts as it selects (chunk by chunk) and keeps each
    selected entry's old value; when nothing is sent (NaN/inf found, fewer
    than 2 entries, or capped with ``apply_when_capped=False``) the old
    values are put back, so the residual is then bit-for-bit unchanged.
    """
    cdef Py_ssize_t n = residual.shape[0]
    cdef Py_ssize_t cap, total, m
    cdef Py_ssize_t bad[2]
    if limit < 0:
        raise ValueError(f"Expect limit >= 0, got {limit}")
    if n == 0:
        return None, 0
    cap = min(limit, n)
    # Positions are written up to GROUP entries ahead of the count.
    buf = np.empty(4 + cap + GROUP, dtype=np.int32)
    saved = np.empty(max(cap, 1), dtype=np.float32)
    cdef int32_t[::1] out = buf
    cdef float[::1] orig = saved
    bad[0] = 0
    bad[1] = -1
    with nogil:
        total = _sparse_encode(&residual[0], n, tau, &out[0] + 4, &orig[0], cap, bad)
    m = min(total, cap)
    if bad[0] or total < 2 or (total >= limit and not apply_when_capped):
        with nogil:
            _sparse_undo(&residual[0], &out[0] + 4, &orig[0], m)
        if bad[0]:
            _raise_non_finite(bad[0], bad[1])
        return None, total
    out[0] = <int32_t>m
    out[1] = <int32_t>n
    out[2] = _float_bits(tau)
    out[3] = 0
    out = None      # release the buffer, so that numpy may shrink it in place
    buf.resize(4 + m, refcheck=False)   # realloc: no copy, unused pages never touched
    return buf, total


def bitmap_encode(float[::1] residual, float tau):
    """Bitmap encoding of ``residual`` in place.

    Returns ``(message, count)``: int32[N // 16 + 5] with header
    [N, N, bits(tau), 1], and how many values it sends.
    """
    cdef Py_ssize_t n = residual.shape[0]
    cdef Py_ssize_t nwords = n // BLOCK + 1
    cdef Py_ssize_t count
    cdef Py_ssize_t bad[2]
    cdef const float* rp = NULL
    buf = np.empty(4 + nwords, dtype=np.int32)
    cdef int32_t[::1] out = buf
    cdef float dummy[BLOCK]
    if n:
        rp = &residual[0]
    else:
        rp = dummy      # never read: rest == 0
    bad[0] = 0
    bad[1] = -1
    with nogil:
        count = _bitmap_collect(rp, n, tau, &out[0] + 4, bad)
    if bad[0]:
        _raise_non_finite(bad[0], bad[1])
    if count:
        with nogil:
            _bitmap_apply(&residual[0], n, &out[0] + 4, nwords, tau, True)
    out[0] = <int32_t>n
    out[1] = <int32_t>n
    out[2] = _float_bits(tau)
    out[3] = 1
    return buf, count


def sparse_decode(const int32_t[::1] encoded, float[::1] target):
    """target[|v|-1] += sign(v) * tau for every body entry, in place.

    The header must have been validated (flag 0, N == len(target)); the body
    is checked in full before the target is touched.
    """
    cdef Py_ssize_t n = target.shape[0]
    cdef Py_ssize_t m, bad_at
    if encoded.shape[0] < 4:
        raise ValueError(f"encoded message has {encoded.shape[0]} words, fewer than its 4-word header")
    m = encoded[0]
    if m < 0 or m > encoded.shape[0] - 4 or encoded[1] != n:
        raise ValueError("sparse header disagrees with the message or the target")
    cdef float tau = _bits_float(encoded[2])
    if m == 0:
        return target
    with nogil:
        bad_at = _sparse_check(&encoded[0] + 4, m, n)
    if bad_at >= 0:
        raise ValueError(
            f"encoded entry {bad_at} is {encoded[4 + bad_at]}, not a signed 1-based "
            f"index into a target of length {n}; the target is unchanged"
        )
    with nogil:
        _sparse_add(&target[0], &encoded[0] + 4, m, tau)
    return target


def bitmap_decode(const int32_t[::1] encoded, float[::1] target):
    """target[16k+b] += +-tau for every value bit of word 4+k, in place."""
    cdef Py_ssize_t n = target.shape[0]
    cdef Py_ssize_t nwords = n // BLOCK + 1
    cdef Py_ssize_t bad_at
    if encoded.shape[0] != 4 + nwords or encoded[1] != n:
        raise ValueError(
            f"bitmap message of {encoded.shape[0]} words does not fit a target of "
            f"length {n} (expected {4 + nwords} words)"
        )
    cdef float tau = _bits_float(encoded[2])
    with nogil:
        bad_at = _bitmap_check(&encoded[0] + 4, nwords, n)
    if bad_at >= 0:
        word = encoded[4 + bad_at] & 0xFFFFFFFF
        raise ValueError(
            f"bitmap word {bad_at} (0x{word:08x}) has a sign bit "
            f"without its value bit or a bit past element {n - 1}; the target is unchanged"
        )
    if n:
        with nogil:
            _bitmap_apply(&target[0], n, &encoded[0] + 4, nwords, tau, False)
    return target


def count_above(const float[::1] residual, float tau):
    """How many entries have |r| >= tau (NaN never, inf always)."""
    cdef Py_ssize_t n = residual.shape[0]
    cdef Py_ssize_t c = 0
    if n:
        with nogil:
            c = _count_above(&residual[0], n, tau)
    return c


def clip(float[::1] residual, float bound):
    """Clip ``residual`` to [-bound, bound] in place (NaN stays NaN)."""
    cdef Py_ssize_t n = residual.shape[0]
    if n:
        with nogil:
            _clip(&residual[0], n, bound)
    return residual
