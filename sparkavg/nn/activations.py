"""Element-wise activations, applied in place, with derivatives taken from
the activation's OUTPUT (so a layer keeps one array per step, not two).

Every function is xp-generic (numpy or CuPy).  ``softmax`` acts along the
last axis of a 2-D (batch, units) array.
"""
from __future__ import annotations

from ..backend import get_array_module

__all__ = ["ACTIVATIONS", "LEAKY_RELU_ALPHA", "check_activation", "forward", "backward"]

#: Slope of leaky ReLU for negative inputs (DL4J's default).
LEAKY_RELU_ALPHA = 0.01

ACTIVATIONS = ("identity", "relu", "leaky_relu", "tanh", "sigmoid", "softmax")


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


def forward(name: str, z):
    """Apply activation ``name`` to ``z`` in place and return it."""
    if name == "identity":
        return z
    xp = get_array_module(z)
    if name == "relu":
        xp.maximum(z, 0, out=z)
    elif name == "leaky_relu":
        z *= xp.where(z > 0, 1.0, LEAKY_RELU_ALPHA).astype(z.dtype, copy=False)
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


def backward(name: str, dy, y):
    """Turn dL/dy into dL/dz in place, given the activation's output ``y``."""
    if name == "identity":
        return dy
    xp = get_array_module(dy)
    one = dy.dtype.type(1.0)
    if name == "relu":
        dy *= y > 0
    elif name == "leaky_relu":
        # y > 0 exactly where z > 0, since the negative slope is positive.
        dy *= xp.where(y > 0, 1.0, LEAKY_RELU_ALPHA).astype(dy.dtype, copy=False)
    elif name == "tanh":
        dy *= one - y * y
    elif name == "sigmoid":
        dy *= y * (one - y)
    elif name == "softmax":
        # Jacobian-vector product of softmax: y * (dy - <dy, y>).
        dy -= (dy * y).sum(axis=1, keepdims=True)
        dy *= y
    else:
        check_activation(name)
    return dy
