"""What a torch optimizer (or scheduler) class is, and what it keeps per
parameter: the checks :class:`~sparkavg.torch.optim.TorchOptimizer` makes
of its arguments, and the probe that finds its state's :class:`Layout`
with one dry step on small stand-in parameters."""
from __future__ import annotations

import inspect
import numbers
import warnings
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

from ..references import KINDS, parse, reference_of, resolve

__all__ = ["Layout", "probe", "class_and_name", "display", "json_values", "accepted", "check_kwargs", "default_lr",
           "is_torch_own", "OWN"]

#: Shapes of the probe's stand-in parameters: a state tensor shaped like its
#: parameter has one of them; one of another shape is not per-parameter.
PROBE_SHAPES = ((3, 2), (5,))

#: Torch's own classes, allowed in a loaded configuration without a mark.
OWN = {"optimizer": ("torch.optim", "Optimizer"), "scheduler": ("torch.optim.lr_scheduler", "LRScheduler")}


def _torch():
    import torch

    return torch


def _package(kind):
    torch = _torch()
    return torch.optim if kind == "optimizer" else torch.optim.lr_scheduler


def _base(kind):
    return getattr(_package(kind), OWN[kind][1])


def is_torch_own(reference: str, kind: str) -> bool:
    """Whether ``reference`` names one of torch.optim's optimizer (or
    lr_scheduler's scheduler) classes: code a loader may build unmarked."""
    module, _ = parse(reference, KINDS[kind])
    package = OWN[kind][0]
    if module != package and not module.startswith(package + "."):
        return False
    obj = resolve(reference, kind)  # a module of torch itself
    return isinstance(obj, type) and issubclass(obj, _base(kind)) and obj.__module__.startswith("torch.optim")


def class_and_name(value, kind: str, what: str):
    """``(class, stored value, display name)`` of an optimizer or scheduler
    given as ``"package.module:Class"`` or as the class itself (stored by
    name where it is importable by one, else kept: this process only)."""
    if isinstance(value, str):
        cls = resolve(value, kind)
        stored = value
    elif isinstance(value, type):
        cls = value
        own = getattr(_package(kind), value.__name__, None)
        stored = f"{OWN[kind][0]}:{value.__name__}" if own is value else (reference_of(value) or value)
    else:
        raise ValueError(f"Expect the {what} as a 'package.module:Class' string or the class, got "
                         f"{type(value).__name__} {value!r:.100}")
    if not (isinstance(cls, type) and issubclass(cls, _base(kind))):
        raise ValueError(f"Expect the {what} {display(stored)!r} to name a {OWN[kind][0]}.{OWN[kind][1]} "
                         f"subclass, got {cls!r:.100}")
    return cls, stored, display(stored)


def display(stored) -> str:
    return stored if isinstance(stored, str) else f"{stored.__module__}.{stored.__qualname__}"


def json_values(value, what: str):
    """``value`` (a dict of JSON values) with tuples as lists; raises naming a value that is not JSON."""
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise ValueError(f"Expect {what} as a dict of keyword arguments, got {value!r:.200}")

    def plain(v, where):
        if v is None or isinstance(v, (bool, str)):
            return v
        if isinstance(v, numbers.Integral):
            return int(v)
        if isinstance(v, numbers.Real):
            return float(v)
        if isinstance(v, (list, tuple)):
            return [plain(x, f"{where}[{i}]") for i, x in enumerate(v)]
        if isinstance(v, dict) and all(isinstance(k, str) for k in v):
            return {k: plain(x, f"{where}[{k!r}]") for k, x in v.items()}
        raise ValueError(f"Expect {what} of JSON values (numbers, strings, lists), got {type(v).__name__} "
                         f"{v!r:.100} for {where}")

    return {k: plain(v, k) for k, v in value.items()}


def accepted(cls) -> Tuple[Optional[set], list]:
    """The keyword arguments ``cls`` takes (None: any), and their names in order."""
    params = inspect.signature(cls).parameters
    names = [n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return None, names
    return set(names), names


def check_kwargs(cls, name: str, kwargs: dict, what: str, skip=()) -> None:
    allowed, names = accepted(cls)
    if allowed is None:
        return
    unknown = [k for k in kwargs if k not in allowed or k in skip]
    if unknown:
        shown = [n for n in names if n not in skip]
        raise ValueError(f"Expect {what} that {name} takes ({', '.join(shown)}), got unknown {unknown}")


def default_lr(cls, name: str) -> float:
    param = inspect.signature(cls).parameters.get("lr")
    default = None if param is None else param.default
    if isinstance(default, bool) or not isinstance(default, numbers.Real):
        raise ValueError(f"Expect a learning rate for {name} (lr=... or optimizer_kwargs={{'lr': ...}}): it has "
                         f"no numeric default")
    return float(default)


@dataclass(frozen=True)
class Layout:
    """What an optimizer keeps per parameter, found by a probe step.

    ``slots`` are the flat vector's slots in order; ``scalars`` those of
    them that hold one value per parameter tensor; ``group_keys[g]`` the
    slots group ``g`` (0: the default group, then the user's) keeps;
    ``lazy[g]`` the keys (slots and ``step``) torch creates at a first step
    rather than at construction; ``step`` the dtype of a ``step`` tensor
    (``"int"`` for a Python number, None without a step); ``betas[g]`` and
    ``momentum[g]`` the groups' values (None where the optimizer has none)."""

    slots: Tuple[str, ...]
    step: Optional[str]
    scalars: frozenset
    group_keys: Tuple[frozenset, ...]
    lazy: Tuple[frozenset, ...]
    betas: Tuple[Optional[tuple], ...]
    momentum: Tuple[float, ...]
    weight_decay: Tuple[float, ...]




def probe(cls, name: str, lr: float, kwargs: dict, options: Sequence[dict]) -> Layout:
    """The :class:`Layout` of ``cls`` from one dry step on stand-in
    parameters: one pair per group (``options[0]`` the default group's,
    empty), gradients of 0.5."""
    torch = _torch()

    def standins():
        params = [torch.nn.Parameter(torch.zeros(shape)) for shape in PROBE_SHAPES]
        for p in params:
            p.grad = torch.full_like(p, 0.5)
        return params

    groups = [{"params": standins(), **opts} for opts in options]
    shapes = " and ".join(str(s) for s in PROBE_SHAPES)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            optimizer = cls(groups, lr=lr, **kwargs)
    except Exception as exc:  # noqa: BLE001 -- any failure of the user's arguments: named
        raise ValueError(f"Expect {name} to build on the arguments given: building it on parameters of shapes "
                         f"{shapes} failed with {type(exc).__name__}: {exc}") from None
    eager_by_group = [set().union(*(set(optimizer.state.get(p, {})) for p in g["params"]))
                      for g in optimizer.param_groups]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            optimizer.step(lambda: torch.zeros(()))
    except Exception as exc:  # noqa: BLE001
        raise ValueError(f"Expect a torch optimizer that steps on dense gradients without a closure: a probe step of "
                         f"{name} failed with {type(exc).__name__}: {exc}") from None
    known = {id(p) for g in optimizer.param_groups for p in g["params"]}
    bad = []
    if any(id(p) not in known for p in optimizer.state):
        bad.append("state under keys that are not its parameters")
    order, scalars, group_keys, lazy, step = [], set(), [], [], None
    for g, group in enumerate(optimizer.param_groups):
        keys = set()
        stateful = [bool(optimizer.state.get(p)) for p in group["params"]]
        if any(stateful) and not all(stateful):
            bad.append("state for some of its parameters only (state that is not per parameter)")
        for p in group["params"]:
            state = optimizer.state.get(p)
            if not state:
                continue
            for key, value in state.items():
                if torch.is_tensor(value) and tuple(value.shape) == tuple(p.shape) and value.dim() > 0:
                    kind = "tensor"
                elif (torch.is_tensor(value) and value.dim() == 0) or (
                        isinstance(value, numbers.Real) and not isinstance(value, bool)):
                    kind = "scalar"
                elif torch.is_tensor(value):
                    bad.append(f"{key!r} (a tensor of shape {tuple(value.shape)} for a parameter of shape "
                               f"{tuple(p.shape)})")
                    continue
                else:
                    bad.append(f"{key!r} (a {type(value).__name__})")
                    continue
                if key == "step":
                    step = str(value.dtype).replace("torch.", "") if torch.is_tensor(value) else "int"
                    continue
                if kind == "scalar":
                    scalars.add(key)
                if key not in order:
                    order.append(key)
                keys.add(key)
        group_keys.append(frozenset(keys))
        lazy.append(frozenset(k for k in keys | {"step"} if k not in eager_by_group[g]))
    if bad:
        shown = ", ".join(dict.fromkeys(bad))
        raise ValueError(f"Expect a torch optimizer whose state is tensors shaped like each parameter plus scalars "
                         f"such as 'step', got {name}, which keeps {shown}")
    # slots shaped like the parameters first, then the scalars, each in the optimizer's own order
    slots = tuple([k for k in order if k not in scalars] + [k for k in order if k in scalars])
    groups_out = optimizer.param_groups

    def value(group, key):
        v = group.get(key)
        if isinstance(v, (list, tuple)):
            return tuple(float(x) for x in v)
        return v

    return Layout(slots, step, frozenset(scalars), tuple(group_keys), tuple(lazy),
                  tuple(value(g, "betas") for g in groups_out),
                  tuple(float(g.get("momentum", 0.0) or 0.0) for g in groups_out),
                  tuple(float(g.get("weight_decay", 0.0) or 0.0) for g in groups_out))
