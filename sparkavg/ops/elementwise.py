"""Averaging and updater steps: one pass over flat vectors, in place.

Each function checks its arrays (see :mod:`sparkavg.ops._dispatch` for
what is converted and what is rejected), then runs the Cython kernel
(numpy float32), the CuPy kernel (CuPy arrays) or the numpy reference
(float64, or ``SPARKAVG_PURE_NUMPY=1``).  Formulas: see
:mod:`sparkavg.ops.reference`.  Arrays of any shape are accepted as long
as all operands share it; ``params`` may be a zero buffer, which then
receives the update itself.

``n_threads`` (keyword, Cython path only) splits the vectors into that many
contiguous chunks under OpenMP; the default is 1 because each Spark task
owns one core.  On the 2-core development machine two threads did not pay
(see benchmarks/RESULTS.md).
"""
from __future__ import annotations

import math

from . import _cuda, reference
from ._dispatch import (
    CUDA,
    CYTHON,
    REFERENCE,
    check_inplace,
    check_operand,
    check_threads,
    ext,
    route,
)

__all__ = [
    "accumulate",
    "scale",
    "sgd_step",
    "nesterov_step",
    "adagrad_step",
    "rmsprop_step",
    "adam_step",
]


def _flat(a):
    return a.reshape(-1)


def accumulate(buffer, x, weight=1.0, *, n_threads=None):
    """``buffer += weight * x`` in place, without temporaries.

    Parameters
    ----------
    buffer : float32/float64 array (numpy or CuPy), C-contiguous, writeable
    x : array of the same kind, dtype and shape (strided: copied)
    weight : float
    n_threads : int or None, Cython path only

    Returns
    -------
    buffer
    """
    kind = check_inplace("buffer", buffer)
    x = check_operand("x", x, buffer, "buffer")
    path = route(kind, buffer.dtype)
    if path == CYTHON:
        ext.averaging.accumulate(_flat(buffer), _flat(x), float(weight), check_threads(n_threads))
    elif path == CUDA:
        _cuda.accumulate(buffer, x, weight)
    else:
        reference.accumulate(buffer, x, weight)
    return buffer


def scale(buffer, factor, *, n_threads=None):
    """``buffer *= factor`` in place; returns ``buffer``."""
    kind = check_inplace("buffer", buffer)
    path = route(kind, buffer.dtype)
    if path == CYTHON:
        ext.averaging.scale(_flat(buffer), float(factor), check_threads(n_threads))
    elif path == CUDA:
        _cuda.scale(buffer, factor)
    else:
        reference.scale(buffer, factor)
    return buffer


def sgd_step(params, grads, lr, *, n_threads=None):
    """``params -= lr * grads`` in place; returns ``params``."""
    kind = check_inplace("params", params)
    grads = check_operand("grads", grads, params, "params")
    path = route(kind, params.dtype)
    if path == CYTHON:
        ext.updaters.sgd_step(_flat(params), _flat(grads), float(lr), check_threads(n_threads))
    elif path == CUDA:
        _cuda.sgd_step(params, grads, lr)
    else:
        reference.sgd_step(params, grads, lr)
    return params


def nesterov_step(params, grads, velocity, lr, momentum, *, n_threads=None):
    """Nesterov momentum step in place (params and velocity); returns ``params``."""
    kind = check_inplace("params", params)
    check_inplace("velocity", velocity)
    grads = check_operand("grads", grads, params, "params")
    check_operand("velocity", velocity, params, "params")
    path = route(kind, params.dtype)
    if path == CYTHON:
        mu = float(momentum)
        ext.updaters.nesterov_step(_flat(params), _flat(grads), _flat(velocity), float(lr),
                                   mu, -mu, 1.0 + mu, check_threads(n_threads))
    elif path == CUDA:
        _cuda.nesterov_step(params, grads, velocity, lr, momentum)
    else:
        reference.nesterov_step(params, grads, velocity, lr, momentum)
    return params


def adagrad_step(params, grads, history, lr, eps=1e-6, *, n_threads=None):
    """Adagrad step in place (params and history); returns ``params``."""
    kind = check_inplace("params", params)
    check_inplace("history", history)
    grads = check_operand("grads", grads, params, "params")
    check_operand("history", history, params, "params")
    path = route(kind, params.dtype)
    if path == CYTHON:
        ext.updaters.adagrad_step(_flat(params), _flat(grads), _flat(history), float(lr),
                                  float(eps), check_threads(n_threads))
    elif path == CUDA:
        _cuda.adagrad_step(params, grads, history, lr, eps)
    else:
        reference.adagrad_step(params, grads, history, lr, eps)
    return params


def rmsprop_step(params, grads, cache, lr, decay=0.95, eps=1e-8, *, n_threads=None):
    """RMSProp step in place (params and cache); returns ``params``."""
    kind = check_inplace("params", params)
    check_inplace("cache", cache)
    grads = check_operand("grads", grads, params, "params")
    check_operand("cache", cache, params, "params")
    path = route(kind, params.dtype)
    if path == CYTHON:
        d = float(decay)
        ext.updaters.rmsprop_step(_flat(params), _flat(grads), _flat(cache), float(lr),
                                  d, 1.0 - d, float(eps), check_threads(n_threads))
    elif path == CUDA:
        _cuda.rmsprop_step(params, grads, cache, lr, decay, eps)
    else:
        reference.rmsprop_step(params, grads, cache, lr, decay, eps)
    return params


def adam_step(params, grads, m, v, lr, beta1=0.9, beta2=0.999, eps=1e-8, t=1, *,
              n_threads=None):
    """Fused Adam step in place (params, m, v); ``t`` >= 1 is the step
    count for bias correction.  Returns ``params``."""
    kind = check_inplace("params", params)
    check_inplace("m", m)
    check_inplace("v", v)
    grads = check_operand("grads", grads, params, "params")
    check_operand("m", m, params, "params")
    check_operand("v", v, params, "params")
    if t < 1:
        raise ValueError(f"Expect Adam step count t >= 1, got {t}")
    path = route(kind, params.dtype)
    if path == REFERENCE:
        reference.adam_step(params, grads, m, v, lr, beta1, beta2, eps, t)
        return params
    # The same double-precision expression as the reference, rounded once.
    alpha = lr * math.sqrt(1.0 - beta2**t) / (1.0 - beta1**t)
    b1, b2 = float(beta1), float(beta2)
    if path == CYTHON:
        ext.updaters.adam_step(_flat(params), _flat(grads), _flat(m), _flat(v), b1, 1.0 - b1,
                               b2, 1.0 - b2, alpha, float(eps), check_threads(n_threads))
    else:
        _cuda.adam_step(params, grads, m, v, b1, b2, alpha, eps)
    return params

