"""Recurrent layers: :class:`LSTM` and :class:`GRU`.

Shapes.  A layer takes a sequence, user shape (T, F) (internal arrays
(N, T, F), batch first), and returns the whole output sequence (T, units)
when ``return_sequences`` is true, else the last step's output (units,).

Layout of the work.  Inside, time runs along the first axis: the input is
copied once into (T, N, F), and the input projection of every step is one
GEMM, ``x (T*N, F) @ W (F, G*units) + b`` (G = 4 gates for the LSTM, 3 for
the GRU).  Each step then costs one recurrent GEMM ``h (N, units) @ RW``
plus the gates' element-wise work, fused in one kernel per step and
direction (:mod:`sparkavg.ops.sequence`: Cython for numpy float32, the
xp-generic twins otherwise).  Back-propagation through time runs the
steps in reverse with the same structure and leaves the weight gradients
to three GEMMs over all steps at once: ``dW = x^T dZ``, ``dRW = h_prev^T dZ``
and ``db = 1^T dZ``, and the input gradient to one, ``dx = dZ W^T``.

Gate order in the parameter columns is PyTorch's (LSTM: input, forget,
cell, output; GRU: reset, update, new), so ``W`` is ``weight_ih_l0.T`` and
``RW`` is ``weight_hh_l0.T``.

Masking (padded, variable-length sequences).  With ``mask_value`` set, a
time step of an example whose features ALL equal ``mask_value`` is
skipped: the state (h, and c for the LSTM) is carried through it
unchanged, its output in the sequence is zero, and the last-step output
is the state after the last unmasked step (the last valid step of a
right-padded sequence).  Masked steps get a zero input gradient and add
nothing to the parameter gradients.  Since masked outputs are zero, a
second recurrent layer with ``mask_value=0.0`` skips the same steps, and
an :class:`~sparkavg.nn.embedding.Embedding` with ``padding_id`` feeds
all-zero vectors for padding ids, which ``mask_value=0.0`` recognises.
"""
from __future__ import annotations

import math

import numpy as np

from ..backend import get_array_module
from ..configurable import register
from ..ops.elementwise import unchecked
from .initializers import WEIGHT_INITS, init_weights
from .layers import Layer, ParamSpec, _contiguous, _positive_int

__all__ = ["LSTM", "GRU", "SEQUENCE_INITS", "orthogonal"]

#: Schemes for the recurrent weights: ``orthogonal`` or a weight init.
SEQUENCE_INITS = ("orthogonal",) + WEIGHT_INITS


def orthogonal(n: int, rng: np.random.Generator) -> np.ndarray:
    """A float64 (n, n) orthogonal matrix, Haar distributed (QR of a
    Gaussian matrix with the signs of R's diagonal folded into Q)."""
    q, r = np.linalg.qr(rng.standard_normal((n, n)))
    return q * np.where(np.diag(r) < 0, -1.0, 1.0)


def _check_mask_value(value):
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) \
            or not math.isfinite(value):
        raise ValueError(f"Expect mask_value as a finite float or None, got {value!r}")
    return float(value)


class _Recurrent(Layer):
    """What LSTM and GRU share: configuration, parameters, masks, layouts."""

    #: Gates per unit (columns of W and RW per unit).
    GATES = 0

    def __init__(self, units, return_sequences, mask_value, weight_init, recurrent_init):
        super().__init__()
        self.units = _positive_int("units", units)
        if not isinstance(return_sequences, (bool, np.bool_)):
            raise ValueError(f"Expect return_sequences as a bool, got {return_sequences!r}")
        self.return_sequences = bool(return_sequences)
        self.mask_value = _check_mask_value(mask_value)
        if weight_init not in WEIGHT_INITS:
            raise ValueError(f"Expect weight_init in {WEIGHT_INITS}, got {weight_init!r}")
        if recurrent_init not in SEQUENCE_INITS:
            raise ValueError(f"Expect recurrent_init in {SEQUENCE_INITS}, got {recurrent_init!r}")
        self.weight_init, self.recurrent_init = weight_init, recurrent_init
        self.W = self.RW = self.b = self.dW = self.dRW = self.db = None

    def config_arguments(self):
        return {"units": self.units, "return_sequences": self.return_sequences, "mask_value": self.mask_value,
                "weight_init": self.weight_init, "recurrent_init": self.recurrent_init}

    def build(self, input_shape):
        if len(input_shape) != 2:
            raise ValueError(f"Expect a (T, F) sequence input to {type(self).__name__}, got shape "
                             f"{tuple(input_shape)}")
        self.input_shape = tuple(input_shape)
        t = input_shape[0]
        self.output_shape = (t, self.units) if self.return_sequences else (self.units,)
        return self.output_shape

    def param_specs(self):
        f, u, g = self.input_shape[1], self.units, self.GATES
        return [ParamSpec("W", (f, g * u), True), ParamSpec("b", (g * u,), False), ParamSpec("RW", (u, g * u), True)]

    def initial_value(self, spec, rng):
        f, u, g = self.input_shape[1], self.units, self.GATES
        if spec.name == "W":  # each gate as a Dense layer F -> units
            return np.concatenate([init_weights(self.weight_init, (f, u), f, u, rng) for _ in range(g)], axis=1)
        if spec.name == "RW":
            if self.recurrent_init == "orthogonal":
                return np.concatenate([orthogonal(u, rng) for _ in range(g)], axis=1)
            return np.concatenate([init_weights(self.recurrent_init, (u, u), u, u, rng) for _ in range(g)], axis=1)
        return np.zeros(spec.shape)

    def bind(self, params, grads):
        super().bind(params, grads)
        p, gr = self._split(params), self._split(grads)
        self.W, self.RW, self.b = p["W"], p["RW"], p["b"]
        self.dW, self.dRW, self.db = gr["W"], gr["RW"], gr["b"]
        # W (F, G*U) is followed by b (G*U,) in the flat vector: the block is
        # the (F+1, G*U) matrix [W; b], and with a ones column in the input
        # one GEMM gives the projection with its bias, and one dW with db.
        f, gu = self.W.shape
        self._Wb = params[:(f + 1) * gu].reshape(f + 1, gu)
        self._dWb = grads[:(f + 1) * gu].reshape(f + 1, gu)
        return p, gr

    # ------------------------------------------------------------ helpers
    def _time_major(self, x):
        """(N, T, F) -> a (T, N, F+1) work copy, the last column ones."""
        n, t, f = x.shape
        xt = self._buffer("xt", (t, n, f + 1), x)
        xt[:, :, :f] = x.transpose(1, 0, 2)
        xt[:, :, f] = 1
        return xt

    def _keep(self, x):
        """(T, N, 1) boolean: the steps that are NOT masked (None without a mask)."""
        if self.mask_value is None:
            return None
        xp = get_array_module(x)
        masked = xp.all(x == x.dtype.type(self.mask_value), axis=2)  # (N, T)
        return xp.ascontiguousarray(~masked.T)[:, :, None]

    def _start(self, x, gate_blocks):
        """What both cells' forward passes begin with: ``x`` contiguous, its
        mask, the time-major work copy, every step's input projection into
        ``gate_blocks * units`` columns, and the states' buffer (T+1, N, U)
        with the initial zeros."""
        x = _contiguous(x)
        n, t, _ = x.shape
        xt = self._time_major(x)
        gates = self._projection(xt, self._buffer("gates", (t, n, gate_blocks * self.units), x))
        h = self._buffer("h", (t + 1, n, self.units), x)
        h[0].fill(0)
        return x, self._keep(x), xt, gates, h

    def _projection(self, xt, out):
        """out (T, N, G*U) = [x 1] (T, N, F+1) @ [W; b]: every step's input part at once."""
        t, n, f1 = xt.shape
        get_array_module(xt).matmul(xt.reshape(t * n, f1), self._Wb, out=out.reshape(t * n, -1))
        return out

    def _output(self, states, keep):
        """The layer's output from the states (T+1, N, U) (states[0] the initial zeros)."""
        if not self.return_sequences:
            return states[-1]
        t, n, u = states.shape[0] - 1, states.shape[1], states.shape[2]
        y = self._buffer("y", (n, t, u), states)
        y[...] = states[1:].transpose(1, 0, 2)
        if keep is not None:
            y *= keep.transpose(1, 0, 2)
        return y

    def _step_dy(self, dy, t, keep, into):
        """Add the output gradient of step t to ``into`` (N, U) (a masked step's output is constant)."""
        if not self.return_sequences:
            return
        if keep is None:
            into += dy[:, t]
        else:
            into += dy[:, t] * keep[t]

    def _rw_transposed(self, like):
        """A C-contiguous copy of RW^T (G*U, U) for the backward steps' GEMMs:
        OpenBLAS multiplies by it 2.7x faster than by the transposed view
        (64x512 @ 512x128, one thread: 71 against 196 us)."""
        rw_t = self._buffer("rw_t", self.RW.shape[::-1], like)
        rw_t[...] = self.RW.T
        return rw_t

    def _weight_grads(self, xt, h_prev, dz, dz_rec=None):
        """dW, dRW, db from all steps at once; dz (T, N, G*U) is the
        gradient of the pre-activations, ``dz_rec`` the one the recurrent
        GEMM saw (the GRU's differs in its new-gate columns)."""
        xp = get_array_module(dz)
        t, n, f1 = xt.shape
        dz2 = dz.reshape(t * n, -1)
        rec2 = dz2 if dz_rec is None else dz_rec.reshape(t * n, -1)
        xp.matmul(xt.reshape(t * n, f1).T, dz2, out=self._dWb)
        xp.matmul(h_prev.reshape(t * n, -1).T, rec2, out=self.dRW)

    def _input_grad(self, dz, n):
        """dx (N, T, F) = dz (T, N, G*U) @ W^T, back in batch-first order."""
        xp = get_array_module(dz)
        t = dz.shape[0]
        f = self.W.shape[0]
        dxt = self._buffer("dxt", (t, n, f), dz)
        xp.matmul(dz.reshape(t * n, -1), self.W.T, out=dxt.reshape(t * n, f))
        dx = self._buffer("dx", (n, t, f), dz)
        dx[...] = dxt.transpose(1, 0, 2)
        return dx


@register("layer")
class LSTM(_Recurrent):
    """Long short-term memory (Hochreiter & Schmidhuber 1997, with a forget
    gate; no peepholes -- DL4J's ``LSTM``, PyTorch's ``nn.LSTM``)::

        i, f, g, o = sig(x W_i + h R_i + b_i), sig(.. f ..), tanh(.. g ..), sig(.. o ..)
        c' = f * c + i * g
        h' = o * tanh(c')

    The state starts at zero for every sequence.

    Parameters
    ----------
    units : int
        Size of h and c.
    return_sequences : bool, default False
        Output every step's h, (T, units), or only the last, (units,).
    mask_value : float or None, default None
        Steps whose features all equal it are skipped (see the module doc).
    forget_bias : float, default 1.0
        Initial bias of the forget gate (DL4J's ``forgetGateBiasInit``);
        the other biases start at 0.
    weight_init : str, default 'xavier'
        Input weights, each gate as a Dense layer F -> units.
    recurrent_init : str, default 'orthogonal'
        Recurrent weights: an orthogonal (units, units) block per gate, or
        a weight init with fan_in = fan_out = units.

    Notes
    -----
    Parameters in the flat vector: W (F, 4*units), b (4*units,), RW
    (units, 4*units); columns in gate order input, forget, cell, output.
    """

    GATES = 4

    def __init__(self, units: int, return_sequences: bool = False, mask_value: float | None = None,
                 forget_bias: float = 1.0, weight_init: str = "xavier", recurrent_init: str = "orthogonal"):
        super().__init__(units, return_sequences, mask_value, weight_init, recurrent_init)
        if isinstance(forget_bias, bool) or not isinstance(forget_bias, (int, float)) \
                or not math.isfinite(forget_bias):
            raise ValueError(f"Expect forget_bias as a finite float, got {forget_bias!r}")
        self.forget_bias = float(forget_bias)

    def config_arguments(self):
        args = super().config_arguments()
        args["forget_bias"] = self.forget_bias
        return args

    def initial_value(self, spec, rng):
        value = super().initial_value(spec, rng)
        if spec.name == "b":
            u = self.units
            value[u:2 * u] = self.forget_bias
        return value

    def forward(self, x, training):
        xp = get_array_module(x)
        x, keep, xt, gates, h = self._start(x, 4)
        n, t, _ = x.shape
        u = self.units
        c = self._buffer("c", (t + 1, n, u), x)
        tc = self._buffer("tc", (t, n, u), x)
        rec = self._buffer("rec", (n, 4 * u), x)
        c[0].fill(0)
        rec.fill(0)  # h[0] @ RW
        for s in range(t):
            if s:
                xp.matmul(h[s], self.RW, out=rec)
            unchecked("lstm_forward_step", x, gates[s], rec, c[s], c[s + 1], tc[s], h[s + 1])
            if keep is not None:
                xp.copyto(c[s + 1], c[s], where=~keep[s])
                xp.copyto(h[s + 1], h[s], where=~keep[s])
        self._saved = xt, keep, gates, h, c, tc
        return self._output(h, keep)

    def backward(self, dy, need_dx):
        xp = get_array_module(dy)
        xt, keep, gates, h, c, tc = self._saved
        t, n, _ = xt.shape
        u = self.units
        dz = self._buffer("dz", (t, n, 4 * u), dy)
        dh = self._buffer("dh", (n, u), dy)
        dc = self._buffer("dc", (n, u), dy)
        dc.fill(0)
        rw_t = self._rw_transposed(dy)
        if self.return_sequences:
            dh.fill(0)
        else:
            dh[...] = dy
        if keep is not None:
            skip_h, skip_c = self._buffer("skip_h", (n, u), dy), self._buffer("skip_c", (n, u), dy)
        for s in range(t - 1, -1, -1):
            self._step_dy(dy, s, keep, dh)
            if keep is not None:  # a masked step passes dh and dc through unchanged
                xp.multiply(dh, ~keep[s], out=skip_h)
                xp.multiply(dc, ~keep[s], out=skip_c)
            unchecked("lstm_backward_step", dy, gates[s], c[s], tc[s], dh, dc, dz[s])
            if keep is not None:
                dz[s] *= keep[s]
                dc *= keep[s]
                dc += skip_c
            if s:
                xp.matmul(dz[s], rw_t, out=dh)
                if keep is not None:
                    dh += skip_h
        self._weight_grads(xt, h[:t], dz)
        return self._input_grad(dz, n) if need_dx else None


@register("layer")
class GRU(_Recurrent):
    """Gated recurrent unit (Cho et al. 2014) in the form of PyTorch's
    ``nn.GRU`` and cuDNN (Keras' ``reset_after=True``)::

        r = sig(x W_r + h R_r + b_r)
        z = sig(x W_z + h R_z + b_z)
        n = tanh(x W_n + b_n + r * (h R_n + rb))
        h' = (1 - z) * n + z * h

    The state starts at zero for every sequence.

    Parameters
    ----------
    units, return_sequences, mask_value, weight_init, recurrent_init
        As :class:`LSTM`.

    Notes
    -----
    Parameters in the flat vector: W (F, 3*units), b (3*units,), RW
    (units, 3*units), rb (units,) (the recurrent bias of the new gate, inside
    the reset product: PyTorch's ``bias_hh_l0[2*units:]``; its other two
    thirds add to ``b``).  Columns in gate order reset, update, new; all
    biases start at 0.
    """

    GATES = 3

    def __init__(self, units: int, return_sequences: bool = False, mask_value: float | None = None,
                 weight_init: str = "xavier", recurrent_init: str = "orthogonal"):
        super().__init__(units, return_sequences, mask_value, weight_init, recurrent_init)
        self.rb = self.drb = None

    def param_specs(self):
        return super().param_specs() + [ParamSpec("rb", (self.units,), False)]

    def bind(self, params, grads):
        p, g = super().bind(params, grads)
        self.rb, self.drb = p["rb"], g["rb"]

    def forward(self, x, training):
        xp = get_array_module(x)
        x, keep, xt, gates, h = self._start(x, 3)
        n, t, _ = x.shape
        u = self.units
        hn = self._buffer("hn", (t, n, u), x)
        rec = self._buffer("rec", (n, 3 * u), x)
        for s in range(t):
            if s:
                xp.matmul(h[s], self.RW, out=rec)
            else:
                rec.fill(0)
            unchecked("gru_forward_step", x, gates[s], rec, self.rb, h[s], hn[s], h[s + 1])
            if keep is not None:
                xp.copyto(h[s + 1], h[s], where=~keep[s])
        self._saved = xt, keep, gates, h, hn
        return self._output(h, keep)

    def backward(self, dy, need_dx):
        xp = get_array_module(dy)
        xt, keep, gates, h, hn = self._saved
        t, n, _ = xt.shape
        u = self.units
        dz = self._buffer("dz", (t, n, 3 * u), dy)
        dz_rec = self._buffer("dz_rec", (t, n, 3 * u), dy)
        dh = self._buffer("dh", (n, u), dy)
        if self.return_sequences:
            dh.fill(0)
        else:
            dh[...] = dy
        rw_t = self._rw_transposed(dy)
        if keep is not None:
            skip_h = self._buffer("skip_h", (n, u), dy)
        for s in range(t - 1, -1, -1):
            self._step_dy(dy, s, keep, dh)
            if keep is not None:
                xp.multiply(dh, ~keep[s], out=skip_h)
            # dh becomes the direct part of dh_prev, z * dh
            unchecked("gru_backward_step", dy, gates[s], hn[s], h[s], dh, dz[s], dz_rec[s])
            if keep is not None:
                dz[s] *= keep[s]
                dz_rec[s] *= keep[s]
                dh *= keep[s]
                dh += skip_h
            if s:
                dh += xp.matmul(dz_rec[s], rw_t, out=self._buffer("dh_rec", (n, u), dy))
        self._weight_grads(xt, h[:t], dz, dz_rec)
        xp.matmul(self._ones(t * n, dy), dz_rec.reshape(t * n, 3 * u)[:, 2 * u:], out=self.drb)
        return self._input_grad(dz, n) if need_dx else None
