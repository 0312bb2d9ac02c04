"""Updaters: frozen dataclasses that turn a flat gradient into a flat update.

Each updater owns nothing but its hyper-parameters; its state lives in one
flat vector the network allocates (``state_size(n)`` values for ``n``
parameters), so averaging and saving treat it like the parameters.

``apply(update, grads, state, iteration)`` ADDS the step to ``update``
(the network passes a zeroed buffer, so it receives exactly the update the
parameters get) through the fused in-place kernels of :mod:`sparkavg.ops`.
``iteration`` counts completed steps; Adam's bias correction uses
``t = iteration + 1``.

=============  ===============  ==============================================
updater        state            formula (see sparkavg/ops/reference.py)
=============  ===============  ==============================================
``SGD``        none             u = -lr*g
``Nesterov``   v (n)            DL4J's Nesterov momentum
``Adagrad``    h (n)            h += g^2; u = -lr*g/(sqrt(h)+eps)
``RMSProp``    c (n)            c = d*c + (1-d)*g^2; u = -lr*g/(sqrt(c)+eps)
``Adam``       [m | v] (2n)     Kingma & Ba with bias correction
``Nadam``      [m | v] (2n)     Dozat's Nesterov Adam (numpy/CuPy, no kernel)
=============  ===============  ==============================================

Defaults are DL4J's.  Every updater is a :class:`~sparkavg.configurable.Configurable`
registered under the kind ``"updater"``: ``u.to_config()`` gives
``{"type": "Adam", "lr": 0.001, ...}`` and
``from_config(config, kind="updater")`` rebuilds it, naming any badly typed
field.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import ClassVar

from .. import ops
from ..backend import get_array_module
from ..configurable import Configurable, register

__all__ = ["Updater", "SGD", "Nesterov", "Adagrad", "RMSProp", "Adam", "Nadam"]


def _real(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _positive(name, value):
    if not (_real(value) and math.isfinite(value) and value > 0):
        raise ValueError(f"Expect {name} > 0, got {value!r}")


def _unit(name, value):
    if not (_real(value) and 0 <= value < 1):
        raise ValueError(f"Expect 0 <= {name} < 1, got {value!r}")


@dataclass(frozen=True)
class Updater(Configurable):
    """Base class: the learning rate; ``to_config()`` comes with the mixin."""

    _config_kind = "updater"

    lr: float = 0.1
    """Learning rate."""

    #: Whether the step is linear in the gradient (SGD, Nesterov): the sum of
    #: several workers' steps on their gradients is one step on the summed gradient.
    linear: ClassVar[bool] = False

    def __post_init__(self):
        _positive("lr", self.lr)

    def state_size(self, num_params: int) -> int:
        """Length of the flat state vector for ``num_params`` parameters."""
        return 0

    def apply(self, update, grads, state, iteration: int) -> None:  # pragma: no cover - abstract
        """Add this step's update to ``update`` in place, advancing ``state``."""
        raise NotImplementedError

    def noise_moment(self, num_params: int):
        """The slice of the state holding a first moment (a running mean of
        the gradients) whose spread across averaged workers measures their
        gradient noise, or None: nothing to correct after averaging (see
        :meth:`correct_averaged_state`)."""
        return None

    def velocity(self, num_params: int):
        """The slice of the state holding a velocity (a momentum that keeps
        moving the parameters after its gradient), or None.  Gradient
        sharing clears it where a message sent the entry
        (:class:`~sparkavg.spark.policies.sharing.MomentumMasking`)."""
        return None

    def correct_averaged_state(self, state, moment_sq, sent, workers: int, steps: int, blocks=None) -> None:
        """Correct an average of ``workers`` workers' states in place (nothing
        to correct here; :class:`Adam` corrects its second moment)."""


@register("updater")
@dataclass(frozen=True)
class SGD(Updater):
    """Plain stochastic gradient descent: ``u = -lr * g``."""

    linear: ClassVar[bool] = True

    lr: float = 0.1
    """Learning rate."""

    def apply(self, update, grads, state, iteration):
        ops.sgd_step(update, grads, self.lr)


@register("updater")
@dataclass(frozen=True)
class Nesterov(Updater):
    """Nesterov momentum (DL4J's formulation); state = velocity (n)."""

    linear: ClassVar[bool] = True

    lr: float = 0.1
    """Learning rate."""
    momentum: float = 0.9
    """Momentum coefficient mu, 0 <= mu < 1."""

    def __post_init__(self):
        super().__post_init__()
        _unit("momentum", self.momentum)

    def state_size(self, num_params):
        return num_params

    def apply(self, update, grads, state, iteration):
        ops.nesterov_step(update, grads, state, self.lr, self.momentum)

    def velocity(self, num_params):
        """The whole state: the velocity."""
        return slice(0, num_params)


@register("updater")
@dataclass(frozen=True)
class Adagrad(Updater):
    """Adagrad; state = sum of squared gradients (n)."""

    lr: float = 0.1
    """Learning rate."""
    eps: float = 1e-6
    """Added to sqrt(history) in the denominator."""

    def __post_init__(self):
        super().__post_init__()
        _positive("eps", self.eps)

    def state_size(self, num_params):
        return num_params

    def apply(self, update, grads, state, iteration):
        ops.adagrad_step(update, grads, state, self.lr, self.eps)


@register("updater")
@dataclass(frozen=True)
class RMSProp(Updater):
    """RMSProp; state = running mean of squared gradients (n)."""

    lr: float = 0.1
    """Learning rate."""
    decay: float = 0.95
    """Decay of the running mean, 0 <= decay < 1."""
    eps: float = 1e-8
    """Added to sqrt(cache) in the denominator."""

    def __post_init__(self):
        super().__post_init__()
        _unit("decay", self.decay)
        _positive("eps", self.eps)

    def state_size(self, num_params):
        return num_params

    def apply(self, update, grads, state, iteration):
        ops.rmsprop_step(update, grads, state, self.lr, self.decay, self.eps)


@register("updater")
@dataclass(frozen=True)
class Adam(Updater):
    """Adam; state = [m | v] (2n), bias-corrected with t = iteration + 1."""

    lr: float = 1e-3
    """Learning rate."""
    beta1: float = 0.9
    """Decay of the first moment, 0 <= beta1 < 1."""
    beta2: float = 0.999
    """Decay of the second moment, 0 <= beta2 < 1."""
    eps: float = 1e-8
    """Added to sqrt(v) in the denominator."""

    def __post_init__(self):
        super().__post_init__()
        _unit("beta1", self.beta1)
        _unit("beta2", self.beta2)
        _positive("eps", self.eps)

    def state_size(self, num_params):
        return 2 * num_params

    def apply(self, update, grads, state, iteration):
        n = grads.shape[0]
        ops.adam_step(update, grads, state[:n], state[n:], self.lr, self.beta1, self.beta2,
                      self.eps, t=iteration + 1)

    def noise_moment(self, num_params):
        """``m``: its spread across workers measures their gradient noise."""
        return slice(0, num_params)

    def correct_averaged_state(self, state, moment_sq, sent, workers, steps, blocks=None):
        """The averaged second moment as one process at the workers' combined
        batch would have it (parameter averaging).

        Each of ``K = workers`` workers adds ``g^2`` of its own ``B``-example
        gradients to ``v``: ``E[g_B^2] = mu^2 + s^2 / B``, where one process
        at ``K B`` examples per step adds ``mu^2 + s^2 / (K B)``.  The plain
        average of the workers' ``v`` is therefore too large by ``(1 - 1/K)
        s^2 / B`` in the share of ``v`` written this round, and Adam's steps
        ``m / sqrt(v)`` too small: up to ``1/sqrt(K)`` where the noise
        dominates (measured: benchmarks/history/torch.md).  The workers' ``m``
        started the round equal, so their spread is noise: its variance
        across workers is ``c s^2 / B`` with ``c = (1 - b1) / (1 + b1) (1 -
        b1^(2 F))`` after ``F = steps`` steps, which gives the excess to take
        off the round's share ``1 - b2^F`` of ``v``.  With few workers one
        coordinate's spread is too noisy to use alone (2 workers: one
        degree of freedom), so the excess is pooled per block (a parameter
        tensor): each block keeps the fraction ``1 - excess / added`` of
        what the round added to its ``v``, in ``[1/K, 1]`` (``E[g_KB^2] >=
        E[g_B^2] / K``).

        Parameters
        ----------
        state : ndarray (2n,)
            The workers' average ``[m | v]``; ``v`` corrected in place.
        moment_sq : ndarray (n,)
            The workers' average of ``m * m`` (same weights).
        sent : ndarray (2n,)
            The state every worker started the round from.
        workers : int
            Workers averaged (nothing is corrected below 2).
        steps : int
            Minibatches each worker fitted this round.
        blocks : list of (start, stop), optional
            Ranges of the parameters pooled together (the model's
            parameter segments); default: all of them as one block.
        """
        n = state.shape[0] // 2
        if workers < 2 or steps < 1 or n == 0:
            return
        xp = get_array_module(state)
        b1, b2 = self.beta1, self.beta2
        c = (1.0 - b1) / (1.0 + b1) * (1.0 - b1 ** (2 * steps))
        m, v = state[:n], state[n:]
        spread = xp.maximum(moment_sq - m * m, 0.0)  # the workers' variance of m (weighted, population)
        # (1 - 1/K) s^2/B from a population variance of K values: spread * K/(K-1) / c * (1 - 1/K) = spread / c
        excess = spread * ((1.0 - b2 ** steps) / c)
        added = xp.maximum(v - (b2 ** steps) * sent[n:], 0.0)  # what this round wrote into v
        for start, stop in blocks or [(0, n)]:
            total = float(added[start:stop].sum())
            if total > 0.0:
                keep = min(1.0, max(1.0 / workers, 1.0 - float(excess[start:stop].sum()) / total))
                v[start:stop] -= (1.0 - keep) * added[start:stop]


@register("updater")
@dataclass(frozen=True)
class Nadam(Adam):
    """Nesterov-accelerated Adam (Dozat 2016, the simplified form Keras and
    DL4J use); state = [m | v] (2n)::

        m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g^2
        u = -lr * (b1*m/(1-b1^(t+1)) + (1-b1)*g/(1-b1^t)) / (sqrt(v/(1-b2^t)) + eps)

    There is no fused kernel for it; it runs as xp array expressions.
    """

    def apply(self, update, grads, state, iteration):
        xp = get_array_module(grads)
        ty = grads.dtype.type
        n = grads.shape[0]
        m, v = state[:n], state[n:]
        t = iteration + 1
        b1, b2 = self.beta1, self.beta2
        m *= ty(b1)
        m += ty(1.0 - b1) * grads
        v *= ty(b2)
        v += ty(1.0 - b2) * grads * grads
        numer = ty(b1 / (1.0 - b1 ** (t + 1))) * m + ty((1.0 - b1) / (1.0 - b1**t)) * grads
        denom = xp.sqrt(v * ty(1.0 / (1.0 - b2**t)))
        denom += ty(self.eps)
        update -= ty(self.lr) * numer / denom

