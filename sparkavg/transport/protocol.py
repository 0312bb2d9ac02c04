"""Wire format of one datagram: fixed header, payload, HMAC-SHA256 tag.

Layout (network byte order, ``HEADER`` is a :class:`struct.Struct`)::

    offset size field
    0      4    magic         b"SAVG"
    4      1    version       PROTOCOL_VERSION (1)
    5      1    type          MessageType (DATA=1, ACK=2)
    6      2    flags         reserved, must be 0
    8      8    job_id        session id; must match the receiver's
    16     4    src           sender rank
    20     4    dst           receiver rank
    24     8    seq           DATA: message sequence number (per src->dst pair)
                              ACK: cumulative ack, every seq below it delivered
    32     4    chunk_index   DATA: index of this chunk; ACK: 0
    36     4    chunk_count   DATA: chunks in the message (>= 1); ACK: 0
    40     4    payload_len   bytes of payload that follow
    44     n    payload       DATA: chunk bytes; ACK: ACK_ENTRY records
    44+n   32   tag           HMAC-SHA256(key, header + payload)

``key`` is one key for every peer, or -- as the executors use it -- the key
of the pair (sender, receiver) that the two ranks agreed
(:mod:`~sparkavg.transport.keys`): the receiver picks it by ``src``.

An ACK payload is a sequence of ``ACK_ENTRY`` records ``(seq u64, chunk
u32)``: "this chunk of this message has arrived" (selective ack).

The receiver checks only the length before the tag (and, with a key per
peer, reads ``src`` to pick the key: a forged ``src`` selects a key its
sender does not hold, and ``src`` is under the tag); the tag is verified
with :func:`hmac.compare_digest` before any other header field is read. Nothing is ever
unpickled: payloads are opaque bytes.
"""
from __future__ import annotations

import enum
import hashlib
import hmac
import struct
from typing import NamedTuple

__all__ = [
    "ACK_ENTRY",
    "HEADER",
    "HEADER_BYTES",
    "MAGIC",
    "MAX_UDP_PAYLOAD",
    "MIN_KEY_BYTES",
    "OVERHEAD_BYTES",
    "PROTOCOL_VERSION",
    "TAG_BYTES",
    "DatagramCodec",
    "DatagramRejected",
    "KeyUnknown",
    "Header",
    "MessageType",
    "RejectReason",
    "check_key",
]

MAGIC = b"SAVG"
PROTOCOL_VERSION = 1
HEADER = struct.Struct("!4sBBHQIIQIII")
HEADER_BYTES = HEADER.size
TAG_BYTES = 32
OVERHEAD_BYTES = HEADER_BYTES + TAG_BYTES
ACK_ENTRY = struct.Struct("!QI")
MIN_KEY_BYTES = 16
#: Largest UDP payload over IPv4 (65535 - 8 UDP - 20 IP header bytes).
MAX_UDP_PAYLOAD = 65507

_U32 = 1 << 32
_U64 = 1 << 64


class MessageType(enum.IntEnum):
    """Datagram types."""

    DATA = 1
    ACK = 2


class RejectReason(str, enum.Enum):
    """Why a received datagram was dropped; each has a ``rejected_<value>`` counter."""

    #: Shorter than header + tag.
    TRUNCATED = "truncated"
    #: Longer than ``max_datagram_bytes``.
    OVERSIZED = "oversized"
    #: HMAC tag does not verify (forged, corrupted, other key, cut short).
    BAD_MAC = "bad_mac"
    #: Authentic but inconsistent (magic, version, type, flags, lengths, chunk fields).
    MALFORMED = "malformed"
    #: Authentic but for another job / session id.
    WRONG_JOB = "wrong_job"
    #: Source rank is not a configured peer.
    UNKNOWN_PEER = "unknown_peer"
    #: Destination rank is not this endpoint.
    MISROUTED = "misrouted"
    #: DATA of a message already delivered (late retransmission, duplicate or replay).
    REPLAY = "replay"
    #: DATA too far ahead of the receive window.
    OUT_OF_WINDOW = "out_of_window"
    #: Reassembly or inbox buffer full; the sender will retransmit.
    BUFFER_FULL = "buffer_full"


class DatagramRejected(Exception):
    """Internal signal that a datagram was dropped; ``reason`` is a :class:`RejectReason`."""

    def __init__(self, reason: RejectReason):
        super().__init__(reason.value)
        self.reason = reason

    def __reduce__(self):
        return (type(self), (self.reason,))


class KeyUnknown(DatagramRejected):
    """Internal signal: a datagram from a rank whose key is not known (yet);
    it cannot be authenticated now (the endpoint may hold it until the key comes)."""

    def __init__(self, src: int):
        super().__init__(RejectReason.UNKNOWN_PEER)
        self.src = src

    def __reduce__(self):
        return (type(self), (self.src,))


class Header(NamedTuple):
    """Decoded header fields (``payload_len`` is implied by the payload)."""

    type: MessageType
    job_id: int
    src: int
    dst: int
    seq: int
    chunk_index: int
    chunk_count: int


def check_key(key) -> bytes:
    """Return ``key`` as bytes after checking it is long enough.

    Raises
    ------
    TypeError
        If ``key`` is not bytes-like.
    ValueError
        If it is shorter than ``MIN_KEY_BYTES`` (16).
    """
    if not isinstance(key, (bytes, bytearray, memoryview)):
        raise TypeError(f"Expect the job key as bytes (secrets.token_bytes(32)), got {type(key).__name__}")
    key = bytes(key)
    if len(key) < MIN_KEY_BYTES:
        raise ValueError(f"Expect a job key of at least {MIN_KEY_BYTES} bytes, got {len(key)}")
    return key


_SRC = struct.Struct("!I")
_SRC_OFFSET = 16


class DatagramCodec:
    """Encode and authenticate datagrams of one job: one key for every
    peer, or a key per peer rank.

    Parameters
    ----------
    key : bytes or None
        One secret for every peer, at least 16 bytes
        (``secrets.token_bytes(32)``); or None: a key per peer, given by
        :meth:`set_keys` (the pair's key, :mod:`~sparkavg.transport.keys`).
    job_id : int
        Session id in ``[0, 2**64)``; datagrams with another id are rejected.
    max_datagram_bytes : int
        Upper bound of a whole datagram (header + payload + tag), in
        ``[512, 65507]``.
    """

    __slots__ = ("job_id", "max_datagram_bytes", "max_payload_bytes", "_mac", "_macs")

    def __init__(self, key, job_id: int, max_datagram_bytes: int):
        if not 0 <= int(job_id) < _U64:
            raise ValueError(f"Expect job_id in [0, 2**64), got {job_id}")
        if not 512 <= int(max_datagram_bytes) <= MAX_UDP_PAYLOAD:
            raise ValueError(f"Expect max_datagram_bytes in [512, {MAX_UDP_PAYLOAD}], got {max_datagram_bytes}")
        self.job_id = int(job_id)
        self.max_datagram_bytes = int(max_datagram_bytes)
        self.max_payload_bytes = self.max_datagram_bytes - OVERHEAD_BYTES
        # Keyed once; .copy() per datagram skips the key schedule.
        self._mac = None if key is None else hmac.new(check_key(key), digestmod=hashlib.sha256)
        self._macs: dict = {}  # per-peer keys: rank -> keyed HMAC (replaced whole by set_keys)

    @property
    def per_peer(self) -> bool:
        """Whether each peer has its own key (the codec was made with ``key=None``)."""
        return self._mac is None

    def set_keys(self, keys) -> None:
        """Set the per-peer keys ``{rank: key}`` (replacing the earlier ones).

        Raises
        ------
        ValueError
            If the codec has one key for every peer, or a key is too short.
        """
        if self._mac is not None:
            raise ValueError("Expect per-peer keys only for a codec made without a job key (key=None), "
                             "got keys for a codec with one key for every peer")
        macs = {}
        for rank, key in dict(keys).items():
            try:
                macs[int(rank)] = hmac.new(check_key(key), digestmod=hashlib.sha256)
            except (TypeError, ValueError) as exc:
                raise type(exc)(f"peer rank {rank}: {exc}") from None
        self._macs = macs  # one assignment: the I/O thread sees the old table or the new one

    def has_key(self, rank: int) -> bool:
        """Whether datagrams from and to ``rank`` can be authenticated."""
        return self._mac is not None or rank in self._macs

    def _keyed(self, peer: int):
        mac = self._mac if self._mac is not None else self._macs.get(peer)
        if mac is None:
            raise KeyUnknown(peer)
        return mac.copy()

    def encode(self, type_: MessageType, src: int, dst: int, seq: int,
               chunk_index: int, chunk_count: int, payload=b"") -> bytes:
        """Return one authenticated datagram.

        Parameters
        ----------
        type_ : MessageType
        src, dst : int
            Ranks in ``[0, 2**32)``.
        seq : int
            In ``[0, 2**64)``.
        chunk_index, chunk_count : int
            In ``[0, 2**32)``.
        payload : bytes-like
            At most ``max_payload_bytes`` bytes.

        Raises
        ------
        KeyUnknown
            With a key per peer, when ``dst`` has none.
        """
        n = len(payload)
        if n > self.max_payload_bytes:
            raise ValueError(f"Expect a datagram payload of at most {self.max_payload_bytes} bytes, got {n}")
        header = HEADER.pack(MAGIC, PROTOCOL_VERSION, int(type_), 0, self.job_id, src, dst,
                             seq, chunk_index, chunk_count, n)
        mac = self._keyed(dst)
        mac.update(header)
        mac.update(payload)
        return b"".join((header, payload, mac.digest()))

    def decode(self, data) -> tuple[Header, memoryview]:
        """Authenticate and parse one received datagram.

        Parameters
        ----------
        data : bytes-like
            The datagram as received.

        Returns
        -------
        header : Header
        payload : memoryview
            A view into ``data``.

        Raises
        ------
        DatagramRejected
            With the reason; nothing beyond the length (and, with a key per
            peer, ``src``) is read before the tag verifies.
        KeyUnknown
            (A ``DatagramRejected``) with a key per peer, when ``src`` has
            none (yet).
        """
        view = memoryview(data)
        n = view.nbytes
        if n < OVERHEAD_BYTES:
            raise DatagramRejected(RejectReason.TRUNCATED)
        if n > self.max_datagram_bytes:
            raise DatagramRejected(RejectReason.OVERSIZED)
        body = view[: n - TAG_BYTES]
        mac = self._keyed(_SRC.unpack_from(body, _SRC_OFFSET)[0] if self._mac is None else 0)
        mac.update(body)
        if not hmac.compare_digest(mac.digest(), view[n - TAG_BYTES:]):
            raise DatagramRejected(RejectReason.BAD_MAC)
        (magic, version, type_, flags, job_id, src, dst, seq, chunk_index, chunk_count,
         payload_len) = HEADER.unpack_from(body)
        if (magic != MAGIC or version != PROTOCOL_VERSION or flags != 0
                or payload_len != n - OVERHEAD_BYTES):
            raise DatagramRejected(RejectReason.MALFORMED)
        if type_ == MessageType.DATA:
            if not chunk_index < chunk_count:
                raise DatagramRejected(RejectReason.MALFORMED)
        elif type_ == MessageType.ACK:
            if chunk_index or chunk_count or payload_len % ACK_ENTRY.size:
                raise DatagramRejected(RejectReason.MALFORMED)
        else:
            raise DatagramRejected(RejectReason.MALFORMED)
        if job_id != self.job_id:
            raise DatagramRejected(RejectReason.WRONG_JOB)
        header = Header(MessageType(type_), job_id, src, dst, seq, chunk_index, chunk_count)
        return header, body[HEADER_BYTES:]
