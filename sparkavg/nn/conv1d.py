"""``Conv1D``: a convolution along time, (T, F) -> (T', filters).

A sequence (N, T, F) is an NHWC image batch (N, T, 1, F) -- T rows, one
column, F channels -- and a 1-D kernel of width k is a (k, 1) 2-D one, so
:class:`Conv1D` is a :class:`~sparkavg.nn.layers.Conv2D` it owns, bound to
the same parameters, on that view (im2col rows of k*F values and one GEMM
each way; no copies of the input beyond the Conv2D's).
"""
from __future__ import annotations

import numpy as np

from ..configurable import register
from . import activations
from .initializers import check_weight_init
from .layers import Conv2D, Layer, ParamSpec, _positive_int

__all__ = ["Conv1D"]


def _nonneg_int(name, value):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError(f"Expect {name} as an int >= 0, got {value!r}")
    return int(value)


@register("layer")
class Conv1D(Layer):
    """1-D convolution (cross-correlation) along the time axis of a (T, F)
    sequence, zero padding, output length T' = floor((T + 2p - k) / s) + 1
    (PyTorch's ``nn.Conv1d`` on (N, F, T), Keras' ``Conv1D`` on (N, T, F)).

    Parameters
    ----------
    filters : int
        Output features per step.
    kernel_size : int
        Window length k (time steps).
    stride : int, default 1
    padding : int, default 0
        Zero steps added at both ends.
    activation : str, default 'identity'
        One of :data:`sparkavg.nn.activations.ACTIVATIONS` except softmax.
    weight_init : str, default 'xavier'
        Fans as a convolution's: fan_in = F*k, fan_out = filters*k/stride.

    Notes
    -----
    Parameters in the flat vector: W (k, F, filters) (PyTorch's
    ``weight.permute(2, 1, 0)``), then b (filters,).
    """

    def __init__(self, filters: int, kernel_size: int, stride: int = 1, padding: int = 0,
                 activation: str = "identity", weight_init: str = "xavier"):
        super().__init__()
        self.filters = _positive_int("filters", filters)
        self.kernel_size = _positive_int("kernel_size", kernel_size)
        self.stride = _positive_int("stride", stride)
        self.padding = _nonneg_int("padding", padding)
        self.activation = activations.check_activation(activation)
        if activation == "softmax":
            raise ValueError("Expect a per-element activation for Conv1D, got 'softmax'")
        self.weight_init = check_weight_init(weight_init)
        self._conv = None

    def config_arguments(self):
        return {"filters": self.filters, "kernel_size": self.kernel_size, "stride": self.stride,
                "padding": self.padding, "activation": self.activation, "weight_init": self.weight_init}

    def build(self, input_shape):
        if len(input_shape) != 2:
            raise ValueError(f"Expect a (T, F) sequence input to Conv1D, got shape {tuple(input_shape)}")
        t, f = input_shape
        conv = Conv2D(self.filters, (self.kernel_size, 1), (self.stride, 1), (self.padding, 0),
                      self.activation, self.weight_init)
        try:
            _, t_out, _ = conv.build((f, t, 1))
        except ValueError:
            raise ValueError(f"Expect a Conv1D kernel {self.kernel_size} (padding {self.padding}) that fits "
                             f"the sequence length {t}, got an empty output") from None
        self._conv = conv
        self.input_shape, self.output_shape = tuple(input_shape), (t_out, self.filters)
        return self.output_shape

    def param_specs(self):
        return [ParamSpec("W", (self.kernel_size, self.input_shape[1], self.filters), True),
                ParamSpec("b", (self.filters,), False)]

    def initial_value(self, spec, rng):
        conv_spec = self._conv.param_specs()[0 if spec.name == "W" else 1]
        return self._conv.initial_value(conv_spec, rng).reshape(spec.shape)

    def bind(self, params, grads):
        super().bind(params, grads)
        self._conv.bind(params, grads)  # the same flat layout: W (k, 1, F, filters), b

    def reset_workspace(self):
        super().reset_workspace()
        if self._conv is not None:
            self._conv.reset_workspace()

    def forward(self, x, training):
        n, t, f = x.shape
        y = self._conv.forward(x.reshape(n, t, 1, f), training)
        return y.reshape(n, *self.output_shape)

    def backward(self, dy, need_dx):
        n = dy.shape[0]
        dx = self._conv.backward(dy.reshape(n, self.output_shape[0], 1, self.filters), need_dx)
        return None if dx is None else dx.reshape(n, *self.input_shape)
