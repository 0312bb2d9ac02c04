"""The limits and timers of a reliable endpoint: the library's, not the user's.

What a cluster operator sets -- the UDP port and the network mask -- is on
:class:`~sparkavg.spark.GradientSharing`; every other size and timer of the
transport is fixed here, as module constants.  Every rank of a job runs with
the same values.

The transport's own tests build endpoints with smaller windows or shorter
timers through ``ReliableEndpoint(..., limits={name: value})``; the Spark
executors only through the test hooks (:mod:`sparkavg.spark.executor.hooks`:
stall and retransmit timeouts, simulated loss).  No master, configuration
or saved file carries them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Mapping, Optional

import numpy as np

from .faults import FaultInjection
from .protocol import MAX_UDP_PAYLOAD, OVERHEAD_BYTES

__all__ = ["MAX_DATAGRAM_BYTES", "MAX_MESSAGE_BYTES", "RETRANSMIT_TIMEOUT", "ADAPTIVE_RETRANSMIT",
           "MIN_RETRANSMIT_TIMEOUT", "STALL_TIMEOUT", "LEAVE_GRACE", "SEND_WINDOW_BYTES", "SEND_WINDOW_MESSAGES",
           "RECV_WINDOW_MESSAGES", "MAX_REASSEMBLY_BYTES", "MAX_INBOX_BYTES", "SOCKET_BUFFER_BYTES",
           "COLLECTIVE_ALIVE_FRACTION", "RENDEZVOUS_FRAME_BYTES",
           "RENDEZVOUS_ANSWER_GRACE", "endpoint_limits"]

_MiB = 1 << 20

#: A rank of the TCP all-reduce (:mod:`.reduction`) that waits on its other partners sends a partner an ALIVE
#: frame after this fraction of the stall timeout without a frame: only the link to a rank that stopped
#: stalls, so the rank that notices names it to the others.
COLLECTIVE_ALIVE_FRACTION = 0.25

#: Bound on a whole datagram (44-byte header + chunk + 32-byte tag); received datagrams above it are
#: rejected as ``oversized``.  DL4J uses 64 KB chunks; 60000 stays under the IPv4 UDP limit of 65507.
MAX_DATAGRAM_BYTES = 60000
#: Largest payload ``send`` accepts; bounds the chunk count a receiver will believe (a 431k-parameter
#: dense float32 update is 1.7 MB).
MAX_MESSAGE_BYTES = 8 * _MiB
#: Seconds before an unacked chunk is sent again (DL4J: 1 s); the adaptive timeout's start and ceiling.
RETRANSMIT_TIMEOUT = 1.0
#: The timeout per peer from measured round trips (smoothed RTT + 4 deviations, Karn's rule, doubling on
#: each repeat), clamped to ``[MIN_RETRANSMIT_TIMEOUT, RETRANSMIT_TIMEOUT]``.
ADAPTIVE_RETRANSMIT = True
#: Floor of the adaptive timeout, seconds.
MIN_RETRANSMIT_TIMEOUT = 0.05
#: A peer that acknowledges nothing new for this many seconds while data to it is outstanding is
#: stalled (lost): ``send`` and ``flush`` raise :class:`~sparkavg.transport.errors.PeerStalledError`
#: naming it; ``send`` also blocks at most this long for window space.
STALL_TIMEOUT = 60.0
#: Seconds a rank that has every neighbour's DONE keeps retransmitting its own until acked before it closes
#: (at least; four retransmit timeouts when longer).  Paid in full only when a neighbour left before acking it.
LEAVE_GRACE = 1.0
#: Unacked payload bytes allowed per peer; ``send`` blocks beyond it (one message larger than the window
#: may still go when nothing else is outstanding).
SEND_WINDOW_BYTES = 4 * _MiB
#: Unacked messages allowed per peer.
SEND_WINDOW_MESSAGES = 256
#: A receiver accepts DATA only for sequence numbers below its lowest undelivered one plus this.
RECV_WINDOW_MESSAGES = 1024
#: Bytes of partially received messages held per peer (>= the send window and the largest message,
#: so a well-behaved peer never hits it).
MAX_REASSEMBLY_BYTES = 8 * _MiB
#: Delivered but not yet received payload bytes; beyond it new chunks are refused unacked (senders slow down).
MAX_INBOX_BYTES = 64 * _MiB
#: Requested SO_RCVBUF / SO_SNDBUF (the kernel caps it at ``net.core.rmem_max`` / ``wmem_max``).
SOCKET_BUFFER_BYTES = 4 * _MiB

#: Largest registration at the driver's rendezvous (:mod:`.rendezvous`), JSON bytes: an entry of a
#: collective group is ~150; an answer carries the world's entries, at most this many bytes each.
RENDEZVOUS_FRAME_BYTES = 4096
#: Seconds a registered rank waits for the rendezvous's answer beyond the stall timeout (the rendezvous
#: answers, or names the missing ranks, within the stall timeout of the first registration).
RENDEZVOUS_ANSWER_GRACE = 1.0

_INTS = ("max_datagram_bytes", "max_message_bytes", "send_window_bytes", "send_window_messages",
         "recv_window_messages", "max_reassembly_bytes", "max_inbox_bytes", "socket_buffer_bytes")
_SECONDS = ("retransmit_timeout", "min_retransmit_timeout", "stall_timeout")


@dataclass(frozen=True)
class _Limits:
    """The values one endpoint runs with: the constants above, or a test's
    overrides (``faults``: datagram loss the tests inject)."""

    max_datagram_bytes: int = MAX_DATAGRAM_BYTES
    max_message_bytes: int = MAX_MESSAGE_BYTES
    retransmit_timeout: float = RETRANSMIT_TIMEOUT
    adaptive_retransmit: bool = ADAPTIVE_RETRANSMIT
    min_retransmit_timeout: float = MIN_RETRANSMIT_TIMEOUT
    stall_timeout: float = STALL_TIMEOUT
    send_window_bytes: int = SEND_WINDOW_BYTES
    send_window_messages: int = SEND_WINDOW_MESSAGES
    recv_window_messages: int = RECV_WINDOW_MESSAGES
    max_reassembly_bytes: int = MAX_REASSEMBLY_BYTES
    max_inbox_bytes: int = MAX_INBOX_BYTES
    socket_buffer_bytes: int = SOCKET_BUFFER_BYTES
    faults: Optional[FaultInjection] = None

    def __post_init__(self):
        def expect(ok: bool, what: str, value) -> None:
            if not ok:
                raise ValueError(f"Expect {what}, got {value}")

        # Types first: a fractional size or an infinite / NaN timeout would pass the range checks below.
        for name in _INTS:
            value = getattr(self, name)
            expect(isinstance(value, (int, np.integer)) and not isinstance(value, bool), f"{name} as an int",
                   f"{type(value).__name__} {value!r}")
        for name in _SECONDS:
            value = getattr(self, name)
            expect(isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
                   and math.isfinite(value), f"{name} as a finite number of seconds",
                   f"{type(value).__name__} {value!r}")
        expect(512 <= self.max_datagram_bytes <= MAX_UDP_PAYLOAD,
               f"max_datagram_bytes in [512, {MAX_UDP_PAYLOAD}]", self.max_datagram_bytes)
        expect(self.max_message_bytes >= 0, "max_message_bytes >= 0", self.max_message_bytes)
        expect(0.0 < self.retransmit_timeout <= 60.0, "retransmit_timeout in (0, 60] seconds",
               self.retransmit_timeout)
        expect(0.0 < self.min_retransmit_timeout <= self.retransmit_timeout,
               f"min_retransmit_timeout in (0, retransmit_timeout={self.retransmit_timeout}]",
               self.min_retransmit_timeout)
        expect(self.stall_timeout > 0.0, "stall_timeout > 0 seconds", self.stall_timeout)
        expect(self.send_window_bytes >= 1, "send_window_bytes >= 1", self.send_window_bytes)
        expect(self.send_window_messages >= 1, "send_window_messages >= 1", self.send_window_messages)
        expect(self.recv_window_messages >= self.send_window_messages,
               f"recv_window_messages >= send_window_messages={self.send_window_messages} "
               "(else a full send window is refused as out of window)", self.recv_window_messages)
        need = max(self.send_window_bytes, self.max_message_bytes)
        expect(self.max_reassembly_bytes >= need,
               f"max_reassembly_bytes >= max(send_window_bytes, max_message_bytes) = {need} "
               "(else a full send window cannot be reassembled)", self.max_reassembly_bytes)
        expect(self.max_inbox_bytes >= 1, "max_inbox_bytes >= 1", self.max_inbox_bytes)
        expect(self.socket_buffer_bytes >= 0, "socket_buffer_bytes >= 0", self.socket_buffer_bytes)
        expect(self.faults is None or isinstance(self.faults, FaultInjection),
               "faults to be a FaultInjection or None", type(self.faults).__name__)

    @property
    def chunk_bytes(self) -> int:
        """Payload bytes per DATA datagram."""
        return self.max_datagram_bytes - OVERHEAD_BYTES

    @property
    def max_chunks(self) -> int:
        """Largest chunk count of a valid message."""
        return max(1, math.ceil(self.max_message_bytes / self.chunk_bytes))


_NAMES = frozenset(f.name for f in fields(_Limits))


def endpoint_limits(overrides: Optional[Mapping] = None) -> _Limits:
    """The limits an endpoint runs with: the module's constants, with
    ``overrides`` (``{name: value}``, the tests' route) in their place.

    Raises
    ------
    ValueError
        An override of no limit (naming the known ones), or a value out of
        its range (naming what was expected).
    """
    overrides = dict(overrides or {})
    unknown = sorted(set(overrides) - _NAMES)
    if unknown:
        raise ValueError(f"Expect transport limits among {sorted(_NAMES)}, got {unknown}")
    return _Limits(**overrides)
