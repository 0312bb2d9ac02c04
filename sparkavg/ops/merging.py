"""Threshold messages summed on their way between ranks (``Topology.TREE``;
SparCML, Renggli et al. 2019): the merged wire format.

Every message the ranks merge was encoded at the same τ (they share it), so the sum of any number of them is ``c_i τ`` per index with a
small integer ``c_i`` (a rank sends at most one ``±τ`` per index and
iteration).  A merged message carries those counts, int32 words,
little-endian::

    header (7 words): count | N | bits(τ) | 2 | layout | sent (low) | sent (high)
    sparse body:      count indices (0-based, ascending), then count counts
    dense body:       N counts (count = N)

``layout`` is ``width | dense << 8``: counts are signed ``width``-byte
integers (1 while every ``|c| <= 127``, else 2), packed and zero-padded to
a whole word.  A merged message is dense where that is smaller: when
``count (4 + width) > N width``, past ``1/5`` of the entries at width 1
(SparCML's switch to a dense vector as the sum fills in).  ``sent`` is the
number of ``±τ`` entries the summed messages carried (cancelled ones too):
what the ranks' shared τ adapts to.

:func:`merge_messages` takes messages of any format -- libnd4j sparse,
bitmap, or merged -- and returns their sum; :func:`decode` of
:mod:`sparkavg.ops.encoding` adds one into a target (``c_i`` times
``float32(τ)``, as float32 products); merging is exact integer arithmetic,
so merging messages in any grouping (level by level, exchange by
exchange) gives the same words as merging them all at once.  Where the routing rule takes the extension
(numpy, ``sparkavg_ext`` built, no ``SPARKAVG_PURE_NUMPY``), sums of
sparse messages are pairwise merges of their ascending lists, one kernel
call each (``sparkavg_ext._merging.merge_pair``: headers, checks, merge and
packing), and a merged message is added into a float32 target by
``add_counts``; a bitmap, a dense merge or a message the kernels refuse
takes the numpy path (sorting the entries, ``bincount``), which gives the
same words -- or names the fault.
A CuPy target is written on its device; :mod:`sparkavg.ops.reference_merging`
is the entry-by-entry oracle.
"""
from __future__ import annotations

import numpy as np

from .. import backend
from . import _cython
from ._checks import BITMAP_FLAG, HEADER_WORDS, SPARSE_FLAG, bitmap_length, bits_float

__all__ = ["MERGED_FLAG", "MERGED_HEADER_WORDS", "merge_messages", "merged_parts", "decode_merged",
           "merged_count"]

#: Header word 3 of a merged message.
MERGED_FLAG = 2
MERGED_HEADER_WORDS = 7
_MAX_COUNT = {1: 127, 2: 32767}


def _words(message) -> np.ndarray:
    if isinstance(message, (bytes, bytearray, memoryview)):
        size = memoryview(message).nbytes
        if size % 4:
            raise ValueError(f"Expect a message of whole int32 words (a multiple of 4 bytes), got {size} bytes")
        return np.frombuffer(message, dtype="<i4")
    arr = np.asarray(backend.to_cpu(message))  # a device message: copied to the host (sync)
    if arr.dtype != np.int32 or arr.ndim != 1:
        raise TypeError(f"Expect an int32 1-D message, got dtype {arr.dtype} and shape {arr.shape}")
    return arr


def _counts_bytes(width: int, size: int) -> int:
    return -(-size * width // 4) * 4  # padded to whole words


def _layout(words: np.ndarray, n: int):
    """A merged message's header checked for N = ``n``: ``(tau, sent,
    indices, counts)`` as views of its words (``indices`` None when dense;
    counts int8 or int16), the entries themselves not checked."""
    if words.size < MERGED_HEADER_WORDS or int(words[3]) != MERGED_FLAG:
        raise ValueError(f"Expect a merged message ({MERGED_HEADER_WORDS}-word header, flag {MERGED_FLAG} in "
                         f"word 3), got {words.size} words" + (f" with flag {int(words[3])}" if words.size > 3 else ""))
    count, size, bits, _, layout = (int(v) for v in words[:5])
    sent = int(np.uint32(words[5])) | (int(np.uint32(words[6])) << 32)
    if size != n:
        raise ValueError(f"Merged message is for N = {size} values (header word 1), but the target has length {n}")
    width, dense = layout & 0xFF, layout >> 8
    if width not in _MAX_COUNT or dense not in (0, 1):
        raise ValueError(f"Expect a merged layout of width 1 or 2 and a dense bit 0 or 1, got layout 0x{layout:x}")
    tau = bits_float(bits)
    if not (np.isfinite(tau) and tau > 0):
        raise ValueError(f"Merged header threshold {float(tau)!r} is not a finite float32 > 0")
    body = words[MERGED_HEADER_WORDS:]
    if dense:
        if count != n or body.size * 4 != _counts_bytes(width, n):
            raise ValueError(f"Dense merged message for N = {n} must have count N and {_counts_bytes(width, n) // 4} "
                             f"body words, got count {count} and {body.size}")
        return tau, sent, None, body.view(np.uint8)[:n * width].view(f"<i{width}")
    if count < 0 or body.size * 4 != count * 4 + _counts_bytes(width, count):
        raise ValueError(f"Sparse merged message with count {count} (width {width}) must have "
                         f"{count + _counts_bytes(width, count) // 4} body words, got {body.size}")
    return tau, sent, body[:count], body[count:].view(np.uint8)[:count * width].view(f"<i{width}")


def merged_parts(message, n: int):
    """Check a merged message for N = ``n`` and return ``(tau, sent, indices,
    counts)``: ``indices`` None for a dense message (``counts`` then has N
    entries), int64 counts.

    Raises
    ------
    ValueError
        A header that is not a merged message's for ``n``, or a body of the
        wrong length, indices out of order or range, a zero count.
    """
    tau, sent, indices, counts = _layout(_words(message), n)
    counts = counts.astype(np.int64)
    if indices is None:
        return tau, sent, None, counts
    indices = indices.astype(np.int64)
    if indices.size and (indices[0] < 0 or indices[-1] >= n or np.any(np.diff(indices) <= 0)):
        raise ValueError(f"Expect merged indices ascending in [0, {n}), got {indices[:8].tolist()}...")
    if np.any(counts == 0):
        raise ValueError("Expect no zero count in a sparse merged message")
    return tau, sent, indices, counts


def merged_count(message) -> int:
    """``sent``: the ±τ entries the messages merged into this one carried."""
    words = _words(message)
    return int(np.uint32(words[5])) | (int(np.uint32(words[6])) << 32)


def _entries(words: np.ndarray, n: int) -> tuple:
    """One message's ``(tau bits, indices, counts, entries it carried)``:
    int64 indices (distinct) and nonzero counts."""
    if words.size < HEADER_WORDS:
        raise ValueError(f"Expect an encoded message of at least {HEADER_WORDS} int32 words, got {words.size}")
    word0, size, bits, flag = (int(v) for v in words[:HEADER_WORDS])
    if flag == MERGED_FLAG:
        _, sent, indices, counts = merged_parts(words, n)
        if indices is None:
            indices = np.flatnonzero(counts)
            counts = counts[indices]
        return bits, indices, counts, sent
    if size != n:
        raise ValueError(f"Encoded message is for N = {size} values (header word 1), but the merge is of N = {n}")
    if flag == SPARSE_FLAG:
        if word0 < 0 or word0 > words.size - HEADER_WORDS:
            raise ValueError(f"Sparse header count {word0} does not fit its body of {words.size - HEADER_WORDS}")
        body = words[HEADER_WORDS:HEADER_WORDS + word0].astype(np.int64)
        indices = np.abs(body) - 1
        if word0 and (np.any(body == 0) or indices.max() >= n):
            raise ValueError(f"Expect sparse indices in [1, {n}] (signed, 1-based), got {body[:8].tolist()}...")
        return bits, indices, np.sign(body), word0
    if flag == BITMAP_FLAG:
        if word0 != n or words.size != bitmap_length(n):
            raise ValueError(f"Bitmap message for N = {n} must have header N and {bitmap_length(n)} words, "
                             f"got {word0} and {words.size}")
        w = words[HEADER_WORDS:].view(np.uint32)[:, None] >> np.arange(32, dtype=np.uint32)
        value = (w[:, :16] & 1).astype(bool).ravel()
        negative = (w[:, 16:] & 1).astype(bool).ravel()
        if np.any(negative & ~value) or np.any(value[n:]):
            raise ValueError("Bitmap word has a sign bit without its value bit (libnd4j's -tau/2), or bits past "
                             "element N - 1: not mergeable")
        indices = np.flatnonzero(value)
        return bits, indices, np.where(negative[indices], -1, 1), int(indices.size)
    raise ValueError(f"Unknown encoding flag {flag} in header word 3: expected {SPARSE_FLAG} (sparse), "
                     f"{BITMAP_FLAG} (bitmap) or {MERGED_FLAG} (merged)")


def merged_message(indices: np.ndarray, counts: np.ndarray, n: int, bits: int, sent: int) -> np.ndarray:
    """The merged message of nonzero ``counts`` at ascending distinct
    ``indices`` (of N = ``n``) at τ ``bits``, carrying ``sent`` entries."""
    top = int(np.abs(counts).max()) if counts.size else 0
    width = 1 if top <= _MAX_COUNT[1] else 2
    if top > _MAX_COUNT[2]:
        raise ValueError(f"Expect merged counts within ±{_MAX_COUNT[2]} (one ±τ per rank and index), got {top}")
    dense = indices.size * (4 + width) > n * width
    if dense:
        values = np.zeros(n, np.int64)
        values[indices] = counts
    else:
        values = counts
    packed = np.zeros(_counts_bytes(width, values.size), np.uint8)
    packed[:values.size * width] = values.astype(f"<i{width}").view(np.uint8)
    header = np.array([n if dense else indices.size, n, bits, MERGED_FLAG, width | (int(dense) << 8),
                       np.uint32(sent & 0xFFFFFFFF).view(np.int32), np.uint32(sent >> 32).view(np.int32)],
                      dtype=np.int32)
    parts = [header] if dense else [header, indices.astype(np.int32)]
    return np.concatenate(parts + [packed.view("<i4")])


def merge_messages(messages, n: int):
    """The sum of threshold messages encoded at one τ, as one message.

    Parameters
    ----------
    messages : iterable of int32 arrays or bytes-like
        Messages of any format (libnd4j sparse or bitmap, merged); empty
        payloads and None are skipped (an iteration that sent nothing).
    n : int
        N, the length of the vectors they encode.

    Returns
    -------
    int32 numpy array or None
        None when every message was empty; the message itself when exactly
        one is not (its format kept: a bitmap stays smaller than a dense
        merge); else a merged message (module doc), in the same order of
        indices whatever the order of ``messages``.

    Raises
    ------
    ValueError
        A malformed message, one for another N, or messages encoded at
        different τ (named).
    """
    present = [_words(m) for m in messages if m is not None and (not isinstance(m, (bytes, bytearray, memoryview))
                                                                   or len(m))]
    if not present:
        return None
    if len(present) == 1:  # kept as it is (checked in full where it is decoded)
        words = present[0]
        if words.size < HEADER_WORDS or int(words[1]) != n:
            raise ValueError(f"Expect a message for N = {n} (header word 1), got {words[:HEADER_WORDS].tolist()}")
        return words
    if _cython.merging_kernels():  # pairwise, in one kernel call each; None: the numpy path's case
        merged = present[0]
        for more in present[1:]:
            merged = _cython.merge_pair(merged, more, n)
            if merged is None:
                break
        else:
            return merged
    first_bits, sent, all_indices, all_counts = None, 0, [], []
    for words in present:
        bits, indices, counts, entries = _entries(words, n)
        if first_bits is None:
            first_bits = bits
        elif bits != first_bits:
            raise ValueError(f"Expect messages encoded at one threshold τ to merge, got "
                             f"τ={float(bits_float(first_bits))!r} and τ={float(bits_float(bits))!r}: the ranks of a "
                             f"tree share their τ")
        sent += entries
        all_indices.append(indices)
        all_counts.append(counts)
    indices, counts = np.concatenate(all_indices), np.concatenate(all_counts)
    if indices.size * 8 < n:  # few entries: sort them (E log E) rather than pass over all N
        unique, where = np.unique(indices, return_inverse=True)
        summed = np.bincount(where, counts, minlength=unique.size)
    else:
        summed = np.bincount(indices, counts, minlength=n)  # float64 sums of small integers: exact
        unique = np.arange(n)
    keep = summed != 0
    return merged_message(unique[keep], summed[keep].astype(np.int64), n, first_bits, sent)


def decode_merged(message, target):
    """Add a merged message into ``target`` (float32 or float64, numpy or
    CuPy) in place: ``target[i] += float(c_i) * float(τ)`` in the target's
    dtype.  Checked before the target is touched; returns ``target``."""
    xp = backend.get_array_module(target)
    if xp is np and target.dtype == np.float32 and _cython.merging_kernels():
        tau, _, indices, counts = _layout(_words(message), int(target.size))
        if indices is None:
            _cython.add_dense_counts(counts, tau, target)
            return target
        if _cython.add_counts(indices, counts, tau, target) < 0:
            return target
        merged_parts(message, int(target.size))  # a bad entry, the target untouched: named there
        raise AssertionError("the kernel refused an entry merged_parts accepts")  # pragma: no cover
    tau, _, indices, counts = merged_parts(message, int(target.size))
    if indices is None:
        indices = np.flatnonzero(counts)  # only touched entries change: adding 0 would turn -0.0 into +0.0
        counts = counts[indices]
    values = counts.astype(target.dtype) * target.dtype.type(tau)
    target[xp.asarray(indices)] += xp.asarray(values)  # distinct indices; host -> device copies for CuPy
    return target
