"""Convolution and pooling kernels on channels-last (NHWC) arrays.

Each function checks its arguments (shapes, dtypes, geometry; see
:mod:`sparkavg.ops._checks` for what is converted and what is rejected),
then runs where :mod:`sparkavg.ops._dispatch` routes: numpy float32 to the
Cython kernels, CuPy arrays to the xp-generic twins on the device, float64
(gradient checks) and ``SPARKAVG_PURE_NUMPY=1`` to the numpy twins of
:mod:`sparkavg.ops.reference_conv`.

Layouts (all C-contiguous):

- images ``x`` and image gradients ``out``: (N, H, W, C)
- columns: (N*OH*OW, KH*KW*C [+ 1]); row = (n, oh, ow), column = (i, j, c),
  so a convolution is one GEMM ``cols @ W`` with ``W`` of shape (KH*KW*C, F)
- pooled ``out`` / ``dout``: (N, OH, OW, C); max-pool ``argmax``: the same
  shape, int32, the flat index inside one sample's (H, W, C) block of the
  first maximal input

``OH = (H + 2*ph - kh) // sh + 1`` (:func:`conv_output_size`); pooling has
no padding.  Arrays named ``out``/``argmax`` are written (and returned);
when optional and None they are allocated.

The network's layers call the backend operations through
:func:`sparkavg.ops.elementwise.unchecked` (their arrays are right by
construction, and checks cost more than a small layer's kernel); everyone
else goes through the checked functions here.
"""
from __future__ import annotations

import numbers

import numpy as np

from ._checks import check_inplace, check_operand, check_readonly, check_threads
from ._dispatch import call
from ._kernels import CONV
from .reference_conv import conv_output_size

__all__ = ["conv_output_size", *CONV]

#: argmax holds flat int32 indices into one sample.
_MAX_SAMPLE = 2**31 - 1


def _check_geometry(kh, kw, sh, sw, ph=0, pw=0) -> None:
    values = (kh, kw, sh, sw, ph, pw)
    if not all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in values) \
            or min(kh, kw, sh, sw) < 1 or min(ph, pw) < 0:
        raise ValueError(
            f"Expect integer kernel >= 1, stride >= 1, padding >= 0, got kernel=({kh!r}, "
            f"{kw!r}), stride=({sh!r}, {sw!r}), padding=({ph!r}, {pw!r})"
        )


def _images(name: str, a):
    """A read-only NHWC float array (strided: copied) -> (kind, array)."""
    kind, a = check_readonly(name, a)
    if a.ndim != 4:
        raise ValueError(f"Expect {name} of shape (N, H, W, C), got shape {a.shape}")
    return kind, a


def _output_hw(h, w, kh, kw, sh, sw, ph, pw, what):
    oh, ow = conv_output_size(h, kh, sh, ph), conv_output_size(w, kw, sw, pw)
    if oh < 1 or ow < 1:
        raise ValueError(
            f"Expect a {what} that fits the padded input, got input {h}x{w}, {what} {kh}x{kw}, "
            f"padding ({ph}, {pw})"
        )
    return oh, ow


def _out(name: str, out, like, like_name: str, shape, dtype=None) -> None:
    """An array the kernel writes: C-contiguous, writeable, on ``like``'s
    device, of ``shape`` and ``like``'s dtype (or ``dtype``)."""
    check_inplace(name, out, dtype=like.dtype if dtype is None else dtype)
    check_operand(name, out, like, like_name, shape=shape, dtype=dtype)


def _image_out(name: str, out):
    """The (N, H, W, C) float array a backward kernel writes -> its kind."""
    kind = check_inplace(name, out)
    if out.ndim != 4:
        raise ValueError(f"Expect {name} of shape (N, H, W, C), got shape {out.shape}")
    return kind


# ------------------------------------------------------------------ im2col
def im2col(x, kh, kw, sh, sw, ph, pw, out=None, ones_column=False):
    """Unfold NHWC images into patch rows; padding reads as zero.

    Parameters
    ----------
    x : float32/float64 array (N, H, W, C), numpy or CuPy
    kh, kw, sh, sw, ph, pw : int
        Kernel size, stride and zero padding (rows, columns).
    out : array (N*OH*OW, KH*KW*C [+ 1]) of x's dtype, or None
    ones_column : bool
        End every row with a 1, so that ``cols @ [W; b]`` adds the bias
        inside the GEMM.

    Returns
    -------
    out
    """
    kind, x = _images("x", x)
    _check_geometry(kh, kw, sh, sw, ph, pw)
    n, h, w, c = x.shape
    oh, ow = _output_hw(h, w, kh, kw, sh, sw, ph, pw, "kernel")
    if out is not None:
        _out("out", out, x, "x", (n * oh * ow, kh * kw * c + int(bool(ones_column))))
    return call("im2col", kind, x.dtype, x, kh, kw, sh, sw, ph, pw, out, bool(ones_column))


def col2im(cols, kh, kw, sh, sw, ph, pw, out):
    """Fold patch rows back into ``out`` (N, H, W, C), summing overlaps;
    values that fell on padding are dropped.  The adjoint of :func:`im2col`
    (without the ones column).  ``out`` is overwritten and returned."""
    kind = _image_out("out", out)
    _check_geometry(kh, kw, sh, sw, ph, pw)
    n, h, w, c = out.shape
    oh, ow = _output_hw(h, w, kh, kw, sh, sw, ph, pw, "kernel")
    cols = check_operand("cols", cols, out, "out", shape=(n * oh * ow, kh * kw * c))
    return call("col2im", kind, out.dtype, cols, kh, kw, sh, sw, ph, pw, out)


# ------------------------------------------- stride-1 convolution (direct)
def _direct_geometry(kh, kw, ph, pw) -> None:
    _check_geometry(kh, kw, 1, 1, ph, pw)
    if ph >= kh or pw >= kw:
        raise ValueError(f"Expect padding < kernel, got kernel=({kh}, {kw}), padding=({ph}, {pw})")


def _weights(name: str, a, like, like_name: str):
    """A read-only (KH, KW, C, F) array of ``like``'s kind and dtype."""
    a = check_operand(name, a, like, like_name, shape=getattr(a, "shape", None))
    if a.ndim != 4:
        raise ValueError(f"Expect {name} of shape (KH, KW, C, F), got shape {a.shape}")
    return a


def _direct_shapes(weights, images, images_name: str, ph, pw):
    """Check ``weights`` (KH, KW, C, F) and the padding against the images
    (N, H, W, C) named ``images_name``; returns ``(weights, (n, oh, ow, f))``,
    the shape of the convolution's output."""
    weights = _weights("weights", weights, images, images_name)
    kh, kw, c, f = weights.shape
    _direct_geometry(kh, kw, ph, pw)
    n, h, w, channels = images.shape
    if c != channels:
        raise ValueError(f"Expect weights of shape (KH, KW, {channels}, F) for {images_name}'s "
                         f"{channels} channels, got shape {weights.shape}")
    oh, ow = _output_hw(h, w, kh, kw, 1, 1, ph, pw, "kernel")
    return weights, (n, oh, ow, f)


def conv2d_forward(x, weights, bias=None, ph=0, pw=0, out=None, *, n_threads=None):
    """Stride-1 convolution (cross-correlation) with zero padding:
    ``out[n, r, q, :] = bias + sum_{i, j, c} xpad[n, r + i, q + j, c] * weights[i, j, c, :]``.

    numpy float32 runs the direct kernels (no im2col; AVX-512, see
    :func:`have_direct_conv`), everything else im2col + GEMM.

    Parameters
    ----------
    x : float32/float64 array (N, H, W, C), numpy or CuPy
    weights : array (KH, KW, C, F) of x's kind and dtype
    bias : array (F,) or None
    ph, pw : int
        Zero padding, ``0 <= p < kernel``.
    out : array (N, OH, OW, F) of x's dtype, or None
        ``OH = H + 2*ph - KH + 1``.
    n_threads : int or None, Cython path only
        OpenMP threads over the batch; None: 1.

    Returns
    -------
    out
    """
    kind, x = _images("x", x)
    weights, out_shape = _direct_shapes(weights, x, "x", ph, pw)
    if bias is not None:
        bias = check_operand("bias", bias, x, "x", shape=(out_shape[3],))
    if out is not None:
        _out("out", out, x, "x", out_shape)
    return call("conv2d_forward", kind, x.dtype, x, weights, bias, ph, pw, out,
                n_threads=check_threads(n_threads))


def conv2d_backward_data(dy, weights, ph, pw, out, *, n_threads=None):
    """The gradient of :func:`conv2d_forward` with respect to ``x``, given
    ``dy`` (N, OH, OW, F): ``out`` (N, H, W, C) is overwritten and returned."""
    kind = _image_out("out", out)
    weights, dy_shape = _direct_shapes(weights, out, "out", ph, pw)
    dy = check_operand("dy", dy, out, "out", shape=dy_shape)
    return call("conv2d_backward_data", kind, out.dtype, dy, weights, ph, pw, out,
                n_threads=check_threads(n_threads))


def conv2d_backward_weights(x, dy, ph, pw, dw, db=None, *, n_threads=None):
    """The gradients of :func:`conv2d_forward` with respect to the weights
    and the bias, given ``x`` and ``dy``: ``dw`` (KH, KW, C, F) and ``db``
    (F,) (when given) are overwritten; returns ``(dw, db)``."""
    kind = check_inplace("dw", dw)
    if dw.ndim != 4:
        raise ValueError(f"Expect dw of shape (KH, KW, C, F), got shape {dw.shape}")
    kh, kw, c, f = dw.shape
    _direct_geometry(kh, kw, ph, pw)
    x = check_operand("x", x, dw, "dw", shape=getattr(x, "shape", None))
    if x.ndim != 4 or x.shape[3] != c:
        raise ValueError(f"Expect x of shape (N, H, W, {c}), got shape {x.shape}")
    n, h, w, _ = x.shape
    oh, ow = _output_hw(h, w, kh, kw, 1, 1, ph, pw, "kernel")
    dy = check_operand("dy", dy, dw, "dw", shape=(n, oh, ow, f))
    if db is not None:
        _out("db", db, dw, "dw", (f,))
    return call("conv2d_backward_weights", kind, dw.dtype, x, dy, ph, pw, dw, db,
                n_threads=check_threads(n_threads))


# ---------------------------------------------------------------- max pool
def maxpool_forward(x, kh, kw, sh, sw, out=None, argmax=None):
    """Max over KHxKW windows with step (sh, sw), no padding.

    Returns ``(out, argmax)``: (N, OH, OW, C) of x's dtype and int32, written
    into the arrays given (both or neither) or allocated.  Ties go to the
    first maximal element of the window.
    """
    kind, x = _images("x", x)
    _check_geometry(kh, kw, sh, sw)
    n, h, w, c = x.shape
    oh, ow = _output_hw(h, w, kh, kw, sh, sw, 0, 0, "pool window")
    if h * w * c > _MAX_SAMPLE:
        raise ValueError(f"Expect at most {_MAX_SAMPLE} values per sample (argmax is int32), "
                         f"got {h * w * c}")
    if (out is None) != (argmax is None):
        raise ValueError("Expect out and argmax both given or both None, got only "
                         + ("out" if argmax is None else "argmax"))
    if out is not None:
        _out("out", out, x, "x", (n, oh, ow, c))
        _out("argmax", argmax, x, "x", (n, oh, ow, c), dtype=np.int32)
    return call("maxpool_forward", kind, x.dtype, x, kh, kw, sh, sw, out, argmax)


def maxpool_backward(dout, argmax, kh, kw, sh, sw, out):
    """Route each output gradient to its window's maximum (from
    :func:`maxpool_forward`'s ``argmax``); ``out`` (N, H, W, C) is
    overwritten -- inputs that won no window get 0 -- and returned."""
    kind = _image_out("out", out)
    _check_geometry(kh, kw, sh, sw)
    n, h, w, c = out.shape
    oh, ow = _output_hw(h, w, kh, kw, sh, sw, 0, 0, "pool window")
    dout = check_operand("dout", dout, out, "out", shape=(n, oh, ow, c))
    argmax = check_operand("argmax", argmax, out, "out", shape=(n, oh, ow, c), dtype=np.int32)
    return call("maxpool_backward", kind, out.dtype, dout, argmax, kh, kw, sh, sw, out)


# ---------------------------------------------------------------- avg pool
def avgpool_forward(x, kh, kw, sh, sw, out=None):
    """Mean over KHxKW windows with step (sh, sw), no padding; returns
    ``out`` (N, OH, OW, C), allocated when None."""
    kind, x = _images("x", x)
    _check_geometry(kh, kw, sh, sw)
    n, h, w, c = x.shape
    oh, ow = _output_hw(h, w, kh, kw, sh, sw, 0, 0, "pool window")
    if out is not None:
        _out("out", out, x, "x", (n, oh, ow, c))
    return call("avgpool_forward", kind, x.dtype, x, kh, kw, sh, sw, out)


def avgpool_backward(dout, kh, kw, sh, sw, out):
    """Spread each output gradient evenly over its window; ``out``
    (N, H, W, C) is overwritten and returned."""
    kind = _image_out("out", out)
    _check_geometry(kh, kw, sh, sw)
    n, h, w, c = out.shape
    oh, ow = _output_hw(h, w, kh, kw, sh, sw, 0, 0, "pool window")
    dout = check_operand("dout", dout, out, "out", shape=(n, oh, ow, c))
    return call("avgpool_backward", kind, out.dtype, dout, kh, kw, sh, sw, out)
