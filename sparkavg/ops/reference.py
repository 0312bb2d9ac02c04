"""Pure-numpy (xp-generic) twins of every kernel: the oracle the fast
paths are tested against, and the path taken when
``SPARKAVG_PURE_NUMPY=1``.

Updater formulas (all in place; ``params`` may be a zero buffer, in which
case it receives the update itself -- that is how gradient sharing gets
"the update after the updater"):

- SGD:      p -= lr*g
- Nesterov: v_prev = v; v = mu*v - lr*g; p += -mu*v_prev + (1+mu)*v
- Adagrad:  h += g*g; p -= lr*g / (sqrt(h) + eps)
- RMSProp:  c = decay*c + (1-decay)*g*g; p -= lr*g / (sqrt(c) + eps)
- Adam:     m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g*g;
            alpha = lr*sqrt(1-b2**t)/(1-b1**t); p -= alpha*m / (sqrt(v) + eps)
"""
from __future__ import annotations

import math

from ..backend import get_array_module

__all__ = [
    "accumulate",
    "scale",
    "sgd_step",
    "nesterov_step",
    "adagrad_step",
    "rmsprop_step",
    "adam_step",
]


# ---------------------------------------------------------------- averaging
def accumulate(buffer, x, weight=1.0):
    """buffer += weight * x, in place."""
    if weight == 1.0:
        buffer += x
    else:
        buffer += x * buffer.dtype.type(weight)
    return buffer


def scale(buffer, factor):
    """buffer *= factor, in place."""
    buffer *= buffer.dtype.type(factor)
    return buffer


# ----------------------------------------------------------------- updaters
def sgd_step(params, grads, lr):
    params -= params.dtype.type(lr) * grads
    return params


def nesterov_step(params, grads, velocity, lr, momentum):
    t = params.dtype.type
    v_prev = velocity.copy()
    velocity *= t(momentum)
    velocity -= t(lr) * grads
    params += t(-momentum) * v_prev + t(1.0 + momentum) * velocity
    return params


def adagrad_step(params, grads, history, lr, eps=1e-6):
    xp = get_array_module(params)
    t = params.dtype.type
    history += grads * grads
    params -= t(lr) * grads / (xp.sqrt(history) + t(eps))
    return params


def rmsprop_step(params, grads, cache, lr, decay=0.95, eps=1e-8):
    xp = get_array_module(params)
    t = params.dtype.type
    cache *= t(decay)
    cache += t(1.0 - decay) * grads * grads
    params -= t(lr) * grads / (xp.sqrt(cache) + t(eps))
    return params


def adam_step(params, grads, m, v, lr, beta1=0.9, beta2=0.999, eps=1e-8, t=1):
    xp = get_array_module(params)
    ty = params.dtype.type
    if t < 1:
        raise ValueError(f"Expect Adam step count t >= 1, got {t}")
    m *= ty(beta1)
    m += ty(1.0 - beta1) * grads
    v *= ty(beta2)
    v += ty(1.0 - beta2) * grads * grads
    alpha = lr * math.sqrt(1.0 - beta2**t) / (1.0 - beta1**t)
    params -= ty(alpha) * m / (xp.sqrt(v) + ty(eps))
    return params
