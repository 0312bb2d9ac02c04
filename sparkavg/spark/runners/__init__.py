"""Driver side of training: one epoch skeleton (:mod:`.base`) and how each
master distributes an epoch (:mod:`.averaging`, :mod:`.sharing`).

A master names the module of its runner (``runner_module``, a class
attribute); that module declares its runner with :func:`runs`.  A new
master is a :class:`~sparkavg.spark.masters.Master` subclass, its runner
module here and its executor task: nothing else changes.
"""
from __future__ import annotations

import importlib

from ..masters import Master
from .base import _RUNNERS, EpochRunner, runs

__all__ = ["EpochRunner", "runner_for", "runs"]


def runner_for(seam, master) -> EpochRunner:
    """The runner of ``master`` on ``seam``."""
    module = getattr(master, "runner_module", None) if isinstance(master, Master) else None
    if module is not None:
        importlib.import_module(f"{__name__}.{module}")  # its runs() declaration
    for cls in type(master).__mro__:
        if cls in _RUNNERS:
            return _RUNNERS[cls](seam, master)
    raise TypeError(f"Expect master to be a Master with a runner (ParameterAveraging(...), GradientSharing(...)), "
                    f"got {type(master).__name__}")
