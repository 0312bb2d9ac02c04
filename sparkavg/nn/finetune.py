"""Fine-tuning in the native engine: frozen layers, per-layer learning-rate
multipliers, and layers initialised from another model (DL4J's
``TransferLearning`` and ``FrozenLayer``; Keras' ``trainable = False``); :mod:`sparkavg.nn.transfer` initialises
layers from another model.

A layer is named as its model names it: a :class:`~sparkavg.nn.Network`'s
by its index (``"0"``, ``"1"``, ...; an int is taken too), a
:class:`~sparkavg.nn.Graph`'s by its vertex name.

- A **frozen** layer is never updated: its gradient is zero before
  normalisation, its update is zero, its updater state does not move, and
  averaging keeps its parameters as they were (so they stay bit-identical
  under both masters; under gradient sharing a zero update is never
  encoded).
- A **learning-rate multiplier** scales the layer's whole step (the
  updater's and the weight decay's), which is the step at ``multiplier *
  lr`` for every updater here (each step is linear in the rate, its state
  not).
"""
from __future__ import annotations

import math
import numbers
from typing import Mapping, Optional, Sequence

import numpy as np

from ..backend import to_cpu
from ..configurable import Configurable, register

__all__ = ["FineTuning", "keep_frozen"]


def _name(value) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, numbers.Integral)):
        raise ValueError(f"Expect a layer name (str, or a Network's int index), got {value!r}")
    return str(value)


@register("fine_tuning")
class FineTuning(Configurable):
    """Which layers train, and how fast.

    Parameters
    ----------
    frozen : sequence of str or int
        Layers never updated.
    lr_multipliers : dict of str -> float
        A layer's learning rate as a multiple of the model's (finite, > 0;
        freeze a layer instead of giving it 0).
    """

    def __init__(self, frozen: Sequence = (), lr_multipliers: Mapping | None = None):
        if isinstance(frozen, (str, numbers.Integral)):
            frozen = [frozen]
        self.frozen = tuple(dict.fromkeys(_name(f) for f in frozen))
        multipliers = {}
        for key, value in dict(lr_multipliers or {}).items():
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not (
                    math.isfinite(value) and value > 0):
                raise ValueError(f"Expect a learning-rate multiplier finite and > 0 for layer {key!r}, got {value!r} "
                                 f"(freeze a layer with frozen=[...] instead)")
            multipliers[_name(key)] = float(value)
        both = sorted(set(self.frozen) & set(multipliers))
        if both:
            raise ValueError(f"Expect a layer either frozen or with a learning-rate multiplier, got both for {both}")
        self.lr_multipliers = multipliers

    def config_arguments(self) -> dict:
        return {"frozen": list(self.frozen), "lr_multipliers": dict(self.lr_multipliers)}

    def __eq__(self, other):
        return isinstance(other, FineTuning) and self.config_arguments() == other.config_arguments()

    def __repr__(self):
        return f"FineTuning(frozen={list(self.frozen)!r}, lr_multipliers={self.lr_multipliers!r})"

    def scales(self, names: Sequence[str], ranges: Sequence[tuple]) -> list:
        """``(start, stop, scale)`` of the layers it names (``scale`` 0 for a
        frozen one), in layer order; ``names[i]`` is layer ``i``'s name and
        ``ranges[i]`` its block of the parameters.  A name no layer has is
        named with the layers there are."""
        known = list(names)
        unknown = [n for n in (*self.frozen, *self.lr_multipliers) if n not in known]
        if unknown:
            raise ValueError(f"Expect layer names among {known}, got {unknown} (a Network's layers are named by "
                             f"index, a Graph's by vertex)")
        out = []
        for name, (start, stop) in zip(known, ranges):
            scale = 0.0 if name in self.frozen else self.lr_multipliers.get(name)
            if scale is not None and stop > start:
                out.append((int(start), int(stop), scale))
        return out


def keep_frozen(model, sums: dict, own: Optional[dict] = None) -> None:
    """Put ``model``'s own values (or ``own``'s, the same names) back into
    the frozen ranges of averaged state vectors ``sums`` (``params`` and
    each ``updater`` slot there), in place: a mean of equal values may
    differ from them in the last bit."""
    frozen = getattr(model, "frozen_ranges", ())
    if not frozen:
        return
    n = model.num_params
    for name, value in sums.items():
        if value is None or name not in ("params", "updater") or not value.size:
            continue
        kept = to_cpu((model.state if own is None else own)[name])
        for j in range(value.size // n):
            for a, b in frozen:
                value[j * n + a:j * n + b] = kept[j * n + a:j * n + b]
