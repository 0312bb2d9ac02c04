"""Threshold encoding of residuals for gradient sharing (libnd4j formats).

Wire formats, int32 arrays (REFERENCE.md section 1):

- sparse ("flexible"): ``[count, N, bits(tau), 0]`` then ``count`` signed
  1-based indices in ascending order: ``+(i+1)`` sends ``+tau`` for
  ``r[i] >= tau`` (then ``r[i] -= tau``), ``-(i+1)`` sends ``-tau`` for
  ``r[i] <= -tau`` (then ``r[i] += tau``).
- bitmap: ``[N, N, bits(tau), 1]`` then ``N // 16 + 1`` words (length
  ``N // 16 + 5``); word ``4+k`` covers elements ``16k .. 16k+15``, bit
  ``b`` = "sends tau", bit ``b+16`` = "negative".

Decisions (where libnd4j leaves a choice or does something we do not want):

- tau travels as float32 bits; encoders subtract exactly ``float32(tau)``
  (in the residual's dtype) and decoders add exactly that, so what leaves a
  residual is what arrives.
- Bitmaps are symmetric: ``|r| >= tau`` sends ``+-tau``.  libnd4j also
  sends ``-tau/2`` for ``r`` in ``(-tau, -tau/2]`` as a sign bit without
  its value bit; we never produce that and the decoder rejects such words,
  so ``decode(encode(r)) + r_after == r_before`` holds for both formats.
- Sparse cap: ``limit`` defaults to ``max(N // 16, 2)`` (see
  :func:`sparkavg.ops.default_limit`); the first ``limit`` qualifying
  indices are sent, the rest stay in the residual.
- Nothing to send: the sparse encoder returns None (residual untouched)
  when fewer than 2 entries qualify, as libnd4j.
- Ordering: indices are ascending (libnd4j's OpenMP encoder leaves them in
  thread order); a capped message is therefore the lowest indices.
- A residual holding NaN or inf is rejected with ValueError (how many, the
  first index) and left bit-for-bit unchanged; a malformed message is
  rejected before the target is touched.
"""
from __future__ import annotations

import numpy as np

from .. import backend
from ._checks import (
    BITMAP_FLAG,
    HEADER_WORDS,
    SPARSE_FLAG,
    bitmap_length,
    bits_float,
    check_clip_factor,
    check_inplace,
    check_limit,
    check_message,
    check_readonly,
    check_threshold,
    default_limit,
)
from ._cuda import bitmap_count
from ._dispatch import call
from .merging import MERGED_FLAG, decode_merged, merged_count

__all__ = [
    "SPARSE",
    "BITMAP",
    "default_limit",
    "threshold_encode",
    "threshold_decode",
    "bitmap_encode",
    "bitmap_decode",
    "encode",
    "decode",
    "EncodingState",
    "encoded_count",
    "encoded_nbytes",
    "count_above",
    "clip_residual",
]

SPARSE = "sparse"
BITMAP = "bitmap"


# ---------------------------------------------------------------- internals
def _read_header(encoded, n_target):
    """Check a message header against its length and the target; return
    ``(flag, count, tau)`` (count = sparse entries; N for bitmaps)."""
    size = int(encoded.size)
    if size < HEADER_WORDS:
        raise ValueError(
            f"Expect an encoded message of at least {HEADER_WORDS} int32 words (its header), "
            f"got {size}"
        )
    # Device messages: a 16-byte device -> host copy (sync).
    word0, n, bits, flag = (int(v) for v in backend.to_cpu(encoded[:HEADER_WORDS]))
    if flag not in (SPARSE_FLAG, BITMAP_FLAG):
        raise ValueError(
            f"Unknown encoding flag {flag} in header word 3: expected {SPARSE_FLAG} (sparse) "
            f"or {BITMAP_FLAG} (bitmap)"
        )
    if n != n_target:
        raise ValueError(
            f"Encoded message is for N = {n} values (header word 1), but the target has "
            f"length {n_target}"
        )
    if flag == SPARSE_FLAG:
        if word0 < 0 or word0 > size - HEADER_WORDS:
            raise ValueError(
                f"Sparse header count {word0} does not fit its body of {size - HEADER_WORDS} "
                "entries"
            )
    else:
        if word0 != n:
            raise ValueError(f"Bitmap header words 0 and 1 must both be N, got {word0} and {n}")
        if size != bitmap_length(n):
            raise ValueError(
                f"Bitmap message for N = {n} must have {bitmap_length(n)} words, got {size}"
            )
    tau = bits_float(bits)
    if not (np.isfinite(tau) and tau > 0):
        raise ValueError(
            f"Header threshold {float(tau)!r} (bits 0x{bits & 0xFFFFFFFF:08x}) is not a "
            "finite float32 > 0"
        )
    return flag, word0, tau


def _decode_body(flag, count, tau, encoded, msg_kind, target, kind):
    if msg_kind == "cupy" and kind == "numpy":
        encoded = backend.to_cpu(encoded)  # device -> host copy (sync)
    if flag == SPARSE_FLAG:
        call("decode_sparse", kind, target.dtype, encoded, target, count, tau)
    else:
        call("decode_bitmap", kind, target.dtype, encoded, target, tau)
    return target


# ------------------------------------------------------------- the formats
def threshold_encode(residual, threshold, limit=None):
    """Sparse-encode ``residual`` and subtract what is sent, in place.

    Parameters
    ----------
    residual : float32 (or float64) 1-D array, numpy or CuPy, C-contiguous
    threshold : float > 0; sent as float32
    limit : int >= 0 or None
        Most indices in one message; None -> ``max(N // 16, 2)``.

    Returns
    -------
    int32 array of length ``4 + count``, or None (residual untouched) when
    fewer than 2 entries have ``|r| >= tau``.

    Raises
    ------
    ValueError
        NaN/inf in ``residual`` (how many, first index; nothing changed),
        ``threshold`` not finite and > 0, a bad ``limit`` or layout.
    TypeError
        A dtype other than float32/float64, or not an array.
    """
    kind = check_inplace("residual", residual, flat=True)
    tau = check_threshold(threshold)
    limit = check_limit(limit, residual.size)
    return call("encode_sparse", kind, residual.dtype, residual, tau, limit, True)[0]


def bitmap_encode(residual, threshold):
    """Bitmap-encode ``residual`` and subtract what is sent, in place.

    Returns an int32 array of length ``N // 16 + 5`` (always, even when it
    sends nothing).  Raises as :func:`threshold_encode`.
    """
    kind = check_inplace("residual", residual, flat=True)
    tau = check_threshold(threshold)
    return call("encode_bitmap", kind, residual.dtype, residual, tau)[0]


def _decode_as(encoded, target, expected_flag: int, name: str, other: str):
    """Decode ``encoded`` into ``target`` if its header has ``expected_flag``."""
    kind = check_inplace("target", target, flat=True)
    msg_kind, enc = check_message(encoded)
    flag, count, tau = _read_header(enc, target.size)
    if flag != expected_flag:
        raise ValueError(
            f"Expect a {name} message (header flag {expected_flag}), got flag {flag}: "
            f"use {other} or decode"
        )
    return _decode_body(flag, count, tau, enc, msg_kind, target, kind)


def threshold_decode(encoded, target):
    """``target[|v|-1] += sign(v) * tau`` for each body entry, in place.

    ``encoded`` is an int32 sparse message (numpy or CuPy); ``target`` a
    float32/float64 1-D array of length N.  A header that disagrees with
    the message or the target, an index 0 or out of range, or a flag other
    than 0 raises ValueError and leaves ``target`` unchanged.  Returns
    ``target``.
    """
    return _decode_as(encoded, target, SPARSE_FLAG, "sparse", "bitmap_decode")


def bitmap_decode(encoded, target):
    """``target[16k+b] += +-tau`` for each value bit of word ``4+k``, in place.

    Rejects (ValueError, target unchanged) a header that disagrees with the
    target or the message length, a flag other than 1, a sign bit without
    its value bit (libnd4j's ``-tau/2``), and bits past element N-1.
    Returns ``target``.
    """
    return _decode_as(encoded, target, BITMAP_FLAG, "bitmap", "threshold_decode")


# ------------------------------------------------------ switching encoder
class EncodingState:
    """What :func:`encode` remembers between calls (one per residual).

    Attributes
    ----------
    limit : int or None
        *Set by user.*  Sparse cap; None -> ``max(N // 16, 2)``.
    format : {"bitmap", "sparse"}
        *Internal.*  The format the next call tries first; starts "bitmap".
    last_format : {"bitmap", "sparse", None}
        *Internal.*  What the last call sent (None: nothing).
    last_count : int
        *Internal.*  Entries with ``|r| >= tau`` seen by the last call.
    messages, sparse_messages, bitmap_messages, skipped : int
        *Statistics.*  Messages sent (by format) and calls that sent nothing.
    values_sent, bytes_sent, dense_bytes : int
        *Statistics.*  +-tau entries and bytes sent; bytes the dense vectors
        would have taken (for the compression ratio).
    """

    __slots__ = (
        # set by user
        "limit",
        # internal
        "format",
        "last_format",
        "last_count",
        # statistics
        "messages",
        "sparse_messages",
        "bitmap_messages",
        "skipped",
        "values_sent",
        "bytes_sent",
        "dense_bytes",
    )

    def __init__(self, limit=None):
        if limit is not None:
            check_limit(limit, 0)
        self.limit = limit
        self.reset()

    def reset(self) -> None:
        """Back to bitmap first, statistics zeroed (``limit`` kept)."""
        self.format = BITMAP
        self.last_format = None
        self.last_count = 0
        self.messages = self.sparse_messages = self.bitmap_messages = self.skipped = 0
        self.values_sent = self.bytes_sent = self.dense_bytes = 0

    @property
    def compression_ratio(self) -> float:
        """Dense bytes over sent bytes (inf when nothing was sent)."""
        return self.dense_bytes / self.bytes_sent if self.bytes_sent else float("inf")

    def as_dict(self) -> dict:
        return {name: getattr(self, name) for name in self.__slots__}

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in self.as_dict().items())
        return f"EncodingState({fields})"


def encode(residual, threshold, state=None):
    """Encode ``residual`` in place as libnd4j's EncodingHandler does.

    Starts with a bitmap; after a bitmap that carried fewer than
    ``(N // 16 + 5) // 2`` values the next call tries sparse; a sparse
    attempt that would reach the cap (``count >= limit``) is re-encoded as a
    bitmap in the same call -- unlike libnd4j, which has then already
    subtracted the capped sparse message and drops it, our sparse encoder
    restores what it took before the bitmap encoder runs.

    Parameters
    ----------
    residual : float32 (or float64) 1-D array, numpy or CuPy
    threshold : float > 0
    state : EncodingState or None
        Carries the format between calls and collects statistics; a fresh
        one (bitmap first) when None.

    Returns
    -------
    int32 message (either format) or None when nothing is sent: fewer than
    2 entries qualify in sparse mode, or none in bitmap mode (the residual
    is untouched then).
    """
    kind = check_inplace("residual", residual, flat=True)
    tau = check_threshold(threshold)
    st = EncodingState() if state is None else state
    n = residual.size
    limit = check_limit(st.limit, n)
    if st.format == SPARSE:
        message, count = call("encode_sparse", kind, residual.dtype, residual, tau, limit, False)
        sent = SPARSE
        if message is None and count >= 2:  # count >= limit: a bitmap is smaller
            st.format = BITMAP
            message, count = call("encode_bitmap", kind, residual.dtype, residual, tau)
            sent = BITMAP
    else:
        message, count = call("encode_bitmap", kind, residual.dtype, residual, tau)
        sent = BITMAP
        if count < bitmap_length(n) // 2:
            st.format = SPARSE
        if count == 0:
            message = None  # all-zero bitmap: nothing moved, nothing to send
    st.last_count = int(count)
    if message is None:
        st.last_format = None
        st.skipped += 1
        return None
    st.last_format = sent
    st.messages += 1
    if sent == SPARSE:
        st.sparse_messages += 1
    else:
        st.bitmap_messages += 1
    st.values_sent += int(count)
    st.bytes_sent += encoded_nbytes(message)
    st.dense_bytes += n * residual.itemsize
    return message


def decode(encoded, target):
    """Add an encoded message (any format, read from its header flag:
    sparse, bitmap, or a tree's merged sum -- :mod:`sparkavg.ops.merging`)
    into ``target`` in place; returns ``target``.  Raises as
    :func:`threshold_decode` / :func:`bitmap_decode`."""
    kind = check_inplace("target", target, flat=True)
    msg_kind, enc = check_message(encoded)
    if enc.size > 3 and int(backend.to_cpu(enc[3:4])[0]) == MERGED_FLAG:  # device messages: a 4-byte sync
        return decode_merged(enc, target)
    flag, count, tau = _read_header(enc, target.size)
    return _decode_body(flag, count, tau, enc, msg_kind, target, kind)


def encoded_count(encoded) -> int:
    """How many +-tau entries a message carries (0 for None).

    Sparse: header word 0.  Bitmap: the number of value bits.  Merged:
    the entries of the messages summed into it (header words 5-6).
    """
    if encoded is None:
        return 0
    msg_kind, enc = check_message(encoded)
    if enc.size < HEADER_WORDS:
        raise ValueError(f"Expect at least {HEADER_WORDS} words (the header), got {enc.size}")
    word0, _, _, flag = (int(v) for v in backend.to_cpu(enc[:HEADER_WORDS]))  # sync (device)
    if flag == SPARSE_FLAG:
        return word0
    if flag == MERGED_FLAG:
        return merged_count(enc)
    if flag != BITMAP_FLAG:
        raise ValueError(f"Unknown encoding flag {flag} in header word 3")
    if msg_kind == "cupy":
        return bitmap_count(enc)
    # Value bits are the low 16 of each word (np.bitwise_count needs numpy 2).
    low = (enc[HEADER_WORDS:].view(np.uint32) & np.uint32(0xFFFF)).astype(np.uint16)
    return int(np.unpackbits(low.view(np.uint8)).sum())


def encoded_nbytes(encoded) -> int:
    """Bytes a message takes on the wire (4 per int32 word; 0 for None)."""
    return 0 if encoded is None else int(encoded.size) * 4


# ------------------------------------------------------------------ helpers
def count_above(residual, threshold) -> int:
    """How many entries have ``|r| >= float32(threshold)`` (NaN never, inf
    always); libnd4j's thresholdEstimate.  ``residual`` is only read (any
    shape; strided arrays are copied)."""
    kind, r = check_readonly("residual", residual)
    tau = check_threshold(threshold)
    return call("count_above", kind, r.dtype, r, tau)


def clip_residual(residual, threshold, k=5.0):
    """Clip ``residual`` to ``[-k*tau, k*tau]`` in place (NaN stays NaN).

    The default residual post-processor runs this every 5 iterations with
    ``k = 5`` against "residual explosion".  Returns ``residual``.
    """
    kind = check_inplace("residual", residual)
    tau = check_threshold(threshold)
    check_clip_factor(k)
    call("clip_residual", kind, residual.dtype, residual, tau, k)
    return residual
