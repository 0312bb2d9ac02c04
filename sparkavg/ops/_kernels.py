"""The one list of kernels (names only; no imports, so every module of
:mod:`sparkavg.ops` can derive its own lists from it).

Each name in :data:`KERNELS` is a public function of :mod:`sparkavg.ops`
(the front: it checks its arguments, then dispatches) with a twin of the
same name and signature, less ``n_threads``, in
:mod:`sparkavg.ops.reference`.  Each front runs one backend *operation*
(:data:`OPERATIONS`): the kernel's name, except for the four below, whose
backend form returns more than the front (encoders: the count ``encode()``
needs) or takes what the front has read (decoders: the header, so that a
device message is not read twice).  Every backend -- ``_cython``,
``_cuda`` and ``reference`` -- defines every operation with one signature.
tests/test_ops_front.py checks all of this.
"""
from __future__ import annotations

__all__ = ["ELEMENTWISE", "ENCODING", "CONV", "NORM", "SEQUENCE", "KERNELS", "OPERATIONS", "operation"]

#: The kernels of :mod:`sparkavg.ops.elementwise`: averaging and updater steps.
ELEMENTWISE = ("accumulate", "scale", "sgd_step", "nesterov_step", "adagrad_step", "rmsprop_step", "adam_step")
#: The kernels of :mod:`sparkavg.ops.encoding`: threshold encoding.
ENCODING = ("threshold_encode", "threshold_decode", "bitmap_encode", "bitmap_decode", "count_above", "clip_residual")
#: The kernels of :mod:`sparkavg.ops.conv`: convolution and pooling on NHWC arrays.
CONV = ("im2col", "col2im", "conv2d_forward", "conv2d_backward_data", "conv2d_backward_weights",
        "maxpool_forward", "maxpool_backward", "avgpool_forward", "avgpool_backward")
#: The kernels of :mod:`sparkavg.ops.norm`: per-channel sums and affine maps of (M, C) rows.
NORM = ("channel_stats", "channel_affine", "channel_sums", "channel_blend", "batchnorm_coefficients")
#: The kernels of :mod:`sparkavg.ops.sequence`: the element-wise work of one LSTM / GRU time step,
#: and the embedding gradient's scatter-add.
SEQUENCE = ("lstm_forward_step", "lstm_backward_step", "gru_forward_step", "gru_backward_step", "scatter_add_rows")
#: Every kernel of the front, in the order the docs list them.
KERNELS = ELEMENTWISE + ENCODING + CONV + NORM + SEQUENCE

_RENAMED = {
    "threshold_encode": "encode_sparse",   # -> (message or None, total qualifying)
    "bitmap_encode": "encode_bitmap",      # -> (message, values sent)
    "threshold_decode": "decode_sparse",   # (encoded, target, count, tau)
    "bitmap_decode": "decode_bitmap",      # (encoded, target, tau)
}


def operation(kernel: str) -> str:
    """The backend operation that runs ``kernel``."""
    return _RENAMED.get(kernel, kernel)


#: The backend operations, one per kernel.
OPERATIONS = tuple(operation(name) for name in KERNELS)
