"""Element-wise activations, applied in place, with derivatives taken from
the activation's OUTPUT (so a layer keeps one array per step, not two).

Every function is xp-generic (numpy or CuPy).  ``softmax`` acts along the
last axis of a 2-D (batch, units) array.

``work`` is an optional scratch array of the input's shape and dtype that
a layer keeps between steps; the activations in :data:`NEEDS_WORK` use it
instead of allocating temporaries (a fresh array per call when None).
Results are the same either way, to the last bit.
"""
from __future__ import annotations

from ..backend import get_array_module

__all__ = ["ACTIVATIONS", "LEAKY_RELU_ALPHA", "NEEDS_WORK", "check_activation", "forward", "backward"]

#: Slope of leaky ReLU for negative inputs (DL4J's default).
LEAKY_RELU_ALPHA = 0.01

ACTIVATIONS = ("identity", "relu", "leaky_relu", "tanh", "sigmoid", "softmax")

#: Activations whose forward or backward take a ``work`` array.
NEEDS_WORK = frozenset({"leaky_relu", "tanh", "sigmoid"})


def check_activation(name: str) -> str:
    """Return ``name`` if it is a known activation, else raise ValueError."""
    if name not in ACTIVATIONS:
        raise ValueError(f"Expect an activation in {ACTIVATIONS}, got {name!r}")
    return name


def softmax_(z):
    """Row-wise softmax of a 2-D array, in place (max-shifted, so stable)."""
    xp = get_array_module(z)
    z -= z.max(axis=1, keepdims=True)
    xp.exp(z, out=z)
    z /= z.sum(axis=1, keepdims=True)
    return z


def _work(work, like, xp):
    return xp.empty_like(like) if work is None else work


def forward(name: str, z, work=None):
    """Apply activation ``name`` to ``z`` in place and return it (``work``:
    scratch of ``z``'s shape and dtype, see the module doc)."""
    if name == "identity":
        return z
    xp = get_array_module(z)
    if name == "relu":
        xp.maximum(z, 0, out=z)
    elif name == "leaky_relu":
        # max(z, alpha*z) for 0 < alpha < 1: z where z > 0, else the same
        # product z*alpha the slope gives; NaN stays NaN.
        work = _work(work, z, xp)
        xp.multiply(z, z.dtype.type(LEAKY_RELU_ALPHA), out=work)
        xp.maximum(z, work, out=z)
    elif name == "tanh":
        xp.tanh(z, out=z)
    elif name == "sigmoid":
        # 0.5*(1 + tanh(z/2)) equals 1/(1+exp(-z)) and cannot overflow.
        z *= z.dtype.type(0.5)
        xp.tanh(z, out=z)
        z *= z.dtype.type(0.5)
        z += z.dtype.type(0.5)
    elif name == "softmax":
        if z.ndim != 2:
            raise ValueError(f"Expect a 2-D (batch, units) input to softmax, got shape {z.shape}")
        softmax_(z)
    else:
        check_activation(name)
    return z


def backward(name: str, dy, y, work=None):
    """Turn dL/dy into dL/dz in place, given the activation's output ``y``
    (``work``: scratch of ``dy``'s shape and dtype, see the module doc)."""
    if name == "identity":
        return dy
    xp = get_array_module(dy)
    one = dy.dtype.type(1.0)
    if name == "relu":
        dy *= y > 0
    elif name == "leaky_relu":
        # y > 0 exactly where z > 0, since the negative slope is positive;
        # the slope max(y > 0, alpha) is exactly 1 or alpha.
        work = _work(work, dy, xp)
        xp.greater(y, 0, out=work)
        xp.maximum(work, dy.dtype.type(LEAKY_RELU_ALPHA), out=work)
        dy *= work
    elif name == "tanh":
        work = _work(work, dy, xp)
        xp.multiply(y, y, out=work)
        xp.subtract(one, work, out=work)
        dy *= work
    elif name == "sigmoid":
        work = _work(work, dy, xp)
        xp.subtract(one, y, out=work)
        work *= y
        dy *= work
    elif name == "softmax":
        # Jacobian-vector product of softmax: y * (dy - <dy, y>).
        dy -= (dy * y).sum(axis=1, keepdims=True)
        dy *= y
    else:
        check_activation(name)
    return dy
