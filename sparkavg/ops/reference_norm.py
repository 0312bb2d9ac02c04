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
