"""A ``sparkavg.torch.TorchModel`` as an ONNX file (``torch.onnx.export``)
or a TorchScript file (``torch.jit.trace``).

Both files compute what ``model.output`` computes, in float32 on the CPU:
the module followed by softmax (``cross_entropy``, a custom loss on
``classes``) or sigmoid (``bce``, ``binary``), raw outputs for regression,
preceded by the fit's input encoding when one is given (``x * scale``,
then ``(x - mean) / std``, as the MLflow pyfunc applies it).  One input
``"input"`` of shape ``(batch, *input_shape)``, one output ``"output"``
``(batch, units)``; the batch axis is dynamic.  A module held in float64
or on a GPU is exported from a float32 CPU copy, the model left as it is.

The ONNX file comes from torch's TorchScript-based exporter
(``dynamo=False``): the ``torch.export``-based one needs ``onnxscript``,
which the ``onnx`` extra does not install.  What either exporter cannot
trace (data-dependent control flow, operators without an ONNX form) is an
:class:`~sparkavg.export.onnx.ExportError` naming the module.
"""
from __future__ import annotations

import copy
import logging
import os
import warnings
from typing import Optional

from ..data.transforms import check_encoding_dict
from .onnx import OPSET, ExportError, import_onnx

__all__ = ["served_module", "export_onnx", "export_torchscript"]

logger = logging.getLogger(__name__)


def served_module(model, encoding: Optional[dict] = None):
    """``torch.nn.Module``: the model's module on float32 CPU inputs, with
    its input encoding before and its output activation after, in eval mode."""
    import torch

    encoding = check_encoding_dict(encoding, "export (encoding=)")
    module = model.module
    params = list(module.parameters()) + list(module.buffers())
    if any(p.dtype != torch.float32 or p.device.type != "cpu" for p in params if p.is_floating_point()):
        module = copy.deepcopy(module).to(device="cpu", dtype=torch.float32)
    scale = None if not encoding or encoding.get("scale") is None else float(encoding["scale"])
    normalize = None if not encoding or encoding.get("normalize") is None else [float(v) for v in encoding["normalize"]]
    activation = {"nll": "softmax", "bce": "sigmoid"}.get(model.loss_kind)

    class Served(torch.nn.Module):
        """The module as ``TorchModel.output`` applies it."""

        def __init__(self):
            super().__init__()
            self.module = module

        def forward(self, x):
            if scale is not None:
                x = x * scale
            if normalize is not None:
                x = (x - normalize[0]) / normalize[1]
            y = self.module(x)
            if activation == "softmax":
                return torch.softmax(y, dim=1)
            if activation == "sigmoid":
                return torch.sigmoid(y)
            return y

    return Served().eval()


def _example(model):
    import torch

    return torch.zeros((2,) + tuple(model.input_shape), dtype=torch.float32)


def _name(model) -> str:
    return model.factory_ref or type(model.module).__name__


def _first_line(exc: Exception) -> str:
    """An exception's message up to its first line break (torch's go on with the whole traced graph)."""
    return (str(exc).strip().splitlines() or [""])[0]


def _writable(path) -> str:
    path = os.fspath(path)
    folder = os.path.dirname(path)
    if folder:
        os.makedirs(folder, exist_ok=True)
    return path


def export_onnx(model, path, encoding: Optional[dict] = None) -> None:
    """Write ``model`` (a TorchModel) as an ONNX file at ``path`` (see the module doc)."""
    import torch

    onnx = import_onnx()
    served, path = served_module(model, encoding), _writable(path)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.onnx.export(served, (_example(model),), path, dynamo=False, input_names=["input"],
                              output_names=["output"], dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}},
                              opset_version=OPSET)
    except Exception as exc:  # noqa: BLE001 -- whatever the exporter raises, named with the module
        raise ExportError(f"Expect a module torch.onnx.export can express in ONNX (opset {OPSET}), got {_name(model)!r}, which failed with "
                          f"{type(exc).__name__}: {_first_line(exc)}") from exc
    for w in caught:  # the exporter's notes (its deprecation among them), not the caller's business
        logger.debug("torch.onnx.export of %s: %s", _name(model), w.message)
    onnx.checker.check_model(path)
    logger.info("exported TorchModel %s as ONNX to %s", _name(model), path)


def export_torchscript(model, path, encoding: Optional[dict] = None) -> None:
    """Write ``model`` (a TorchModel) as a TorchScript file at ``path``
    (``torch.jit.load(path)(x)`` gives ``model.output(x)``)."""
    import torch

    served, path = served_module(model, encoding), _writable(path)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            traced = torch.jit.trace(served, (_example(model),))
            torch.jit.save(traced, path)
    except Exception as exc:  # noqa: BLE001 -- whatever tracing raises, named with the module
        raise ExportError(f"Expect a module torch.jit.trace can trace, got {_name(model)!r}, which failed with "
                          f"{type(exc).__name__}: {_first_line(exc)}") from exc
    for w in caught:
        logger.debug("torch.jit.trace of %s: %s", _name(model), w.message)
    logger.info("exported TorchModel %s as TorchScript to %s", _name(model), path)
