/* Threshold encoding (libnd4j sparse and bitmap formats) on a flat vector.
 *
 * Formats and arithmetic are those of sparkavg/ops/reference.py: encoders
 * subtract tau where r >= tau and add it where r <= -tau, decoders add +-tau;
 * both exact IEEE operations, so results equal the reference bit for bit.
 *
 * The encoders never write the residual when it holds a non-finite value:
 * a first pass classifies (and, for bitmaps, writes the words) and counts
 * non-finite values into an info vector; the second pass, queued behind it
 * on the same stream, reads that vector on the device and writes the
 * message body and the residual only when the first pass found none (and,
 * for the sparse format, when the message is sent at all).  The host reads
 * the info vector once, after both: the only synchronisation.  Decoders
 * likewise check the message first and write the target only when the
 * check found nothing.
 *
 * info vectors (long long, zeroed by the caller):
 *   [0] non-finite values seen
 *   [1] max over non-finite positions e of (n - e): n - info[1] is the FIRST
 *       one (0 = none), so that a zeroed vector is the neutral start
 *   [2] values sent (bitmap) / total qualifying (sparse, written there by
 *       the emit kernel from the group sums)
 */
#include "spk.cuh"

/* Chunks of 32 values a warp classifies at once (SPK_BALLOTS). */
#define SPK_GROUP 8

/* bit 0: sends (|x| >= tau); bit 1: negative (x <= -tau); bit 2: non-finite.
 * Past the end: 0. */
SPK_DEV int spk_classify(const T *SPK_RESTRICT r, I e, I n, T tau)
{
    if (e >= n) return 0;
    const T x = r[e];
    return (x >= tau || x <= -tau ? 1 : 0) | (x <= -tau ? 2 : 0) | (SPK_ISFINITE(x) ? 0 : 4);
}

/* spk_classify of element e when `in` (else 0), with a load that needs no
 * branch (its index clamped into range): in an unrolled group the loads
 * then issue together instead of each waiting behind its own branch. */
SPK_DEV int spk_classify_in(const T *SPK_RESTRICT r, I e, I n, T tau, int in)
{
    const T x = r[e < n ? e : n - 1];
    const int c = (x >= tau || x <= -tau ? 1 : 0) | (x <= -tau ? 2 : 0) | (SPK_ISFINITE(x) ? 0 : 4);
    return in && e < n ? c : 0;
}

/* A classification's bit 0 (sends) and bit 2 (non-finite), as bits 0 and 1. */
SPK_DEV int spk_sends_bad(int c)
{
    return (c & 1) | ((c >> 1) & 2);
}

SPK_DEV void spk_note_bad(long long *info, unsigned bad, I base, I n)
{
    SPK_ATOMIC_ADD64(&info[0], SPK_POPC(bad));
    SPK_ATOMIC_MAX64(&info[1], n - (base + SPK_CTZ(bad)));
}

/* ------------------------------------------------------------ sparse ---
 * The vector is cut into tiles of `chunks` * 32 values, one warp per tile,
 * 32 values (one per lane) per chunk: loads are coalesced and the order of
 * a tile's entries is the order of its values.  A warp classifies SPK_GROUP
 * chunks at once (their loads in flight together).
 *
 * Where a tile's entries start needs no scan of the tile counts: the count
 * pass also adds each count into its group of `per1` tiles (g1) and its
 * group of `per1 * per2` tiles (g2) -- integer atomics, so the sums are
 * exact whatever the order -- and the emit pass adds up the whole g2
 * groups, the whole g1 groups and the single tiles before its own (a few
 * dozen warp-uniform loads, see spk_tile_start). */

/* counts[t] = values of tile t with |x| >= tau, also added into g1 and g2;
 * non-finite values noted. */
SPK_KERNEL sparkavg_sparse_count(const T *SPK_RESTRICT r, I n, T tau, I ntiles, I chunks,
                                 int *SPK_RESTRICT counts, long long *SPK_RESTRICT info,
                                 long long *SPK_RESTRICT g1, long long *SPK_RESTRICT g2, I per1, I per2)
{
    SPK_FOR_WARPS(t, ntiles) {
        int count = 0;
        for (I k = 0; k < chunks; k += SPK_GROUP) {
            const I first = (t * chunks + k) * 32;
            if (first >= n) break;
            SPK_BALLOTS2(sends, bad, J, SPK_GROUP, L,
                         spk_sends_bad(spk_classify_in(r, first + J * 32 + L, n, tau, k + J < chunks)))
            for (int J = 0; J < SPK_GROUP; ++J) {
                count += SPK_POPC(sends[J]);
                if (bad[J]) {
                    SPK_WARP_LEADER spk_note_bad(info, bad[J], first + J * 32, n);
                }
            }
        }
        SPK_WARP_LEADER {
            counts[t] = count;
            if (count) {
                SPK_ATOMIC_ADD64(&g1[t / per1], count);
                SPK_ATOMIC_ADD64(&g2[t / (per1 * per2)], count);
            }
        }
    }
}

/* Entries of the tiles before tile t: the g2 groups before its own, the
 * g1 groups of its g2 group before its own, the tiles of its g1 group
 * before it. */
SPK_DEV I spk_tile_start(const int *SPK_RESTRICT counts, const long long *SPK_RESTRICT g1,
                         const long long *SPK_RESTRICT g2, I t, I per1, I per2)
{
    const I q1 = t / per1, q2 = q1 / per2;
    I pos = 0;
    for (I k = 0; k < q2; ++k) pos += (I)g2[k];
    for (I k = q2 * per2; k < q1; ++k) pos += (I)g1[k];
    for (I k = q1 * per1; k < t; ++k) pos += (I)counts[k];
    return pos;
}

/* Writes tile t's entries at spk_tile_start(t) of the body, the first
 * `limit` entries only, and takes tau off each sent value; the first launch
 * thread writes the header [m, n, bits, 0] with m = min(total, limit) and
 * the total into info[2].  Nothing is written (but info[2]) when the count
 * found a non-finite value, when fewer than 2 values qualify, or when the
 * message is capped and apply_capped is 0: the same decision in every
 * thread. */
SPK_KERNEL sparkavg_sparse_emit(T *SPK_RESTRICT r, I n, T tau, I ntiles, I chunks,
                                const int *SPK_RESTRICT counts, const long long *SPK_RESTRICT g1,
                                const long long *SPK_RESTRICT g2, I per1, I per2, I limit,
                                int *SPK_RESTRICT message, long long *SPK_RESTRICT info,
                                int apply_capped, int bits)
{
    I total = 0;
    for (I k = 0, groups = (ntiles - 1) / (per1 * per2) + 1; k < groups; ++k) total += (I)g2[k];
    SPK_ONCE { info[2] = (long long)total; }
    if (info[0] != 0 || total < 2 || (total >= limit && !apply_capped)) return;
    SPK_ONCE {
        message[0] = (int)(total < limit ? total : limit);
        message[1] = (int)n;
        message[2] = bits;
        message[3] = 0;
    }
    int *SPK_RESTRICT body = message + 4;
    SPK_FOR_WARPS(t, ntiles) {
        /* The tile's entries lie in [pos, end): a tile stops reading at its
         * last entry, and an empty one reads nothing. */
        I pos = spk_tile_start(counts, g1, g2, t, per1, per2);
        const I end = pos + counts[t] < limit ? pos + counts[t] : limit;
        for (I k = 0; k < chunks && pos < end; k += SPK_GROUP) {
            const I first = (t * chunks + k) * 32;
            SPK_BALLOTS(group, J, SPK_GROUP, L, spk_classify_in(r, first + J * 32 + L, n, tau, k + J < chunks))
            for (int J = 0; J < SPK_GROUP && pos < end; ++J) {
                const I base = first + J * 32;
                const unsigned sends = group[J];
                SPK_LANES(L) {
                    if ((sends >> L) & 1u) {
                        const I p = pos + SPK_POPC(sends & ((1u << L) - 1u));
                        if (p < end) {
                            const I e = base + L;
                            const T x = r[e];
                            if (x >= tau) {
                                body[p] = (int)(e + 1);
                                r[e] = x - tau;
                            } else {
                                body[p] = -(int)(e + 1);
                                r[e] = x + tau;
                            }
                        }
                    }
                }
                pos += SPK_POPC(sends);
            }
        }
    }
}

/* ------------------------------------------------------------ bitmap ---
 * One warp per pair of words (32 values): word bits are the warp's
 * ballots.  message: the whole message, header included. */
SPK_KERNEL sparkavg_bitmap_words(const T *SPK_RESTRICT r, I n, T tau, I nwords,
                                 int *SPK_RESTRICT message, int bits,
                                 long long *SPK_RESTRICT info)
{
    SPK_ONCE {
        message[0] = (int)n;
        message[1] = (int)n;
        message[2] = bits;
        message[3] = 1;
    }
    int *SPK_RESTRICT words = message + 4;
    long long sent = 0;
    SPK_FOR_WARPS(p, (nwords + 1) / 2) {
        const I base = p * 32;
        SPK_BALLOT3(sends, negative, bad, L, spk_classify(r, base + L, n, tau))
        SPK_WARP_LEADER {
            words[2 * p] = (int)((sends & 0xFFFFu) | (negative << 16));
            if (2 * p + 1 < nwords) {
                words[2 * p + 1] = (int)((sends >> 16) | (negative & 0xFFFF0000u));
            }
            sent += SPK_POPC(sends);
            if (bad) spk_note_bad(info, bad, base, n);
        }
    }
    SPK_WARP_LEADER {
        if (sent) SPK_ATOMIC_ADD64(&info[2], sent);
    }
}

/* r[e] -+= tau for every value bit of the words, unless the words' pass
 * found a non-finite value (info[0]).  One thread per word, over its set
 * bits: a thread per value would mostly find its bit clear. */
SPK_KERNEL sparkavg_bitmap_apply(T *SPK_RESTRICT r, I nwords, T tau, const int *SPK_RESTRICT words,
                                 const long long *SPK_RESTRICT info)
{
    if (info[0] != 0) return;
    SPK_FOR(k, nwords) {
        const unsigned w = (unsigned)words[k];
        for (unsigned bits = w & 0xFFFFu; bits; bits &= bits - 1u) {
            const int b = SPK_CTZ(bits);
            const I e = k * 16 + b;
            const T x = r[e];
            r[e] = ((w >> (b + 16)) & 1u) ? x + tau : x - tau;
        }
    }
}

/* ----------------------------------------------------------- decoding ---
 * Checks run first and write the largest (count - position) of a bad
 * entry into first_bad[0] (zeroed by the caller; 0 = none); the decoders,
 * queued behind them, write nothing when it is set, and the host reads
 * that one value after both. */
SPK_KERNEL sparkavg_sparse_check(const int *SPK_RESTRICT body, I count, I n,
                                 long long *SPK_RESTRICT first_bad)
{
    SPK_FOR(i, count) {
        const I v = (I)body[i];
        if (v == 0 || v > n || v < -n) SPK_ATOMIC_MAX64(first_bad, count - i);
    }
}

/* Atomic adds: a hand-made message may repeat an index. */
SPK_KERNEL sparkavg_sparse_decode(const int *SPK_RESTRICT body, I count, T tau,
                                  T *SPK_RESTRICT target, const long long *SPK_RESTRICT first_bad)
{
    if (first_bad[0] != 0) return;
    SPK_FOR(i, count) {
        const int v = body[i];
        if (v > 0) SPK_ATOMIC_ADD(&target[v - 1], tau);
        else SPK_ATOMIC_ADD(&target[-v - 1], -tau);
    }
}

/* A word is bad when a sign bit lacks its value bit or a value bit lies
 * past element n - 1. */
SPK_KERNEL sparkavg_bitmap_check(const int *SPK_RESTRICT words, I nwords, I n,
                                 long long *SPK_RESTRICT first_bad)
{
    SPK_FOR(k, nwords) {
        const unsigned w = (unsigned)words[k];
        const I valid = n - k * 16;
        const unsigned vals = w & 0xFFFFu;
        const int past = valid <= 0 ? vals != 0u : (valid < 16 ? (vals >> valid) != 0u : 0);
        if ((((w >> 16) & ~w & 0xFFFFu) != 0u) || past) SPK_ATOMIC_MAX64(first_bad, nwords - k);
    }
}

/* target[e] += +-tau for every value bit (only those: adding 0 would turn
 * -0.0 into +0.0).  One thread per word, over its set bits (the check
 * passed: no bit lies past element n - 1). */
SPK_KERNEL sparkavg_bitmap_decode(const int *SPK_RESTRICT words, I nwords, T tau,
                                  T *SPK_RESTRICT target, const long long *SPK_RESTRICT first_bad)
{
    if (first_bad[0] != 0) return;
    SPK_FOR(k, nwords) {
        const unsigned w = (unsigned)words[k];
        for (unsigned bits = w & 0xFFFFu; bits; bits &= bits - 1u) {
            const int b = SPK_CTZ(bits);
            target[k * 16 + b] += ((w >> (b + 16)) & 1u) ? -tau : tau;
        }
    }
}
