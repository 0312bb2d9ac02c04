"""The one order in which the ranks' weighted vectors are summed.

IEEE addition is commutative but not associative: the sum of ``W`` values
is fixed, bit for bit, by the shape of the tree that adds them, not by
which operand of each addition is which.  Both paths of parameter averaging
sum in this tree -- the all-reduce of :mod:`.collective` (recursive halving
and doubling) and the driver of a Spark job per round -- so that they give
the same bits:

- ``P = 2^floor(log2 W)`` leaves; leaf ``i`` is ``v_i + v_{i+P}`` for
  ``i < W - P`` (the fold of the ranks above ``P``), else ``v_i``;
- then pairwise, over distance 1, 2, 4, ...: ``(leaf_0 + leaf_1) +
  (leaf_2 + leaf_3)``, and so on up to the root.

For ``W = 6``: ``((v_0 + v_4) + (v_1 + v_5)) + (v_2 + v_3)``.  A missing
value (``None``: a worker without examples, a rank of weight 0) is no
operand at all, not a zero: ``a + missing`` is ``a`` (so ``-0.0`` stays
``-0.0``).  The node of level ``k`` and index ``g`` sums the leaves
``[g 2^k, (g + 1) 2^k)``, ranks included by :func:`group_of`; the sum of
the nodes of one level, in index order, by :func:`ordered_sum` is the
root's (a power of two of them has no fold).  So the tree can be summed in
parts -- the nodes of some levels apart (:func:`tree_levels`, on Spark's
executors), the rest on the driver (:func:`node_sum`) -- to the same bits.
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence

import functools
import math

import numpy as np

from .. import ops

__all__ = ["ordered_sum", "partial_sum", "group_of", "ranks_of", "power_below", "total_weight", "placed",
           "in_order", "tree_levels", "level_steps", "node_of", "node_sum"]


def power_below(world: int) -> int:
    """``P``, the largest power of two ``<= world`` (``world >= 1``)."""
    if world < 1:
        raise ValueError(f"Expect world >= 1, got {world}")
    return 1 << (int(world).bit_length() - 1)


def _add(a, b):
    if isinstance(a, np.ndarray):
        return ops.accumulate(a, b)
    return a + b


def _plus(a, b, add: Callable):
    if a is None:
        return b
    if b is None:
        return a
    return add(a, b)


def partial_sum(get: Callable[[int], object], world: int, level: int, index: int,
                add: Optional[Callable] = None):
    """The node of ``level`` and ``index`` of ``world`` ranks' tree (the
    module docstring): ``get(rank)`` gives each rank's value, None where it
    has none; ``add(a, b)`` sums two present values (default: numpy arrays
    with :func:`sparkavg.ops.accumulate`, in place into ``a``; anything else
    with ``+``).  None when no rank of the node has a value."""
    add = add or _add
    p = power_below(world)
    first, count = index << level, 1 << level
    if level < 0 or first + count > p:
        raise ValueError(f"Expect a node of a tree of {p} leaves, got level {level}, index {index}")
    nodes = [_plus(get(i), get(i + p) if i + p < world else None, add) for i in range(first, first + count)]
    while len(nodes) > 1:
        nodes = [_plus(nodes[j], nodes[j + 1], add) for j in range(0, len(nodes), 2)]
    return nodes[0]


def ordered_sum(values: Sequence, add: Optional[Callable] = None):
    """The sum of ``values[r]`` by rank ``r`` in the one order (the module
    docstring); None for a missing value, and the result when all are.

    Parameters
    ----------
    values : sequence
        One entry per rank: float32/float64 arrays of one shape, floats, or
        anything ``add`` sums.
    add : callable, optional
        ``add(a, b)``, the sum of two present values (it may reuse ``a``).
        Default: :func:`sparkavg.ops.accumulate` for arrays -- in place, so
        the arrays of ``values`` are overwritten -- and ``+`` otherwise.

    Returns
    -------
    The sum, or None when every value is missing (or there is none).
    """
    values = list(values)
    if not values:
        return None
    p = power_below(len(values))
    return partial_sum(values.__getitem__, len(values), p.bit_length() - 1, 0, add)


def group_of(rank: int, world: int, level: int) -> int:
    """The index of the node of ``level`` that sums ``rank``'s value."""
    return (rank % power_below(world)) >> level


def ranks_of(world: int, level: int, index: int) -> list:
    """The ranks whose values the node of ``level`` and ``index`` sums, ascending."""
    p = power_below(world)
    leaves = range(index << level, (index + 1) << level)
    return sorted([*leaves, *(i + p for i in leaves if i + p < world)])


def total_weight(weights: Sequence[float]) -> float:
    """The sum of ``weights[r]`` by rank in the one order, a weight of 0
    missing (as its rank sends nothing); 0.0 when every weight is 0."""
    total = ordered_sum([float(w) if w else None for w in weights])
    return 0.0 if total is None else total


def placed(results, worker_of: Callable[[int], int], workers: int) -> list:
    """``(key, value)`` pairs as one value per worker (``worker_of(key)``),
    None where a worker has none.

    Raises
    ------
    RuntimeError
        Two values for one worker, or a worker out of ``0 .. workers - 1``.
    """
    values = [None] * workers
    for key, value in results:
        w = worker_of(key)
        if not 0 <= w < workers or values[w] is not None:
            raise RuntimeError(f"Expect at most one result per worker 0..{workers - 1}, got "
                               f"{'another' if 0 <= w < workers else 'one'} for worker {w} (key {key})")
        values[w] = value
    return values


def in_order(results, worker_of: Callable[[int], int], workers: int, add: Optional[Callable] = None):
    """:func:`ordered_sum` of ``(key, value)`` pairs placed by :func:`placed`."""
    return ordered_sum(placed(results, worker_of, workers), add)


def tree_levels(workers: int, depth: int) -> list:
    """The levels whose nodes are summed apart before the root, as Spark's
    ``treeAggregate`` of ``depth`` sums: none unless there are more than
    ``scale + W / scale`` values (``scale = ceil(W^(1 / depth))``), else up
    to ``depth - 1`` levels evenly spaced between the leaves and the root."""
    height = power_below(workers).bit_length() - 1
    scale = max(math.ceil(workers ** (1.0 / depth)), 2)
    if depth < 2 or height < 2 or workers <= scale + workers / scale:
        return []
    return sorted({min(height - 1, max(1, round(height * j / depth))) for j in range(1, depth)})


def node_of(key: int, workers: int, below: Optional[int], level: int) -> int:
    """The index of the node of ``level`` that sums rank ``key`` (``below``
    None) or node ``key`` of level ``below``."""
    return group_of(key, workers, level) if below is None else key >> (level - below)


def node_sum(children, workers: int, below: Optional[int], level: Optional[int] = None, index: int = 0,
             add: Optional[Callable] = None):
    """The node of ``level`` and ``index`` from ``children`` (a mapping of
    rank -- ``below`` None -- or node index of level ``below`` to its value;
    absent: missing); ``level`` None: the root, :func:`ordered_sum`'s sum."""
    level = power_below(workers).bit_length() - 1 if level is None else level
    if below is None:
        return partial_sum(children.get, workers, level, index, add)
    shift = level - below
    return ordered_sum([children.get(i) for i in range(index << shift, (index + 1) << shift)], add)


def _child(workers: int, below: Optional[int], level: int, item):
    return node_of(item[0], workers, below, level), item


def _node(workers: int, below: Optional[int], level: int, add, item):
    index, children = item
    return index, node_sum(dict(children), workers, below, level, index, add)


def level_steps(workers: int, depth: int, add: Optional[Callable] = None):
    """The tree summed in parts (Spark's executors): ``(steps, below)``,
    a step per level of :func:`tree_levels` as ``(child, node, count)`` --
    ``child((key, value))`` is ``(node index, (key, value))`` (a worker's
    value, then a node's of the level before), ``node((index, children))``
    is ``(index, the node's sum)``, ``count`` the level's nodes -- and the
    last level (None: none), whose nodes :func:`node_sum` takes to the root."""
    below, steps = None, []
    for level in tree_levels(workers, depth):
        steps.append((functools.partial(_child, workers, below, level),
                      functools.partial(_node, workers, below, level, add), power_below(workers) >> level))
        below = level
    return steps, below
