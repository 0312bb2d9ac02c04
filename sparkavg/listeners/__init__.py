"""Listeners: hook into a fit on the driver (epochs, rounds, checkpoints, failures)::

    from sparkavg.listeners import MLflowListener, TensorBoardListener
    trainer = SparkTrainer(spark, net, master, listeners=[MLflowListener(), TensorBoardListener("runs/lenet")])

The events and their payloads are documented in :mod:`sparkavg.listeners.base`;
a listener of your own is any object with some ``on_<event>(trainer, event)``
methods, or a :class:`TrainingListener` subclass.  ``MLflowListener`` needs
``sparkavg[mlflow]``, ``TensorBoardListener`` ``sparkavg[tensorboard]``,
``ProgressBar`` tqdm (``sparkavg[progress]``); each is imported on first use.
"""
import importlib

from .base import EVENTS, EventDispatcher, TrainingListener

_LAZY = {
    "MLflowListener": ".mlflow_listener",
    "TensorBoardListener": ".tensorboard_listener",
    "ProgressBar": ".progress",
}

__all__ = ["TrainingListener", "EventDispatcher", "EVENTS", *_LAZY]


def __getattr__(name):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
