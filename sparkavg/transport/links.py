"""Authenticated TCP links between the ranks of a collective group.

One connection per pair of partners (:func:`~.reduction.partners`), made
once per stage (epoch) and reused by every round; the higher rank dials the
lower one.

Keys.  The pair's X25519 key of :mod:`~sparkavg.transport.keys` (bound to the
stage attempt, both ranks and both public keys) is expanded once more for TCP,
so that no TCP key equals a datagram key::

    K_tcp = HKDF-SHA256(IKM = K_pair, salt = "sparkavg-tcp-v1" || u64(context), info = "pair")

Handshake (``HELLO``: magic ``b"SAVT"``, version, kind, from rank, to rank,
context, a fresh 16-byte nonce, then an HMAC-SHA256 tag under ``K_tcp``)::

    dialer   -> acceptor: HELLO(dial,   nonce_d), tag over the hello
    acceptor -> dialer:   HELLO(accept, nonce_a), tag over the hello and nonce_d

and each direction ``src -> dst`` of the connection gets its own key::

    K_dir = HKDF-SHA256(IKM = K_tcp, salt = "sparkavg-tcp-v1",
                        info = "dir" || u32(src) || u32(dst) || nonce_d || nonce_a)

A hello that does not verify is logged and its connection dropped; the real
peer may still come.

Frames (network byte order)::

    offset size field
    0      1    kind      ROUND=1, DATA=2, ABORT=3, ALIVE=4
    1      1    phase     DATA: 1 reduce-scatter, 2 all-gather; else 0
    2      2    reserved  0
    4      4    round     the round's number
    8      8    offset    DATA: index of the first element in the logical vector
    16     4    length    payload bytes
    20     n    payload
    20+n   32   tag       HMAC-SHA256(K_dir, u64(seq) || header || payload)

``seq`` counts the frames of one direction from 0 and is never sent: a frame
replayed, reordered, dropped or altered fails its tag.  The receiver checks
``length`` against the frame it expects before reading the payload (bounded
memory), then the tag, then the other fields; any failure is a
:class:`~sparkavg.transport.errors.FrameRejectedError` naming the peer.  An
ABORT frame carries a JSON notice (which rank was lost and why) that a rank
sends its other peers when a round fails, before it shuts its connections.
An ALIVE frame (no payload) says the sender is in the round but waits on
its other partners; the receiver skips it.  Nothing is ever unpickled.
"""
from __future__ import annotations

import enum
import hashlib
import hmac
import json
import logging
import os
import socket
import struct
import threading
import time
from collections.abc import Mapping

from .errors import FrameRejectedError, PeerLostError, TransportError
from .keys import KeyAgreement, hkdf_sha256

__all__ = ["HEADER", "HELLO", "SALT", "TAG_BYTES", "Kind", "Link", "LinkClosed", "accept_hello", "dial",
           "tcp_pair_keys"]

logger = logging.getLogger(__name__)

SALT = b"sparkavg-tcp-v1"
MAGIC = b"SAVT"
VERSION = 1
#: magic, version, kind (1 dial, 2 accept), reserved, from rank, to rank, context, nonce
HELLO = struct.Struct("!4sBBHIIQ16s")
#: kind, phase, reserved, round, offset, length
HEADER = struct.Struct("!BBHIQI")
TAG_BYTES = 32
_SEQ = struct.Struct("!Q")
_U32 = struct.Struct("!I")
_HELLO_DIAL, _HELLO_ACCEPT = 1, 2
#: Largest ABORT notice read.
MAX_NOTICE = 4096
#: How long a failing rank waits for a link's sender to finish its frame before
#: shutting the link without a notice.
NOTICE_WAIT = 0.2


class Kind(enum.IntEnum):
    """What a frame is."""

    ROUND = 1  # a round's announcement: weight and layout
    DATA = 2  # a piece of a vector
    ABORT = 3  # a failure notice, the last frame of a link
    ALIVE = 4  # the sender waits on its other partners: the link has not stalled


class LinkClosed(TransportError):
    """This rank closed or aborted the link: its threads stop quietly."""


def tcp_pair_keys(agreement: KeyAgreement, publics: Mapping[int, bytes]) -> dict:
    """``{peer rank: K_tcp}`` (the module docstring) for every rank of
    ``publics`` but the agreement's own."""
    salt = SALT + struct.pack("!Q", agreement.context)
    return {r: hkdf_sha256(k, salt, b"pair") for r, k in agreement.pair_keys(publics).items()}


def _direction_key(key: bytes, src: int, dst: int, nonce_d: bytes, nonce_a: bytes) -> bytes:
    return hkdf_sha256(key, SALT, b"dir" + _U32.pack(src) + _U32.pack(dst) + nonce_d + nonce_a)


def _hello(kind: int, src: int, dst: int, context: int, nonce: bytes, key: bytes, extra: bytes = b"") -> bytes:
    body = HELLO.pack(MAGIC, VERSION, kind, 0, src, dst, context, nonce)
    return body + hmac.new(key, body + extra, hashlib.sha256).digest()


def _read_exact(sock, n: int) -> bytes:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            raise ConnectionResetError("end of stream")
        got += k
    return bytes(buf)


def dial(rank: int, peer: int, address, key: bytes, context: int, deadline: float, *,
         stall_timeout: float) -> "Link":
    """Connect to ``peer`` at ``address`` (retrying while it refuses, until
    ``deadline`` on :func:`time.monotonic`) and run the dialer's handshake.

    Raises
    ------
    PeerLostError
        ``reason="connect"``: no connection by the deadline, or the peer
        closed it during the handshake (another stage attempt's keys).
    FrameRejectedError
        ``reason="handshake"``: the peer's answer did not verify.
    """
    address = (str(address[0]), int(address[1]))
    last = None
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise PeerLostError(f"rank {rank}: cannot connect to rank {peer} at {address[0]}:{address[1]} "
                                f"({last or 'timed out'})", peer, address, "connect")
        try:
            sock = socket.create_connection(address, timeout=left)
            break
        except (ConnectionRefusedError, socket.timeout, OSError) as exc:
            last = exc
            time.sleep(min(0.05, max(0.0, left)))  # the peer may not listen yet
    try:
        sock.settimeout(max(0.001, deadline - time.monotonic()))
        nonce_d = os.urandom(16)
        sock.sendall(_hello(_HELLO_DIAL, rank, peer, context, nonce_d, key))
        answer = _read_exact(sock, HELLO.size + TAG_BYTES)
    except (OSError, socket.timeout) as exc:
        sock.close()
        raise PeerLostError(f"rank {rank}: rank {peer} at {address[0]}:{address[1]} closed the connection during "
                            f"the handshake ({exc}); is it in the same stage attempt?", peer, address,
                            "connect") from None
    body, tag = answer[:HELLO.size], answer[HELLO.size:]
    magic, version, kind, _, src, dst, ctx, nonce_a = HELLO.unpack(body)
    expect = hmac.new(key, body + nonce_d, hashlib.sha256).digest()
    if not hmac.compare_digest(tag, expect) or (magic, version, kind, src, dst, ctx) != (
            MAGIC, VERSION, _HELLO_ACCEPT, peer, rank, context):
        sock.close()
        raise FrameRejectedError(f"rank {rank}: the handshake answer from {address[0]}:{address[1]} does not "
                                 f"verify as rank {peer}'s (expected rank {peer}, context {context:#x}, "
                                 f"got rank {src}, context {ctx:#x})", peer, address, "handshake")
    return Link(sock, rank, peer, address, _direction_key(key, rank, peer, nonce_d, nonce_a),
                _direction_key(key, peer, rank, nonce_d, nonce_a), stall_timeout)


def accept_hello(sock, rank: int, keys: Mapping[int, bytes], context: int, expected, *,
                 stall_timeout: float, address_of: Mapping[int, tuple]) -> "Link":
    """The acceptor's handshake on an accepted ``sock`` (its timeout set by
    the caller): the dialer must be a rank of ``expected`` and its hello
    must verify under that rank's key.

    Raises
    ------
    FrameRejectedError
        ``reason="handshake"``, naming what came (the caller logs it and
        drops the connection).
    OSError
        The connection broke during the handshake.
    """
    body_tag = _read_exact(sock, HELLO.size + TAG_BYTES)
    body, tag = body_tag[:HELLO.size], body_tag[HELLO.size:]
    magic, version, kind, _, src, dst, ctx, nonce_d = HELLO.unpack(body)
    where = sock.getpeername()
    if (magic, version, kind, dst, ctx) != (MAGIC, VERSION, _HELLO_DIAL, rank, context) or src not in expected:
        raise FrameRejectedError(f"rank {rank}: a hello from {where[0]}:{where[1]} is not one of this stage's "
                                 f"(expected a dial to rank {rank} from one of ranks {sorted(expected)} with context "
                                 f"{context:#x}, got rank {src} -> {dst}, context {ctx:#x}, version {version})",
                                 src, where, "handshake")
    key = keys[src]
    if not hmac.compare_digest(tag, hmac.new(key, body, hashlib.sha256).digest()):
        raise FrameRejectedError(f"rank {rank}: the hello from {where[0]}:{where[1]} claiming rank {src} does not "
                                 f"verify under rank {src}'s key", src, where, "handshake")
    nonce_a = os.urandom(16)
    sock.sendall(_hello(_HELLO_ACCEPT, rank, src, context, nonce_a, key, nonce_d))
    return Link(sock, rank, src, address_of[src], _direction_key(key, rank, src, nonce_d, nonce_a),
                _direction_key(key, src, rank, nonce_d, nonce_a), stall_timeout)


class Link:
    """One authenticated TCP connection to a peer (the module docstring).

    One thread sends and one thread receives at a time; :meth:`abort` may be
    called from any thread.

    Parameters
    ----------
    sock : socket.socket
        Connected, handshake done.
    rank, peer : int
        This rank and the other end's.
    address : (str, int)
        The peer's advertised address, for messages.
    send_key, recv_key : bytes
        This direction's and the other's key.
    stall_timeout : float
        A send or receive that makes no progress for this long fails.

    Attributes
    ----------
    bytes_sent, bytes_received : int
        Everything written and read after the handshake, headers and tags
        included.
    payload_sent, payload_received : int
        DATA payload bytes only.
    """

    def __init__(self, sock, rank: int, peer: int, address, send_key: bytes, recv_key: bytes,
                 stall_timeout: float):
        self.sock, self.rank, self.peer = sock, int(rank), int(peer)
        self.address = (str(address[0]), int(address[1]))
        self.stall_timeout = float(stall_timeout)
        self._send_mac = hmac.new(send_key, digestmod=hashlib.sha256)
        self._recv_mac = hmac.new(recv_key, digestmod=hashlib.sha256)
        self._send_seq = self._recv_seq = 0
        self._send_lock = threading.Lock()
        self.closed = False
        self.bytes_sent = self.bytes_received = self.payload_sent = self.payload_received = 0
        self.last_sent = time.monotonic()  # when the last frame was written (ALIVE frames keep it recent)
        sock.settimeout(self.stall_timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # announcements are small

    def _where(self) -> str:
        return f"rank {self.peer} at {self.address[0]}:{self.address[1]}"

    def _lost(self, exc: BaseException, doing: str) -> TransportError:
        if self.closed:
            return LinkClosed(f"rank {self.rank}: the link to rank {self.peer} was closed")
        if isinstance(exc, socket.timeout):
            return PeerLostError(f"rank {self.rank}: {self._where()} {doing} nothing for {self.stall_timeout:g} s "
                                 "(stall timeout)", self.peer, self.address, "stalled")
        return PeerLostError(f"rank {self.rank}: {self._where()} closed the connection ({exc})", self.peer,
                             self.address, "closed")

    # ------------------------------------------------------------ sending
    def send(self, kind: Kind, round_no: int, payload=b"", phase: int = 0, offset: int = 0) -> None:
        """Send one frame; ``payload`` any C-contiguous buffer (a numpy view
        is sent without a copy).

        Raises
        ------
        PeerLostError
            ``"stalled"`` when the peer took nothing for the stall timeout,
            ``"closed"`` when the connection broke.
        LinkClosed
            This rank closed the link.
        """
        with self._send_lock:
            if self.closed:
                raise LinkClosed(f"rank {self.rank}: the link to rank {self.peer} was closed")
            try:
                self._write(kind, round_no, payload, phase, offset)
            except (OSError, socket.timeout) as exc:
                raise self._lost(exc, "took") from None
        if kind == Kind.DATA:
            self.payload_sent += memoryview(payload).nbytes

    def _write(self, kind, round_no, payload, phase, offset) -> None:
        data = memoryview(payload).cast("B")
        header = HEADER.pack(int(kind), phase, 0, round_no & 0xFFFFFFFF, offset, data.nbytes)
        mac = self._send_mac.copy()
        mac.update(_SEQ.pack(self._send_seq) + header)
        mac.update(data)
        self._send_seq += 1
        parts = [memoryview(header), data, memoryview(mac.digest())]
        self.bytes_sent += sum(p.nbytes for p in parts)
        self.last_sent = time.monotonic()
        parts = [p for p in parts if p.nbytes]
        while parts:  # sendmsg may take part of the parts
            sent = self.sock.sendmsg(parts)
            while sent:
                if sent >= parts[0].nbytes:
                    sent -= parts[0].nbytes
                    parts.pop(0)
                else:
                    parts[0], sent = parts[0][sent:], 0

    def sending(self) -> bool:
        """Whether a frame is being written now."""
        return self._send_lock.locked()

    def abort(self, notice: dict | None) -> None:
        """Stop using the link: send ``notice`` (JSON) as an ABORT frame when
        the sender finishes its frame within :data:`NOTICE_WAIT` and the
        socket takes the notice at once, then shut the connection, waking
        this rank's threads blocked on it."""
        if self.closed:
            return
        self.closed = True  # this rank's threads now stop at their next call
        if notice is not None and self._send_lock.acquire(timeout=NOTICE_WAIT):
            try:
                # Never wait on a peer that takes nothing (a stalled one): its notice is dropped.
                self.sock.settimeout(0.0)
                self._write(Kind.ABORT, 0, json.dumps(notice).encode()[:MAX_NOTICE], 0, 0)
            except (OSError, socket.timeout):
                pass  # the peer is gone too, or takes nothing
            finally:
                self._send_lock.release()
        self._shutdown()

    def _shutdown(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def shutdown(self) -> None:
        """Stop using the link without a notice: the peer sees the end of
        the stream, this rank's threads blocked on it wake up."""
        self.closed = True
        self._shutdown()

    def close(self) -> None:
        """:meth:`shutdown`, then release the socket (once no thread uses it)."""
        self.shutdown()
        self.sock.close()

    # ------------------------------------------------------------ receiving
    def _read_into(self, view: memoryview) -> None:
        got, n = 0, view.nbytes
        try:
            while got < n:
                k = self.sock.recv_into(view[got:])
                if k == 0:
                    raise ConnectionResetError("end of stream")
                got += k
        except (OSError, socket.timeout) as exc:
            raise self._lost(exc, "sent") from None
        self.bytes_received += n

    def _reject(self, reason: str, what: str) -> FrameRejectedError:
        return FrameRejectedError(f"rank {self.rank}: refused a frame from {self._where()}: {what}", self.peer,
                                  self.address, reason)

    def recv(self, kind: Kind, round_no: int, into=None, *, length: int | None = None, phase: int = 0,
             offset: int = 0):
        """Read the next frame, which must be ``kind`` of round ``round_no``
        (and ``phase``, ``offset`` for DATA); its payload goes into ``into``
        (a writeable buffer of exactly the expected length) or, without
        ``into``, comes back as bytes of exactly ``length``.

        Raises
        ------
        FrameRejectedError
            Naming the first check that failed (``reason``).
        PeerLostError
            The connection broke or stalled, or the peer sent an ABORT notice
            (then naming the rank the notice names).
        LinkClosed
            This rank closed the link.
        """
        while True:  # ALIVE frames are skipped
            head = bytearray(HEADER.size)
            self._read_into(memoryview(head))
            got_kind, got_phase, _, got_round, got_offset, got_length = HEADER.unpack(head)
            target = None if into is None else memoryview(into).cast("B")
            want = target.nbytes if target is not None else length
            if got_kind == Kind.ABORT:
                if got_length > MAX_NOTICE:
                    raise self._reject("length", f"a notice of {got_length} bytes, at most {MAX_NOTICE} expected")
                target = None
            elif got_kind == Kind.ALIVE:
                if got_length:
                    raise self._reject("length", f"an ALIVE frame of {got_length} bytes, 0 expected")
                target = None
            elif got_length != want:
                raise self._reject("length", f"expected {want} payload bytes ({Kind(kind).name}, round {round_no}, "
                                             f"offset {offset}), got {got_length}")
            if target is None:
                body = bytearray(got_length)
                target = memoryview(body)
            self._read_into(target)
            tag = bytearray(TAG_BYTES)
            self._read_into(memoryview(tag))
            mac = self._recv_mac.copy()
            mac.update(_SEQ.pack(self._recv_seq) + bytes(head))
            mac.update(target)
            if not hmac.compare_digest(mac.digest(), bytes(tag)):
                raise self._reject("tag", f"its tag does not verify as frame {self._recv_seq} of this direction "
                                          "(altered, forged, replayed or out of order)")
            self._recv_seq += 1
            if got_kind != Kind.ALIVE:
                break
        if got_kind == Kind.ABORT:
            raise self._notice_error(bytes(target))
        for reason, expected, got in (("kind", int(kind), got_kind), ("round", round_no & 0xFFFFFFFF, got_round),
                                      ("phase", phase, got_phase), ("offset", offset, got_offset)):
            if expected != got:
                raise self._reject(reason, f"expected {reason} {expected}, got {got}")
        if kind == Kind.DATA:
            self.payload_received += got_length
        return None if into is not None else bytes(target)

    def _notice_error(self, text: bytes) -> PeerLostError:
        try:
            notice = json.loads(text)
            rank, host, port = int(notice["rank"]), str(notice["host"]), int(notice["port"])
            reason, why = str(notice["reason"]), str(notice.get("message", ""))
        except (ValueError, KeyError, TypeError):
            return PeerLostError(f"rank {self.rank}: {self._where()} failed (unreadable notice)", self.peer,
                                 self.address, "failed")
        if rank == self.rank:  # the peer refused or lost this very rank
            return PeerLostError(f"rank {self.rank}: {self._where()} dropped this rank ({reason}): {why}", self.peer,
                                 self.address, reason)
        if rank == self.peer:
            return PeerLostError(f"rank {self.rank}: {self._where()} failed: {why}", rank, (host, port), reason)
        return PeerLostError(f"rank {self.rank}: rank {rank} at {host}:{port} was lost ({reason}), as "
                             f"{self._where()} reports: {why}", rank, (host, port), reason, reported_by=self.peer)
