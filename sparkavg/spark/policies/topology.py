"""Decision ``topology``: how gradient sharing's messages travel, by the worker count.

``PLAIN`` (all-to-all) up to :data:`TREE_ABOVE` workers: every rank sends its
message to every other rank, one hop.  Above it ``TREE``: the messages are
summed on their way by recursive doubling (:class:`~sparkavg.transport.TreeGroup`),
and every rank receives, decodes and applies one message per iteration
instead of ``W - 1`` -- what stops all-to-all from scaling.  Where the
crossing lies is measured and predicted in benchmarks/RESULTS.md ("Sums
through a tree").  A master's explicit ``topology`` is kept; an
asynchronous fit (``staleness=None``) stays ``PLAIN``: a tree's ranks share
τ, adapted from totals the staleness bound makes sure they all applied.
"""
from __future__ import annotations

from typing import Optional, Tuple

from ...transport import Topology
from . import Policy

__all__ = ["TopologyChoice", "TREE_ABOVE"]

#: Worker counts above this train with Topology.TREE unless the master names a topology.
TREE_ABOVE = 4


class TopologyChoice(Policy):
    """Decision ``topology`` (the module doc)."""

    name = "topology"

    def decide(self, topology: Optional[Topology], workers: int, staleness: Optional[int]) -> Tuple[Topology, str]:
        if topology is not None:
            return topology, "set by user"
        if staleness is None:
            return Topology.PLAIN, ("asynchronous (staleness=None): a tree's ranks share τ, which needs the totals "
                                    "a staleness bound guarantees; all-to-all")
        if workers > TREE_ABOVE:
            return Topology.TREE, (f"{workers} workers > {TREE_ABOVE}: each rank applies one sum per iteration "
                                   f"instead of {workers - 1} messages (measured and modelled: "
                                   f"benchmarks/RESULTS.md)")
        return Topology.PLAIN, f"{workers} workers <= {TREE_ABOVE}: all-to-all, one hop"
