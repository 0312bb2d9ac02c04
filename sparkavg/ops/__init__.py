"""The one front for kernels.

numpy float32 arrays go to the Cython kernels in ``sparkavg_ext``; CuPy
arrays go to CuPy kernels; anything else (float64 for gradient checks, or
``SPARKAVG_PURE_NUMPY=1``) goes to the pure-numpy twins in
:mod:`sparkavg.ops.reference`.
"""
from __future__ import annotations

from . import reference
from .reference import (  # replaced by dispatching versions as kernels land
    accumulate,
    adagrad_step,
    adam_step,
    nesterov_step,
    rmsprop_step,
    scale,
    sgd_step,
)

__all__ = [
    "reference",
    "accumulate",
    "scale",
    "sgd_step",
    "nesterov_step",
    "adagrad_step",
    "rmsprop_step",
    "adam_step",
]
