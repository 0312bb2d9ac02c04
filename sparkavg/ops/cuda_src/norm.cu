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

#if defined(__CUDACC__)
SPK_DEV T spk_sqrt(T a) { return sqrt(a); } /* correctly rounded (nvrtc's default -prec-sqrt=true) */
#else
#include <math.h>
SPK_DEV T spk_sqrt(T a) { return sizeof(T) == sizeof(float) ? (T)sqrtf((float)a) : (T)sqrt((double)a); }
#endif

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

/* A training BatchNorm's per-channel bookkeeping, one thread per channel,
 * each term rounded in T in the reference's order (no contraction):
 * inv_std = 1 / sqrt(var + eps), scale = gamma * inv_std,
 * shift = beta - mean * scale, running_mean = running_mean * momentum +
 * (1 - momentum) * mean, and with update_var running_var = running_var *
 * momentum + var_factor * var. */
SPK_KERNEL sparkavg_batchnorm_coefficients(const T *SPK_RESTRICT mean, const T *SPK_RESTRICT var,
                                           const T *SPK_RESTRICT gamma, const T *SPK_RESTRICT beta,
                                           T *SPK_RESTRICT running_mean, T *SPK_RESTRICT running_var,
                                           T *SPK_RESTRICT scale, T *SPK_RESTRICT shift,
                                           T *SPK_RESTRICT inv_std, I total, T eps, T momentum,
                                           T keep, T var_factor, int update_var)
{
    SPK_FOR(ch, total) {
        const T m = mean[ch];
        const T inv = (T)1 / spk_sqrt(var[ch] + eps);
        const T s = gamma[ch] * inv;
        const T ms = m * s;
        inv_std[ch] = inv;
        scale[ch] = s;
        shift[ch] = beta[ch] - ms;
        const T rm = running_mean[ch] * momentum;
        const T km = keep * m;
        running_mean[ch] = rm + km;
        if (update_var) {
            const T rv = running_var[ch] * momentum;
            const T fv = var_factor * var[ch];
            running_var[ch] = rv + fv;
        }
    }
}
