"""The losses an output can train on, written once for every model kind.

Each loss says what its labels must be (its *target*: class indices or
one-hot rows, binary labels, or real values), checks a batch of labels
against it, and, for the native engine's :class:`~sparkavg.nn.Output`, gives
the summed loss and its gradient with respect to the output's
pre-activation (fused with the activation where the pair is stable).

=========  ==========  ===========  ========================================
loss       activation  target       loss of one element, ``e = y - t``
=========  ==========  ===========  ========================================
``nll``    softmax     ``classes``  ``-log p[label]`` (mean over rows)
``bce``    sigmoid     ``binary``   ``-t log p - (1-t) log(1-p)``
``mse``    identity    ``values``   ``e**2``
``mae``    identity    ``values``   ``|e|``
``huber``  identity    ``values``   ``e**2/2`` if ``|e| <= delta``, else
                                    ``delta * (|e| - delta/2)``
=========  ==========  ===========  ========================================

``nll`` is the mean over rows; the others the mean over rows and units
(Keras' and PyTorch's convention for ``reduction="mean"``).

Weights scale each row's (or element's) loss and the mean keeps its divisor
(the row count), as Keras' ``sample_weight`` does: a batch of small weights
moves the model less.  ``class_weights`` are a weight per class for ``nll``
(the label's class weights the row) and ``(negative, positive)`` for
``bce`` (the weights of ``t`` and ``1 - t`` above, PyTorch's ``pos_weight``
generalised); per-row weights multiply them.
"""
from __future__ import annotations

import math
import numbers
from typing import NamedTuple, Optional, Sequence, Tuple

import numpy as np

from .. import backend
from . import device_checks
from .model import LOSS_KINDS, TARGETS

__all__ = ["LOSSES", "TARGETS", "DEFAULT_ACTIVATION", "Targets", "check_loss", "check_class_weights",
           "check_huber_delta", "prepare_targets", "label_shapes", "predicted"]

LOSSES = LOSS_KINDS

#: The activation each loss takes by default (``nll`` and ``bce`` require theirs).
DEFAULT_ACTIVATION = {"nll": "softmax", "bce": "sigmoid", "mse": "identity", "mae": "identity",
                      "huber": "identity"}


class Targets(NamedTuple):
    """A checked batch of labels on the model's device.

    ``kind`` is ``"index"`` (int64 class indices, ``(n,)``) or ``"dense"``
    (float rows, ``(n, units)``); ``weight`` is None or the rows' weights
    as ``(n, 1)``."""

    kind: str
    y: object
    weight: object = None

    def rows(self, start: int, stop: int) -> "Targets":
        return Targets(self.kind, self.y[start:stop], None if self.weight is None else self.weight[start:stop])


def check_loss(loss: str) -> str:
    if loss not in LOSSES:
        raise ValueError(f"Expect loss in {list(LOSSES)}, got {loss!r}")
    return loss


def check_huber_delta(delta) -> float:
    if isinstance(delta, bool) or not isinstance(delta, numbers.Real) or not (math.isfinite(delta) and delta > 0):
        raise ValueError(f"Expect huber_delta to be a finite number > 0, got {delta!r}")
    return float(delta)


def check_class_weights(loss: str, class_weights, units: int) -> Optional[Tuple[float, ...]]:
    """``class_weights`` as a tuple of floats, or None: one weight per class
    for ``nll``, ``(negative, positive)`` for ``bce``; finite, >= 0, not
    all zero.  Other losses take none."""
    if class_weights is None:
        return None
    if TARGETS[loss] == "values":
        raise ValueError(f"Expect class_weights only with loss 'nll' or 'bce' (classes), got loss {loss!r}")
    want = units if loss == "nll" else 2
    what = f"one weight per class ({units})" if loss == "nll" else "two weights (negative, positive)"
    try:
        values = np.asarray(class_weights, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"Expect class_weights as {what}, got {class_weights!r}") from None
    if values.shape != (want,):
        raise ValueError(f"Expect class_weights as {what} for loss {loss!r}, got {values.size} "
                         f"value(s) of shape {values.shape}")
    if not np.isfinite(values).all() or (values < 0).any() or not (values > 0).any():
        raise ValueError(f"Expect class_weights finite, >= 0 and not all zero, got {values.tolist()}")
    return tuple(float(v) for v in values)


def label_shapes(loss: str, n: int, units: int) -> str:
    """What a batch of ``n`` labels may look like, as messages say it."""
    if loss == "nll":
        return f"({n},) class indices or ({n}, {units}) one-hot rows"
    return f"({n}, {units})" + (f" or ({n},)" if units == 1 else "")


def _row_weights(weights, n: int, xp, dtype):
    """Per-row weights as ``(n, 1)`` on ``xp``: finite and >= 0."""
    w = np.asarray(weights) if xp is np else xp.asarray(weights)
    if tuple(w.shape) not in ((n,), (n, 1)):
        raise ValueError(f"Expect one weight per example, shape ({n},), got {tuple(w.shape)}")
    if w.dtype.kind not in "fiu":
        raise ValueError(f"Expect numeric weights, got dtype {w.dtype}")
    w = xp.asarray(w, dtype=dtype).reshape(n, 1)
    if n and not bool((xp.isfinite(w) & (w >= 0)).all()):  # device -> host sync
        raise ValueError("Expect weights finite and >= 0, got a negative or non-finite weight")
    return w


def prepare_targets(loss: str, y, n: int, units: int, xp, dtype, weights=None) -> Targets:
    """Check a batch of ``n`` labels for ``loss`` and an output of ``units``;
    return them as :class:`Targets` on module ``xp`` (class labels from the
    host are checked there, before they cross: no device sync; labels on the
    device in a training step: :mod:`~sparkavg.nn.device_checks`)."""
    shape = tuple(getattr(y, "shape", np.shape(y)))
    w = None if weights is None else _row_weights(weights, n, xp, dtype)
    if loss == "nll":
        if shape == (n, units):
            return Targets("dense", xp.asarray(y, dtype=dtype), w)
        if shape == (n,):
            # checked where they are: host labels before they cross to the device (no sync), device
            # labels with one sync, or in a training step on the device, read later (device_checks)
            module = xp if xp is not np and hasattr(y, "__cuda_array_interface__") else np
            labels = module.asarray(y)
            if labels.dtype.kind == "f":
                if n and not bool((labels == module.floor(labels)).all()):
                    raise ValueError("Expect integer class labels, got non-integral floats")
            elif labels.dtype.kind not in "iu":
                raise ValueError(f"Expect integer class labels, got dtype {labels.dtype}")
            labels = labels.astype(np.int64, copy=False)
            if n:
                if module is not np and device_checks.active():  # a training step: no sync (device_checks)
                    return Targets("index", device_checks.clip_labels(labels, units), w)
                lo, hi = (int(v) for v in backend.to_cpu(module.stack([labels.min(), labels.max()])))
                if lo < 0 or hi >= units:
                    raise ValueError(f"Expect class labels in [0, {units}), got values from {lo} to {hi}")
            return Targets("index", xp.asarray(labels), w)
    elif shape == (n, units) or (units == 1 and shape == (n,)):
        t = xp.asarray(y, dtype=dtype).reshape(n, units)
        if loss == "bce" and n and not bool(((t >= 0) & (t <= 1)).all()):  # device -> host sync (NaN fails too)
            raise ValueError("Expect binary labels in [0, 1] (0 or 1, or a probability) for loss 'bce', got "
                             f"values from {float(t.min())} to {float(t.max())}")
        return Targets("dense", t, w)
    raise ValueError(f"Expect labels of shape {label_shapes(loss, n, units)}, got {shape}")


# ----------------------------------------------------------- the formulas
def softplus(z, xp):
    """``log(1 + exp(z))`` without overflow: ``max(z, 0) + log1p(exp(-|z|))``."""
    return xp.maximum(z, 0) + xp.log1p(xp.exp(-xp.abs(z)))


def bce_terms(t, class_weights: Optional[Sequence[float]], dtype):
    """``(a, b)`` with the element loss ``a*softplus(-z) + b*softplus(z)``:
    ``(t, 1 - t)`` scaled by the (negative, positive) class weights."""
    one = dtype.type(1.0)
    if class_weights is None:
        return t, one - t
    neg, pos = class_weights
    return t * dtype.type(pos), (one - t) * dtype.type(neg)


def regression_terms(loss: str, err, xp, delta: float):
    """``(element losses, d loss / d err)`` of the regression losses."""
    if loss == "mse":
        return err * err, err * err.dtype.type(2.0)
    if loss == "mae":
        return xp.abs(err), xp.sign(err)
    # huber
    d = err.dtype.type(delta)
    a = xp.abs(err)
    small = a <= d
    value = xp.where(small, err * err * err.dtype.type(0.5), d * (a - d * err.dtype.type(0.5)))
    return value, xp.clip(err, -d, d)


def predicted(target: str, out):
    """The prediction column of outputs ``out`` ``(n, units)``: the class
    (argmax) for ``classes``, 1.0 where the probability of the first label
    is above 0.5 for ``binary`` (Spark's binary classifiers' threshold),
    the first value for ``values``."""
    if target == "classes":
        return out.argmax(axis=1)
    if target == "binary":
        return (out[:, 0] > 0.5).astype(out.dtype)
    return out[:, 0]
