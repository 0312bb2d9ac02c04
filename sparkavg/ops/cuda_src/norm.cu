/* Per-channel sums over the rows of a C-contiguous (M, C) array: BatchNorm's
 * statistics and its gamma and beta gradients (sparkavg/ops/reference_norm.py).
 *
 * Two deterministic stages, no atomics.  Stage 1: thread t = (r, ch) sums
 * rows [r*len, min((r+1)*len, m)) of channel ch into a double partial (so
 * neighbouring threads read neighbouring channels of a row); stage 2: one
 * thread per channel adds the partials in row-chunk order.  Each term is
 * formed in T, as the reference forms it, and accumulated in double, as the
 * reference's float64 sums are.  (A reduction over axis 0 of a few channels
 * otherwise runs on as many thread blocks as channels.)
 */
#include "spk.cuh"

/* part[t] = sum(x - center), part[total + t] = sum((x - center)^2) over
 * the rows of chunk r of channel ch; centered == 0: center is not read and
 * 0 is used. */
SPK_KERNEL sparkavg_channel_partials(const T *SPK_RESTRICT x, const T *SPK_RESTRICT center,
                                     double *SPK_RESTRICT part, I total, I m, I c, I len,
                                     int centered)
{
    SPK_FOR(t, total) {
        const I r = t / c, ch = t - r * c;
        const I lo = r * len;
        const I hi = lo + len < m ? lo + len : m;
        const T k = centered ? center[ch] : (T)0;
        double s1 = 0.0, s2 = 0.0;
        for (I row = lo; row < hi; ++row) {
            const T d = x[row * c + ch] - k;
            s1 += (double)d;
            s2 += (double)(d * d);
        }
        part[t] = s1;
        part[total + t] = s2;
    }
}

/* part[t] = sum(dy), part[total + t] = sum(dy * (x - center)) over the rows
 * of chunk r of channel ch. */
SPK_KERNEL sparkavg_channel_grad_partials(const T *SPK_RESTRICT dy, const T *SPK_RESTRICT x,
                                          const T *SPK_RESTRICT center, double *SPK_RESTRICT part,
                                          I total, I m, I c, I len)
{
    SPK_FOR(t, total) {
        const I r = t / c, ch = t - r * c;
        const I lo = r * len;
        const I hi = lo + len < m ? lo + len : m;
        const T k = center[ch];
        double s1 = 0.0, s2 = 0.0;
        for (I row = lo; row < hi; ++row) {
            const T g = dy[row * c + ch];
            s1 += (double)g;
            s2 += (double)(g * (x[row * c + ch] - k));
        }
        part[t] = s1;
        part[total + t] = s2;
    }
}

/* The chunks' partials of channel ch added in chunk order (part holds two
 * blocks of chunks * c partials: s1 and s2), then, by mode:
 *   0: out1 = s1 / m                 (the mean; out2 not written)
 *   1: out2 = s2 / m - (s1 / m)^2    (the variance about a centre s1 is taken from)
 *   2: out1 = s1, out2 = s2          (plain sums)
 * in double, rounded once to T, as the reference's float64 means are. */
SPK_KERNEL sparkavg_channel_finish(const double *SPK_RESTRICT part, T *SPK_RESTRICT out1,
                                   T *SPK_RESTRICT out2, I total, I chunks, I m, int mode)
{
    SPK_FOR(ch, total) {
        const I c = total, second = chunks * total;
        double s1 = 0.0, s2 = 0.0;
        for (I r = 0; r < chunks; ++r) {
            s1 += part[r * c + ch];
            s2 += part[second + r * c + ch];
        }
        if (mode == 0) {
            out1[ch] = (T)(s1 / (double)m);
        } else if (mode == 1) {
            const double e = s1 / (double)m;
            out2[ch] = (T)(s2 / (double)m - e * e);
        } else {
            out1[ch] = (T)s1;
            out2[ch] = (T)s2;
        }
    }
}
