"""Averaging and updater steps: one pass over flat vectors, in place.

Each function checks its arrays (see :mod:`sparkavg.ops._checks` for
what is converted and what is rejected), then runs the Cython kernel
(numpy float32), the CuPy kernel (CuPy arrays) or the numpy reference
(float64, or ``SPARKAVG_PURE_NUMPY=1``), as :mod:`sparkavg.ops._dispatch`
routes.  Formulas: see :mod:`sparkavg.ops.reference`.  Arrays of any shape are accepted as long
as all operands share it; ``params`` may be a zero buffer, which then
receives the update itself.

``n_threads`` (keyword, Cython path only) splits the vectors into that many
contiguous chunks under OpenMP; the default is 1 because each Spark task
owns one core.  On the 2-core development machine two threads did not pay
(see benchmarks/history/kernels.md).

:func:`unchecked` is the one way around the checks, for callers whose
arrays are right by construction (the network engine, per step).
"""
from __future__ import annotations

import numpy as np

from ._checks import check_inplace, check_operand, check_threads
from ._dispatch import call
from ._kernels import ELEMENTWISE

__all__ = list(ELEMENTWISE)


def unchecked(operation: str, like, *args):
    """Run backend ``operation`` (:data:`sparkavg.ops._kernels.OPERATIONS`)
    where the routing rule sends ``like``'s kind and dtype, WITHOUT the
    front's checks; returns what the backend returns.

    Internal: for :mod:`sparkavg.nn`, which calls a few kernels per layer
    and step on arrays it allocated itself, C-contiguous and of one float
    dtype on one device, with the shapes the front would check; the front's
    checks cost more than a small layer's kernel.  Arguments are the
    backend's (the front's, less ``n_threads``; ``out`` arrays given).
    Anything else must go through the checked fronts.
    """
    return call(operation, "numpy" if isinstance(like, np.ndarray) else "cupy", like.dtype, *args)


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
    call("accumulate", kind, buffer.dtype, buffer, x, weight, n_threads=check_threads(n_threads))
    return buffer


def scale(buffer, factor, *, n_threads=None):
    """``buffer *= factor`` in place; returns ``buffer``."""
    kind = check_inplace("buffer", buffer)
    call("scale", kind, buffer.dtype, buffer, factor, n_threads=check_threads(n_threads))
    return buffer


def _state(params, grads, **state):
    """Check params, grads and the updater state; return (kind, grads)."""
    kind = check_inplace("params", params)
    for name, array in state.items():
        check_inplace(name, array)
        check_operand(name, array, params, "params")
    return kind, check_operand("grads", grads, params, "params")


def sgd_step(params, grads, lr, *, n_threads=None):
    """``params -= lr * grads`` in place; returns ``params``."""
    kind, grads = _state(params, grads)
    call("sgd_step", kind, params.dtype, params, grads, lr, n_threads=check_threads(n_threads))
    return params


def nesterov_step(params, grads, velocity, lr, momentum, *, n_threads=None):
    """Nesterov momentum step in place (params and velocity); returns ``params``."""
    kind, grads = _state(params, grads, velocity=velocity)
    call("nesterov_step", kind, params.dtype, params, grads, velocity, lr, momentum,
         n_threads=check_threads(n_threads))
    return params


def adagrad_step(params, grads, history, lr, eps=1e-6, *, n_threads=None):
    """Adagrad step in place (params and history); returns ``params``."""
    kind, grads = _state(params, grads, history=history)
    call("adagrad_step", kind, params.dtype, params, grads, history, lr, eps,
         n_threads=check_threads(n_threads))
    return params


def rmsprop_step(params, grads, cache, lr, decay=0.95, eps=1e-8, *, n_threads=None):
    """RMSProp step in place (params and cache); returns ``params``."""
    kind, grads = _state(params, grads, cache=cache)
    call("rmsprop_step", kind, params.dtype, params, grads, cache, lr, decay, eps,
         n_threads=check_threads(n_threads))
    return params


def adam_step(params, grads, m, v, lr, beta1=0.9, beta2=0.999, eps=1e-8, t=1, *,
              n_threads=None):
    """Fused Adam step in place (params, m, v); ``t`` >= 1 is the step
    count for bias correction.  Returns ``params``."""
    kind, grads = _state(params, grads, m=m, v=v)
    if t < 1:
        raise ValueError(f"Expect Adam step count t >= 1, got {t}")
    call("adam_step", kind, params.dtype, params, grads, m, v, lr, beta1, beta2, eps, t,
         n_threads=check_threads(n_threads))
    return params
