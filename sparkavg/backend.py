"""Array-module switch: the ONE place that imports CuPy (lazily).

After chainer/backends/cuda.py: everything else in sparkavg is written
against ``xp = get_array_module(x)`` and never imports CuPy itself.
"""
from __future__ import annotations

import importlib
import os

import numpy as np

__all__ = [
    "available",
    "check_available",
    "cupy",
    "get_array_module",
    "is_gpu_array",
    "to_cpu",
    "to_gpu",
    "pure_numpy",
]

_cupy = None
_cupy_checked = False


def pure_numpy() -> bool:
    """True when ``SPARKAVG_PURE_NUMPY=1`` forces the numpy reference kernels."""
    return os.environ.get("SPARKAVG_PURE_NUMPY", "0") == "1"


def _load_cupy():
    global _cupy, _cupy_checked
    if not _cupy_checked:
        _cupy_checked = True
        try:
            mod = importlib.import_module("cupy")
            # Importing succeeds without a driver; a device count proves CUDA works.
            if mod.cuda.runtime.getDeviceCount() > 0:
                _cupy = mod
        except Exception:  # ImportError, CUDARuntimeError, driver missing ...
            _cupy = None
    return _cupy


def available() -> bool:
    """Whether CuPy imports and at least one CUDA device is visible."""
    return _load_cupy() is not None


def check_available() -> None:
    """Raise a helpful error when the GPU path is requested but unusable."""
    if not available():
        raise RuntimeError(
            "CuPy with a CUDA device is required for the GPU path, but it is not "
            "available: install the 'gpu' extra (pip install sparkavg[gpu]) on a "
            "machine with an NVIDIA driver, or keep the network on the CPU"
        )


def cupy():
    """The CuPy module (raises when unavailable)."""
    check_available()
    return _cupy


def is_gpu_array(x) -> bool:
    """True for a CuPy ndarray, without importing CuPy when it is not loaded."""
    return type(x).__module__.startswith("cupy")


def get_array_module(*arrays):
    """``cupy`` if any argument is a CuPy array, else ``numpy``."""
    for a in arrays:
        if is_gpu_array(a):
            return _load_cupy()
    return np


def to_gpu(x):
    """Copy a numpy array to the current CUDA device (host -> device sync)."""
    return cupy().asarray(x)


def to_cpu(x):
    """Copy a CuPy array to host memory; numpy arrays pass through."""
    if is_gpu_array(x):
        return x.get()  # device -> host sync
    return np.asarray(x)
