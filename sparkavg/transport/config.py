"""Configuration of a :class:`~sparkavg.transport.endpoint.ReliableEndpoint`."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..configurable import Configurable, register
from .faults import FaultInjection
from .protocol import MAX_UDP_PAYLOAD, OVERHEAD_BYTES

__all__ = ["EndpointConfig"]

_MiB = 1 << 20


@register("transport")
@dataclass(frozen=True)
class EndpointConfig(Configurable):
    """Limits and timers of one reliable UDP endpoint.

    Every rank of a job must use the same configuration (ship it with the
    job; the keys are not shipped: the ranks agree them, :mod:`.keys`).

    Parameters
    ----------
    max_datagram_bytes : int, default 60000
        Bound on a whole datagram (44-byte header + chunk + 32-byte tag), in
        ``[512, 65507]``. DL4J uses 64 KB chunks; 60000 stays under the IPv4
        UDP limit of 65507 with headroom. Received datagrams above it are
        rejected as ``oversized``.
    max_message_bytes : int, default 8 MiB
        Largest payload ``send`` accepts; bounds the chunk count a receiver
        will believe. A 431k-parameter dense float32 update is 1.7 MB.
    retransmit_timeout : float, default 1.0
        Seconds before an unacked chunk is sent again (DL4J: 1 s). With
        ``adaptive_retransmit`` it is the initial and the largest timeout.
    adaptive_retransmit : bool, default True
        Estimate the timeout per peer from measured round trips (smoothed RTT
        + 4 deviations, Karn's rule, doubling on each repeat), clamped to
        ``[min_retransmit_timeout, retransmit_timeout]``.
    min_retransmit_timeout : float, default 0.05
        Floor of the adaptive timeout, seconds.
    stall_timeout : float, default 60.0
        A peer that acknowledges nothing new for this long while data to it is
        outstanding is stalled: ``send`` and ``flush`` raise
        :class:`~sparkavg.transport.errors.PeerStalledError` naming it.
        ``send`` also blocks at most this long for window space.
    send_window_bytes : int, default 4 MiB
        Unacked payload bytes allowed per peer; ``send`` blocks beyond it
        (one message larger than the window may still go when nothing else
        is outstanding).
    send_window_messages : int, default 256
        Unacked messages allowed per peer.
    recv_window_messages : int, default 1024
        A receiver accepts DATA only for sequence numbers below its lowest
        undelivered one plus this; must be >= ``send_window_messages``.
    max_reassembly_bytes : int, default 8 MiB
        Bytes of partially received messages held per peer; must be >=
        ``max(send_window_bytes, max_message_bytes)`` so a well-behaved
        peer never hits it.
    max_inbox_bytes : int, default 64 MiB
        Delivered but not yet received (by the application) payload bytes;
        beyond it new chunks are refused unacked, so senders slow down.
    socket_buffer_bytes : int, default 4 MiB
        Requested SO_RCVBUF / SO_SNDBUF (the kernel caps it at
        ``net.core.rmem_max`` / ``wmem_max``).
    faults : FaultInjection or None, default None
        Inject loss / duplication / reordering into outgoing datagrams.
    """

    max_datagram_bytes: int = 60000
    max_message_bytes: int = 8 * _MiB
    retransmit_timeout: float = 1.0
    adaptive_retransmit: bool = True
    min_retransmit_timeout: float = 0.05
    stall_timeout: float = 60.0
    send_window_bytes: int = 4 * _MiB
    send_window_messages: int = 256
    recv_window_messages: int = 1024
    max_reassembly_bytes: int = 8 * _MiB
    max_inbox_bytes: int = 64 * _MiB
    socket_buffer_bytes: int = 4 * _MiB
    faults: FaultInjection | None = None

    def __post_init__(self):
        def expect(ok: bool, what: str, value) -> None:
            if not ok:
                raise ValueError(f"Expect {what}, got {value}")

        # Types first: a fractional size or an infinite / NaN timeout would pass the range
        # checks below and only fail on the executors.
        for name in ("max_datagram_bytes", "max_message_bytes", "send_window_bytes", "send_window_messages",
                     "recv_window_messages", "max_reassembly_bytes", "max_inbox_bytes", "socket_buffer_bytes"):
            value = getattr(self, name)
            expect(isinstance(value, (int, np.integer)) and not isinstance(value, bool), f"{name} as an int",
                   f"{type(value).__name__} {value!r}")
        for name in ("retransmit_timeout", "min_retransmit_timeout", "stall_timeout"):
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
