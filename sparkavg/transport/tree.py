"""Every iteration's messages summed by recursive doubling: one total per rank
and iteration, whatever the world size (``Topology.TREE``; SparCML's sparse
all-reduce, Renggli et al. SC 2019, on the schedule of Thakur, Rabenseifner
and Gropp 2005).

The ``P`` lowest ranks (``P`` the largest power of two <= ``W``) are the
core; each of the ``W - P`` others (the extras) is paired with core rank
``r - P``.  For each iteration ``i``:

1. an extra sends its message to its core rank, which merges it with its
   own (own first);
2. in exchange ``j = 0 .. log2(P) - 1`` every core rank sends what it holds
   to ``r XOR 2**j`` and merges what comes back, the lower rank's part
   first: after exchange ``j`` both hold the sum of the same block of
   ``2**(j + 1)`` core ranks (and their extras), bit for bit;
3. every core rank now holds the total; one with an extra sends it to it.

So the sum takes ``log2(P)`` exchanges (plus two for an extra), each rank
its own tree of merges, where a tree through a root takes twice the depth
and the root's round trip; and every rank ends with the same bytes, in
iteration order, each once.  What a merge is (summing threshold messages:
:func:`sparkavg.ops.merge_messages`) is the caller's; payloads are opaque
bytes here, and a merge is only called for two parts that both carry bytes
(else the one that does is kept as it is).

Ranks may publish different numbers of iterations: a rank that finished
contributes "nothing, ended" to later iterations; the first iteration to
which no rank contributes anything is the group's end, which every rank
learns from the same exchanges (the ``live`` flag, or-ed block by block).
A rank whose partner's part stops coming waits ``stall_timeout`` and names
whom it waits for: every rank whose message that part carries.

Frames (network byte order), inside each endpoint message::

    kind u8 | sender u32 | iteration u64 | exchange u8 | live u8 | payload

kinds PART (an exchange's part: its number; an extra's message to its core
rank: exchange 255), TOTAL (a core rank's total to its extra: exchange 254)
and DONE (as :class:`~.group.PeerGroup`'s: its sender has finished).
"""
from __future__ import annotations

import logging
import struct
import threading
import time
from typing import Callable, Optional

from .endpoint import ReliableEndpoint
from .errors import PeerStalledError, TransportError
from .group import DONE_KIND, leave_neighbours, named_peers

__all__ = ["TreeGroup", "exchange_partners", "contributors"]

logger = logging.getLogger(__name__)

_FRAME = struct.Struct("!BIQBB")
_PART, _TOTAL = 8, 9
_FROM_EXTRA = 255  # the exchange number of an extra's message to its core rank
_FOR_EXTRA = 254   # and of its core rank's total to it
_DONE_BYTE = bytes([DONE_KIND])
_POLL_SLICE = 0.05
#: The origin :meth:`TreeGroup.poll` gives every total (the whole group's).
TOTAL_ORIGIN = 0

Merge = Callable[[list], bytes]


def _core(world_size: int) -> int:
    return 1 << (world_size.bit_length() - 1)


def exchange_partners(rank: int, world_size: int) -> tuple:
    """``(paired, partners)`` of ``rank``: the rank it is paired with outside
    the exchanges (an extra's core rank, a core rank's extra, or None) and
    its partner in each exchange, in order (none for an extra)."""
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"Expect 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
    core = _core(world_size)
    if rank >= core:
        return rank - core, []
    paired = rank + core if rank + core < world_size else None
    return paired, [rank ^ (1 << j) for j in range(core.bit_length() - 1)]


def contributors(rank: int, world_size: int, exchanges: int) -> list[int]:
    """The ranks whose messages a core ``rank``'s part holds after
    ``exchanges`` exchanges (its block of ``2**exchanges`` core ranks and
    their extras), ascending; an extra's own part holds its own."""
    core = _core(world_size)
    if rank >= core:
        return [rank]
    first = (rank >> exchanges) << exchanges
    block = range(first, first + (1 << exchanges))
    return sorted([*block, *(r + core for r in block if r + core < world_size)])


class _Iteration:
    """One iteration's sum on this rank: the exchange it is at and what it holds."""

    __slots__ = ("exchange", "part", "live")

    def __init__(self, exchange: int, part, live: bool):
        self.exchange, self.part, self.live = exchange, part, live


class TreeGroup:
    """One rank of the sums (the module doc): publish a message per
    iteration, get one total per iteration.

    Parameters
    ----------
    rank, world_size, endpoint
        As for :class:`~.group.PeerGroup`; the endpoint must know this
        rank's partners (:func:`exchange_partners`).
    merge : callable(list of bytes) -> bytes
        The sum of two payloads (the part of the lower ranks first), as
        bytes.  Called on the endpoint's I/O thread as a partner's part
        arrives (:meth:`ReliableEndpoint.deliver_to`: an exchange takes no
        thread switch, and goes on while the training thread computes), or
        inside :meth:`publish`; it must raise nothing but ValueError for a
        bad payload (raised again in the training thread).

    Notes
    -----
    One thread (the training loop) calls the methods; the group's lock
    keeps it and the I/O thread apart.  :meth:`poll` returns
    ``(TOTAL_ORIGIN, payload)`` -- or ``(TOTAL_ORIGIN, iteration, payload)``
    when ``numbered`` -- in iteration order.
    """

    def __init__(self, rank: int, world_size: int, endpoint: ReliableEndpoint, merge: Merge):
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"Expect 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
        if endpoint.rank != rank:
            raise ValueError(f"Expect the endpoint of rank {rank}, got one of rank {endpoint.rank}")
        if not callable(merge):
            raise TypeError(f"Expect merge to be a callable(list of bytes) -> bytes, got {merge!r}")
        self.rank, self.world_size, self.endpoint = rank, world_size, endpoint
        self._merge = merge
        self.extra = rank >= _core(world_size)
        self.paired, self.partners = exchange_partners(rank, world_size)
        self.neighbours = sorted({*self.partners, *([self.paired] if self.paired is not None else [])})
        missing = sorted(set(self.neighbours) - set(endpoint.peers))
        if missing:
            raise ValueError(f"Expect the endpoint to know peer ranks {missing} (call endpoint.set_peers first)")
        # Where each frame of an iteration comes from: the extra's message, each exchange's partner, the total.
        self._expect = ({_FROM_EXTRA: self.paired} if self.paired is not None and not self.extra else {})
        self._expect.update(enumerate(self.partners))
        self._own: dict[int, bytes] = {}
        self._published = 0
        self._own_end: Optional[int] = None   # iterations this rank published, once it finished
        self._frames: dict = {}                # (iteration, exchange) -> (payload, live), arrived, not yet used
        self._running: dict[int, _Iteration] = {}
        self._started = 0                      # iterations begun: every one below is running or complete
        self._complete = 0                     # iterations complete: every one below
        self._totals: dict[int, bytes] = {}    # complete, not yet handed out
        self._delivered = 0                    # totals handed out: every iteration below
        self._total_end: Optional[int] = None  # the whole group's iterations
        self._finished = False
        self._done: set[int] = set()
        self._counts = dict(published=0, delivered=0, merged=0, forwarded=0, duplicates_dropped=0, malformed=0)
        #: Thread CPU seconds spent in ``merge``.
        self.merge_seconds = 0.0
        self._cv = threading.Condition()
        self._deferred: list = []              # (rank, frame) the I/O thread found no window for
        self._error: Optional[BaseException] = None
        endpoint.deliver_to(self._on_message)

    # ------------------------------------------------------------------ public API
    def publish(self, payload) -> None:
        """This rank's message of its next iteration (may be empty)."""
        with self._cv:
            if self._finished:
                raise TransportError("TreeGroup.publish after finish(): use a new group per epoch")
            self._raise_error()
            self._own[self._published] = bytes(payload)
            self._published += 1
            self._counts["published"] += 1
            self._advance()
        self._send_deferred()

    def poll(self, timeout: float = 0.0, numbered: bool = False) -> list:
        """The totals that are due, in iteration order, each once (waiting up
        to ``timeout`` seconds for what the I/O thread completes when none is)."""
        out: list = []
        self._receive(timeout if timeout > 0 else None, out)
        return out if numbered else [(origin, payload) for origin, _, payload in out]

    def behind(self, count: int) -> list[int]:
        """The ranks this rank waits for while fewer than ``count`` totals
        (or fewer than the group's iterations, when it has ended) have been
        handed out: those whose messages the missing part carries; empty
        when none."""
        with self._cv:
            end = count if self._total_end is None else min(count, self._total_end)
            return [] if self._delivered >= end else (self._waiting_on() or [self.rank])  # own: not published yet

    def incomplete(self) -> list[int]:
        """As :meth:`behind` for every iteration of the group."""
        with self._cv:
            if self._total_end is not None and self._delivered >= self._total_end:
                return []
            return self._waiting_on() or [self.rank]

    def finish(self, stall_timeout: float, numbered: bool = False) -> list:
        """End this rank's publication; wait for every total of the group and
        for this rank's sends to be acknowledged.  Returns the totals handed
        out since the last :meth:`poll`.

        Raises
        ------
        PeerStalledError
            Naming the ranks waited for when ``stall_timeout`` passes first.
        """
        with self._cv:
            if self._finished:
                raise TransportError("TreeGroup.finish called twice")
            self._finished = True
            self._own_end = self._published
            self._advance()
        deadline = time.monotonic() + stall_timeout
        out: list = []
        self._receive(None, out)
        while self.incomplete():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise self._stalled(f"the group's sums incomplete after {stall_timeout:g} s "
                                    f"({self._delivered} of {self._total_end if self._total_end is not None else '?'} "
                                    f"iterations)")
            self._receive(min(remaining, _POLL_SLICE), out)
        self.endpoint.flush(max(0.0, deadline - time.monotonic()))
        logger.debug("rank %d finished: %s", self.rank, self._counts)
        return out if numbered else [(origin, payload) for origin, _, payload in out]

    def leave(self, stall_timeout: float) -> None:
        """After :meth:`finish`: leave with the partners, as :meth:`PeerGroup.leave`."""
        if not self._finished:
            raise TransportError("TreeGroup.leave before finish()")
        leave_neighbours(self.rank, self.endpoint, self.neighbours, self._done, stall_timeout,
                         lambda seconds: self._receive(seconds, []))

    def stats(self) -> dict[str, int]:
        """Counters: ``published``, ``delivered`` (totals handed out),
        ``merged`` (merges of two payloads), ``forwarded`` (totals sent to an
        extra), ``duplicates_dropped``, ``malformed``."""
        with self._cv:
            return dict(self._counts)

    # ------------------------------------------------------------------ internals
    def _receive(self, timeout: Optional[float], out: list) -> None:
        """Send what the I/O thread left, wait up to ``timeout`` for any frame
        when no total is due, and hand out the totals that are."""
        self._send_deferred()
        with self._cv:
            self._raise_error()
            if timeout and self._delivered not in self._totals:
                self._cv.wait(timeout)  # the I/O thread wakes it for a total, the end, a DONE or an error
                self._raise_error()
            self._hand_out(out)

    def _progress(self) -> tuple:
        """What the training thread waits for: a total, the group's end, a partner's DONE, an error."""
        return len(self._totals), self._total_end, len(self._done), self._error

    def _on_message(self, src: int, frame) -> None:
        """The endpoint's handler: a frame, on the I/O thread."""
        with self._cv:
            before = self._progress()
            try:
                if self._error is None:
                    self._accept(src, frame)
                    self._advance()
            except BaseException as exc:  # raised again in the training thread
                self._error = exc
            if self._progress() != before:  # not once per exchange: a wake is a thread switch
                self._cv.notify_all()

    def _raise_error(self) -> None:
        if self._error is not None:
            raise self._error

    def _send_deferred(self) -> None:
        """Send the frames the I/O thread had no window for (blocking, outside the lock)."""
        while self._deferred:
            with self._cv:
                deferred, self._deferred = self._deferred, []
            for rank, frame in deferred:
                self.endpoint.send(rank, frame)

    def _hand_out(self, out: list) -> None:
        while self._delivered in self._totals:
            out.append((TOTAL_ORIGIN, self._delivered, self._totals.pop(self._delivered)))
            self._delivered += 1
            self._counts["delivered"] += 1

    def _send(self, rank: int, kind: int, iteration: int, exchange: int, part, live: bool) -> None:
        header = _FRAME.pack(kind, self.rank, iteration, exchange, live)
        frame = header + part if part else header
        # Never blocking: the lock is held, and the I/O thread must not wait for the acks it reads.
        if self._deferred or not self.endpoint.send(rank, frame, block=False):
            self._deferred.append((rank, frame))

    def _send_part(self, i: int, state: _Iteration) -> None:
        """On entering exchange ``state.exchange``: this rank's part to that exchange's partner."""
        if state.exchange < len(self.partners):
            self._send(self.partners[state.exchange], _PART, i, state.exchange, state.part, state.live)

    def _combine(self, lower, higher):
        """The sum of two parts (``None``/``b""``: nothing), merged only when both carry bytes."""
        if lower and higher:
            began = time.thread_time()
            merged = bytes(self._merge([lower, higher]))
            self.merge_seconds += time.thread_time() - began
            self._counts["merged"] += 1
            return merged
        return lower or higher or b""

    def _begin(self) -> bool:
        """Begin the next iteration if this rank's part of it is known: its
        message, or -- once it finished -- nothing (an iteration past its own
        end begins only after every earlier one completed and none was the
        group's end)."""
        i = self._started
        if i < self._published:
            own, live = self._own.pop(i), True
        elif self._own_end is not None and self._complete == i and self._total_end is None:
            own, live = None, False
        else:
            return False
        self._started += 1
        if self.extra:
            self._send(self.paired, _PART, i, _FROM_EXTRA, own, live)
            self._running[i] = _Iteration(_FOR_EXTRA, None, False)
        elif self.paired is not None:
            self._running[i] = _Iteration(_FROM_EXTRA, own, live)
        else:
            self._running[i] = state = _Iteration(0, own, live)
            self._send_part(i, state)
        return True

    def _step(self, i: int, state: _Iteration) -> bool:
        """Take iteration ``i`` as far as its frames allow; True when it completed."""
        frames = self._frames
        if state.exchange == _FOR_EXTRA:  # an extra: the total from its core rank
            frame = frames.pop((i, _FOR_EXTRA), None)
            return frame is not None and self._completed(i, *frame)
        if state.exchange == _FROM_EXTRA:
            frame = frames.pop((i, _FROM_EXTRA), None)
            if frame is None:
                return False
            state.part, state.live, state.exchange = self._combine(state.part, frame[0]), state.live or frame[1], 0
            self._send_part(i, state)
        while state.exchange < len(self.partners):
            frame = frames.pop((i, state.exchange), None)
            if frame is None:
                return False
            theirs = frame[0]
            lower, higher = (state.part, theirs) if self.rank < self.partners[state.exchange] else (theirs, state.part)
            state.part, state.live = self._combine(lower, higher), state.live or frame[1]
            state.exchange += 1
            self._send_part(i, state)
        if self.paired is not None:
            self._send(self.paired, _TOTAL, i, _FOR_EXTRA, state.part, state.live)
            self._counts["forwarded"] += 1
        return self._completed(i, state.part, state.live)

    def _completed(self, i: int, part, live: bool) -> bool:
        if live:
            self._totals[i] = bytes(part or b"")
        elif self._total_end is None:
            self._total_end = i  # no rank had iteration i: every rank learns it from the same exchanges
        return True

    def _advance(self) -> None:
        """Begin what can begin, and take every running iteration as far as it goes."""
        while True:
            began = self._begin()
            for i in sorted(self._running):
                if self._step(i, self._running[i]):
                    del self._running[i]
            while self._complete < self._started and self._complete not in self._running:
                self._complete += 1
            if not began and not (self._own_end is not None and self._total_end is None
                                  and self._complete == self._started):
                return

    def _accept(self, src: int, frame: bytes) -> None:
        if frame[:1] == _DONE_BYTE:
            if src in self.neighbours:
                self._done.add(src)
            return
        if len(frame) < _FRAME.size:
            self._malformed(src, "short frame")
            return
        kind, sender, i, exchange, live = _FRAME.unpack_from(frame)
        if sender != src:
            self._malformed(src, f"kind {kind} names sender {sender}")
            return
        if kind == _TOTAL:
            wanted = self.paired if self.extra and exchange == _FOR_EXTRA else None
        else:
            wanted = self._expect.get(exchange) if kind == _PART else None
        if wanted is None or wanted != src or live > 1:
            self._malformed(src, f"kind {kind} of exchange {exchange} from a rank that is not its partner in it")
            return
        key = (i, exchange)
        state = self._running.get(i)
        if (i < self._complete or key in self._frames
                or (state is not None and state.exchange != _FROM_EXTRA and exchange != _FOR_EXTRA
                    and (exchange == _FROM_EXTRA or exchange < state.exchange))):
            self._counts["duplicates_dropped"] += 1
            return
        self._frames[key] = (memoryview(frame)[_FRAME.size:], bool(live))

    def _waiting_on(self) -> list[int]:
        """Whom the next total waits for: the ranks whose messages the part it
        waits for carries (an extra's own, or a partner's block); empty while
        this rank's own part is not known (not published)."""
        i = self._delivered
        state = self._running.get(i)
        if state is None:
            return []  # not begun: this rank's own message; or complete, handed out at the next poll
        if state.exchange in (_FOR_EXTRA, _FROM_EXTRA):
            return [self.paired]  # an extra's total comes from its core rank; a core rank waits for its extra's part
        partner = self.partners[state.exchange]
        return contributors(partner, self.world_size, state.exchange)

    def _stalled(self, what: str) -> PeerStalledError:
        with self._cv:
            ranks = self._waiting_on() or [self.rank]
        peers = self.endpoint.peers
        pending = self.endpoint.pending()
        hint = f"; unacked messages to partners {pending}" if pending else ""
        return PeerStalledError(f"rank {self.rank}: {what}: waiting for the part of rank(s) "
                                f"{named_peers(ranks, peers)}{hint}", ranks, [peers.get(r) for r in ranks])

    def _malformed(self, src: int, what: str) -> None:
        self._counts["malformed"] += 1
        logger.warning("rank %d: dropped malformed sum frame from rank %d (%s)", self.rank, src, what)
