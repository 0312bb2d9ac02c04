"""Channels-last (NHWC) im2col / col2im and pooling kernels, float32.

Every public ``def`` checks shapes and allocates the output when none is
given, then runs a private kernel without the GIL.  float32 only, as every
kernel in sparkavg_ext: float64 arrays (gradient checks) take the numpy
twins (sparkavg.ops routes them).  The kernels
are serial on purpose: they are memory-bound, and an OpenMP pool spinning
next to OpenBLAS's threads on the same cores (a training step alternates
the two) made LeNet steps 3x slower on 2 cores, not faster.

Layouts (C-contiguous):

- images   ``x``    : (N, H, W, C)
- columns  ``cols`` : (N*OH*OW, KH*KW*C), row = (n, oh, ow), column =
  (i, j, c); a conv is then ``cols @ W`` with ``W`` of shape (KH*KW*C, F).
- pool argmax       : (N, OH, OW, C) int32, the flat index within one
  sample's (H, W, C) block of the element that won.

Use these through :mod:`sparkavg.ops` (``im2col``, ``maxpool_forward``,
...), which checks the arguments first and routes numpy float32 here.
"""
from libc.string cimport memcpy, memset

import numpy as np

cdef inline Py_ssize_t _out_size(Py_ssize_t size, Py_ssize_t k, Py_ssize_t s,
                                 Py_ssize_t p) noexcept nogil:
    return (size + 2 * p - k) // s + 1


cdef tuple _dims(Py_ssize_t* shape):
    return (shape[0], shape[1], shape[2], shape[3])


def _check_geometry(Py_ssize_t kh, Py_ssize_t kw, Py_ssize_t sh, Py_ssize_t sw,
                    Py_ssize_t ph, Py_ssize_t pw):
    if kh < 1 or kw < 1 or sh < 1 or sw < 1 or ph < 0 or pw < 0:
        raise ValueError(
            f"Expect kernel >= 1, stride >= 1, padding >= 0, got kernel=({kh}, {kw}), "
            f"stride=({sh}, {sw}), padding=({ph}, {pw})")


# ------------------------------------------------------------------ im2col
def im2col_nhwc(const float[:, :, :, ::1] x, Py_ssize_t kh, Py_ssize_t kw,
                Py_ssize_t sh, Py_ssize_t sw, Py_ssize_t ph, Py_ssize_t pw,
                float[:, ::1] out=None, bint ones_column=False):
    """Unfold (N, H, W, C) images into (N*OH*OW, KH*KW*C) patch rows.

    Padding reads as zero.  With ``ones_column`` every row gets one more
    column holding 1, so that ``cols @ [W; b]`` adds the bias inside the
    GEMM.  Returns ``out`` (allocated when None).
    """
    _check_geometry(kh, kw, sh, sw, ph, pw)
    cdef Py_ssize_t n = x.shape[0], h = x.shape[1], w = x.shape[2], c = x.shape[3]
    cdef Py_ssize_t oh = _out_size(h, kh, sh, ph), ow = _out_size(w, kw, sw, pw)
    if oh < 1 or ow < 1:
        raise ValueError(f"Expect a kernel that fits the padded input, got input "
                         f"{h}x{w}, kernel {kh}x{kw}, padding ({ph}, {pw})")
    cdef Py_ssize_t width = kh * kw * c + (1 if ones_column else 0)
    if out is None:
        out = np.empty((n * oh * ow, width), dtype=np.float32)
    elif out.shape[0] != n * oh * ow or out.shape[1] != width:
        raise ValueError(f"Expect out of shape ({n * oh * ow}, {width}), "
                         f"got ({out.shape[0]}, {out.shape[1]})")
    if n > 0:
        with nogil:
            _im2col(x, kh, kw, sh, sw, ph, pw, oh, ow, ones_column, out)
    return np.asarray(out)


cdef void _im2col(const float[:, :, :, ::1] x,   # IN  (N, H, W, C)
                  Py_ssize_t kh, Py_ssize_t kw, Py_ssize_t sh, Py_ssize_t sw,
                  Py_ssize_t ph, Py_ssize_t pw, Py_ssize_t oh, Py_ssize_t ow,
                  bint ones_column,
                  float[:, ::1] out) noexcept nogil:  # OUT (N*OH*OW, KH*KW*C [+ 1])
    cdef Py_ssize_t n, r, q, i, j, k, ih, iw, iw0, row
    cdef Py_ssize_t h = x.shape[1], w = x.shape[2], c = x.shape[3]
    cdef Py_ssize_t run = kw * c
    cdef const float* src
    cdef float* dst
    for n in range(x.shape[0]):
        for r in range(oh):
            for q in range(ow):
                row = (n * oh + r) * ow + q
                iw0 = q * sw - pw
                for i in range(kh):
                    ih = r * sh - ph + i
                    dst = &out[row, i * run]
                    if ih < 0 or ih >= h:
                        memset(dst, 0, run * sizeof(float))
                    elif iw0 >= 0 and iw0 + kw <= w:
                        # One contiguous run of KW*C values in channels-last layout.
                        src = &x[n, ih, iw0, 0]
                        for k in range(run):
                            dst[k] = src[k]
                    else:
                        for j in range(kw):
                            iw = iw0 + j
                            if iw < 0 or iw >= w:
                                memset(dst + j * c, 0, c * sizeof(float))
                            else:
                                memcpy(dst + j * c, &x[n, ih, iw, 0], c * sizeof(float))
                if ones_column:
                    out[row, kh * run] = 1


# ------------------------------------------------------------------ col2im
def col2im_nhwc(const float[:, ::1] cols, Py_ssize_t kh, Py_ssize_t kw,
                Py_ssize_t sh, Py_ssize_t sw, Py_ssize_t ph, Py_ssize_t pw,
                float[:, :, :, ::1] out):
    """Fold patch rows back, summing overlaps: the adjoint of im2col.

    ``out`` (N, H, W, C) gives the image shape; it is overwritten (not
    accumulated into).  Values that fell on padding are dropped.
    """
    _check_geometry(kh, kw, sh, sw, ph, pw)
    cdef Py_ssize_t n = out.shape[0], h = out.shape[1], w = out.shape[2], c = out.shape[3]
    cdef Py_ssize_t oh = _out_size(h, kh, sh, ph), ow = _out_size(w, kw, sw, pw)
    if oh < 1 or ow < 1 or cols.shape[0] != n * oh * ow or cols.shape[1] != kh * kw * c:
        raise ValueError(f"Expect cols of shape ({n * max(oh, 0) * max(ow, 0)}, {kh * kw * c}) "
                         f"for images {_dims(out.shape)}, got ({cols.shape[0]}, {cols.shape[1]})")
    if n > 0:
        with nogil:
            _col2im(cols, kh, kw, sh, sw, ph, pw, oh, ow, out)
    return np.asarray(out)


cdef void _col2im(const float[:, ::1] cols,       # IN  (N*OH*OW, KH*KW*C)
                  Py_ssize_t kh, Py_ssize_t kw, Py_ssize_t sh, Py_ssize_t sw,
                  Py_ssize_t ph, Py_ssize_t pw, Py_ssize_t oh, Py_ssize_t ow,
                  float[:, :, :, ::1] out) noexcept nogil:  # OUT (N, H, W, C)
    cdef Py_ssize_t n, r, q, i, j, k, ih, iw, iw0, row
    cdef Py_ssize_t h = out.shape[1], w = out.shape[2], c = out.shape[3]
    cdef Py_ssize_t run = kw * c
    cdef const float* src
    cdef float* dst
    for n in range(out.shape[0]):
        memset(&out[n, 0, 0, 0], 0, h * w * c * sizeof(float))
        for r in range(oh):
            for q in range(ow):
                row = (n * oh + r) * ow + q
                iw0 = q * sw - pw
                for i in range(kh):
                    ih = r * sh - ph + i
                    if ih < 0 or ih >= h:
                        continue
                    src = &cols[row, i * run]
                    if iw0 >= 0 and iw0 + kw <= w:
                        dst = &out[n, ih, iw0, 0]
                        for k in range(run):
                            dst[k] += src[k]
                    else:
                        for j in range(kw):
                            iw = iw0 + j
                            if iw >= 0 and iw < w:
                                dst = &out[n, ih, iw, 0]
                                for k in range(c):
                                    dst[k] += src[j * c + k]


# ----------------------------------------------------------------- max pool
def maxpool_nhwc_forward(const float[:, :, :, ::1] x, Py_ssize_t kh, Py_ssize_t kw,
                         Py_ssize_t sh, Py_ssize_t sw, float[:, :, :, ::1] out=None,
                         int[:, :, :, ::1] argmax=None):
    """Max over KHxKW windows (no padding); returns ``(out, argmax)``.

    ``argmax`` holds, per output value, the flat index within the sample's
    (H, W, C) block of the first maximal input (ties go to the first).
    """
    _check_geometry(kh, kw, sh, sw, 0, 0)
    cdef Py_ssize_t n = x.shape[0], h = x.shape[1], w = x.shape[2], c = x.shape[3]
    cdef Py_ssize_t oh = _out_size(h, kh, sh, 0), ow = _out_size(w, kw, sw, 0)
    if oh < 1 or ow < 1:
        raise ValueError(f"Expect a pool window that fits the input, got input {h}x{w}, "
                         f"window {kh}x{kw}")
    if h * w * c >= 2**31:
        raise ValueError(f"Expect fewer than 2**31 values per sample, got {h * w * c}")
    shape = (n, oh, ow, c)
    if out is None:
        out = np.empty(shape, dtype=np.float32)
    if argmax is None:
        argmax = np.empty(shape, dtype=np.int32)
    if _dims(out.shape) != shape or _dims(argmax.shape) != shape:
        raise ValueError(f"Expect out and argmax of shape {shape}, got "
                         f"{_dims(out.shape)} and {_dims(argmax.shape)}")
    if n > 0:
        with nogil:
            _maxpool_forward(x, kh, kw, sh, sw, out, argmax)
    return np.asarray(out), np.asarray(argmax)


cdef void _maxpool_forward(const float[:, :, :, ::1] x,  # IN  (N, H, W, C)
                           Py_ssize_t kh, Py_ssize_t kw, Py_ssize_t sh, Py_ssize_t sw,
                           float[:, :, :, ::1] out,       # OUT (N, OH, OW, C)
                           int[:, :, :, ::1] argmax) noexcept nogil:  # OUT
    # Two passes over each window, both straight-line loops over the
    # contiguous channels that compile to selects (a branchy running
    # arg-max mispredicts on every other element): first the max, then,
    # walking the window backwards, the offset of the FIRST element equal
    # to it.
    cdef Py_ssize_t n, r, q, i, j, k, corner, off
    cdef Py_ssize_t w = x.shape[2], c = x.shape[3]
    cdef Py_ssize_t oh = out.shape[1], ow = out.shape[2]
    cdef const float* sample
    cdef const float* src
    cdef float* dst
    cdef int* idx
    cdef float a, b
    for n in range(x.shape[0]):
        sample = &x[n, 0, 0, 0]
        for r in range(oh):
            for q in range(ow):
                corner = (r * sh * w + q * sw) * c
                dst = &out[n, r, q, 0]
                idx = &argmax[n, r, q, 0]
                src = sample + corner
                for k in range(c):
                    dst[k] = src[k]
                    # Stays when nothing compares equal (a NaN max), so the
                    # backward pass never reads an uninitialised index.
                    idx[k] = <int>(corner + k)
                for i in range(kh):
                    for j in range(kw):
                        src = sample + corner + (i * w + j) * c
                        for k in range(c):
                            a = src[k]
                            b = dst[k]
                            dst[k] = max(a, b)
                i = kh
                while i > 0:
                    i = i - 1
                    j = kw
                    while j > 0:
                        j = j - 1
                        off = corner + (i * w + j) * c
                        src = sample + off
                        for k in range(c):
                            idx[k] = <int>(off + k) if src[k] == dst[k] else idx[k]


def maxpool_nhwc_backward(const float[:, :, :, ::1] dout, const int[:, :, :, ::1] argmax,
                          float[:, :, :, ::1] out):
    """Route each output gradient to its window's maximum.

    ``out`` (N, H, W, C) is overwritten; inputs that won no window get 0.
    """
    if _dims(dout.shape) != _dims(argmax.shape) or dout.shape[0] != out.shape[0] \
            or dout.shape[3] != out.shape[3]:
        raise ValueError(f"Expect dout and argmax of one shape matching out's batch and "
                         f"channels, got dout {_dims(dout.shape)}, argmax "
                         f"{_dims(argmax.shape)}, out {_dims(out.shape)}")
    if out.shape[0] > 0:
        with nogil:
            _maxpool_backward(dout, argmax, out)
    return np.asarray(out)


cdef void _maxpool_backward(const float[:, :, :, ::1] dout,  # IN  (N, OH, OW, C)
                            const int[:, :, :, ::1] argmax,     # IN  (N, OH, OW, C)
                            float[:, :, :, ::1] out) noexcept nogil:  # OUT (N, H, W, C)
    cdef Py_ssize_t n, k
    cdef Py_ssize_t block = out.shape[1] * out.shape[2] * out.shape[3]
    cdef Py_ssize_t m = dout.shape[1] * dout.shape[2] * dout.shape[3]
    cdef const float* g
    cdef const int* idx
    cdef float* dst
    for n in range(out.shape[0]):
        dst = &out[n, 0, 0, 0]
        memset(dst, 0, block * sizeof(float))
        g = &dout[n, 0, 0, 0]
        idx = &argmax[n, 0, 0, 0]
        for k in range(m):
            dst[idx[k]] += g[k]


# ----------------------------------------------------------------- avg pool
def avgpool_nhwc_forward(const float[:, :, :, ::1] x, Py_ssize_t kh, Py_ssize_t kw,
                         Py_ssize_t sh, Py_ssize_t sw, float[:, :, :, ::1] out=None):
    """Mean over KHxKW windows (no padding); returns ``out``."""
    _check_geometry(kh, kw, sh, sw, 0, 0)
    cdef Py_ssize_t n = x.shape[0], h = x.shape[1], w = x.shape[2], c = x.shape[3]
    cdef Py_ssize_t oh = _out_size(h, kh, sh, 0), ow = _out_size(w, kw, sw, 0)
    if oh < 1 or ow < 1:
        raise ValueError(f"Expect a pool window that fits the input, got input {h}x{w}, "
                         f"window {kh}x{kw}")
    shape = (n, oh, ow, c)
    if out is None:
        out = np.empty(shape, dtype=np.float32)
    elif _dims(out.shape) != shape:
        raise ValueError(f"Expect out of shape {shape}, got {_dims(out.shape)}")
    if n > 0:
        with nogil:
            _avgpool_forward(x, kh, kw, sh, sw, out)
    return np.asarray(out)


cdef void _avgpool_forward(const float[:, :, :, ::1] x,  # IN  (N, H, W, C)
                           Py_ssize_t kh, Py_ssize_t kw, Py_ssize_t sh, Py_ssize_t sw,
                           float[:, :, :, ::1] out) noexcept nogil:  # OUT (N, OH, OW, C)
    cdef Py_ssize_t n, r, q, i, j, k
    cdef Py_ssize_t c = x.shape[3], oh = out.shape[1], ow = out.shape[2]
    cdef float scale = <float>1.0 / <float>(kh * kw)
    cdef const float* src
    cdef float* dst
    for n in range(x.shape[0]):
        for r in range(oh):
            for q in range(ow):
                dst = &out[n, r, q, 0]
                memset(dst, 0, c * sizeof(float))
                for i in range(kh):
                    for j in range(kw):
                        src = &x[n, r * sh + i, q * sw + j, 0]
                        for k in range(c):
                            dst[k] += src[k]
                for k in range(c):
                    dst[k] *= scale


def avgpool_nhwc_backward(const float[:, :, :, ::1] dout, Py_ssize_t kh, Py_ssize_t kw,
                          Py_ssize_t sh, Py_ssize_t sw, float[:, :, :, ::1] out):
    """Spread each output gradient evenly over its window; ``out`` is overwritten."""
    _check_geometry(kh, kw, sh, sw, 0, 0)
    cdef Py_ssize_t h = out.shape[1], w = out.shape[2]
    shape = (out.shape[0], _out_size(h, kh, sh, 0), _out_size(w, kw, sw, 0), out.shape[3])
    if _dims(dout.shape) != shape:
        raise ValueError(f"Expect dout of shape {shape}, got {_dims(dout.shape)}")
    if out.shape[0] > 0:
        with nogil:
            _avgpool_backward(dout, kh, kw, sh, sw, out)
    return np.asarray(out)


cdef void _avgpool_backward(const float[:, :, :, ::1] dout,  # IN  (N, OH, OW, C)
                            Py_ssize_t kh, Py_ssize_t kw, Py_ssize_t sh, Py_ssize_t sw,
                            float[:, :, :, ::1] out) noexcept nogil:  # OUT (N, H, W, C)
    cdef Py_ssize_t n, r, q, i, j, k
    cdef Py_ssize_t c = out.shape[3], oh = dout.shape[1], ow = dout.shape[2]
    cdef Py_ssize_t block = out.shape[1] * out.shape[2] * c
    cdef float scale = <float>1.0 / <float>(kh * kw)
    cdef const float* g
    cdef float* dst
    for n in range(out.shape[0]):
        memset(&out[n, 0, 0, 0], 0, block * sizeof(float))
        for r in range(oh):
            for q in range(ow):
                g = &dout[n, r, q, 0]
                for i in range(kh):
                    for j in range(kw):
                        dst = &out[n, r * sh + i, q * sw + j, 0]
                        for k in range(c):
                            dst[k] += scale * g[k]


# ------------------------------------------------- direct convolution (C)
cdef extern from "_conv_direct.h" nogil:
    int sparkavg_conv_direct_available()
    int sparkavg_omp_max_threads()
    int sparkavg_conv_direct_forward(const float* x, Py_ssize_t n, Py_ssize_t h, Py_ssize_t w,
                                     Py_ssize_t c, const float* wt, const float* bias,
                                     Py_ssize_t f, Py_ssize_t kh, Py_ssize_t kw, Py_ssize_t ph,
                                     Py_ssize_t pw, float* y, int n_threads)
    int sparkavg_conv_direct_backward_data(const float* dy, Py_ssize_t n, Py_ssize_t h,
                                           Py_ssize_t w, Py_ssize_t c, const float* wt,
                                           Py_ssize_t f, Py_ssize_t kh, Py_ssize_t kw,
                                           Py_ssize_t ph, Py_ssize_t pw, float* dx,
                                           int n_threads)
    int sparkavg_conv_direct_backward_weights(const float* x, Py_ssize_t n, Py_ssize_t h,
                                              Py_ssize_t w, Py_ssize_t c, const float* dy,
                                              Py_ssize_t f, Py_ssize_t kh, Py_ssize_t kw,
                                              Py_ssize_t ph, Py_ssize_t pw, float* dw,
                                              float* db, int n_threads)

#: Whether this CPU runs the direct convolution kernels (AVX-512); without
#: them the conv2d_* functions raise and callers keep im2col + GEMM.
DIRECT_CONV = bool(sparkavg_conv_direct_available())


cdef int _omp_threads() noexcept nogil:
    # The OpenMP pool's limit (OMP_NUM_THREADS, threadpoolctl, sparkavg.threads).
    return sparkavg_omp_max_threads()


cdef _direct_geometry(Py_ssize_t h, Py_ssize_t w, Py_ssize_t kh, Py_ssize_t kw,
                      Py_ssize_t ph, Py_ssize_t pw):
    if not DIRECT_CONV:
        raise RuntimeError("Expect a CPU with AVX-512 for the direct convolution kernels, "
                           "got one without (use im2col + GEMM)")
    if kh < 1 or kw < 1 or ph < 0 or pw < 0 or ph >= kh or pw >= kw:
        raise ValueError(f"Expect kernel >= 1 and 0 <= padding < kernel, got kernel=({kh}, "
                         f"{kw}), padding=({ph}, {pw})")
    cdef Py_ssize_t oh = h + 2 * ph - kh + 1, ow = w + 2 * pw - kw + 1
    if oh < 1 or ow < 1:
        raise ValueError(f"Expect a kernel that fits the padded input, got input {h}x{w}, "
                         f"kernel {kh}x{kw}, padding ({ph}, {pw})")
    return oh, ow


def conv2d_nhwc_forward(const float[:, :, :, ::1] x, const float[:, :, :, ::1] weights,
                        const float[::1] bias, Py_ssize_t ph, Py_ssize_t pw,
                        float[:, :, :, ::1] out=None, int n_threads=0):
    """Stride-1 convolution ``out = conv(x, weights) + bias`` (zero padding).

    ``x`` (N, H, W, C), ``weights`` (KH, KW, C, F), ``bias`` (F,) or None;
    returns ``out`` (N, OH, OW, F), allocated when None.  ``n_threads`` 0:
    the OpenMP limit.  Needs 0 <= padding < kernel.
    """
    cdef Py_ssize_t n = x.shape[0], h = x.shape[1], w = x.shape[2], c = x.shape[3]
    cdef Py_ssize_t kh = weights.shape[0], kw = weights.shape[1], f = weights.shape[3]
    oh, ow = _direct_geometry(h, w, kh, kw, ph, pw)
    if weights.shape[2] != c or (bias is not None and bias.shape[0] != f):
        raise ValueError(f"Expect weights (KH, KW, {c}, F) and bias (F,), got weights "
                         f"{_dims(weights.shape)}, bias "
                         f"{None if bias is None else bias.shape[0]}")
    shape = (n, oh, ow, f)
    if out is None:
        out = np.empty(shape, dtype=np.float32)
    elif _dims(out.shape) != shape:
        raise ValueError(f"Expect out of shape {shape}, got {_dims(out.shape)}")
    cdef const float* b = NULL if bias is None else &bias[0]
    cdef int status = 0
    if n_threads <= 0:
        n_threads = _omp_threads()
    if n > 0 and f > 0 and c > 0:
        with nogil:
            status = sparkavg_conv_direct_forward(&x[0, 0, 0, 0], n, h, w, c,
                                                  &weights[0, 0, 0, 0], b, f, kh, kw, ph, pw,
                                                  &out[0, 0, 0, 0], n_threads)
    if status != 0:
        raise MemoryError("conv2d_nhwc_forward: out of memory")
    return np.asarray(out)


def conv2d_nhwc_backward_data(const float[:, :, :, ::1] dy, const float[:, :, :, ::1] weights,
                              Py_ssize_t ph, Py_ssize_t pw, float[:, :, :, ::1] out,
                              int n_threads=0):
    """The gradient of :func:`conv2d_nhwc_forward` with respect to ``x``,
    given ``dy`` (N, OH, OW, F); ``out`` (N, H, W, C) is overwritten."""
    cdef Py_ssize_t n = out.shape[0], h = out.shape[1], w = out.shape[2], c = out.shape[3]
    cdef Py_ssize_t kh = weights.shape[0], kw = weights.shape[1], f = weights.shape[3]
    oh, ow = _direct_geometry(h, w, kh, kw, ph, pw)
    if weights.shape[2] != c or _dims(dy.shape) != (n, oh, ow, f):
        raise ValueError(f"Expect weights (KH, KW, {c}, F) and dy {(n, oh, ow, f)}, got "
                         f"weights {_dims(weights.shape)}, dy {_dims(dy.shape)}")
    cdef int status = 0
    if n_threads <= 0:
        n_threads = _omp_threads()
    if n > 0 and c > 0:
        if f == 0:
            out[...] = 0
        else:
            with nogil:
                status = sparkavg_conv_direct_backward_data(&dy[0, 0, 0, 0], n, h, w, c,
                                                            &weights[0, 0, 0, 0], f, kh, kw,
                                                            ph, pw, &out[0, 0, 0, 0], n_threads)
    if status != 0:
        raise MemoryError("conv2d_nhwc_backward_data: out of memory")
    return np.asarray(out)


def conv2d_nhwc_backward_weights(const float[:, :, :, ::1] x, const float[:, :, :, ::1] dy,
                                 Py_ssize_t ph, Py_ssize_t pw, float[:, :, :, ::1] dw,
                                 float[::1] db=None, int n_threads=0):
    """The gradients of :func:`conv2d_nhwc_forward` with respect to the
    weights and bias: ``dw`` (KH, KW, C, F) and ``db`` (F,) (or None) are
    overwritten.  The same bits on any thread count."""
    cdef Py_ssize_t n = x.shape[0], h = x.shape[1], w = x.shape[2], c = x.shape[3]
    cdef Py_ssize_t kh = dw.shape[0], kw = dw.shape[1], f = dw.shape[3]
    oh, ow = _direct_geometry(h, w, kh, kw, ph, pw)
    if dw.shape[2] != c or _dims(dy.shape) != (n, oh, ow, f) \
            or (db is not None and db.shape[0] != f):
        raise ValueError(f"Expect dw (KH, KW, {c}, F), dy {(n, oh, ow, f)} and db (F,), got "
                         f"dw {_dims(dw.shape)}, dy {_dims(dy.shape)}, db "
                         f"{None if db is None else db.shape[0]}")
    cdef float* pdb = NULL if db is None else &db[0]
    cdef int status = 0
    if n_threads <= 0:
        n_threads = _omp_threads()
    if n == 0 or f == 0 or c == 0:
        np.asarray(dw)[...] = 0
        if db is not None:
            np.asarray(db)[...] = 0
    else:
        with nogil:
            status = sparkavg_conv_direct_backward_weights(&x[0, 0, 0, 0], n, h, w, c,
                                                           &dy[0, 0, 0, 0], f, kh, kw, ph, pw,
                                                           &dw[0, 0, 0, 0], pdb, n_threads)
    if status != 0:
        raise MemoryError("conv2d_nhwc_backward_weights: out of memory")
    return np.asarray(dw), (None if db is None else np.asarray(db))
