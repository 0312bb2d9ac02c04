"""A rank's peer group, joined while it already trains.

Peers find each other through an all-gather of their addresses -- a
``gather(str) -> list of str``: the driver's rendezvous
(:meth:`~sparkavg.transport.rendezvous.Rendezvous.gatherer`) on classic
sessions, Spark's ``BarrierTaskContext.allGather`` on Connect, which polls
for its answer once a second.  :class:`JoiningGroup` asks in a background
thread; until the answer is there, the worker trains and its
messages are held, then published in order.  Peers that learn the table
sooner have their first datagrams rejected as ``unknown_peer`` and
retransmitted (:meth:`~sparkavg.transport.ReliableEndpoint.set_peers`).
Gradient sharing is asynchronous, so a message that arrives a second late
is applied a second late: every replica still applies every message.

The same gather carries each rank's X25519 public key (never a secret):
every pair of ranks derives its datagram key from it
(:mod:`sparkavg.transport.keys`), so no key travels in the task, the
broadcast or the gather.
"""
from __future__ import annotations

import json
import threading

from .errors import PeerStalledError
from .group import PeerGroup, Topology
from .keys import KeyAgreement
from .tree import TreeGroup

__all__ = ["JoiningGroup", "gather_peers"]


def gather_peers(gather, address, agreement: KeyAgreement, world: int) -> tuple:
    """``({rank: (host, port)}, {rank: key})`` of every other rank: their
    addresses and the pair keys agreed with them, from one ``gather`` of
    addresses and public keys.

    Raises
    ------
    ValueError
        When the gathered entries are not one per rank ``0 .. world - 1``
        with a 32-byte public key each (naming what came).
    """
    rank = agreement.rank
    gathered = gather(json.dumps({"rank": rank, "host": address[0], "port": address[1],
                                         "public": agreement.public.hex()}))
    peers, publics = {}, {}
    for text in gathered:
        entry = json.loads(text)
        r = int(entry["rank"])
        if r in publics:
            raise ValueError(f"rank {rank}: expect one gathered entry per rank, got two for rank {r}")
        peers[r], publics[r] = (entry["host"], int(entry["port"])), bytes.fromhex(entry["public"])
    if sorted(publics) != list(range(world)) or publics[rank] != agreement.public:
        raise ValueError(f"rank {rank}: expect the gather to return ranks 0..{world - 1} with this rank's own "
                         f"public key, got ranks {sorted(publics)}")
    keys = agreement.pair_keys(publics)
    return {r: a for r, a in peers.items() if r != rank}, keys


class JoiningGroup:
    """A :class:`~sparkavg.transport.PeerGroup` -- or, for ``Topology.TREE``,
    a :class:`~sparkavg.transport.TreeGroup` summing with ``merge`` -- once
    the peers are known (the module docstring); the same
    ``publish``/``poll``/``finish``/``leave``."""

    def __init__(self, gather, endpoint, agreement: KeyAgreement, world: int, topology, stall_timeout: float,
                 merge=None):
        if topology is Topology.TREE and merge is None:
            raise ValueError("Expect a merge function for Topology.TREE (its relays sum the messages), got None")
        self.endpoint, self.rank, self.world, self.topology = endpoint, agreement.rank, world, topology
        self.merge = merge
        self.agreement = agreement
        self.stall_timeout = stall_timeout
        self.group = None
        self._pending: list = []  # messages published before the peers were known
        self._peers, self._keys, self._error = None, None, None
        self._thread = threading.Thread(target=self._gather, args=(gather,), name=f"sparkavg-peers-{self.rank}",
                                        daemon=True)
        self._thread.start()

    def _gather(self, gather) -> None:
        try:
            # the pair keys too, here: X25519 costs ~1 ms a peer, off the training thread
            self._peers, self._keys = gather_peers(gather, self.endpoint.address, self.agreement, self.world)
        except BaseException as exc:  # raised in the training thread
            self._error = exc

    def _ready(self, wait: bool) -> bool:
        if self.group is not None:
            return True
        if wait:
            self._thread.join(self.stall_timeout)
        if self._thread.is_alive():
            if wait:
                raise PeerStalledError(f"rank {self.rank}: the peers' addresses (the meeting) did not come "
                                       f"within {self.stall_timeout:g} s", [], [])
            return False
        if self._error is not None:
            raise self._error
        self.endpoint.set_peers(self._peers, keys=self._keys)
        self.group = (TreeGroup(self.rank, self.world, self.endpoint, self.merge) if self.topology is Topology.TREE
                      else PeerGroup(self.rank, self.world, self.endpoint, self.topology))
        pending, self._pending = self._pending, []
        for payload in pending:
            self.group.publish(payload)
        return True

    def publish(self, payload) -> None:
        if self._ready(False):
            self.group.publish(payload)
        else:
            self._pending.append(bytes(payload))

    def poll(self, timeout: float = 0.0, numbered: bool = False) -> list:
        return self.group.poll(timeout, numbered) if self._ready(False) else []

    def behind(self, count: int) -> list:
        """:meth:`PeerGroup.behind`, after waiting for the peers' addresses
        (up to ``stall_timeout``): a bounded-staleness wait must not let a
        rank run ahead while it cannot hear its peers."""
        self._ready(True)
        return self.group.behind(count)

    def finish(self, stall_timeout: float, numbered: bool = False) -> list:
        self._ready(True)
        return self.group.finish(stall_timeout, numbered)

    def leave(self, stall_timeout: float) -> None:
        self.group.leave(stall_timeout)
