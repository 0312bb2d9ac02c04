"""CUDA kernel sources of :mod:`sparkavg.ops` and the one way to run them.

The ``.cu`` files here are written against the macros of ``spk.cuh``, so
the same text compiles as CUDA (nvrtc, through ``cupy.RawModule``) and as
plain C (tests/test_cuda_sources.py runs the bodies serially on the CPU
against the numpy reference).  :func:`source` assembles one compilation
unit: the element and index types, the prelude, the kernels.

The Python side of every kernel is written against a *launcher*: an object
with ``xp`` (the array module its arrays live in) and ``launch(file, name,
dtype, index, threads, args)``.  :class:`CupyLauncher` is the device one
(:func:`device` gives the process's);
the tests' C launcher runs the same Python glue on numpy arrays.  Scalars
in ``args`` are numpy scalars of the kernel parameter's exact type
(``np.int32``/``np.int64`` for ``int``/``I``, ``dtype.type`` for ``T``):
CuPy passes them by value as they are.

Importing this module never imports CuPy.
"""
from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

from ... import backend

__all__ = ["BLOCK", "FILES", "INDEX_TYPES", "NVRTC_OPTIONS", "CupyLauncher", "device",
           "index_type", "source"]

_HERE = Path(__file__).resolve().parent
_PRELUDE = "spk.cuh"
_INCLUDE = f'#include "{_PRELUDE}"'

#: The kernel files, by the name :func:`source` takes.
FILES = ("conv", "encode", "norm", "rnn")
#: C type of the flat index I, by numpy dtype.
INDEX_TYPES = {np.dtype(np.int32): "int", np.dtype(np.int64): "long long"}
_ELEMENT_TYPES = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}

#: Threads per block (a multiple of 32: warp kernels assume whole warps).
BLOCK = 256
#: Blocks at most; grid-stride loops cover the rest.
_MAX_BLOCKS = 1 << 16
#: No multiply-add contraction: sums equal the CPU kernels' bit for bit.
NVRTC_OPTIONS = ("--std=c++14", "--fmad=false")


@functools.cache
def _read(name: str) -> str:
    return (_HERE / name).read_text()


def source(file: str, dtype, index=np.int64) -> str:
    """One compilation unit: ``typedef``s of T and I, the prelude, ``file``.cu.

    Parameters
    ----------
    file : str
        One of :data:`FILES`.
    dtype : float32 or float64
        The element type T.
    index : int32 or int64
        The flat index type I.
    """
    if file not in FILES:
        raise ValueError(f"Expect a kernel file in {FILES}, got {file!r}")
    dtype, index = np.dtype(dtype), np.dtype(index)
    if dtype not in _ELEMENT_TYPES:
        raise TypeError(f"Expect float32 or float64 elements, got {dtype}")
    if index not in INDEX_TYPES:
        raise TypeError(f"Expect an int32 or int64 index, got {index}")
    body = _read(f"{file}.cu")
    if _INCLUDE not in body:
        raise RuntimeError(f"{file}.cu does not include {_PRELUDE}")
    return (f"typedef {_ELEMENT_TYPES[dtype]} T;\ntypedef {INDEX_TYPES[index]} I;\n"
            + body.replace(_INCLUDE, _read(_PRELUDE), 1))


def index_type(*sizes: int):
    """int32 when every flat index of a launch (sizes, plus a grid stride)
    fits in 31 bits, else int64: 64-bit division costs several times more
    on the device."""
    bound = max(sizes, default=0) + BLOCK * _MAX_BLOCKS
    return np.int32 if bound < 2**31 else np.int64


class CupyLauncher:
    """Compiles (once per file, dtype and index type; CuPy caches the
    binaries on disk too) and launches the kernels on the current stream."""

    def __init__(self, cupy):
        self.xp = cupy
        self._modules = {}
        self._kernels = {}  # (file, name, dtype, index) -> RawKernel: no lookup per launch

    def _kernel(self, file, name, dtype, index):
        key = (file, name, dtype, index)
        kernel = self._kernels.get(key)
        if kernel is None:
            unit = (file, np.dtype(dtype), np.dtype(index))
            if unit not in self._modules:
                self._modules[unit] = self.xp.RawModule(code=source(*unit), options=NVRTC_OPTIONS)
            kernel = self._kernels[key] = self._modules[unit].get_function(name)
        return kernel

    def launch(self, file, name, dtype, index, threads, args):
        """Run kernel ``name`` of ``file`` with at least ``threads`` threads
        (fewer blocks past the cap: the kernels loop); no launch for 0."""
        if threads <= 0:
            return
        kernel = self._kernel(file, name, dtype, index)
        blocks = min(-(-int(threads) // BLOCK), _MAX_BLOCKS)
        kernel((blocks,), (BLOCK,), args)


@functools.cache
def device() -> CupyLauncher:
    """The launcher of the current process (raises when CuPy is unusable)."""
    return CupyLauncher(backend.cupy())
