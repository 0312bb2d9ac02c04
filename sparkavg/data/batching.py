"""Minibatching of in-memory arrays: every example exactly once per pass."""
from __future__ import annotations

import logging
from collections.abc import Iterator

import numpy as np

__all__ = ["minibatches", "num_batches"]

logger = logging.getLogger(__name__)


def _check_batch_size(batch_size) -> int:
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise ValueError(f"Expect batch_size to be an int >= 1, got {batch_size!r}")
    return int(batch_size)


def _shape(a) -> tuple:
    shape = getattr(a, "shape", None)
    return tuple(shape) if shape is not None else (len(a),)


def num_batches(n: int, batch_size: int) -> int:
    """Number of minibatches :func:`minibatches` yields for ``n`` examples.

    Parameters
    ----------
    n : int
        Number of examples, at least 0.
    batch_size : int
        Examples per batch, at least 1.

    Returns
    -------
    int
        ``ceil(n / batch_size)``: the last, possibly smaller, batch counts.
    """
    batch_size = _check_batch_size(batch_size)
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
        raise ValueError(f"Expect n to be an int >= 0, got {n!r}")
    return -(-int(n) // batch_size)


def minibatches(
    x, y, batch_size: int, shuffle: bool = True, seed=None
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Split paired arrays into minibatches along axis 0.

    Every example appears in exactly one batch per pass; all batches have
    ``batch_size`` examples except possibly the last, which is smaller and
    never dropped. Arguments are validated when this function is called, not
    when iteration starts.

    Parameters
    ----------
    x : numpy.ndarray, shape (N, ...)
        Features.
    y : numpy.ndarray, shape (N, ...)
        Labels (int (N,) or one-hot (N, C) alike).
    batch_size : int
        Examples per batch, at least 1.
    shuffle : bool, default True
        Visit examples in a random order (the same order for ``x`` and ``y``).
        Without shuffling, batches are views (slices) of the inputs.
    seed : int, numpy.random.Generator or None
        Seed for the order; the same int gives the same batches. ``None``
        draws fresh entropy.

    Yields
    ------
    (numpy.ndarray, numpy.ndarray)
        ``(xb, yb)`` with ``len(xb) == len(yb)``, dtypes as the inputs.

    Raises
    ------
    ValueError
        ``batch_size < 1``, or ``len(x) != len(y)``.
    """
    batch_size = _check_batch_size(batch_size)
    n = len(x)
    if len(y) != n:
        raise ValueError(f"Expect x and y with the same number of examples, got x {_shape(x)} and y {_shape(y)}")
    order = np.random.default_rng(seed).permutation(n) if shuffle else None
    return _iterate(x, y, batch_size, order)


def _iterate(x, y, batch_size: int, order) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    n = len(x)
    for start in range(0, n, batch_size):
        stop = min(start + batch_size, n)
        if order is None:
            yield x[start:stop], y[start:stop]
        else:
            idx = order[start:stop]
            yield x[idx], y[idx]
