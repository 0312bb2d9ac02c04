"""xp-generic (numpy or CuPy) twins of the convolution and pooling kernels:
the oracle the Cython kernels are held to, the path of float64 arrays, and
what CuPy arrays run (the GEMM around them is CuPy's own).

Layouts, C-contiguous, channels last (NHWC):

- images ``x``: (N, H, W, C)
- columns: (N*OH*OW, KH*KW*C); row = (n, oh, ow), column = (i, j, c), so
  a convolution is one GEMM ``cols @ W`` with ``W`` of shape (KH*KW*C, F)
- max-pool ``argmax``: (N, OH, OW, C) int32, the flat index inside one
  sample's (H, W, C) block of the (first) maximal input

These functions assume checked arguments (:mod:`sparkavg.ops.conv` checks
them) and are re-exported by :mod:`sparkavg.ops.reference`.
"""
from __future__ import annotations

from ..backend import get_array_module
from ._kernels import CONV

__all__ = ["conv_output_size", *CONV]


def conv_output_size(size: int, kernel: int, stride: int, padding: int) -> int:
    """Output length of a 'truncate'-mode window: floor((size + 2p - k) / s) + 1."""
    return (size + 2 * padding - kernel) // stride + 1


def _windows(x, kh, kw, sh, sw):
    """(N, OH, OW, KH, KW, C) strided view of the windows of an NHWC array."""
    xp = get_array_module(x)
    n, h, w, c = x.shape
    oh, ow = conv_output_size(h, kh, sh, 0), conv_output_size(w, kw, sw, 0)
    s0, s1, s2, s3 = x.strides
    return xp.lib.stride_tricks.as_strided(
        x, shape=(n, oh, ow, kh, kw, c), strides=(s0, s1 * sh, s2 * sw, s1, s2, s3)
    )


def _fold(cols, shape, kh, kw, sh, sw, ph, pw):
    """col2im: sum every patch value back onto its pixel; a new array."""
    xp = get_array_module(cols)
    n, h, w, c = shape
    oh, ow = conv_output_size(h, kh, sh, ph), conv_output_size(w, kw, sw, pw)
    padded = xp.zeros((n, h + 2 * ph, w + 2 * pw, c), dtype=cols.dtype)
    patches = cols.reshape(n, oh, ow, kh, kw, c)
    for i in range(kh):
        for j in range(kw):
            padded[:, i:i + sh * oh:sh, j:j + sw * ow:sw, :] += patches[:, :, :, i, j, :]
    return padded[:, ph:ph + h, pw:pw + w, :]


# ------------------------------------------------------------------ im2col
def im2col(x, kh, kw, sh, sw, ph, pw, out=None, ones_column=False):
    """Unfold NHWC images into patch rows (zero padding); see module doc.

    With ``ones_column`` each row ends with an extra 1, so that a GEMM with
    the weights stacked on the bias, ``cols @ [W; b]``, adds the bias.
    Returns ``out`` (allocated when None).
    """
    xp = get_array_module(x)
    x = xp.ascontiguousarray(x)
    if ph or pw:
        x = xp.pad(x, ((0, 0), (ph, ph), (pw, pw), (0, 0)))
    win = _windows(x, kh, kw, sh, sw)
    rows = win.shape[0] * win.shape[1] * win.shape[2]
    k = kh * kw * x.shape[3]
    if out is None:
        out = xp.empty((rows, k + int(bool(ones_column))), dtype=x.dtype)
    out[:, :k] = win.reshape(rows, k)  # reshape of a strided view copies
    if ones_column:
        out[:, k] = 1
    return out


def col2im(cols, kh, kw, sh, sw, ph, pw, out):
    """Fold patch rows back into ``out`` (N, H, W, C), summing overlaps.

    ``out`` is overwritten and returned; the adjoint of :func:`im2col`.
    """
    out[...] = _fold(cols, out.shape, kh, kw, sh, sw, ph, pw)
    return out


# ------------------------------------------- stride-1 convolution (direct)
# The oracle of the Cython direct kernels: im2col + GEMM, written once with
# the unfold/fold functions as arguments so that the CuPy backend runs the
# same code on its own im2col/col2im.
def _conv2d_forward(unfold, x, weights, bias, ph, pw, out):
    kh, kw, c, f = weights.shape
    n, h, w, _ = x.shape
    oh, ow = conv_output_size(h, kh, 1, ph), conv_output_size(w, kw, 1, pw)
    y = unfold(x, kh, kw, 1, 1, ph, pw) @ weights.reshape(kh * kw * c, f)
    if bias is not None:
        y += bias
    y = y.reshape(n, oh, ow, f)
    if out is None:
        return y
    out[...] = y
    return out


def _conv2d_backward_data(fold, dy, weights, ph, pw, out):
    kh, kw, c, f = weights.shape
    dcols = dy.reshape(-1, f) @ weights.reshape(kh * kw * c, f).T
    return fold(dcols, kh, kw, 1, 1, ph, pw, out)


def _conv2d_backward_weights(unfold, x, dy, ph, pw, dw, db):
    kh, kw, c, f = dw.shape
    d = dy.reshape(-1, f)
    dw[...] = (unfold(x, kh, kw, 1, 1, ph, pw).T @ d).reshape(dw.shape)
    if db is not None:
        db[...] = d.sum(axis=0)
    return dw, db


def conv2d_forward(x, weights, bias=None, ph=0, pw=0, out=None):
    """Stride-1 convolution ``conv(x, weights) + bias`` with zero padding:
    x (N, H, W, C), weights (KH, KW, C, F), bias (F,) or None -> ``out``
    (N, OH, OW, F), allocated when None.  im2col + GEMM."""
    return _conv2d_forward(im2col, x, weights, bias, ph, pw, out)


def conv2d_backward_data(dy, weights, ph, pw, out):
    """The gradient of :func:`conv2d_forward` with respect to x, given dy
    (N, OH, OW, F): ``out`` (N, H, W, C) is overwritten and returned."""
    return _conv2d_backward_data(col2im, dy, weights, ph, pw, out)


def conv2d_backward_weights(x, dy, ph, pw, dw, db=None):
    """The gradients of :func:`conv2d_forward` with respect to the weights
    and the bias: ``dw`` (KH, KW, C, F) and ``db`` (F,) (when given) are
    overwritten; returns ``(dw, db)``."""
    return _conv2d_backward_weights(im2col, x, dy, ph, pw, dw, db)


# ---------------------------------------------------------------- max pool
def maxpool_forward(x, kh, kw, sh, sw, out=None, argmax=None):
    """Max over windows (no padding) -> ``(out, argmax)``; see module doc.

    Ties go to the first element of the window.
    """
    xp = get_array_module(x)
    n, h, w, c = x.shape
    win = _windows(xp.ascontiguousarray(x), kh, kw, sh, sw)
    oh, ow = win.shape[1], win.shape[2]
    flat = win.reshape(n, oh, ow, kh * kw, c)
    pos = flat.argmax(axis=3)  # the first maximum
    best = xp.take_along_axis(flat, pos[:, :, :, None, :], axis=3)[:, :, :, 0, :]
    r = xp.arange(oh).reshape(1, oh, 1, 1) * sh + pos // kw
    q = xp.arange(ow).reshape(1, 1, ow, 1) * sw + pos % kw
    index = ((r * w + q) * c + xp.arange(c).reshape(1, 1, 1, c)).astype(xp.int32)
    if out is None:
        return best, index
    out[...] = best
    argmax[...] = index
    return out, argmax


def maxpool_backward(dout, argmax, kh, kw, sh, sw, out):
    """Route each output gradient to its window's maximum; ``out`` (N, H, W, C)
    is overwritten and returned."""
    xp = get_array_module(dout)
    n, h, w, c = out.shape
    oh, ow = dout.shape[1], dout.shape[2]
    pixel = argmax // c
    i = pixel // w - xp.arange(oh).reshape(1, oh, 1, 1) * sh
    j = pixel % w - xp.arange(ow).reshape(1, 1, ow, 1) * sw
    pos = i * kw + j  # window position of each maximum, (N, OH, OW, C)
    onehot = pos[:, :, :, None, :] == xp.arange(kh * kw).reshape(1, 1, 1, kh * kw, 1)
    patches = (onehot * dout[:, :, :, None, :]).astype(dout.dtype)
    out[...] = _fold(patches.reshape(n * oh * ow, kh * kw * c), out.shape, kh, kw, sh, sw, 0, 0)
    return out


# ---------------------------------------------------------------- avg pool
def avgpool_forward(x, kh, kw, sh, sw, out=None):
    """Mean over windows (no padding) -> ``out`` (N, OH, OW, C)."""
    xp = get_array_module(x)
    mean = _windows(xp.ascontiguousarray(x), kh, kw, sh, sw).mean(axis=(3, 4), dtype=x.dtype)
    if out is None:
        return mean
    out[...] = mean
    return out


def avgpool_backward(dout, kh, kw, sh, sw, out):
    """Spread each output gradient evenly over its window; ``out`` (N, H, W, C)
    is overwritten and returned."""
    xp = get_array_module(dout)
    n, oh, ow, c = dout.shape
    share = dout * dout.dtype.type(1.0 / (kh * kw))
    patches = xp.broadcast_to(share[:, :, :, None, None, :], (n, oh, ow, kh, kw, c))
    cols = xp.ascontiguousarray(patches).reshape(n * oh * ow, kh * kw * c)
    out[...] = _fold(cols, out.shape, kh, kw, sh, sw, 0, 0)
    return out
