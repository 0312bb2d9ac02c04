"""Transport between real processes on 127.0.0.1: PeerGroup exactly-once under
injected loss / duplication / reordering (PLAIN), and a killed peer
making send / flush / finish raise PeerStalledError instead of hanging.

Worker functions live here (module level) so spawned children can import
them; this module imports nothing heavy on purpose.
"""
from __future__ import annotations

import collections
import hashlib
import multiprocessing
import random
import secrets
import time

import pytest

from sparkavg.transport import (FaultInjection, PeerGroup, PeerStalledError,
                                ReliableEndpoint, Topology)

CTX = multiprocessing.get_context("spawn")
WAIT = 60.0  # bound on any single wait on another process


def _payload(origin: int, index: int) -> bytes:
    """Deterministic message ``index`` of ``origin``: mostly small, sometimes multi-chunk."""
    rng = random.Random(origin * 100_003 + index)
    size = rng.choice([0, 17, 900, 3000, 3000, 70_000])
    return origin.to_bytes(4, "big") + index.to_bytes(4, "big") + rng.randbytes(size)


def _digest(payload: bytes) -> str:
    return hashlib.sha256(payload).hexdigest()


def _group_worker(rank, world, topology, key, job_id, config, n_messages, finish_timeout, addr_q,
                  peers_q, result_q, barrier):
    """One rank: publish, poll, finish, barrier; report digests of what it got."""
    endpoint = ReliableEndpoint(rank, key, job_id, limits=config)
    try:
        addr_q.put((rank, endpoint.address))
        endpoint.set_peers(peers_q.get(timeout=WAIT))
        group = PeerGroup(rank, world, endpoint, topology)
        got = []
        for i in range(n_messages):
            group.publish(_payload(rank, i))
            got += group.poll()
        got += group.finish(stall_timeout=finish_timeout)
        barrier.wait(timeout=WAIT)  # peers may still need our acks until all have finished
        result_q.put((rank, "ok", [(o, _digest(p)) for o, p in got], endpoint.stats(), group.stats()))
    except BaseException as exc:  # report, do not hang the parent
        result_q.put((rank, "error", exc, None, None))
    finally:
        endpoint.close()


def _idle_worker(rank, key, job_id, config, addr_q, peers_q, stop):
    """A rank that binds, acks whatever arrives, and waits to be killed."""
    endpoint = ReliableEndpoint(rank, key, job_id, limits=config)
    try:
        addr_q.put((rank, endpoint.address))
        endpoint.set_peers(peers_q.get(timeout=WAIT))
        stop.wait(WAIT)
    finally:
        endpoint.close()


class _Procs:
    """Start processes, and make sure none outlives the test."""

    def __init__(self):
        self.procs = {}

    def start(self, rank, target, *args):
        p = CTX.Process(target=target, args=args, name=f"rank{rank}", daemon=True)
        p.start()
        self.procs[rank] = p
        return p

    def stop(self):
        for p in self.procs.values():
            p.join(timeout=10)
        for p in self.procs.values():
            if p.is_alive():
                p.kill()
                p.join(timeout=5)


def _gather_addresses(addr_q, n) -> dict:
    """The test's stand-in for BarrierTaskContext.allGather of endpoint addresses."""
    table = {}
    while len(table) < n:
        rank, address = addr_q.get(timeout=WAIT)
        table[rank] = address
    return table


def _run_group(world, topology, config, n_messages):
    key, job_id = secrets.token_bytes(32), 42
    addr_q, peers_q, result_q = CTX.Queue(), CTX.Queue(), CTX.Queue()
    barrier = CTX.Barrier(world)
    procs = _Procs()
    try:
        for rank in range(world):
            procs.start(rank, _group_worker, rank, world, topology, key, job_id, config, n_messages,
                        WAIT / 2, addr_q, peers_q, result_q, barrier)
        table = _gather_addresses(addr_q, world)
        for _ in range(world):
            peers_q.put(table)
        results = {}
        while len(results) < world:
            rank, status, got, stats, gstats = result_q.get(timeout=WAIT)
            assert status == "ok", f"rank {rank} failed: {got!r}"
            results[rank] = (got, stats, gstats)
        return results
    finally:
        procs.stop()


def _check_exactly_once(results, world, n_messages):
    for rank, (got, _, _) in results.items():
        expected = collections.Counter((o, _digest(_payload(o, i)))
                                       for o in range(world) if o != rank for i in range(n_messages))
        received = collections.Counter(got)
        assert received == expected, (
            f"rank {rank}: missing {expected - received}, unexpected or duplicated {received - expected}")


# A shorter retransmit timeout than the 1 s default keeps the test quick; loss still costs retries.
LOSSY = dict(stall_timeout=WAIT / 2, retransmit_timeout=0.25,
                       faults=FaultInjection(loss=0.25, duplicate=0.2, reorder=0.2, seed=7))


@pytest.mark.slow
def test_plain_group_exactly_once_under_loss_duplication_reordering():
    world, n = 4, 12
    results = _run_group(world, Topology.PLAIN, LOSSY, n)
    _check_exactly_once(results, world, n)
    total = collections.Counter()
    for _, stats, _ in results.values():
        total.update(stats)
    assert total["injected_loss"] > 0 and total["injected_duplicate"] > 0 and total["injected_reorder"] > 0
    assert total["datagrams_retransmitted"] > 0, "loss was injected, so something must be retransmitted"
    # Only early arrivals (before a receiver's set_peers) may be refused; they are retransmitted.
    assert total["datagrams_invalid"] == total["rejected_unknown_peer"], total


def _start_idle_peer(procs, key, job_id, config):
    addr_q, peers_q, stop = CTX.Queue(), CTX.Queue(), CTX.Event()
    procs.start(1, _idle_worker, 1, key, job_id, config, addr_q, peers_q, stop)
    rank, address = addr_q.get(timeout=WAIT)
    return address, peers_q


def test_killed_peer_makes_send_and_flush_raise_naming_it():
    key, job_id = secrets.token_bytes(32), 5
    config = dict(stall_timeout=1.0, retransmit_timeout=0.2, send_window_messages=4,
                            recv_window_messages=4)
    procs = _Procs()
    with ReliableEndpoint(0, key, job_id, limits=config) as ep:
        try:
            address, peers_q = _start_idle_peer(procs, key, job_id, config)
            peers_q.put({0: ep.address, 1: address})
            ep.set_peers({1: address})
            ep.send(1, b"alive?")
            ep.flush(timeout=WAIT)  # the peer is up and acks

            procs.procs[1].kill()
            procs.procs[1].join(timeout=WAIT)

            for _ in range(4):  # fills the window of 4 unacked messages
                ep.send(1, b"x" * 100)
            t0 = time.monotonic()
            with pytest.raises(PeerStalledError) as info:
                ep.send(1, b"blocked")
            elapsed = time.monotonic() - t0
            assert info.value.ranks == (1,) and info.value.addresses == (tuple(address),)
            assert "rank 1" in str(info.value) and f"{address[0]}:{address[1]}" in str(info.value)
            assert elapsed < 1.0 + 2.0, f"send must give up after the 1 s stall timeout, took {elapsed:.1f} s"

            with pytest.raises(PeerStalledError) as info:
                ep.flush(timeout=WAIT)
            assert info.value.ranks == (1,)
        finally:
            procs.stop()


@pytest.mark.slow
def test_killed_peer_makes_finish_raise_naming_it():
    world, key, job_id = 3, secrets.token_bytes(32), 9
    config = dict(stall_timeout=WAIT, retransmit_timeout=0.2)
    addr_q, peers_q, result_q = CTX.Queue(), CTX.Queue(), CTX.Queue()
    barrier = CTX.Barrier(2)
    procs = _Procs()
    with ReliableEndpoint(0, key, job_id, limits=config) as ep:
        try:
            procs.start(1, _group_worker, 1, world, Topology.PLAIN, key, job_id, config, 3, 3.0,
                        addr_q, peers_q, result_q, barrier)
            stop = CTX.Event()
            procs.start(2, _idle_worker, 2, key, job_id, config, addr_q, peers_q, stop)
            table = _gather_addresses(addr_q, 2)
            table[0] = ep.address
            peers_q.put(table)
            peers_q.put(table)
            ep.set_peers(table)
            group = PeerGroup(0, world, ep, Topology.PLAIN)
            for i in range(3):
                group.publish(_payload(0, i))
            got, deadline = [], time.monotonic() + WAIT
            while len(got) < 3 and time.monotonic() < deadline:  # rank 1 is up and publishing
                got += group.poll(timeout=0.5)
            assert sorted(got) == sorted((1, _payload(1, i)) for i in range(3))
            procs.procs[2].kill()
            procs.procs[2].join(timeout=WAIT)

            t0 = time.monotonic()
            with pytest.raises(PeerStalledError) as info:
                group.finish(stall_timeout=1.5)
            elapsed = time.monotonic() - t0
            assert info.value.ranks == (2,), str(info.value)
            assert "[2] incomplete" in str(info.value)
            assert elapsed < 1.5 + 2.0, f"finish must give up after its 1.5 s stall timeout, took {elapsed:.1f} s"
            # Rank 1 got everything from rank 0 and nothing from the dead rank 2 either.
            rank, status, exc, _, _ = result_q.get(timeout=WAIT)
            assert rank == 1 and status == "error" and isinstance(exc, PeerStalledError), exc
            assert exc.ranks == (2,), str(exc)
        finally:
            procs.stop()
