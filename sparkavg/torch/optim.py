"""torch.optim's optimizers and learning-rate schedulers as a sparkavg updater.

:class:`TorchOptimizer` is an :class:`~sparkavg.nn.updaters.Updater` that
steps with a ``torch.optim`` optimizer (``"torch.optim:AdamW"``, JSON
keyword arguments), optionally driven by a ``torch.optim.lr_scheduler``
scheduler.  Its per-parameter state tensors are views of the model's flat
updater vector, so averaging (example-weighted), the moment correction,
sharing's momentum masking, checkpoints and resumes act on them as on any
sparkavg updater's state:

- **Layout.**  One dry step on small stand-in parameters (a probe, once per
  configuration) finds what the optimizer keeps per parameter: each tensor
  shaped like its parameter (Adam's ``exp_avg``, ``exp_avg_sq``; SGD's
  ``momentum_buffer``) is a slot of the flat vector (``num_params`` values
  laid out as the parameters are); each other scalar (NAdam's
  ``mu_product``, ASGD's ``eta``) is a slot too, one value per parameter
  tensor at the first position of its range.  ``step`` is not kept: it is
  the model's global iteration, written in before every step, so every
  worker and every resume counts alike.  An optimizer keeping anything
  else (LBFGS's history, Adafactor's row and column factors) is refused,
  naming the optimizer and the state.
- **Roles.**  ``exp_avg`` is the first moment and ``exp_avg_sq`` the second
  (decays from ``betas``, when every group shares them); ``momentum_buffer``
  is a velocity.  Averaging's moment correction and sharing's momentum
  masking find them there (:attr:`TorchOptimizer.roles`).
- **A fresh start.**  At iteration 0 the optimizer initialises its state as
  torch does (SGD's first momentum is the gradient, Rprop's step sizes
  start at ``lr``); afterwards the state lives in the flat vector.
- **Parameter groups.**  ``param_groups=[{"params": "bias$|norm", "weight_decay":
  0.0}, {"params": "^backbone\\.", "lr": 1e-4}]``: ``"params"`` is a regular
  expression searched in each parameter's name (or a list of exact names);
  a parameter joins the first group that matches it, the others keep the
  optimizer's own arguments.  A group's ``lr`` is absolute; a schedule, a
  scheduler or a divergence recovery scales every group alike.
- **Rates.**  A float ``lr``, a sparkavg schedule
  (:mod:`sparkavg.nn.schedules`) or a torch scheduler
  (``scheduler="torch.optim.lr_scheduler:StepLR"``, ``scheduler_kwargs``,
  stepped once per epoch or per iteration): the scheduler's rates are
  computed from the model's epoch or iteration (a private copy of the
  optimizer and scheduler is stepped that many times), never from a
  per-worker counter, so every worker and every resume steps at the same rate.

The optimizer is bound to the flat vectors by
:meth:`FlatState._apply_updater <sparkavg.nn.flatstate.FlatState._apply_updater>`
(:meth:`TorchOptimizer.bind`, :mod:`sparkavg.torch.binding`); a model's
state is only its flat vectors, so rebuilding the binding loses nothing.
:mod:`sparkavg.torch.layout` checks the arguments and probes the layout.
"""
from __future__ import annotations

import copy
import dataclasses
import functools
import json
import logging
import math
import numbers
import re
import threading
from dataclasses import dataclass, field
from typing import Annotated, Any, Dict, Literal, Optional, Sequence, Tuple

from ..configurable import ConfigError, register
from ..nn.schedules import Schedule
from ..nn.updaters import Updater
from ..references import Names
from .binding import Binding, ScheduleTrack
from .layout import (Layout, accepted, check_kwargs, class_and_name, default_lr, display, is_torch_own, json_values,
                     probe)

__all__ = ["TorchOptimizer", "ROLES", "INTERVALS"]

logger = logging.getLogger(__name__)

#: The roles of state tensors a strategy may act on, by the names torch's optimizers give them.
ROLES = {"exp_avg": "first_moment", "exp_avg_sq": "second_moment", "momentum_buffer": "velocity"}

#: What a torch scheduler steps on: the model's completed epochs or iterations.
INTERVALS = ("epoch", "iteration")


def _torch():
    import torch

    return torch


class TorchCode(Names):
    """``Names`` of an optimizer or scheduler class: torch's own classes are
    allowed as they are; any other must be marked or trusted
    (:mod:`sparkavg.references`)."""

    def check_config_value(self, where, value):
        if isinstance(value, str):
            try:
                if is_torch_own(value, self.kind):
                    return value
            except ConfigError:
                pass  # the check below names what is wrong
        return super().check_config_value(where, value)


_LAYOUTS: Dict[str, Layout] = {}
_LAYOUTS_LOCK = threading.Lock()


@register("updater")
@dataclass(frozen=True, kw_only=True)
class TorchOptimizer(Updater):
    """A ``torch.optim`` optimizer as a sparkavg updater (see the module doc);
    keyword arguments only.

    Parameters
    ----------
    optimizer : str or type, default "torch.optim:Adam"
        ``"torch.optim:AdamW"`` or any ``torch.optim.Optimizer`` subclass by
        ``"package.module:Class"`` (marked ``@sparkavg.torch.optimizer`` for
        a loaded configuration to build it), or the class itself (one not
        importable by name trains in this process only).
    lr : float, Schedule or None
        The learning rate of the default group; None: ``kwargs["lr"]`` or
        the optimizer's own default.  A :mod:`sparkavg.nn.schedules`
        schedule scales every group alike.
    kwargs : dict
        The optimizer's other JSON keyword arguments (``betas``,
        ``weight_decay``, ``momentum`` ...).
    param_groups : sequence of dict
        ``{"params": regex or list of names, **options}``, in order; a
        parameter joins the first group that matches its name (``re.search``).
    scheduler : str or type, optional
        ``"torch.optim.lr_scheduler:StepLR"`` or any ``LRScheduler``
        subclass (marked ``@sparkavg.torch.scheduler`` to be loaded);
        ``ReduceLROnPlateau`` steps on a metric and is refused.
    scheduler_kwargs : dict
        Its JSON keyword arguments (``step_size``, ``gamma`` ...).
    scheduler_interval : {"epoch", "iteration"}, default "epoch"
        What the scheduler steps on: the model's completed epochs (torch's
        ``scheduler.step()`` after each epoch) or iterations (after each step).
    """

    _config_kind = "updater"

    optimizer: Annotated[Any, TorchCode("optimizer")] = "torch.optim:Adam"
    """The optimizer class, by name or itself."""
    lr: Optional[float | Schedule] = None
    """The default group's learning rate (None: the optimizer's default)."""
    kwargs: Dict[str, Any] = field(default_factory=dict)
    """The optimizer's keyword arguments other than ``lr``."""
    param_groups: Sequence[Dict[str, Any]] = ()
    """Groups of parameters by name with their own options."""
    scheduler: Annotated[Any, TorchCode("scheduler")] = None
    """A torch learning-rate scheduler class, by name or itself."""
    scheduler_kwargs: Dict[str, Any] = field(default_factory=dict)
    """The scheduler's keyword arguments."""
    scheduler_interval: Literal["epoch", "iteration"] = "epoch"
    """Whether the scheduler steps per epoch or per iteration."""

    def __post_init__(self):
        cls, stored, name = class_and_name(self.optimizer, "optimizer", "torch optimizer")
        object.__setattr__(self, "optimizer", stored)
        kwargs = json_values(self.kwargs, "optimizer_kwargs")
        lr = self.lr
        if "lr" in kwargs:
            if lr is not None:
                raise ValueError(f"Expect the learning rate of {name} once, as lr= or in optimizer_kwargs, got both "
                                 f"({lr!r} and {kwargs['lr']!r})")
            lr = kwargs.pop("lr")
        if lr is None:
            lr = default_lr(cls, name)
        if isinstance(lr, numbers.Integral) and not isinstance(lr, bool):
            lr = float(lr)
        object.__setattr__(self, "lr", lr)
        object.__setattr__(self, "kwargs", kwargs)
        super().__post_init__()  # lr > 0 or a schedule
        check_kwargs(cls, name, kwargs, "optimizer_kwargs", skip=("params", "lr"))
        object.__setattr__(self, "param_groups", tuple(self._groups(cls, name)))
        if self.scheduler_interval not in INTERVALS:
            raise ValueError(f"Expect scheduler_interval in {list(INTERVALS)}, got {self.scheduler_interval!r}")
        object.__setattr__(self, "scheduler_kwargs", json_values(self.scheduler_kwargs, "scheduler_kwargs"))
        if self.scheduler is not None:
            self._check_scheduler()
        elif self.scheduler_kwargs:
            raise ValueError(f"Expect scheduler_kwargs only with a scheduler, got {self.scheduler_kwargs!r:.200}")
        self.layout  # noqa: B018 -- probed now: a bad optimizer is named where it is made

    def _groups(self, cls, name):
        if isinstance(self.param_groups, (str, dict)) or not isinstance(self.param_groups, Sequence):
            raise ValueError(f"Expect param_groups as a list of dicts, got {self.param_groups!r:.200}")
        allowed, names = accepted(cls)
        groups = []
        for i, group in enumerate(self.param_groups):
            group = json_values(group, f"param_groups[{i}]")
            selector = group.get("params")
            if isinstance(selector, str):
                try:
                    re.compile(selector)
                except re.error as exc:
                    raise ValueError(f"Expect param_groups[{i}]['params'] as a regular expression or a list of "
                                     f"parameter names, got {selector!r} ({exc})") from None
            elif not (isinstance(selector, list) and selector and all(isinstance(s, str) for s in selector)):
                raise ValueError(f"Expect param_groups[{i}]['params'] as a regular expression or a list of parameter "
                                 f"names, got {selector!r:.100}")
            unknown = [k for k in group if k != "params" and allowed is not None and k not in allowed]
            if unknown:
                raise ValueError(f"Expect param_groups[{i}] options that {name} takes "
                                 f"({', '.join(n for n in names if n != 'params')}), got unknown {unknown}")
            lr = group.get("lr")
            if lr is not None and not (isinstance(lr, float) and math.isfinite(lr) and lr > 0):
                raise ValueError(f"Expect param_groups[{i}]['lr'] > 0, got {lr!r}")
            groups.append(group)
        return groups

    def _check_scheduler(self):
        torch = _torch()
        cls, stored, name = class_and_name(self.scheduler, "scheduler", "learning-rate scheduler")
        object.__setattr__(self, "scheduler", stored)
        if issubclass(cls, torch.optim.lr_scheduler.ReduceLROnPlateau):
            raise ValueError(f"Expect a scheduler whose rate follows the epoch or the iteration, got {name}, which steps "
                             f"on a metric (schedule by epoch instead, e.g. StepLR or CosineAnnealingLR)")
        if isinstance(self.lr, Schedule):
            raise ValueError(f"Expect one schedule: a torch scheduler ({name}) or a sparkavg schedule as lr, got both "
                             f"({self.lr!r})")
        check_kwargs(cls, name, self.scheduler_kwargs, "scheduler_kwargs", skip=("optimizer",))
        ScheduleTrack(self, range(1 + len(self.param_groups))).at(0)  # builds it: bad arguments named here

    # ------------------------------------------------------------ identity
    def config_arguments(self) -> dict:
        """The fields; an optimizer or scheduler class not importable by name cannot be saved or shipped."""
        for value, what in ((self.optimizer, "optimizer"), (self.scheduler, "scheduler")):
            if value is not None and not isinstance(value, str):
                raise ConfigError(f"Expect a torch {what} importable by name to save, checkpoint or ship the model to "
                                  f"Spark executors, got the class {display(value)!r}: define it at module level in "
                                  f"an importable module (not __main__ or a notebook) and pass 'package.module:Class'")
        return super().config_arguments()

    def __hash__(self):
        return hash(json.dumps(self._plain(), sort_keys=True))

    def _plain(self) -> dict:
        return {"optimizer": display(self.optimizer), "lr": repr(self.lr), "kwargs": self.kwargs,
                "param_groups": list(self.param_groups), "scheduler": display(self.scheduler)
                if self.scheduler is not None else None, "scheduler_kwargs": self.scheduler_kwargs,
                "scheduler_interval": self.scheduler_interval}

    @functools.cached_property
    def layout_key(self) -> str:
        """What fixes the state's layout and the binding: the optimizer, its
        arguments and the groups, not the rates."""
        groups = [{k: v for k, v in g.items() if k != "lr"} for g in self.param_groups]
        optimizer = self.optimizer if isinstance(self.optimizer, str) else f"<class {id(self.optimizer)}>"
        return json.dumps({"optimizer": optimizer, "kwargs": self.kwargs, "groups": groups}, sort_keys=True)

    @functools.cached_property
    def rates_key(self) -> str:
        """What fixes the groups' rates: the rates and the scheduler."""
        groups = [g.get("lr") for g in self.param_groups]
        scheduler = None if self.scheduler is None else display(self.scheduler)
        return json.dumps({"lr": repr(self.lr), "groups": groups, "scheduler": scheduler,
                           "kwargs": self.scheduler_kwargs, "interval": self.scheduler_interval}, sort_keys=True)

    @functools.cached_property
    def _track(self) -> ScheduleTrack:
        """The scheduler on a copy of every group (:meth:`rate`)."""
        return ScheduleTrack(self, range(1 + len(self.param_groups)))

    @functools.cached_property
    def optimizer_class(self) -> type:
        return class_and_name(self.optimizer, "optimizer", "torch optimizer")[0]

    @property
    def name(self) -> str:
        """The optimizer's name as messages give it."""
        return display(self.optimizer)

    @functools.cached_property
    def layout(self) -> Layout:
        """The per-parameter state the optimizer keeps (a probe step, once per layout)."""
        key = self.layout_key
        with _LAYOUTS_LOCK:
            found = _LAYOUTS.get(key)
        if found is None:
            options = [{}] + [{k: v for k, v in g.items() if k != "params"} for g in self.param_groups]
            found = probe(self.optimizer_class, self.name, self.learning_rate, self.kwargs, options)
            with _LAYOUTS_LOCK:
                _LAYOUTS[key] = found
        return found

    # --------------------------------------------------- the updater contract
    @property
    def slot_names(self) -> Tuple[str, ...]:
        """The state's slots (one ``num_params`` vector each), as the optimizer names them."""
        return self.layout.slots

    @property
    def roles(self) -> Dict[str, str]:
        """``first_moment``/``second_moment`` (``exp_avg``/``exp_avg_sq``, when
        every group shares its ``betas``) and ``velocity`` (``momentum_buffer``)."""
        layout = self.layout
        betas = set(layout.betas)
        moments = len(betas) == 1 and None not in betas and "exp_avg" in layout.slots  # decays known, one for all
        return {role: slot for slot, role in ROLES.items()
                if slot in layout.slots and (role == "velocity" or moments)}

    def decays(self) -> Dict[str, float]:
        """``exp_avg``: ``betas[0]``, ``exp_avg_sq``: ``betas[1]`` (where they play their roles)."""
        roles = self.roles
        if "first_moment" not in roles:
            return {}
        b1, b2 = self.layout.betas[0][:2]
        out = {"exp_avg": b1}
        if "second_moment" in roles:
            out["exp_avg_sq"] = b2
        return out

    @property
    def momentum(self) -> float:
        """The largest ``momentum`` of the groups (SGD's, RMSprop's; 0 for
        others): what averaging's block momentum and frequency bound read."""
        return max(self.layout.momentum)

    @property
    def linear(self) -> bool:
        """SGD without weight decay: the step is linear in the gradient."""
        return self.optimizer_class is _torch().optim.SGD and not any(self.layout.weight_decay)

    def apply(self, update, grads, state, iteration):
        raise TypeError(f"Expect {self.name} to step through the model that holds it (its state tensors are views of "
                        f"the model's flat vectors: TorchModel(..., optimizer=...)), got apply() on bare arrays")

    def bind(self, flat) -> "Binding":
        """This optimizer over ``flat``'s vectors (:class:`~sparkavg.nn.flatstate.FlatState`)."""
        return Binding(self, flat)

    # ----------------------------------------------------------------- rates
    def _scaled(self, factor: float, **changes) -> "TorchOptimizer":
        groups = tuple({**g, "lr": g["lr"] * factor} if "lr" in g else g for g in self.param_groups)
        return dataclasses.replace(self, param_groups=groups, **changes)

    def with_learning_rate(self, lr) -> "TorchOptimizer":
        """As :meth:`Updater.with_learning_rate`; every group's own rate is scaled alike."""
        if isinstance(lr, Schedule):
            return dataclasses.replace(self, lr=lr)
        factor = float(lr) / self.learning_rate
        new = super().with_learning_rate(lr)
        return new._scaled(factor) if self.param_groups else new

    def at_rate(self, rate: float) -> "TorchOptimizer":
        """The updater of one step at a scheduled ``rate``: every group
        scaled by ``rate / learning_rate`` (no new probe: the layout is kept)."""
        factor = float(rate) / self.learning_rate
        new = copy.copy(self)  # keeps the cached layout and class
        new.__dict__.pop("rates_key", None)
        object.__setattr__(new, "lr", float(rate))
        if self.param_groups:
            object.__setattr__(new, "param_groups", tuple({**g, "lr": g["lr"] * factor} if "lr" in g else g
                                                          for g in self.param_groups))
        return new

    def rate(self, iteration: int, epoch: int) -> float:
        """The default group's rate at ``iteration`` in ``epoch`` (a torch scheduler's included)."""
        if self.scheduler is None:
            return super().rate(iteration, epoch)
        count = epoch if self.scheduler_interval == "epoch" else iteration
        return float(self._track.at(count)[0]["lr"])

    def __repr__(self):
        extra = f", scheduler={display(self.scheduler)!r}" if self.scheduler is not None else ""
        return f"TorchOptimizer({self.name!r}, lr={self.lr!r}{extra})"
