"""xp-generic (numpy or CuPy) twins of the recurrent step kernels and the
embedding gradient's scatter-add: the oracle the Cython kernels are held
to, the path of float64 arrays, and what CuPy arrays run.

One call is one time step of one direction for a batch of N rows and U
units; arrays are C-contiguous (N, G*U) gate rows (gate blocks of U
columns, PyTorch's order) and (N, U) state rows.  The GEMMs around a step
(the input projection of all steps, the recurrent ``h @ RW``) are the
layer's; these kernels do the element-wise rest in one pass (Cython) or a
few xp operations (here).  Re-exported by :mod:`sparkavg.ops.reference`.
"""
from __future__ import annotations

from ..backend import get_array_module
from ._kernels import SEQUENCE

__all__ = list(SEQUENCE)


def _sigmoid_(a):
    """sigmoid in place, as 0.5 * (1 + tanh(a / 2)) (cannot overflow)."""
    xp = get_array_module(a)
    half = a.dtype.type(0.5)
    a *= half
    xp.tanh(a, out=a)
    a *= half
    a += half
    return a


def lstm_forward_step(z, rec, c_prev, c, tc, h):
    """One LSTM step after the GEMMs.

    z : (N, 4U) IN x W + b, OUT the gates' activations i, f, g, o
        (sigmoid, sigmoid, tanh, sigmoid of z + rec)
    rec : (N, 4U) IN h_prev @ RW
    c_prev : (N, U) IN the previous cell state
    c, tc, h : (N, U) OUT the cell state f*c_prev + i*g, tanh(c), and h = o*tanh(c)
    """
    xp = get_array_module(z)
    u = c.shape[1]
    z += rec
    _sigmoid_(z[:, :2 * u])
    xp.tanh(z[:, 2 * u:3 * u], out=z[:, 2 * u:3 * u])
    _sigmoid_(z[:, 3 * u:])
    i, f, g, o = z[:, :u], z[:, u:2 * u], z[:, 2 * u:3 * u], z[:, 3 * u:]
    xp.multiply(f, c_prev, out=c)
    c += i * g
    xp.tanh(c, out=tc)
    xp.multiply(o, tc, out=h)


def lstm_backward_step(a, c_prev, tc, dh, dc, dz):
    """One LSTM step back, before the GEMMs.

    a : (N, 4U) IN the gates' activations i, f, g, o
    c_prev, tc : (N, U) IN the previous cell state and tanh of this step's
    dh : (N, U) IN dL/dh of this step (from the output and the next step)
    dc : (N, U) IN dL/dc from the next step; OUT dL/dc_prev = f * dL/dc (total)
    dz : (N, 4U) OUT dL/d(pre-activations)
    """
    one = a.dtype.type(1)
    u = tc.shape[1]
    i, f, g, o = a[:, :u], a[:, u:2 * u], a[:, 2 * u:3 * u], a[:, 3 * u:]
    dc += dh * o * (one - tc * tc)
    dz[:, :u] = dc * g * i * (one - i)
    dz[:, u:2 * u] = dc * c_prev * f * (one - f)
    dz[:, 2 * u:3 * u] = dc * i * (one - g * g)
    dz[:, 3 * u:] = dh * tc * o * (one - o)
    dc *= f


def gru_forward_step(z, rec, rb, h_prev, hn, h):
    """One GRU step (PyTorch's form) after the GEMMs.

    z : (N, 3U) IN x W + b; OUT the gates' activations r, z, n
    rec : (N, 3U) IN h_prev @ RW
    rb : (U,) IN the new gate's recurrent bias
    h_prev : (N, U) IN
    hn, h : (N, U) OUT h_prev RW_n + rb, and h = n + z * (h_prev - n)
    """
    xp = get_array_module(z)
    u = h.shape[1]
    z[:, :2 * u] += rec[:, :2 * u]
    _sigmoid_(z[:, :2 * u])
    xp.add(rec[:, 2 * u:], rb, out=hn)
    n = z[:, 2 * u:]
    n += z[:, :u] * hn
    xp.tanh(n, out=n)
    xp.subtract(h_prev, n, out=h)
    h *= z[:, u:2 * u]
    h += n


def gru_backward_step(a, hn, h_prev, dh, dz, dz_rec):
    """One GRU step back, before the GEMMs.

    a : (N, 3U) IN the gates' activations r, z, n
    hn, h_prev : (N, U) IN
    dh : (N, U) IN dL/dh of this step; OUT its direct part of dL/dh_prev, z * dh
    dz : (N, 3U) OUT dL/d(x W + b) per gate
    dz_rec : (N, 3U) OUT dL/d(h_prev RW) per gate (the new gate's is r times its dz)
    """
    one = a.dtype.type(1)
    u = hn.shape[1]
    r, zg, n = a[:, :u], a[:, u:2 * u], a[:, 2 * u:]
    dn = dh * (one - zg) * (one - n * n)
    dz[:, 2 * u:] = dn
    dz[:, :u] = dn * hn * r * (one - r)
    dz[:, u:2 * u] = dh * (h_prev - n) * zg * (one - zg)
    dz_rec[:, :2 * u] = dz[:, :2 * u]
    dz_rec[:, 2 * u:] = dn * r
    dh *= zg


def scatter_add_rows(index, rows, out):
    """``out[index[k]] += rows[k]`` for every k, repeated indices summed
    (an embedding's gradient).

    index : int64 (M,) IN row numbers of ``out``, in range
    rows : (M, D) IN
    out : (V, D) IN/OUT
    """
    get_array_module(out).add.at(out, index, rows)
