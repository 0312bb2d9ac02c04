"""xp-generic (numpy or CuPy) twins of the per-channel normalisation
kernels: the oracle the Cython kernels are held to, the path of float64
arrays, and what CuPy arrays run.

Arrays are rows of channels, (M, C), C-contiguous (a channels-last batch
(N, H, W, C) seen as (N*H*W, C), or a dense batch (N, F)); per-channel
vectors are (C,).  Sums accumulate in float64.  These functions assume
checked arguments (:mod:`sparkavg.ops.norm` checks them) and are
re-exported by :mod:`sparkavg.ops.reference`.
"""
from __future__ import annotations

import numpy as np

from ..backend import get_array_module
from ._kernels import NORM

__all__ = list(NORM)


def _vector(out, like):
    """``out``, or a new (C,) array of ``like``'s dtype on its device."""
    return get_array_module(like).empty(like.shape[1], dtype=like.dtype) if out is None else out


def channel_stats(x, mean=None, var=None):
    """Mean and biased variance of each column of ``x`` (M >= 1 rows)."""
    mean, var = _vector(mean, x), _vector(var, x)
    mu = x.mean(axis=0, dtype=np.float64)
    d = x - mu.astype(x.dtype)
    mean[...] = mu
    var[...] = (d * d).mean(axis=0, dtype=np.float64) - (d.mean(axis=0, dtype=np.float64)) ** 2
    return mean, var


def channel_affine(x, scale, shift, out=None):
    """``out = x * scale + shift`` per column."""
    out = get_array_module(x).empty_like(x) if out is None else out
    get_array_module(x).multiply(x, scale, out=out)
    out += shift
    return out


def channel_sums(dy, x, center, sum_dy=None, sum_dy_x=None):
    """``sum(dy)`` and ``sum(dy * (x - center))`` of each column."""
    sum_dy, sum_dy_x = _vector(sum_dy, dy), _vector(sum_dy_x, dy)
    sum_dy[...] = dy.sum(axis=0, dtype=np.float64)
    sum_dy_x[...] = (dy * (x - center)).sum(axis=0, dtype=np.float64)
    return sum_dy, sum_dy_x


def channel_blend(dy, x, center, a, b, shift, out=None):
    """``out = a * dy + b * (x - center) + shift`` per column; ``out`` may be ``dy``."""
    xp = get_array_module(dy)
    term = x - center
    term *= b
    out = xp.empty_like(dy) if out is None else out
    xp.multiply(dy, a, out=out)
    out += term
    out += shift
    return out


def batchnorm_coefficients(mean, var, gamma, beta, eps, momentum, var_factor, running_mean, running_var,
                           scale, shift, inv_std):
    """A training BatchNorm's per-channel bookkeeping, in this order:
    ``inv_std = 1 / sqrt(var + eps)``, ``scale = gamma * inv_std``,
    ``shift = beta - mean * scale``; ``running_mean = running_mean *
    momentum + (1 - momentum) * mean``; with ``var_factor`` (``(1 -
    momentum) m / (m - 1)``; 0: not updated) ``running_var = running_var *
    momentum + var_factor * var``."""
    xp = get_array_module(mean)
    t = mean.dtype.type
    xp.add(var, t(eps), out=inv_std)
    xp.sqrt(inv_std, out=inv_std)
    xp.divide(t(1.0), inv_std, out=inv_std)
    xp.multiply(gamma, inv_std, out=scale)
    xp.multiply(mean, scale, out=shift)
    xp.subtract(beta, shift, out=shift)
    running_mean *= t(momentum)
    running_mean += t(1.0 - momentum) * mean
    if var_factor:
        running_var *= t(momentum)
        running_var += t(var_factor) * var
