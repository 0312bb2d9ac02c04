"""Which implementation runs a kernel: the one routing rule.

Routing (:func:`route`), the same for every kernel in
:data:`sparkavg.ops._kernels.KERNELS`:

- ``SPARKAVG_PURE_NUMPY=1``            -> the numpy reference (numpy or CuPy arrays)
- CuPy arrays                          -> the CuPy backend (:mod:`sparkavg.ops._cuda`)
- numpy float32, extension built       -> the Cython kernels (:mod:`sparkavg.ops._cython`)
- anything else: numpy float64, or     -> the numpy reference (:mod:`sparkavg.ops.reference`)
  numpy float32 without the extension

float64: the Cython kernels are float32 only; float64 (what the gradient
checks use) takes the numpy reference for every kernel, on the CPU.  CuPy
arrays of either dtype take the CuPy backend.
"""
from __future__ import annotations

import numpy as np

from .. import backend
from . import _cuda, _cython, reference
from ._kernels import KERNELS, OPERATIONS

__all__ = [
    "KERNELS",
    "OPERATIONS",
    "CYTHON",
    "CUDA",
    "REFERENCE",
    "have_extension",
    "have_direct_conv",
    "route",
    "call",
]

CYTHON, CUDA, REFERENCE = "cython", "cuda", "reference"

_BACKENDS = {CYTHON: _cython, CUDA: _cuda, REFERENCE: reference}


def have_extension() -> bool:
    """Whether the Cython kernels (``sparkavg_ext``) are compiled and importable.

    The one such check in sparkavg; without them numpy float32 arrays take
    the numpy reference (a warning says so once, at import).
    """
    return _cython.error is None


def have_direct_conv() -> bool:
    """Whether numpy float32 convolutions run the direct kernels (the
    extension is built and the CPU has AVX-512).

    Without them :func:`sparkavg.ops.conv2d_forward` and its backward
    kernels still give the same results (im2col + GEMM), and
    :class:`sparkavg.nn.Conv2D` keeps its own im2col + GEMM path.
    """
    return _cython.error is None and _cython.direct_conv and not backend.pure_numpy()


def route(kind: str, dtype) -> str:
    """CYTHON, CUDA or REFERENCE for arrays of ``kind`` ("numpy"/"cupy")
    and ``dtype``: the rule in the module doc."""
    if backend.pure_numpy():
        return REFERENCE
    if kind == "cupy":
        return CUDA
    if dtype == np.float32 and _cython.error is None:
        return CYTHON
    return REFERENCE


def call(operation: str, kind: str, dtype, *args, **cython_options):
    """Run backend ``operation`` where :func:`route` sends (kind, dtype).

    ``cython_options`` are keywords only the Cython kernels take
    (``n_threads``); the other backends run without them.
    """
    path = route(kind, dtype)
    function = getattr(_BACKENDS[path], operation)
    if path == CYTHON:
        return function(*args, **cython_options)
    return function(*args)
