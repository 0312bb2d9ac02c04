"""Bring your own PyTorch module (the optional extra ``sparkavg[torch]``).

:class:`TorchModel` trains a ``torch.nn.Module`` with sparkavg's updaters,
masters, checkpoints and ``pyspark.ml`` stages: its parameters and
gradients are views of one flat vector (see :mod:`sparkavg.torch.model`).
Executors rebuild the module from its factory's importable name; model
files hold only flat vectors and JSON, and a loader calls the factory (or
loss) a file names only when it is marked with :func:`factory` (or
``sparkavg.loss``) or trusted (:mod:`sparkavg.references`).
:mod:`sparkavg.torch.zoo` has ready-made modules, all marked.

Importing this package imports torch; the rest of sparkavg never does
(an executor imports it when a configuration names ``"TorchModel"``).
"""
from ..references import UnresolvedReference as FactoryError
from ..references import factory, reference_of, resolve
from .model import LOSSES, TorchModel

__all__ = ["TorchModel", "FactoryError", "factory", "resolve", "reference_of", "LOSSES"]
