"""One round of the weighted all-reduce on one rank: which pieces of which
chunk go where, and the order in which contributions are added.

The logical vector is the concatenation of the round's arrays; rank ``j``
owns chunk ``[n j // W, n (j + 1) // W)``.  In the reduce-scatter every rank
sends its weighted chunk ``j`` to rank ``j`` in pieces; rank ``j`` adds the
contributions of each piece in rank order -- a contribution waits for its
turn, so rank ``r``'s piece ``k`` is added after ranks ``< r`` added theirs
-- and the last one scales the piece by ``1 / total_weight``: the driver's
``((w_0 v_0 + w_1 v_1) + w_2 v_2) ...`` element by element.  A final piece
is sent on at once to every other rank (the all-gather).  Ranks of weight
0 send nothing in the reduce-scatter and are not waited for.

:class:`Round` is shared by the group's threads: the caller's thread adds
this rank's own contribution, one thread per peer sends (:meth:`Round.send_to`)
and one receives (:meth:`Round.read_from`).
"""
from __future__ import annotations

import hashlib
import json
import math
import struct
import threading

import numpy as np

from .. import ops
from .links import Kind, Link

__all__ = ["DTYPES", "Layout", "Round", "Stop"]

#: weight, dtype code, element count, layout digest
_ROUND = struct.Struct("!dBQ16s")
_REDUCE, _GATHER = 1, 2
#: How long an error seen while sending waits for one seen while receiving,
#: which names the lost rank more surely (a survivor that aborts breaks its
#: connections too).
_SEND_ERROR_GRACE = 0.5


#: dtype -> its code in a round's announcement.
DTYPES = {np.dtype(np.float32): 1, np.dtype(np.float64): 2}


class Stop(Exception):
    """The round failed elsewhere: this thread stops."""


class Layout:
    """Where the pieces of each rank's chunk lie in the arrays of a round.

    The logical vector is the concatenation of the arrays; chunk ``j`` is
    ``[n j // W, n (j + 1) // W)``.  A piece is ``(offset, array, start,
    stop)``: elements ``start:stop`` of one array, ``offset`` in the logical
    vector.
    """

    __slots__ = ("arrays", "dtype", "size", "digest", "bounds", "pieces")

    def __init__(self, arrays, names, world: int, piece_bytes: int):
        self.arrays = arrays
        self.dtype = arrays[0].dtype if arrays else np.dtype(np.float32)
        sizes = [a.size for a in arrays]
        self.size = sum(sizes)
        described = json.dumps([self.dtype.str, [[str(n), s] for n, s in zip(names, sizes)]])
        self.digest = hashlib.sha256(described.encode()).digest()[:16]
        self.bounds = [self.size * j // world for j in range(world + 1)]
        step = max(1, piece_bytes // self.dtype.itemsize)
        starts = np.cumsum([0] + sizes)
        self.pieces = []
        for j in range(world):
            lo, hi, pieces = self.bounds[j], self.bounds[j + 1], []
            for index, (first, n) in enumerate(zip(starts, sizes)):
                s, e = max(lo, first), min(hi, first + n)
                for a in range(s, e, step):
                    b = min(e, a + step)
                    pieces.append((int(a), index, int(a - first), int(b - first)))
            self.pieces.append(pieces)

    def view(self, piece):
        _, index, start, stop = piece
        return self.arrays[index][start:stop]


class Round:
    """The shared state of one round on one rank: the peers' weights, how
    many contributions each piece of this rank's chunk has taken, which of
    its pieces are final, and the first error (``on_fail(error)`` is called
    once, with it).

    ``acc`` is a buffer of at least this rank's chunk's length, where its
    pieces are summed."""

    def __init__(self, rank: int, number: int, layout: Layout, weight: float, acc, on_fail, average: bool = True):
        self.rank, self.number, self.layout, self.weight, self.average = rank, number, layout, weight, average
        self.world, self.on_fail = len(layout.bounds) - 1, on_fail
        self.cond = threading.Condition()
        self.weights = [None] * self.world
        self.weights[self.rank] = weight
        self.announced = 1
        self.position = None  # rank -> index in the summation order, once every weight is known
        self.contributors = 0
        self.total = self.inv = None
        mine = layout.pieces[self.rank]
        lo = layout.bounds[self.rank]
        self.acc = [acc[p[0] - lo: p[0] - lo + p[3] - p[2]] for p in mine]
        self.applied = [0] * len(mine)
        self.final = [False] * len(mine)
        self.pending = 2 * (self.world - 1)
        self.error = None
        self._announce_done()

    # ------------------------------------------------------------ coordination
    def _announce_done(self) -> None:
        if self.announced < self.world:
            return
        total, order = None, []
        for r, w in enumerate(self.weights):
            if w:
                order.append(r)
                total = w if total is None else total + w  # the driver's order, not sum()'s compensated one
        self.total = 0.0 if total is None else total
        self.inv = (1.0 / self.total if self.average else 1.0) if self.total else None
        self.contributors = len(order)
        self.position = {r: i for i, r in enumerate(order)}
        self.cond.notify_all()

    def announce(self, peer: int, weight: float) -> None:
        with self.cond:
            self.weights[peer] = weight
            self.announced += 1
            self._announce_done()

    def wait(self, ready) -> None:
        """Until ``ready()`` (called under the lock) or the round fails."""
        with self.cond:
            while True:
                if self.error is not None:
                    raise Stop
                if ready():
                    return
                self.cond.wait()

    def fail(self, exc: BaseException, weak: bool = False) -> None:
        """Record the round's first error and abort the group; a ``weak``
        one (seen while sending) first gives a receiving thread
        :data:`_SEND_ERROR_GRACE` to report a better one."""
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

    # ------------------------------------------------------------ the reduction
    def apply(self, k: int, rank: int, src) -> None:
        """Add ``rank``'s contribution to piece ``k`` of this rank's chunk in
        its turn; the last one makes the piece final."""
        self.wait(lambda: self.position is not None and self.applied[k] == self.position[rank])
        dst = self.acc[k]
        if self.applied[k] == 0:
            np.copyto(dst, src)
        else:
            ops.accumulate(dst, src)
        last = self.applied[k] + 1 == self.contributors
        if last:
            if self.inv != 1.0:
                ops.scale(dst, self.inv)
            np.copyto(self.layout.view(self.layout.pieces[self.rank][k]), dst)
        with self.cond:
            self.applied[k] += 1
            self.final[k] = last
            self.cond.notify_all()

    def contribute_own(self) -> None:
        if self.weight:
            for k, piece in enumerate(self.layout.pieces[self.rank]):
                self.apply(k, self.rank, self.layout.view(piece))

    def send_to(self, link: Link) -> None:
        layout, number = self.layout, self.number
        link.send(Kind.ROUND, number, _ROUND.pack(self.weight, DTYPES[layout.dtype], layout.size, layout.digest))
        if self.weight:
            for piece in layout.pieces[link.peer]:
                link.send(Kind.DATA, number, layout.view(piece), _REDUCE, piece[0])
        self.wait(lambda: self.position is not None)
        if self.total:
            for k, piece in enumerate(layout.pieces[self.rank]):
                self.wait(lambda: self.final[k])
                link.send(Kind.DATA, number, layout.view(piece), _GATHER, piece[0])

    def read_from(self, link: Link, buffer) -> None:
        layout, number, peer = self.layout, self.number, link.peer
        weight, code, size, digest = _ROUND.unpack(link.recv(Kind.ROUND, number, length=_ROUND.size))
        if (code, size, digest) != (DTYPES[layout.dtype], layout.size, layout.digest):
            dtypes = {v: k for k, v in DTYPES.items()}
            raise ValueError(f"rank {self.rank}: rank {peer} at {link.address[0]}:{link.address[1]} reduces {size} "
                             f"{dtypes.get(code, code)} values (layout {digest.hex()}), this rank {layout.size} "
                             f"{layout.dtype} values (layout {layout.digest.hex()}): every rank must pass the same "
                             "names, sizes and dtype")
        if not (math.isfinite(weight) and weight >= 0):
            raise ValueError(f"rank {self.rank}: rank {peer} announced weight {weight}; expected a finite weight "
                             ">= 0")
        self.announce(peer, weight)
        if weight:
            for k, piece in enumerate(layout.pieces[self.rank]):
                view = buffer[: (piece[3] - piece[2]) * layout.dtype.itemsize].view(layout.dtype)
                link.recv(Kind.DATA, number, view, phase=_REDUCE, offset=piece[0])
                self.apply(k, peer, view)
        self.wait(lambda: self.position is not None)
        if self.total:
            for piece in layout.pieces[peer]:
                link.recv(Kind.DATA, number, layout.view(piece), phase=_GATHER, offset=piece[0])
