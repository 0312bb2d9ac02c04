"""Every iteration's messages summed on their way up a tree of ranks, the sum
sent back down: one message per rank and iteration, whatever the world size
(``Topology.TREE``; SparCML's sparse all-reduce, Renggli et al. SC 2019, as a
reduce followed by a broadcast).

Ranks form a tree of fan-out :data:`TREE_FANOUT` (parent of ``r`` is
``(r - 1) // fanout``, :func:`~.group.tree_neighbours`).  For each iteration
``i`` a rank merges its own message of ``i`` with its children's -- one
message per child subtree -- as soon as all are there, in the fixed order
own, then children by rank, and sends the result up; the root's merge is the
total of iteration ``i``, which goes down unchanged, relay by relay.  Every
rank is handed the totals in iteration order, each once: the same payloads
in the same order on every rank.  What a merge is (summing threshold
messages: :func:`sparkavg.ops.merge_messages`) is the caller's; payloads
are opaque bytes here.

Ranks may publish different numbers of messages: END (up, then down) says
how many iterations a subtree, then the whole group, has; a subtree that
ended contributes nothing to later iterations.  A rank whose children's
messages or parent's totals stop coming waits ``stall_timeout`` and names
who it waits for: the child's whole subtree, or the parent.

Frames (network byte order), inside each endpoint message::

    kind u8 | sender u32 | value u64 | payload

kinds UP and DOWN (``value``: the iteration; the payload: a subtree's merge
or the total), END_UP and END_DOWN (``value``: iterations), DONE (as
:class:`~.group.PeerGroup`'s: its sender has finished).
"""
from __future__ import annotations

import logging
import struct
import time
from typing import Callable, Optional

from .endpoint import ReliableEndpoint
from .errors import PeerStalledError, TransportError
from .group import DONE_KIND, leave_neighbours, named_peers, tree_neighbours
from .limits import TREE_FANOUT

__all__ = ["TreeGroup", "subtree"]

logger = logging.getLogger(__name__)

_FRAME = struct.Struct("!BIQ")
_UP, _DOWN, _END_UP, _END_DOWN = 4, 5, 6, 7
_POLL_SLICE = 0.05
#: The origin :meth:`TreeGroup.poll` gives every total (the whole group's, handed down from the root).
TOTAL_ORIGIN = 0

Merge = Callable[[list], bytes]


def subtree(rank: int, world_size: int, fanout: int = TREE_FANOUT) -> list[int]:
    """``rank`` and every rank below it in the tree, ascending."""
    out, todo = [], [rank]
    while todo:
        r = todo.pop()
        out.append(r)
        todo.extend(range(r * fanout + 1, min(r * fanout + 1 + fanout, world_size)))
    return sorted(out)


class TreeGroup:
    """One rank of the tree (the module doc): publish a message per
    iteration, get one total per iteration.

    Parameters
    ----------
    rank, world_size, endpoint
        As for :class:`~.group.PeerGroup`; the endpoint must know this
        rank's parent and children.
    merge : callable(list of bytes) -> bytes
        The sum of a list of payloads (own first, then the children's by
        rank; an empty payload or None where a subtree sent nothing or has
        ended), as bytes (``b""`` for nothing).  Called on this rank's
        thread, inside :meth:`publish`, :meth:`poll` and :meth:`finish`.
    fanout : int, default TREE_FANOUT

    Notes
    -----
    Not thread-safe: one thread (the training loop) calls it; relays merge
    and forward while it polls, so poll regularly.  :meth:`poll` returns
    ``(TOTAL_ORIGIN, payload)`` -- or ``(TOTAL_ORIGIN, iteration, payload)``
    when ``numbered`` -- in iteration order.
    """

    def __init__(self, rank: int, world_size: int, endpoint: ReliableEndpoint, merge: Merge,
                 fanout: int = TREE_FANOUT):
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"Expect 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
        if endpoint.rank != rank:
            raise ValueError(f"Expect the endpoint of rank {rank}, got one of rank {endpoint.rank}")
        if not callable(merge):
            raise TypeError(f"Expect merge to be a callable(list of bytes) -> bytes, got {merge!r}")
        self.rank, self.world_size, self.endpoint, self.fanout = rank, world_size, endpoint, fanout
        self._merge = merge
        neighbours = tree_neighbours(rank, world_size, fanout)
        self.parent: Optional[int] = neighbours[0] if rank else None
        self.children: list[int] = neighbours[1:] if rank else neighbours
        self.neighbours = neighbours
        missing = sorted(set(neighbours) - set(endpoint.peers))
        if missing:
            raise ValueError(f"Expect the endpoint to know peer ranks {missing} (call endpoint.set_peers first)")
        self._own: dict[int, bytes] = {}
        self._published = 0
        self._own_end: Optional[int] = None            # iterations this rank published, once it finished
        self._up = {c: {} for c in self.children}      # child -> {iteration: its subtree's merge}
        self._child_end = {c: None for c in self.children}
        self._next_up = 0                               # the next iteration this subtree merges
        self._end_sent = False
        self._totals: dict[int, bytes] = {}             # arrived, not yet handed out
        self._delivered = 0                             # totals handed out: every iteration below
        self._total_end: Optional[int] = None           # the whole group's iterations (END_DOWN)
        self._finished = False
        self._done: set[int] = set()
        self._counts = dict(published=0, delivered=0, merged=0, forwarded=0, duplicates_dropped=0, malformed=0)
        #: Thread CPU seconds spent in ``merge``.
        self.merge_seconds = 0.0

    # ------------------------------------------------------------------ public API
    def publish(self, payload) -> None:
        """This rank's message of its next iteration (may be empty)."""
        if self._finished:
            raise TransportError("TreeGroup.publish after finish(): use a new group per epoch")
        self._own[self._published] = bytes(payload)
        self._published += 1
        self._counts["published"] += 1
        self._advance()

    def poll(self, timeout: float = 0.0, numbered: bool = False) -> list:
        """The totals that are due, in iteration order, each once (waiting up
        to ``timeout`` seconds for the first datagram when none is)."""
        out: list = []
        self._receive(timeout if timeout > 0 else None, out)
        return out if numbered else [(origin, payload) for origin, _, payload in out]

    def behind(self, count: int) -> list[int]:
        """The ranks this rank waits for while fewer than ``count`` totals
        (or fewer than the group's iterations, when it has ended) have been
        handed out: a child's whole subtree, or its parent; empty when none."""
        end = count if self._total_end is None else min(count, self._total_end)
        return [] if self._delivered >= end else (self._waiting_on() or [self.rank])  # own: not handed out yet

    def incomplete(self) -> list[int]:
        """As :meth:`behind` for every iteration of the group."""
        if self._total_end is not None and self._delivered >= self._total_end:
            return []
        return self._waiting_on() or [self.rank]  # own: merged, not handed out yet

    def finish(self, stall_timeout: float, numbered: bool = False) -> list:
        """End this rank's publication; wait for every total of the group and
        for this rank's sends to be acknowledged.  Returns the totals handed
        out since the last :meth:`poll`.

        Raises
        ------
        PeerStalledError
            Naming the ranks waited for (a child's subtree, or the parent)
            when ``stall_timeout`` passes first.
        """
        if self._finished:
            raise TransportError("TreeGroup.finish called twice")
        self._finished = True
        self._own_end = self._published
        deadline = time.monotonic() + stall_timeout
        out: list = []
        self._advance()
        self._hand_out(out)
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
        """After :meth:`finish`: leave with the neighbours, as :meth:`PeerGroup.leave`."""
        if not self._finished:
            raise TransportError("TreeGroup.leave before finish()")
        leave_neighbours(self.rank, self.endpoint, self.neighbours, self._done, stall_timeout,
                         lambda seconds: self._receive(seconds, []))

    def stats(self) -> dict[str, int]:
        """Counters: ``published``, ``delivered`` (totals handed out),
        ``merged`` (merges of two or more payloads), ``forwarded`` (totals
        passed down), ``duplicates_dropped``, ``malformed``."""
        return dict(self._counts)

    # ------------------------------------------------------------------ internals
    def _receive(self, timeout: Optional[float], out: list) -> None:
        first = self.endpoint.receive(timeout) if timeout else None
        if first is not None:
            self._accept(*first)
        for src, frame in self.endpoint.poll():
            self._accept(src, frame)
        self._advance()
        self._hand_out(out)

    def _hand_out(self, out: list) -> None:
        while self._delivered in self._totals:
            out.append((TOTAL_ORIGIN, self._delivered, self._totals.pop(self._delivered)))
            self._delivered += 1
            self._counts["delivered"] += 1

    def _subtree_end(self) -> Optional[int]:
        """The subtree's iterations, once this rank and every child have ended."""
        if self._own_end is None or any(e is None for e in self._child_end.values()):
            return None
        return max([self._own_end, *self._child_end.values()])

    def _advance(self) -> None:
        """Merge every iteration whose parts are all here; send it up (or, at
        the root, down as the total); then the subtree's END when it is due."""
        while True:
            i = self._next_up
            end = self._subtree_end()
            if end is not None and i >= end:
                break
            if i >= self._published and self._own_end is None:
                break  # this rank has not published iteration i yet
            if any(i not in self._up[c] and (self._child_end[c] is None or i < self._child_end[c])
                   for c in self.children):
                break
            parts = [self._own.pop(i, None)] + [self._up[c].pop(i, None) for c in self.children]
            present = [p for p in parts if p]
            if len(present) > 1:
                began = time.thread_time()
                merged = bytes(self._merge(parts))
                self.merge_seconds += time.thread_time() - began
                self._counts["merged"] += 1
            else:
                merged = present[0] if present else b""
            self._next_up += 1
            if self.parent is None:
                self._totals[i] = merged
                self._send_down(_FRAME.pack(_DOWN, self.rank, i) + merged)
            else:
                self.endpoint.send(self.parent, _FRAME.pack(_UP, self.rank, i) + merged)
        end = self._subtree_end()
        if end is not None and self._next_up >= end and not self._end_sent:
            self._end_sent = True
            if self.parent is None:
                self._total_end = end
                self._send_down(_FRAME.pack(_END_DOWN, self.rank, end))
            else:
                self.endpoint.send(self.parent, _FRAME.pack(_END_UP, self.rank, end))

    def _send_down(self, frame: bytes) -> None:
        for c in self.children:
            self.endpoint.send(c, frame)

    def _accept(self, src: int, frame: bytes) -> None:
        if len(frame) < _FRAME.size:
            self._malformed(src, "short frame")
            return
        kind, sender, value = _FRAME.unpack_from(frame)
        if sender != src:
            self._malformed(src, f"kind {kind} names sender {sender}")
            return
        if kind == DONE_KIND and src in self.neighbours:
            self._done.add(src)
        elif kind == _UP and src in self._up:
            if value < self._next_up or value in self._up[src]:
                self._counts["duplicates_dropped"] += 1
            else:
                self._up[src][value] = frame[_FRAME.size:]
        elif kind == _END_UP and src in self._child_end:
            self._child_end[src] = value
        elif kind == _DOWN and src == self.parent:
            if value < self._delivered or value in self._totals:
                self._counts["duplicates_dropped"] += 1
                return
            self._totals[value] = payload = frame[_FRAME.size:]
            self._send_down(_FRAME.pack(_DOWN, self.rank, value) + payload)  # the root's payload, unchanged
            self._counts["forwarded"] += len(self.children)
        elif kind == _END_DOWN and src == self.parent:
            if self._total_end is None:
                self._total_end = value
                self._send_down(_FRAME.pack(_END_DOWN, self.rank, value))
        else:
            self._malformed(src, f"kind {kind} from a rank that is not a tree neighbour for it")

    def _waiting_on(self) -> list[int]:
        """Whom the next total waits for: the children whose part of it (or
        END) has not come, with their subtrees; else the parent."""
        i = self._delivered
        if self.parent is not None and (self._next_up > i or self._end_sent):
            return [self.parent]
        late = [c for c in self.children
                if i not in self._up[c] and self._child_end[c] is None]
        return sorted(r for c in late for r in subtree(c, self.world_size, self.fanout))

    def _stalled(self, what: str) -> PeerStalledError:
        ranks = self._waiting_on()
        peers = self.endpoint.peers
        via = (f"its parent {named_peers([self.parent], peers)}" if ranks == [self.parent]
               else f"the subtree of rank(s) {named_peers(ranks, peers)}")
        pending = self.endpoint.pending()
        hint = f"; unacked messages to neighbours {pending}" if pending else ""
        return PeerStalledError(f"rank {self.rank}: {what}: waiting for {via}{hint}", ranks,
                                [peers.get(r) for r in ranks])

    def _malformed(self, src: int, what: str) -> None:
        self._counts["malformed"] += 1
        logger.warning("rank %d: dropped malformed tree frame from rank %d (%s)", self.rank, src, what)
