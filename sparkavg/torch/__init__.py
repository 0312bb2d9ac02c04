"""Bring your own PyTorch module (the optional extra ``sparkavg[torch]``).

:class:`TorchModel` trains a ``torch.nn.Module`` with sparkavg's updaters or
a ``torch.optim`` optimizer and scheduler (:class:`TorchOptimizer`),
masters, checkpoints and ``pyspark.ml`` stages: its parameters and
gradients are views of one flat vector (see :mod:`sparkavg.torch.model`),
an optimizer's per-parameter state views of another.
Executors rebuild the module from its factory's importable name; model
files hold only flat vectors and JSON, and a loader calls the factory (or
loss, training step, optimizer, scheduler) a file names only when it is
marked with :func:`factory` (:func:`training_step`, :func:`optimizer`,
:func:`scheduler`, ``sparkavg.loss``) or trusted
(:mod:`sparkavg.references`); torch.optim's own classes need no mark.
:mod:`sparkavg.torch.zoo` has ready-made modules, all marked.

Importing this package imports torch; the rest of sparkavg never does
(an executor imports it when a configuration names ``"TorchModel"``).
"""
from ..references import UnresolvedReference as FactoryError
from ..references import factory, optimizer, reference_of, resolve, scheduler, training_step
from .model import LOSSES, TorchModel
from .optim import TorchOptimizer

__all__ = ["TorchModel", "TorchOptimizer", "FactoryError", "factory", "optimizer", "scheduler", "training_step",
           "resolve", "reference_of", "LOSSES"]
