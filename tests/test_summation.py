"""The one order in which the ranks' weighted vectors are summed
(:mod:`sparkavg.transport.summation`): the all-reduce's tree, which the job
path's driver -- and Spark's executors before it -- sum in too."""
from collections import defaultdict

import numpy as np
import pytest

from sparkavg.transport.summation import (in_order, level_steps, node_sum, ordered_sum, placed, ranks_of,
                                          total_weight, tree_levels)


def test_the_one_order_is_the_fold_then_pairs():
    f = np.float32
    v = [f(x) for x in (1e8, 1.0, -1e8, 1.0, 3.0, 5.0)]
    # W = 6, P = 4: ((v0 + v4) + (v1 + v5)) + (v2 + v3), in float32
    assert ordered_sum(v) == f(f(f(v[0] + v[4]) + f(v[1] + v[5])) + f(v[2] + v[3]))
    assert ordered_sum(v) != f(f(f(f(f(v[0] + v[1]) + v[2]) + v[3]) + v[4]) + v[5])  # not left to right
    assert ranks_of(6, 0, 1) == [1, 5] and ranks_of(6, 1, 1) == [2, 3] and ranks_of(6, 2, 0) == list(range(6))


def test_a_missing_value_is_no_operand_not_a_zero():
    assert ordered_sum([None, 2.0, None]) == 2.0
    assert ordered_sum([None, None]) is None and ordered_sum([]) is None
    negative_zero = ordered_sum([np.array([-0.0], np.float32), None, None])
    assert np.signbit(negative_zero[0])  # -0.0 + 0.0 would be +0.0
    assert total_weight([0.0, 0.0]) == 0.0 and total_weight([1.5, 0.0, 2.5]) == 4.0


def test_results_are_placed_by_worker_and_a_second_one_for_a_worker_is_refused():
    assert in_order([(7, 1.0), (5, 2.0), (6, 4.0)], lambda p: p - 5, 3) == 7.0
    assert placed([(2, "c"), (0, "a")], int, 4) == ["a", None, "c", None]
    with pytest.raises(RuntimeError, match="at most one result per worker 0..2, got another for worker 1"):
        placed([(1, 1.0), (1, 2.0)], int, 3)
    with pytest.raises(RuntimeError, match="got one for worker 3"):
        placed([(3, 1.0)], int, 3)


@pytest.mark.parametrize("depth", [2, 3, 4])
def test_the_tree_summed_in_parts_gives_the_same_bits(depth):
    """What Spark's executors do with ``level_steps`` (each node apart, its
    children in any order), then the driver's ``node_sum``, is ``ordered_sum``."""
    for workers in range(1, 41):
        rng = np.random.default_rng(workers)
        values = [None if rng.random() < 0.2 else rng.standard_normal(5).astype(np.float32) * 1e4
                  for _ in range(workers)]
        expected = ordered_sum([None if v is None else v.copy() for v in values])
        items = [(w, v.copy()) for w, v in enumerate(values) if v is not None][::-1]  # any arrival order
        steps, below = level_steps(workers, depth)
        assert len(steps) == len(tree_levels(workers, depth)) <= depth - 1
        for child, node, count in steps:
            groups = defaultdict(list)
            for key, item in map(child, items):
                assert 0 <= key < count
                groups[key].append(item)
            items = [node((key, children)) for key, children in groups.items()]
        got = node_sum(dict(items), workers, below)
        assert (got is None and expected is None) or got.tobytes() == expected.tobytes(), (workers, depth)


def test_the_executors_sum_levels_where_tree_aggregate_would_shuffle():
    # treeAggregate of depth d shuffles while W > scale + W / scale, scale = ceil(W^(1/d))
    assert tree_levels(4, 2) == [] and tree_levels(5, 2) == [1] and tree_levels(9, 2) == [2]
    assert tree_levels(17, 3) == [1, 3] and tree_levels(256, 2) == [4] and tree_levels(9, 1) == []
