/* Convolution and pooling on channels-last (NHWC) arrays, C-contiguous.
 *
 * Layouts and results are those of sparkavg/ops/reference_conv.py and of the
 * Cython kernels (sparkavg_ext/_conv.pyx):
 *   images (N, H, W, C); columns (N*OH*OW, KH*KW*C [+ 1]) with row
 *   (n, oh, ow) and column (i, j, c); pooled (N, OH, OW, C); argmax int32,
 *   the flat index inside one sample's (H, W, C) block.
 *
 * One thread per OUTPUT element everywhere, so the backward kernels
 * (col2im, pool backward) GATHER what the Cython kernels scatter: no
 * atomics, deterministic, and each sum adds its terms in the Cython
 * kernels' order (windows (oh, ow) ascending, starting from +0), so float32
 * results equal theirs bit for bit when compiled without FMA contraction
 * (nvrtc --fmad=false).
 */
#include "spk.cuh"

/* Flat index i of an (N, hh, ww, cc) array as const n, y, x, ch (one
 * division and modulo per axis: integer division
 * is dear on a GPU). */
#define SPK_NHWC(i, hh, ww, cc, n, y, x, ch)                \
    I spk_t_##ch = (i) / (cc);                              \
    const I ch = (i) - spk_t_##ch * (cc);                   \
    const I x = spk_t_##ch % (ww);                          \
    spk_t_##ch = spk_t_##ch / (ww);                         \
    const I y = spk_t_##ch % (hh), n = spk_t_##ch / (hh);

/* Windows r of stride s and size k covering padded coordinate p, clipped
 * to [0, count): r*s <= p < r*s + k. */
#define SPK_WINDOW_RANGE(lo, hi, p, k, s, count)                              \
    I lo = (p) >= (k) ? ((p) - (k)) / (s) + 1 : 0;                            \
    I hi = (p) / (s);                                                         \
    if (hi > (count) - 1) hi = (count) - 1;

/* out[row, col] = x[n, r*sh - ph + i, q*sw - pw + j, c] (0 on padding);
 * col == KH*KW*C (the ones column, when width says so) is 1. */
SPK_KERNEL sparkavg_im2col(const T *SPK_RESTRICT x, T *SPK_RESTRICT out, I total,
                           I h, I w, I c, I oh, I ow, I kh, I kw, I sh, I sw,
                           I ph, I pw, I width)
{
    const I k = kh * kw * c;
    SPK_FOR(i, total) {
        const I row = i / width, col = i - row * width;
        T v = (T)1;
        if (col < k) {
            I t = col / c;
            const I ch = col - t * c;
            const I kj = t % kw, ki = t / kw;
            t = row / ow;
            const I q = row - t * ow;
            const I r = t % oh, n = t / oh;
            const I ih = r * sh - ph + ki, iw = q * sw - pw + kj;
            v = (ih >= 0 && ih < h && iw >= 0 && iw < w)
                    ? x[((n * h + ih) * w + iw) * c + ch] : (T)0;
        }
        out[i] = v;
    }
}

/* The adjoint of im2col: out[n, y, x, c] = sum of every column entry that
 * im2col read from that pixel, windows in ascending order. */
SPK_KERNEL sparkavg_col2im(const T *SPK_RESTRICT cols, T *SPK_RESTRICT out, I total,
                           I h, I w, I c, I oh, I ow, I kh, I kw, I sh, I sw,
                           I ph, I pw)
{
    const I k = kh * kw * c;
    SPK_FOR(i, total) {
        SPK_NHWC(i, h, w, c, n, y, x0, ch)
        const I yp = y + ph, xp = x0 + pw;
        SPK_WINDOW_RANGE(r0, r1, yp, kh, sh, oh)
        SPK_WINDOW_RANGE(q0, q1, xp, kw, sw, ow)
        T acc = (T)0;
        for (I r = r0; r <= r1; ++r) {
            const I ki = yp - r * sh;
            const T *row = cols + (n * oh + r) * ow * k + ki * kw * c + ch;
            for (I q = q0; q <= q1; ++q) {
                acc += row[q * k + (xp - q * sw) * c];
            }
        }
        out[i] = acc;
    }
}

/* Max over each window and the flat in-sample index of its FIRST maximum.
 * The running max is the Cython kernel's (m > a ? m : a), then the first
 * element equal to it wins and is the value written (so a tie of -0.0 and
 * +0.0 gives the first, as the reference); when none equals it (a NaN
 * max) the window's corner and the NaN stay, as in the Cython kernel. */
SPK_KERNEL sparkavg_maxpool_forward(const T *SPK_RESTRICT x, T *SPK_RESTRICT out,
                                    int *SPK_RESTRICT argmax, I total,
                                    I h, I w, I c, I oh, I ow, I kh, I kw, I sh, I sw)
{
    SPK_FOR(i, total) {
        SPK_NHWC(i, oh, ow, c, n, r, q, ch)
        const T *sample = x + n * h * w * c;
        const I corner = (r * sh * w + q * sw) * c + ch;
        T m = sample[corner];
        for (I a = 0; a < kh; ++a) {
            for (I b = 0; b < kw; ++b) {
                const T v = sample[corner + (a * w + b) * c];
                m = (m > v) ? m : v;
            }
        }
        I best = corner;
        for (I a = kh - 1; a >= 0; --a) {
            for (I b = kw - 1; b >= 0; --b) {
                const I off = corner + (a * w + b) * c;
                if (sample[off] == m) best = off;
            }
        }
        out[i] = sample[best] == m ? sample[best] : m;
        argmax[i] = (int)best;
    }
}

/* out[n, y, x, c] = sum of dout over the windows whose argmax is this
 * input, in ascending window order; 0 when it won none.  An argmax outside
 * its own window (not one maxpool_forward wrote) is never read. */
SPK_KERNEL sparkavg_maxpool_backward(const T *SPK_RESTRICT dout,
                                     const int *SPK_RESTRICT argmax,
                                     T *SPK_RESTRICT out, I total,
                                     I h, I w, I c, I oh, I ow, I kh, I kw, I sh, I sw)
{
    SPK_FOR(i, total) {
        SPK_NHWC(i, h, w, c, n, y, x0, ch)
        const int flat = (int)((y * w + x0) * c + ch);
        SPK_WINDOW_RANGE(r0, r1, y, kh, sh, oh)
        SPK_WINDOW_RANGE(q0, q1, x0, kw, sw, ow)
        T acc = (T)0;
        for (I r = r0; r <= r1; ++r) {
            for (I q = q0; q <= q1; ++q) {
                const I o = ((n * oh + r) * ow + q) * c + ch;
                if (argmax[o] == flat) acc += dout[o];
            }
        }
        out[i] = acc;
    }
}

/* Mean over each window: the sum in window order from +0, times
 * 1/(KH*KW) rounded to T (the Cython kernel's arithmetic). */
SPK_KERNEL sparkavg_avgpool_forward(const T *SPK_RESTRICT x, T *SPK_RESTRICT out, I total,
                                    I h, I w, I c, I oh, I ow, I kh, I kw, I sh, I sw)
{
    const T scale = (T)1 / (T)(kh * kw);
    SPK_FOR(i, total) {
        SPK_NHWC(i, oh, ow, c, n, r, q, ch)
        const T *src = x + n * h * w * c + (r * sh * w + q * sw) * c + ch;
        T acc = (T)0;
        for (I a = 0; a < kh; ++a) {
            for (I b = 0; b < kw; ++b) {
                acc += src[(a * w + b) * c];
            }
        }
        out[i] = acc * scale;
    }
}

/* Each input gathers scale * dout of every window covering it, in
 * ascending window order. */
SPK_KERNEL sparkavg_avgpool_backward(const T *SPK_RESTRICT dout, T *SPK_RESTRICT out, I total,
                                     I h, I w, I c, I oh, I ow, I kh, I kw, I sh, I sw)
{
    const T scale = (T)1 / (T)(kh * kw);
    SPK_FOR(i, total) {
        SPK_NHWC(i, h, w, c, n, y, x0, ch)
        SPK_WINDOW_RANGE(r0, r1, y, kh, sh, oh)
        SPK_WINDOW_RANGE(q0, q1, x0, kw, sw, ow)
        T acc = (T)0;
        for (I r = r0; r <= r1; ++r) {
            for (I q = q0; q <= q1; ++q) {
                acc += scale * dout[((n * oh + r) * ow + q) * c + ch];
            }
        }
        out[i] = acc;
    }
}
