"""The element-wise work of one LSTM or GRU time step, after (forward) or
before (backward) the step's recurrent GEMM (:mod:`sparkavg.nn.recurrent`
does the GEMMs):

- :func:`lstm_forward_step`  -- gates' activations, c, tanh(c) and h
- :func:`lstm_backward_step` -- the pre-activation gradients and dc_prev
- :func:`gru_forward_step`   -- gates' activations and h (PyTorch's GRU)
- :func:`gru_backward_step`  -- the pre-activation gradients and z * dh
- :func:`scatter_add_rows`   -- ``out[index] += rows`` with repeats summed (Embedding's gradient)

Rows: (N, G*U) gate arrays (G = 4 or 3 blocks of U columns in PyTorch's
gate order) and (N, U) state arrays, all C-contiguous, one kind and float
dtype.  The Cython kernels (numpy float32) make each call one pass over
its rows, where the xp twins of :mod:`sparkavg.ops.reference_sequence`
(float64, CuPy, or ``SPARKAVG_PURE_NUMPY=1``) take a dozen or two numpy
passes -- which is what a step of a small LSTM is mostly made of.

Each function checks its arguments, then runs where
:mod:`sparkavg.ops._dispatch` routes; arrays marked OUT are written (and
nothing is returned).
"""
from __future__ import annotations

import numpy as np

from ._checks import check_inplace, check_operand
from ._dispatch import call
from ._kernels import SEQUENCE

__all__ = list(SEQUENCE)


def _state(name, a, like, like_name, units):
    return check_operand(name, a, like, like_name, shape=(like.shape[0], units))


def _out(name, a, like, like_name, shape):
    check_inplace(name, a, dtype=like.dtype)
    check_operand(name, a, like, like_name, shape=shape)


def _gates(name, a, gates, inplace=True):
    """``a`` (N, G*U) with G*U a multiple of ``gates``; returns (kind, U)."""
    kind = check_inplace(name, a) if inplace else None
    if a.ndim != 2 or a.shape[1] % gates or a.shape[1] == 0:
        raise ValueError(f"Expect {name} of shape (N, {gates}*units), got shape {a.shape}")
    return kind, a.shape[1] // gates


def lstm_forward_step(z, rec, c_prev, c, tc, h):
    """One LSTM step after the GEMMs.

    Parameters
    ----------
    z : float32/float64 array (N, 4U), numpy or CuPy
        IN ``x W + b``; OUT the activations of the gates input, forget,
        cell, output (sigmoid, sigmoid, tanh, sigmoid of ``z + rec``).
    rec : array (N, 4U)
        IN ``h_prev @ RW``.
    c_prev : array (N, U)
        IN the previous cell state.
    c, tc, h : arrays (N, U)
        OUT ``c = f * c_prev + i * g``, ``tc = tanh(c)``, ``h = o * tc``.
    """
    kind, u = _gates("z", z, 4)
    rec = check_operand("rec", rec, z, "z")
    c_prev = _state("c_prev", c_prev, z, "z", u)
    for name, a in (("c", c), ("tc", tc), ("h", h)):
        _out(name, a, z, "z", (z.shape[0], u))
    call("lstm_forward_step", kind, z.dtype, z, rec, c_prev, c, tc, h)


def lstm_backward_step(a, c_prev, tc, dh, dc, dz):
    """One LSTM step back, before the GEMMs.

    Parameters
    ----------
    a : float32/float64 array (N, 4U)
        IN the gates' activations i, f, g, o of the step.
    c_prev, tc : arrays (N, U)
        IN the previous cell state and ``tanh(c)`` of the step.
    dh : array (N, U)
        IN dL/dh of the step (its output's and the next step's).
    dc : array (N, U)
        IN dL/dc from the next step; OUT dL/dc_prev (``f`` times the total).
    dz : array (N, 4U)
        OUT dL/d(pre-activations).
    """
    _, u = _gates("a", a, 4, inplace=False)
    kind = check_inplace("dc", dc, dtype=a.dtype)
    a = check_operand("a", a, dc, "dc", shape=a.shape)
    c_prev, tc, dh = (_state(name, v, a, "a", u) for name, v in (("c_prev", c_prev), ("tc", tc), ("dh", dh)))
    _state("dc", dc, a, "a", u)
    _out("dz", dz, a, "a", a.shape)
    call("lstm_backward_step", kind, a.dtype, a, c_prev, tc, dh, dc, dz)


def gru_forward_step(z, rec, rb, h_prev, hn, h):
    """One GRU step (PyTorch's form) after the GEMMs.

    Parameters
    ----------
    z : float32/float64 array (N, 3U)
        IN ``x W + b``; OUT the activations of the gates reset, update, new.
    rec : array (N, 3U)
        IN ``h_prev @ RW``.
    rb : array (U,)
        IN the new gate's recurrent bias.
    h_prev : array (N, U)
        IN the previous state.
    hn, h : arrays (N, U)
        OUT ``hn = h_prev RW_n + rb`` (kept for the backward step) and
        ``h = n + z * (h_prev - n)``.
    """
    kind, u = _gates("z", z, 3)
    rec = check_operand("rec", rec, z, "z")
    rb = check_operand("rb", rb, z, "z", shape=(u,))
    h_prev = _state("h_prev", h_prev, z, "z", u)
    _out("hn", hn, z, "z", (z.shape[0], u))
    _out("h", h, z, "z", (z.shape[0], u))
    call("gru_forward_step", kind, z.dtype, z, rec, rb, h_prev, hn, h)


def gru_backward_step(a, hn, h_prev, dh, dz, dz_rec):
    """One GRU step back, before the GEMMs.

    Parameters
    ----------
    a : float32/float64 array (N, 3U)
        IN the gates' activations r, z, n of the step.
    hn, h_prev : arrays (N, U)
        IN as :func:`gru_forward_step` left them, and the previous state.
    dh : array (N, U)
        IN dL/dh of the step; OUT its direct part of dL/dh_prev, ``z * dh``.
    dz : array (N, 3U)
        OUT dL/d(x W + b).
    dz_rec : array (N, 3U)
        OUT dL/d(h_prev RW): ``dz`` with the new gate's block times r.
    """
    _, u = _gates("a", a, 3, inplace=False)
    kind = check_inplace("dh", dh, dtype=a.dtype)
    a = check_operand("a", a, dh, "dh", shape=a.shape)
    hn, h_prev = (_state(name, v, a, "a", u) for name, v in (("hn", hn), ("h_prev", h_prev)))
    _state("dh", dh, a, "a", u)
    _out("dz", dz, a, "a", a.shape)
    _out("dz_rec", dz_rec, a, "a", a.shape)
    call("gru_backward_step", kind, a.dtype, a, hn, h_prev, dh, dz, dz_rec)


def scatter_add_rows(index, rows, out):
    """``out[index[k]] += rows[k]`` for every k, repeated indices summed:
    an embedding's weight gradient (``np.add.at(out, index, rows)``, whose
    numpy implementation is some 50x slower than one pass).

    Parameters
    ----------
    index : int64 array (M,), numpy or CuPy
        Rows of ``out``, each in [0, V).
    rows : float32/float64 array (M, D)
    out : array (V, D) of rows' dtype
        IN/OUT, accumulated into (zero it first for a plain scatter).
    """
    kind = check_inplace("out", out)
    if out.ndim != 2:
        raise ValueError(f"Expect out of shape (V, D), got shape {out.shape}")
    if getattr(index, "ndim", None) != 1:
        raise ValueError(f"Expect index of shape (M,), got shape {getattr(index, 'shape', None)}")
    index = check_operand("index", index, out, "out", shape=index.shape, dtype=np.int64)
    m = index.shape[0]
    rows = check_operand("rows", rows, out, "out", shape=(m, out.shape[1]))
    if m:
        lo, hi = int(index.min()), int(index.max())  # device -> host sync on CuPy
        if lo < 0 or hi >= out.shape[0]:
            bad = lo if lo < 0 else hi
            raise ValueError(f"Expect index values in [0, {out.shape[0]}), got {bad}")
    call("scatter_add_rows", kind, out.dtype, index, rows, out)
