"""Normalisation layers: :class:`BatchNorm` and :class:`LayerNorm`.

Both follow the layer contract of :mod:`sparkavg.nn.layers` (NCHW shapes
for users, channels-last arrays inside, parameters and gradients as views
of the model's flat vectors, work buffers reused between steps).  Both
keep the centred input ``xc = x - mean`` and the per-row/per-channel
``1 / sqrt(var + eps)`` of the last training forward for ``backward``,
and write outputs and input gradients with ``out=`` arguments, so that a
step allocates nothing but a few (C,)-sized vectors.
"""
from __future__ import annotations

import math

import numpy as np

from ..backend import get_array_module
from ..configurable import register
from .layers import Layer, ParamSpec, _contiguous

__all__ = ["BatchNorm", "LayerNorm"]


def _check_eps(eps):
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not (eps > 0 and math.isfinite(eps)):
        raise ValueError(f"Expect eps as a finite float > 0, got {eps!r}")
    return float(eps)


def _check_normalizable(name, input_shape):
    if len(input_shape) not in (1, 3):
        raise ValueError(f"Expect a (features,) or (C, H, W) input to {name}, got shape {tuple(input_shape)}")
    return tuple(input_shape)


class _Affine(Layer):
    """gamma (init 1) and beta (init 0) of shape (channels,), never regularized."""

    def __init__(self, eps):
        super().__init__()
        self.eps = _check_eps(eps)
        self.gamma = self.beta = self.dgamma = self.dbeta = None

    def _channels(self):
        return self.input_shape[0]

    def param_specs(self):
        c = self._channels()
        return [ParamSpec("gamma", (c,), False), ParamSpec("beta", (c,), False)]

    def initial_value(self, spec, rng):
        return np.ones(spec.shape) if spec.name == "gamma" else np.zeros(spec.shape)

    def bind(self, params, grads):
        super().bind(params, grads)
        p, g = self._split(params), self._split(grads)
        self.gamma, self.beta = p["gamma"], p["beta"]
        self.dgamma, self.dbeta = g["gamma"], g["beta"]


@register("layer")
class BatchNorm(_Affine):
    """Batch normalisation (Ioffe & Szegedy 2015): per feature of a
    (features,) input, per channel of a (C, H, W) input (over the batch and
    both spatial axes), ``y = gamma * (x - mean) / sqrt(var + eps) + beta``.

    Training mode normalises with the batch's mean and biased variance and
    moves the running statistics towards the batch's::

        running_mean = momentum * running_mean + (1 - momentum) * mean
        running_var  = momentum * running_var  + (1 - momentum) * var * m / (m - 1)

    (the unbiased variance of the m values per channel, as PyTorch; a
    batch with m = 1 leaves ``running_var`` as it is).  Inference mode
    normalises with the running statistics.

    Parameters
    ----------
    momentum : float, default 0.9
        The weight of the OLD running value, 0 <= momentum < 1 (DL4J's
        ``decay``, Keras' ``momentum``).  PyTorch's ``momentum`` is the
        weight of the NEW value: its default 0.1 is this class's 0.9.
    eps : float, default 1e-5
        Added to the variance.

    Parameters in the flat vector: gamma (C,) (init 1), then beta (C,)
    (init 0), neither regularized.  Buffers (the model's flat ``buffers``
    vector, averaged like parameters): running ``mean`` (C,) (init 0), then
    running ``var`` (C,) (init 1).
    """

    def __init__(self, momentum: float = 0.9, eps: float = 1e-5):
        super().__init__(eps)
        if isinstance(momentum, bool) or not isinstance(momentum, (int, float)) or not 0 <= momentum < 1:
            raise ValueError(f"Expect momentum with 0 <= momentum < 1, got {momentum!r}")
        self.momentum = float(momentum)
        self.running_mean = self.running_var = None

    def config_arguments(self):
        return {"momentum": self.momentum, "eps": self.eps}

    def build(self, input_shape):
        self.input_shape = self.output_shape = _check_normalizable("BatchNorm", input_shape)
        return self.output_shape

    def buffer_specs(self):
        c = self._channels()
        return [ParamSpec("mean", (c,), False), ParamSpec("var", (c,), False)]

    def initial_buffer(self, spec):
        return np.ones(spec.shape) if spec.name == "var" else np.zeros(spec.shape)

    def bind_buffers(self, buffers):
        c = self._channels()
        self.running_mean, self.running_var = buffers[:c], buffers[c:2 * c]

    def forward(self, x, training):
        xp = get_array_module(x)
        c = self._channels()
        x2 = _contiguous(x).reshape(-1, c)
        m = x2.shape[0]
        y = self._buffer("y", x2.shape, x)
        if not training:
            scale = self.gamma / xp.sqrt(self.running_var + self.eps)
            shift = self.beta - self.running_mean * scale
            xp.multiply(x2, scale, out=y)
            y += shift
            return y.reshape(x.shape)
        ones = self._ones(m, x)
        mean = xp.matmul(ones, x2)  # GEMV: faster than sum(axis=0) over the short rows
        mean *= 1.0 / m
        xc = self._buffer("xc", x2.shape, x)
        xp.subtract(x2, mean, out=xc)
        xp.multiply(xc, xc, out=y)  # y is scratch until the output is written
        var = xp.matmul(ones, y)
        var *= 1.0 / m
        inv_std = 1.0 / xp.sqrt(var + self.eps)
        xp.multiply(xc, self.gamma * inv_std, out=y)
        y += self.beta
        self._xc, self._inv_std = xc, inv_std
        mom = self.momentum
        self.running_mean *= mom
        self.running_mean += (1.0 - mom) * mean
        if m > 1:
            self.running_var *= mom
            self.running_var += ((1.0 - mom) * m / (m - 1)) * var
        return y.reshape(x.shape)

    def backward(self, dy, need_dx):
        xp = get_array_module(dy)
        xc, inv_std = self._xc, self._inv_std
        m = xc.shape[0]
        dy2 = _contiguous(dy).reshape(xc.shape)
        ones = self._ones(m, dy)
        xp.matmul(ones, dy2, out=self.dbeta)
        tmp = self._buffer("tmp", xc.shape, dy)
        xp.multiply(dy2, xc, out=tmp)
        sum_dy_xc = xp.matmul(ones, tmp)
        xp.multiply(sum_dy_xc, inv_std, out=self.dgamma)
        if not need_dx:
            return None
        # dx = gamma*inv_std/m * (m*dy - sum(dy) - xhat*sum(dy*xhat)), xhat = xc*inv_std,
        #    = a*dy + c*xc + b with per-channel a, b, c.
        a = self.gamma * inv_std
        b = a * self.dbeta * (-1.0 / m)
        cc = a * inv_std * inv_std * sum_dy_xc * (-1.0 / m)
        dx = dy2  # dy is ours to overwrite (or _contiguous's copy)
        xp.multiply(xc, cc, out=tmp)
        xp.multiply(dy2, a, out=dx)
        dx += tmp
        dx += b
        return dx.reshape(dy.shape)


@register("layer")
class LayerNorm(_Affine):
    """Layer normalisation (Ba et al. 2016): each example is normalised over
    all its values, ``y = gamma * (x - mean) / sqrt(var + eps) + beta``
    with the example's mean and biased variance, in training and inference
    alike (no running statistics, no buffers).

    The affine parameters are per feature for a (features,) input and per
    channel for a (C, H, W) input: on images this is GroupNorm with one
    group (PyTorch's ``GroupNorm(1, C)``), not PyTorch's
    ``LayerNorm((C, H, W))`` whose gamma has one entry per value.

    Parameters
    ----------
    eps : float, default 1e-5
        Added to the variance.

    Parameters in the flat vector: gamma (F,) or (C,) (init 1), then beta
    (init 0), neither regularized.
    """

    def __init__(self, eps: float = 1e-5):
        super().__init__(eps)

    def config_arguments(self):
        return {"eps": self.eps}

    def build(self, input_shape):
        self.input_shape = self.output_shape = _check_normalizable("LayerNorm", input_shape)
        return self.output_shape

    def forward(self, x, training):
        xp = get_array_module(x)
        n, c = x.shape[0], self._channels()
        x2 = _contiguous(x).reshape(n, -1)
        k = x2.shape[1]
        xc = self._buffer("xc", x2.shape, x)
        y = self._buffer("y", x2.shape, x)
        ones = self._ones(k, x)
        mean = xp.matmul(x2, ones)
        mean *= 1.0 / k
        xp.subtract(x2, mean[:, None], out=xc)
        xp.multiply(xc, xc, out=y)  # scratch
        var = xp.matmul(y, ones)
        var *= 1.0 / k
        inv_std = 1.0 / xp.sqrt(var + self.eps)
        xp.multiply(xc, inv_std[:, None], out=xc)  # xc now holds xhat
        y3 = y.reshape(n, -1, c)
        xp.multiply(xc.reshape(y3.shape), self.gamma, out=y3)
        y3 += self.beta
        self._xhat, self._inv_std = xc, inv_std
        return y.reshape(x.shape)

    def backward(self, dy, need_dx):
        xp = get_array_module(dy)
        xhat, inv_std = self._xhat, self._inv_std
        n, k = xhat.shape
        c = self._channels()
        dy2 = _contiguous(dy).reshape(n, k)
        rows = self._ones(n * k // c, dy)
        tmp = self._buffer("tmp", xhat.shape, dy)
        xp.multiply(dy2, xhat, out=tmp)
        xp.matmul(rows, tmp.reshape(-1, c), out=self.dgamma)
        xp.matmul(rows, dy2.reshape(-1, c), out=self.dbeta)
        if not need_dx:
            return None
        # g = dy*gamma; dx = inv_std/k * (k*g - sum(g) - xhat*sum(g*xhat)) per example.
        dx = self._buffer("dx", xhat.shape, dy)
        xp.multiply(dy2.reshape(n, -1, c), self.gamma, out=dx.reshape(n, -1, c))
        ones = self._ones(k, dy)
        sum_g = xp.matmul(dx, ones)
        xp.multiply(dx, xhat, out=tmp)
        sum_gx = xp.matmul(tmp, ones)
        xp.multiply(xhat, (-1.0 / k) * sum_gx[:, None], out=tmp)
        dx += tmp
        dx -= ((1.0 / k) * sum_g)[:, None]
        dx *= inv_std[:, None]
        return dx.reshape(dy.shape)
