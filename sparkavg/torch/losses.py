"""The losses a :class:`~sparkavg.torch.TorchModel` trains on, and which of
its module's outputs gives predictions.

The built-in losses are the formulas of :mod:`sparkavg.nn.losses` written in
torch (on the predictions output); a custom ``loss(outputs, targets)``
receives everything the module returned, a tuple or a dict of tensors too.
"""
from __future__ import annotations

import numbers
from collections.abc import Mapping

from .plan import callable_or_reference

__all__ = ["LOSSES", "CUSTOM_TARGETS", "loss_choice", "check_prediction", "predictions", "builtin_loss"]

#: Built-in losses by name and the loss kind each is (:mod:`sparkavg.nn.losses`):
#: ``bce`` takes the module's outputs as logits, as
#: ``torch.nn.functional.binary_cross_entropy_with_logits`` does.
LOSSES = {"cross_entropy": "nll", "bce": "bce", "mse": "mse", "mae": "mae", "huber": "huber"}

#: A custom loss's (or training step's) ``targets`` and the loss kind its labels are checked as.
CUSTOM_TARGETS = {"classes": "nll", "binary": "bce", "values": "mse"}


def loss_choice(loss, targets):
    """``(reference or None, callable or None, loss kind)``; a None callable:
    a built-in (``loss`` None: a training step's, its labels checked as ``targets``)."""
    if isinstance(loss, str) and loss in LOSSES:
        return loss, None, LOSSES[loss]
    if targets not in CUSTOM_TARGETS:
        raise ValueError(f"Expect targets in {list(CUSTOM_TARGETS)}, got {targets!r}")
    if loss is None:
        return None, None, CUSTOM_TARGETS[targets]
    if isinstance(loss, str) and ":" not in loss:
        raise ValueError(f"Expect loss in {sorted(LOSSES)}, a 'package.module:function' or a callable, "
                         f"got {loss!r}")
    ref, fn = callable_or_reference(loss, "loss", "loss function")
    return ref, fn, CUSTOM_TARGETS[targets]


def check_prediction(prediction):
    """``prediction`` as the key (str) or index (int >= 0) of the module's
    output predictions come from, or None (the module returns one tensor)."""
    if prediction is None or (isinstance(prediction, str) and prediction):
        return prediction
    if isinstance(prediction, numbers.Integral) and not isinstance(prediction, bool) and prediction >= 0:
        return int(prediction)
    raise ValueError(f"Expect prediction as the key (str) or the index (int >= 0) of the module's output that "
                     f"gives predictions, got {prediction!r}")


def predictions(raw, key):
    """The output predictions come from: ``raw`` itself (one tensor), or
    ``raw[key]`` of the tuple or dict the module returned."""
    import torch

    if isinstance(raw, torch.Tensor):
        if key not in (None, 0):
            raise ValueError(f"Expect prediction=None for a module returning one tensor, got {key!r}")
        return raw
    if isinstance(raw, Mapping):
        if key not in raw:
            raise ValueError(f"Expect prediction= naming one of the keys {list(raw)} of the dict the module "
                             f"returns, got {key!r}")
        return raw[key]
    if isinstance(raw, (tuple, list)):
        if not isinstance(key, int) or key >= len(raw):
            raise ValueError(f"Expect prediction= as an index below {len(raw)} into the tuple the module "
                             f"returns, got {key!r}")
        return raw[key]
    raise ValueError(f"Expect the module to return a tensor, a tuple or a dict of tensors, got {type(raw).__name__}")


def builtin_loss(out, target, loss: str, class_weights, huber_delta: float):
    """Mean loss of predictions ``out`` against prepared targets (a 0-d
    tensor), as :mod:`sparkavg.nn.losses` computes it: per-row weights scale
    a row's loss and the mean keeps its divisor; ``class_weights`` a tensor
    like ``out`` or None."""
    import torch

    functional = torch.nn.functional
    _, y, w = target
    cw = class_weights
    if w is None and cw is None:  # the plain losses, as torch computes them
        if loss == "nll":
            return functional.cross_entropy(out, y)
        if loss == "bce":
            return functional.binary_cross_entropy_with_logits(out, y)
        if loss == "huber":
            return functional.huber_loss(out, y, delta=huber_delta)
        return (functional.mse_loss if loss == "mse" else functional.l1_loss)(out, y)
    n = out.shape[0]
    if loss == "nll":
        rows = functional.cross_entropy(out, y, weight=cw, reduction="none")
        return (rows if w is None else rows * w).sum() / n
    if loss == "bce":
        a, b = (y, 1 - y) if cw is None else (y * cw[1], (1 - y) * cw[0])
        elements = (a + b) * functional.softplus(out) - a * out  # a*softplus(-z) + b*softplus(z)
    elif loss == "huber":
        elements = functional.huber_loss(out, y, delta=huber_delta, reduction="none")
    else:
        elements = (functional.mse_loss if loss == "mse" else functional.l1_loss)(out, y, reduction="none")
    if w is not None:
        elements = elements * w[:, None]
    return elements.sum() / elements.numel()
