"""PeerGroup with every rank on its own thread and UDP socket in this process
(the separate-process versions are in test_transport_processes.py)."""
from __future__ import annotations

import collections
import secrets
import threading

import pytest

from sparkavg.transport import (PeerGroup, PeerStalledError, ReliableEndpoint,
                                Topology, TransportError)

WAIT = 20.0
KEY = secrets.token_bytes(32)


def _endpoints(world, config=None):
    config = config or dict(stall_timeout=WAIT, retransmit_timeout=0.25)
    eps = [ReliableEndpoint(r, KEY, 3, limits=config) for r in range(world)]
    table = {r: ep.address for r, ep in enumerate(eps)}
    for ep in eps:
        ep.set_peers(table)
    return eps


def _message(origin, i):
    return f"{origin}:{i}:".encode() + bytes(i * 37 % 5000)


def _run_ranks(eps, topology, n, dead=(), finish_timeout=WAIT):
    """Run every live rank on a thread; return {rank: messages or exception}."""
    world = len(eps)
    live = [r for r in range(world) if r not in dead]
    barrier = threading.Barrier(len(live))
    results = {}

    def rank_main(rank):
        group = PeerGroup(rank, world, eps[rank], topology)
        try:
            got = []
            for i in range(n):
                group.publish(_message(rank, i))
                got += group.poll()
            got += group.finish(finish_timeout)
            results[rank] = (got, group.stats())
        except Exception as exc:
            results[rank] = exc
        try:
            barrier.wait(WAIT)  # keep acking until every rank is done
        except threading.BrokenBarrierError:
            pass

    threads = [threading.Thread(target=rank_main, args=(r,), daemon=True) for r in live]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT * 2)
    assert not any(t.is_alive() for t in threads), "a rank hung"
    return results


@pytest.mark.parametrize("topology, world", [(Topology.PLAIN, 5), (Topology.PLAIN, 12)])
def test_every_rank_gets_every_other_message_once(topology, world):
    n = 5
    eps = _endpoints(world)
    try:
        results = _run_ranks(eps, topology, n)
    finally:
        for ep in eps:
            ep.close()
    for rank in range(world):
        assert not isinstance(results[rank], Exception), f"rank {rank}: {results[rank]!r}"
        got, _ = results[rank]
        expected = collections.Counter((o, _message(o, i)) for o in range(world) if o != rank for i in range(n))
        assert collections.Counter(got) == expected, f"rank {rank} got the wrong messages"


def test_a_dead_peer_makes_finish_name_it():
    world = 4
    eps = _endpoints(world)
    eps[1].close()                      # rank 1 dies before doing anything
    try:
        results = _run_ranks(eps, Topology.PLAIN, 2, dead={1}, finish_timeout=1.5)
    finally:
        for ep in eps:
            ep.close()
    for rank in (0, 2, 3):
        err = results[rank]
        assert isinstance(err, PeerStalledError) and err.ranks == (1,), f"rank {rank}: {err!r}"


def test_group_rejects_misuse():
    eps = _endpoints(2)
    try:
        with pytest.raises(ValueError, match="Expect the endpoint of rank 1, got one of rank 0"):
            PeerGroup(1, 2, eps[0])
        with pytest.raises(ValueError, match="Expect 0 <= rank < world_size"):
            PeerGroup(0, 0, eps[0])
        with pytest.raises(ValueError, match=r"know peer ranks \[2\]"):
            PeerGroup(0, 3, eps[0])
        with pytest.raises(TypeError, match="Topology"):
            PeerGroup(0, 2, eps[0], "plain")
        with pytest.raises(ValueError, match="TreeGroup"):
            PeerGroup(0, 2, eps[0], Topology.TREE)
        g0, g1 = PeerGroup(0, 2, eps[0]), PeerGroup(1, 2, eps[1])
        eps[0].send(1, b"\x01\x00")     # a frame too short to be a group message
        g0.publish(b"ok")
        got = g1.poll(timeout=WAIT)
        while len(got) < 1:
            got += g1.poll(timeout=WAIT)
        assert got == [(0, b"ok")]
        other = threading.Thread(target=g0.finish, args=(WAIT,), daemon=True)
        other.start()
        assert g1.finish(WAIT) == []
        other.join(WAIT)
        assert g1.stats()["malformed"] == 1
        with pytest.raises(TransportError, match="after finish"):
            g0.publish(b"late")
        with pytest.raises(TransportError, match="twice"):
            g0.finish(WAIT)
    finally:
        for ep in eps:
            ep.close()


@pytest.mark.parametrize("topology, world, loss", [(Topology.PLAIN, 4, 0.0), (Topology.PLAIN, 3, 0.2),
                                                   (Topology.PLAIN, 7, 0.1)])
def test_ranks_leave_together_and_close_at_once_without_a_barrier(topology, world, loss):
    """finish() then leave(), then close straight away -- no barrier: every rank still gets every
    message, also with datagrams lost and one rank far behind the others."""
    import time

    from sparkavg.transport import FaultInjection

    n = 6
    config = dict(stall_timeout=WAIT, retransmit_timeout=0.25, faults=FaultInjection(loss=loss, seed=3))
    eps = _endpoints(world, config)
    results, left = {}, {}

    def rank_main(rank):
        group = PeerGroup(rank, world, eps[rank], topology)
        try:
            got = []
            for i in range(n):
                if rank == 0:
                    time.sleep(0.05)  # rank 0 is late: the others finish first and must wait in leave()
                group.publish(_message(rank, i))
                got += group.poll()
            got += group.finish(WAIT)
            group.leave(WAIT)
            left[rank] = time.monotonic()
            results[rank] = got
        except Exception as exc:
            results[rank] = exc
        finally:
            eps[rank].close()  # at once: nobody may still need this rank's acks

    threads = [threading.Thread(target=rank_main, args=(r,), daemon=True) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT * 2)
    assert not any(t.is_alive() for t in threads), "a rank hung"
    for rank in range(world):
        assert not isinstance(results[rank], Exception), f"rank {rank}: {results[rank]!r}"
        expected = collections.Counter((o, _message(o, i)) for o in range(world) if o != rank for i in range(n))
        assert collections.Counter(results[rank]) == expected, f"rank {rank} got the wrong messages"
    assert max(left.values()) - min(left.values()) < WAIT / 4


def test_leave_names_a_neighbour_that_never_finishes():
    eps = _endpoints(2)
    try:
        group = PeerGroup(0, 2, eps[0])
        with pytest.raises(TransportError, match="before finish"):
            group.leave(1.0)
        other = PeerGroup(1, 2, eps[1])
        group.publish(b"x")
        other.publish(b"y")
        other.poll(1.0)
        group.poll(1.0)
        finisher = threading.Thread(target=other.finish, args=(WAIT,), daemon=True)
        finisher.start()
        group.finish(WAIT)
        finisher.join(WAIT)
        with pytest.raises(PeerStalledError) as info:
            group.leave(0.5)  # rank 1 finished but never leaves
        assert info.value.ranks == (1,) and info.value.addresses == (eps[1].address,)
        assert f"rank 1 at {eps[1].address[0]}:{eps[1].address[1]}" in str(info.value)  # the operator's lookup
    finally:
        for ep in eps:
            ep.close()


def test_numbered_messages_and_behind_count_by_publication_order():
    """``poll(numbered=True)`` tells each message's place in its origin's order, and ``behind`` waits for every
    number below the count -- or below the END's count when the origin ended with fewer -- which is what a
    staleness-0 replica needs to apply the same messages before every step, whenever they arrive."""
    from sparkavg.sharing import InOrder

    eps = _endpoints(3)
    try:
        groups = [PeerGroup(r, 3, eps[r]) for r in range(3)]
        for i in range(3):
            groups[1].publish(f"one{i}".encode())
        groups[2].publish(b"two0")
        held = InOrder()
        assert groups[0].behind(1) == [1, 2]
        while groups[0].behind(1) or groups[0].behind(3) != [2]:
            held.add(groups[0].poll(0.1, numbered=True))
        assert groups[0].behind(2) == [2]
        assert held.take(1) == [b"one0", b"two0"]  # (iteration, rank) order
        assert held.take(3) == [b"one1", b"one2"] and held.take(None) == []
        others = [threading.Thread(target=g.finish, args=(WAIT,), daemon=True) for g in groups[1:]]
        for t in others:
            t.start()
        assert groups[0].finish(WAIT, numbered=True) == []
        assert groups[0].behind(3) == []  # rank 2 ended after one message: nothing more to wait for
        for t in others:
            t.join(WAIT)
    finally:
        for ep in eps:
            ep.close()


def test_a_bounded_staleness_wait_names_the_peer_that_went_silent_within_its_stall_timeout():
    """Rank 1 publishes one message and goes silent (its process or host lost): rank 0's wait for two
    iterations' messages ends after the stall timeout with an error naming rank 1 and its address."""
    import time

    from sparkavg.transport import wait_for_peers

    eps = _endpoints(2)
    try:
        groups = [PeerGroup(r, 2, eps[r]) for r in range(2)]
        groups[1].publish(b"only one")
        started = time.monotonic()
        with pytest.raises(PeerStalledError) as info:
            wait_for_peers(groups[0], lambda timeout: groups[0].poll(timeout), 2, stall_timeout=0.5)
        waited = time.monotonic() - started
        assert info.value.ranks == (1,) and info.value.addresses == (eps[1].address,)
        assert f"rank 1 at {eps[1].address[0]}:{eps[1].address[1]}" in str(info.value)
        assert 0.5 <= waited < 5.0, waited
        wait_for_peers(groups[0], lambda timeout: groups[0].poll(timeout), 1, stall_timeout=0.5)  # one: there
    finally:
        for ep in eps:
            ep.close()


class _AllGather:
    """``allGather`` as Spark's BarrierTaskContext offers it, across threads: every caller gets every
    caller's message, in rank order, once all ``world`` have called."""

    def __init__(self, world: int):
        self.barrier, self.messages = threading.Barrier(world), {}

    def allGather(self, message: str) -> list:
        import json

        self.messages[json.loads(message)["rank"]] = message
        self.barrier.wait(WAIT)
        return [self.messages[r] for r in sorted(self.messages)]


def test_a_joining_group_trains_before_it_knows_its_peers_and_delivers_everything_once():
    """JoiningGroup (the executors' peer group, Spark-free): messages published before the addresses
    arrive are held and sent once they do; every rank gets every other rank's messages exactly once."""
    from sparkavg.transport import JoiningGroup, KeyAgreement

    world, gather = 3, _AllGather(3)
    eps = [ReliableEndpoint(r, None, 9, limits=dict(stall_timeout=WAIT)) for r in range(world)]
    got, errors = {}, []

    def rank_main(rank):
        try:
            group = JoiningGroup(gather.allGather, eps[rank], KeyAgreement(rank, 9), world, Topology.PLAIN, WAIT)
            for i in range(3):
                group.publish(f"{rank}:{i}".encode())  # maybe before the peers are known: held
            got[rank] = sorted(p for _, p in group.finish(WAIT)) + sorted(p for _, p in group.poll(0))
            group.leave(WAIT)
        except BaseException as exc:  # reported below, per rank
            errors.append((rank, exc))

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(world)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(2 * WAIT)
    finally:
        for ep in eps:
            ep.close()
    assert not errors, errors
    for rank in range(world):
        assert got[rank] == sorted(f"{o}:{i}".encode() for o in range(world) if o != rank for i in range(3)), rank
