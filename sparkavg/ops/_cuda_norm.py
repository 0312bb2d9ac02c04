"""Per-channel sums on CuPy arrays: raw CUDA kernels
(``sparkavg/ops/cuda_src/norm.cu``) for BatchNorm's statistics and its
gamma and beta gradients.

CuPy's own reduction over axis 0 of an (M, C) array runs one thread block
per channel: a handful of blocks for a network's 16 or 32 channels, each
reading a strided column.  Here stage 1 spreads the rows over about
:data:`_TARGET_THREADS` threads (one per chunk of rows and channel, so a
warp reads neighbouring channels of a row) and stage 2 adds each channel's
partials in chunk order: deterministic, terms formed as the reference
forms them and summed in double, as its float64 sums are.  A training
BatchNorm's per-channel bookkeeping is one launch too
(``batchnorm_coefficients``).  The element-wise kernels (``channel_affine``,
``channel_blend``) are the xp twins'.

The ``_``-prefixed functions take a launcher (:mod:`sparkavg.ops.cuda_src`),
which is how the tests run this glue and the kernel bodies on the CPU.
"""
from __future__ import annotations

import numpy as np

from .cuda_src import device, index_type
from .reference_norm import channel_affine, channel_blend  # noqa: F401 -- the xp twins run here

__all__ = ["channel_stats", "channel_sums", "channel_affine", "channel_blend", "batchnorm_coefficients"]

_FILE = "norm"
#: Stage 1's threads, about: enough to fill a device, few enough partials.
_TARGET_THREADS = 1 << 16


def _chunks(m: int, c: int) -> tuple[int, int]:
    """(chunks, rows per chunk) for an (m, c) array."""
    rows = max(1, -(-m // max(1, min(m, _TARGET_THREADS // max(c, 1)))))
    return max(1, -(-m // rows)), rows


#: What stage 2 writes (see norm.cu): the mean, the variance, plain sums.
_MEAN, _VARIANCE, _SUMS = 0, 1, 2


def _sums(launcher, kernel, arrays, m, c, out1, out2, mode, flags=()):
    """Stage 1 (``kernel`` over ``arrays``, then the geometry, then
    ``flags``: int32s), then stage 2 writing ``out1``/``out2`` by ``mode``."""
    xp = launcher.xp
    chunks, rows = _chunks(m, c)
    total = chunks * c
    part = xp.empty(2 * total, dtype=np.float64)
    dtype = arrays[0].dtype
    index = index_type(m * c, 2 * total)
    launcher.launch(_FILE, kernel, dtype, index, total,
                    (*arrays, part, index(total), index(m), index(c), index(rows), *map(np.int32, flags)))
    launcher.launch(_FILE, "sparkavg_channel_finish", dtype, index, c,
                    (part, out1, out2, index(c), index(chunks), index(m), np.int32(mode)))


def _channel_stats(launcher, x, mean=None, var=None):
    xp = launcher.xp
    x = xp.ascontiguousarray(x)
    m, c = x.shape
    if mean is None:
        mean, var = xp.empty(c, dtype=x.dtype), xp.empty(c, dtype=x.dtype)
    _sums(launcher, "sparkavg_channel_partials", (x, mean), m, c, mean, var, _MEAN, flags=(0,))  # mean not read
    _sums(launcher, "sparkavg_channel_partials", (x, mean), m, c, mean, var, _VARIANCE, flags=(1,))  # about it
    return mean, var


def _channel_sums(launcher, dy, x, center, sum_dy=None, sum_dy_x=None):
    xp = launcher.xp
    dy, x = xp.ascontiguousarray(dy), xp.ascontiguousarray(x)
    m, c = dy.shape
    center = xp.ascontiguousarray(center, dtype=dy.dtype)
    if sum_dy is None:
        sum_dy, sum_dy_x = xp.empty(c, dtype=dy.dtype), xp.empty(c, dtype=dy.dtype)
    _sums(launcher, "sparkavg_channel_grad_partials", (dy, x, center), m, c, sum_dy, sum_dy_x, _SUMS)
    return sum_dy, sum_dy_x


def _batchnorm_coefficients(launcher, mean, var, gamma, beta, eps, momentum, var_factor, running_mean,
                            running_var, scale, shift, inv_std):
    c, t = mean.size, mean.dtype.type
    index = index_type(c)
    launcher.launch(_FILE, "sparkavg_batchnorm_coefficients", mean.dtype, index, c,
                    (mean, var, gamma, beta, running_mean, running_var, scale, shift, inv_std, index(c), t(eps),
                     t(momentum), t(1.0 - momentum), t(var_factor), np.int32(bool(var_factor))))


# ------------------------------------------------------- the device backend
def channel_stats(x, mean=None, var=None):
    """See :func:`sparkavg.ops.norm.channel_stats`; CuPy arrays."""
    return _channel_stats(device(), x, mean, var)


def channel_sums(dy, x, center, sum_dy=None, sum_dy_x=None):
    """See :func:`sparkavg.ops.norm.channel_sums`; CuPy arrays."""
    return _channel_sums(device(), dy, x, center, sum_dy, sum_dy_x)


def batchnorm_coefficients(mean, var, gamma, beta, eps, momentum, var_factor, running_mean, running_var,
                           scale, shift, inv_std):
    """See :func:`sparkavg.ops.norm.batchnorm_coefficients`; CuPy arrays: one launch."""
    _batchnorm_coefficients(device(), mean, var, gamma, beta, eps, momentum, var_factor, running_mean, running_var,
                            scale, shift, inv_std)
