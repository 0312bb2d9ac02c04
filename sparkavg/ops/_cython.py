"""The Cython backend: numpy float32 arrays -> ``sparkavg_ext``.

One function per backend operation (:data:`sparkavg.ops._dispatch.OPERATIONS`),
with the signature the other backends share; the fronts have checked the
arguments.  The elementwise operations also take ``n_threads``.

``sparkavg_ext`` is imported here and nowhere else in :mod:`sparkavg`;
when it is not built, :data:`error` holds the ImportError and
:func:`sparkavg.ops.have_extension` is False.
"""
from __future__ import annotations

import logging
import math
import os

import numpy as np

from .. import backend
from . import reference_conv
from ._checks import clip_bound
from ._kernels import OPERATIONS
from .reference_norm import batchnorm_coefficients  # noqa: F401 -- (C,) vectors: the numpy twin serves

logger = logging.getLogger(__name__)

#: The merged format's kernels (:mod:`sparkavg.ops.merging`): integer lists, not float32 operations of the
#: routing rule; :mod:`~sparkavg.ops.merging` takes them where the rule would take this backend.
MERGING = ("merge_pair", "add_counts", "add_dense_counts")

__all__ = ["error", "direct_conv", "merging_kernels", *OPERATIONS, *MERGING]

#: The ImportError when ``sparkavg_ext`` is not built, else None.
error: Exception | None = None
#: Whether the direct convolution kernels run on this CPU (AVX-512); see
#: :func:`sparkavg.ops.have_direct_conv`.
direct_conv = False
#: libgomp's spin count while the extension loads, unless the user set one
#: (or OMP_WAIT_POLICY).  libgomp reads it once, when it loads (with
#: sparkavg_ext), and by default its idle threads spin 300,000 pause loops
#: -- milliseconds of a core -- after every parallel region, on the core
#: OpenBLAS's threads need for the GEMMs that a training step runs between
#: the OpenMP kernels (the direct convolutions).  1000 is what libgomp itself
#: uses on an oversubscribed machine: then idle threads sleep within
#: microseconds, and a region wakes them with a futex call.
GOMP_SPINCOUNT = "1000"
_spin_default = not ({"OMP_WAIT_POLICY", "GOMP_SPINCOUNT"} & set(os.environ))
if _spin_default:
    os.environ["GOMP_SPINCOUNT"] = GOMP_SPINCOUNT
try:
    from sparkavg_ext import _conv, _elementwise, _merging, _norm, _sequence, _threshold
    direct_conv = bool(_conv.DIRECT_CONV)
except ImportError as exc:  # not built: everything takes the numpy reference
    _conv = _elementwise = _merging = _norm = _sequence = _threshold = None
    error = exc
    logger.warning(
        "sparkavg_ext is not built (%s); numpy float32 arrays take the slow numpy "
        "reference path. Build it with: pip install -e . (or python setup.py "
        "build_ext --inplace)", exc
    )
finally:  # only libgomp's start-up reads it: leave the environment as it was
    if _spin_default:
        del os.environ["GOMP_SPINCOUNT"]


def _flat(a):
    return a.reshape(-1)  # a view: the fronts pass C-contiguous arrays


# ---------------------------------------------------------------- elementwise
def accumulate(buffer, x, weight, n_threads=1):
    _elementwise.accumulate(_flat(buffer), _flat(x), float(weight), n_threads)


def scale(buffer, factor, n_threads=1):
    _elementwise.scale(_flat(buffer), float(factor), n_threads)


def sgd_step(params, grads, lr, n_threads=1):
    _elementwise.sgd_step(_flat(params), _flat(grads), float(lr), n_threads)


def nesterov_step(params, grads, velocity, lr, momentum, n_threads=1):
    mu = float(momentum)
    _elementwise.nesterov_step(_flat(params), _flat(grads), _flat(velocity), float(lr),
                               mu, -mu, 1.0 + mu, n_threads)


def adagrad_step(params, grads, history, lr, eps, n_threads=1):
    _elementwise.adagrad_step(_flat(params), _flat(grads), _flat(history), float(lr),
                              float(eps), n_threads)


def rmsprop_step(params, grads, cache, lr, decay, eps, n_threads=1):
    d = float(decay)
    _elementwise.rmsprop_step(_flat(params), _flat(grads), _flat(cache), float(lr),
                              d, 1.0 - d, float(eps), n_threads)


def adam_step(params, grads, m, v, lr, beta1, beta2, eps, t, n_threads=1):
    # The reference's double-precision expression, rounded once.
    alpha = lr * math.sqrt(1.0 - beta2**t) / (1.0 - beta1**t)
    b1, b2 = float(beta1), float(beta2)
    _elementwise.adam_step(_flat(params), _flat(grads), _flat(m), _flat(v), b1, 1.0 - b1,
                           b2, 1.0 - b2, alpha, float(eps), n_threads)


# ------------------------------------------------------------------- encoding
def encode_sparse(residual, tau, limit, apply_when_capped):
    return _threshold.sparse_encode(residual, float(tau), limit, apply_when_capped)


def encode_bitmap(residual, tau):
    return _threshold.bitmap_encode(residual, float(tau))


def decode_sparse(encoded, target, count, tau):
    _threshold.sparse_decode(encoded, target)  # re-reads (and re-checks) the header


def decode_bitmap(encoded, target, tau):
    _threshold.bitmap_decode(encoded, target)


def count_above(residual, threshold):
    return _threshold.count_above(_flat(residual), float(threshold))


def clip_residual(residual, threshold, k):
    _threshold.clip(_flat(residual), float(clip_bound(residual.dtype, threshold, k)))


# ---------------------------------------------------------------------- conv
def im2col(x, kh, kw, sh, sw, ph, pw, out=None, ones_column=False):
    return _conv.im2col_nhwc(x, kh, kw, sh, sw, ph, pw, out, ones_column)


def col2im(cols, kh, kw, sh, sw, ph, pw, out):
    return _conv.col2im_nhwc(cols, kh, kw, sh, sw, ph, pw, out)


# The direct kernels need AVX-512; elsewhere the same results come from the
# Cython im2col/col2im and numpy's GEMM (the twins' code).  n_threads None:
# the OpenMP pool's limit, as the GEMMs beside them use the BLAS pool's.
def conv2d_forward(x, weights, bias=None, ph=0, pw=0, out=None, n_threads=None):
    if not direct_conv:
        return reference_conv._conv2d_forward(im2col, x, weights, bias, ph, pw, out)
    return _conv.conv2d_nhwc_forward(x, weights, bias, ph, pw, out, n_threads or 0)


def conv2d_backward_data(dy, weights, ph, pw, out, n_threads=None):
    if not direct_conv:
        return reference_conv._conv2d_backward_data(col2im, dy, weights, ph, pw, out)
    _conv.conv2d_nhwc_backward_data(dy, weights, ph, pw, out, n_threads or 0)
    return out


def conv2d_backward_weights(x, dy, ph, pw, dw, db=None, n_threads=None):
    if not direct_conv:
        return reference_conv._conv2d_backward_weights(im2col, x, dy, ph, pw, dw, db)
    _conv.conv2d_nhwc_backward_weights(x, dy, ph, pw, dw, db, n_threads or 0)
    return dw, db


def maxpool_forward(x, kh, kw, sh, sw, out=None, argmax=None):
    return _conv.maxpool_nhwc_forward(x, kh, kw, sh, sw, out, argmax)


def maxpool_backward(dout, argmax, kh, kw, sh, sw, out):
    return _conv.maxpool_nhwc_backward(dout, argmax, out)


def avgpool_forward(x, kh, kw, sh, sw, out=None):
    return _conv.avgpool_nhwc_forward(x, kh, kw, sh, sw, out)


def avgpool_backward(dout, kh, kw, sh, sw, out):
    return _conv.avgpool_nhwc_backward(dout, kh, kw, sh, sw, out)


# ------------------------------------------------------------------------ norm
# The extension returns new array objects over the memory it wrote; the
# front returns the very arrays the caller gave (or these allocations).
def _vector(out, like):
    return np.empty(like.shape[1], dtype=np.float32) if out is None else out


def channel_stats(x, mean=None, var=None):
    mean, var = _vector(mean, x), _vector(var, x)
    _norm.channel_stats(x, mean, var)
    return mean, var


def channel_affine(x, scale, shift, out=None):
    out = np.empty_like(x) if out is None else out
    _norm.channel_affine(x, scale, shift, out)
    return out


def channel_sums(dy, x, center, sum_dy=None, sum_dy_x=None):
    sum_dy, sum_dy_x = _vector(sum_dy, dy), _vector(sum_dy_x, dy)
    _norm.channel_sums(dy, x, center, sum_dy, sum_dy_x)
    return sum_dy, sum_dy_x


def channel_blend(dy, x, center, a, b, shift, out=None):
    out = np.empty_like(dy) if out is None else out
    _norm.channel_blend(dy, x, center, a, b, shift, out)
    return out


# -------------------------------------------------------------------- sequence
def lstm_forward_step(z, rec, c_prev, c, tc, h):
    _sequence.lstm_forward_step(z, rec, c_prev, c, tc, h)


def lstm_backward_step(a, c_prev, tc, dh, dc, dz):
    _sequence.lstm_backward_step(a, c_prev, tc, dh, dc, dz)


def gru_forward_step(z, rec, rb, h_prev, hn, h):
    _sequence.gru_forward_step(z, rec, rb, h_prev, hn, h)


def gru_backward_step(a, hn, h_prev, dh, dz, dz_rec):
    _sequence.gru_backward_step(a, hn, h_prev, dh, dz, dz_rec)


def scatter_add_rows(index, rows, out):
    _sequence.scatter_add_rows(index, rows, out)


# --------------------------------------------------------------------- merging
def merging_kernels() -> bool:
    """Whether :mod:`sparkavg.ops.merging` runs these kernels: the extension is
    built and ``SPARKAVG_PURE_NUMPY`` is not set (the routing rule's test)."""
    return error is None and not backend.pure_numpy()


def merge_pair(a, b, n):
    return _merging.merge_pair(a, b, n)


def add_counts(indices, counts, tau, target):
    return _merging.add_counts(indices, counts, float(tau), target)


def add_dense_counts(counts, tau, target):
    return _merging.add_dense_counts(counts, float(tau), target)
