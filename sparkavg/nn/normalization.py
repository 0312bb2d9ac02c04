"""Normalisation layers: :class:`BatchNorm` and :class:`LayerNorm`.

Both follow the layer contract of :mod:`sparkavg.nn.layers` (NCHW shapes
for users, channels-last arrays inside, parameters and gradients as views
of the model's flat vectors, work buffers reused between steps).  The
per-channel work -- statistics, ``gamma * xhat + beta`` and its gradients
-- runs in the kernels of :mod:`sparkavg.ops.norm` on the input seen as
(rows, C): one or two fused passes each (Cython for numpy float32), where
numpy broadcasting a (C,) vector over short rows is slow.  Input
gradients are written over the ``dy`` received (the caller hands it over),
so a step allocates nothing but a few (C,)- or (N,)-sized vectors.
"""
from __future__ import annotations

import math

import numpy as np

from ..backend import get_array_module
from ..configurable import register
from ..ops.elementwise import unchecked
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

    Notes
    -----
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
            # the running statistics are constants here: backward (a frozen
            # BatchNorm being fine-tuned through) is the per-channel affine map's
            std = xp.sqrt(self.running_var + self.eps)
            scale = self.gamma / std
            unchecked("channel_affine", x, x2, scale, self.beta - self.running_mean * scale, y)
            self._x2, self._mean, self._inv_std, self._std = x2, self.running_mean, None, std
            return y.reshape(x.shape)
        mean, var = self._buffer("mean", (c,), x), self._buffer("var", (c,), x)
        unchecked("channel_stats", x, x2, mean, var)
        scale, shift, inv_std = (self._buffer(name, (c,), x) for name in ("scale", "shift", "inv_std"))
        mom = self.momentum
        unchecked("batchnorm_coefficients", x, mean, var, self.gamma, self.beta, self.eps, mom,
                  (1.0 - mom) * m / (m - 1) if m > 1 else 0.0, self.running_mean, self.running_var,
                  scale, shift, inv_std)
        unchecked("channel_affine", x, x2, scale, shift, y)
        # backward reads x itself (a layer never writes into its input), not a centred copy
        self._x2, self._mean, self._inv_std, self._std = x2, mean, inv_std, None
        return y.reshape(x.shape)

    def backward(self, dy, need_dx):
        x2, mean = self._x2, self._mean
        frozen = self._inv_std is None  # inference mode kept the deviation (inverted only when trained through)
        inv_std = 1.0 / self._std if frozen else self._inv_std
        m = x2.shape[0]
        dy2 = _contiguous(dy).reshape(x2.shape)
        sum_dy_xc = self._buffer("sum_dy_xc", mean.shape, dy)
        unchecked("channel_sums", dy, dy2, x2, mean, self.dbeta, sum_dy_xc)
        get_array_module(dy).multiply(sum_dy_xc, inv_std, out=self.dgamma)
        if not need_dx:
            return None
        # dx = gamma*inv_std/m * (m*dy - sum(dy) - xhat*sum(dy*xhat)) with xhat = (x - mean)*inv_std,
        # one blend a*dy + b*(x - mean) + shift per channel, written over dy (ours to overwrite);
        # with the running statistics (inference mode) only a*dy is left.
        a = self.gamma * inv_std
        if frozen:
            b = shift = get_array_module(dy).zeros_like(a)
        else:
            b, shift = a * inv_std * self.dgamma * (-1.0 / m), a * self.dbeta * (-1.0 / m)
        unchecked("channel_blend", dy, dy2, x2, mean, a, b, shift, dy2)
        return dy2.reshape(dy.shape)


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

    Notes
    -----
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
        xhat = self._buffer("xhat", x2.shape, x)
        ones = self._ones(k, x)
        mean = xp.matmul(x2, ones)  # GEMV: the row sums
        mean *= 1.0 / k
        xp.subtract(x2, mean[:, None], out=xhat)
        var = xp.einsum("ij,ij->i", xhat, xhat)
        var *= 1.0 / k
        inv_std = 1.0 / xp.sqrt(var + self.eps)
        xhat *= inv_std[:, None]
        y = self._buffer("y", x2.shape, x)
        unchecked("channel_affine", x, xhat.reshape(-1, c), self.gamma, self.beta, y.reshape(-1, c))
        self._xhat, self._inv_std = xhat, inv_std
        return y.reshape(x.shape)

    def backward(self, dy, need_dx):
        xp = get_array_module(dy)
        xhat, inv_std = self._xhat, self._inv_std
        n, k = xhat.shape
        c = self._channels()
        dy2 = _contiguous(dy).reshape(n, k)
        zeros = self._buffer("zeros", (c,), dy)
        zeros.fill(0)
        unchecked("channel_sums", dy, dy2.reshape(-1, c), xhat.reshape(-1, c), zeros, self.dbeta, self.dgamma)
        if not need_dx:
            return None
        # g = dy*gamma; dx = inv_std/k * (k*g - sum(g) - xhat*sum(g*xhat)) per example, over dy.
        g = unchecked("channel_affine", dy, dy2.reshape(-1, c), self.gamma, zeros, dy2.reshape(-1, c))
        g = g.reshape(n, k)
        mean_g = xp.matmul(g, self._ones(k, dy))
        mean_g *= 1.0 / k
        mean_gx = xp.einsum("ij,ij->i", g, xhat)
        mean_gx *= 1.0 / k
        tmp = self._buffer("tmp", xhat.shape, dy)
        xp.multiply(xhat, mean_gx[:, None], out=tmp)
        g -= tmp
        g -= mean_g[:, None]
        g *= inv_std[:, None]
        return g.reshape(dy.shape)
