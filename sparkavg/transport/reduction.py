"""One round of the weighted all-reduce on one rank: recursive halving
(a reduce-scatter), then recursive doubling (an all-gather), with the
ranks above a power of two folded in first and served last.

``W`` ranks, ``P = 2^floor(log2 W)``, ``L = log2 P``.  The logical vector
is the concatenation of the round's arrays, ``n`` elements.

- **Fold in.**  Rank ``q >= P`` sends its weighted vector to rank ``q - P``,
  which adds it to its own: the tree's leaf ``q - P``
  (:mod:`.summation`).
- **Reduce-scatter**, steps ``s = 0 .. L - 1``: rank ``r < P`` and its
  partner ``r ^ 2^s`` split their current segment (the whole vector at
  step 0) in halves; ``r`` keeps the lower half when bit ``s`` of ``r`` is
  0, sends the other and adds the partner's.  Step ``s`` adds two nodes of
  level ``s`` of the tree into one of level ``s + 1``, so after step
  ``L - 1`` each rank holds its ``1 / P`` of the root: the sum in the one
  order, scaled there by ``1 / total_weight``.
- **All-gather**, steps ``s = L - 1 .. 0``: each rank sends the segment it
  holds to the partner of step ``s`` and receives the partner's in its
  place.
- **Fold out.**  Rank ``q - P`` sends the whole result to rank ``q``.

Each rank sends ``2 (P - 1) / P`` of the vector (and a rank that folds one
in, one more vector): bandwidth-optimal, over ``log2 P`` connections (one
more to fold) in ``2 log2 P`` steps (``+ 2``).

Weights.  Every announcement (a ROUND frame, one per round and direction)
carries the weights of the ranks the sender's data sums: the folded rank's
own, a node's ranks at step ``s``, every rank's on the way out; so every
rank knows every weight after the reduce-scatter and sums them in the one
order (:func:`~.summation.total_weight`).  A node whose ranks all weigh 0 is
missing, not zero: its data is not sent, and a rank adds nothing for it (or
takes the partner's as it comes, when its own is missing).

Transfers are cut in pieces of at most ``piece_bytes`` (never across two
arrays).  A piece is sent as soon as what it depends on is final (a
reduced piece goes on to the next step while the current one still
adds); a receiving thread holds one piece while it waits for its rank's
own data to reach the level it adds to.  :class:`Round` is shared by the
group's threads: the caller's thread scales the rank's part of the root,
one thread per partner sends (:meth:`Round.send_to`) and one receives
(:meth:`Round.read_from`).  A sending thread that waits on the rank's
other partners tells its partner it is alive (an ALIVE frame) every
:data:`~.limits.COLLECTIVE_ALIVE_FRACTION` of the stall timeout: only the
connection to a rank that stopped times out, and the rank that notices
tells its partners who it was (an ABORT notice).
"""
from __future__ import annotations

import hashlib
import json
import math
import struct
import threading
import time

import numpy as np

from .. import ops
from .links import Kind, Link
from .summation import power_below, ranks_of, total_weight

__all__ = ["DTYPES", "Layout", "Round", "Schedule", "Stop", "partners"]

#: dtype code, element count, layout digest; then one float64 weight per rank announced
_ROUND = struct.Struct("!BQ16s")
_REDUCE, _GATHER = 1, 2
#: How long an error seen while sending waits for one seen while receiving,
#: which names the lost rank more surely (a survivor that aborts breaks its
#: connections too).
_SEND_ERROR_GRACE = 0.5


#: dtype -> its code in a round's announcement.
DTYPES = {np.dtype(np.float32): 1, np.dtype(np.float64): 2}


class Stop(Exception):
    """The round failed elsewhere: this thread stops."""


def partners(rank: int, world: int) -> list:
    """The ranks ``rank`` connects to, ascending: its partner of each
    reduce-scatter step and the rank it folds (or is folded into)."""
    p = power_below(world)
    if rank >= p:
        return [rank - p]
    out = [rank ^ (1 << s) for s in range(p.bit_length() - 1)]
    if rank + p < world:
        out.append(rank + p)
    return sorted(out)


class Schedule:
    """What one rank does in every round (pure arithmetic on ``rank``,
    ``world`` and ``n`` elements).

    Attributes
    ----------
    steps : int
        ``L = log2 P``.
    extra : bool
        The rank is ``>= P``: it only folds into ``fold``.
    fold : int or None
        The rank folded into this one (``rank + P``), or this rank's fold
        target (``rank - P``); None without.
    keep, send : list of (int, int)
        Per reduce-scatter step, the half kept and the half sent, as
        ``[lo, hi)`` of the logical vector.
    final : (int, int)
        This rank's part of the root.
    """

    __slots__ = ("rank", "world", "size", "steps", "extra", "fold", "keep", "send", "final")

    def __init__(self, rank: int, world: int, size: int):
        p = power_below(world)
        self.rank, self.world, self.size = rank, world, size
        self.steps = p.bit_length() - 1
        self.extra = rank >= p
        self.fold = rank - p if self.extra else (rank + p if rank + p < world else None)
        self.keep, self.send = [], []
        lo, hi = 0, size
        if not self.extra:
            for s in range(self.steps):
                mid = (lo + hi) // 2
                low, high = (lo, mid), (mid, hi)
                keep, send = (high, low) if (rank >> s) & 1 else (low, high)
                self.keep.append(keep)
                self.send.append(send)
                lo, hi = keep
        self.final = (lo, hi)

    def step_of(self, peer: int):
        """The reduce-scatter step whose partner is ``peer``, or None (the fold)."""
        s = (self.rank ^ peer).bit_length() - 1
        return s if not self.extra and peer == self.rank ^ (1 << s) and s < self.steps else None

    def block(self, s: int, rank: int | None = None) -> list:
        """The ranks whose values ``rank``'s data (default: this rank's) sums
        before reduce-scatter step ``s``."""
        rank = self.rank if rank is None else rank
        return ranks_of(self.world, s, rank >> s)


class Layout:
    """Where a range of the logical vector lies in the arrays of a round.

    A piece is ``(offset, array, start, stop)``: elements ``start:stop`` of
    one array, ``offset`` in the logical vector; :meth:`pieces` cuts a range
    at array boundaries and every ``piece_bytes``, the same on every rank.
    """

    __slots__ = ("arrays", "dtype", "size", "digest", "step", "starts", "sizes")

    def __init__(self, arrays, names, piece_bytes: int):
        self.arrays = arrays
        self.dtype = arrays[0].dtype if arrays else np.dtype(np.float32)
        self.sizes = [a.size for a in arrays]
        self.size = sum(self.sizes)
        described = json.dumps([self.dtype.str, [[str(n), s] for n, s in zip(names, self.sizes)]])
        self.digest = hashlib.sha256(described.encode()).digest()[:16]
        self.step = max(1, piece_bytes // self.dtype.itemsize)
        self.starts = [int(x) for x in np.cumsum([0] + self.sizes)]

    def pieces(self, lo: int, hi: int) -> list:
        out = []
        for index, (first, n) in enumerate(zip(self.starts, self.sizes)):
            s, e = max(lo, first), min(hi, first + n)
            for a in range(s, e, self.step):
                out.append((a, index, a - first, min(e, a + self.step) - first))
        return out

    def view(self, piece):
        _, index, start, stop = piece
        return self.arrays[index][start:stop]


def _end(piece) -> int:
    return piece[0] + piece[3] - piece[2]


class Round:
    """The shared state of one round on one rank: the weights known so far,
    how far each step has come, and the first error (``on_fail(error)`` is
    called once, with it).

    Progress is an offset per step -- everything of its range below it is
    done -- because every step walks its range in ascending pieces:
    ``folded`` (the fold in), ``reduced[s]`` (reduce-scatter step ``s``
    added into ``keep[s]``), ``scaled`` (the rank's part of the root is
    final), ``gathered[s]`` (all-gather step ``s`` wrote ``send[s]``).
    """

    def __init__(self, rank: int, world: int, number: int, layout: Layout, weight: float, on_fail, *,
                 average: bool = True, alive_every: float = 30.0):
        self.rank, self.world, self.number, self.layout = rank, world, number, layout
        self.weight, self.average, self.on_fail, self.alive_every = weight, average, on_fail, alive_every
        self.plan = plan = Schedule(rank, world, layout.size)
        self.cond = threading.Condition()
        self.weights = [None] * world
        self.weights[rank] = weight
        self.folded_known = plan.extra or plan.fold is None
        self.step_known = [False] * plan.steps
        self.folded = layout.size if self.folded_known else 0
        self.reduced = [k[0] for k in plan.keep]
        self.scaled = plan.final[0]
        self.gathered = [s[0] for s in plan.send]
        self.total = self.inv = None
        self.pending = 2 * len(partners(rank, world))
        self.error = None

    # ------------------------------------------------------------ coordination
    def wait(self, ready, link: Link | None = None) -> None:
        """Until ``ready()`` (called under the lock) or the round fails; a
        sending thread (``link``) sends ALIVE frames meanwhile."""
        while True:
            with self.cond:
                while True:
                    if self.error is not None:
                        raise Stop
                    if ready():
                        return
                    if link is None:
                        self.cond.wait()
                        continue
                    left = link.last_sent + self.alive_every - time.monotonic()
                    if left <= 0:
                        break
                    self.cond.wait(left)
            link.send(Kind.ALIVE, self.number)

    def fail(self, exc: BaseException, weak: bool = False) -> None:
        """Record the round's first error and abort the group; a ``weak``
        one (seen while sending, or a partner that closed without a notice)
        first gives another thread :data:`_SEND_ERROR_GRACE` to report a
        better one (an ABORT notice naming the rank that was lost)."""
        with self.cond:
            if weak and self.error is None:
                self.cond.wait_for(lambda: self.error is not None, _SEND_ERROR_GRACE)
            if self.error is not None:
                return
            self.error = exc
            self.cond.notify_all()
        self.on_fail(exc)

    def part_done(self) -> None:
        with self.cond:
            self.pending -= 1
            self.cond.notify_all()

    def _set(self, name: str, value, index=None) -> None:
        with self.cond:
            if index is None:
                setattr(self, name, value)
            else:
                getattr(self, name)[index] = value
            self.cond.notify_all()

    # ------------------------------------------------------------ what is known and final (under the lock)
    def _known_before(self, s: int) -> bool:
        """The weights of this rank's node before step ``s`` are known."""
        return self.folded_known and all(self.step_known[:s])

    def _present(self, ranks) -> bool:
        return any(self.weights[x] for x in ranks)

    def _reduced_to(self, s: int, b: int) -> bool:
        """Everything below ``b`` (in ``keep[s - 1]``) has the fold and
        reduce-scatter steps ``< s`` added."""
        return self.folded >= b and all(self.reduced[j] >= b for j in range(s))

    def _final(self, a: int, b: int, above: int) -> bool:
        """``[a, b)`` holds the result: this rank's part of the root and the
        all-gathers of steps ``>= above``."""
        ranges = [(self.plan.final, self.scaled)] + [(self.plan.send[j], self.gathered[j])
                                                      for j in range(above, self.plan.steps)]
        return all(done >= min(b, hi) for (lo, hi), done in ranges if a < hi and b > lo)

    def _learn(self, ranks, values, link: Link, then=None) -> None:
        """Take the weights a peer announced; ``then()`` under the same lock.
        Once every rank's is known, the total (in the one order)."""
        for x, w in zip(ranks, values):
            if not (math.isfinite(w) and w >= 0):
                raise ValueError(f"rank {self.rank}: rank {link.peer} at {link.address[0]}:{link.address[1]} "
                                 f"announced weight {w} for rank {x}; expected a finite weight >= 0")
        with self.cond:
            for x, w in zip(ranks, values):
                if x != self.rank:
                    self.weights[x] = w
            if then is not None:
                then()
            if self.total is None and all(w is not None for w in self.weights):
                self.total = total_weight(self.weights)
                self.inv = (1.0 / self.total if self.average else 1.0) if self.total else None
            self.cond.notify_all()

    # ------------------------------------------------------------ frames
    def _announce(self, link: Link, ranks) -> None:
        layout = self.layout
        head = _ROUND.pack(DTYPES[layout.dtype], layout.size, layout.digest)
        with self.cond:
            values = [self.weights[x] for x in ranks]
        link.send(Kind.ROUND, self.number, head + struct.pack(f"!{len(values)}d", *values))

    def _announced(self, link: Link, ranks, then=None) -> None:
        """Read the peer's announcement of ``ranks``' weights and learn them."""
        layout = self.layout
        payload = link.recv(Kind.ROUND, self.number, length=_ROUND.size + 8 * len(ranks))
        code, size, digest = _ROUND.unpack_from(payload)
        if (code, size, digest) != (DTYPES[layout.dtype], layout.size, layout.digest):
            dtypes = {v: k for k, v in DTYPES.items()}
            raise ValueError(f"rank {self.rank}: rank {link.peer} at {link.address[0]}:{link.address[1]} reduces "
                             f"{size} {dtypes.get(code, code)} values (layout {digest.hex()}), this rank "
                             f"{layout.size} {layout.dtype} values (layout {layout.digest.hex()}): every rank must "
                             "pass the same names, sizes and dtype")
        self._learn(ranks, struct.unpack_from(f"!{len(ranks)}d", payload, _ROUND.size), link, then)

    def _send(self, link: Link, lo: int, hi: int, phase: int, ready) -> None:
        for piece in self.layout.pieces(lo, hi):
            self.wait(lambda: ready(piece[0], _end(piece)), link)
            link.send(Kind.DATA, self.number, self.layout.view(piece), phase, piece[0])

    def _receive(self, link: Link, lo: int, hi: int, phase: int, progress: str, index=None) -> None:
        """Pieces of ``[lo, hi)`` straight into the arrays (nothing of this
        rank's own is there to add to)."""
        for piece in self.layout.pieces(lo, hi):
            link.recv(Kind.DATA, self.number, self.layout.view(piece), phase=phase, offset=piece[0])
            self._set(progress, _end(piece), index)

    def _add(self, link: Link, lo: int, hi: int, buffer, ready, progress: str, index=None) -> None:
        """Pieces of ``[lo, hi)`` added to the arrays, each once ``ready(end)``."""
        layout = self.layout
        for piece in layout.pieces(lo, hi):
            got = buffer[: (piece[3] - piece[2]) * layout.dtype.itemsize].view(layout.dtype)
            link.recv(Kind.DATA, self.number, got, phase=_REDUCE, offset=piece[0])
            end = _end(piece)
            self.wait(lambda: ready(end))
            ops.accumulate(layout.view(piece), got)
            self._set(progress, end, index)

    # ------------------------------------------------------------ the threads' parts
    def own_part(self) -> None:
        """The caller's thread: scale this rank's part of the root by ``1 /
        total_weight`` as it becomes final."""
        plan = self.plan
        if plan.extra:
            return
        self.wait(lambda: self.total is not None)
        for piece in self.layout.pieces(*plan.final) if self.total else ():
            end = _end(piece)
            self.wait(lambda: self._reduced_to(plan.steps, end))
            if self.inv != 1.0:
                ops.scale(self.layout.view(piece), self.inv)
            self._set("scaled", end)

    def send_to(self, link: Link) -> None:
        plan, n, peer = self.plan, self.layout.size, link.peer
        if plan.extra:  # fold in: this rank's weighted vector
            self._announce(link, [self.rank])
            if self.weight:
                self._send(link, 0, n, _REDUCE, lambda a, b: True)
            return
        s = plan.step_of(peer)
        if s is None:  # fold out: the result, once every weight is known
            self.wait(lambda: self.total is not None, link)
            self._announce(link, range(self.world))
            if self.total:
                self._send(link, 0, n, _GATHER, lambda a, b: self._final(a, b, 0))
            return
        self.wait(lambda: self._known_before(s), link)
        mine = plan.block(s)
        self._announce(link, mine)
        with self.cond:
            present = self._present(mine)
        if present:
            self._send(link, *plan.send[s], _REDUCE, lambda a, b: self._reduced_to(s, b))
        self.wait(lambda: self.total is not None, link)
        if self.total:
            self._send(link, *plan.keep[s], _GATHER, lambda a, b: self._final(a, b, s + 1))

    def read_from(self, link: Link, buffer) -> None:
        plan, n, peer = self.plan, self.layout.size, link.peer
        if plan.extra:  # fold out: every weight, then the result
            self._announced(link, range(self.world))
            if self.total:
                self._receive(link, 0, n, _GATHER, "folded")
            return
        s = plan.step_of(peer)
        if s is None:  # fold in: the folded rank's weighted vector, added to this rank's
            def known():
                self.folded_known = True
                if not self.weights[peer]:
                    self.folded = n

            self._announced(link, [peer], known)
            if self.weights[peer]:
                if self.weight:
                    self._add(link, 0, n, buffer, lambda b: True, "folded")
                else:
                    self._receive(link, 0, n, _REDUCE, "folded")
            return
        theirs = plan.block(s, peer)
        self._announced(link, theirs, lambda: self.step_known.__setitem__(s, True))
        keep = plan.keep[s]
        if any(self.weights[x] for x in theirs):
            self.wait(lambda: self._known_before(s))
            with self.cond:
                mine = self._present(plan.block(s))
            if mine:
                self._add(link, *keep, buffer, lambda b: self._reduced_to(s, b), "reduced", s)
            else:
                self._receive(link, *keep, _REDUCE, "reduced", s)
        self._set("reduced", keep[1], s)
        self.wait(lambda: self.total is not None)
        if self.total:
            self._receive(link, *plan.send[s], _GATHER, "gathered", s)
