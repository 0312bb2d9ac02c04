"""Where the ranks of a barrier stage meet: a rendezvous on the driver.

The ranks of a :class:`~sparkavg.transport.CollectiveGroup` exchange their
table entries (address and X25519 public key) once per stage attempt.
Spark's ``BarrierTaskContext.allGather`` does it, but answers on Spark's
one-second poll; on a classic session the driver instead runs a
:class:`RendezvousServer` (a daemon thread, a TCP listener on an ephemeral
port of ``spark.driver.host``, the address executors already reach the
driver at) and every rank calls :func:`gather`, which behaves as
``allGather``: ``gather(text) -> [every rank's text, in rank order]``.

Authentication.  The driver draws a fresh 32-byte ``secret`` per stage
(:mod:`secrets`) and ships it to the tasks in the task's closure, as the
stage's other values.  The table carries the public keys the ranks' link
keys come from, so every message is tagged::

    frame = u32(len(body)) || body || HMAC-SHA256(secret, "sparkavg-rdv-v1" || direction || body)

with ``direction`` ``"register"`` (rank -> rendezvous) or ``"answer"``
(rendezvous -> rank), ``body`` UTF-8 JSON.  A registration
``{"version", "context", "rank", "world", "entry", "nonce"}`` names the
stage attempt (``context``: entries of one attempt never mix with
another's), the rank, the world it expects, its entry and a fresh nonce; an
answer repeats the context, rank and nonce (an old answer does not verify
as a new one) with ``"entries"`` (every rank's, in rank order), or
``"missing"`` and ``"error"`` (the ranks that had not registered when the
rendezvous's timeout ran out, counted from the attempt's first
registration), or ``"refused"`` (why this registration was refused: a
second one for the same rank, a world that is not the stage's, an
attempt that already met).  A registration whose tag does not verify is
refused and the rendezvous logs it, naming where it came from; an answer
whose tag does not verify fails the rank (:class:`RendezvousError`,
``reason="rejected"``).  Sizes are bounded before anything is read: a
registration of at most :data:`~.limits.RENDEZVOUS_FRAME_BYTES`, an answer
of at most that many bytes per rank.  Nothing is ever unpickled.

Examples
--------
The driver, around one barrier stage of ``world`` ranks::

    with RendezvousServer(world, host=sc.getConf().get("spark.driver.host")) as meeting:
        # meeting: a Rendezvous (host, port, secret), shipped in the task's closure
        rdd.barrier().mapPartitions(task).collect()

and each task::

    ctx = BarrierTaskContext.get()
    context = (ctx.stageId() << 16) | ctx.attemptNumber()     # the stage attempt (a KeyAgreement's)
    gather = meeting.gatherer(ctx.partitionId(), world, context)
    group.join_in_background(gather)                # instead of ctx.allGather
"""
from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
import logging
import secrets
import selectors
import socket
import struct
import threading
import time
from typing import Callable, Optional

from .errors import PeerStalledError, RendezvousError
from .limits import RENDEZVOUS_ANSWER_GRACE, RENDEZVOUS_FRAME_BYTES, STALL_TIMEOUT

__all__ = ["SECRET_BYTES", "Rendezvous", "RendezvousServer", "gather"]

logger = logging.getLogger(__name__)

#: Bytes of a stage's secret.
SECRET_BYTES = 32
VERSION = 1
_DOMAIN = b"sparkavg-rdv-v1"
_REGISTER, _ANSWER = b"register", b"answer"
_LENGTH = struct.Struct("!I")
_TAG_BYTES = 32
_NONCE_HEX = 32


def _tag(secret: bytes, direction: bytes, body: bytes) -> bytes:
    return hmac.new(secret, _DOMAIN + direction + body, hashlib.sha256).digest()


def _frame(secret: bytes, direction: bytes, message: dict) -> bytes:
    body = json.dumps(message, separators=(",", ":")).encode()
    return _LENGTH.pack(len(body)) + body + _tag(secret, direction, body)


def _where(address) -> str:
    return f"{address[0]}:{address[1]}"


@dataclasses.dataclass(frozen=True)
class Rendezvous:
    """What a task needs to meet its peers at the driver: the rendezvous's
    ``host`` and ``port`` and the stage's ``secret`` (never printed)."""

    host: str
    port: int
    secret: bytes = dataclasses.field(repr=False)

    @property
    def address(self) -> tuple:
        return (self.host, self.port)

    def gatherer(self, rank: int, world: int, context: int,
                 timeout: float = STALL_TIMEOUT) -> Callable[[str], list]:
        """``gather(text) -> list of str`` for ``rank`` of ``world`` in the
        stage attempt ``context``: :func:`gather` with these arguments, in
        the shape of ``BarrierTaskContext.allGather`` (what
        :meth:`~sparkavg.transport.CollectiveGroup.join_in_background` takes)."""

        def run(text: str) -> list:
            return gather(self, text, rank=rank, world=world, context=context, timeout=timeout)

        return run


def _read_exact(sock, n: int, what: str, address) -> bytes:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    try:
        while got < n:
            k = sock.recv_into(view[got:])
            if k == 0:
                raise ConnectionResetError("end of stream")
            got += k
    except (OSError, socket.timeout) as exc:
        raise RendezvousError(f"{what}: the driver's rendezvous at {_where(address)} sent no answer "
                              f"({type(exc).__name__}: {exc})", address, "closed") from None
    return bytes(buf)


def gather(rendezvous: Rendezvous, text: str, *, rank: int, world: int, context: int,
           timeout: float = STALL_TIMEOUT) -> list:
    """Register ``text`` as ``rank``'s entry of the stage attempt ``context``
    at ``rendezvous`` and wait for every rank's: ``allGather``'s answer.

    Parameters
    ----------
    rendezvous : Rendezvous
        The driver's rendezvous and the stage's secret.
    text : str
        This rank's entry (JSON text, at most
        :data:`~.limits.RENDEZVOUS_FRAME_BYTES` bytes with its registration).
    rank, world : int
        This rank and the number of ranks.
    context : int
        The stage attempt, in ``[0, 2**64)``.
    timeout : float, default STALL_TIMEOUT
        Seconds to reach the rendezvous (it runs before the stage's tasks
        start); the answer then comes within the rendezvous's own timeout.

    Returns
    -------
    list of str
        Every rank's ``text``, in rank order.

    Raises
    ------
    RendezvousError
        Naming the rendezvous's address: unreachable within ``timeout``
        (a firewall between the executors and ``spark.driver.host``), the
        registration refused, an answer that does not verify, or none.
    PeerStalledError
        The rendezvous's timeout ran out before every rank registered; its
        ``ranks`` are the missing ones.
    """
    address = rendezvous.address
    who = f"rank {rank}"
    nonce = secrets.token_hex(_NONCE_HEX // 2)
    message = {"version": VERSION, "context": int(context), "rank": int(rank), "world": int(world),
               "entry": str(text), "nonce": nonce}
    frame = _frame(rendezvous.secret, _REGISTER, message)
    if len(frame) - _LENGTH.size - _TAG_BYTES > RENDEZVOUS_FRAME_BYTES:
        raise ValueError(f"{who}: expect a rendezvous registration of at most {RENDEZVOUS_FRAME_BYTES} bytes, got "
                         f"{len(frame) - _LENGTH.size - _TAG_BYTES} (an entry of {len(text)} characters)")
    deadline = time.monotonic() + timeout
    last: Optional[BaseException] = None
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise RendezvousError(f"{who}: cannot reach the driver's rendezvous at {_where(address)} within "
                                  f"{timeout:g} s ({last or 'timed out'}); the executors must reach the driver's "
                                  f"spark.driver.host on any TCP port", address, "unreachable")
        try:
            sock = socket.create_connection(address, timeout=left)
            break
        except OSError as exc:  # refused, unreachable, timed out
            last = exc
            time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
    with sock:
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.settimeout(max(0.001, deadline - time.monotonic()))
            sock.sendall(frame)
        except OSError as exc:
            raise RendezvousError(f"{who}: the driver's rendezvous at {_where(address)} closed the connection "
                                  f"before the registration was sent ({exc})", address, "closed") from None
        sock.settimeout(timeout + RENDEZVOUS_ANSWER_GRACE)  # it answers within its timeout of the first registration
        what = f"{who}, stage attempt {int(context):#x}"
        (length,) = _LENGTH.unpack(_read_exact(sock, _LENGTH.size, what, address))
        bound = (int(world) + 1) * RENDEZVOUS_FRAME_BYTES
        if length > bound:
            raise RendezvousError(f"{what}: refused an answer of {length} bytes from the driver's rendezvous at "
                                  f"{_where(address)}: at most {bound} expected for {world} ranks", address, "rejected")
        body = _read_exact(sock, length, what, address)
        tag = _read_exact(sock, _TAG_BYTES, what, address)
    if not hmac.compare_digest(tag, _tag(rendezvous.secret, _ANSWER, body)):
        raise RendezvousError(f"{what}: the answer from {_where(address)} does not verify under the stage's secret "
                              f"(not the driver's rendezvous of this stage, or altered)", address, "rejected")
    try:
        answer = json.loads(body)
        same = (answer["context"], answer["rank"], answer["nonce"]) == (int(context), int(rank), nonce)
    except (ValueError, KeyError, TypeError):
        answer, same = None, False
    if not same:
        raise RendezvousError(f"{what}: the answer from the driver's rendezvous at {_where(address)} is not the "
                              f"answer to this registration (expected context {int(context):#x}, rank {rank} and "
                              f"this registration's nonce)", address, "rejected")
    if "refused" in answer:
        raise RendezvousError(f"{what}: the driver's rendezvous at {_where(address)} refused the registration: "
                              f"{answer['refused']}", address, "refused")
    if "missing" in answer:
        missing = [int(r) for r in answer["missing"]]
        raise PeerStalledError(f"{what}: {answer.get('error', '')} (the driver's rendezvous at {_where(address)})",
                               missing)
    entries = answer.get("entries")
    if not (isinstance(entries, list) and len(entries) == int(world) and all(isinstance(e, str) for e in entries)
            and entries[int(rank)] == str(text)):
        raise RendezvousError(f"{what}: the answer from the driver's rendezvous at {_where(address)} is not "
                              f"{world} entries with this rank's own at {rank}", address, "rejected")
    return entries


class _Attempt:
    """The registrations of one stage attempt so far."""

    __slots__ = ("ranks", "began", "deadline", "closed", "failed")

    def __init__(self, now: float, timeout: float):
        self.ranks: dict = {}  # rank -> (socket, nonce, entry)
        self.began, self.deadline = now, now + timeout
        self.closed: Optional[str] = None  # why a later registration is refused: met, or timed out
        self.failed = False  # the driver saw the attempt fail (abandon)


class _Connection:
    """A connection whose registration is still being read."""

    __slots__ = ("sock", "peer", "buffer", "need", "deadline")

    def __init__(self, sock, peer, deadline: float):
        self.sock, self.peer, self.deadline = sock, peer, deadline
        self.buffer, self.need = bytearray(), None  # need: the frame's whole size, once its length is read


class RendezvousServer:
    """The driver's side of the rendezvous (the module docstring): collects
    one entry per rank per stage attempt and answers every rank once all
    ``world`` have registered.

    Parameters
    ----------
    world : int
        Ranks of the stage, ``>= 1``.
    host : str
        Address to listen on, one the executors reach (``spark.driver.host``).
    advertise : str, optional
        Address the tasks dial when it differs from ``host`` (Spark's
        ``spark.driver.host`` with ``spark.driver.bindAddress``).
    timeout : float, default STALL_TIMEOUT
        Seconds from a stage attempt's first registration until the ranks
        that registered are told which are missing; also how long a
        connection may take to send its registration.

    Attributes
    ----------
    rendezvous : Rendezvous
        What the tasks need: the address and the stage's fresh secret.
    """

    def __init__(self, world: int, *, host: str, advertise: Optional[str] = None,
                 timeout: float = STALL_TIMEOUT):
        if int(world) < 1:
            raise ValueError(f"Expect a rendezvous of world >= 1 ranks, got {world}")
        if not timeout > 0:
            raise ValueError(f"Expect a rendezvous timeout > 0 seconds, got {timeout}")
        self.world, self.timeout = int(world), float(timeout)
        self._secret = secrets.token_bytes(SECRET_BYTES)
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._listener.bind((host, 0))
            self._listener.listen(socket.SOMAXCONN)  # every rank may dial at once
            self._listener.setblocking(False)
        except OSError as exc:
            self._listener.close()
            raise OSError(f"cannot listen for the ranks' rendezvous on {host} ({exc}): expect spark.driver.host "
                          f"(or spark.driver.bindAddress) to be an address of this machine") from None
        self.rendezvous = Rendezvous(advertise or host, self._listener.getsockname()[1], self._secret)
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._stopping = self._abandoning = False
        self._attempts: dict = {}
        self._connections: dict = {}
        self._thread = threading.Thread(target=self._serve, name=f"sparkavg-rendezvous-{self.rendezvous.port}",
                                        daemon=True)
        self._thread.start()

    @property
    def address(self) -> tuple:
        return self.rendezvous.address

    def __enter__(self) -> Rendezvous:
        """The :attr:`rendezvous` the tasks take; the server closes when the block ends."""
        return self.rendezvous

    def __exit__(self, *exc):
        self.close()

    def abandon(self, error=None) -> None:
        """The stage attempt in flight failed (the driver saw it; ``error``
        its error): answer every rank still waiting now, as the timeout would,
        so that none holds its task slot until then -- the next attempt needs
        them -- and let later attempts register as usual.  Returns None (the
        hook :meth:`~sparkavg.spark.runners.base.EpochRunner.run_barrier`
        calls on every failed attempt)."""
        self._abandoning = True
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass

    def close(self) -> None:
        """Stop serving: every connection and the listener closed (a rank
        still waiting sees the end of the stream).  Idempotent."""
        if self._stopping:
            return
        self._stopping = True
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        self._thread.join(5.0)  # wakes at once; an answer still being sent ends on its own timeout, closing all
        self._wake_w.close()

    # ------------------------------------------------------------ the thread
    def _serve(self) -> None:
        sel = selectors.DefaultSelector()
        sel.register(self._listener, selectors.EVENT_READ, "listener")
        sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        try:
            while not self._stopping:
                now = time.monotonic()
                deadlines = [c.deadline for c in self._connections.values()] + \
                    [a.deadline for a in self._attempts.values() if a.closed is None]
                wait = None if not deadlines else max(0.0, min(deadlines) - now)
                for key, _ in sel.select(wait):
                    if key.data == "listener":
                        self._accept(sel)
                    elif key.data != "wake":
                        self._read(sel, key.data)
                if self._abandoning:  # every attempt still open ends now
                    self._abandoning = False
                    for attempt in self._attempts.values():
                        if attempt.closed is None:
                            attempt.deadline, attempt.failed = time.monotonic(), True
                self._expire(sel, time.monotonic())
        except Exception:  # a bug: the ranks then fail on their own timeouts, naming this address
            logger.exception("the ranks' rendezvous at %s stopped", _where(self.address))
        finally:
            for conn in list(self._connections.values()):
                conn.sock.close()
            for attempt in self._attempts.values():
                for sock, _, _ in attempt.ranks.values():
                    sock.close()
            sel.close()
            self._listener.close()
            self._wake_r.close()

    def _accept(self, sel) -> None:
        while True:
            try:
                sock, peer = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # out of descriptors: the rank retries until its timeout
                logger.warning("the ranks' rendezvous at %s could not accept a connection: %s",
                               _where(self.address), exc)
                return
            sock.setblocking(False)
            conn = _Connection(sock, peer, time.monotonic() + self.timeout)
            self._connections[sock] = conn
            sel.register(sock, selectors.EVENT_READ, conn)

    def _read(self, sel, conn: _Connection) -> None:
        try:
            chunk = conn.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            chunk, why = b"", exc
        else:
            why = "end of stream"
        if not chunk:
            self._drop(sel, conn)
            logger.debug("the ranks' rendezvous: %s closed before registering (%s)", _where(conn.peer), why)
            return
        conn.buffer += chunk
        if conn.need is None and len(conn.buffer) >= _LENGTH.size:
            (length,) = _LENGTH.unpack_from(conn.buffer)
            if length > RENDEZVOUS_FRAME_BYTES:
                self._refuse(sel, conn, None, f"a registration of {length} bytes, at most {RENDEZVOUS_FRAME_BYTES} "
                                             "expected")
                return
            conn.need = _LENGTH.size + length + _TAG_BYTES
        if conn.need is not None and len(conn.buffer) >= conn.need:
            if len(conn.buffer) > conn.need:
                self._refuse(sel, conn, None, "bytes after the registration")
                return
            self._register(sel, conn, bytes(conn.buffer[_LENGTH.size:-_TAG_BYTES]), bytes(conn.buffer[-_TAG_BYTES:]))

    def _register(self, sel, conn: _Connection, body: bytes, tag: bytes) -> None:
        if not hmac.compare_digest(tag, _tag(self._secret, _REGISTER, body)):
            self._refuse(sel, conn, body, "its tag does not verify under the stage's secret (not a task of this "
                                          "stage, or altered)")
            return
        try:
            msg = json.loads(body)
            context, rank, world, entry, nonce = (msg["context"], msg["rank"], msg["world"], msg["entry"],
                                                  msg["nonce"])
            well_formed = (msg["version"] == VERSION and all(type(v) is int for v in (context, rank, world))
                           and 0 <= context < 1 << 64 and isinstance(entry, str) and isinstance(nonce, str)
                           and len(nonce) == _NONCE_HEX)
        except (ValueError, KeyError, TypeError):
            well_formed = False
        if not well_formed:
            self._refuse(sel, conn, body, f"expected a version-{VERSION} registration of context, rank, world, entry "
                                          f"and nonce, got {body[:200]!r}")
            return
        if world != self.world or not 0 <= rank < self.world:
            self._refuse(sel, conn, body, f"expected a rank in [0, {self.world}) of a stage of {self.world} ranks, "
                                           f"got rank {rank} of {world}")
            return
        now = time.monotonic()
        attempt = self._attempts.get(context)
        if attempt is None:
            attempt = self._attempts[context] = _Attempt(now, self.timeout)
        if attempt.closed is not None:
            self._refuse(sel, conn, body, f"stage attempt {context:#x} {attempt.closed}")
            return
        if rank in attempt.ranks:
            self._refuse(sel, conn, body, f"rank {rank} registered twice in stage attempt {context:#x}")
            return
        sel.unregister(conn.sock)
        del self._connections[conn.sock]
        attempt.ranks[rank] = (conn.sock, nonce, entry)
        if len(attempt.ranks) == self.world:
            entries = [attempt.ranks[r][2] for r in range(self.world)]
            for r, (sock, nonce, _) in attempt.ranks.items():
                self._send(sock, {"context": context, "rank": r, "nonce": nonce, "entries": entries})
            attempt.ranks, attempt.closed = {}, "already met"
            logger.debug("the ranks' rendezvous at %s: stage attempt %#x met, %d ranks in %.3f s",
                         _where(self.address), context, self.world, now - attempt.began)

    def _expire(self, sel, now: float) -> None:
        for conn in [c for c in self._connections.values() if c.deadline <= now]:
            self._drop(sel, conn)
            logger.warning("the ranks' rendezvous at %s: %s sent no registration within %g s; dropped",
                           _where(self.address), _where(conn.peer), self.timeout)
        for context, attempt in self._attempts.items():
            if attempt.closed is not None or attempt.deadline > now:
                continue
            missing = [r for r in range(self.world) if r not in attempt.ranks]
            error = (f"ranks {missing} of {self.world} had not registered when stage attempt {context:#x} failed"
                     if attempt.failed else f"ranks {missing} of {self.world} did not register within "
                     f"{self.timeout:g} s of the first registration of stage attempt {context:#x}")
            logger.warning("the ranks' rendezvous at %s: %s", _where(self.address), error)
            for r, (sock, nonce, _) in attempt.ranks.items():
                self._send(sock, {"context": context, "rank": r, "nonce": nonce, "missing": missing, "error": error})
            attempt.ranks, attempt.closed = {}, f"timed out: {error}"

    def _refuse(self, sel, conn: _Connection, body: Optional[bytes], why: str) -> None:
        """Log ``why`` and answer it (echoing the registration's context, rank
        and nonce where they can be read, so that a rank whose registration
        was altered on the way learns why)."""
        logger.warning("the ranks' rendezvous at %s refused a registration from %s: %s", _where(self.address),
                       _where(conn.peer), why)
        sel.unregister(conn.sock)
        del self._connections[conn.sock]
        try:
            msg = json.loads(body) if body is not None else {}
            reply = {k: msg.get(k) for k in ("context", "rank", "nonce")}
        except (ValueError, AttributeError):
            reply = {"context": None, "rank": None, "nonce": None}
        self._send(conn.sock, {**reply, "refused": why})

    def _drop(self, sel, conn: _Connection) -> None:
        sel.unregister(conn.sock)
        del self._connections[conn.sock]
        conn.sock.close()

    def _send(self, sock, message: dict) -> None:
        """One answer, then the connection closed."""
        try:
            sock.setblocking(True)
            sock.settimeout(self.timeout)
            sock.sendall(_frame(self._secret, _ANSWER, message))
        except OSError as exc:
            logger.debug("the ranks' rendezvous: an answer was not delivered: %s", exc)
        finally:
            sock.close()
