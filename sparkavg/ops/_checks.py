"""Argument checks and error messages shared by every kernel backend.

Each message says what was expected and what was got.  The fronts
(:mod:`sparkavg.ops.elementwise`, ``.encoding``, ``.conv``) check their
arguments here before dispatching, so every path rejects the same input
with the same text.  The data-dependent checks (NaN/inf in a residual, bad
indices in a message body) run inside each backend, which formats them with
the helpers here.

Convert or reject:

- Arrays written in place (a buffer, params, updater state, a residual, a
  decode target, a conv/pool ``out``) are *rejected* unless C-contiguous and
  writeable: a converted copy would take the write and the caller would
  never see it.  Float arrays must be float32/float64 (``TypeError``
  otherwise); layout problems raise ``ValueError``.
- Read-only operands (``x``, ``grads``, an encoded message, the residual of
  ``count_above``, conv/pool inputs) must have the dtype of the array they
  update (no silent float64 -> float32 casts) and are *converted* to a
  C-contiguous copy when strided.
"""
from __future__ import annotations

import math
import numbers
import struct

import numpy as np

from .. import backend

__all__ = [
    "array_kind",
    "check_inplace",
    "check_operand",
    "check_readonly",
    "check_message",
    "check_threads",
    "MAX_LENGTH",
    "SPARSE_FLAG",
    "BITMAP_FLAG",
    "HEADER_WORDS",
    "default_limit",
    "bitmap_length",
    "check_threshold",
    "check_limit",
    "check_clip_factor",
    "clip_bound",
    "float_bits",
    "bits_float",
    "non_finite_error",
    "bad_index_error",
    "bad_word_error",
]

_F32 = struct.Struct("<f")
_I32 = struct.Struct("<i")

#: Indices are signed 1-based int32 and N travels as int32 in the header.
MAX_LENGTH = 2**31 - 1
HEADER_WORDS = 4
SPARSE_FLAG = 0  # libnd4j ThresholdCompression.FLEXIBLE_ENCODING
BITMAP_FLAG = 1  # libnd4j ThresholdCompression.BITMAP_ENCODING


def default_limit(n: int) -> int:
    """Default cap on the entries of one sparse message: ``max(n // 16, 2)``.

    ``n // 16`` is libnd4j's boundary (past it a bitmap of ``n // 16 + 5``
    words is smaller).  For ``n < 32`` that cap falls below 2 while a sparse
    message is only sent when at least 2 entries qualify, so libnd4j would
    send empty (or one-entry) messages; the floor of 2 keeps tiny vectors
    able to send.  :func:`sparkavg.ops.encode` switches those to bitmaps.
    """
    return max(int(n) // 16, 2)


def bitmap_length(n: int) -> int:
    """Words of a bitmap message for ``n`` values: ``n // 16 + 5`` (libnd4j)."""
    return int(n) // 16 + 5


def check_threshold(threshold) -> float:
    """The threshold rounded to the float32 that travels in the header
    (returned as a Python float holding that exact value).

    Encoders subtract exactly this value (cast to the residual's dtype), so
    that decoding the header's bits adds back what was taken.
    """
    if isinstance(threshold, (bool, np.bool_)) or not isinstance(threshold, numbers.Real):
        raise TypeError(f"Expect a real threshold, got {type(threshold).__name__} {threshold!r}")
    value = float(threshold)
    if not math.isfinite(value) or value <= 0.0:
        raise ValueError(f"Expect a finite threshold > 0, got {threshold!r}")
    try:
        tau = _F32.unpack(_F32.pack(value))[0]  # round to float32 (struct: no numpy overhead)
    except OverflowError:
        tau = math.inf
    if not (math.isfinite(tau) and tau > 0.0):
        raise ValueError(
            f"Expect a threshold representable as a float32 > 0 (it travels as float32 bits), "
            f"got {threshold!r} which becomes {tau!r}"
        )
    return tau


def check_limit(limit, n: int) -> int:
    """``limit`` as an int >= 0, ``default_limit(n)`` when None."""
    if limit is None:
        return default_limit(n)
    if isinstance(limit, (bool, np.bool_)) or not isinstance(limit, numbers.Integral):
        raise TypeError(f"Expect an integer limit or None, got {type(limit).__name__} {limit!r}")
    if limit < 0:
        raise ValueError(f"Expect limit >= 0, got {limit}")
    return int(limit)


def check_clip_factor(k) -> float:
    value = float(k)
    if not math.isfinite(value) or value <= 0.0:
        raise ValueError(f"Expect a finite clip factor k > 0, got {k!r}")
    return value


def clip_bound(dtype, tau: float, k) -> float:
    """``k * tau`` rounded to ``dtype``: the bound :func:`clip_residual` uses."""
    return np.dtype(dtype).type(check_clip_factor(k) * float(tau))


def float_bits(tau: float) -> int:
    """The int32 whose bits are the float32 ``tau`` (header word 2)."""
    return _I32.unpack(_F32.pack(tau))[0]


def bits_float(bits: int) -> np.float32:
    """Inverse of :func:`float_bits`."""
    return np.int32(bits).view(np.float32)


def non_finite_error(n_bad: int, first: int) -> ValueError:
    return ValueError(
        f"residual holds {n_bad} non-finite value(s) (NaN or inf), the first at "
        f"index {first}; nothing was encoded and the residual is unchanged"
    )


def bad_index_error(position: int, value: int, n: int) -> ValueError:
    return ValueError(
        f"encoded entry {position} is {value}, not a signed 1-based "
        f"index into a target of length {n}; the target is unchanged"
    )


def bad_word_error(position: int, word: int, n: int) -> ValueError:
    return ValueError(
        f"bitmap word {position} (0x{word & 0xFFFFFFFF:08x}) has a sign bit "
        f"without its value bit or a bit past element {n - 1}; the target is unchanged"
    )


# ------------------------------------------------------------------- arrays
def array_kind(name: str, a) -> str:
    """"numpy" or "cupy"; TypeError for anything else."""
    if isinstance(a, np.ndarray):
        return "numpy"
    if backend.is_gpu_array(a):
        return "cupy"
    raise TypeError(f"Expect {name} to be a numpy or CuPy array, got {type(a).__name__}")


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


def check_inplace(name: str, a, flat: bool = False, dtype=None) -> str:
    """Check an array written in place; return its kind ("numpy"/"cupy").

    A float32/float64 array unless ``dtype`` names the one dtype allowed.
    """
    kind = array_kind(name, a)
    if dtype is None:
        _check_float(name, a)
    elif a.dtype != dtype:
        raise TypeError(f"Expect {name} of dtype {np.dtype(dtype)}, got {a.dtype}")
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


def check_operand(name: str, x, like, like_name: str, shape=None, dtype=None):
    """A read-only operand of an in-place op: the kind and dtype of ``like``
    (or ``dtype``) and its shape (or ``shape``); a strided one comes back as
    a contiguous copy."""
    kind = array_kind(name, x)
    like_kind = array_kind(like_name, like)
    if kind != like_kind:
        raise TypeError(
            f"Expect {name} to be a {like_kind} array like {like_name}, got a {kind} array"
        )
    want = like.dtype if dtype is None else np.dtype(dtype)
    if x.dtype != want:
        raise TypeError(f"Expect {name} of dtype {want} like {like_name}, got {x.dtype}")
    want_shape = like.shape if shape is None else tuple(shape)
    if x.shape != want_shape:
        raise ValueError(f"Expect {name} of shape {want_shape} like {like_name}, got {x.shape}")
    if not x.flags.c_contiguous:
        x = backend.get_array_module(x).ascontiguousarray(x)
    return x


def check_readonly(name: str, a):
    """A float array that is only read; strided ones are copied.
    Returns ``(kind, array)``."""
    kind = array_kind(name, a)
    _check_float(name, a)
    if not a.flags.c_contiguous:
        a = backend.get_array_module(a).ascontiguousarray(a)
    return kind, a


def check_message(encoded):
    """An int32 1-D message; strided ones are copied.  Returns ``(kind, array)``."""
    kind = array_kind("encoded", encoded)
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
