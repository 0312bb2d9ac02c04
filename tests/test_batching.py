"""Minibatching: every example exactly once, reproducible shuffles, no dropped tail."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sparkavg.data.batching import minibatches, num_batches


def _data(n):
    x = np.arange(n * 3, dtype=np.float32).reshape(n, 3)
    y = np.arange(n, dtype=np.int64)  # y == row index, so pairing is checkable
    return x, y


@given(n=st.integers(0, 200), batch_size=st.integers(1, 64), shuffle=st.booleans(), seed=st.integers(0, 2**32))
def test_every_example_exactly_once(n, batch_size, shuffle, seed):
    x, y = _data(n)
    batches = list(minibatches(x, y, batch_size, shuffle=shuffle, seed=seed))
    assert len(batches) == num_batches(n, batch_size)
    seen = np.concatenate([yb for _, yb in batches]) if batches else np.array([], np.int64)
    np.testing.assert_array_equal(np.sort(seen), y)
    for xb, yb in batches:
        np.testing.assert_array_equal(xb, x[yb])  # features stay paired with labels
    sizes = [len(yb) for _, yb in batches]
    assert all(s == batch_size for s in sizes[:-1])
    if sizes:
        assert 1 <= sizes[-1] <= batch_size


def test_last_batch_smaller_not_dropped():
    x, y = _data(10)
    sizes = [len(xb) for xb, _ in minibatches(x, y, 4, shuffle=False)]
    assert sizes == [4, 4, 2]


def test_no_shuffle_keeps_order_and_views():
    x, y = _data(7)
    batches = list(minibatches(x, y, 3, shuffle=False))
    np.testing.assert_array_equal(np.concatenate([yb for _, yb in batches]), y)
    assert np.shares_memory(batches[0][0], x)


def test_seeded_shuffle_is_reproducible():
    x, y = _data(50)
    a = [yb for _, yb in minibatches(x, y, 8, seed=123)]
    b = [yb for _, yb in minibatches(x, y, 8, seed=123)]
    c = [yb for _, yb in minibatches(x, y, 8, seed=124)]
    assert all(np.array_equal(p, q) for p, q in zip(a, b))
    assert not all(np.array_equal(p, q) for p, q in zip(a, c))
    assert not np.array_equal(np.concatenate(a), y)  # actually shuffled


def test_validation_is_eager():
    x, y = _data(5)
    with pytest.raises(ValueError, match="batch_size to be an int >= 1, got 0"):
        minibatches(x, y, 0)  # raised at call time, before iterating
    with pytest.raises(ValueError, match=r"Expect x and y with the same number of examples, got x \(5, 3\) and y \(4,\)"):
        minibatches(x, y[:4], 2)
    with pytest.raises(ValueError, match=r"got x \(5, 3\) and y \(6,\)"):
        minibatches(x, list(range(6)), 2)
    with pytest.raises(ValueError, match="batch_size"):
        minibatches(x, y, 2.5)


def test_num_batches():
    assert num_batches(0, 5) == 0
    assert num_batches(10, 5) == 2
    assert num_batches(11, 5) == 3
    assert num_batches(1, 100) == 1
    with pytest.raises(ValueError, match="n to be an int >= 0, got -1"):
        num_batches(-1, 5)
    with pytest.raises(ValueError, match="batch_size"):
        num_batches(5, 0)
