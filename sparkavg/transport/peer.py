"""Per-peer protocol state of a reliable endpoint: pure bookkeeping, no I/O.

Send side: numbered messages awaiting acks (the send window), per-chunk
transmission counts and times, and the retransmission timeout estimated
from round trips (RFC 6298: smoothed RTT + 4 deviations, Karn's rule).

Receive side: the cumulative sequence number (every message below it is
delivered), delivered numbers above it, partially reassembled messages, and
the acks owed. The caller (the endpoint) holds the lock.
"""
from __future__ import annotations

import enum

from .limits import _Limits
from .protocol import ACK_ENTRY, RejectReason

__all__ = ["OutMessage", "PeerState", "Receipt"]


class Receipt(enum.Enum):
    """What happened to an accepted DATA chunk (rejections are :class:`RejectReason`)."""

    #: Completed a message, which is returned.
    DELIVERED = "delivered"
    #: Stored for reassembly.
    STORED = "stored"
    #: A chunk already held (duplicate or retransmission).
    DUPLICATE = "duplicate"


class OutMessage:
    """A sent message until every chunk is acked."""

    __slots__ = ("seq", "size", "datagrams", "acked", "n_acked", "sent_at", "sends")

    def __init__(self, seq: int, size: int, datagrams: list):
        self.seq = seq
        self.size = size
        self.datagrams = datagrams
        self.acked = [False] * len(datagrams)
        self.n_acked = 0
        self.sent_at = [0.0] * len(datagrams)
        self.sends = [0] * len(datagrams)


class _Partial:
    """A message being reassembled."""

    __slots__ = ("count", "chunks", "nbytes")

    def __init__(self, count: int):
        self.count = count
        self.chunks: dict[int, bytes] = {}
        self.nbytes = 0


class PeerState:
    """Send and receive state for one remote rank.

    Parameters
    ----------
    rank : int
    address : (str, int)
    limits : _Limits
        The endpoint's sizes and timers (:mod:`.limits`).
    """

    __slots__ = (
        # set by the endpoint
        "rank", "address", "limits",
        # send side
        "next_seq", "unacked", "unacked_bytes", "last_progress", "srtt", "rttvar", "rto",
        # receive side
        "cum", "delivered", "partial", "partial_bytes", "ack_entries",
    )

    def __init__(self, rank: int, address: tuple, limits: _Limits):
        self.rank = rank
        self.address = address
        self.limits = limits
        self.next_seq = 0
        self.unacked: dict[int, OutMessage] = {}   # ascending seq (insertion order)
        self.unacked_bytes = 0
        self.last_progress = 0.0
        self.srtt = None
        self.rttvar = 0.0
        self.rto = limits.retransmit_timeout
        self.cum = 0
        self.delivered: set[int] = set()
        self.partial: dict[int, _Partial] = {}
        self.partial_bytes = 0
        self.ack_entries: list | None = None      # None: no ack owed

    # ------------------------------------------------------------------ send side
    def has_room(self, nbytes: int) -> bool:
        """Whether a message of ``nbytes`` fits the send window (always when it is empty)."""
        cfg = self.limits
        return not self.unacked or (self.unacked_bytes + nbytes <= cfg.send_window_bytes
                                    and len(self.unacked) < cfg.send_window_messages)

    def stalled(self, now: float) -> bool:
        """Data is outstanding and nothing new was acked for ``stall_timeout``."""
        return bool(self.unacked) and now - self.last_progress > self.limits.stall_timeout

    def add_sent(self, msg: OutMessage, now: float) -> None:
        """Record a message whose chunks were just transmitted once each."""
        if not self.unacked:
            self.last_progress = now  # the stall clock starts with the first outstanding message
        self.unacked[msg.seq] = msg
        self.unacked_bytes += msg.size
        for i in range(len(msg.datagrams)):
            msg.sent_at[i] = now
            msg.sends[i] = 1

    def retransmit_delay(self, sends: int) -> float:
        """Timeout after the ``sends``-th transmission of a chunk (doubling, capped)."""
        return min(self.limits.retransmit_timeout, self.rto * (2 ** min(sends - 1, 16)))

    def on_ack(self, cum: int, payload, now: float) -> bool | None:
        """Apply an ACK; return whether it acknowledged anything new, ``None`` if malformed."""
        if cum > self.next_seq:
            return None  # acks something never sent
        progressed = False
        unacked = self.unacked
        for seq, index in ACK_ENTRY.iter_unpack(payload):
            msg = unacked.get(seq)
            if msg is None or index >= len(msg.acked) or msg.acked[index]:
                continue
            msg.acked[index] = True
            msg.n_acked += 1
            progressed = True
            if msg.sends[index] == 1:  # Karn: only unambiguous samples
                self._sample_rtt(now - msg.sent_at[index])
            if msg.n_acked == len(msg.acked):
                del unacked[seq]
                self.unacked_bytes -= msg.size
        while unacked:
            seq = next(iter(unacked))
            if seq >= cum:
                break
            self.unacked_bytes -= unacked.pop(seq).size
            progressed = True
        if progressed:
            self.last_progress = now
        return progressed

    def _sample_rtt(self, sample: float) -> None:
        cfg = self.limits
        if not cfg.adaptive_retransmit:
            return
        if self.srtt is None:
            self.srtt, self.rttvar = sample, sample / 2
        else:
            self.rttvar = 0.75 * self.rttvar + 0.25 * abs(self.srtt - sample)
            self.srtt = 0.875 * self.srtt + 0.125 * sample
        self.rto = min(cfg.retransmit_timeout, max(cfg.min_retransmit_timeout, self.srtt + 4 * self.rttvar))

    # ------------------------------------------------------------------ receive side
    def on_data(self, seq: int, index: int, count: int, payload: memoryview, inbox_full: bool):
        """Take one authentic DATA chunk addressed to us.

        Returns
        -------
        outcome : Receipt or RejectReason
            Every :class:`Receipt` and ``RejectReason.REPLAY`` must be acked
            (``owe_ack``); other rejections must not (the sender retries).
        message : bytes or None
            The completed message for ``Receipt.DELIVERED``.
        """
        cfg = self.limits
        if count > cfg.max_chunks or payload.nbytes > cfg.chunk_bytes:
            return RejectReason.MALFORMED, None
        if seq < self.cum or seq in self.delivered:
            return RejectReason.REPLAY, None
        if seq >= self.cum + cfg.recv_window_messages:
            return RejectReason.OUT_OF_WINDOW, None
        part = self.partial.get(seq)
        if part is not None:
            if part.count != count:
                return RejectReason.MALFORMED, None
            if index in part.chunks:
                return Receipt.DUPLICATE, None
        n = payload.nbytes
        if inbox_full or self.partial_bytes + n > cfg.max_reassembly_bytes:
            return RejectReason.BUFFER_FULL, None
        if count == 1:
            message = bytes(payload)
        else:
            if part is None:
                part = self.partial[seq] = _Partial(count)
            part.chunks[index] = bytes(payload)
            part.nbytes += n
            self.partial_bytes += n
            if len(part.chunks) < count:
                return Receipt.STORED, None
            del self.partial[seq]
            self.partial_bytes -= part.nbytes
            message = b"".join([part.chunks[i] for i in range(count)])
        if seq == self.cum:
            self.cum += 1
            while self.cum in self.delivered:
                self.delivered.remove(self.cum)
                self.cum += 1
        else:
            self.delivered.add(seq)
        return Receipt.DELIVERED, message

    def owe_ack(self, seq: int, index: int) -> int:
        """Remember to ack ``(seq, index)``; return how many entries are owed."""
        if self.ack_entries is None:
            self.ack_entries = []
        # Selective even below cum: the sender samples round trips from entries only.
        self.ack_entries.append((seq, index))
        return len(self.ack_entries)

    def take_ack_entries(self) -> list:
        """The owed entries, clearing them."""
        entries, self.ack_entries = self.ack_entries or [], None
        return entries
