"""Gradient normalisation: DL4J's ``GradientNormalization`` modes, and
clipping the global L2 norm.

Set on a model, ``Network(..., gradient_normalization=ClipGlobalNorm(1.0))``
(a :class:`~sparkavg.nn.Graph` and a :class:`~sparkavg.torch.TorchModel`
take the same argument; it is saved in the model's configuration).  Every
training step (``fit_batch``, ``compute_update``) normalises the loss's
gradient, then adds the L2 gradient and runs the updater -- DL4J's order
(normalisation, regularisation, updater; PyTorch's ``clip_grad_norm_``
before an optimizer's ``weight_decay`` too).  Under gradient sharing the
executor's ``compute_update`` normalises before the update reaches the
residual.  ``model.gradient(x, y)`` stays the raw gradient.

A *layer* is a layer's contiguous block of the flat gradient (a
``Network``'s or ``Graph``'s layer; for a ``TorchModel``, where the layers
are the module's, each parameter tensor); a *parameter tensor* is one
parameter's segment (DL4J's "parameter type": a layer's ``W`` or ``b``).

===============================  =======================================================
mode                             on each group ``g`` (``|g|``: its L2 norm)
===============================  =======================================================
``ClipElementWise(t)``           every element clipped to ``[-t, t]``
``ClipL2PerLayer(t)``            per layer: ``g *= t / |g|`` where ``|g| > t``
``ClipL2PerParamType(t)``        the same per parameter tensor
``RenormalizeL2PerLayer()``      per layer: ``g /= |g|`` (where ``|g| > 0``)
``RenormalizeL2PerParamType()``  the same per parameter tensor
``ClipGlobalNorm(max_norm)``     the whole gradient: ``g *= max_norm / |g|`` where ``|g| > max_norm``
===============================  =======================================================

``ClipGlobalNorm`` is PyTorch's ``clip_grad_norm_`` without its ``1e-6``
in the denominator (a gradient within the limit is left exactly as it is).
Every mode works on numpy and CuPy gradients alike
(:func:`sparkavg.backend.get_array_module`); on a GPU the norms stay on the
device (no synchronisation).  A non-finite gradient is left for the
divergence checks.

Every mode is a frozen :class:`~sparkavg.configurable.Configurable`
registered under the kind ``"gradient_normalization"``.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import ClassVar, Optional, Sequence, Tuple

import numpy as np

from ..backend import get_array_module
from ..configurable import Configurable, register

__all__ = ["GradientNormalization", "ClipElementWise", "ClipL2PerLayer", "ClipL2PerParamType",
           "RenormalizeL2PerLayer", "RenormalizeL2PerParamType", "ClipGlobalNorm"]

def _positive(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not (math.isfinite(value) and value > 0):
        raise ValueError(f"Expect {name} > 0 and finite, got {value!r}")


def _squared_norm(xp, view):
    """``view @ view``: a float on the host, a 0-d array on a GPU."""
    return xp.dot(view, view)


def clip_norm(view, limit: float) -> None:
    """``view *= limit / |view|`` where ``|view| > limit``, in place."""
    xp = get_array_module(view)
    sq = _squared_norm(xp, view)
    if xp is np:
        norm = math.sqrt(float(sq))
        if norm > limit:
            view *= view.dtype.type(limit / norm)
    else:  # on the device: inf where the norm is 0, so the factor is 1
        view *= xp.minimum(limit / xp.sqrt(sq), 1.0).astype(view.dtype)


def renormalize(view) -> None:
    """``view /= |view|`` where ``|view| > 0``, in place."""
    xp = get_array_module(view)
    sq = _squared_norm(xp, view)
    if xp is np:
        norm = math.sqrt(float(sq))
        if norm > 0:
            view *= view.dtype.type(1.0 / norm)
    else:
        norm = xp.sqrt(sq)
        view *= xp.where(norm > 0, 1.0 / norm, 1.0).astype(view.dtype)


@dataclass(frozen=True)
class GradientNormalization(Configurable):
    """Base class: what a model does to its loss gradient before the updater.

    A mode says which groups it works on (:attr:`per`) and normalises them
    in :meth:`apply`.
    """

    _config_kind = "gradient_normalization"

    #: ``"layer"``, ``"parameter"`` (a parameter tensor) or None (the whole
    #: gradient): the ranges the model passes to :meth:`apply`.
    per: ClassVar[Optional[str]] = None

    def apply(self, grads, ranges: Sequence[Tuple[int, int]]) -> None:  # pragma: no cover - abstract
        """Normalise the flat gradient ``grads`` (numpy or CuPy) in place,
        group by group: ``ranges`` are the ``(start, stop)`` of each group
        :attr:`per` names (``[(0, n)]`` for the whole gradient)."""
        raise NotImplementedError


@dataclass(frozen=True)
class _Threshold(GradientNormalization):
    threshold: float
    """The largest absolute value (element-wise) or L2 norm (per group) kept (> 0)."""

    def __post_init__(self):
        _positive("threshold", self.threshold)


@dataclass(frozen=True)
class _ClipL2(_Threshold):
    def apply(self, grads, ranges):
        for start, stop in ranges:
            clip_norm(grads[start:stop], self.threshold)


@dataclass(frozen=True)
class _Renormalize(GradientNormalization):
    def apply(self, grads, ranges):
        for start, stop in ranges:
            renormalize(grads[start:stop])


@register("gradient_normalization")
@dataclass(frozen=True)
class ClipElementWise(_Threshold):
    """Clip every element to ``[-threshold, threshold]`` (DL4J's
    ``ClipElementWiseAbsoluteValue``).

    Parameters
    ----------
    threshold : float
        > 0.
    """

    def apply(self, grads, ranges):
        xp = get_array_module(grads)
        xp.clip(grads, -self.threshold, self.threshold, out=grads)


@register("gradient_normalization")
@dataclass(frozen=True)
class ClipL2PerLayer(_ClipL2):
    """Scale each layer's gradient down to an L2 norm of ``threshold`` (> 0)
    where it is larger (DL4J's ``ClipL2PerLayer``)."""

    per: ClassVar[Optional[str]] = "layer"


@register("gradient_normalization")
@dataclass(frozen=True)
class ClipL2PerParamType(_ClipL2):
    """Scale each parameter tensor's gradient down to an L2 norm of
    ``threshold`` (> 0) where it is larger (DL4J's ``ClipL2PerParamType``)."""

    per: ClassVar[Optional[str]] = "parameter"


@register("gradient_normalization")
@dataclass(frozen=True)
class RenormalizeL2PerLayer(_Renormalize):
    """Divide each layer's gradient by its L2 norm (DL4J's
    ``RenormalizeL2PerLayer``; a zero gradient stays zero)."""

    per: ClassVar[Optional[str]] = "layer"


@register("gradient_normalization")
@dataclass(frozen=True)
class RenormalizeL2PerParamType(_Renormalize):
    """Divide each parameter tensor's gradient by its L2 norm (DL4J's
    ``RenormalizeL2PerParamType``; a zero gradient stays zero)."""

    per: ClassVar[Optional[str]] = "parameter"


@register("gradient_normalization")
@dataclass(frozen=True)
class ClipGlobalNorm(GradientNormalization):
    """Scale the whole gradient down to an L2 norm of ``max_norm`` where it
    is larger (PyTorch's ``clip_grad_norm_``).

    Parameters
    ----------
    max_norm : float
        > 0.
    """

    max_norm: float
    """The largest L2 norm the whole gradient keeps (> 0)."""

    def __post_init__(self):
        _positive("max_norm", self.max_norm)

    def apply(self, grads, ranges):
        clip_norm(grads, self.max_norm)
