"""Layers that change an example's shape: :class:`Flatten`, :class:`Reshape`,
:class:`GlobalAvgPool` and :class:`GlobalMaxPool`.

Users speak NCHW and these layers do too: :class:`Flatten` and
:class:`Reshape` order values as a row-major (C, H, W) array (PyTorch's
``flatten`` / ``view`` on NCHW tensors), whatever the channels-last layout
inside (see :mod:`sparkavg.nn.layers`).  Internal per-example layouts:
(C, H, W) -> (H, W, C); (T, F) (a sequence, for recurrent layers) and
(features,) are stored as they are.

Where the NCHW order and the internal order coincide (no (C, H, W) side
with C > 1 and H * W > 1), ``forward`` returns a view of its input and
``backward`` a view of the gradient it received (as :class:`Dropout`
returns its input at inference): nothing downstream writes into either.
"""
from __future__ import annotations

import math

import numpy as np

from ..backend import get_array_module
from ..configurable import register
from .layers import Layer, _contiguous, _internal_shape

__all__ = ["Flatten", "Reshape", "GlobalAvgPool", "GlobalMaxPool"]


def _channels_last(shape) -> bool:
    """Whether a (logical) example shape is stored in a different order inside."""
    return len(shape) == 3 and shape[0] > 1 and shape[1] * shape[2] > 1


def _to_nchw(a):
    """Internal (N, H, W, C) -> a (N, C, H, W) view (other ranks unchanged)."""
    return a.transpose(0, 3, 1, 2) if a.ndim == 4 else a


def _to_internal(a):
    """(N, C, H, W) -> an (N, H, W, C) view (other ranks unchanged)."""
    return a.transpose(0, 2, 3, 1) if a.ndim == 4 else a


class _Relayout(Layer):
    """A pure relayout of each example from ``input_shape`` to ``output_shape``
    (both logical, same size), values in NCHW row-major order on both sides."""

    def _relayout(self, a, src, dst, name):
        n = a.shape[0]
        if not (_channels_last(src) or _channels_last(dst)):
            return _contiguous(a).reshape(n, *_internal_shape(dst))
        out = self._buffer(name, (n, *_internal_shape(dst)), a)
        out[...] = _to_internal(_to_nchw(a).reshape(n, *dst))
        return out

    def forward(self, x, training):
        return self._relayout(x, self.input_shape, self.output_shape, "y")

    def backward(self, dy, need_dx):
        if not need_dx:
            return None
        return self._relayout(dy, self.output_shape, self.input_shape, "dx")


@register("layer")
class Flatten(_Relayout):
    """(C, H, W) -> (C*H*W,) in C, H, W order (PyTorch's ``flatten(1)`` on
    NCHW; (T, F) -> (T*F,); the identity on (features,)).

    A :class:`~sparkavg.nn.layers.Dense` layer applied directly to a
    (C, H, W) input flattens it in the internal (H, W, C) order instead,
    one copy fewer; the two differ only in the order of Dense's weight
    rows, which matters when weights are exchanged with another framework.
    """

    def build(self, input_shape):
        if len(input_shape) not in (1, 2, 3):
            raise ValueError(f"Expect a (features,), (T, F) or (C, H, W) input to Flatten, "
                             f"got shape {tuple(input_shape)}")
        self.input_shape = tuple(input_shape)
        self.output_shape = (math.prod(input_shape),)
        return self.output_shape


def _check_target(shape):
    if isinstance(shape, (int, np.integer)) and not isinstance(shape, bool):
        shape = (shape,)
    try:
        target = tuple(int(d) for d in shape)
        ok = (not isinstance(shape, (str, bytes)) and 1 <= len(target) <= 3
              and not any(isinstance(d, bool) for d in shape)
              and all(float(d) == t for d, t in zip(shape, target))
              and all(t >= 1 or t == -1 for t in target) and target.count(-1) <= 1)
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ValueError(f"Expect shape as 1 to 3 ints >= 1 (at most one -1), got {shape!r}")
    return target


@register("layer")
class Reshape(_Relayout):
    """Reshape each example to ``shape``, values in NCHW row-major order on
    both sides (PyTorch's ``view`` / Keras' ``Reshape`` on NCHW data).

    ``Reshape((1, 28, 28))`` turns a flat 784 input into a one-channel
    image, and :class:`Flatten` undoes it.

    Parameters
    ----------
    shape : int or tuple of 1 to 3 ints
        The target example shape: (features,), (T, F) or (C, H, W); one
        entry may be -1 (inferred from the input's size).
    """

    def __init__(self, shape: int | tuple[int, ...]):
        super().__init__()
        self.shape = _check_target(shape)

    def config_arguments(self):
        return {"shape": self.shape}

    def build(self, input_shape):
        size = math.prod(input_shape)
        known = math.prod(d for d in self.shape if d != -1)
        target = self.shape
        if -1 in target and size % known == 0:
            target = tuple(size // known if d == -1 else d for d in target)
        if math.prod(target) != size or len(input_shape) not in (1, 2, 3):
            raise ValueError(f"Expect an input of 1 to 3 dims with the size of shape {self.shape}, "
                             f"got shape {tuple(input_shape)} (size {size})")
        self.input_shape, self.output_shape = tuple(input_shape), target
        return self.output_shape


class _GlobalPool(Layer):
    """Pool over the spatial axes of a (C, H, W) input or the time axis of a
    (T, F) input: internal (N, K, C) -> (N, C)."""

    def build(self, input_shape):
        if len(input_shape) not in (2, 3):
            raise ValueError(f"Expect a (C, H, W) or (T, F) input to {type(self).__name__}, "
                             f"got shape {tuple(input_shape)}")
        self.input_shape = tuple(input_shape)
        self.output_shape = (input_shape[0],) if len(input_shape) == 3 else (input_shape[1],)
        return self.output_shape

    def _rows(self, a):
        """``(N, *internal input shape)`` -> an (N, K, C) view."""
        return _contiguous(a).reshape(a.shape[0], -1, self.output_shape[0])


@register("layer")
class GlobalAvgPool(_GlobalPool):
    """Mean over the spatial axes, (C, H, W) -> (C,), or over time, (T, F) -> (F,)."""

    def forward(self, x, training):
        xp = get_array_module(x)
        x3 = self._rows(x)
        y = self._buffer("y", (x3.shape[0], x3.shape[2]), x)
        xp.sum(x3, axis=1, out=y)
        y *= 1.0 / x3.shape[1]
        self._x_shape = x.shape
        return y

    def backward(self, dy, need_dx):
        if not need_dx:
            return None
        xp = get_array_module(dy)
        dx = self._buffer("dx", self._x_shape, dy)
        dx3 = self._rows(dx)
        xp.multiply(dy[:, None, :], 1.0 / dx3.shape[1], out=dx3)
        return dx


@register("layer")
class GlobalMaxPool(_GlobalPool):
    """Maximum over the spatial axes, (C, H, W) -> (C,), or over time,
    (T, F) -> (F,); the gradient goes to the first maximal element (as
    :class:`~sparkavg.nn.layers.MaxPool2D`)."""

    def _base(self, n, k, c, like):
        """Flat offset of element (i, 0, j) of an (n, k, c) array, as (n, c) int64."""
        key = ("base", n, k, c)
        base = self._ws.get(key)
        if base is None:
            xp = get_array_module(like)
            base = (xp.arange(n, dtype=np.int64)[:, None] * (k * c) + xp.arange(c, dtype=np.int64)[None, :])
            self._ws[key] = base
        return base

    def forward(self, x, training):
        xp = get_array_module(x)
        x3 = self._rows(x)
        n, k, c = x3.shape
        index = self._buffer("index", (n, c), x, dtype=np.int64)
        index[...] = xp.argmax(x3, axis=1)  # the first maximum, as MaxPool2D
        index *= c
        index += self._base(n, k, c, x)
        y = self._buffer("y", (n, c), x)
        xp.take(x3.reshape(-1), index, out=y)
        self._x_shape, self._index = x.shape, index
        return y

    def backward(self, dy, need_dx):
        if not need_dx:
            return None
        dx = self._buffer("dx", self._x_shape, dy)
        dx.fill(0)
        dx.reshape(-1)[self._index.reshape(-1)] = _contiguous(dy).reshape(-1)
        return dx
