"""The TCP all-reduce of :mod:`sparkavg.transport.collective` over real
sockets on 127.0.0.1: ranks as threads and as spawned processes.

The reference is the job path's own arithmetic: each worker's
``RoundResult`` of ``ops.scale``-d vectors, the driver's sum of them with
``combine_results`` in the one order (``summation.in_order``, as the
deals sum), and ``merge_sums``'s division.

Worker functions live at module level so spawned children can import them.
"""
from __future__ import annotations

import hashlib
import multiprocessing
import os
import pickle
import signal
import socket
import threading
import time

import numpy as np
import pytest

from sparkavg import ops
from sparkavg.transport import (CollectiveGroup, FrameRejectedError, KeyAgreement, PeerLostError, PeerStalledError,
                                TransportError)
from sparkavg.transport.links import HEADER, HELLO, TAG_BYTES, Kind, tcp_pair_keys
from sparkavg.transport.reduction import Schedule, partners

from .ranks import on_threads
from sparkavg.transport.summation import in_order, ordered_sum, total_weight

CTX = multiprocessing.get_context("spawn")
WAIT = 60.0  # bound on any single wait on another thread or process
CONTEXT = 0x5EED


# ------------------------------------------------------------ helpers
def _groups(world, context=CONTEXT, **kw):
    kw.setdefault("stall_timeout", 10.0)
    return [CollectiveGroup(KeyAgreement(r, context), world, host="127.0.0.1", **kw) for r in range(world)]


def _on_threads(fn, world):
    """``fn(rank)`` on one thread per rank; ``[(value, error)]`` by rank."""
    out = on_threads(fn, range(world), WAIT)
    return [out[r] for r in range(world)]


def _values(results):
    errors = [e for _, e in results if e is not None]
    if errors:
        raise errors[0]
    return [v for v, _ in results]


@pytest.fixture
def mesh():
    """``mesh(world, **kw)``: connected groups, closed after the test."""
    made = []

    def make(world, tables=None, **kw):
        groups = _groups(world, **kw)
        made.extend(groups)
        table = [g.entry() for g in groups]
        _values(_on_threads(lambda r: groups[r].connect(tables[r] if tables else table), world))
        return groups

    yield make
    for g in made:
        g.close()


def _job_sums(vectors_by_rank, weights):
    """The driver's sum: workers' ``RoundResult``s of ``ops.scale``-d copies
    of ``(params, updater, buffers)`` (none for weight 0), summed with
    ``combine_results`` as the deals do (``summation.in_order``); None when
    no worker trained."""
    from sparkavg.spark.executor.averaging import RoundResult, combine_results

    results = []
    for vectors, w in zip(vectors_by_rank, weights):
        if not w:
            results.append(None)
            continue
        params, state, buffers = (v.copy() for v in vectors)
        for v in (params, state, buffers):
            ops.scale(v, w)
        results.append(RoundResult(w, params, state, buffers, 0.0, 1, 1, 0, [], [], [], None))
    return in_order([(w, x) for w, x in enumerate(results) if x is not None], int, len(results), combine_results)


def _job_path(vectors_by_rank, weights):
    """The driver's average: :func:`_job_sums` divided as ``merge_sums``
    divides; ``([params, updater, buffers], total weight)``."""
    total = _job_sums(vectors_by_rank, weights)
    if total is None:
        return None, 0.0
    inv = 1.0 / total.weight
    out = [total.params, total.state, total.buffers]
    for v in out:
        if v.size and inv != 1.0:
            ops.scale(v, inv)
    return out, total.weight


def _same_bits(a, b) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


# ------------------------------------------------------------ arithmetic
SIZES = {"odd": (7, 3, 1001), "tiny": (1, 0, 2), "mixed": (33, 65, 0)}


@pytest.mark.parametrize("world", [1, 2, 3, 4, 5, 6])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("sizes", list(SIZES))
def test_the_average_is_bit_identical_to_the_job_path(mesh, world, dtype, sizes):
    groups = mesh(world, piece_bytes=64)  # many pieces: the streaming path
    rng = np.random.default_rng(world * 100 + len(sizes))
    ports = {g.rank: {p: link.sock.getsockname() for p, link in g.links.items()} for g in groups}
    for round_no in range(3):
        vectors = [[rng.standard_normal(n).astype(dtype) for n in SIZES[sizes]] for _ in range(world)]
        weights = [float(w) for w in rng.integers(0, 40, size=world)]
        weights[round_no % world] = 37.0  # at least one worker trained
        if round_no == 2:
            weights = [w + 0.1 * (r + 1) for r, w in enumerate(weights)]  # fractional weights too
        expected, expected_total = _job_path(vectors, weights)

        def rank_round(r):
            mine = dict(zip(("params", "updater", "buffers"), (v.copy() for v in vectors[r])))
            out, total = groups[r].allreduce_weighted(mine, weights[r])
            assert out is mine
            return list(mine.values()), total

        for r, (got, total) in enumerate(_values(_on_threads(rank_round, world))):
            assert total == expected_total, (r, total, expected_total)
            for name, a, b in zip(("params", "updater", "buffers"), got, expected):
                assert _same_bits(a, b), f"rank {r}, round {round_no}: {name} differs from the job path"
    for g in groups:
        assert g.stats()["rounds"] == 3 and g.stats()["connections"] == len(partners(g.rank, world))
        # the same connections served every round
        assert {p: link.sock.getsockname() for p, link in g.links.items()} == ports[g.rank]


@pytest.mark.parametrize("world", [1, 3])
def test_undivided_sums_are_the_drivers_combined_sums_bit_for_bit(mesh, world):
    groups = mesh(world, piece_bytes=64)
    rng = np.random.default_rng(7 + world)
    vectors = [[rng.standard_normal(n).astype(np.float32) for n in (9, 5, 3)] for _ in range(world)]
    weights = [5.0, 0.0, 12.0][:world]
    expected = _job_sums(vectors, weights)

    def rank_round(r):
        mine = [v.copy() for v in vectors[r]]
        return groups[r].allreduce_weighted(mine, weights[r], average=False)

    for r, (got, total) in enumerate(_values(_on_threads(rank_round, world))):
        assert total == expected.weight
        for name, a, b in zip(("params", "updater", "buffers"), got,
                              (expected.params, expected.state, expected.buffers)):
            assert _same_bits(a, b), f"rank {r}: {name} differs from the driver's combined sums"


def test_a_real_network_round_is_bit_identical_to_the_job_path(mesh):
    from sparkavg.averaging import merge_sums, start_of

    from .nets import blobs, small_net

    world = 3
    groups = mesh(world, piece_bytes=256)
    x, y = blobs(60, seed=3)
    shards = [(0, 8), (8, 28), (28, 60)]  # 8, 20 and 32 examples: the weights
    replicas = []
    for lo, hi in shards:
        net = small_net(seed=5)
        for a in range(lo, hi, 4):
            net.fit_batch(x[a:a + 4], y[a:a + 4])
        replicas.append(net)
    vectors = [[net.state["params"].copy(), net.state["updater"].copy(), np.zeros(0, np.float32)]
               for net in replicas]
    weights = [float(hi - lo) for lo, hi in shards]
    sums = _job_sums(vectors, weights)
    driver = small_net(seed=5)
    merge_sums(driver, {"params": sums.params, "updater": sums.state, "buffers": sums.buffers}, sums.weight, 0,
               start=start_of(driver), workers=world, batches=15)

    def rank_round(r):
        mine = {"params": replicas[r].state["params"].copy(), "updater": replicas[r].state["updater"].copy()}
        return groups[r].allreduce_weighted(mine, weights[r])

    for mine, got_total in _values(_on_threads(rank_round, world)):
        assert got_total == sums.weight == 60.0
        assert _same_bits(mine["params"], driver.state["params"])
        assert _same_bits(mine["updater"], driver.state["updater"])


@pytest.mark.parametrize("world", [1, 2, 3, 4, 5, 6, 7, 8, 9])
@pytest.mark.parametrize("weighing", ["examples", "uniform", "fractional"])
@pytest.mark.parametrize("average", [True, False])
def test_the_all_reduce_sums_in_the_one_order(mesh, world, weighing, average):
    """Every rank ends with ``ordered_sum`` of the weighted vectors, bit for
    bit: non-powers of two (a fold), missing ranks (weight 0), vectors of
    odd lengths cut in pieces smaller than each of them."""
    groups = mesh(world, piece_bytes=24)  # 6 float32s a piece
    rng = np.random.default_rng(1000 + world)
    sizes = (13, 1, 0, 29)
    for round_no in range(2):
        vectors = [[rng.standard_normal(n).astype(np.float32) for n in sizes] for _ in range(world)]
        if weighing == "uniform":  # DL4J's unweighted mean
            weights = [1.0] * world
        else:
            weights = [float(w) for w in rng.integers(0, 5, size=world)]  # some 0: missing
            weights[(round_no * 3) % world] = 7.0
            if weighing == "fractional":
                weights = [w * 0.37 for w in weights]
        total = total_weight(weights)
        expected = []
        for k in range(len(sizes)):
            scaled = [ops.scale(v[k].copy(), w) if w else None for v, w in zip(vectors, weights)]
            out = ordered_sum(scaled)
            if average and 1.0 / total != 1.0:
                ops.scale(out, 1.0 / total)
            expected.append(out)

        def rank_round(r):
            mine = [v.copy() for v in vectors[r]]
            return groups[r].allreduce_weighted(mine, weights[r], average=average)

        for r, (got, got_total) in enumerate(_values(_on_threads(rank_round, world))):
            assert got_total == total, (r, got_total, total)
            for k, (a, b) in enumerate(zip(got, expected)):
                assert _same_bits(a, b), f"world {world}, rank {r}, round {round_no}: vector {k} differs"


@pytest.mark.parametrize("world", [2, 3, 4, 5, 8])
def test_each_rank_sends_two_p_minus_one_over_p_of_the_vector_and_a_fold_one_more(mesh, world):
    groups = mesh(world, piece_bytes=1024)
    n = 10_007
    p = 1 << (world.bit_length() - 1)
    _values(_on_threads(lambda r: groups[r].allreduce_weighted(np.ones(n, np.float32), 1.0), world))
    for r, g in enumerate(groups):
        stats, plan = g.stats(), Schedule(r, world, n)
        assert stats["connections"] == len(partners(r, world)) <= (p.bit_length() - 1) + 1
        if plan.extra:  # its vector in, the result out
            assert stats["payload_sent"] == stats["payload_received"] == 4 * n
            continue
        halves = sum(hi - lo for lo, hi in plan.send) + sum(hi - lo for lo, hi in plan.keep)
        assert abs(halves - 2 * (p - 1) / p * n) <= 2 * (p.bit_length() - 1)  # the halves of an odd n
        fold = n if plan.fold is not None else 0
        assert stats["payload_sent"] == stats["payload_received"] == 4 * (halves + fold)
    assert sum(g.stats()["payload_sent"] for g in groups) == sum(g.stats()["payload_received"] for g in groups)


def test_zero_weights_contribute_nothing_and_all_zero_leaves_the_vectors(mesh):
    groups = mesh(3, piece_bytes=64)
    vectors = [np.full(11, -0.0, np.float32), np.arange(11, dtype=np.float32), np.full(11, np.nan, np.float32)]
    results = _values(_on_threads(lambda r: groups[r].allreduce_weighted(vectors[r].copy(), [0.0, 3.0, 0.0][r]),
                                  3))
    expected = vectors[1].copy()
    ops.scale(ops.scale(expected, 3.0), 1.0 / 3.0)
    for out, total in results:
        assert total == 3.0 and _same_bits(out, expected)
    sent = [g.stats()["payload_sent"] for g in groups]
    results = _values(_on_threads(lambda r: groups[r].allreduce_weighted(vectors[r].copy(), 0.0), 3))
    for r, (out, total) in enumerate(results):
        assert total == 0.0 and _same_bits(out, vectors[r])
    assert [g.stats()["payload_sent"] for g in groups] == sent


# ------------------------------------------------------------ joining while training
class _ThreadGather:
    """An all-gather across threads, as ``BarrierTaskContext.allGather``:
    every rank's text, by rank, once all ``world`` ranks have called it."""

    def __init__(self, world, delay=0.0):
        self.texts, self.delay = [None] * world, delay
        self.barrier = threading.Barrier(world)

    def for_rank(self, rank):
        def gather(text):
            self.texts[rank] = text
            self.barrier.wait(WAIT)
            time.sleep(self.delay)  # Spark answers on a poll
            return list(self.texts)
        return gather


def test_ranks_that_join_while_they_train_average_as_connected_ones(mesh):
    world, n = 3, 5003
    vectors = [np.random.default_rng(r).standard_normal(n).astype(np.float32) for r in range(world)]
    joined = _groups(world)
    gather = _ThreadGather(world, delay=0.3)
    began = time.perf_counter()
    try:
        for r, g in enumerate(joined):  # returns at once: the meeting runs in the background
            g.join_in_background(gather.for_rank(r))
        assert time.perf_counter() - began < 0.3
        results = _values(_on_threads(lambda r: joined[r].allreduce_weighted(vectors[r].copy(), r + 1.0), world))
        assert all(len(g.links) == len(partners(g.rank, world)) for g in joined)
        with pytest.raises(RuntimeError, match="already joining or connected"):
            joined[0].join_in_background(gather.for_rank(0))
    finally:
        for g in joined:
            g.close()
    connected = mesh(world)
    expected = _values(_on_threads(lambda r: connected[r].allreduce_weighted(vectors[r].copy(), r + 1.0), world))
    for (out, total), (ref, ref_total) in zip(results, expected):
        assert total == ref_total == 6.0 and _same_bits(out, ref)


def test_a_failed_meeting_is_raised_by_the_first_all_reduce():
    (group,) = _groups(1)

    def gather(text):
        raise ConnectionError("the barrier coordinator is gone")

    try:
        group.join_in_background(gather)
        with pytest.raises(ConnectionError, match="coordinator is gone"):
            group.allreduce_weighted(np.ones(3, np.float32), 1.0)
    finally:
        group.close()


def test_a_meeting_that_never_answers_is_named_within_twice_the_stall_timeout():
    stall = 0.3
    groups = _groups(2, stall_timeout=stall)
    never = threading.Event()
    try:
        groups[0].join_in_background(lambda text: never.wait(WAIT) and [])
        began = time.perf_counter()
        with pytest.raises(PeerStalledError, match=r"rank 0: the ranks' addresses \(allGather\)"):
            groups[0].allreduce_weighted(np.ones(3, np.float32), 1.0)
        assert 2 * stall <= time.perf_counter() - began < 2 * stall + 2.0
    finally:
        never.set()
        for g in groups:
            g.close()


# ------------------------------------------------------------ keys and validation
def test_tcp_keys_differ_from_the_datagram_keys_and_both_ends_agree():
    a, b = KeyAgreement(0, CONTEXT), KeyAgreement(1, CONTEXT)
    publics = {0: a.public, 1: b.public}
    assert tcp_pair_keys(a, publics)[1] == tcp_pair_keys(b, publics)[0]
    assert tcp_pair_keys(a, publics)[1] != a.pair_keys(publics)[1]


def test_bad_arguments_are_named():
    (g,) = _groups(1)
    with g:
        with pytest.raises(ValueError, match="Expect weight >= 0 and finite, got -1.0"):
            g.allreduce_weighted(np.ones(3, np.float32), -1)
        with pytest.raises(TypeError, match=r"Expect vectors\['w'\] of dtype float32 or float64, got int64"):
            g.allreduce_weighted({"w": np.ones(3, np.int64)}, 1.0)
        with pytest.raises(TypeError, match="Expect every vector of one dtype"):
            g.allreduce_weighted([np.ones(3, np.float32), np.ones(3)], 1.0)
        with pytest.raises(ValueError, match="1-D, C-contiguous, writeable"):
            g.allreduce_weighted(np.ones(6, np.float32)[::2], 1.0)
        with pytest.raises(ValueError, match="expect entries for ranks 0..0"):
            g.connect([])
    with pytest.raises(ValueError, match="Expect piece_bytes a positive multiple of 8, got 12"):
        _groups(1, piece_bytes=12)


def test_ranks_that_disagree_on_the_layout_name_each_other(mesh):
    groups = mesh(2)
    sizes = [5, 6]
    results = _on_threads(lambda r: groups[r].allreduce_weighted(np.ones(sizes[r], np.float32), 1.0), 2)
    for r, (_, error) in enumerate(results):
        assert isinstance(error, (ValueError, PeerLostError)), error
    assert any(isinstance(e, ValueError) and f"rank {1 - r}" in str(e) for r, (_, e) in enumerate(results))


def test_a_stranger_is_dropped_and_the_real_peer_still_joins():
    groups = _groups(2)
    try:
        stranger = socket.create_connection(groups[0].address)
        stranger.sendall(b"SAVT" + bytes(HELLO.size + TAG_BYTES - 4))  # a hello without a valid tag
        table = [g.entry() for g in groups]
        _values(_on_threads(lambda r: groups[r].connect(table), 2))
        assert stranger.recv(1) == b""  # dropped
        stranger.close()
        results = _values(_on_threads(lambda r: groups[r].allreduce_weighted(np.full(5, r, np.float64), 1.0), 2))
        assert all(np.array_equal(out, np.full(5, 0.5)) for out, _ in results)
    finally:
        for g in groups:
            g.close()


def test_a_rank_of_another_stage_attempt_cannot_connect():
    first = CollectiveGroup(KeyAgreement(0, CONTEXT), 2, host="127.0.0.1", stall_timeout=1.0)
    other = CollectiveGroup(KeyAgreement(1, CONTEXT + 1), 2, host="127.0.0.1", stall_timeout=1.0)
    try:
        # rank 1 of another attempt publishes its own key: rank 0 derives keys that never verify
        table = [first.entry(), other.entry()]
        results = _on_threads(lambda r: (first, other)[r].connect(table), 2)
        for r, (_, error) in enumerate(results):
            assert isinstance(error, (PeerLostError, FrameRejectedError)), error
            assert error.rank == 1 - r
    finally:
        for g in (first, other):
            g.close()


def test_transport_errors_pickle_with_their_fields():
    lost = PeerLostError("rank 0: rank 2 at h:1 closed", 2, ("h", 1), "closed", reported_by=1)
    back = pickle.loads(pickle.dumps(lost))
    assert (type(back), back.rank, back.address, back.reason, back.reported_by) == (PeerLostError, 2, ("h", 1),
                                                                                    "closed", 1)
    rejected = pickle.loads(pickle.dumps(FrameRejectedError("m", 1, ("h", 2), "tag")))
    assert (rejected.rank, rejected.address, rejected.reason) == (1, ("h", 2), "tag")


# ------------------------------------------------------------ tampering
def _read_exact(sock, n):
    buf = b""
    while len(buf) < n:
        part = sock.recv(n - len(buf))
        if not part:
            return None
        buf += part
    return buf


class _Relay:
    """A TCP relay between a dialer and its acceptor that alters the
    ``nth`` DATA frame the dialer sends: ``"flip"`` one payload bit,
    ``"replay"`` it twice, ``"swap"`` it with the next frame."""

    def __init__(self, target, mode, nth=2):
        self.target, self.mode, self.nth = target, mode, nth
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.done = []
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self):
        a, _ = self.listener.accept()
        b = socket.create_connection(self.target)
        threading.Thread(target=self._pump, args=(b, a), daemon=True).start()  # acceptor -> dialer as is
        try:
            b.sendall(_read_exact(a, HELLO.size + TAG_BYTES))
            seen, held = 0, None
            while (head := _read_exact(a, HEADER.size)) is not None:
                kind, _, _, _, _, length = HEADER.unpack(head)
                frame = bytearray(head + _read_exact(a, length + TAG_BYTES))
                if kind == Kind.DATA:
                    seen += 1
                    if seen == self.nth:
                        self.done.append(self.mode)
                        if self.mode == "flip":
                            frame[HEADER.size] ^= 1
                        elif self.mode == "replay":
                            b.sendall(frame)
                        else:
                            held = frame
                            continue
                b.sendall(frame)
                if held is not None:
                    b.sendall(held)
                    held = None
        except OSError:
            while a.recv(65536):  # keep the dialer's sends flowing until it stops
                pass
        finally:
            _shut(b)

    @staticmethod
    def _pump(src, dst):
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            _shut(dst)


def _shut(sock):
    try:
        sock.shutdown(socket.SHUT_WR)
    except OSError:  # the other end is gone already
        pass


@pytest.mark.parametrize("mode", ["flip", "replay", "swap"])
def test_an_altered_replayed_or_reordered_frame_is_refused_naming_the_sender(mode):
    groups = _groups(2, piece_bytes=64)
    relay = _Relay(groups[0].address, mode)
    table = [g.entry() for g in groups]
    via_relay = [dict(table[0], port=relay.port), table[1]]  # rank 1 dials rank 0 through the relay
    try:
        _values(_on_threads(lambda r: groups[r].connect(table if r == 0 else via_relay), 2))
        results = _on_threads(lambda r: groups[r].allreduce_weighted(np.arange(101, dtype=np.float32), 1.0), 2)
    finally:
        for g in groups:
            g.close()
    assert relay.done == [mode]
    refused, told = results[0][1], results[1][1]
    assert isinstance(refused, FrameRejectedError) and (refused.rank, refused.reason) == (1, "tag")
    assert refused.address == ("127.0.0.1", groups[1].address[1])
    assert isinstance(told, PeerLostError) and (told.rank, told.reason) == (0, "rejected")


# ------------------------------------------------------------ lost peers
def _round_without_rank_2(group, rank):
    """One round on ``group`` that rank 2 misses: (the PeerLostError it ends with, seconds it took)."""
    began = time.monotonic()
    try:
        group.allreduce_weighted(np.ones(50, np.float32), 1.0)
    except PeerLostError as exc:
        return exc, time.monotonic() - began
    raise AssertionError(f"rank {rank} finished a round without rank 2")


@pytest.mark.parametrize("world", [3, 5, 8])
def test_a_peer_that_closes_mid_round_is_named(mesh, world):
    stall = 10.0
    groups = mesh(world, stall_timeout=stall)
    _values(_on_threads(lambda r: groups[r].allreduce_weighted(np.ones(50, np.float32), 1.0), world))

    def second_round(r):
        if r == 2:
            groups[2].close()  # gone instead of its second round
            return None
        return _round_without_rank_2(groups[r], r)

    for r, value in enumerate(_values(_on_threads(second_round, world))):
        if r == 2:
            continue
        exc, seconds = value  # a partner of rank 2 sees it close; the others hear it from their partners
        assert (exc.rank, exc.address, exc.reason) == (2, groups[2].address, "closed"), (r, exc)
        assert seconds < stall + 1.0
        with pytest.raises(PeerLostError):  # the group stays failed
            groups[r].allreduce_weighted(np.ones(50, np.float32), 1.0)


@pytest.mark.parametrize("world", [3, 5, 8])
def test_a_peer_that_stalls_is_named_within_the_stall_timeout(mesh, world):
    stall = 1.0
    groups = mesh(world, stall_timeout=stall)
    release, survivors = threading.Event(), []

    def stalled_round(r):
        if r == 2:
            release.wait(WAIT)  # connected, silent
            return None
        try:
            return _round_without_rank_2(groups[r], r)
        finally:
            survivors.append(r)
            if len(survivors) == world - 1:
                release.set()

    for r, value in enumerate(_values(_on_threads(stalled_round, world))):
        if r == 2:
            continue
        # ranks not connected to rank 2 wait on partners that wait on it: their ALIVE frames keep those
        # links from stalling, so every survivor names rank 2, which only its partners saw stall.  The
        # first partner to see it (the stall timeout after its own round began) tells the others: a rank
        # that began its round a little later hears it that much sooner on its own clock.
        exc, seconds = value
        assert (exc.rank, exc.address, exc.reason) == (2, groups[2].address, "stalled"), (r, exc)
        assert stall - 0.5 <= seconds < stall + 1.0


def test_a_group_closed_during_a_round_raises_there_and_its_partners_name_it(mesh):
    world = 5  # rank 4 folds into rank 0, which waits for it
    groups = mesh(world, stall_timeout=10.0)
    release = threading.Event()

    def a_round(r):
        if r == 4:
            release.wait(WAIT)  # not in the round yet
            return None
        try:
            groups[r].allreduce_weighted(np.ones(50, np.float32), 1.0)
        except TransportError as exc:
            return exc
        finally:
            if r == 0:
                release.set()
        raise AssertionError(f"rank {r} finished a round rank 0 closed")

    def close_rank_0_in_its_round():
        deadline = time.monotonic() + WAIT
        while groups[0]._round is None and time.monotonic() < deadline:  # poll until it waits in the round
            time.sleep(0.005)
        groups[0].close()

    closer = threading.Thread(target=close_rank_0_in_its_round, daemon=True)
    closer.start()
    results = _values(_on_threads(a_round, world))
    closer.join(WAIT)
    assert type(results[0]) is TransportError and "closed during round 0" in str(results[0])
    for r in (1, 2, 3):
        assert isinstance(results[r], PeerLostError) and (results[r].rank, results[r].reason) == (0, "closed"), r


# ------------------------------------------------------------ processes
def _vectors(rank, round_no, n=3001):
    rng = np.random.default_rng(rank * 1000 + round_no)
    return [rng.standard_normal(n).astype(np.float32), rng.standard_normal(n // 2).astype(np.float32),
            np.zeros(0, np.float32)]


def _weight(rank, round_no):
    return float((rank * 7 + round_no * 3) % 5)


def _digest(arrays):
    return hashlib.sha256(b"".join(a.tobytes() for a in arrays)).hexdigest()


def _process_rank(rank, world, rounds, stall, entry_q, table_q, result_q, hold):
    """One rank in its own process: connect, run ``rounds`` rounds, report
    digests; with ``hold``, wait after the first round to be killed."""
    group = CollectiveGroup(KeyAgreement(rank, CONTEXT), world, host="127.0.0.1", stall_timeout=stall,
                            piece_bytes=4096)
    try:
        entry_q.put(group.entry())
        group.connect(table_q.get(timeout=WAIT))
        for round_no in range(rounds):
            if hold and round_no == 1:
                result_q.put((rank, "holding", None))
                time.sleep(WAIT)  # until killed
            mine = _vectors(rank, round_no)
            try:
                _, total = group.allreduce_weighted(mine, _weight(rank, round_no))
            except PeerLostError as exc:
                result_q.put((rank, "lost", (exc.rank, exc.address, exc.reason, time.monotonic())))
                return
            result_q.put((rank, "round", (round_no, total, _digest(mine), group.stats()["connections"])))
    except BaseException as exc:  # report, do not hang the parent
        result_q.put((rank, "error", repr(exc)))
    finally:
        group.close()


def _start(world, rounds, stall, hold=()):
    """Spawn the ranks; ``(processes, table, result queue per rank)`` (one
    queue each: a killed process may die holding a shared queue's lock)."""
    entry_q = CTX.Queue()
    table_qs, result_qs = [CTX.Queue() for _ in range(world)], [CTX.Queue() for _ in range(world)]
    procs = [CTX.Process(target=_process_rank, args=(r, world, rounds, stall, entry_q, table_qs[r], result_qs[r],
                                                     r in hold), daemon=True) for r in range(world)]
    for p in procs:
        p.start()
    table = sorted((entry_q.get(timeout=WAIT) for _ in range(world)), key=lambda e: e["rank"])
    for q in table_qs:
        q.put(table)
    return procs, table, result_qs


def test_ranks_in_processes_average_bit_identically_over_rounds():
    world, rounds = 3, 3
    procs, _, result_qs = _start(world, rounds, stall=WAIT)
    try:
        got = [q.get(timeout=WAIT) for q in result_qs for _ in range(rounds)]
    finally:
        for p in procs:
            p.join(WAIT)
    assert all(kind == "round" for _, kind, _ in got), got
    for round_no in range(rounds):
        weights = [_weight(r, round_no) for r in range(world)]
        expected, total = _job_path([_vectors(r, round_no) for r in range(world)], weights)
        for rank, _, (number, got_total, digest, connections) in got:
            if number == round_no:
                assert (got_total, digest, connections) == (total, _digest(expected), len(partners(rank, world))), \
                    rank


def test_a_killed_process_is_named_by_the_survivors_within_the_stall_timeout():
    world, stall = 3, 3.0
    procs, table, result_qs = _start(world, rounds=2, stall=stall, hold={2})
    try:
        for rank in range(world):  # the first round, everywhere
            assert result_qs[rank].get(timeout=WAIT)[1] == "round"
        assert result_qs[2].get(timeout=WAIT)[1] == "holding"  # the survivors are in (or entering) the second
        os.kill(procs[2].pid, signal.SIGKILL)
        killed = time.monotonic()
        lost = {rank: result_qs[rank].get(timeout=WAIT) for rank in (0, 1)}
    finally:
        for p in procs:
            p.join(WAIT)
    for rank, (_, kind, value) in lost.items():
        assert kind == "lost", (rank, kind, value)
        lost_rank, address, reason, when = value
        assert (lost_rank, tuple(address), reason) == (2, (table[2]["host"], table[2]["port"]), "closed")
        assert when - killed < stall + 1.0, rank
