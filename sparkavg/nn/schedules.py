"""Learning-rate schedules: a rate that changes with the iteration or the epoch.

A schedule stands wherever a learning rate does: ``Adam(lr=CosineSchedule(1e-3,
steps=5000))``, ``SGD(lr=StepSchedule(0.1, 0.5, 1000))``, for every updater.
The model's flat state resolves it at each step
(:meth:`sparkavg.nn.flatstate.FlatState.step_updater`: ``compute_update``, ``fit_batch``) from its global :attr:`iteration` and its :attr:`epoch`, so a
:class:`~sparkavg.nn.Network`, a :class:`~sparkavg.nn.Graph` and a
:class:`~sparkavg.torch.TorchModel` all follow it, on one process or on Spark:
parameter averaging's workers start every round from the round's shipped
iteration and epoch, gradient sharing's ranks step in lockstep, and a resumed
fit continues the schedule from its checkpoint's counters.  The rate of a step
also scales its weight decay.

Every schedule is a frozen :class:`~sparkavg.configurable.Configurable`
registered under the kind ``"schedule"``; an updater's ``to_config()`` nests
it (``{"type": "Adam", "lr": {"type": "CosineSchedule", ...}}``) and
``from_config`` rebuilds it.  Two keyword fields are common to all:

``by``
    ``"iteration"`` (the model's completed updater steps, the default) or
    ``"epoch"`` (its completed epochs): the ``i`` of the formulas below.
``scale``
    A factor on the whole schedule (default 1).  ``updater.learning_rate``
    is the schedule's :attr:`Schedule.base_rate` (``scale`` times its
    initial or peak rate), and ``updater.with_learning_rate(r)`` -- what a
    fit's divergence recovery calls (``Recover(lr_factor=...)``) -- changes
    ``scale`` so that the base rate becomes ``r``: the whole schedule, warm-up
    and floor included, is multiplied by ``r / base_rate`` and keeps its shape.

=======================  ==================================================
schedule                 rate at ``i`` (before ``scale``)
=======================  ==================================================
``StepSchedule``         ``initial * decay_rate ** floor(i / step)``
``ExponentialSchedule``  ``initial * gamma ** i``
``InverseSchedule``      ``initial / (1 + gamma * i) ** power``
``PolySchedule``         ``initial * (1 - i / max_iter) ** power``, 0 from ``max_iter``
``SigmoidSchedule``      ``initial / (1 + exp(-gamma * (i - step_size)))``
``MapSchedule``          the value of the largest key ``<= i`` (key 0 required)
``CosineSchedule``       linear warm-up, then cosine from ``peak`` to ``floor``
``OneCycleSchedule``     PyTorch's ``OneCycleLR``
=======================  ==================================================

The first six are DL4J's (``org.nd4j.linalg.schedule``), with its parameter
meanings.  ``PolySchedule`` follows Caffe's ``poly`` policy and DL4J's
original ``LearningRatePolicy.Poly`` ("polynomial decay that hits 0 when
iterations are complete"); the later nd4j class computes
``initial * (1 + i / max_iter) ** power``, which grows, against its own
documentation.

A rate must be finite and > 0 wherever it is evaluated: a schedule that goes
to 0 (``PolySchedule`` at ``max_iter``, ``CosineSchedule`` with ``floor=0``
at its last step), below it or overflows raises :class:`ScheduleError`,
naming the schedule, the iteration, the epoch and the value, before the step
changes anything.  Bad parameters are refused when the schedule is built.
"""
from __future__ import annotations

import bisect
import dataclasses
import math
import numbers
from dataclasses import dataclass
from typing import ClassVar, Literal, Mapping, Sequence, Tuple, Union

from ..configurable import Configurable, register

__all__ = ["Schedule", "ScheduleError", "StepSchedule", "ExponentialSchedule", "InverseSchedule", "PolySchedule",
           "SigmoidSchedule", "MapSchedule", "CosineSchedule", "OneCycleSchedule"]

#: What ``by`` may name.
BY = ("iteration", "epoch")


class ScheduleError(ValueError):
    """A schedule's rate is not finite and > 0 where a step evaluates it."""


def _real(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _check(name: str, value, ok: bool, expected: str):
    if not ok:
        raise ValueError(f"Expect {name} {expected}, got {value!r}")
    return value


def _finite(name, value, low=None, *, above=True):
    """``value`` a finite real, > ``low`` (``above``) or >= it."""
    ok = _real(value) and math.isfinite(value)
    if low is None:
        return _check(name, value, ok, "finite")
    ok = ok and (value > low if above else value >= low)
    return _check(name, value, ok, f"{'>' if above else '>='} {low:g} and finite")


def _count(name, value, low):
    ok = isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= low
    return _check(name, value, ok, f"as an int >= {low}")


@dataclass(frozen=True)
class Schedule(Configurable):
    """Base class: a learning rate as a function of the iteration or the epoch.

    A subclass defines :meth:`rate_at` (its formula) and names the field of
    its initial or peak rate (:attr:`base_field`), and registers itself
    under ``"schedule"``.

    Parameters
    ----------
    by : {"iteration", "epoch"}, default "iteration"
        What ``i`` counts (keyword only).
    scale : float, default 1
        A factor on every rate (keyword only); see the module doc.
    """

    _config_kind = "schedule"

    by: Literal["iteration", "epoch"] = dataclasses.field(default="iteration", kw_only=True)
    """What the schedule follows: the model's iteration or its epoch."""
    scale: float = dataclasses.field(default=1.0, kw_only=True)
    """A factor on the whole schedule (the divergence recovery changes it)."""

    def __post_init__(self):
        if self.by not in BY:
            raise ValueError(f"Expect by in {list(BY)}, got {self.by!r}")
        _finite("scale", self.scale, 0)
        if self.base_field:
            _finite(self.base_field, getattr(self, self.base_field), 0)

    def config_arguments(self) -> dict:
        """The schedule's own fields, then ``by`` and ``scale``."""
        own = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in ("by", "scale")}
        return {**own, "by": self.by, "scale": self.scale}

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in self.config_arguments().items())
        return f"{type(self).__name__}({args})"

    #: The field holding the schedule's initial or peak rate (:attr:`base`).
    base_field: ClassVar[str] = "initial"

    @property
    def base(self) -> float:
        """The schedule's own initial or peak rate (its :attr:`base_field`), before :attr:`scale`."""
        return float(getattr(self, self.base_field))

    def rate_at(self, i: int) -> float:  # pragma: no cover - abstract
        """The rate at iteration or epoch ``i``, before :attr:`scale` (unchecked)."""
        raise NotImplementedError

    @property
    def base_rate(self) -> float:
        """``scale * base``: what ``updater.learning_rate`` reports."""
        return self.scale * float(self.base)

    def with_base_rate(self, rate: float) -> "Schedule":
        """This schedule with :attr:`scale` set so that :attr:`base_rate` is ``rate``
        (every rate multiplied by ``rate / base_rate``)."""
        _finite("the base rate", rate, 0)
        return dataclasses.replace(self, scale=float(rate) / float(self.base))

    def value(self, iteration: int, epoch: int) -> float:
        """The learning rate of the step at ``iteration`` in ``epoch`` (both
        counted from 0: completed steps and completed epochs).

        Raises
        ------
        ScheduleError
            The rate is not finite and > 0 there (naming the schedule, the
            iteration, the epoch and the value).
        """
        i = iteration if self.by == "iteration" else epoch
        try:
            rate = self.scale * self.rate_at(int(i))
        except OverflowError:
            rate = math.inf
        if not (rate > 0 and math.isfinite(rate)):
            hint = (f"a schedule that decays to 0 must end after the fit's last {self.by} or keep a floor above 0"
                    if rate <= 0 else "its parameters make it grow without bound")
            raise ScheduleError(f"Expect a finite learning rate > 0 from {self!r} at iteration {iteration}, epoch "
                                f"{epoch} ({self.by} {i}), got {rate!r}: {hint}")
        return rate

    def rates(self, steps: int) -> list:
        """The rates at ``i = 0 .. steps - 1`` (iterations or epochs, as
        ``by`` says), checked as :meth:`value` checks them: for plots and tests."""
        return [self.value(i, i) for i in range(int(steps))]


# ------------------------------------------------------------------ DL4J's
@register("schedule")
@dataclass(frozen=True, repr=False)
class StepSchedule(Schedule):
    """Step decay (DL4J's ``StepSchedule``): ``initial * decay_rate ** floor(i / step)``.

    Parameters
    ----------
    initial : float
        The rate at ``i = 0`` (> 0).
    decay_rate : float
        The factor every ``step`` (> 0; below 1 decays).
    step : float
        Iterations or epochs per decay (> 0).
    """

    initial: float
    decay_rate: float
    step: float

    def __post_init__(self):
        super().__post_init__()
        _finite("decay_rate", self.decay_rate, 0)
        _finite("step", self.step, 0)

    def rate_at(self, i):
        return self.initial * self.decay_rate ** math.floor(i / self.step)


@register("schedule")
@dataclass(frozen=True, repr=False)
class ExponentialSchedule(Schedule):
    """Exponential decay (DL4J's ``ExponentialSchedule``): ``initial * gamma ** i``,
    ``initial`` the rate at ``i = 0`` (> 0) and ``gamma`` the factor per
    iteration or epoch (> 0; below 1 decays)."""

    initial: float
    gamma: float

    def __post_init__(self):
        super().__post_init__()
        _finite("gamma", self.gamma, 0)

    def rate_at(self, i):
        return self.initial * self.gamma ** i


@register("schedule")
@dataclass(frozen=True, repr=False)
class InverseSchedule(Schedule):
    """Inverse decay (DL4J's ``InverseSchedule``): ``initial / (1 + gamma * i) ** power``,
    ``initial`` the rate at ``i = 0`` (> 0), ``gamma >= 0``, ``power`` finite
    (> 0 decays)."""

    initial: float
    gamma: float
    power: float

    def __post_init__(self):
        super().__post_init__()
        _finite("gamma", self.gamma, 0, above=False)
        _finite("power", self.power)

    def rate_at(self, i):
        return self.initial * (1.0 + self.gamma * i) ** -self.power  # underflows to 0 where a division overflows


@register("schedule")
@dataclass(frozen=True, repr=False)
class PolySchedule(Schedule):
    """Polynomial decay to 0 at ``max_iter``: ``initial * (1 - i / max_iter) ** power``
    (Caffe's ``poly``; see the module doc for DL4J's versions).

    The rate is 0 from ``i = max_iter`` on, which a step refuses
    (:class:`ScheduleError`): choose ``max_iter`` beyond the fit's last
    iteration (or epoch).

    Parameters
    ----------
    initial : float
        The rate at ``i = 0`` (> 0).
    power : float
        >= 0 (1: linear decay).
    max_iter : int
        >= 1.
    """

    initial: float
    power: float
    max_iter: int

    def __post_init__(self):
        super().__post_init__()
        _finite("power", self.power, 0, above=False)
        _count("max_iter", self.max_iter, 1)

    def rate_at(self, i):
        if i >= self.max_iter:
            return 0.0
        return self.initial * (1.0 - i / self.max_iter) ** self.power


@register("schedule")
@dataclass(frozen=True, repr=False)
class SigmoidSchedule(Schedule):
    """Sigmoid (DL4J's ``SigmoidSchedule``): ``initial / (1 + exp(-gamma * (i - step_size)))``.

    A positive ``gamma`` rises to ``initial`` around ``step_size`` (a soft
    warm-up), a negative one falls from it.

    Parameters
    ----------
    initial : float
        The rate the sigmoid tends to (> 0).
    gamma : float
        Its steepness (finite).
    step_size : float
        Where it is at half of ``initial`` (finite).
    """

    initial: float
    gamma: float
    step_size: float

    def __post_init__(self):
        super().__post_init__()
        _finite("gamma", self.gamma)
        _finite("step_size", self.step_size)

    def rate_at(self, i):
        z = -self.gamma * (i - self.step_size)
        if z > 0:  # exp(-z) never overflows: initial * e / (e + 1), e = exp(-z)
            e = math.exp(-z)
            return self.initial * e / (1.0 + e)
        return self.initial / (1.0 + math.exp(z))


def _pairs(values) -> Tuple[Tuple[int, float], ...]:
    """``values`` (a mapping or (key, value) pairs) as sorted, checked pairs."""
    items = list(values.items()) if isinstance(values, Mapping) else values
    if not isinstance(items, (list, tuple)):
        raise ValueError(f"Expect values as a dict of iteration or epoch -> rate (or [key, rate] pairs), got "
                         f"{values!r:.200}")
    pairs = {}
    for item in items:
        if not (isinstance(item, (tuple, list)) and len(item) == 2):
            raise ValueError(f"Expect values as [key, rate] pairs, got the item {item!r:.100}")
        key, rate = item
        if isinstance(key, str) and key.strip().isdigit():  # JSON object keys
            key = int(key)
        _count("every values key", key, 0)
        _finite(f"values[{key}]", rate, 0)
        if int(key) in pairs:
            raise ValueError(f"Expect each values key once, got {key!r} twice")
        pairs[int(key)] = float(rate)
    if 0 not in pairs:
        raise ValueError(f"Expect values with the key 0 (the initial rate), got keys {sorted(pairs)}")
    return tuple(sorted(pairs.items()))


@register("schedule")
@dataclass(frozen=True, repr=False)
class MapSchedule(Schedule):
    """Rates by iteration or epoch (DL4J's ``MapSchedule``): the value of the
    largest key ``<= i``; ``{0: 0.1, 10: 0.05, 20: 0.01}`` gives 0.1 for
    0-9, 0.05 for 10-19, 0.01 from 20.

    Parameters
    ----------
    values : dict of int -> float, or [key, rate] pairs
        Keys >= 0, key 0 required; rates > 0.  Kept (and saved) as sorted
        ``(key, rate)`` pairs.
    """

    values: Union[Mapping[str, float], Sequence[Tuple[int, float]]]

    base_field: ClassVar[str] = ""  # values[0]

    def __post_init__(self):
        super().__post_init__()
        object.__setattr__(self, "values", _pairs(self.values))

    @property
    def base(self) -> float:
        return self.values[0][1]

    def rate_at(self, i):
        keys = [k for k, _ in self.values]
        return self.values[bisect.bisect_right(keys, i) - 1][1]


# -------------------------------------------------------------- cosine family
@register("schedule")
@dataclass(frozen=True, repr=False)
class CosineSchedule(Schedule):
    """Linear warm-up, then cosine annealing from ``peak`` to ``floor``.

    For ``i < warmup``: ``peak * (i + 1) / (warmup + 1)``; for
    ``warmup <= i <= steps``: ``floor + (peak - floor) * (1 + cos(pi * (i -
    warmup) / (steps - warmup))) / 2``; after ``steps``: ``floor``.  Without
    warm-up this is PyTorch's ``CosineAnnealingLR(T_max=steps,
    eta_min=floor)`` (for ``i <= steps``); with it, ``LinearLR(start_factor=1
    / (warmup + 1), total_iters=warmup)`` followed by that cosine over
    ``steps - warmup``.

    With ``floor=0`` the rate reaches 0 at ``i = steps``, which a step
    refuses (:class:`ScheduleError`): make ``steps`` the fit's number of
    iterations (or epochs), or give a floor.

    Parameters
    ----------
    peak : float
        The rate after the warm-up (> 0).
    steps : int
        Iterations (or epochs) from 0 to the end of the cosine, warm-up included (>= 1).
    warmup : int, default 0
        Warm-up iterations (or epochs), ``0 <= warmup < steps``.
    floor : float, default 0
        The rate at the end, ``0 <= floor < peak``.
    """

    peak: float
    steps: int
    warmup: int = 0
    floor: float = 0.0

    base_field: ClassVar[str] = "peak"

    def __post_init__(self):
        super().__post_init__()
        _count("steps", self.steps, 1)
        _count("warmup", self.warmup, 0)
        if self.warmup >= self.steps:
            raise ValueError(f"Expect warmup < steps (a cosine of at least one step), got warmup={self.warmup}, "
                             f"steps={self.steps}")
        _finite("floor", self.floor, 0, above=False)
        if self.floor >= self.peak:
            raise ValueError(f"Expect floor < peak, got floor={self.floor!r}, peak={self.peak!r}")

    def rate_at(self, i):
        if i < self.warmup:
            return self.peak * (i + 1) / (self.warmup + 1)
        if i >= self.steps:
            return self.floor
        t = (i - self.warmup) / (self.steps - self.warmup)
        return self.floor + (self.peak - self.floor) * (1.0 + math.cos(math.pi * t)) / 2.0


def _anneal(kind: str, start: float, end: float, pct: float) -> float:
    if kind == "cos":
        return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1.0)
    return (end - start) * pct + start


@register("schedule")
@dataclass(frozen=True, repr=False)
class OneCycleSchedule(Schedule):
    """The 1cycle policy, as PyTorch's ``OneCycleLR`` computes it.

    From ``max_lr / div_factor`` up to ``max_lr`` over the first
    ``pct_start * total_steps - 1`` steps, then down to ``max_lr /
    div_factor / final_div_factor`` at step ``total_steps - 1`` (``anneal``:
    ``"cos"`` or ``"linear"``); ``three_phase=True`` comes back to the
    initial rate first, as PyTorch's does.  After ``total_steps - 1`` the
    rate stays at the last one (PyTorch raises).

    Parameters
    ----------
    max_lr : float
        The peak rate (> 0).
    total_steps : int
        Iterations (or epochs) of the cycle.
    pct_start : float, default 0.3
        The share of the cycle spent rising, in (0, 1).
    anneal : {"cos", "linear"}, default "cos"
    div_factor : float, default 25
        ``initial rate = max_lr / div_factor`` (> 0).
    final_div_factor : float, default 1e4
        ``final rate = initial rate / final_div_factor`` (> 0).
    three_phase : bool, default False
    """

    max_lr: float
    total_steps: int
    pct_start: float = 0.3
    anneal: Literal["cos", "linear"] = "cos"
    div_factor: float = 25.0
    final_div_factor: float = 1e4
    three_phase: bool = False

    base_field: ClassVar[str] = "max_lr"

    def __post_init__(self):
        super().__post_init__()
        _count("total_steps", self.total_steps, 2)
        _check("pct_start", self.pct_start, _real(self.pct_start) and 0 < self.pct_start < 1, "in (0, 1)")
        _check("anneal", self.anneal, self.anneal in ("cos", "linear"), "in ['cos', 'linear']")
        _finite("div_factor", self.div_factor, 0)
        _finite("final_div_factor", self.final_div_factor, 0)
        _check("three_phase", self.three_phase, isinstance(self.three_phase, bool), "as a bool")
        ends = [end for end, _, _ in self._phases()]
        if not all(b > a for a, b in zip([0.0] + ends, ends)):
            raise ValueError(f"Expect every phase of OneCycleSchedule to last at least one step, got phases "
                             f"ending at steps [{', '.join(f'{e:g}' for e in ends)}] for total_steps={self.total_steps}, "
                             f"pct_start={self.pct_start}: raise total_steps or pct_start")


    def _phases(self) -> list:
        """``(end step, start rate, end rate)`` per phase, as PyTorch's."""
        initial = self.max_lr / self.div_factor
        final = initial / self.final_div_factor
        rise = float(self.pct_start * self.total_steps) - 1
        last = float(self.total_steps - 1)
        if self.three_phase:
            return [(rise, initial, self.max_lr), (2 * rise, self.max_lr, initial), (last, initial, final)]
        return [(rise, initial, self.max_lr), (last, self.max_lr, final)]

    def rate_at(self, i):
        phases = self._phases()
        start = 0.0
        for number, (end, low, high) in enumerate(phases):
            if i <= end or number == len(phases) - 1:
                pct = min(1.0, (i - start) / (end - start))
                return _anneal(self.anneal, low, high, pct)
            start = end
        raise AssertionError("unreachable")  # pragma: no cover
