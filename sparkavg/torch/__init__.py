"""Bring your own PyTorch module (the optional extra ``sparkavg[torch]``).

:class:`TorchModel` trains a ``torch.nn.Module`` with sparkavg's updaters,
masters, checkpoints and ``pyspark.ml`` stages: its parameters and
gradients are views of one flat vector (see :mod:`sparkavg.torch.model`).
Executors rebuild the module from its factory's importable name
(:mod:`sparkavg.torch.factory`); model files hold only flat vectors and
JSON.  :mod:`sparkavg.torch.zoo` has ready-made modules.

Importing this package imports torch; the rest of sparkavg never does
(an executor imports it when a configuration names ``"TorchModel"``).
"""
from .factory import FactoryError, reference_of, resolve
from .model import LOSSES, TorchModel

__all__ = ["TorchModel", "FactoryError", "resolve", "reference_of", "LOSSES"]
