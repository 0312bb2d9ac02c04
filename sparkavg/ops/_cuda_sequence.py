"""The LSTM step on CuPy arrays: raw CUDA kernels
(``sparkavg/ops/cuda_src/rnn.cu``), one launch per step and direction.

The xp twin (:mod:`sparkavg.ops.reference_sequence`) takes a CuPy launch
per operation of a step, so a sequence cost launches in proportion to its
steps whatever the batch.  Same signatures and results as the twin; the GRU steps and the embedding's scatter-add still
run the twins.  The ``_``-prefixed functions take a launcher (see
:mod:`sparkavg.ops.cuda_src`), which is how the tests run the same glue
and kernel bodies on the CPU.
"""
from __future__ import annotations

from .cuda_src import device, index_type
from .reference_sequence import gru_backward_step, gru_forward_step, scatter_add_rows  # noqa: F401

__all__ = ["lstm_forward_step", "lstm_backward_step", "gru_forward_step", "gru_backward_step",
           "scatter_add_rows"]

_FILE = "rnn"


def _lstm_forward_step(launcher, z, rec, c_prev, c, tc, h):
    n, u = c.shape
    index = index_type(z.size)
    launcher.launch(_FILE, "sparkavg_lstm_forward_step", z.dtype, index, n * u,
                    (z, rec, c_prev, c, tc, h, index(n * u), index(u)))


def _lstm_backward_step(launcher, a, c_prev, tc, dh, dc, dz):
    n, u = tc.shape
    index = index_type(a.size)
    launcher.launch(_FILE, "sparkavg_lstm_backward_step", a.dtype, index, n * u,
                    (a, c_prev, tc, dh, dc, dz, index(n * u), index(u)))


# ------------------------------------------------------- the device backend
def lstm_forward_step(z, rec, c_prev, c, tc, h):
    """See :func:`sparkavg.ops.sequence.lstm_forward_step`; C-contiguous CuPy arrays."""
    _lstm_forward_step(device(), z, rec, c_prev, c, tc, h)


def lstm_backward_step(a, c_prev, tc, dh, dc, dz):
    """See :func:`sparkavg.ops.sequence.lstm_backward_step`; C-contiguous CuPy arrays."""
    _lstm_backward_step(device(), a, c_prev, tc, dh, dc, dz)
