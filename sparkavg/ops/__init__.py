"""The one front for kernels.

numpy float32 arrays go to the Cython kernels in ``sparkavg_ext``; CuPy
arrays go to CuPy kernels (built lazily, :mod:`sparkavg.ops._cuda`);
anything else (float64 for gradient checks, or ``SPARKAVG_PURE_NUMPY=1``)
goes to the pure-numpy twins in :mod:`sparkavg.ops.reference`, which are
also the oracle the tests hold the fast paths to.

- Averaging / updaters (in place, one pass): :func:`accumulate`,
  :func:`scale`, :func:`sgd_step`, :func:`nesterov_step`,
  :func:`adagrad_step`, :func:`rmsprop_step`, :func:`adam_step`.
- Threshold encoding (libnd4j wire formats): :func:`threshold_encode` /
  :func:`threshold_decode`, :func:`bitmap_encode` / :func:`bitmap_decode`,
  the switching :func:`encode` / :func:`decode` with :class:`EncodingState`,
  :func:`encoded_count`, :func:`encoded_nbytes`, :func:`count_above`,
  :func:`clip_residual`, :func:`default_limit`.

Convert or reject (details: :mod:`sparkavg.ops._dispatch`): arrays written
in place (buffer, params, updater state, residual, decode target) must be
float32/float64, C-contiguous and writeable, else TypeError/ValueError -- a
converted copy would swallow the write; read-only operands (``x``,
``grads``, messages) must match the target's dtype and are copied when
strided.  NaN/inf in a residual, a bad threshold or a malformed message
raise ValueError and change nothing.

Wire-format decisions (details: :mod:`sparkavg.ops.encoding`): tau travels
and is subtracted as float32; bitmaps are symmetric (no libnd4j -tau/2);
the sparse cap defaults to ``max(N // 16, 2)``; indices are ascending.
"""
from __future__ import annotations

from . import reference
from ._dispatch import have_extension
from .elementwise import (
    accumulate,
    adagrad_step,
    adam_step,
    nesterov_step,
    rmsprop_step,
    scale,
    sgd_step,
)
from .encoding import (
    BITMAP,
    SPARSE,
    EncodingState,
    bitmap_decode,
    bitmap_encode,
    clip_residual,
    count_above,
    decode,
    default_limit,
    encode,
    encoded_count,
    encoded_nbytes,
    threshold_decode,
    threshold_encode,
)

__all__ = [
    "reference",
    "have_extension",
    "accumulate",
    "scale",
    "sgd_step",
    "nesterov_step",
    "adagrad_step",
    "rmsprop_step",
    "adam_step",
    "threshold_encode",
    "threshold_decode",
    "bitmap_encode",
    "bitmap_decode",
    "encode",
    "decode",
    "EncodingState",
    "SPARSE",
    "BITMAP",
    "encoded_count",
    "encoded_nbytes",
    "count_above",
    "clip_residual",
    "default_limit",
]
