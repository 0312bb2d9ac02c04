"""Argument checks and error messages shared by every kernel backend.

Each message says what was expected and what was got.  The data-dependent
checks (NaN/inf in a residual, bad indices in a message body) run inside
each backend, which formats them with the helpers here so that the Cython,
CuPy and numpy paths raise the same text.
"""
from __future__ import annotations

import math
import numbers
import struct

import numpy as np

__all__ = [
    "MAX_LENGTH",
    "SPARSE_FLAG",
    "BITMAP_FLAG",
    "HEADER_WORDS",
    "default_limit",
    "bitmap_length",
    "check_threshold",
    "check_limit",
    "check_clip_factor",
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
