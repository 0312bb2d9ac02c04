"""TreeGroup: every iteration's messages summed by recursive doubling, every
rank on its own thread and real UDP socket in this process."""
from __future__ import annotations

import secrets
import threading
import time

import numpy as np
import pytest

from sparkavg import ops
from sparkavg.sharing import apply_received, message_bytes
from sparkavg.transport import (FaultInjection, PeerStalledError, ReliableEndpoint, TransportError, TreeGroup,
                                contributors, exchange_partners)

from .ranks import on_threads

WAIT = 20.0
KEY = secrets.token_bytes(32)


def _endpoints(world, **limits):
    config = dict(stall_timeout=WAIT, retransmit_timeout=0.25, **limits)
    eps = [ReliableEndpoint(r, KEY, 5, limits=config) for r in range(world)]
    table = {r: ep.address for r, ep in enumerate(eps)}
    for ep in eps:
        ep.set_peers(table)
    return eps


def nested(parts):
    """A merge that keeps its parts' order: ``(lower,higher)``, so a total shows the exchanges it came through."""
    present = [p for p in parts if p]
    return b"(" + b",".join(present) + b")"


def _combined(lower, higher):
    present = [p for p in (lower, higher) if p]
    return None if not present else present[0] if len(present) == 1 else b"(" + b",".join(present) + b")"


def expected_nesting(world, iteration, published):
    """What ``nested`` makes of iteration ``iteration`` by recursive doubling (None when no rank sent)."""
    core = 1 << (world.bit_length() - 1)
    own = [f"{r}:{iteration}".encode() if iteration < published[r] else None for r in range(world)]
    parts = [_combined(own[r], own[r + core] if r + core < world else None) for r in range(core)]
    step = 1
    while step < core:
        parts = [_combined(parts[r & ~step], parts[r | step]) for r in range(core)]
        step <<= 1
    assert len(set(parts)) == 1  # every core rank holds the same total
    return parts[0]


def run_ranks(eps, published, body, dead=(), finish_timeout=WAIT, merge=nested):
    """Every live rank on a thread: ``body(rank, group)`` then finish and leave; {rank: result or exception}."""
    world = len(eps)
    results = {}

    def main(rank):
        group = TreeGroup(rank, world, eps[rank], merge)
        try:
            got = body(rank, group)
            got += group.finish(finish_timeout, numbered=True)
            group.leave(finish_timeout)
            results[rank] = (got, group.stats())
        except Exception as exc:
            results[rank] = exc

    on_threads(main, [r for r in range(world) if r not in dead], WAIT * 3)
    return results


@pytest.mark.parametrize("world", range(1, 10))
def test_every_rank_gets_each_iterations_sum_once_in_order(world):
    """W = 1..9, ranks publishing different numbers of iterations: every rank is handed one total per
    iteration of the group, in order, made by merging the lower ranks' part first at every exchange -- the
    same bytes on every rank."""
    published = [4 + (r % 3) for r in range(world)]
    eps = _endpoints(world)

    def body(rank, group):
        got = []
        for i in range(published[rank]):
            group.publish(f"{rank}:{i}".encode())
            got += group.poll(numbered=True)
        return got

    try:
        results = run_ranks(eps, published, body)
    finally:
        for ep in eps:
            ep.close()
    iterations = max(published)
    expected = [(0, i, expected_nesting(world, i, published) or b"") for i in range(iterations)]
    for rank in range(world):
        assert not isinstance(results[rank], Exception), f"rank {rank}: {results[rank]!r}"
        got, stats = results[rank]
        assert got == expected, f"rank {rank}"
        assert stats["delivered"] == iterations and stats["malformed"] == 0


def test_replicas_applying_the_sums_agree_bit_for_bit_with_loss():
    """Real threshold messages at one τ, merged by ops.merge_messages through 7 ranks with 10% of datagrams
    lost: every replica applies the same 6 totals in the same order and ends bit-for-bit equal -- to each
    other and to one process adding each iteration's messages' sum."""
    world, iterations, n, tau = 7, 6, 3000, 0.01
    rng = np.random.default_rng(38)
    residuals = [(rng.standard_normal(n) * 0.008).astype(np.float32) for _ in range(world)]
    start = rng.standard_normal(n).astype(np.float32)
    eps = _endpoints(world, faults=FaultInjection(loss=0.1, seed=38))
    replicas, messages = {}, {}

    def merge(parts):
        merged = ops.merge_messages(parts, n)
        return b"" if merged is None else message_bytes(merged)

    def body(rank, group):
        residual, states = residuals[rank].copy(), ops.EncodingState()
        mine = []
        for i in range(iterations):
            residual += np.float32(0.004) * (rank + 1)
            message = ops.encode(residual, tau, states)
            payload = b"" if message is None else message_bytes(message)
            mine.append(payload)
            group.publish(payload)
        messages[rank] = mine
        return group.poll(numbered=True)

    try:
        results = run_ranks(eps, [iterations] * world, body, merge=merge)
    finally:
        for ep in eps:
            ep.close()
    for rank in range(world):
        assert not isinstance(results[rank], Exception), f"rank {rank}: {results[rank]!r}"
        got, _ = results[rank]
        assert [i for _, i, _ in got] == list(range(iterations))
        params = start.copy()
        from sparkavg.sharing import SharingState, FixedThreshold
        state = SharingState(FixedThreshold(tau), n)
        assert apply_received(state, [p for _, _, p in got], params) == iterations
        replicas[rank] = params
    for rank in range(1, world):
        assert np.array_equal(replicas[rank].view(np.uint32), replicas[0].view(np.uint32)), f"rank {rank}"
    oracle = start.copy()
    for i in range(iterations):
        total = ops.merge_messages([messages[r][i] for r in range(world)], n)
        ops.decode(total, oracle)
    assert np.array_equal(oracle.view(np.uint32), replicas[0].view(np.uint32))


def test_partners_and_contributors():
    """7 ranks: the core 0..3 exchanges with rank XOR 1, then XOR 2; extras 4, 5, 6 pair with 0, 1, 2."""
    assert [exchange_partners(r, 7) for r in range(7)] == [
        (4, [1, 2]), (5, [0, 3]), (6, [3, 0]), (None, [2, 1]), (0, []), (1, []), (2, [])]
    assert exchange_partners(0, 1) == (None, []) and exchange_partners(1, 2) == (None, [0])
    assert contributors(1, 7, 0) == [1, 5] and contributors(3, 7, 1) == [2, 3, 6] and contributors(0, 7, 2) == list(
        range(7))
    assert contributors(5, 7, 1) == [5]
    with pytest.raises(ValueError, match="rank=7"):
        exchange_partners(7, 7)


def test_a_lost_rank_is_named_by_the_ranks_waiting_for_its_part():
    """Rank 1 of 7 dies before it publishes: rank 0 waits for the part of rank 1's block (1 and its extra 5);
    ranks 2 and 3 wait in the second exchange for the block of ranks 0, 1 and their extras (0 never got
    its first part); the extras 4 and 5 wait for their core ranks' totals; 6 for rank 2's."""
    world = 7
    eps = _endpoints(world)
    eps[1].close()

    def body(rank, group):
        group.publish(b"x")
        return []

    try:
        results = run_ranks(eps, [1] * world, body, dead={1}, finish_timeout=1.0)
    finally:
        for ep in eps:
            ep.close()
    expected = {0: (1, 5), 2: (0, 1, 4, 5), 3: (0, 1, 4, 5), 4: (0,), 5: (1,), 6: (2,)}
    for rank, ranks in expected.items():
        assert isinstance(results[rank], PeerStalledError) and results[rank].ranks == ranks, (rank, results[rank])


def test_behind_waits_for_the_total_not_just_a_publication():
    """A bounded-staleness wait: a rank of two is behind its partner until the partner's part came, then has
    the total; the partner too."""
    eps = _endpoints(2)
    try:
        low, high = TreeGroup(0, 2, eps[0], nested), TreeGroup(1, 2, eps[1], nested)
        low.publish(b"0:0")
        assert low.behind(1) == [1]  # rank 1's part of iteration 0 has not come
        assert high.behind(1) == [1]  # its own: not published yet
        high.publish(b"1:0")
        deadline = time.monotonic() + WAIT
        got = []
        while low.behind(1) and time.monotonic() < deadline:
            got += low.poll(0.05, numbered=True)
        assert got == [(0, 0, b"(0:0,1:0)")]
        while high.behind(1) and time.monotonic() < deadline:
            got += high.poll(0.05, numbered=True)
        assert got[-1] == (0, 0, b"(0:0,1:0)")
        with pytest.raises(ValueError, match="Expect the endpoint of rank 1"):
            TreeGroup(1, 2, eps[0], nested)
        with pytest.raises(TypeError, match="merge"):
            TreeGroup(0, 2, eps[0], None)
        done = threading.Thread(target=high.finish, args=(WAIT,), daemon=True)
        done.start()
        low.finish(WAIT)
        done.join(WAIT)
        with pytest.raises(TransportError, match="after finish"):
            low.publish(b"late")
    finally:
        for ep in eps:
            ep.close()
