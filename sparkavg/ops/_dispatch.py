"""Which implementation runs a kernel, and the argument checks before it.

Routing (:func:`route`):

- ``SPARKAVG_PURE_NUMPY=1``      -> the numpy reference (numpy or CuPy arrays)
- CuPy arrays                    -> CuPy kernels (:mod:`sparkavg.ops._cuda`)
- numpy float32                  -> Cython kernels (``sparkavg_ext``)
- numpy float64                  -> the numpy reference (gradient checks)

Convert or reject:

- Arrays written in place (a buffer, params, updater state, a residual, a
  decode target) are *rejected* unless float32/float64, C-contiguous and
  writeable: a converted copy would take the write and the caller would
  never see it.  Other dtypes raise ``TypeError``; layout problems
  ``ValueError``.
- Read-only operands (``x``, ``grads``, an encoded message, the residual of
  ``count_above``) must have the dtype of the array they update (no silent
  float64 -> float32 casts) and are *converted* to a C-contiguous copy when
  strided.
"""
from __future__ import annotations

import logging
import numbers

import numpy as np

from .. import backend
from ._checks import MAX_LENGTH

logger = logging.getLogger(__name__)

__all__ = [
    "CYTHON",
    "CUDA",
    "REFERENCE",
    "ext",
    "have_extension",
    "route",
    "check_inplace",
    "check_operand",
    "check_readonly",
    "check_message",
    "check_threads",
]

CYTHON, CUDA, REFERENCE = "cython", "cuda", "reference"


class _Ext:
    """The compiled modules, or None each when the build is missing."""

    averaging = threshold = updaters = None
    error: Exception | None = None


ext = _Ext()
try:
    from sparkavg_ext import _averaging, _threshold, _updaters

    ext.averaging, ext.threshold, ext.updaters = _averaging, _threshold, _updaters
except ImportError as exc:  # not built: everything takes the numpy reference
    ext.error = exc
    logger.warning(
        "sparkavg_ext is not built (%s); numpy float32 arrays take the slow numpy "
        "reference path. Build it with: python setup.py build_ext --inplace", exc
    )


def have_extension() -> bool:
    """Whether the Cython kernels are compiled and importable."""
    return ext.error is None


def _kind(name: str, a) -> str:
    if isinstance(a, np.ndarray):
        return "numpy"
    if backend.is_gpu_array(a):
        return "cupy"
    raise TypeError(f"Expect {name} to be a numpy or CuPy array, got {type(a).__name__}")


def route(kind: str, dtype) -> str:
    """CYTHON, CUDA or REFERENCE for arrays of ``kind`` and ``dtype``."""
    if backend.pure_numpy():
        return REFERENCE
    if kind == "cupy":
        return CUDA
    if dtype == np.float32 and ext.error is None:
        return CYTHON
    return REFERENCE


def _check_float(name: str, a) -> None:
    if a.dtype != np.float32 and a.dtype != np.float64:
        raise TypeError(
            f"Expect {name} of dtype float32 (float64 takes the numpy reference path), "
            f"got {a.dtype}"
        )


def _check_flat(name: str, a) -> None:
    if a.ndim != 1:
        raise ValueError(f"Expect {name} to be a flat 1-D vector, got shape {a.shape}")
    if a.size > MAX_LENGTH:
        raise ValueError(
            f"Expect {name} of at most {MAX_LENGTH} values (indices travel as int32), "
            f"got {a.size}"
        )


def check_inplace(name: str, a, flat: bool = False) -> str:
    """Check an array written in place; return its kind ("numpy"/"cupy")."""
    kind = _kind(name, a)
    _check_float(name, a)
    if flat:
        _check_flat(name, a)
    if not a.flags.c_contiguous:
        raise ValueError(
            f"Expect {name} to be C-contiguous, got a strided view (strides {a.strides}): "
            "it is updated in place, so it cannot be converted to a contiguous copy"
        )
    if kind == "numpy" and not a.flags.writeable:
        raise ValueError(f"Expect {name} to be writeable: it is updated in place")
    return kind


def check_operand(name: str, x, like, like_name: str):
    """A read-only operand of an in-place op: same kind, dtype and shape as
    ``like``; a strided one comes back as a contiguous copy."""
    kind = _kind(name, x)
    like_kind = _kind(like_name, like)
    if kind != like_kind:
        raise TypeError(
            f"Expect {name} to be a {like_kind} array like {like_name}, got a {kind} array"
        )
    if x.dtype != like.dtype:
        raise TypeError(f"Expect {name} of dtype {like.dtype} like {like_name}, got {x.dtype}")
    if x.shape != like.shape:
        raise ValueError(f"Expect {name} of shape {like.shape} like {like_name}, got {x.shape}")
    if not x.flags.c_contiguous:
        x = backend.get_array_module(x).ascontiguousarray(x)
    return x


def check_readonly(name: str, a):
    """A float array that is only read; strided ones are copied.
    Returns ``(kind, array)``."""
    kind = _kind(name, a)
    _check_float(name, a)
    if not a.flags.c_contiguous:
        a = backend.get_array_module(a).ascontiguousarray(a)
    return kind, a


def check_message(encoded):
    """An int32 1-D message; strided ones are copied.  Returns ``(kind, array)``."""
    kind = _kind("encoded", encoded)
    if encoded.dtype != np.int32:
        raise TypeError(f"Expect an int32 encoded message, got dtype {encoded.dtype}")
    if encoded.ndim != 1:
        raise ValueError(f"Expect a 1-D encoded message, got shape {encoded.shape}")
    if not encoded.flags.c_contiguous:
        encoded = backend.get_array_module(encoded).ascontiguousarray(encoded)
    return kind, encoded


def check_threads(n_threads) -> int:
    """``n_threads`` for the Cython kernels: None -> 1 (a Spark task owns one core)."""
    if n_threads is None:
        return 1
    if isinstance(n_threads, bool) or not isinstance(n_threads, numbers.Integral):
        raise TypeError(f"Expect n_threads to be an int or None, got {n_threads!r}")
    if n_threads < 1:
        raise ValueError(f"Expect n_threads >= 1, got {n_threads}")
    return int(n_threads)
