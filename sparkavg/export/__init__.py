"""Models as files other runtimes serve (the optional extra ``sparkavg[onnx]``).

- :mod:`sparkavg.export.onnx` -- a :class:`~sparkavg.nn.Network` or
  :class:`~sparkavg.nn.Graph` as an ONNX graph, built node by node with
  ``onnx.helper`` from the model's layers and flat vectors (no torch);
- :mod:`sparkavg.export.torch_model` -- a ``sparkavg.torch.TorchModel``
  through ``torch.onnx.export``, and as TorchScript.

Every model says it as ``model.export_onnx(path)`` (and a TorchModel
``model.export_torchscript(path)``).  The exported graph computes what
``model.output`` computes: class probabilities for ``nll`` outputs,
sigmoid probabilities for ``bce`` ones, raw values for regression.
Neither onnx nor torch is imported until an export runs.
"""
from .onnx import ExportError, to_onnx

__all__ = ["ExportError", "to_onnx"]
