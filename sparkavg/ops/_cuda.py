"""CuPy kernels behind :mod:`sparkavg.ops` for arrays on a CUDA device.

CuPy comes only from :func:`sparkavg.backend.cupy`, and the kernels are
built on first use (:func:`kernels`, cached), so importing sparkavg never
imports CuPy.  Kernel names carry the ``sparkavg_`` prefix (they show up
so in profilers).  Every host-device synchronisation is marked ``# sync``:
a Python ``int``/``bool`` of a device value, ``.get()``, a host array
copied to the device, and ``flatnonzero`` (it needs the count on the host
to size its output).

Arithmetic matches the CPU paths: encoders and decoders only add or
subtract the float32 threshold (exact IEEE results, so messages and
residuals equal the numpy reference bit for bit); updaters may differ by
a few ulps because nvrtc contracts multiply-adds into FMAs.

One function per backend operation (:data:`sparkavg.ops._kernels.OPERATIONS`),
with the signature every backend shares.  Convolution and pooling run the
xp-generic twins of :mod:`sparkavg.ops.reference_conv` on CuPy arrays (the
GEMM around them is CuPy's).
"""
from __future__ import annotations

import functools
import math
import types

import numpy as np

from .. import backend
from ._checks import (
    BITMAP_FLAG,
    SPARSE_FLAG,
    bad_index_error,
    bad_word_error,
    clip_bound,
    float_bits,
    non_finite_error,
)
from ._kernels import OPERATIONS
from .reference_conv import (  # noqa: F401 -- xp-generic: they run on CuPy arrays as they are
    avgpool_backward,
    avgpool_forward,
    col2im,
    im2col,
    maxpool_backward,
    maxpool_forward,
)

__all__ = ["kernels", "bitmap_count", *OPERATIONS]

# One bitmap word per thread: elements 16*i .. 16*i+15 of r (i = word index).
_BITMAP_ENCODE = r"""
unsigned int w = 0u;
long long base = (long long)i * 16;
for (int b = 0; b < 16; ++b) {
    long long e = base + b;
    if (e < n) {
        T x = r[e];
        if (x >= tau) { w |= 1u << b; r[e] = x - tau; }
        else if (x <= -tau) { w |= (1u << b) | (1u << (b + 16)); r[e] = x + tau; }
    }
}
word = (int)w;
"""

_BITMAP_DECODE = r"""
unsigned int w = (unsigned int)word;
long long base = (long long)i * 16;
for (int b = 0; b < 16; ++b) {
    if ((w >> b) & 1u) {
        t[base + b] += ((w >> (b + 16)) & 1u) ? -tau : tau;
    }
}
"""

# A word is bad when a sign bit lacks its value bit or a value bit lies past n.
_BITMAP_CHECK = r"""
unsigned int w = (unsigned int)word;
long long valid = n - (long long)i * 16;
unsigned int vals = w & 0xFFFFu;
bool past = valid <= 0 ? vals != 0u : (valid < 16 ? (vals >> valid) != 0u : false);
bad = (((w >> 16) & ~w & 0xFFFFu) != 0u) || past;
"""


@functools.cache
def kernels() -> types.SimpleNamespace:
    """Compile (lazily, once) and return the CuPy kernels."""
    cp = backend.cupy()
    ek, rk = cp.ElementwiseKernel, cp.ReductionKernel
    return types.SimpleNamespace(
        accumulate=ek("T x, T w", "T buf", "buf += w * x", "sparkavg_accumulate"),
        scale=ek("T f", "T buf", "buf *= f", "sparkavg_scale"),
        sgd=ek("T g, T lr", "T p", "p -= lr * g", "sparkavg_sgd"),
        nesterov=ek(
            "T g, T lr, T mu, T neg_mu, T one_plus_mu",
            "T p, T v",
            "T vp = v; T vn = mu * vp - lr * g; v = vn; p += neg_mu * vp + one_plus_mu * vn;",
            "sparkavg_nesterov",
        ),
        adagrad=ek(
            "T g, T lr, T eps",
            "T p, T h",
            "T hn = h + g * g; h = hn; p -= lr * g / (sqrt(hn) + eps);",
            "sparkavg_adagrad",
        ),
        rmsprop=ek(
            "T g, T lr, T decay, T omd, T eps",
            "T p, T c",
            "T cn = decay * c + omd * g * g; c = cn; p -= lr * g / (sqrt(cn) + eps);",
            "sparkavg_rmsprop",
        ),
        adam=ek(
            "T g, T b1, T omb1, T b2, T omb2, T alpha, T eps",
            "T p, T m, T v",
            "T mn = b1 * m + omb1 * g; T vn = b2 * v + omb2 * g * g; m = mn; v = vn;"
            " p -= alpha * mn / (sqrt(vn) + eps);",
            "sparkavg_adam",
        ),
        # Non-finite count in the high 32 bits, |x| >= tau count in the low
        # ones (N < 2**31 keeps them apart): one pass, one sync.
        scan=rk(
            "T x, T tau",
            "int64 y",
            "(isfinite(x) ? 0LL : (1LL << 32)) + (fabs(x) >= tau ? 1LL : 0LL)",
            "a + b",
            "y = a",
            "0",
            "sparkavg_scan",
        ),
        # Residual update and body entry for every selected index.
        sparse_emit=ek(
            "S idx, T tau",
            "raw T r, int32 code",
            "T x = r[idx];"
            " if (x >= tau) { code = (int)(idx + 1); r[idx] = x - tau; }"
            " else { code = -(int)(idx + 1); r[idx] = x + tau; }",
            "sparkavg_sparse_emit",
        ),
        bitmap_encode=ek("T tau, int64 n", "raw T r, int32 word", _BITMAP_ENCODE,
                         "sparkavg_bitmap_encode"),
        sparse_check=ek("int32 code, int64 n", "bool bad",
                        "bad = code == 0 || code > n || code < -n", "sparkavg_sparse_check"),
        # atomicAdd: a hand-made message may repeat an index.
        sparse_decode=ek(
            "int32 code, T tau",
            "raw T t",
            "if (code > 0) atomicAdd(&t[code - 1], tau); else atomicAdd(&t[-code - 1], -tau);",
            "sparkavg_sparse_decode",
        ),
        bitmap_check=ek("int32 word, int64 n", "bool bad", _BITMAP_CHECK, "sparkavg_bitmap_check"),
        bitmap_decode=ek("int32 word, T tau", "raw T t", _BITMAP_DECODE, "sparkavg_bitmap_decode"),
        popcount=rk("int32 w", "int64 y", "__popc((unsigned int)w & 0xFFFFu)", "a + b", "y = a",
                    "0", "sparkavg_popcount"),
        clip=ek("T b", "T r", "if (r > b) r = b; else if (r < -b) r = -b;", "sparkavg_clip"),
    )


# ---------------------------------------------------------------- elementwise
def accumulate(buffer, x, weight):
    t = buffer.dtype.type
    kernels().accumulate(x, t(weight), buffer)


def scale(buffer, factor):
    kernels().scale(buffer.dtype.type(factor), buffer)


def sgd_step(params, grads, lr):
    kernels().sgd(grads, params.dtype.type(lr), params)


def nesterov_step(params, grads, velocity, lr, momentum):
    t = params.dtype.type
    kernels().nesterov(grads, t(lr), t(momentum), t(-momentum), t(1.0 + momentum), params, velocity)


def adagrad_step(params, grads, history, lr, eps):
    t = params.dtype.type
    kernels().adagrad(grads, t(lr), t(eps), params, history)


def rmsprop_step(params, grads, cache, lr, decay, eps):
    t = params.dtype.type
    kernels().rmsprop(grads, t(lr), t(decay), t(1.0 - decay), t(eps), params, cache)


def adam_step(params, grads, m, v, lr, beta1, beta2, eps, t):
    # The reference's double-precision expression, rounded once.
    alpha = lr * math.sqrt(1.0 - beta2**t) / (1.0 - beta1**t)
    ty = params.dtype.type
    kernels().adam(grads, ty(beta1), ty(1.0 - beta1), ty(beta2), ty(1.0 - beta2), ty(alpha),
                   ty(eps), params, m, v)


# ------------------------------------------------------------------ encoding
def _scan(residual, tt):
    """(non-finite count, |r| >= tau count); raises on non-finite."""
    cp = backend.cupy()
    packed = int(kernels().scan(residual, tt))  # sync: counts decide what happens next
    n_bad, total = packed >> 32, packed & 0xFFFFFFFF
    if n_bad:
        first = int(cp.flatnonzero(~cp.isfinite(residual))[0])  # sync: for the message
        raise non_finite_error(n_bad, first)
    return total


def _header(cp, words):
    return cp.asarray(np.asarray(words, dtype=np.int32))  # sync: host -> device copy


def encode_sparse(residual, tau, limit, apply_when_capped=True):
    """(message or None, total) on the device; see sparkavg.ops.threshold_encode."""
    cp = backend.cupy()
    n = residual.size
    if n == 0:
        return None, 0
    tt = residual.dtype.type(tau)
    total = _scan(residual, tt)
    if total < 2 or (total >= limit and not apply_when_capped):
        return None, total
    idx = cp.flatnonzero(cp.abs(residual) >= tt)[:limit]  # sync: output size
    m = int(idx.size)
    out = cp.empty(4 + m, dtype=cp.int32)
    kernels().sparse_emit(idx, tt, residual, out[4:])
    out[:4] = _header(cp, [m, n, float_bits(tau), SPARSE_FLAG])
    return out, total


def encode_bitmap(residual, tau):
    """(message, count) on the device; see sparkavg.ops.bitmap_encode."""
    cp = backend.cupy()
    n = residual.size
    tt = residual.dtype.type(tau)
    count = _scan(residual, tt) if n else 0
    out = cp.empty(n // 16 + 5, dtype=cp.int32)
    kernels().bitmap_encode(tt, n, residual, out[4:])
    out[:4] = _header(cp, [n, n, float_bits(tau), BITMAP_FLAG])
    return out, count


def _on_device(cp, encoded):
    if backend.is_gpu_array(encoded):
        return encoded
    return cp.asarray(encoded)  # sync: a received (host) message goes to the device


def decode_sparse(encoded, target, count, tau):
    """Add the first ``count`` body entries into ``target``; the caller
    checked the header and read ``count`` and ``tau`` from it."""
    cp = backend.cupy()
    n = target.size
    if count == 0:
        return target
    body = _on_device(cp, encoded)[4:4 + count]
    tau = target.dtype.type(tau)
    bad = kernels().sparse_check(body, n)
    if bool(bad.any()):  # sync: validate before writing
        pos = int(cp.flatnonzero(bad)[0])  # sync: for the message
        raise bad_index_error(pos, int(body[pos]), n)  # sync: for the message
    kernels().sparse_decode(body, tau, target)
    return target


def decode_bitmap(encoded, target, tau):
    """Add every value bit into ``target``; the caller checked the header."""
    cp = backend.cupy()
    n = target.size
    words = _on_device(cp, encoded)[4:]
    tau = target.dtype.type(tau)
    bad = kernels().bitmap_check(words, n)
    if bool(bad.any()):  # sync: validate before writing
        pos = int(cp.flatnonzero(bad)[0])  # sync: for the message
        raise bad_word_error(pos, int(words[pos]), n)  # sync: for the message
    kernels().bitmap_decode(words, tau, target)
    return target


def count_above(residual, threshold):
    cp = backend.cupy()
    tt = residual.dtype.type(threshold)
    return int(cp.count_nonzero(cp.abs(residual) >= tt))  # sync: the count is returned


def clip_residual(residual, threshold, k):
    kernels().clip(clip_bound(residual.dtype, threshold, k), residual)


def bitmap_count(encoded):
    """Values a device bitmap message sends (popcount of the low halves)."""
    return int(kernels().popcount(encoded[4:]))  # sync: the count is returned
