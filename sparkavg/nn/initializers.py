"""Seedable weight initialisation (DL4J's schemes).

Draws are made on the host in float64 from a ``numpy.random.Generator``
and cast to the network's dtype, so one seed gives bit-identical networks
on every machine, and the float32 and float64 versions of a network agree
up to rounding.  Biases start at zero (DL4J's default ``biasInit``).

=================  ==========================================================
name               distribution (fan_in, fan_out as DL4J computes them)
=================  ==========================================================
``xavier``         Normal(0, sd = sqrt(2 / (fan_in + fan_out))) -- DL4J
                   ``WeightInit.XAVIER`` (Gaussian, not truncated)
``xavier_uniform`` Uniform(-a, a), a = sqrt(6 / (fan_in + fan_out))
``he``             Normal(0, sd = sqrt(2 / fan_in)) -- DL4J ``RELU``
``he_uniform``     Uniform(-a, a), a = sqrt(6 / fan_in) -- DL4J ``RELU_UNIFORM``
``normal``         Normal(0, sd = 1 / sqrt(fan_in)) -- DL4J ``NORMAL``
``uniform``        Uniform(-a, a), a = 1 / sqrt(fan_in) -- DL4J ``UNIFORM``
``zeros``          all zeros (tests, debugging)
=================  ==========================================================

Fans follow DL4J: a dense layer has fan_in = n_in, fan_out = n_out; a
convolution has fan_in = C_in*KH*KW and fan_out = F*KH*KW / (SH*SW).
"""
from __future__ import annotations

import math

import numpy as np

__all__ = ["WEIGHT_INITS", "check_weight_init", "init_weights"]

WEIGHT_INITS = ("xavier", "xavier_uniform", "he", "he_uniform", "normal", "uniform", "zeros")


def check_weight_init(name: str) -> str:
    """Return ``name`` if it is a known scheme, else raise ValueError."""
    if name not in WEIGHT_INITS:
        raise ValueError(f"Expect weight_init in {WEIGHT_INITS}, got {name!r}")
    return name


def init_weights(name: str, shape, fan_in: float, fan_out: float, rng: np.random.Generator):
    """A float64 numpy array of ``shape`` drawn from scheme ``name``."""
    check_weight_init(name)
    if name == "zeros":
        return np.zeros(shape)
    if name == "xavier":
        return rng.standard_normal(shape) * math.sqrt(2.0 / (fan_in + fan_out))
    if name == "xavier_uniform":
        a = math.sqrt(6.0 / (fan_in + fan_out))
    elif name == "he":
        return rng.standard_normal(shape) * math.sqrt(2.0 / fan_in)
    elif name == "he_uniform":
        a = math.sqrt(6.0 / fan_in)
    elif name == "normal":
        return rng.standard_normal(shape) / math.sqrt(fan_in)
    else:  # uniform
        a = 1.0 / math.sqrt(fan_in)
    return rng.uniform(-a, a, size=shape)
