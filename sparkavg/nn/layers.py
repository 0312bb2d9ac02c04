"""Layers of a :class:`~sparkavg.nn.Network` (the loss-carrying
:class:`~sparkavg.nn.output.Output` layer lives in its own module).

A layer is first a configuration (its constructor arguments, round-tripped
through ``layer.to_config()`` / ``from_config(config, kind="layer")`` of
:mod:`sparkavg.configurable`; every concrete layer is registered under the
kind ``"layer"``), then, once a network builds it, a piece of runtime: its parameters and gradients are
views into the network's flat vectors (:meth:`Layer.bind`), and
``forward`` / ``backward`` reuse per-layer work buffers between steps.

Shapes.  Users speak NCHW: a network's ``input_shape`` is (C, H, W) or
(features,), and :attr:`Layer.output_shape` uses the same convention.
Inside, feature maps travel channels-last, (N, H, W, C), because im2col
rows are then contiguous runs of KW*C values and a convolution is one GEMM
(see :mod:`sparkavg.ops.conv`).  Consequences that show in the flat
parameter vector: a Conv2D kernel is stored as (KH, KW, C_in, F), and a
Dense layer after a convolution sees its input flattened in (H, W, C)
order.  Dense weights are (n_in, n_out).

Ownership.  An array returned by ``forward`` or ``backward`` belongs to the
layer and is overwritten by its next call; the model copies what it hands
out.  ``forward`` never writes into its input.  ``backward`` may overwrite
the gradient array it receives: the caller hands it over exclusively (a
:class:`~sparkavg.nn.graph.Graph` never gives one gradient array to two
consumers: where a value fans out it sums the branches' gradients into an
array of its own, and a vertex that passes one gradient to several inputs
passes copies).  A layer's backward may return the very array it received
(an identity), which then belongs to the next consumer in turn.

Kernels.  Layers call the conv and pool kernels of :mod:`sparkavg.ops`
without the fronts' argument checks (:func:`sparkavg.ops.elementwise.unchecked`):
the network validates a batch once on entry, and everything a layer hands
a kernel is its own work buffer or a C-contiguous array of the network's
dtype with the shape :meth:`Layer.build` fixed (:func:`_contiguous` makes
sure of the layout of what arrives).
"""
from __future__ import annotations

import math
from collections import namedtuple

import numpy as np

from .. import ops
from ..backend import get_array_module
from ..configurable import Configurable, register
from ..ops.elementwise import unchecked
from . import activations
from .initializers import check_weight_init, init_weights

__all__ = [
    "Layer",
    "Conv2D",
    "MaxPool2D",
    "AvgPool2D",
    "Dense",
    "Activation",
    "Dropout",
    "ParamSpec",
]

#: A parameter a layer owns: ``regularized`` marks weights (L2 / weight
#: decay apply) as opposed to biases.
ParamSpec = namedtuple("ParamSpec", "name shape regularized")


def _pair(name, value, minimum):
    """An int or a pair of ints -> tuple of two ints >= minimum."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        value = (int(value), int(value))
    try:
        pair = tuple(int(v) for v in value)
        ok = len(pair) == 2 and all(float(v) == p for v, p in zip(value, pair))
    except (TypeError, ValueError):
        ok = False
    if not ok or min(pair) < minimum:
        raise ValueError(f"Expect {name} as an int or a pair of ints >= {minimum}, got {value!r}")
    return pair


def _positive_int(name, value):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"Expect {name} as an int >= 1, got {value!r}")
    return int(value)


class Layer(Configurable):
    """Base class.  Subclasses set :attr:`output_shape` in :meth:`build`,
    return their constructor arguments from :meth:`config_arguments` and are
    registered with ``@register("layer")``."""

    _config_kind = "layer"

    def __init__(self):
        self.input_shape = None
        self.output_shape = None
        self._ws = {}

    # ----------------------------------------------------------- config
    def config_arguments(self) -> dict:
        """The constructor arguments that rebuild this layer (unbuilt)."""
        return {}

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in self.config_arguments().items())
        return f"{type(self).__name__}({args})"

    # ------------------------------------------------------------ build
    def build(self, input_shape: tuple) -> tuple:
        """Fix the input shape (NCHW convention, no batch axis); return the output shape."""
        self.input_shape = tuple(input_shape)
        self.output_shape = self.input_shape
        return self.output_shape

    def param_specs(self) -> list:
        """The parameters this layer owns, in flat-vector order."""
        return []

    def initial_value(self, spec: ParamSpec, rng: np.random.Generator):
        """Float64 numpy initial value of parameter ``spec``."""
        return np.zeros(spec.shape)

    def bind(self, params, grads) -> None:
        """Receive this layer's contiguous blocks of the flat parameter and
        gradient vectors (1-D views, the parameters of :meth:`param_specs`
        one after another)."""
        self.reset_workspace()

    def buffer_specs(self) -> list:
        """The non-trainable state this layer owns (BatchNorm's running
        statistics), in flat-buffer order.  Buffers live in the model's own
        flat ``buffers`` vector: averaged like parameters, never given a
        gradient, L2, weight decay or threshold encoding."""
        return []

    def initial_buffer(self, spec: ParamSpec) -> np.ndarray:
        """Float64 numpy initial value of buffer ``spec``."""
        return np.zeros(spec.shape)

    def bind_buffers(self, buffers) -> None:
        """Receive this layer's contiguous block of the flat buffer vector (a
        1-D view, the buffers of :meth:`buffer_specs` one after another);
        called after :meth:`bind`."""

    def _split(self, flat) -> dict:
        """name -> view of ``flat`` shaped as the parameter, in spec order."""
        views, offset = {}, 0
        for spec in self.param_specs():
            size = math.prod(spec.shape)
            views[spec.name] = flat[offset:offset + size].reshape(spec.shape)
            offset += size
        return views

    def reset_workspace(self) -> None:
        """Drop cached work buffers (after a device move or to free memory)."""
        self._ws = {}

    def _buffer(self, name, shape, like, dtype=None):
        """A cached uninitialised work array of ``shape`` on ``like``'s device,
        with ``like``'s dtype unless ``dtype`` is given."""
        key = (name, tuple(shape))
        buf = self._ws.get(key)
        if buf is None:
            if len(self._ws) > 32:  # many batch sizes seen: keep memory bounded
                self._ws = {}
            buf = get_array_module(like).empty(shape, dtype=like.dtype if dtype is None else dtype)
            self._ws[key] = buf
        return buf

    def _act_work(self, name, like):
        """Scratch for activation ``name`` on arrays like ``like`` (None when it needs none)."""
        return self._buffer("act", like.shape, like) if name in activations.NEEDS_WORK else None

    def _ones(self, n, like):
        key = ("ones", n)
        buf = self._ws.get(key)
        if buf is None:
            buf = get_array_module(like).ones(n, dtype=like.dtype)
            self._ws[key] = buf
        return buf

    # ----------------------------------------------------------- compute
    def forward(self, x, training: bool):
        """``(N, *internal input shape)`` -> ``(N, *internal output shape)``."""
        return x

    def backward(self, dy, need_dx: bool):
        """Write parameter gradients; return dL/dx (or None when not needed)."""
        return dy if need_dx else None

    def multiply_adds(self) -> tuple:
        """``(in OpenMP kernels, in BLAS GEMMs)``: this layer's multiply-adds
        per example of a training step (forward + backward), for the model's
        choice of thread pools (:meth:`sparkavg.nn.flat.FlatModel.step_threads`)."""
        return 0, 0


def _contiguous(a):
    """``a`` itself when C-contiguous (always, inside a network), else a contiguous copy."""
    return a if a.flags.c_contiguous else get_array_module(a).ascontiguousarray(a)


def _internal_shape(shape):
    """NCHW logical shape -> internal per-sample array shape (channels last)."""
    if len(shape) == 3:
        c, h, w = shape
        return (h, w, c)
    return tuple(shape)


class _Weighted(Layer):
    """A layer with weights W, bias b and an element-wise activation."""

    def __init__(self, activation, weight_init):
        super().__init__()
        self.activation = activations.check_activation(activation)
        self.weight_init = check_weight_init(weight_init)
        self.W = self.b = self.dW = self.db = None

    def _fans(self):
        raise NotImplementedError

    def initial_value(self, spec, rng):
        if spec.name == "b":
            return np.zeros(spec.shape)
        fan_in, fan_out = self._fans()
        return init_weights(self.weight_init, spec.shape, fan_in, fan_out, rng)

    def bind(self, params, grads):
        super().bind(params, grads)
        p, g = self._split(params), self._split(grads)
        self.W, self.b = p["W"], p["b"]
        self.dW, self.db = g["W"], g["b"]


@register("layer")
class Conv2D(_Weighted):
    """2-D convolution (cross-correlation, as every DL framework), zero padding,
    'truncate' output size floor((H + 2p - k) / s) + 1.

    Parameters
    ----------
    filters : int
        Output channels F.
    kernel_size, stride, padding : int or (int, int)
        Window (KH, KW), step (SH, SW) and symmetric zero padding (PH, PW).
    activation : str
        One of :data:`sparkavg.nn.activations.ACTIVATIONS` except softmax.
    weight_init : str
        See :mod:`sparkavg.nn.initializers`.

    Notes
    -----
    Parameters in the flat vector: W (KH, KW, C_in, F), then b (F,).
    """

    def __init__(self, filters: int, kernel_size: int | tuple[int, int], stride: int | tuple[int, int] = 1,
                 padding: int | tuple[int, int] = 0, activation: str = "identity", weight_init: str = "xavier"):
        super().__init__(activation, weight_init)
        if activation == "softmax":
            raise ValueError("Expect a per-element activation for Conv2D, got 'softmax'")
        self.filters = _positive_int("filters", filters)
        self.kernel_size = _pair("kernel_size", kernel_size, 1)
        self.stride = _pair("stride", stride, 1)
        self.padding = _pair("padding", padding, 0)

    def config_arguments(self):
        return {"filters": self.filters, "kernel_size": self.kernel_size, "stride": self.stride,
                "padding": self.padding, "activation": self.activation, "weight_init": self.weight_init}

    def build(self, input_shape):
        if len(input_shape) != 3:
            raise ValueError(f"Expect a (C, H, W) input to Conv2D, got shape {tuple(input_shape)}")
        self.input_shape = tuple(input_shape)
        c, h, w = input_shape
        (kh, kw), (sh, sw), (ph, pw) = self.kernel_size, self.stride, self.padding
        oh, ow = (ops.conv_output_size(h, kh, sh, ph), ops.conv_output_size(w, kw, sw, pw))
        if oh < 1 or ow < 1:
            raise ValueError(f"Expect a Conv2D kernel {kh}x{kw} (padding {ph}, {pw}) that fits the "
                             f"input {h}x{w}, got an empty output")
        self.output_shape = (self.filters, oh, ow)
        return self.output_shape

    def param_specs(self):
        kh, kw = self.kernel_size
        return [ParamSpec("W", (kh, kw, self.input_shape[0], self.filters), True),
                ParamSpec("b", (self.filters,), False)]

    def _fans(self):
        (kh, kw), (sh, sw) = self.kernel_size, self.stride
        return self.input_shape[0] * kh * kw, self.filters * kh * kw / (sh * sw)

    def bind(self, params, grads):
        super().bind(params, grads)
        k = self.W.shape[0] * self.W.shape[1] * self.W.shape[2]
        self._W2 = self.W.reshape(k, self.filters)
        self._dW2 = self.dW.reshape(k, self.filters)
        # W (K, F) is followed by b (F,) in the flat vector, so the block is
        # the (K+1, F) matrix [W; b]: with a ones column in the patch rows
        # one GEMM adds the bias, and one GEMM gives dW and db together.
        self._Wb = params.reshape(k + 1, self.filters)
        self._dWb = grads.reshape(k + 1, self.filters)

    def _pointwise(self):
        return self.kernel_size == (1, 1) and self.stride == (1, 1) and self.padding == (0, 0)

    #: The direct kernels compute whole 16-lane vectors of output channels
    #: and, for backward data, the full correlation over the padded output
    #: gradient: they run where that costs at most this many times the
    #: multiply-adds of im2col + GEMM (benchmarks/history/kernels.md: 2-5x faster
    #: at 1.0, still 2x for LeNet's F = 20, 1.6; LeNet's conv2 backward
    #: data, 144/64 pixels x 32/20 lanes = 3.6, is 3-4x slower direct).
    _DIRECT_MAX_WASTE = 2.0
    _DIRECT_DX_MAX_WASTE = 1.5

    @staticmethod
    def _lane_waste(channels):
        return 16 * -(-channels // 16) / channels

    def _direct(self, x):
        """Whether this step runs the direct (no im2col) kernels of
        :func:`sparkavg.ops.conv2d_forward`: numpy float32 where they run
        (:func:`sparkavg.ops.have_direct_conv`), stride 1, padding < kernel,
        not 1x1, and few wasted vector lanes (see ``_DIRECT_MAX_WASTE``).
        Everything else keeps im2col (or the 1x1 GEMM) + GEMM."""
        return x.dtype == np.float32 and isinstance(x, np.ndarray) and self._direct_shape()

    def _direct_shape(self):
        """The part of :meth:`_direct` that the layer's shape decides."""
        (kh, kw), (ph, pw) = self.kernel_size, self.padding
        return (self.stride == (1, 1) and ph < kh and pw < kw and (kh, kw) != (1, 1)
                and self._lane_waste(self.filters) <= self._DIRECT_MAX_WASTE and ops.have_direct_conv())

    def multiply_adds(self):
        f, oh, ow = self.output_shape
        (kh, kw), c = self.kernel_size, self.input_shape[0]
        macs = 3 * oh * ow * kh * kw * c * f
        return (macs, 0) if self._direct_shape() else (0, macs)

    def _direct_dx(self):
        """Whether backward data runs direct too (else GEMM + col2im)."""
        c, h, w = self.input_shape
        _, oh, ow = self.output_shape
        return h * w / (oh * ow) * self._lane_waste(c) <= self._DIRECT_DX_MAX_WASTE

    def _direct_backward(self, dz, need_dx):
        x = self._x
        n, (f, oh, ow) = x.shape[0], self.output_shape
        (kh, kw), (ph, pw) = self.kernel_size, self.padding
        dz4 = dz.reshape(n, oh, ow, f)
        unchecked("conv2d_backward_weights", dz, x, dz4, ph, pw, self.dW, self.db)
        if not need_dx:
            return None
        dx = self._buffer("dx", x.shape, dz)
        if self._direct_dx():
            return unchecked("conv2d_backward_data", dz, dz4, self.W, ph, pw, dx)
        dcols = self._buffer("dcols", (dz.shape[0], self._W2.shape[0]), dz)
        np.matmul(dz, self._W2.T, out=dcols)
        return unchecked("col2im", dz, dcols, kh, kw, 1, 1, ph, pw, dx)

    def forward(self, x, training):
        xp = get_array_module(x)
        n = x.shape[0]
        f, oh, ow = self.output_shape
        (kh, kw), (sh, sw), (ph, pw) = self.kernel_size, self.stride, self.padding
        rows = n * oh * ow
        y = self._buffer("y", (rows, f), x)
        self._x = None
        if self._direct(x):
            # No patch rows: x is kept (as Dense keeps its input) for backward.
            x = _contiguous(x)
            unchecked("conv2d_forward", x, x, self.W, self.b, ph, pw, y.reshape(n, oh, ow, f))
            cols, self._x = None, x
        elif self._pointwise():
            cols = x.reshape(rows, x.shape[3])
            xp.matmul(cols, self._W2, out=y)
            y += self.b
        else:
            cols = unchecked("im2col", x, _contiguous(x), kh, kw, sh, sw, ph, pw,
                             self._buffer("cols", (rows, self._Wb.shape[0]), x), True)
            xp.matmul(cols, self._Wb, out=y)
        activations.forward(self.activation, y, self._act_work(self.activation, y))
        self._x_shape, self._cols, self._y = x.shape, cols, y
        return y.reshape(n, oh, ow, f)

    def backward(self, dy, need_dx):
        xp = get_array_module(dy)
        cols, y = self._cols, self._y
        dz = activations.backward(self.activation, dy.reshape(y.shape), y, self._act_work(self.activation, y))
        if self._x is not None:
            return self._direct_backward(dz, need_dx)
        if self._pointwise():
            xp.matmul(cols.T, dz, out=self._dW2)
            xp.matmul(self._ones(dz.shape[0], dz), dz, out=self.db)  # GEMV: faster than sum(axis=0)
            if not need_dx:
                return None
            dx = self._buffer("dx", self._x_shape, dz)
            xp.matmul(dz, self._W2.T, out=dx.reshape(cols.shape))
            return dx
        # dW and db (the ones column) at once.  For a tall [W; b] (K+1 >= 2F,
        # e.g. LeNet's second conv: 501 x 50) OpenBLAS is ~16% faster on one
        # thread computing the (F, K+1) transpose and copying it back, within
        # 3% on two (benchmarks/bench_conv_dw.py); not for conv1's 26 x 20.
        k1, f = self._dWb.shape
        if k1 >= 2 * f:
            dwb_t = self._buffer("dWb_t", (f, k1), dz)
            xp.matmul(dz.T, cols, out=dwb_t)
            self._dWb[...] = dwb_t.T
        else:
            xp.matmul(cols.T, dz, out=self._dWb)
        if not need_dx:
            return None
        dcols = self._buffer("dcols", (cols.shape[0], self._W2.shape[0]), dz)
        xp.matmul(dz, self._W2.T, out=dcols)
        (kh, kw), (sh, sw), (ph, pw) = self.kernel_size, self.stride, self.padding
        return unchecked("col2im", dz, dcols, kh, kw, sh, sw, ph, pw, self._buffer("dx", self._x_shape, dz))


class _Pool2D(Layer):
    def __init__(self, pool_size: int | tuple[int, int] = 2, stride: int | tuple[int, int] | None = None):
        super().__init__()
        self.pool_size = _pair("pool_size", pool_size, 1)
        self.stride = self.pool_size if stride is None else _pair("stride", stride, 1)

    def config_arguments(self):
        return {"pool_size": self.pool_size, "stride": self.stride}

    def build(self, input_shape):
        name = type(self).__name__
        if len(input_shape) != 3:
            raise ValueError(f"Expect a (C, H, W) input to {name}, got shape {tuple(input_shape)}")
        self.input_shape = tuple(input_shape)
        c, h, w = input_shape
        (kh, kw), (sh, sw) = self.pool_size, self.stride
        oh, ow = ops.conv_output_size(h, kh, sh, 0), ops.conv_output_size(w, kw, sw, 0)
        if oh < 1 or ow < 1:
            raise ValueError(f"Expect a {name} window {kh}x{kw} that fits the input {h}x{w}")
        self.output_shape = (c, oh, ow)
        return self.output_shape


@register("layer")
class MaxPool2D(_Pool2D):
    """Max pooling over (KH, KW) windows with step ``stride`` (default: the
    window, i.e. non-overlapping); no padding, 'truncate' output size.  The
    gradient goes to the first maximal element of each window."""

    def forward(self, x, training):
        c, oh, ow = self.output_shape
        n = x.shape[0]
        (kh, kw), (sh, sw) = self.pool_size, self.stride
        out = self._buffer("y", (n, oh, ow, c), x)
        argmax = self._buffer("argmax", (n, oh, ow, c), x, dtype=np.int32)
        unchecked("maxpool_forward", x, _contiguous(x), kh, kw, sh, sw, out, argmax)
        self._x_shape, self._argmax = x.shape, argmax
        return out

    def backward(self, dy, need_dx):
        if not need_dx:
            return None
        (kh, kw), (sh, sw) = self.pool_size, self.stride
        dx = self._buffer("dx", self._x_shape, dy)
        return unchecked("maxpool_backward", dy, _contiguous(dy), self._argmax, kh, kw, sh, sw, dx)


@register("layer")
class AvgPool2D(_Pool2D):
    """Average pooling over (KH, KW) windows; see :class:`MaxPool2D`."""

    def forward(self, x, training):
        c, oh, ow = self.output_shape
        (kh, kw), (sh, sw) = self.pool_size, self.stride
        self._x_shape = x.shape
        return unchecked("avgpool_forward", x, _contiguous(x), kh, kw, sh, sw,
                         self._buffer("y", (x.shape[0], oh, ow, c), x))

    def backward(self, dy, need_dx):
        if not need_dx:
            return None
        (kh, kw), (sh, sw) = self.pool_size, self.stride
        return unchecked("avgpool_backward", dy, _contiguous(dy), kh, kw, sh, sw,
                         self._buffer("dx", self._x_shape, dy))


@register("layer")
class Dense(_Weighted):
    """Fully connected layer ``act(x @ W + b)``; a (C, H, W) input is flattened.

    Notes
    -----
    Parameters in the flat vector: W (n_in, units), then b (units,).
    """

    def __init__(self, units: int, activation: str = "relu", weight_init: str = "xavier"):
        super().__init__(activation, weight_init)
        self.units = _positive_int("units", units)

    def config_arguments(self):
        return {"units": self.units, "activation": self.activation, "weight_init": self.weight_init}

    def build(self, input_shape):
        self.input_shape = tuple(input_shape)
        self.n_in = int(math.prod(input_shape))
        self.output_shape = (self.units,)
        return self.output_shape

    def param_specs(self):
        return [ParamSpec("W", (self.n_in, self.units), True), ParamSpec("b", (self.units,), False)]

    def _fans(self):
        return self.n_in, self.units

    def multiply_adds(self):
        return 0, 3 * self.n_in * self.units

    def _affine(self, x):
        xp = get_array_module(x)
        x2 = x.reshape(x.shape[0], self.n_in)
        z = self._buffer("y", (x.shape[0], self.units), x)
        xp.matmul(x2, self.W, out=z)
        z += self.b
        self._x_shape, self._x2 = x.shape, x2
        return z

    def _affine_backward(self, dz, need_dx):
        xp = get_array_module(dz)
        xp.matmul(self._x2.T, dz, out=self.dW)
        xp.matmul(self._ones(dz.shape[0], dz), dz, out=self.db)
        if not need_dx:
            return None
        dx = self._buffer("dx", self._x_shape, dz)
        xp.matmul(dz, self.W.T, out=dx.reshape(dz.shape[0], self.n_in))
        return dx

    def forward(self, x, training):
        z = self._affine(x)
        self._y = activations.forward(self.activation, z, self._act_work(self.activation, z))
        return self._y

    def backward(self, dy, need_dx):
        dz = activations.backward(self.activation, dy, self._y, self._act_work(self.activation, dy))
        return self._affine_backward(dz, need_dx)


@register("layer")
class Activation(Layer):
    """A standalone activation (``softmax`` needs a (units,) input)."""

    def __init__(self, name: str):
        super().__init__()
        self.name = activations.check_activation(name)

    def config_arguments(self):
        return {"name": self.name}

    def build(self, input_shape):
        if self.name == "softmax" and len(input_shape) != 1:
            raise ValueError(f"Expect a (units,) input to softmax, got shape {tuple(input_shape)}")
        return super().build(input_shape)

    def forward(self, x, training):
        y = self._buffer("y", x.shape, x)
        y[...] = x
        self._y = activations.forward(self.name, y, self._act_work(self.name, y))
        return self._y

    def backward(self, dy, need_dx):
        if not need_dx:
            return None
        return activations.backward(self.name, dy, self._y, self._act_work(self.name, dy))


@register("layer")
class Dropout(Layer):
    """Inverted dropout: in training each value is zeroed with probability
    ``rate`` and the survivors scaled by 1/(1-rate); at inference it is the
    identity.  ``rate`` is the DROP probability (Keras' convention; DL4J's
    ``dropOut(p)`` takes the RETAIN probability).  Masks come from a
    generator seeded from the network seed and the layer's position."""

    def __init__(self, rate: float):
        super().__init__()
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 <= rate < 1:
            raise ValueError(f"Expect a dropout rate with 0 <= rate < 1, got {rate!r}")
        self.rate = float(rate)
        self._seed = 0
        self._rng = None
        self._rng_xp = None

    def config_arguments(self):
        return {"rate": self.rate}

    def reseed(self, seed: int, xp=np) -> None:
        """Restart the mask generator (``xp.random.default_rng(seed)``)."""
        self._seed = int(seed)
        self._rng = xp.random.default_rng(self._seed)
        self._rng_xp = xp

    def forward(self, x, training):
        if not training or self.rate == 0.0:
            self._mask = None
            return x
        if self._rng_xp is not get_array_module(x):  # first use, or moved between devices
            self.reseed(self._seed, get_array_module(x))
        mask = self._buffer("mask", x.shape, x)
        mask[...] = self._rng.random(x.shape, dtype=x.dtype) >= self.rate
        mask *= mask.dtype.type(1.0 / (1.0 - self.rate))
        self._mask = mask
        y = self._buffer("y", x.shape, x)
        get_array_module(x).multiply(x, mask, out=y)
        return y

    def backward(self, dy, need_dx):
        if not need_dx:
            return None
        if self._mask is not None:
            dy *= self._mask
        return dy

