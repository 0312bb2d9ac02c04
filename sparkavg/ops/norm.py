"""Per-channel kernels of batch and layer normalisation on rows of
channels: (M, C) C-contiguous arrays (a channels-last batch (N, H, W, C)
seen as (N*H*W, C), or a dense batch (N, F)) and (C,) vectors.

- :func:`channel_stats`  -- mean and biased variance of each channel
- :func:`channel_affine` -- ``out = x * scale + shift``
- :func:`channel_sums`   -- ``sum(dy)`` and ``sum(dy * (x - center))``
- :func:`channel_blend`  -- ``out = a * dy + b * (x - center) + shift``
- :func:`batchnorm_coefficients` -- a training BatchNorm's per-channel
  scale, shift, inverse deviation and running statistics, in one pass

A BatchNorm step is stats + affine going forward and sums + blend going
back: the Cython kernels make that two reads of the input and one write
each way, where numpy's broadcasting of a (C,) vector over short rows
takes a dozen slow passes.  Sums accumulate in double on every path.

Each function checks its arguments (see :mod:`sparkavg.ops._checks`),
then runs where :mod:`sparkavg.ops._dispatch` routes: numpy float32 to the
Cython kernels, CuPy arrays and float64 to the xp-generic twins of
:mod:`sparkavg.ops.reference_norm`.  Output arrays, allocated when None,
are written and returned.
"""
from __future__ import annotations

from ._checks import check_inplace, check_operand, check_readonly
from ._dispatch import call
from ._kernels import NORM

__all__ = list(NORM)


def _rows(name: str, a):
    """A read-only (M, C) float array (strided: copied) -> (kind, array)."""
    kind, a = check_readonly(name, a)
    if a.ndim != 2:
        raise ValueError(f"Expect {name} of shape (M, C), got shape {a.shape}")
    return kind, a


def _vector(name: str, v, rows, rows_name: str):
    return check_operand(name, v, rows, rows_name, shape=(rows.shape[1],))


def _out(name: str, out, like, like_name: str, shape) -> None:
    check_inplace(name, out, dtype=like.dtype)
    check_operand(name, out, like, like_name, shape=shape)


def channel_stats(x, mean=None, var=None):
    """Mean and biased variance of each column.

    Parameters
    ----------
    x : float32/float64 array (M, C), M >= 1, numpy or CuPy
    mean, var : arrays (C,) of x's dtype, or None (both given or neither)

    Returns
    -------
    (mean, var)
    """
    kind, x = _rows("x", x)
    if x.shape[0] < 1:
        raise ValueError(f"Expect x with at least one row, got shape {x.shape}")
    if (mean is None) != (var is None):
        raise ValueError("Expect mean and var both given or both None, got only "
                         + ("mean" if var is None else "var"))
    if mean is not None:
        _out("mean", mean, x, "x", (x.shape[1],))
        _out("var", var, x, "x", (x.shape[1],))
    return call("channel_stats", kind, x.dtype, x, mean, var)


def channel_affine(x, scale, shift, out=None):
    """``out = x * scale + shift`` per column.

    Parameters
    ----------
    x : float32/float64 array (M, C), numpy or CuPy
    scale, shift : arrays (C,) of x's kind and dtype
    out : array (M, C) of x's dtype, or None

    Returns
    -------
    out
    """
    kind, x = _rows("x", x)
    scale, shift = _vector("scale", scale, x, "x"), _vector("shift", shift, x, "x")
    if out is not None:
        _out("out", out, x, "x", x.shape)
    return call("channel_affine", kind, x.dtype, x, scale, shift, out)


def channel_sums(dy, x, center, sum_dy=None, sum_dy_x=None):
    """``sum(dy)`` and ``sum(dy * (x - center))`` of each column (BatchNorm's
    beta and gamma gradients, up to a factor).

    Parameters
    ----------
    dy, x : float32/float64 arrays (M, C) of one kind and dtype
    center : array (C,)
    sum_dy, sum_dy_x : arrays (C,) of dy's dtype, or None (both given or neither)

    Returns
    -------
    (sum_dy, sum_dy_x)
    """
    kind, dy = _rows("dy", dy)
    x = check_operand("x", x, dy, "dy")
    center = _vector("center", center, dy, "dy")
    if (sum_dy is None) != (sum_dy_x is None):
        raise ValueError("Expect sum_dy and sum_dy_x both given or both None, got only "
                         + ("sum_dy" if sum_dy_x is None else "sum_dy_x"))
    if sum_dy is not None:
        _out("sum_dy", sum_dy, dy, "dy", (dy.shape[1],))
        _out("sum_dy_x", sum_dy_x, dy, "dy", (dy.shape[1],))
    return call("channel_sums", kind, dy.dtype, dy, x, center, sum_dy, sum_dy_x)


def channel_blend(dy, x, center, a, b, shift, out=None):
    """``out = a * dy + b * (x - center) + shift`` per column (BatchNorm's
    input gradient).

    Parameters
    ----------
    dy, x : float32/float64 arrays (M, C) of one kind and dtype
    center, a, b, shift : arrays (C,)
    out : array (M, C) of dy's dtype, or None; may be ``dy`` itself

    Returns
    -------
    out
    """
    kind, dy = _rows("dy", dy)
    x = check_operand("x", x, dy, "dy")
    center, a, b, shift = (_vector(name, v, dy, "dy") for name, v in
                           (("center", center), ("a", a), ("b", b), ("shift", shift)))
    if out is not None:
        _out("out", out, dy, "dy", dy.shape)
    return call("channel_blend", kind, dy.dtype, dy, x, center, a, b, shift, out)


def batchnorm_coefficients(mean, var, gamma, beta, eps, momentum, var_factor, running_mean, running_var,
                           scale, shift, inv_std):
    """A training BatchNorm's per-channel bookkeeping in one pass (on a GPU
    one launch, not a dozen on (C,) vectors): ``inv_std = 1 / sqrt(var +
    eps)``, ``scale = gamma * inv_std``, ``shift = beta - mean * scale``,
    ``running_mean = running_mean * momentum + (1 - momentum) * mean`` and,
    unless ``var_factor`` is 0, ``running_var = running_var * momentum +
    var_factor * var`` -- each rounded in ``mean``'s dtype, in this order.

    Parameters
    ----------
    mean, var, gamma, beta : float32/float64 arrays (C,), numpy or CuPy
        The batch's statistics and the affine parameters.
    eps, momentum, var_factor : float
        ``var_factor``: ``(1 - momentum) m / (m - 1)`` for a batch of ``m``
        values per channel (the unbiased variance's weight), 0 for ``m == 1``.
    running_mean, running_var, scale, shift, inv_std : arrays (C,) of mean's kind and dtype
        Updated / written in place.
    """
    kind, mean = check_readonly("mean", mean)
    if mean.ndim != 1:
        raise ValueError(f"Expect mean of shape (C,), got shape {mean.shape}")
    var, gamma, beta = (check_operand(name, v, mean, "mean", shape=mean.shape)
                        for name, v in (("var", var), ("gamma", gamma), ("beta", beta)))
    for name, out in (("running_mean", running_mean), ("running_var", running_var), ("scale", scale),
                      ("shift", shift), ("inv_std", inv_std)):
        _out(name, out, mean, "mean", mean.shape)
    return call("batchnorm_coefficients", kind, mean.dtype, mean, var, gamma, beta, float(eps), float(momentum),
                float(var_factor), running_mean, running_var, scale, shift, inv_std)
