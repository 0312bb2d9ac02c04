"""The entry-by-entry twin of :mod:`sparkavg.ops.merging` (the tests' oracle):
every message read one entry at a time into a dict of counts, the merged
message written word by word."""
from __future__ import annotations

import numpy as np

from ._checks import bitmap_length, bits_float

__all__ = ["merge_counts", "merge_messages", "decode_merged"]


def _entries(words, n):
    """``(tau bits, {index: count}, entries carried)`` of one message of any format."""
    words = [int(w) for w in words]
    flag = words[3]
    out = {}
    if flag == 0:
        for v in words[4:4 + words[0]]:
            out[abs(v) - 1] = out.get(abs(v) - 1, 0) + (1 if v > 0 else -1)
        return words[2], out, words[0]
    if flag == 1:
        assert len(words) == bitmap_length(n)
        sent = 0
        for k, w in enumerate(words[4:]):
            for b in range(16):
                if (w >> b) & 1 and 16 * k + b < n:
                    out[16 * k + b] = -1 if (w >> (b + 16)) & 1 else 1
                    sent += 1
        return words[2], out, sent
    assert flag == 2
    count, _, bits, _, layout, lo, hi = words[:7]
    width, dense = layout & 0xFF, layout >> 8
    sent = (lo & 0xFFFFFFFF) | ((hi & 0xFFFFFFFF) << 32)
    raw = np.asarray(words[7:], dtype="<i4").view(np.uint8)
    if dense:
        counts = raw[:n * width].view(f"<i{width}")
        out = {i: int(c) for i, c in enumerate(counts) if c}
    else:
        counts = raw[4 * count:4 * count + count * width].view(f"<i{width}")
        out = {words[7 + j]: int(counts[j]) for j in range(count)}
    return bits, out, sent


def merge_counts(messages, n):
    """``(tau bits, {index: count} without zeros, entries)`` of the sum of ``messages``."""
    total, bits, sent = {}, None, 0
    for m in messages:
        b, counts, s = _entries(m, n)
        assert bits is None or b == bits, "messages at different τ"
        bits, sent = b, sent + s
        for i, c in counts.items():
            total[i] = total.get(i, 0) + c
    return bits, {i: c for i, c in total.items() if c}, sent


def merge_messages(messages, n):
    """The merged message of ``messages`` (two or more, none empty), word by word."""
    bits, counts, sent = merge_counts(messages, n)
    top = max((abs(c) for c in counts.values()), default=0)
    width = 1 if top <= 127 else 2
    dense = len(counts) * (4 + width) > n * width
    order = sorted(counts)
    values = [counts.get(i, 0) for i in range(n)] if dense else [counts[i] for i in order]
    packed = np.asarray(values, dtype=f"<i{width}").tobytes()
    packed += bytes(-len(packed) % 4)
    header = [n if dense else len(order), n, bits, 2, width | (int(dense) << 8),
              int(np.uint32(sent & 0xFFFFFFFF).view(np.int32)), int(np.uint32(sent >> 32).view(np.int32))]
    return np.concatenate([np.asarray(header + ([] if dense else order), dtype=np.int32),
                           np.frombuffer(packed, dtype="<i4")])


def decode_merged(message, target):
    """``target[i] += float(c_i) * float(τ)`` for every nonzero count, one entry at a time."""
    bits, counts, _ = _entries(message, target.size)
    tau = target.dtype.type(bits_float(bits))
    for i, c in counts.items():
        target[i] = target[i] + target.dtype.type(c) * tau
    return target
