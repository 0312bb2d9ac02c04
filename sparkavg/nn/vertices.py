"""Vertices that combine several inputs in a :class:`~sparkavg.nn.graph.Graph`
(DL4J's ``MergeVertex`` and ``ElementWiseVertex``; Keras' ``Concatenate``,
``Add``, ``Multiply``).

A combining vertex has no parameters.  It is built from its inputs'
shapes (NCHW convention), runs forward on the internal arrays ((N, H, W,
C) or (N, F): channels last, so merging along channels is merging along
the last axis) and hands back one gradient array per input.  Ownership as
for layers (:mod:`sparkavg.nn.layers`): the arrays it returns are its own
or the one it received, and never the same array twice -- a gradient that
goes to two inputs goes as two arrays, so that each consumer may overwrite
what it gets.
"""
from __future__ import annotations

from ..backend import get_array_module
from ..configurable import Configurable, register

__all__ = ["Combine", "Merge", "Add", "Multiply"]


class Combine(Configurable):
    """Base of the combining vertices (registered under the kind ``"combine"``)."""

    _config_kind = "combine"

    def __init__(self):
        self.input_shapes = None
        self.output_shape = None
        self._ws = {}

    def config_arguments(self) -> dict:
        return {}

    def __repr__(self):
        return f"{type(self).__name__}()"

    def build(self, shapes: list) -> tuple:
        """Fix the input shapes; return the output shape."""
        raise NotImplementedError

    def _buffer(self, name, shape, like):
        key = (name, tuple(shape))
        buf = self._ws.get(key)
        if buf is None:
            if len(self._ws) > 32:
                self._ws = {}
            buf = self._ws[key] = get_array_module(like).empty(shape, dtype=like.dtype)
        return buf

    def reset_workspace(self) -> None:
        self._ws = {}

    def forward(self, xs: list, training: bool):
        raise NotImplementedError

    def backward(self, dy, need: list) -> list:
        """One gradient per input (None where ``need[i]`` is false)."""
        raise NotImplementedError


def _same_shapes(name, shapes):
    if len(shapes) < 2:
        raise ValueError(f"Expect at least 2 inputs to {name}, got {len(shapes)}")
    if any(tuple(s) != tuple(shapes[0]) for s in shapes):
        raise ValueError(f"Expect inputs of one shape to {name}, got {[tuple(s) for s in shapes]}")
    return tuple(shapes[0])


@register("combine")
class Merge(Combine):
    """Concatenation along channels ((C_i, H, W) -> (sum C_i, H, W)),
    features ((F_i,) -> (sum F_i,)) or a sequence's features ((T, F_i) ->
    (T, sum F_i)); DL4J's ``MergeVertex``."""

    def build(self, shapes):
        shapes = [tuple(s) for s in shapes]
        if len(shapes) < 2:
            raise ValueError(f"Expect at least 2 inputs to Merge, got {len(shapes)}")
        ranks = {len(s) for s in shapes}
        sequences = ranks == {2}  # (T, F): merged along F, the last axis as along channels
        rest = [s[:-1] if sequences else s[1:] for s in shapes]
        if len(ranks) != 1 or any(r != rest[0] for r in rest):
            what = "steps T of (T, F) sequences" if sequences else "dimensions after the first (channel or feature)"
            raise ValueError(f"Expect Merge inputs of one rank whose {what} agree, got {shapes}")
        self.input_shapes = shapes
        self._widths = [s[-1] if sequences else s[0] for s in shapes]
        width = sum(self._widths)
        self.output_shape = rest[0] + (width,) if sequences else (width,) + rest[0]
        return self.output_shape

    def forward(self, xs, training):
        xp = get_array_module(xs[0])
        out = self._buffer("y", xs[0].shape[:-1] + (sum(self._widths),), xs[0])
        return xp.concatenate(xs, axis=-1, out=out)

    def backward(self, dy, need):
        xp = get_array_module(dy)
        grads, start = [], 0
        for i, (width, needed) in enumerate(zip(self._widths, need)):
            if needed:
                dx = self._buffer(f"dx{i}", dy.shape[:-1] + (width,), dy)
                xp.copyto(dx, dy[..., start:start + width])
                grads.append(dx)
            else:
                grads.append(None)
            start += width
        return grads


@register("combine")
class Add(Combine):
    """Element-wise sum of inputs of one shape (a residual connection);
    DL4J's ``ElementWiseVertex(Op.Add)``."""

    def build(self, shapes):
        self.input_shapes = [tuple(s) for s in shapes]
        self.output_shape = _same_shapes("Add", shapes)
        return self.output_shape

    def forward(self, xs, training):
        xp = get_array_module(xs[0])
        out = self._buffer("y", xs[0].shape, xs[0])
        xp.add(xs[0], xs[1], out=out)
        for x in xs[2:]:
            out += x
        return out

    def backward(self, dy, need):
        grads, handed = [], False
        for i, needed in enumerate(need):
            if not needed:
                grads.append(None)
            elif not handed:
                grads.append(dy)  # the array received goes to one input ...
                handed = True
            else:  # ... the others get copies: each consumer may overwrite its own
                dx = self._buffer(f"dx{i}", dy.shape, dy)
                dx[...] = dy
                grads.append(dx)
        return grads


@register("combine")
class Multiply(Combine):
    """Element-wise product of inputs of one shape (gating);
    DL4J's ``ElementWiseVertex(Op.Product)``."""

    def build(self, shapes):
        self.input_shapes = [tuple(s) for s in shapes]
        self.output_shape = _same_shapes("Multiply", shapes)
        return self.output_shape

    def forward(self, xs, training):
        xp = get_array_module(xs[0])
        out = self._buffer("y", xs[0].shape, xs[0])
        xp.multiply(xs[0], xs[1], out=out)
        for x in xs[2:]:
            out *= x
        self._xs = xs
        return out

    def backward(self, dy, need):
        xp = get_array_module(dy)
        grads = []
        for i, needed in enumerate(need):
            if not needed:
                grads.append(None)
                continue
            dx = self._buffer(f"dx{i}", dy.shape, dy)
            dx[...] = dy
            for j, x in enumerate(self._xs):
                if j != i:
                    xp.multiply(dx, x, out=dx)
            grads.append(dx)
        return grads
