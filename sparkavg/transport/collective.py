"""A weighted all-reduce over authenticated TCP between the ranks of one stage.

The ranks of a Spark barrier stage (or any W processes) form a
:class:`CollectiveGroup`: each listens on a TCP port, the caller exchanges
the table of addresses and X25519 public keys (Spark's ``allGather``), and
each rank connects once to its partners only (:mod:`.links`: per-direction
keys, sequence-bound HMAC-SHA256 tags).  The connections serve every round
of the stage.

Topology: recursive halving and doubling (Rabenseifner's all-reduce;
Thakur, Rabenseifner and Gropp 2005), :mod:`.reduction`.  With ``P =
2^floor(log2 W)``, rank ``r < P`` connects to ``r ^ 1, r ^ 2, ..., r ^
P/2`` and, for ``r < W - P``, to ``r + P``, which it folds in first and
serves the result last: at most ``log2 P + 1`` connections per rank, two
threads each.  A round halves the segment each rank reduces over ``log2
P`` steps (a reduce-scatter) and doubles it back (an all-gather): every
rank sends and receives ``2 (P - 1) / P`` of the vector (one vector more
across a fold), as in a ring, in ``2 log2 P`` steps (``+ 2`` with a fold)
instead of a ring's ``2 (W - 1)``.

Bit-identity with the driver's sum: the halving adds each element in one
fixed tree -- the fold ``v_i + v_{i+P}``, then pairs at distance 1, 2, 4,
... (:mod:`.summation`) -- and the job path's driver sums its workers'
results with :func:`~.summation.ordered_sum`, the same tree; each rank
scales its part by ``1 / sum(w)`` (summed in the same order) before the
all-gather.

Every transfer is cut in pieces of at most ``piece_bytes``: a rank holds one
piece per connection while it waits for its own data to reach the level it
adds to (TCP's flow control holds the rest), and a reduced piece goes on to
the next step as soon as it is final, so the steps overlap.

Examples
--------
One stage of averaging inside a Spark barrier task::

    ctx = BarrierTaskContext.get()
    rank, world = ctx.partitionId(), len(ctx.getTaskInfos())
    agreement = KeyAgreement(rank, (ctx.stageId() << 16) | ctx.stageAttemptNumber())
    group = CollectiveGroup(agreement, world, host=select_address(network_mask))
    try:
        group.connect([json.loads(e) for e in ctx.allGather(json.dumps(group.entry()))])
        for batches in rounds:
            examples = fit(net, batches)
            group.allreduce_weighted({"params": params, "updater": state}, float(examples))
    finally:
        group.close()
"""
from __future__ import annotations

import json
import logging
import math
import queue
import socket
import threading
import time
from collections.abc import Mapping

import numpy as np

from .. import ops
from .address import select_address
from .errors import FrameRejectedError, PeerLostError, PeerStalledError, TransportError
from .keys import KeyAgreement
from .limits import COLLECTIVE_ALIVE_FRACTION
from .links import Link, LinkClosed, accept_hello, dial, tcp_pair_keys
from .reduction import DTYPES, Layout, Round, Stop, partners

__all__ = ["PIECE_BYTES", "CollectiveGroup"]

logger = logging.getLogger(__name__)

#: Largest piece of a vector in one frame (and the buffer a connection holds).
PIECE_BYTES = 1 << 20

def _as_arrays(vectors):
    """``(arrays, names)`` of a mapping, sequence or single array of
    vectors, each checked."""
    if isinstance(vectors, np.ndarray):
        names, arrays = ["0"], [vectors]
    elif isinstance(vectors, Mapping):
        names, arrays = list(vectors), list(vectors.values())
    else:
        arrays = list(vectors)
        names = [str(i) for i in range(len(arrays))]
    for name, a in zip(names, arrays):
        where = f"vectors[{name!r}]"
        if not isinstance(a, np.ndarray):
            raise TypeError(f"Expect {where} to be a numpy array (the all-reduce sends host memory), "
                            f"got {type(a).__name__}")
        if a.dtype not in DTYPES:
            raise TypeError(f"Expect {where} of dtype float32 or float64, got {a.dtype}")
        if a.ndim != 1 or not a.flags.c_contiguous or not a.flags.writeable:
            raise ValueError(f"Expect {where} to be a 1-D, C-contiguous, writeable array (it is averaged in "
                             f"place), got shape {a.shape}, contiguous={a.flags.c_contiguous}, "
                             f"writeable={a.flags.writeable}")
        if a.dtype != arrays[0].dtype:
            raise TypeError(f"Expect every vector of one dtype, got {arrays[0].dtype} for vectors[{names[0]!r}] "
                            f"and {a.dtype} for {where}")
    return arrays, names


class CollectiveGroup:
    """One rank of a TCP all-reduce by recursive halving and doubling that
    averages vectors weighted by the examples each rank trained (the
    module docstring).

    Parameters
    ----------
    agreement : KeyAgreement
        This rank's key pair for the stage attempt: its ``rank`` and
        ``context`` are the group's.
    world : int
        Number of ranks, ``>= 1``.
    host : str, optional
        Address to listen on and advertise; by default
        :func:`~sparkavg.transport.address.select_address`'s choice.
    port : int, default 0
        TCP port; 0 picks a free one.
    stall_timeout : float, default 120.0
        A peer that sends (or takes) nothing for this long during a round,
        or does not connect within it, is lost.  Rounds are meeting points:
        a rank still training this long after the others called
        :meth:`allreduce_weighted` counts as stalled.
    piece_bytes : int, default PIECE_BYTES
        Largest piece of a vector per frame; a multiple of 8.
    """

    def __init__(self, agreement: KeyAgreement, world: int, *, host: str | None = None, port: int = 0,
                 stall_timeout: float = 120.0, piece_bytes: int = PIECE_BYTES):
        if int(world) < 1 or not 0 <= agreement.rank < int(world):
            raise ValueError(f"Expect world >= 1 and 0 <= rank < world, got rank {agreement.rank}, world {world}")
        if not stall_timeout > 0:
            raise ValueError(f"Expect stall_timeout > 0, got {stall_timeout}")
        if int(piece_bytes) < 8 or int(piece_bytes) % 8:
            raise ValueError(f"Expect piece_bytes a positive multiple of 8, got {piece_bytes}")
        self.agreement, self.rank, self.world = agreement, agreement.rank, int(world)
        self.stall_timeout, self.piece_bytes = float(stall_timeout), int(piece_bytes)
        host = select_address() if host is None else host
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._listener.bind((host, int(port)))
            self._listener.listen(max(1, self.world))
        except OSError:
            self._listener.close()
            raise
        self.address = (host, self._listener.getsockname()[1])
        self.links: dict[int, Link] = {}
        self.rounds = 0
        self._round = None
        self._error = None
        self._closed = False
        self._threads: list[threading.Thread] = []
        self._queues: list[queue.SimpleQueue] = []
        self._joining = None  # join_in_background's thread until the first all-reduce has waited for it
        self.joined_in = None  # seconds join_in_background took to connect (None: not joined so)
        self._join_error = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def entry(self) -> dict:
        """This rank's entry of the table :meth:`connect` takes, JSON-ready:
        ``{"rank", "host", "port", "public"}`` (the public key in hex)."""
        return {"rank": self.rank, "host": self.address[0], "port": self.address[1],
                "public": self.agreement.public.hex()}

    # ------------------------------------------------------------ connecting
    def _table(self, entries) -> dict:
        table = {}
        for entry in entries:
            r = int(entry["rank"])
            if r in table:
                raise ValueError(f"rank {self.rank}: expect one entry per rank, got two for rank {r}")
            public = entry["public"]
            table[r] = (str(entry["host"]), int(entry["port"]),
                        bytes.fromhex(public) if isinstance(public, str) else bytes(public))
        if sorted(table) != list(range(self.world)) or table[self.rank][2] != self.agreement.public:
            raise ValueError(f"rank {self.rank}: expect entries for ranks 0..{self.world - 1} with this rank's own "
                             f"public key, got ranks {sorted(table)}")
        return table

    def connect(self, entries) -> None:
        """Connect to this rank's partners (:func:`~.reduction.partners`),
        once per stage.

        Parameters
        ----------
        entries : iterable of mapping
            Every rank's :meth:`entry` (this rank's included), e.g. the
            decoded answer of ``BarrierTaskContext.allGather``.

        Raises
        ------
        ValueError
            The entries are not one per rank with this rank's public key.
        PeerLostError
            ``reason="connect"``: a partner did not connect within the stall
            timeout (the first such rank).
        FrameRejectedError
            A lower partner's handshake answer did not verify.
        """
        if self.links or self._closed:
            raise RuntimeError(f"rank {self.rank}: the group is already connected or closed")
        table = self._table(entries)
        address_of = {r: (h, p) for r, (h, p, _) in table.items()}
        mine = partners(self.rank, self.world)
        keys = tcp_pair_keys(self.agreement, {r: table[r][2] for r in mine})
        deadline = time.monotonic() + self.stall_timeout
        began = time.perf_counter()
        accepted: dict[int, Link] = {}
        higher = {r for r in mine if r > self.rank}
        accepter = threading.Thread(target=self._accept, args=(keys, address_of, deadline, accepted, higher),
                                    name=f"sparkavg-collective-accept-{self.rank}", daemon=True)
        accepter.start()
        links = {}
        try:
            for peer in (r for r in mine if r < self.rank):
                links[peer] = dial(self.rank, peer, address_of[peer], keys[peer], self.agreement.context, deadline,
                                   stall_timeout=self.stall_timeout)
            accepter.join(max(0.0, deadline - time.monotonic()) + 1.0)
            links.update(accepted)
            missing = [r for r in mine if r not in links]
            if missing:
                r = missing[0]
                raise PeerLostError(f"rank {self.rank}: rank {r} at {address_of[r][0]}:{address_of[r][1]} did not "
                                    f"connect within {self.stall_timeout:g} s (missing ranks {missing})", r,
                                    address_of[r], "connect")
        except BaseException:
            self._stop_listening()
            accepter.join(1.0)
            for link in {**links, **accepted}.values():
                link.close()
            raise
        if self._closed:  # closed while a background join connected
            for link in links.values():
                link.close()
            raise TransportError(f"rank {self.rank}: the collective group was closed while it connected")
        self.links = dict(sorted(links.items()))
        for link in self.links.values():
            for part in (self._sending, self._reading):
                q = queue.SimpleQueue()
                t = threading.Thread(target=part, args=(link, q), daemon=True,
                                     name=f"sparkavg-collective-{part.__name__[1:]}-{self.rank}-{link.peer}")
                t.start()
                self._queues.append(q)
                self._threads.append(t)
        logger.debug("rank %d connected to %d peers in %.3f s", self.rank, len(self.links),
                     time.perf_counter() - began)

    def join_in_background(self, gather) -> None:
        """Exchange the table and :meth:`connect` in a background thread: the
        caller trains meanwhile and the first :meth:`allreduce_weighted` waits
        for it.  ``gather(text) -> list of str`` is one all-gather of every
        rank's JSON :meth:`entry` (``BarrierTaskContext.allGather``, which
        answers on a one-second poll: the wait is hidden behind the first
        round's training instead of paid before it); :attr:`joined_in` is
        then the seconds it took."""
        if self._joining is not None or self.links:
            raise RuntimeError(f"rank {self.rank}: the group is already joining or connected")

        began = time.perf_counter()

        def join():
            try:
                self.connect([json.loads(e) for e in gather(json.dumps(self.entry()))])
                self.joined_in = time.perf_counter() - began
            except BaseException as exc:  # raised by the all-reduce that waits for it
                self._join_error = exc

        self._joining = threading.Thread(target=join, name=f"sparkavg-collective-join-{self.rank}", daemon=True)
        self._joining.start()

    def _joined(self) -> None:
        """Wait for :meth:`join_in_background` (the all-gather, then the
        connections: each up to the stall timeout)."""
        joining = self._joining
        if joining is None:
            return
        joining.join(2 * self.stall_timeout + 1.0)
        if joining.is_alive():
            raise PeerStalledError(f"rank {self.rank}: the ranks' addresses (allGather) and connections did not "
                                   f"come within {2 * self.stall_timeout + 1.0:g} s")
        self._joining = None
        if self._join_error is not None:
            raise self._join_error

    def _accept(self, keys, address_of, deadline, accepted, expected) -> None:
        expected = set(expected)
        while expected:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self._listener.settimeout(left)
            try:
                sock, where = self._listener.accept()
            except OSError:  # timed out, or closed by close()
                return
            try:
                sock.settimeout(max(0.001, min(left, deadline - time.monotonic())))
                link = accept_hello(sock, self.rank, keys, self.agreement.context, expected,
                                    stall_timeout=self.stall_timeout, address_of=address_of)
            except (FrameRejectedError, OSError) as exc:
                logger.warning("rank %d: dropped a connection from %s:%d: %s", self.rank, where[0], where[1], exc)
                sock.close()
                continue
            expected.discard(link.peer)
            accepted[link.peer] = link

    # ------------------------------------------------------------ the threads
    def _sending(self, link: Link, q) -> None:
        while (rnd := q.get()) is not None:
            try:
                rnd.send_to(link)
            except (Stop, LinkClosed):
                pass
            except PeerLostError as exc:
                rnd.fail(exc, weak=True)
            except BaseException as exc:  # raised in the caller's thread
                rnd.fail(exc)
            finally:
                rnd.part_done()

    def _reading(self, link: Link, q) -> None:
        buffer = np.empty(self.piece_bytes, dtype=np.uint8)  # the one piece this connection holds
        while (rnd := q.get()) is not None:
            try:
                rnd.read_from(link, buffer)
            except (Stop, LinkClosed):
                pass
            except PeerLostError as exc:
                # A partner that closed without a notice may have aborted for a rank it could not name
                # to this one (its notice dropped behind a piece this rank held): a notice may still
                # come through another partner.
                rnd.fail(exc, weak=exc.reason == "closed" and exc.reported_by is None)
            except BaseException as exc:  # raised in the caller's thread
                rnd.fail(exc)
            finally:
                rnd.part_done()

    def _abort(self, exc: BaseException) -> None:
        """A round failed: tell every peer why, then shut every link."""
        self._error = exc
        if isinstance(exc, (PeerLostError, FrameRejectedError)) and exc.address is not None:
            rank, (host, port) = exc.rank, exc.address
            reason = exc.reason if isinstance(exc, PeerLostError) else "rejected"
        else:
            rank, (host, port), reason = self.rank, self.address, "failed"
        notice = {"rank": rank, "host": host, "port": port, "reason": reason, "message": str(exc)[:1000],
                  "by": self.rank}
        # Links whose sender is between frames first: a partner may hear of the loss only from this rank.
        for link in sorted(self.links.values(), key=lambda link: link.sending()):
            link.abort(notice)

    # ------------------------------------------------------------ the all-reduce
    def allreduce_weighted(self, vectors, weight: float, *, average: bool = True):
        """Average ``vectors`` over the ranks, weighted by each rank's
        ``weight``, in place.

        The arithmetic is the job path's, bit for bit: every rank scales its
        vectors by its weight (:func:`sparkavg.ops.scale`), the weighted
        vectors are summed in the one order of
        :func:`~sparkavg.transport.summation.ordered_sum` with
        :func:`sparkavg.ops.accumulate` (ranks of weight 0 missing, as a
        worker without examples returns nothing), the weights likewise, and
        the sum is scaled by ``1.0 / total_weight`` (skipped when that is
        1.0).

        Parameters
        ----------
        vectors : mapping of str to ndarray, sequence of ndarray, or ndarray
            1-D C-contiguous writeable float32 or float64 arrays, one dtype
            for all; every rank passes the same names (or count) and sizes,
            in the same order.  Overwritten with the average; on error their
            contents are undefined.
        weight : float
            This rank's weight (its examples), finite and ``>= 0``.
        average : bool, default True
            False: leave the weighted sums undivided (the driver's combined
            sums, for a caller that divides them itself).

        Returns
        -------
        (vectors, total_weight)
            ``vectors`` itself, averaged, and the sum of the weights.  When
            every weight is 0 nothing is sent, the vectors are left as they
            were and ``total_weight`` is 0.0.

        Raises
        ------
        PeerLostError
            A rank closed its connection or stalled (naming its rank and
            address, also where a partner reports it); the group is then
            unusable.
        FrameRejectedError
            A frame failed its tag or was not the one expected.
        ValueError, TypeError
            Bad vectors or weight, or ranks that disagree on the layout.
        """
        arrays, names = _as_arrays(vectors)
        weight = float(weight)
        if not (math.isfinite(weight) and weight >= 0):
            raise ValueError(f"Expect weight >= 0 and finite, got {weight}")
        if self._closed:
            raise TransportError(f"rank {self.rank}: the collective group is closed")
        if self._error is not None:
            raise self._error
        self._joined()
        if self.world > 1 and not self.links:
            raise RuntimeError(f"rank {self.rank}: call connect() or join_in_background() before allreduce_weighted()")
        if weight:
            for a in arrays:
                ops.scale(a, weight)
        layout = Layout(arrays, names, self.piece_bytes)
        number, self.rounds = self.rounds, self.rounds + 1
        if self.world == 1:
            if average and weight and 1.0 / weight != 1.0:
                for a in arrays:
                    ops.scale(a, 1.0 / weight)
            return vectors, weight
        rnd = self._round = Round(self.rank, self.world, number, layout, weight, self._abort, average=average,
                                  alive_every=COLLECTIVE_ALIVE_FRACTION * self.stall_timeout)
        for q in self._queues:
            q.put(rnd)
        try:
            rnd.own_part()
        except Stop:
            pass
        except BaseException as exc:
            rnd.fail(exc)
        with rnd.cond:
            rnd.cond.wait_for(lambda: rnd.pending == 0 or rnd.error is not None)
            if rnd.error is not None:  # let the threads leave the caller's arrays
                rnd.cond.wait_for(lambda: rnd.pending == 0, 1.0)
        self._round = None
        if rnd.error is not None:
            raise rnd.error
        return vectors, rnd.total

    def stats(self) -> dict:
        """Counters: ``rounds``, ``connections`` (made by :meth:`connect`:
        the partners),
        ``bytes_sent``/``bytes_received`` (frames) and
        ``payload_sent``/``payload_received`` (vector bytes)."""
        links = self.links.values()
        return {"rounds": self.rounds, "connections": len(self.links),
                **{k: sum(getattr(link, k) for link in links)
                   for k in ("bytes_sent", "bytes_received", "payload_sent", "payload_received")}}

    def close(self) -> None:
        """Close every connection and the listening socket; a round in
        progress in another thread fails.  Idempotent."""
        if self._closed:
            return
        self._closed = True
        rnd = self._round
        if rnd is not None:
            with rnd.cond:
                if rnd.error is None:
                    rnd.error = TransportError(f"rank {self.rank}: the collective group was closed during "
                                               f"round {rnd.number}")
                rnd.cond.notify_all()
        for link in self.links.values():
            link.shutdown()
        for q in self._queues:
            q.put(None)
        for t in self._threads:
            t.join(1.0)
        for link in self.links.values():
            link.close()
        self._stop_listening()

    def _stop_listening(self) -> None:
        try:
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes a thread blocked in accept()
        except OSError:
            pass
        self._listener.close()
