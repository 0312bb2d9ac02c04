"""The one front for kernels.

Every kernel (:data:`KERNELS`) checks its arguments, then runs where one
rule sends it (:mod:`sparkavg.ops._dispatch`):

- numpy float32 -> the Cython kernels in ``sparkavg_ext`` (when built:
  :func:`have_extension`, the one such check);
- CuPy arrays (float32 or float64) -> CuPy kernels, built lazily
  (:mod:`sparkavg.ops._cuda`);
- everything else -> the pure-numpy twins in :mod:`sparkavg.ops.reference`:
  numpy float64 (the Cython kernels are float32 only; gradient checks run
  in float64), numpy float32 without the extension, and every array when
  ``SPARKAVG_PURE_NUMPY=1``.  The twins are also the oracle the tests hold
  the fast paths to.

Kernels:

- Averaging / updaters (in place, one pass): :func:`accumulate`,
  :func:`scale`, :func:`sgd_step`, :func:`nesterov_step`,
  :func:`adagrad_step`, :func:`rmsprop_step`, :func:`adam_step`.
- Threshold encoding (libnd4j wire formats): :func:`threshold_encode` /
  :func:`threshold_decode`, :func:`bitmap_encode` / :func:`bitmap_decode`,
  :func:`count_above`, :func:`clip_residual`; built on them, the switching
  :func:`encode` / :func:`decode` with :class:`EncodingState`, and
  :func:`encoded_count`, :func:`encoded_nbytes`, :func:`default_limit`;
  :func:`merge_messages`, the sum of messages at one τ in the merged
  format the ranks of ``Topology.TREE`` exchange (:mod:`sparkavg.ops.merging`; ``decode``
  reads it).
- Convolution and pooling on NHWC arrays: :func:`im2col` / :func:`col2im`,
  the direct stride-1 convolution :func:`conv2d_forward` /
  :func:`conv2d_backward_data` / :func:`conv2d_backward_weights` (with
  :func:`have_direct_conv`), :func:`maxpool_forward` / :func:`maxpool_backward`,
  :func:`avgpool_forward` / :func:`avgpool_backward`, with
  :func:`conv_output_size`.
- Per-channel normalisation on (M, C) rows (BatchNorm, LayerNorm):
  :func:`channel_stats`, :func:`channel_affine`, :func:`channel_sums`,
  :func:`channel_blend`, and a training BatchNorm's per-channel bookkeeping,
  :func:`batchnorm_coefficients`.
- One LSTM / GRU time step's element-wise work (the GEMMs are the
  layer's): :func:`lstm_forward_step`, :func:`lstm_backward_step`,
  :func:`gru_forward_step`, :func:`gru_backward_step`.

Convert or reject (details: :mod:`sparkavg.ops._checks`): arrays written
in place (buffer, params, updater state, residual, decode target, a
kernel's ``out``) must be float32/float64, C-contiguous and writeable, else
TypeError/ValueError -- a converted copy would swallow the write; read-only
operands (``x``, ``grads``, messages, images) must match the target's dtype
and are copied when strided.  NaN/inf in a residual, a bad threshold or a
malformed message raise ValueError and change nothing.

Wire-format decisions (details: :mod:`sparkavg.ops.encoding`): tau travels
and is subtracted as float32; bitmaps are symmetric (no libnd4j -tau/2);
the sparse cap defaults to ``max(N // 16, 2)``; indices are ascending.
"""
from __future__ import annotations

from . import conv, elementwise, encoding, merging, norm, reference, sequence
from ._dispatch import have_direct_conv, have_extension
from ._kernels import KERNELS
from .conv import *  # noqa: F401,F403 -- the names in conv.__all__
from .elementwise import *  # noqa: F401,F403
from .encoding import *  # noqa: F401,F403
from .merging import MERGED_FLAG, merge_messages
from .norm import *  # noqa: F401,F403
from .sequence import *  # noqa: F401,F403

__all__ = [
    "reference",
    "have_extension",
    "have_direct_conv",
    "KERNELS",
    *elementwise.__all__,
    *encoding.__all__,
    "MERGED_FLAG",
    "merge_messages",
    *conv.__all__,
    *norm.__all__,
    *sequence.__all__,
]
