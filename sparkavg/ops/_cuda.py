"""CuPy kernels behind :mod:`sparkavg.ops` for arrays on a CUDA device.

CuPy comes only from :func:`sparkavg.backend.cupy`, and the kernels are
built on first use (:func:`kernels` and the raw kernels of
:mod:`sparkavg.ops.cuda_src`, cached), so importing sparkavg never imports
CuPy.  Kernel names carry the ``sparkavg_`` prefix (they show up so in
profilers).  Every host-device synchronisation is marked ``# sync``: a
Python ``int``/``bool`` of a device value, ``.get()``/``to_cpu``, a host
array copied to the device.  Encoders synchronise once (the count that
sizes the message), decoders once (the check before writing).

Arithmetic matches the CPU paths: encoders and decoders only add or
subtract the float32 threshold (exact IEEE results, so messages and
residuals equal the numpy reference bit for bit); updaters may differ by
a few ulps because nvrtc contracts multiply-adds into FMAs.

One function per backend operation (:data:`sparkavg.ops._kernels.OPERATIONS`),
with the signature every backend shares.  Encoding and decoding run the
raw kernels of ``cuda_src/encode.cu``; convolution and pooling those of
``cuda_src/conv.cu`` (:mod:`sparkavg.ops._cuda_conv`; the GEMM around them
is CuPy's).  The per-channel normalisation kernels are the xp-generic twins
of :mod:`sparkavg.ops.reference_norm` on the device (CuPy reductions and
element-wise ops; no host synchronisation).
"""
from __future__ import annotations

import functools
import math
import types

import numpy as np

from .. import backend
from ._checks import (
    bad_index_error,
    bad_word_error,
    clip_bound,
    float_bits,
    non_finite_error,
)
from ._cuda_conv import (  # noqa: F401 -- the raw conv/pool kernels are this backend's
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
from ._kernels import OPERATIONS
from .cuda_src import device
from ._cuda_norm import (  # noqa: F401 -- raw kernels for the sums, xp twins element-wise
    batchnorm_coefficients,
    channel_affine,
    channel_blend,
    channel_stats,
    channel_sums,
)
from ._cuda_sequence import (  # noqa: F401 -- raw LSTM step kernels; the GRU's are the xp twins
    gru_backward_step,
    gru_forward_step,
    lstm_backward_step,
    lstm_forward_step,
    scatter_add_rows,
)

__all__ = ["kernels", "bitmap_count", "label_clip", *OPERATIONS]


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
        popcount=rk("int32 w", "int64 y", "__popc((unsigned int)w & 0xFFFFu)", "a + b", "y = a",
                    "0", "sparkavg_popcount"),
        clip=ek("T b", "T r", "if (r > b) r = b; else if (r < -b) r = -b;", "sparkavg_clip"),
        # Class labels clipped into [0, top], their smallest and largest folded into
        # extremes (a contiguous pair, from [INT64_MAX, INT64_MIN]) in the same launch.
        # An atomic only where a label beats the extreme read (min and max are
        # monotone: a stale read costs one atomic more, never a wrong result).
        label_clip=ek("int64 y, int64 top", "int64 c, raw int64 extremes",
                      "long long v = y; long long *e = (long long *)&extremes[0];"
                      " if (v < e[0]) atomicMin(e, v); if (v > e[1]) atomicMax(e + 1, v);"
                      " c = v < 0 ? 0 : (v > top ? top : v);", "sparkavg_label_clip"),
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
# Raw kernels of cuda_src/encode.cu.  Each encoder and decoder synchronises
# once, at its end: the second kernel reads the first one's verdict on the
# device (a non-finite value, a bad entry; for the sparse format, whether
# anything is sent) and writes nothing when it says so, then the host reads
# the small info vector to raise, or to learn the count.
# The ``_``-prefixed functions take a launcher (see cuda_src), so the tests
# run this very glue on the CPU with the C build of the kernels.
_ENCODE = "encode"
_I64 = np.int64
#: Sparse encoding cuts the vector into tiles of up to 32 chunks of 32
#: values (one warp each); about this many tiles, so small vectors still
#: spread over the device and large ones keep the tile scan short.
_TARGET_TILES = 4096
_MAX_CHUNKS = 32


def _tiles(n: int, target: int = _TARGET_TILES) -> tuple[int, int]:
    """(tiles, chunks of 32 values per tile) for n values."""
    chunks = min(max(-(-n // (32 * target)), 1), _MAX_CHUNKS)
    return -(-n // (32 * chunks)), chunks


def _first_bad(info, n):
    """(non-finite count, index of the first) from a host info vector."""
    return int(info[0]), n - int(info[1])


def _groups(ntiles: int) -> tuple[int, int]:
    """(per1, per2): tiles per first-level group, first-level groups per
    second: the emit pass's loads for a tile's start stay near
    2 * sqrt(ntiles / 32) + 32 (see encode.cu)."""
    per1 = 32
    return per1, max(1, math.isqrt(-(-ntiles // per1)))


def _encode_sparse(launcher, residual, tau, limit, apply_when_capped=True, tiles=None):
    xp = launcher.xp
    n = residual.size
    if n == 0:
        return None, 0
    dtype = residual.dtype
    tt = dtype.type(tau)
    ntiles, chunks = tiles or _tiles(n)
    per1, per2 = _groups(ntiles)
    n1 = -(-ntiles // per1)
    n2 = -(-n1 // per2)
    counts = xp.empty(ntiles, dtype=np.int32)
    zeroed = xp.zeros(3 + n1 + n2, dtype=np.int64)  # one fill: info, then the group sums
    info, g1, g2 = zeroed[:3], zeroed[3:3 + n1], zeroed[3 + n1:]
    launcher.launch(_ENCODE, "sparkavg_sparse_count", dtype, _I64, 32 * ntiles,
                    (residual, _I64(n), tt, _I64(ntiles), _I64(chunks), counts, info, g1, g2,
                     _I64(per1), _I64(per2)))
    out = xp.empty(4 + min(int(limit), n), dtype=np.int32)  # room for the largest message
    launcher.launch(_ENCODE, "sparkavg_sparse_emit", dtype, _I64, 32 * ntiles,
                    (residual, _I64(n), tt, _I64(ntiles), _I64(chunks), counts, g1, g2, _I64(per1), _I64(per2),
                     _I64(limit), out, info, np.int32(bool(apply_when_capped)), np.int32(float_bits(tau))))
    host = backend.to_cpu(info)  # sync: the one read, after both passes
    n_bad, first = _first_bad(host, n)
    if n_bad:
        raise non_finite_error(n_bad, first)  # the emit pass wrote nothing
    total = int(host[2])
    if total < 2 or (total >= limit and not apply_when_capped):
        return None, total
    size = 4 + min(total, limit)
    return (out if size == out.size else out[:size].copy()), total  # no idle room kept alive


def _encode_bitmap(launcher, residual, tau):
    xp = launcher.xp
    n = residual.size
    dtype = residual.dtype
    tt = dtype.type(tau)
    nwords = n // 16 + 1
    out = xp.empty(nwords + 4, dtype=np.int32)
    info = xp.zeros(3, dtype=np.int64)
    launcher.launch(_ENCODE, "sparkavg_bitmap_words", dtype, _I64, 32 * ((nwords + 1) // 2),
                    (residual, _I64(n), tt, _I64(nwords), out, np.int32(float_bits(tau)), info))
    launcher.launch(_ENCODE, "sparkavg_bitmap_apply", dtype, _I64, nwords,
                    (residual, _I64(nwords), tt, out[4:], info))  # writes nothing after a non-finite value
    host = backend.to_cpu(info)  # sync: the one read, after both passes
    n_bad, first = _first_bad(host, n)
    if n_bad:
        raise non_finite_error(n_bad, first)
    return out, int(host[2])


def _on_device(xp, encoded):
    if xp is np or backend.is_gpu_array(encoded):
        return encoded
    return xp.asarray(encoded)  # sync: a received (host) message goes to the device


def _check_entries(launcher, kernel, entries, n):
    """Queue ``kernel``'s check of the body entries / words: the device flag
    that the decoder reads (and :func:`_first_bad_entry` after it)."""
    flag = launcher.xp.zeros(1, dtype=np.int64)
    launcher.launch(_ENCODE, kernel, np.float32, _I64, entries.size,
                    (entries, _I64(entries.size), _I64(n), flag))
    return flag


def _first_bad_entry(flag, entries):
    """Position of the first bad entry / word the check flagged, or None."""
    found = int(backend.to_cpu(flag)[0])  # sync: the one read, after check and decode
    return entries.size - found if found else None


def _decode_sparse(launcher, encoded, target, count, tau):
    if count == 0:
        return target
    n = target.size
    body = launcher.xp.ascontiguousarray(_on_device(launcher.xp, encoded)[4:4 + count])
    flag = _check_entries(launcher, "sparkavg_sparse_check", body, n)
    launcher.launch(_ENCODE, "sparkavg_sparse_decode", target.dtype, _I64, count,
                    (body, _I64(count), target.dtype.type(tau), target, flag))  # nothing if flagged
    pos = _first_bad_entry(flag, body)
    if pos is not None:
        raise bad_index_error(pos, int(body[pos]), n)
    return target


def _decode_bitmap(launcher, encoded, target, tau):
    n = target.size
    words = launcher.xp.ascontiguousarray(_on_device(launcher.xp, encoded)[4:])
    flag = _check_entries(launcher, "sparkavg_bitmap_check", words, n)
    launcher.launch(_ENCODE, "sparkavg_bitmap_decode", target.dtype, _I64, words.size,
                    (words, _I64(words.size), target.dtype.type(tau), target, flag))  # nothing if flagged
    pos = _first_bad_entry(flag, words)
    if pos is not None:
        raise bad_word_error(pos, int(words[pos]), n)
    return target


def encode_sparse(residual, tau, limit, apply_when_capped=True):
    """(message or None, total) on the device; see sparkavg.ops.threshold_encode."""
    return _encode_sparse(device(), residual, tau, limit, apply_when_capped)


def encode_bitmap(residual, tau):
    """(message, count) on the device; see sparkavg.ops.bitmap_encode."""
    return _encode_bitmap(device(), residual, tau)


def decode_sparse(encoded, target, count, tau):
    """Add the first ``count`` body entries into ``target``; the caller
    checked the header and read ``count`` and ``tau`` from it."""
    return _decode_sparse(device(), encoded, target, count, tau)


def decode_bitmap(encoded, target, tau):
    """Add every value bit into ``target``; the caller checked the header."""
    return _decode_bitmap(device(), encoded, target, tau)

def count_above(residual, threshold):
    cp = backend.cupy()
    tt = residual.dtype.type(threshold)
    return int(cp.count_nonzero(cp.abs(residual) >= tt))  # sync: the count is returned


def clip_residual(residual, threshold, k):
    kernels().clip(clip_bound(residual.dtype, threshold, k), residual)


def label_clip(labels, top, extremes):
    """``labels`` (int64, on the device) clipped into ``[0, top]``, a new
    array; their smallest and largest are folded into ``extremes`` (see
    :mod:`sparkavg.nn.device_checks`).  No synchronisation."""
    out = backend.cupy().empty_like(labels)
    kernels().label_clip(labels, np.int64(top), out, extremes)
    return out


def bitmap_count(encoded):
    """Values a device bitmap message sends (popcount of the low halves)."""
    return int(kernels().popcount(encoded[4:]))  # sync: the count is returned
