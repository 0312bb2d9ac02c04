"""The output layer: dense + activation + loss (:mod:`sparkavg.nn.losses`)."""
from __future__ import annotations

import numpy as np

from ..backend import get_array_module
from ..configurable import register
from . import activations
from .layers import Dense
from .losses import (DEFAULT_ACTIVATION, LOSSES, TARGETS, Targets, bce_terms, check_class_weights,
                     check_huber_delta, check_loss, prepare_targets, regression_terms, softplus)

__all__ = ["Output", "LOSSES"]

#: The activation a loss is fused with and cannot do without.
_FUSED = {"nll": "softmax", "bce": "sigmoid"}


@register("layer")
class Output(Dense):
    """The last layer: dense + activation + loss.

    Parameters
    ----------
    units : int
        Classes (``nll``), independent binary labels (``bce``; 1 for a
        binary problem) or regression targets.
    activation : str, optional
        ``softmax`` for ``nll`` and ``sigmoid`` for ``bce`` (required: the
        gradient is fused with the loss and computed from the logits, so it
        is stable); ``identity`` by default for the regression losses.
    loss : {"nll", "bce", "mse", "mae", "huber"}, default "nll"
        :mod:`sparkavg.nn.losses` says what each trains on and computes.
    weight_init : str, default "xavier"
    class_weights : sequence of float, optional
        ``nll``: one weight per class, scaling the loss of a row by its
        label's weight; ``bce``: ``(negative, positive)``, the weights of a
        0 and a 1 label.  For imbalanced classes.
    huber_delta : float, default 1.0
        Where ``huber`` turns from squared to absolute error.

    Labels: for ``nll``, int class indices (N,) or one-hot / probability
    rows (N, units); for the others (N, units), or (N,) when units == 1
    (``bce``: values in [0, 1]).
    """

    def __init__(self, units: int, activation: str | None = None, loss: str = "nll", weight_init: str = "xavier",
                 class_weights=None, huber_delta: float = 1.0):
        check_loss(loss)
        if activation is None:
            activation = DEFAULT_ACTIVATION[loss]
        if loss in _FUSED and activation != _FUSED[loss]:
            raise ValueError(f"Expect activation {_FUSED[loss]!r} with loss {loss!r}, got {activation!r}")
        super().__init__(units, activation, weight_init)
        self.loss_name = loss
        self.class_weights = check_class_weights(loss, class_weights, int(units))
        self.huber_delta = check_huber_delta(huber_delta)
        self._cw = None

    def config_arguments(self):
        args = {"units": self.units, "activation": self.activation, "loss": self.loss_name,
                "weight_init": self.weight_init}
        if self.class_weights is not None:
            args["class_weights"] = list(self.class_weights)
        if self.loss_name == "huber":
            args["huber_delta"] = self.huber_delta
        return args

    def forward(self, x, training):
        z = self._affine(x)
        xp = get_array_module(z)
        if self.loss_name == "nll":
            # Keep the logits for a stable log-likelihood; p = softmax(z).
            self._zmax = z.max(axis=1, keepdims=True)
            p = self._buffer("p", z.shape, z)
            xp.subtract(z, self._zmax, out=p)
            xp.exp(p, out=p)
            self._zsum = p.sum(axis=1, keepdims=True)
            p /= self._zsum
            self._z, self._y = z, p
        elif self.loss_name == "bce":
            # Keep the logits for a stable log-likelihood; p = sigmoid(z).
            p = self._buffer("p", z.shape, z)
            p[...] = z
            self._z, self._y = z, activations.forward("sigmoid", p, self._act_work("sigmoid", p))
        else:
            self._y = activations.forward(self.activation, z, self._act_work(self.activation, z))
        return self._y

    # ----------------------------------------------------------- labels
    def prepare_labels(self, y, n, xp, dtype, weights=None) -> Targets:
        """Check labels (and optional per-row ``weights``) for a batch of
        ``n``: :class:`~sparkavg.nn.losses.Targets` on module ``xp``."""
        return prepare_targets(self.loss_name, y, n, self.units, xp, dtype, weights)

    def _class_weights(self, xp, dtype):
        """The class weights on the device, or None."""
        if self.class_weights is None:
            return None
        if self._cw is None or get_array_module(self._cw) is not xp or self._cw.dtype != dtype:
            self._cw = xp.asarray(np.asarray(self.class_weights), dtype=dtype)
        return self._cw

    # ------------------------------------------------------------- loss
    def loss(self, labels) -> float:
        """Mean loss of the last forward pass against prepared ``labels`` (a
        device -> host sync on CuPy)."""
        total, count = self.loss_sum(labels)
        return float(total) / count

    def loss_sum(self, labels: Targets) -> tuple:
        """``(total, count)``: the summed (weighted) loss of the last forward
        pass as a 0-d array on its device (no host sync) and the divisor that
        makes it the mean, ``float(total) / count`` being :meth:`loss`."""
        kind, y, w = labels
        xp = get_array_module(self._y)
        n = self._y.shape[0]
        cw = self._class_weights(xp, self._y.dtype)
        if self.loss_name == "nll":
            # log p_ij = z_ij - max_i - log(sum_i)
            shift = self._zmax + xp.log(self._zsum)
            if kind == "index":
                rows = shift[:, 0] - self._z[self._rows(n, xp), y]
                factor = _row_factor(cw, y, w)
                return (rows if factor is None else rows * factor).sum(), n
            yw = y if cw is None else y * cw
            return ((yw * (shift - self._z)) if w is None else (yw * (shift - self._z)) * w).sum(), n
        count = n * self.units
        if self.loss_name == "bce":
            a, b = bce_terms(y, self.class_weights, self._y.dtype)
            sp = softplus(self._z, xp)
            elements = (a + b) * sp - a * self._z  # a*softplus(-z) + b*softplus(z)
        elif self.loss_name == "mse" and w is None:
            err = self._y - y
            return (err * err).sum(), count
        else:
            elements, _ = regression_terms(self.loss_name, self._y - y, xp, self.huber_delta)
        return (elements if w is None else elements * w).sum(), count

    def backward_loss(self, labels: Targets, need_dx):
        """Gradient of the mean loss: fills dW, db; returns dL/dx (or None)."""
        kind, y, w = labels
        xp = get_array_module(self._y)
        n = self._y.shape[0]
        dz = self._buffer("dz", self._y.shape, self._y)
        cw = self._class_weights(xp, self._y.dtype)
        if self.loss_name == "nll":
            if kind == "index":
                dz[...] = self._y
                dz[self._rows(n, xp), y] -= 1
                factor = _row_factor(cw, y, w)
                if factor is not None:
                    dz *= factor[:, None]
            else:
                yw = y if cw is None else y * cw
                xp.multiply(self._y, yw.sum(axis=1, keepdims=True), out=dz)
                dz -= yw
                if w is not None:
                    dz *= w
            dz *= dz.dtype.type(1.0 / n)
            return self._affine_backward(dz, need_dx)
        scale = dz.dtype.type(1.0 / (n * self.units))
        if self.loss_name == "bce":
            a, b = bce_terms(y, self.class_weights, self._y.dtype)
            xp.multiply(a + b, self._y, out=dz)  # d/dz [a*softplus(-z) + b*softplus(z)] = (a+b)*p - a
            dz -= a
            if w is not None:
                dz *= w
            dz *= scale
            return self._affine_backward(dz, need_dx)
        if self.loss_name == "mse" and w is None:
            xp.subtract(self._y, y, out=dz)
            dz *= dz.dtype.type(2.0 / (n * self.units))
        else:
            _, grad = regression_terms(self.loss_name, self._y - y, xp, self.huber_delta)
            dz[...] = grad if w is None else grad * w
            dz *= scale
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


def _row_factor(class_weights, labels, row_weights):
    """Each row's weight for index labels: its class's weight times its own
    (``(n,)``), or None when neither is given."""
    factor = None if class_weights is None else class_weights[labels]
    if row_weights is not None:
        factor = row_weights[:, 0] if factor is None else factor * row_weights[:, 0]
    return factor
