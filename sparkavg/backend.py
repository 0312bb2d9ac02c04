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
    "unavailable_reason",
    "cupy",
    "device_count",
    "use_device",
    "current_device",
    "get_array_module",
    "is_gpu_array",
    "to_cpu",
    "to_cpu_pinned",
    "to_gpu",
    "pure_numpy",
]

_cupy = None
_cupy_checked = False
_cupy_error = None  # why CuPy is unusable, in words (None while unchecked or usable)


def pure_numpy() -> bool:
    """True when ``SPARKAVG_PURE_NUMPY=1`` forces the numpy reference kernels."""
    return os.environ.get("SPARKAVG_PURE_NUMPY", "0") == "1"


def _load_cupy():
    global _cupy, _cupy_checked, _cupy_error
    if not _cupy_checked:
        _cupy_checked = True
        try:
            mod = importlib.import_module("cupy")
            # Importing succeeds without a driver; a device count proves CUDA works.
            if mod.cuda.runtime.getDeviceCount() > 0:
                _cupy = mod
            else:
                visible = os.environ.get("CUDA_VISIBLE_DEVICES")
                _cupy_error = "CuPy sees no CUDA device" + (
                    f" (CUDA_VISIBLE_DEVICES={visible!r})" if visible is not None else "")
        except Exception as exc:  # ImportError, CUDARuntimeError, driver missing ...
            _cupy = None
            _cupy_error = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
    return _cupy


def available() -> bool:
    """Whether CuPy imports and at least one CUDA device is visible."""
    return _load_cupy() is not None


def unavailable_reason():
    """Why CuPy cannot be used here, in one line (None when it can)."""
    if available():
        return None
    return (f"CuPy with a CUDA device is required for the GPU path, but it is not available "
            f"({_cupy_error}): install the 'gpu' extra (pip install sparkavg[gpu]) on a machine "
            f"with an NVIDIA driver, or keep the network on the CPU")


def check_available() -> None:
    """Raise a helpful error when the GPU path is requested but unusable."""
    if not available():
        raise RuntimeError(unavailable_reason())


def cupy():
    """The CuPy module (raises when unavailable)."""
    check_available()
    return _cupy


def device_count() -> int:
    """CUDA devices CuPy sees in this process (0 when CuPy is unusable)."""
    return _cupy.cuda.runtime.getDeviceCount() if available() else 0


def use_device(index: int) -> None:
    """Make CUDA device ``index`` current for this thread (where new CuPy
    arrays are allocated and kernels run)."""
    cupy().cuda.Device(int(index)).use()


def current_device():
    """The current thread's CUDA device ordinal, or None when CuPy is unusable."""
    return int(_cupy.cuda.runtime.getDevice()) if available() else None


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


def to_cpu_pinned(x) -> np.ndarray:
    """A host copy of a CuPy array in page-locked (pinned) memory.

    The buffer comes from CuPy's pinned memory pool, so a copy of the same
    size made after this one is released reuses it without a new
    ``cudaHostAlloc``; DMA from the device runs at full rate into pinned
    memory.  The result is an ordinary (writable, C-contiguous) numpy array.
    Numpy arrays are copied into ordinary memory.
    """
    if not is_gpu_array(x):
        return np.array(x, copy=True)
    if x.size == 0:
        return np.empty(x.shape, dtype=x.dtype)
    import cupyx  # CuPy is importable here: x is a CuPy array

    out = cupyx.empty_pinned(x.shape, dtype=x.dtype)
    x.get(out=out)  # device -> host sync (blocking copy on the current stream)
    return out
