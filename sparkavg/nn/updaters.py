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

``lr`` is a float or a :class:`~sparkavg.nn.schedules.Schedule`
(``Adam(lr=CosineSchedule(1e-3, steps=5000))``).  A model resolves a
schedule at each step to a constant rate (:meth:`Updater.at_rate`), so
``apply`` always sees a float; :attr:`Updater.learning_rate` is the base
rate either way, and :meth:`Updater.with_learning_rate` scales a schedule
to a new base rate.

Defaults are DL4J's.  Every updater is a :class:`~sparkavg.configurable.Configurable`
registered under the kind ``"updater"``: ``u.to_config()`` gives
``{"type": "Adam", "lr": 0.001, ...}`` and
``from_config(config, kind="updater")`` rebuilds it, naming any badly typed
field.
"""
from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass
from typing import ClassVar, Dict, Optional, Tuple

from .. import ops
from ..backend import get_array_module
from ..configurable import Configurable, register
from .schedules import Schedule

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

    lr: float | Schedule = 0.1
    """Learning rate: a float > 0 or a :class:`~sparkavg.nn.schedules.Schedule`."""

    #: Whether the step is linear in the gradient (SGD, Nesterov): the sum of
    #: several workers' steps on their gradients is one step on the summed gradient.
    linear: ClassVar[bool] = False

    def __post_init__(self):
        if _real(self.lr):
            _positive("lr", self.lr)
        elif not isinstance(self.lr, Schedule):
            raise ValueError(f"Expect lr as a float > 0 or a Schedule (sparkavg.nn.schedules), got {self.lr!r}")

    #: The state's named slots, in order, each one vector of ``num_params``.
    slot_names: ClassVar[Tuple[str, ...]] = ()
    #: What a strategy may know of the slots: role -> slot name.  Roles:
    #: ``"first_moment"`` (an exponential mean of the gradients, decayed by
    #: :meth:`decays`), ``"second_moment"`` (of their squares), ``"velocity"``
    #: (a momentum that keeps moving the parameters after its gradient).
    roles: ClassVar[Dict[str, str]] = {}

    def state_size(self, num_params: int) -> int:
        """Length of the flat state vector for ``num_params`` parameters."""
        return len(self.slot_names) * num_params

    def apply(self, update, grads, state, iteration: int) -> None:  # pragma: no cover - abstract
        """Add this step's update to ``update`` in place, advancing ``state``."""
        raise NotImplementedError

    def slots(self, num_params: int) -> Dict[str, slice]:
        """Each named slot's range in the flat state of ``num_params`` parameters."""
        return {name: slice(i * num_params, (i + 1) * num_params) for i, name in enumerate(self.slot_names)}

    def slot(self, role: str, num_params: int) -> Optional[slice]:
        """The range of the slot playing ``role`` (see :attr:`roles`), or None."""
        name = self.roles.get(role)
        return None if name is None else self.slots(num_params)[name]

    def decays(self) -> Dict[str, float]:
        """The decay of each exponential-mean slot by name (Adam: ``beta1``, ``beta2``)."""
        return {}

    @property
    def schedule(self) -> Optional[Schedule]:
        """The learning-rate schedule, or None for a constant rate."""
        return self.lr if isinstance(self.lr, Schedule) else None

    @property
    def learning_rate(self) -> float:
        """The base learning rate: ``lr``, or a schedule's
        :attr:`~sparkavg.nn.schedules.Schedule.base_rate` (its initial or
        peak rate times its ``scale``)."""
        if isinstance(self.lr, Schedule):
            return self.lr.base_rate
        return float(self.lr)

    def with_learning_rate(self, lr) -> "Updater":
        """This updater with another learning rate (updaters are frozen).

        Parameters
        ----------
        lr : float or Schedule
            A schedule replaces the rate.  A float replaces a constant rate;
            on a scheduled updater it sets the schedule's ``scale`` so that
            its base rate becomes ``lr``: the whole schedule is multiplied by
            ``lr / learning_rate`` (what a divergence recovery does).
        """
        if isinstance(self.lr, Schedule) and not isinstance(lr, Schedule):
            return dataclasses.replace(self, lr=self.lr.with_base_rate(lr))
        return dataclasses.replace(self, lr=lr)

    def rate(self, iteration: int, epoch: int) -> float:
        """The learning rate of the step at ``iteration`` in ``epoch``
        (:meth:`Schedule.value <sparkavg.nn.schedules.Schedule.value>`, or the constant)."""
        if isinstance(self.lr, Schedule):
            return self.lr.value(iteration, epoch)
        return float(self.lr)

    def _constant_lr(self) -> float:
        """``lr`` for :meth:`apply`, which takes a constant rate."""
        if isinstance(self.lr, Schedule):
            raise TypeError(f"Expect an updater at a constant rate in apply(), got the schedule {self.lr!r}: apply "
                            f"updater.at_rate(updater.rate(iteration, epoch)), as a model's step does")
        return self.lr

    def at_rate(self, rate: float) -> "Updater":
        """This updater with the constant learning rate ``rate``: what one
        step of a scheduled updater applies."""
        return dataclasses.replace(self, lr=rate)


@register("updater")
@dataclass(frozen=True)
class SGD(Updater):
    """Plain stochastic gradient descent: ``u = -lr * g``."""

    linear: ClassVar[bool] = True

    lr: float | Schedule = 0.1
    """Learning rate (a float or a schedule)."""

    def apply(self, update, grads, state, iteration):
        ops.sgd_step(update, grads, self._constant_lr())


@register("updater")
@dataclass(frozen=True)
class Nesterov(Updater):
    """Nesterov momentum (DL4J's formulation); state = velocity (n)."""

    linear: ClassVar[bool] = True
    slot_names: ClassVar[Tuple[str, ...]] = ("velocity",)
    roles: ClassVar[Dict[str, str]] = {"velocity": "velocity"}

    lr: float | Schedule = 0.1
    """Learning rate (a float or a schedule)."""
    momentum: float = 0.9
    """Momentum coefficient mu, 0 <= mu < 1."""

    def __post_init__(self):
        super().__post_init__()
        _unit("momentum", self.momentum)

    def apply(self, update, grads, state, iteration):
        ops.nesterov_step(update, grads, state, self._constant_lr(), self.momentum)


@register("updater")
@dataclass(frozen=True)
class Adagrad(Updater):
    """Adagrad; state = sum of squared gradients (n)."""

    slot_names: ClassVar[Tuple[str, ...]] = ("sum_sq",)

    lr: float | Schedule = 0.1
    """Learning rate (a float or a schedule)."""
    eps: float = 1e-6
    """Added to sqrt(history) in the denominator."""

    def __post_init__(self):
        super().__post_init__()
        _positive("eps", self.eps)

    def apply(self, update, grads, state, iteration):
        ops.adagrad_step(update, grads, state, self._constant_lr(), self.eps)


@register("updater")
@dataclass(frozen=True)
class RMSProp(Updater):
    """RMSProp; state = running mean of squared gradients (n)."""

    slot_names: ClassVar[Tuple[str, ...]] = ("mean_sq",)

    lr: float | Schedule = 0.1
    """Learning rate (a float or a schedule)."""
    decay: float = 0.95
    """Decay of the running mean, 0 <= decay < 1."""
    eps: float = 1e-8
    """Added to sqrt(cache) in the denominator."""

    def __post_init__(self):
        super().__post_init__()
        _unit("decay", self.decay)
        _positive("eps", self.eps)

    def apply(self, update, grads, state, iteration):
        ops.rmsprop_step(update, grads, state, self._constant_lr(), self.decay, self.eps)


@register("updater")
@dataclass(frozen=True)
class Adam(Updater):
    """Adam; state = [m | v] (2n), bias-corrected with t = iteration + 1."""

    slot_names: ClassVar[Tuple[str, ...]] = ("m", "v")
    roles: ClassVar[Dict[str, str]] = {"first_moment": "m", "second_moment": "v"}

    lr: float | Schedule = 1e-3
    """Learning rate (a float or a schedule)."""
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

    def apply(self, update, grads, state, iteration):
        n = grads.shape[0]
        ops.adam_step(update, grads, state[:n], state[n:], self._constant_lr(), self.beta1, self.beta2,
                      self.eps, t=iteration + 1)

    def decays(self):
        return {"m": self.beta1, "v": self.beta2}


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
        update -= ty(self._constant_lr()) * numer / denom

