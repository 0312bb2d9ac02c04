"""The output layer: dense + activation + loss (softmax NLL or MSE)."""
from __future__ import annotations

import numpy as np

from ..backend import get_array_module
from ..configurable import register
from . import activations
from .layers import Dense

__all__ = ["Output", "LOSSES"]

LOSSES = ("nll", "mse")


@register("layer")
class Output(Dense):
    """The last layer: dense + activation + loss.

    ``loss='nll'`` (negative log-likelihood, i.e. multi-class cross-entropy)
    needs ``activation='softmax'`` (the default for it); the gradient
    ``(p - y) / N`` is fused and computed from log-sum-exp, so it is stable.
    ``loss='mse'`` (regression; mean over batch and units of the squared
    error, DL4J's LossMSE) defaults to ``activation='identity'``.

    Labels: for nll, int class indices (N,) or one-hot / probability rows
    (N, units); for mse, targets (N, units), or (N,) when units == 1.
    """

    def __init__(self, units: int, activation: str | None = None, loss: str = "nll", weight_init: str = "xavier"):
        if loss not in LOSSES:
            raise ValueError(f"Expect loss in {LOSSES}, got {loss!r}")
        if activation is None:
            activation = "softmax" if loss == "nll" else "identity"
        if loss == "nll" and activation != "softmax":
            raise ValueError(f"Expect activation 'softmax' with loss 'nll', got {activation!r}")
        super().__init__(units, activation, weight_init)
        self.loss_name = loss

    def config_arguments(self):
        return {"units": self.units, "activation": self.activation, "loss": self.loss_name,
                "weight_init": self.weight_init}

    def forward(self, x, training):
        z = self._affine(x)
        if self.loss_name == "nll":
            # Keep the logits for a stable log-likelihood; p = softmax(z).
            xp = get_array_module(z)
            self._zmax = z.max(axis=1, keepdims=True)
            p = self._buffer("p", z.shape, z)
            xp.subtract(z, self._zmax, out=p)
            xp.exp(p, out=p)
            self._zsum = p.sum(axis=1, keepdims=True)
            p /= self._zsum
            self._z, self._y = z, p
        else:
            self._y = activations.forward(self.activation, z, self._act_work(self.activation, z))
        return self._y

    # ----------------------------------------------------------- labels
    def prepare_labels(self, y, n, xp, dtype):
        """Validate labels for a batch of ``n``; return ('index', int array) or
        ('dense', float array of shape (n, units)) on module ``xp``."""
        k = self.units
        shape = tuple(getattr(y, "shape", np.shape(y)))
        if self.loss_name == "nll":
            expected = f"({n},) class indices or ({n}, {k}) one-hot rows"
            if shape == (n, k):
                return "dense", xp.asarray(y, dtype=dtype)
            if shape == (n,):
                labels = xp.asarray(y)
                if labels.dtype.kind == "f":
                    if n and not bool((labels == xp.floor(labels)).all()):  # device -> host sync
                        raise ValueError("Expect integer class labels, got non-integral floats")
                elif labels.dtype.kind not in "iu":
                    raise ValueError(f"Expect integer class labels, got dtype {labels.dtype}")
                labels = labels.astype(xp.int64, copy=False)
                if n:
                    lo, hi = int(labels.min()), int(labels.max())  # device -> host sync
                    if lo < 0 or hi >= k:
                        raise ValueError(f"Expect class labels in [0, {k}), got values from {lo} to {hi}")
                return "index", labels
        else:
            expected = f"({n}, {k})" + (f" or ({n},)" if k == 1 else "")
            if shape == (n, k) or (k == 1 and shape == (n,)):
                return "dense", xp.asarray(y, dtype=dtype).reshape(n, k)
        raise ValueError(f"Expect labels of shape {expected}, got {shape}")

    # ------------------------------------------------------------- loss
    def loss(self, labels) -> float:
        """Mean loss of the last forward pass against prepared ``labels`` (a
        device -> host sync on CuPy)."""
        total, count = self.loss_sum(labels)
        return float(total) / count

    def loss_sum(self, labels) -> tuple:
        """``(total, count)``: the summed loss of the last forward pass as a
        0-d array on its device (no host sync) and the divisor that makes it
        the mean, ``float(total) / count`` being :meth:`loss`."""
        kind, y = labels
        xp = get_array_module(self._y)
        n = self._y.shape[0]
        if self.loss_name == "mse":
            err = self._y - y
            return (err * err).sum(), n * self.units
        # log p_ij = z_ij - max_i - log(sum_i)
        shift = self._zmax + xp.log(self._zsum)
        if kind == "index":
            return (shift[:, 0] - self._z[self._rows(n, xp), y]).sum(), n
        return (y * (shift - self._z)).sum(), n

    def backward_loss(self, labels, need_dx):
        """Gradient of the mean loss: fills dW, db; returns dL/dx (or None)."""
        kind, y = labels
        xp = get_array_module(self._y)
        n = self._y.shape[0]
        dz = self._buffer("dz", self._y.shape, self._y)
        if self.loss_name == "nll":
            if kind == "index":
                dz[...] = self._y
                dz[self._rows(n, xp), y] -= 1
            else:
                xp.multiply(self._y, y.sum(axis=1, keepdims=True), out=dz)
                dz -= y
            dz *= dz.dtype.type(1.0 / n)
        else:
            xp.subtract(self._y, y, out=dz)
            dz *= dz.dtype.type(2.0 / (n * self.units))
            activations.backward(self.activation, dz, self._y, self._act_work(self.activation, dz))
        return self._affine_backward(dz, need_dx)

    def _rows(self, n, xp):
        """``xp.arange(n)``, kept between steps (picks each row's label)."""
        key = ("rows", n)
        rows = self._ws.get(key)
        if rows is None:
            rows = self._ws[key] = xp.arange(n)
        return rows

    def backward(self, dy, need_dx):  # pragma: no cover - the network calls backward_loss
        raise TypeError("Output.backward_loss(labels, need_dx) starts back-propagation")
