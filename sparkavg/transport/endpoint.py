"""Reliable, authenticated message delivery between ranks over one UDP socket.

Delivery contract: every message passed to :meth:`ReliableEndpoint.send` is
delivered to the destination's application exactly once and byte-identical,
or the sender gets :class:`~sparkavg.transport.errors.PeerStalledError`.
Messages from one peer are delivered in the order they complete, which is
NOT necessarily the order they were sent (no head-of-line blocking; the
gradient-sharing updates are additive, so order does not matter).

Mechanics: messages are cut into chunks of at most ``max_datagram_bytes``
per datagram; each (src, dst) pair numbers its messages; the receiver acks
every DATA datagram it gets (also duplicates) with a cumulative sequence
number plus selective ``(seq, chunk)`` entries; the sender retransmits
chunks unacked after the (adaptive) timeout. Buffers are bounded on both
sides: a per-peer send window (``send`` blocks, then raises), a per-peer
receive window of sequence numbers, a per-peer reassembly budget and an
inbox budget (excess is dropped and counted; senders retransmit later).
A background thread reads the socket, acks, and fires retransmissions; it
hands delivered messages to a handler instead, when one is set
(:meth:`ReliableEndpoint.deliver_to`: a relay reacts without a thread switch).
"""
from __future__ import annotations

import collections
import contextlib
import heapq
import logging
import math
import selectors
import socket
import sys
import threading
import time
from collections.abc import Mapping

from .limits import endpoint_limits
from .errors import EndpointClosedError, PeerStalledError
from .faults import FaultInjector
from .peer import OutMessage, PeerState, Receipt
from .protocol import (ACK_ENTRY, OVERHEAD_BYTES, DatagramCodec, DatagramRejected, KeyUnknown, MessageType,
                       RejectReason)

__all__ = ["ReliableEndpoint", "prompt_io_thread", "IO_SWITCH_INTERVAL"]

logger = logging.getLogger(__name__)

_RECV_BUFFER = 65536     # larger than any datagram, so oversized ones are seen whole
_RECV_BATCH = 256        # datagrams read per wake-up before acks and timers run
_MAX_SLEEP = 0.5         # I/O thread wakes at least this often
_MAX_EARLY = 4096        # datagrams kept from ranks not yet in the peer table (or whose key is not known yet)
_KEYLESS = object()      # _decode's mark of a datagram from a rank whose key is not known yet
_INVALID = (RejectReason.TRUNCATED, RejectReason.OVERSIZED, RejectReason.BAD_MAC, RejectReason.MALFORMED,
            RejectReason.WRONG_JOB, RejectReason.UNKNOWN_PEER, RejectReason.MISROUTED)
_COUNTERS = (
    "messages_sent", "messages_delivered", "payload_bytes_sent", "payload_bytes_received",
    "datagrams_sent", "wire_bytes_sent", "datagrams_received", "wire_bytes_received",
    "datagrams_retransmitted", "acks_sent", "acks_received", "duplicates_dropped", "send_errors",
)


#: Seconds between the interpreter's thread switches while a rank trains (:func:`prompt_io_thread`).
IO_SWITCH_INTERVAL = 0.0005


@contextlib.contextmanager
def prompt_io_thread():
    """Let an endpoint's I/O thread take the GIL within :data:`IO_SWITCH_INTERVAL`
    of a datagram's arrival while the training loop runs Python code (the
    interpreter's default, 5 ms, is most of a small model's step: a peer
    waiting for this rank's message would wait for it)."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(min(before, IO_SWITCH_INTERVAL))
    try:
        yield
    finally:
        sys.setswitchinterval(before)


def _check_rank(rank, what: str = "rank") -> int:
    if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < (1 << 32):
        raise ValueError(f"Expect {what} to be an int in [0, 2**32), got {rank!r}")
    return rank


class ReliableEndpoint:
    """One rank's UDP socket with reliable, authenticated message delivery.

    Parameters
    ----------
    rank : int
        This endpoint's rank in ``[0, 2**32)``.
    key : bytes or None
        One HMAC key for every peer, at least 16 bytes
        (``secrets.token_bytes(32)``); or None: a key per peer, given with
        the peers to :meth:`set_peers` (the keys each pair of ranks agreed,
        :class:`~sparkavg.transport.keys.KeyAgreement`: what the executors
        use, so that no key is ever shipped).
    job_id : int, default 0
        Session id in ``[0, 2**64)`` written into and checked on every
        datagram. Sequence numbers restart with each endpoint, so use a
        fresh id for every endpoint lifetime under the same key (e.g. the
        barrier stage id and attempt number) or datagrams of an old session
        could be taken for new ones.
    host : str, default "127.0.0.1"
        Address to bind (see :func:`~sparkavg.transport.address.select_address`).
        Peers must be able to reach it as given: ``address`` reports it.
    port : int, default 0
        UDP port; 0 picks a free ephemeral one.
    limits : mapping, optional
        For the transport's tests only: ``{name: value}`` in place of the
        module constants of :mod:`.limits` (a smaller window, a shorter
        stall timeout, ``faults``: a :class:`~.faults.FaultInjection`).
        Every rank must use the same; production ranks use none.

    Notes
    -----
    Thread-safe. Close it (or use it as a context manager) to stop the
    background thread. Close only once every peer is done with it (after a
    barrier): until then a peer may still need this endpoint's acks.
    """

    def __init__(self, rank: int, key, job_id: int = 0, host: str = "127.0.0.1",
                 port: int = 0, *, limits: Mapping | None = None):
        self._rank = _check_rank(rank)
        self.limits = limits = endpoint_limits(limits)
        self._codec = DatagramCodec(key, job_id, limits.max_datagram_bytes)
        self._ack_entries_per_datagram = (limits.max_datagram_bytes - OVERHEAD_BYTES) // ACK_ENTRY.size
        self._injector = (FaultInjector(limits.faults, self._rank)
                          if limits.faults is not None and limits.faults.active else None)
        self._lock = threading.Lock()
        self._cv = threading.Condition(self._lock)
        self._peers: dict[int, PeerState] = {}
        self._inbox: collections.deque = collections.deque()
        self._inbox_bytes = 0
        self._handler = None  # deliver_to's: takes every delivered message on the I/O thread
        self._early: list = []  # datagrams from ranks not yet known (authentic) or whose key is not (yet)
        self._early_bytes = 0
        self._timers: list = []           # heap of (deadline, rank, seq, chunk, sends)
        self._acks_owed: set[int] = set()
        self._stats = dict.fromkeys(_COUNTERS, 0)
        self._rejected = dict.fromkeys((r.value for r in RejectReason), 0)
        self._closing = False
        self._failure: BaseException | None = None
        self._sleep_until = 0.0

        self._sock = sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._wake_r, self._wake_w = socket.socketpair()
        try:
            for opt in (socket.SO_RCVBUF, socket.SO_SNDBUF):
                if limits.socket_buffer_bytes:
                    try:
                        sock.setsockopt(socket.SOL_SOCKET, opt, limits.socket_buffer_bytes)
                    except OSError as exc:  # not fatal: the kernel default works, only slower
                        logger.debug("setsockopt(%s) failed: %s", opt, exc)
            sock.bind((host, int(port)))
            sock.setblocking(False)
            self._wake_r.setblocking(False)
            self._wake_w.setblocking(False)
            self._address = sock.getsockname()[:2]
            self._selector = selectors.DefaultSelector()
            self._selector.register(sock, selectors.EVENT_READ)
            self._selector.register(self._wake_r, selectors.EVENT_READ)
        except BaseException:
            for s in (sock, self._wake_r, self._wake_w):
                s.close()
            raise
        self._thread = threading.Thread(target=self._run, name=f"sparkavg-udp-{self._rank}", daemon=True)
        self._thread.start()
        logger.debug("rank %d bound UDP %s:%d", self._rank, *self._address)

    # ------------------------------------------------------------------ public API
    @property
    def rank(self) -> int:
        """This endpoint's rank."""
        return self._rank

    @property
    def address(self) -> tuple[str, int]:
        """``(host, port)`` the socket is bound to; send it to the peers."""
        return self._address

    @property
    def peers(self) -> dict[int, tuple[str, int]]:
        """Copy of the peer table ``{rank: (host, port)}``."""
        with self._lock:
            return {r: p.address for r, p in self._peers.items()}

    def set_peers(self, peers: Mapping[int, tuple[str, int]], keys: Mapping[int, bytes] | None = None) -> None:
        """Set the peer table.

        Parameters
        ----------
        peers : mapping of int to (str, int)
            ``{rank: (host, port)}``; this endpoint's own rank may be in it
            (the result of an all-gather) and is skipped. Ranks already known
            keep their state; ranks left out are forgotten.
        keys : mapping of int to bytes, optional
            ``{rank: key}``, the HMAC key of every peer in ``peers``: required
            when the endpoint was made without a key (``key=None``), refused
            otherwise.  Datagrams from and to a rank are authenticated with its
            key only.

        Notes
        -----
        Data datagrams from a rank not (yet) in the table are kept (up to
        4096 and ``max_reassembly_bytes`` bytes) and taken in, acked, when a
        call names that rank: a peer that learnt the table first does not
        wait for a retransmission. With one key they are kept once
        authentic; with a key per peer, before (the key comes with the rank)
        and authenticated when it comes. Beyond that, and acks from unknown
        ranks, they are rejected as ``unknown_peer`` and not acked (the peer
        retransmits). Acks go to the address in the table, never to a
        datagram's source address.
        """
        table = {}
        for rank, addr in dict(peers).items():
            _check_rank(rank, "peer rank")
            try:
                host, port = addr[0], int(addr[1])
            except (TypeError, ValueError, IndexError):
                raise ValueError(f"Expect peer {rank}'s address as (host, port), got {addr!r}") from None
            if not 0 < port < 65536:
                raise ValueError(f"Expect peer {rank}'s port in [1, 65535], got {port}")
            if rank != self._rank:
                table[rank] = (str(host), port)
        per_peer = self._codec.per_peer
        if per_peer != (keys is not None):
            raise ValueError("Expect keys={rank: key} for the peers of an endpoint made without a key (key=None)"
                             if per_peer else
                             "Expect no per-peer keys for an endpoint made with one key for every peer, got keys")
        if per_peer:
            keys = dict(keys)
            missing = sorted(set(table) - set(keys))
            if missing:
                raise ValueError(f"Expect a key for every peer rank, got none for rank(s) {missing}")
        with self._cv:
            self._check_open()
            if per_peer:
                self._codec.set_keys({rank: keys[rank] for rank in table})
            for rank in list(self._peers):
                if rank not in table:
                    self._acks_owed.discard(rank)
                    del self._peers[rank]
            for rank, addr in table.items():
                peer = self._peers.get(rank)
                if peer is None:
                    self._peers[rank] = PeerState(rank, addr, self.limits)
                else:
                    peer.address = addr
            early, self._early, self._early_bytes = self._early, [], 0
            for data in early:
                _, header, payload = self._decode(data)
                self._accept(data, RejectReason.UNKNOWN_PEER if header is _KEYLESS else header, payload,
                             hold=False)
            if early:
                self._send_owed_acks()
            self._cv.notify_all()

    def send(self, rank: int, payload, block: bool = True) -> bool:
        """Send one message to ``rank``; return once it is handed to the socket.

        Blocks while the peer's send window is full (unless ``block`` is
        False: then returns False at once, nothing sent).

        Parameters
        ----------
        rank : int
            A rank in the peer table.
        payload : bytes-like
            At most ``limits.max_message_bytes`` bytes (may be empty).
        block : bool, default True
            False on the I/O thread (a :meth:`deliver_to` handler), which
            must never wait for the acks it reads itself.

        Returns
        -------
        bool
            True once sent; False only when ``block`` is False and the
            window is full.

        Raises
        ------
        PeerStalledError
            If the window stays full for ``stall_timeout`` seconds, or the
            peer has already acknowledged nothing for that long.
        EndpointClosedError
            If the endpoint is closed.
        """
        data = memoryview(payload).cast("B")
        n = data.nbytes
        cfg = self.limits
        if n > cfg.max_message_bytes:
            raise ValueError(f"Expect a message of at most max_message_bytes={cfg.max_message_bytes} "
                             f"bytes, got {n}")
        chunk = cfg.chunk_bytes
        count = max(1, math.ceil(n / chunk))
        with self._cv:
            self._check_open()
            peer = self._peers.get(rank)
            if peer is None:
                raise ValueError(f"Expect a peer rank in {sorted(self._peers)}, got {rank!r}")
            deadline = None
            while True:
                now = time.monotonic()
                if peer.stalled(now):
                    raise self._stalled_error([peer], now, "send")
                if peer.has_room(n):
                    break
                if not block:
                    return False
                if deadline is None:
                    deadline = now + cfg.stall_timeout
                elif now >= deadline:
                    raise self._stalled_error([peer], now, "send (window full)")
                self._cv.wait(min(deadline - now, _MAX_SLEEP))
                self._check_open()
                if self._peers.get(rank) is not peer:
                    raise ValueError(f"Peer rank {rank} was removed while sending to it")
            seq = peer.next_seq
            peer.next_seq += 1
            codec, me = self._codec, self._rank
            msg = OutMessage(seq, n, [codec.encode(MessageType.DATA, me, rank, seq, i, count,
                                                   data[i * chunk:(i + 1) * chunk]) for i in range(count)])
            peer.add_sent(msg, now)
            deadline = now + peer.retransmit_delay(1)
            for i, datagram in enumerate(msg.datagrams):
                self._transmit(datagram, peer.address, now)
                heapq.heappush(self._timers, (deadline, rank, seq, i, 1))
            self._stats["messages_sent"] += 1
            self._stats["payload_bytes_sent"] += n
            self._wake_if_sleeping_past(deadline)
        return True

    def deliver_to(self, handler) -> None:
        """Hand every delivered message to ``handler(src_rank, payload)`` on
        the I/O thread, at the end of the turn that completed it, instead of
        keeping it for :meth:`receive` / :meth:`poll` (which then find
        nothing); messages already waiting go first.

        What reacts to a message then runs without waking another thread
        (a relay's hop: ``TreeGroup``'s exchanges).  The handler runs outside
        the endpoint's lock and may call :meth:`send` with ``block=False``
        only (the I/O thread must never wait for the acks it reads); it must
        not raise (an exception ends the I/O thread: every call then raises
        :class:`EndpointClosedError`).
        """
        if not callable(handler):
            raise TypeError(f"Expect a handler callable(src_rank, payload), got {handler!r}")
        with self._cv:
            self._check_open()
            self._handler = handler
        self._wake()  # messages already delivered are handed over on the next turn

    def receive(self, timeout: float | None = None) -> tuple[int, bytes] | None:
        """Return the next delivered message as ``(src_rank, payload)``.

        Parameters
        ----------
        timeout : float or None, default None
            Seconds to wait; ``None`` waits until a message arrives or the
            endpoint is closed.

        Returns
        -------
        (int, bytes) or None
            ``None`` if nothing arrived in time.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cv:
            while not self._inbox:
                self._check_open()
                if deadline is None:
                    self._cv.wait(_MAX_SLEEP)
                else:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return None
                    self._cv.wait(remaining)
            item = self._inbox.popleft()
            self._inbox_bytes -= len(item[1])
            return item

    def poll(self) -> list[tuple[int, bytes]]:
        """Return every message delivered so far (maybe none), without waiting."""
        with self._cv:
            items = list(self._inbox)
            self._inbox.clear()
            self._inbox_bytes = 0
            return items

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every message sent so far is acknowledged.

        Parameters
        ----------
        timeout : float or None, default None
            Seconds; ``None`` means ``limits.stall_timeout``.

        Raises
        ------
        PeerStalledError
            Naming every peer with unacknowledged messages when time is up,
            or earlier as soon as one has acknowledged nothing for
            ``stall_timeout``.
        """
        timeout = self.limits.stall_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        with self._cv:
            while True:
                self._check_open()
                pending = [p for p in self._peers.values() if p.unacked]
                if not pending:
                    return
                now = time.monotonic()
                stalled = [p for p in pending if p.stalled(now)]
                if stalled or now >= deadline:
                    raise self._stalled_error(stalled or pending, now, f"flush (timeout {timeout:g} s)")
                self._cv.wait(min(deadline - now, _MAX_SLEEP))

    def pending(self) -> dict[int, int]:
        """Unacknowledged messages per peer rank (peers with none are left out)."""
        with self._lock:
            return {r: len(p.unacked) for r, p in self._peers.items() if p.unacked}

    def stats(self) -> dict[str, int]:
        """Counters since creation, as plain ints.

        Keys: ``messages_sent``, ``messages_delivered``, ``payload_bytes_sent``,
        ``payload_bytes_received`` (application bytes, each message once),
        ``datagrams_sent``, ``wire_bytes_sent``, ``datagrams_received``,
        ``wire_bytes_received`` (every datagram, retransmissions and acks
        included), ``datagrams_retransmitted``, ``acks_sent``,
        ``acks_received``, ``duplicates_dropped`` (chunks already held),
        ``send_errors``, ``rejected_<reason>`` for every
        :class:`~sparkavg.transport.protocol.RejectReason`,
        ``datagrams_rejected`` (their sum), ``datagrams_invalid`` (the part of
        it that failed authentication or validation: truncated, oversized,
        bad_mac, malformed, wrong_job, unknown_peer, misrouted; ``replay``
        also counts harmless late retransmissions and duplicates), and
        ``injected_loss``, ``injected_duplicate``, ``injected_reorder``.
        """
        with self._lock:
            out = dict(self._stats)
            for reason, count in self._rejected.items():
                out[f"rejected_{reason}"] = count
            out["datagrams_rejected"] = sum(self._rejected.values())
            out["datagrams_invalid"] = sum(self._rejected[r.value] for r in _INVALID)
            inj = self._injector
            out["injected_loss"] = inj.dropped if inj else 0
            out["injected_duplicate"] = inj.duplicated if inj else 0
            out["injected_reorder"] = inj.reordered if inj else 0
            return out

    def buffer_usage(self) -> dict[str, int]:
        """Current sizes of every buffer, summed over peers (for monitoring and tests)."""
        with self._lock:
            peers = self._peers.values()
            return {
                "unacked_messages": sum(len(p.unacked) for p in peers),
                "unacked_bytes": sum(p.unacked_bytes for p in peers),
                "reassembly_messages": sum(len(p.partial) for p in peers),
                "reassembly_bytes": sum(p.partial_bytes for p in peers),
                "delivered_ahead": sum(len(p.delivered) for p in peers),
                "inbox_messages": len(self._inbox),
                "inbox_bytes": self._inbox_bytes,
                "timers": len(self._timers),
                "held_datagrams": self._injector.held if self._injector else 0,
            }

    def close(self) -> None:
        """Stop the I/O thread and close the socket (idempotent)."""
        with self._cv:
            if self._closing:
                return
            self._closing = True
            self._cv.notify_all()
        self._wake()
        self._thread.join(timeout=10.0)
        if self._thread.is_alive():  # pragma: no cover - would be a bug
            logger.error("rank %d: UDP I/O thread did not stop within 10 s", self._rank)
        for s in (self._sock, self._wake_r, self._wake_w):
            s.close()
        logger.debug("rank %d closed; stats %s", self._rank, self._stats)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closing

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"ReliableEndpoint(rank={self._rank}, address={self._address}, peers={len(self._peers)})"

    # ------------------------------------------------------------------ internals
    def _check_open(self) -> None:
        """Raise if closed or if the I/O thread died (caller holds the lock)."""
        if self._failure is not None:
            raise EndpointClosedError(f"rank {self._rank}: UDP I/O thread failed: {self._failure!r}")
        if self._closing:
            raise EndpointClosedError(f"rank {self._rank}: endpoint is closed")

    def _stalled_error(self, peers: list, now: float, during: str) -> PeerStalledError:
        peers = sorted(peers, key=lambda p: p.rank)
        parts = [f"rank {p.rank} at {p.address[0]}:{p.address[1]} ({len(p.unacked)} messages, "
                 f"{p.unacked_bytes} bytes unacked; last progress {now - p.last_progress:.1f} s ago)"
                 for p in peers]
        message = (f"rank {self._rank}: peer(s) stalled during {during}: " + "; ".join(parts)
                   + f" [stall_timeout={self.limits.stall_timeout:g} s]")
        return PeerStalledError(message, [p.rank for p in peers], [p.address for p in peers])

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"\0")
        except OSError:  # buffer full (a wake-up is already pending) or closed
            pass

    def _wake_if_sleeping_past(self, deadline: float) -> None:
        """The I/O thread sleeps until a computed time; wake it for an earlier timer."""
        if deadline < self._sleep_until:
            self._sleep_until = deadline
            self._wake()

    def _transmit(self, datagram: bytes, address: tuple, now: float) -> None:
        """Send one datagram through fault injection (caller holds the lock)."""
        if self._injector is None:
            self._sendto(datagram, address)
            return
        for d, a in self._injector.outgoing(datagram, address, now):
            self._sendto(d, a)
        release = self._injector.next_release()
        if release is not None:
            self._wake_if_sleeping_past(release)

    def _sendto(self, datagram: bytes, address: tuple) -> None:
        try:
            self._sock.sendto(datagram, address)
        except OSError as exc:  # full buffer, unreachable...: retransmission recovers
            self._stats["send_errors"] += 1
            logger.debug("rank %d: sendto %s failed: %s", self._rank, address, exc)
            return
        self._stats["datagrams_sent"] += 1
        self._stats["wire_bytes_sent"] += len(datagram)

    def _run(self) -> None:
        try:
            while self._service():
                pass
        except BaseException as exc:  # pragma: no cover - would be a bug; never hang the callers
            logger.exception("rank %d: UDP I/O thread failed", self._rank)
            with self._cv:
                self._failure = exc
                self._cv.notify_all()
        finally:
            self._selector.close()

    def _service(self) -> bool:
        """One turn of the I/O thread: sleep until data or a timer, read a batch,
        handle it, ack, fire timers. Returns False once closing. (A function of
        its own so that the batch is freed on return, not kept until the next turn.)"""
        with self._lock:
            if self._closing:
                return False
            now = time.monotonic()
            next_at = now + _MAX_SLEEP
            if self._timers:
                next_at = min(next_at, self._timers[0][0])
            if self._injector is not None and self._injector.held:
                next_at = min(next_at, self._injector.next_release())
            self._sleep_until = next_at
        self._selector.select(max(0.0, next_at - now))
        try:
            while self._wake_r.recv(4096):
                pass
        except OSError:
            pass
        batch = []
        for _ in range(_RECV_BATCH):
            try:
                data = self._sock.recv(_RECV_BUFFER)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as exc:  # e.g. ICMP errors surfaced on some platforms
                logger.debug("rank %d: recv failed: %s", self._rank, exc)
                continue
            batch.append(self._decode(data))
        with self._cv:
            if self._closing:
                return False
            now = time.monotonic()
            notify = False
            for data, header, payload in batch:
                notify |= self._handle(data, header, payload, now)
            self._send_owed_acks()
            self._fire_timers(now)
            if notify:
                self._cv.notify_all()
            handler, delivered = self._handler, None
            if handler is not None and self._inbox:
                delivered = list(self._inbox)
                self._inbox.clear()
                self._inbox_bytes = 0
        if delivered:
            for src, payload in delivered:  # outside the lock: the handler sends
                handler(src, payload)
        return True

    def _decode(self, data: bytes):
        """Authenticate outside the lock; returns (data, header or reason or _KEYLESS, payload)."""
        try:
            header, payload = self._codec.decode(data)
        except KeyUnknown:
            return data, _KEYLESS, None
        except DatagramRejected as rejected:
            return data, rejected.reason, None
        return data, header, payload

    def _reject(self, reason: RejectReason) -> bool:
        self._rejected[reason.value] += 1
        return False

    def _handle(self, data: bytes, header, payload, now: float) -> bool:
        """Process one received datagram (caller holds the lock); True if waiters should wake."""
        self._stats["datagrams_received"] += 1
        self._stats["wire_bytes_received"] += len(data)
        if header is _KEYLESS:
            _, header, payload = self._decode(data)  # the key may have come since (set_peers)
        if header is _KEYLESS:
            return self._hold(data)
        return self._accept(data, header, payload, now=now)

    def _hold(self, data: bytes) -> bool:
        """Keep a datagram of a rank not known yet until set_peers names it (bounded), else reject it."""
        if len(self._early) < _MAX_EARLY and self._early_bytes + len(data) <= self.limits.max_reassembly_bytes:
            self._early.append(data)
            self._early_bytes += len(data)
            return False
        return self._reject(RejectReason.UNKNOWN_PEER)

    def _accept(self, data: bytes, header, payload, now: float = 0.0, hold: bool = True) -> bool:
        """Act on one decoded datagram (caller holds the lock): reject, hold (``hold``), ack or deliver."""
        if isinstance(header, RejectReason):
            return self._reject(header)
        if header.dst != self._rank:
            return self._reject(RejectReason.MISROUTED)
        peer = self._peers.get(header.src)
        if peer is None:
            if header.type != MessageType.ACK and hold:
                return self._hold(data)  # authentic: taken in when set_peers names its rank
            return self._reject(RejectReason.UNKNOWN_PEER)
        if header.type == MessageType.ACK:
            if not hold:
                return self._reject(RejectReason.UNKNOWN_PEER)  # an ack held from before its rank was known
            return self._on_ack(peer, header.seq, payload, now)
        return self._on_data(peer, header, payload)

    def _owe_ack(self, peer: PeerState, seq: int, index: int) -> None:
        self._acks_owed.add(peer.rank)
        if peer.owe_ack(seq, index) >= self._ack_entries_per_datagram:
            self._send_ack(peer)

    def _on_data(self, peer: PeerState, header, payload) -> bool:
        seq, index = header.seq, header.chunk_index
        outcome, message = peer.on_data(seq, index, header.chunk_count, payload,
                                        self._inbox_bytes >= self.limits.max_inbox_bytes)
        if outcome is Receipt.DUPLICATE:
            self._stats["duplicates_dropped"] += 1
        elif isinstance(outcome, RejectReason):
            self._reject(outcome)
            if outcome is not RejectReason.REPLAY:
                return False  # not acked: the sender retransmits later
        self._owe_ack(peer, seq, index)
        if message is None:
            return False
        self._inbox.append((peer.rank, message))
        self._inbox_bytes += len(message)
        self._stats["messages_delivered"] += 1
        self._stats["payload_bytes_received"] += len(message)
        return True

    def _on_ack(self, peer: PeerState, cum: int, payload, now: float) -> bool:
        self._stats["acks_received"] += 1
        progressed = peer.on_ack(cum, payload, now)
        if progressed is None:
            return self._reject(RejectReason.MALFORMED)
        return progressed

    def _send_ack(self, peer: PeerState) -> None:
        entries = peer.take_ack_entries()
        per = self._ack_entries_per_datagram
        now = time.monotonic()
        for start in range(0, max(1, len(entries)), per):
            body = b"".join([ACK_ENTRY.pack(s, c) for s, c in entries[start:start + per]])
            datagram = self._codec.encode(MessageType.ACK, self._rank, peer.rank, peer.cum, 0, 0, body)
            self._transmit(datagram, peer.address, now)
            self._stats["acks_sent"] += 1
        self._acks_owed.discard(peer.rank)

    def _send_owed_acks(self) -> None:
        for rank in list(self._acks_owed):
            self._send_ack(self._peers[rank])

    def _fire_timers(self, now: float) -> None:
        """Retransmit due chunks and release held-back datagrams."""
        if self._injector is not None:
            for d, a in self._injector.due(now):
                self._sendto(d, a)
        timers = self._timers
        while timers and timers[0][0] <= now:
            _, rank, seq, index, sends = heapq.heappop(timers)
            peer = self._peers.get(rank)
            msg = peer.unacked.get(seq) if peer is not None else None
            if msg is None or msg.acked[index] or msg.sends[index] != sends:
                continue  # stale timer
            self._transmit(msg.datagrams[index], peer.address, now)
            msg.sends[index] = sends + 1
            msg.sent_at[index] = now
            self._stats["datagrams_retransmitted"] += 1
            heapq.heappush(timers, (now + peer.retransmit_delay(sends + 1), rank, seq, index, sends + 1))
