"""Pure-numpy (xp-generic) twins of every kernel: the oracle the fast
paths are tested against, and the path taken when
``SPARKAVG_PURE_NUMPY=1``.

Updater formulas (all in place; ``params`` may be a zero buffer, in which
case it receives the update itself -- that is how gradient sharing gets
"the update after the updater"):

- SGD:      p -= lr*g
- Nesterov: v_prev = v; v = mu*v - lr*g; p += -mu*v_prev + (1+mu)*v
- Adagrad:  h += g*g; p -= lr*g / (sqrt(h) + eps)
- RMSProp:  c = decay*c + (1-decay)*g*g; p -= lr*g / (sqrt(c) + eps)
- Adam:     m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g*g;
            alpha = lr*sqrt(1-b2**t)/(1-b1**t); p -= alpha*m / (sqrt(v) + eps)

Threshold encoding (libnd4j wire formats, int32 arrays; tau travels as the
bits of float32(threshold) and exactly that value, cast to the residual's
dtype, is what encoders subtract and decoders add):

- sparse: [count, N, bits(tau), 0] + count signed 1-based indices,
  ascending; +(i+1) where r[i] >= tau (then r[i] -= tau), -(i+1) where
  r[i] <= -tau (then r[i] += tau); at most ``limit`` entries (the first
  ones); nothing (None) when fewer than 2 entries qualify.
- bitmap: [N, N, bits(tau), 1] + (N // 16 + 1) words; word k covers
  elements 16k..16k+15, bit b = "sends tau", bit b+16 = "negative".
  Symmetric: |r| >= tau sends +-tau; unlike libnd4j, values in
  (-tau, -tau/2] are NOT sent as -tau/2 (sign bit alone), and such words
  are rejected by the decoder.

Convolution and pooling: the xp-generic twins of
:mod:`sparkavg.ops.reference_conv`, re-exported here; the per-channel
normalisation kernels likewise from :mod:`sparkavg.ops.reference_norm`,
the recurrent step and scatter-add kernels from
:mod:`sparkavg.ops.reference_sequence`.

These functions check their data (NaN/inf in a residual, bad indices or
words in a message) but not their arguments' types: :mod:`sparkavg.ops`
does that before dispatching here.  Besides the twins of the kernels, the
module defines the backend operations of the numpy path
(:data:`sparkavg.ops._kernels.OPERATIONS`: :func:`encode_sparse`,
:func:`encode_bitmap`, :func:`decode_sparse`, :func:`decode_bitmap`).
"""
from __future__ import annotations

import math

from ..backend import get_array_module
from ._checks import (
    BITMAP_FLAG,
    SPARSE_FLAG,
    bad_index_error,
    bad_word_error,
    bits_float,
    check_limit,
    check_threshold,
    clip_bound,
    float_bits,
    non_finite_error,
)
from ._kernels import KERNELS, OPERATIONS
from .reference_conv import (  # noqa: F401 -- re-exported: the conv twins
    avgpool_backward,
    avgpool_forward,
    col2im,
    conv2d_backward_data,
    conv2d_backward_weights,
    conv2d_forward,
    im2col,
    maxpool_backward,
    maxpool_forward,
)
from .reference_norm import (  # noqa: F401 -- re-exported: the normalisation twins
    batchnorm_coefficients,
    channel_affine,
    channel_blend,
    channel_stats,
    channel_sums,
)
from .reference_sequence import (  # noqa: F401 -- re-exported: the sequence twins
    gru_backward_step,
    gru_forward_step,
    lstm_backward_step,
    lstm_forward_step,
    scatter_add_rows,
)

#: The twins of the kernels, and the backend operations.
__all__ = list(dict.fromkeys(KERNELS + OPERATIONS))


# ---------------------------------------------------------------- averaging
def accumulate(buffer, x, weight=1.0):
    """buffer += weight * x, in place."""
    if weight == 1.0:
        buffer += x
    else:
        buffer += x * buffer.dtype.type(weight)
    return buffer


def scale(buffer, factor):
    """buffer *= factor, in place."""
    buffer *= buffer.dtype.type(factor)
    return buffer


# ----------------------------------------------------------------- updaters
def sgd_step(params, grads, lr):
    params -= params.dtype.type(lr) * grads
    return params


def nesterov_step(params, grads, velocity, lr, momentum):
    t = params.dtype.type
    v_prev = velocity.copy()
    velocity *= t(momentum)
    velocity -= t(lr) * grads
    params += t(-momentum) * v_prev + t(1.0 + momentum) * velocity
    return params


def adagrad_step(params, grads, history, lr, eps=1e-6):
    xp = get_array_module(params)
    t = params.dtype.type
    history += grads * grads
    params -= t(lr) * grads / (xp.sqrt(history) + t(eps))
    return params


def rmsprop_step(params, grads, cache, lr, decay=0.95, eps=1e-8):
    xp = get_array_module(params)
    t = params.dtype.type
    cache *= t(decay)
    cache += t(1.0 - decay) * grads * grads
    params -= t(lr) * grads / (xp.sqrt(cache) + t(eps))
    return params


def adam_step(params, grads, m, v, lr, beta1=0.9, beta2=0.999, eps=1e-8, t=1):
    xp = get_array_module(params)
    ty = params.dtype.type
    if t < 1:
        raise ValueError(f"Expect Adam step count t >= 1, got {t}")
    m *= ty(beta1)
    m += ty(1.0 - beta1) * grads
    v *= ty(beta2)
    v += ty(1.0 - beta2) * grads * grads
    alpha = lr * math.sqrt(1.0 - beta2**t) / (1.0 - beta1**t)
    params -= ty(alpha) * m / (xp.sqrt(v) + ty(eps))
    return params


# ----------------------------------------------------------------- encoding
def _check_finite(residual):
    xp = get_array_module(residual)
    bad = ~xp.isfinite(residual)
    n_bad = int(bad.sum())
    if n_bad:
        raise non_finite_error(n_bad, int(xp.flatnonzero(bad)[0]))


def encode_sparse(residual, tau, limit, apply_when_capped=True):
    """(message or None, total qualifying): see :func:`threshold_encode`;
    with ``apply_when_capped=False`` nothing is sent when total >= limit."""
    xp = get_array_module(residual)
    n = residual.size
    _check_finite(residual)
    tt = residual.dtype.type(tau)
    idx = xp.flatnonzero(xp.abs(residual) >= tt)
    total = int(idx.size)
    if total < 2 or (total >= limit and not apply_when_capped):
        return None, total
    idx = idx[:limit]
    neg = residual[idx] < 0
    body = xp.where(neg, -(idx + 1), idx + 1).astype(xp.int32)
    # r - (-tau) is r + tau to the last bit: one subtraction serves both signs.
    residual[idx] -= xp.where(neg, -tt, tt)
    header = xp.asarray([body.size, n, float_bits(tau), SPARSE_FLAG], dtype=xp.int32)
    return xp.concatenate([header, body]), total


def encode_bitmap(residual, tau):
    """(message, values sent): see :func:`bitmap_encode`."""
    xp = get_array_module(residual)
    n = residual.size
    _check_finite(residual)
    tt = residual.dtype.type(tau)
    nwords = n // 16 + 1
    sends = xp.zeros(nwords * 16, dtype=bool)
    negative = xp.zeros(nwords * 16, dtype=bool)
    sends[:n] = xp.abs(residual) >= tt
    negative[:n] = residual <= -tt
    weights = xp.left_shift(xp.uint32(1), xp.arange(16, dtype=xp.uint32))
    low = (sends.reshape(nwords, 16) * weights).sum(axis=1, dtype=xp.uint32)
    high = (negative.reshape(nwords, 16) * weights).sum(axis=1, dtype=xp.uint32)
    words = (low | (high << xp.uint32(16))).view(xp.int32)
    residual[sends[:n] & ~negative[:n]] -= tt
    residual[negative[:n]] += tt
    header = xp.asarray([n, n, float_bits(tau), BITMAP_FLAG], dtype=xp.int32)
    return xp.concatenate([header, words]), int(sends.sum())


def threshold_encode(residual, threshold, limit=None):
    """Sparse-encode ``residual`` in place; int32[4 + count] or None."""
    tau = check_threshold(threshold)
    return encode_sparse(residual, tau, check_limit(limit, residual.size))[0]


def bitmap_encode(residual, threshold):
    """Bitmap-encode ``residual`` in place; int32[N // 16 + 5]."""
    return encode_bitmap(residual, check_threshold(threshold))[0]


def threshold_decode(encoded, target):
    """target[|v|-1] += sign(v)*tau for each body entry v, in place.

    Assumes a checked header (flag 0, N == target.size); checks the body
    before touching the target.  Repeated indices add up in order.
    """
    return decode_sparse(encoded, target, int(encoded[0]), bits_float(int(encoded[2])))


def decode_sparse(encoded, target, count, tau):
    """:func:`threshold_decode` with the header's count and tau already read."""
    xp = get_array_module(target)
    n = target.size
    tau = target.dtype.type(tau)
    body = xp.asarray(encoded[4:4 + count], dtype=xp.int64)
    bad = (body == 0) | (body > n) | (body < -n)
    if bool(bad.any()):
        pos = int(xp.flatnonzero(bad)[0])
        raise bad_index_error(pos, int(body[pos]), n)
    idx = xp.abs(body) - 1
    vals = xp.where(body > 0, tau, -tau).astype(target.dtype)
    xp.add.at(target, idx, vals)
    return target


def bitmap_decode(encoded, target):
    """target[16k+b] += +-tau for each value bit of word 4+k, in place.

    Assumes a checked header (flag 1, N == target.size, length N // 16 + 5);
    checks every word before touching the target.
    """
    return decode_bitmap(encoded, target, bits_float(int(encoded[2])))


def decode_bitmap(encoded, target, tau):
    """:func:`bitmap_decode` with the header's tau already read."""
    xp = get_array_module(target)
    n = target.size
    tau = target.dtype.type(tau)
    words = xp.asarray(encoded[4:]).view(xp.uint32)
    shifts = xp.arange(16, dtype=xp.uint32)
    sends = ((words[:, None] >> shifts) & xp.uint32(1)).astype(bool)
    negative = ((words[:, None] >> (shifts + xp.uint32(16))) & xp.uint32(1)).astype(bool)
    past_end = xp.arange(words.size * 16).reshape(-1, 16) >= n
    bad = ((negative & ~sends) | (sends & past_end)).any(axis=1)
    if bool(bad.any()):
        pos = int(xp.flatnonzero(bad)[0])
        raise bad_word_error(pos, int(words[pos]), n)
    sends = sends.reshape(-1)[:n]
    negative = negative.reshape(-1)[:n]
    # Only touched entries change: adding 0 would turn -0.0 into +0.0.
    target[sends & ~negative] += tau
    target[sends & negative] -= tau
    return target


def count_above(residual, threshold):
    """How many entries have |r| >= tau (NaN never counts, inf does)."""
    xp = get_array_module(residual)
    tt = residual.dtype.type(check_threshold(threshold))
    return int(xp.count_nonzero(xp.abs(residual) >= tt))


def clip_residual(residual, threshold, k=5.0):
    """Clip ``residual`` to [-k*tau, k*tau] in place (NaN stays NaN)."""
    xp = get_array_module(residual)
    bound = clip_bound(residual.dtype, check_threshold(threshold), k)
    xp.clip(residual, -bound, bound, out=residual)
    return residual
