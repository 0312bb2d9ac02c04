"""All-to-all publication of messages over a :class:`ReliableEndpoint`.

A :class:`PeerGroup` is one barrier stage's (one epoch's) exchange: every rank
publishes its messages, polls the others', and calls :meth:`PeerGroup.finish`
once at the end: ``PLAIN`` (DL4J's name), each message straight to every
other rank (W - 1 sends).  The other topology, ``TREE``, sums the messages
on their way (:class:`~sparkavg.transport.tree.TreeGroup`, by recursive
doubling); DL4J's ``MESH`` relay tree, which forwarded every message
unmerged, is gone (summing applies one message per rank and iteration).

Group frame inside each endpoint message (network byte order)::

    kind u8 (1 = MSG, 2 = END, 3 = DONE) | origin u32 | value u64 | payload

``value`` is the origin's message number for MSG, and the number of
messages the origin published for END. Messages are suppressed by
``(origin, number)`` so each is returned exactly once.  DONE (to
neighbours only) says that its sender has finished: it has
every message and every acknowledgement it needs, so its neighbours may
stop acknowledging it (:meth:`PeerGroup.leave`).
"""
from __future__ import annotations

import enum
import logging
import struct
import time
from typing import Callable

from .endpoint import ReliableEndpoint
from .errors import PeerStalledError, TransportError
from .limits import LEAVE_GRACE

__all__ = ["PeerGroup", "Topology", "wait_for_peers", "named_peers", "DONE_KIND"]

logger = logging.getLogger(__name__)

_FRAME = struct.Struct("!BIQ")
_MSG, _END, _DONE = 1, 2, 3
#: The DONE frame's kind, shared with :class:`~.tree.TreeGroup` (``PeerGroup.leave``'s protocol).
DONE_KIND = _DONE
_POLL_SLICE = 0.05   # finish() wakes this often to check its deadline


def named_peers(ranks, peers: dict) -> str:
    """``"rank 1 at 10.0.0.2:4000, rank 9 (address unknown)"``: ``ranks`` as an
    operator looks them up, by the peer table ``peers`` (``{rank: (host, port)}``;
    a rank this one never talks to may not be in it)."""
    return ", ".join(f"rank {r} at {peers[r][0]}:{peers[r][1]}" if peers.get(r) else f"rank {r} (address unknown)"
                     for r in ranks)


def wait_for_peers(group, receive: Callable[[float], None], count: int, stall_timeout: float) -> None:
    """Call ``receive(timeout)`` until every origin of ``group`` has published
    ``count`` messages, or ended with fewer (a bounded-staleness wait: a rank
    runs at most ``staleness`` iterations ahead of its slowest peer).

    Raises
    ------
    PeerStalledError
        Naming the origins still behind and their addresses, when some are
        ``stall_timeout`` seconds after the first look: a peer lost with its
        process, host or link.
    """
    deadline = None
    while True:
        behind = group.behind(count)
        if not behind:
            return
        if deadline is None:
            deadline = time.monotonic() + stall_timeout
        elif time.monotonic() > deadline:
            peers = group.endpoint.peers
            raise PeerStalledError(f"rank {group.rank}: peer {named_peers(behind, peers)} sent fewer than {count} "
                                   f"iterations' messages within {stall_timeout:g} s: lost, or stalled", behind,
                                   [peers.get(r) for r in behind])
        receive(_POLL_SLICE)


class Topology(enum.Enum):
    """How messages travel between ranks (after DL4J's ``MeshBuildMode``; its
    ``MESH`` loads as ``TREE``: :mod:`sparkavg.spark.upgrade`)."""

    #: Every rank sends to every other rank and applies the W - 1 it receives.
    PLAIN = "plain"
    #: Each iteration's messages summed on the way, every rank its own tree of merges (recursive doubling,
    #: :class:`~sparkavg.transport.tree.TreeGroup`): one message per rank and iteration.
    TREE = "tree"


class _OriginState:
    """What has been received from one origin: message numbers seen, END count."""

    __slots__ = ("low", "ahead", "end_count")

    def __init__(self):
        self.low = 0            # every number below has been seen
        self.ahead: set[int] = set()
        self.end_count = None   # from the END marker

    def first_time(self, number: int) -> bool:
        if number < self.low or number in self.ahead:
            return False
        if number == self.low:
            self.low += 1
            while self.low in self.ahead:
                self.ahead.remove(self.low)
                self.low += 1
        else:
            self.ahead.add(number)
        return True

    @property
    def received(self) -> int:
        """Distinct messages seen."""
        return self.low + len(self.ahead)

    @property
    def complete(self) -> bool:
        return self.end_count is not None and self.received == self.end_count



def leave_neighbours(rank: int, endpoint: ReliableEndpoint, neighbours, done, stall_timeout: float,
                     receive: Callable[[float], None]) -> None:
    """Send every neighbour DONE, ``receive(seconds)`` until each one's DONE
    is in ``done`` (raising :class:`PeerStalledError` naming those missing
    after ``stall_timeout``), then flush for up to :data:`~.limits.LEAVE_GRACE`
    seconds (or four retransmit timeouts, if longer): a neighbour still
    waiting in its own ``leave`` gets our DONE unless every retransmission
    of it was lost -- it would otherwise wait its whole stall timeout and
    fail the stage -- and the flush ends at the first ack; it runs out only
    when the neighbour had left before acking (``PeerGroup``'s and ``TreeGroup``'s ``leave``)."""
    deadline = time.monotonic() + stall_timeout
    frame = _FRAME.pack(_DONE, rank, 0)
    for r in neighbours:
        endpoint.send(r, frame)
    while True:
        waiting = [r for r in neighbours if r not in done]
        if not waiting:
            break
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            peers = endpoint.peers
            raise PeerStalledError(f"rank {rank}: neighbour {named_peers(waiting, peers)} did not finish "
                                   f"within {stall_timeout:g} s", waiting, [peers.get(r) for r in waiting])
        receive(min(remaining, _POLL_SLICE))
    # Not a couple of retransmit timeouts alone: a small one (the tests' 0.05 s) leaves room for one retransmission
    # at most, and a lost DONE then costs the last neighbour its stall timeout (and the stage a restart).
    grace = min(max(0.0, deadline - time.monotonic()), max(LEAVE_GRACE, 4 * endpoint.limits.retransmit_timeout))
    try:
        endpoint.flush(grace)
    except PeerStalledError:
        logger.debug("rank %d: a DONE was not acknowledged within %.2f s; the neighbours left", rank, grace)


class PeerGroup:
    """Publish this rank's messages to all ranks and collect theirs, once each.

    Parameters
    ----------
    rank : int
        This rank, ``endpoint.rank``.
    world_size : int
        Number of ranks; ranks are ``0 .. world_size - 1``.
    endpoint : ReliableEndpoint
        Bound, with ``set_peers`` called for every other rank.
    topology : Topology, default Topology.PLAIN
        ``PLAIN`` (``TREE`` is a :class:`~sparkavg.transport.tree.TreeGroup`).

    Notes
    -----
    Not thread-safe: call it from one thread (the training loop). One group per endpoint lifetime; after
    :meth:`finish` it is spent. Messages are returned in arrival order; that
    of one origin may differ from its publication order.
    """

    def __init__(self, rank: int, world_size: int, endpoint: ReliableEndpoint,
                 topology: Topology = Topology.PLAIN):
        if not isinstance(topology, Topology):
            raise TypeError(f"Expect topology to be a Topology, got {topology!r}")
        if topology is Topology.TREE:
            raise ValueError("Expect PLAIN for a PeerGroup, got TREE: the tree that merges is a TreeGroup")
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"Expect 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
        if endpoint.rank != rank:
            raise ValueError(f"Expect the endpoint of rank {rank}, got one of rank {endpoint.rank}")
        self.rank = rank
        self.world_size = world_size
        self.endpoint = endpoint
        self.topology = topology
        self.neighbours = [r for r in range(world_size) if r != rank]
        missing = sorted(set(self.neighbours) - set(endpoint.peers))
        if missing:
            raise ValueError(f"Expect the endpoint to know peer ranks {missing} "
                             f"(call endpoint.set_peers first)")
        self._origins = {r: _OriginState() for r in range(world_size) if r != rank}
        self._published = 0
        self._finished = False
        self._done: set[int] = set()  # neighbours that sent DONE
        self._counts = dict(published=0, delivered=0, duplicates_dropped=0, malformed=0)

    # ------------------------------------------------------------------ public API
    def publish(self, payload) -> None:
        """Send this rank's next message to every other rank.

        Parameters
        ----------
        payload : bytes-like
            Opaque message (e.g. an encoded update), at most the endpoint's
            ``max_message_bytes`` minus 13 bytes.

        Raises
        ------
        PeerStalledError
            If a neighbour's send window stays full (see ``ReliableEndpoint.send``).
        """
        if self._finished:
            raise TransportError("PeerGroup.publish after finish(): use a new group per epoch")
        frame = _FRAME.pack(_MSG, self.rank, self._published) + bytes(payload)
        self._published += 1
        self._counts["published"] += 1
        for r in self.neighbours:
            self.endpoint.send(r, frame)

    def poll(self, timeout: float = 0.0, numbered: bool = False) -> list:
        """Return the messages of other ranks that arrived, each exactly once.

        Parameters
        ----------
        timeout : float, default 0.0
            Seconds to wait for the first message if none is there yet.
        numbered : bool, default False
            Also return each message's number: its position in its origin's
            publication order (0, 1, ...), to apply messages in an order that
            does not depend on when they arrived.

        Returns
        -------
        list of (int, bytes), or of (int, int, bytes) when ``numbered``
            ``(origin rank, payload)`` or ``(origin rank, number, payload)``
            in arrival order.
        """
        out: list[tuple[int, int, bytes]] = []
        first = self.endpoint.receive(timeout) if timeout > 0 else None
        if first is not None:
            self._accept(first[0], first[1], out)
        for src, frame in self.endpoint.poll():
            self._accept(src, frame, out)
        return out if numbered else [(origin, payload) for origin, _, payload in out]

    def finish(self, stall_timeout: float, numbered: bool = False) -> list:
        """End this rank's publication and wait for everyone else's.

        Sends an END marker carrying the number of messages this rank
        published, then waits until every other origin's END has arrived
        together with exactly that many messages, and until this rank's own
        sends (and relays) are acknowledged.

        Parameters
        ----------
        stall_timeout : float
            Seconds to wait in total.
        numbered : bool, default False
            As for :meth:`poll`.

        Returns
        -------
        list of (int, bytes), or of (int, int, bytes) when ``numbered``
            The messages that arrived since the last :meth:`poll`.

        Raises
        ------
        PeerStalledError
            Naming the origins still incomplete (``ranks``) when time is up,
            or the unresponsive neighbours if acks are missing.

        Notes
        -----
        Keep the endpoint open until every rank has returned from
        ``finish`` (e.g. ``BarrierTaskContext.barrier()``): peers may still
        need its acks.
        """
        if self._finished:
            raise TransportError("PeerGroup.finish called twice")
        self._finished = True
        deadline = time.monotonic() + stall_timeout
        frame = _FRAME.pack(_END, self.rank, self._published)
        for r in self.neighbours:
            self.endpoint.send(r, frame)
        out: list[tuple[int, int, bytes]] = []
        while True:
            incomplete = self.incomplete()
            if not incomplete:
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise self._incomplete_error(incomplete, stall_timeout)
            item = self.endpoint.receive(min(remaining, _POLL_SLICE))
            if item is not None:
                self._accept(item[0], item[1], out)
                for src, f in self.endpoint.poll():
                    self._accept(src, f, out)
        self.endpoint.flush(max(0.0, deadline - time.monotonic()))
        logger.debug("rank %d finished: %s", self.rank, self._counts)
        return out if numbered else [(origin, payload) for origin, _, payload in out]

    def leave(self, stall_timeout: float) -> None:
        """After :meth:`finish`: leave together with the neighbours, without a barrier.

        A rank that has finished may still owe its neighbours
        acknowledgements (of retransmissions, or relays it got late).  It
        sends DONE to each neighbour and keeps its endpoint answering
        until every neighbour's DONE has arrived -- then nobody waits for
        its acknowledgements -- and until its own DONEs are acknowledged
        (briefly: a neighbour that has left answers no more).  Replaces a
        Spark ``barrier()`` after the epoch, which polls once a second.

        Raises
        ------
        PeerStalledError
            Naming the neighbours whose DONE did not come within ``stall_timeout``.
        """
        if not self._finished:
            raise TransportError("PeerGroup.leave before finish()")
        ignored: list = []

        def receive(seconds: float) -> None:
            item = self.endpoint.receive(seconds)
            if item is not None:
                self._accept(item[0], item[1], ignored)
                for src, f in self.endpoint.poll():
                    self._accept(src, f, ignored)

        leave_neighbours(self.rank, self.endpoint, self.neighbours, self._done, stall_timeout, receive)

    def behind(self, count: int) -> list[int]:
        """Origins of which a message numbered below ``count`` has not
        arrived here yet -- or below their END's count, when they ended
        with fewer (a bounded-staleness wait polls until none)."""
        return [r for r, s in self._origins.items()
                if s.low < (count if s.end_count is None else min(count, s.end_count))]

    def incomplete(self) -> list[int]:
        """Origins whose END or some of whose messages have not arrived yet."""
        return [r for r, s in self._origins.items() if not s.complete]

    def stats(self) -> dict[str, int]:
        """Counters: ``published``, ``delivered``, ``duplicates_dropped``, ``malformed``."""
        return dict(self._counts)

    # ------------------------------------------------------------------ internals
    def _incomplete_error(self, incomplete: list[int], stall_timeout: float) -> PeerStalledError:
        details = []
        peers = self.endpoint.peers
        for r in incomplete:
            s = self._origins[r]
            expected = "END missing" if s.end_count is None else f"expected {s.end_count}"
            details.append(f"{named_peers([r], peers)} ({s.received} received, {expected})")
        pending = self.endpoint.pending()
        hint = f"; unacked messages to neighbours {pending}" if pending else ""
        message = (f"rank {self.rank}: origin rank(s) {incomplete} incomplete after "
                   f"{stall_timeout:g} s: " + "; ".join(details) + hint)
        return PeerStalledError(message, incomplete, [peers.get(r) for r in incomplete])

    def _accept(self, src: int, frame: bytes, out: list) -> None:
        if len(frame) < _FRAME.size:
            self._malformed(src, "short frame")
            return
        kind, origin, value = _FRAME.unpack_from(frame)
        if kind == _DONE and origin == src and src in self.neighbours:
            self._done.add(src)
            return
        state = self._origins.get(origin)
        if state is None or kind not in (_MSG, _END):
            self._malformed(src, f"kind {kind}, origin {origin}")
            return
        if kind == _MSG:
            if not state.first_time(value):
                self._counts["duplicates_dropped"] += 1
                return
            out.append((origin, value, frame[_FRAME.size:]))
            self._counts["delivered"] += 1
        else:
            if state.end_count is not None:
                self._counts["duplicates_dropped"] += 1
                return
            state.end_count = value

    def _malformed(self, src: int, what: str) -> None:
        self._counts["malformed"] += 1
        logger.warning("rank %d: dropped malformed group frame from rank %d (%s)", self.rank, src, what)
