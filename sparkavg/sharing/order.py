"""Peers' messages applied in a fixed order: what a replica applies before
each step depends only on the iterations, never on when datagrams arrived
(gradient sharing at ``staleness=0``: a run is reproducible)."""
from __future__ import annotations

import heapq
from typing import Optional

__all__ = ["InOrder"]


class InOrder:
    """Peer messages held until their turn, handed out in (iteration, rank)
    order: those of iteration k are applied just before step k + 1."""

    def __init__(self):
        self._held: list = []

    def add(self, numbered) -> None:
        """Hold ``(origin, number, payload)`` messages (``PeerGroup.poll(numbered=True)``)."""
        for origin, number, payload in numbered:
            heapq.heappush(self._held, (number, origin, payload))

    def take(self, below: Optional[int]) -> list:
        """The held payloads numbered below ``below`` (all when None), in order."""
        out = []
        while self._held and (below is None or self._held[0][0] < below):
            out.append(heapq.heappop(self._held)[2])
        return out
