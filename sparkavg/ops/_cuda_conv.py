"""Convolution and pooling on CuPy arrays: raw CUDA kernels
(``sparkavg/ops/cuda_src/conv.cu``), one thread per output element.

Each operation has the signature and results of its twin in
:mod:`sparkavg.ops.reference_conv` (layouts in :mod:`sparkavg.ops.conv`);
:mod:`sparkavg.ops._cuda` routes CuPy arrays here.  The backward kernels
gather instead of scattering (no atomics: deterministic), adding in the
Cython kernels' order, so float32 results equal the CPU path's bit for bit.
No host synchronisation: every kernel is one launch on the current stream,
and allocations come from CuPy's pool.

Arguments are assumed checked by :mod:`sparkavg.ops.conv`.  The public
functions run on the device; the ``_``-prefixed ones take a launcher
(:mod:`sparkavg.ops.cuda_src`), which is how the tests run the same glue
and kernel bodies on the CPU.
"""
from __future__ import annotations

import numpy as np

from ._kernels import CONV
from .cuda_src import device, index_type
from .reference_conv import (
    _conv2d_backward_data,
    _conv2d_backward_weights,
    _conv2d_forward,
    conv_output_size,
)

__all__ = list(CONV)

_FILE = "conv"


def _geometry(index, *values):
    return tuple(index(v) for v in values)


def _run(launcher, name, dtype, threads, arrays, sizes, dims):
    """Launch ``name`` over ``threads`` outputs; ``sizes`` bound every flat index."""
    index = index_type(threads, *sizes)
    launcher.launch(_FILE, name, dtype, index, threads,
                    (*arrays, index(threads), *_geometry(index, *dims)))


# ------------------------------------------------------------------ im2col
def _im2col(launcher, x, kh, kw, sh, sw, ph, pw, out=None, ones_column=False):
    xp = launcher.xp
    x = xp.ascontiguousarray(x)
    n, h, w, c = x.shape
    oh, ow = conv_output_size(h, kh, sh, ph), conv_output_size(w, kw, sw, pw)
    width = kh * kw * c + int(bool(ones_column))
    if out is None:
        out = xp.empty((n * oh * ow, width), dtype=x.dtype)
    _run(launcher, "sparkavg_im2col", x.dtype, out.size, (x, out), (x.size,),
         (h, w, c, oh, ow, kh, kw, sh, sw, ph, pw, width))
    return out


def _col2im(launcher, cols, kh, kw, sh, sw, ph, pw, out):
    cols = launcher.xp.ascontiguousarray(cols)
    _, h, w, c = out.shape
    oh, ow = conv_output_size(h, kh, sh, ph), conv_output_size(w, kw, sw, pw)
    _run(launcher, "sparkavg_col2im", out.dtype, out.size, (cols, out), (cols.size,),
         (h, w, c, oh, ow, kh, kw, sh, sw, ph, pw))
    return out


# ------------------------------------------------------------------ pooling
def _pooled(xp, x, kh, kw, sh, sw, out):
    """``x`` made contiguous, the pooled output (``out`` or a new array) and
    the kernels' geometry arguments."""
    x = xp.ascontiguousarray(x)
    n, h, w, c = x.shape
    oh, ow = conv_output_size(h, kh, sh, 0), conv_output_size(w, kw, sw, 0)
    if out is None:
        out = xp.empty((n, oh, ow, c), dtype=x.dtype)
    return x, out, (h, w, c, oh, ow, kh, kw, sh, sw)


def _unpooled(dout, out, kh, kw, sh, sw):
    """The backward kernels' geometry arguments: ``out`` is the input's gradient."""
    _, h, w, c = out.shape
    return h, w, c, dout.shape[1], dout.shape[2], kh, kw, sh, sw


def _maxpool_forward(launcher, x, kh, kw, sh, sw, out=None, argmax=None):
    fresh = out is None
    x, out, dims = _pooled(launcher.xp, x, kh, kw, sh, sw, out)
    if fresh:
        argmax = launcher.xp.empty(out.shape, dtype=np.int32)
    _run(launcher, "sparkavg_maxpool_forward", x.dtype, out.size, (x, out, argmax), (x.size,), dims)
    return out, argmax


def _maxpool_backward(launcher, dout, argmax, kh, kw, sh, sw, out):
    xp = launcher.xp
    dout, argmax = xp.ascontiguousarray(dout), xp.ascontiguousarray(argmax)
    _run(launcher, "sparkavg_maxpool_backward", out.dtype, out.size, (dout, argmax, out), (dout.size,),
         _unpooled(dout, out, kh, kw, sh, sw))
    return out


def _avgpool_forward(launcher, x, kh, kw, sh, sw, out=None):
    x, out, dims = _pooled(launcher.xp, x, kh, kw, sh, sw, out)
    _run(launcher, "sparkavg_avgpool_forward", x.dtype, out.size, (x, out), (x.size,), dims)
    return out


def _avgpool_backward(launcher, dout, kh, kw, sh, sw, out):
    dout = launcher.xp.ascontiguousarray(dout)
    _run(launcher, "sparkavg_avgpool_backward", out.dtype, out.size, (dout, out), (dout.size,),
         _unpooled(dout, out, kh, kw, sh, sw))
    return out


# ------------------------------------------------------- the device backend
def im2col(x, kh, kw, sh, sw, ph, pw, out=None, ones_column=False):
    """See :func:`sparkavg.ops.conv.im2col`; CuPy arrays."""
    return _im2col(device(), x, kh, kw, sh, sw, ph, pw, out, ones_column)


def col2im(cols, kh, kw, sh, sw, ph, pw, out):
    """See :func:`sparkavg.ops.conv.col2im`; CuPy arrays."""
    return _col2im(device(), cols, kh, kw, sh, sw, ph, pw, out)


def conv2d_forward(x, weights, bias=None, ph=0, pw=0, out=None):
    """See :func:`sparkavg.ops.conv.conv2d_forward`; CuPy arrays: im2col + GEMM."""
    return _conv2d_forward(im2col, x, weights, bias, ph, pw, out)


def conv2d_backward_data(dy, weights, ph, pw, out):
    """See :func:`sparkavg.ops.conv.conv2d_backward_data`; CuPy arrays: GEMM + col2im."""
    return _conv2d_backward_data(col2im, dy, weights, ph, pw, out)


def conv2d_backward_weights(x, dy, ph, pw, dw, db=None):
    """See :func:`sparkavg.ops.conv.conv2d_backward_weights`; CuPy arrays: im2col + GEMM."""
    return _conv2d_backward_weights(im2col, x, dy, ph, pw, dw, db)


def maxpool_forward(x, kh, kw, sh, sw, out=None, argmax=None):
    """See :func:`sparkavg.ops.conv.maxpool_forward`; CuPy arrays."""
    return _maxpool_forward(device(), x, kh, kw, sh, sw, out, argmax)


def maxpool_backward(dout, argmax, kh, kw, sh, sw, out):
    """See :func:`sparkavg.ops.conv.maxpool_backward`; CuPy arrays."""
    return _maxpool_backward(device(), dout, argmax, kh, kw, sh, sw, out)


def avgpool_forward(x, kh, kw, sh, sw, out=None):
    """See :func:`sparkavg.ops.conv.avgpool_forward`; CuPy arrays."""
    return _avgpool_forward(device(), x, kh, kw, sh, sw, out)


def avgpool_backward(dout, kh, kw, sh, sw, out):
    """See :func:`sparkavg.ops.conv.avgpool_backward`; CuPy arrays."""
    return _avgpool_backward(device(), dout, kh, kw, sh, sw, out)
