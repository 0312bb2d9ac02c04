"""Argument checks and formatting shared by the evaluations."""
from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np


logger = logging.getLogger(__name__)

_AVERAGES = ("macro", "micro")


def _check_positive_int(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"Expect {name} to be an int >= {minimum}, got {value!r}")
    return int(value)


def _check_names(name: str, names, expected_len: int):
    if names is None:
        return None
    if isinstance(names, str) or not isinstance(names, Sequence):
        raise ValueError(f"Expect {name} to be a sequence of {expected_len} strings, got {names!r}")
    names = [str(n) for n in names]
    if len(names) != expected_len:
        raise ValueError(f"Expect {expected_len} {name}, got {len(names)}: {names!r}")
    return names


def _require_examples(owner: str, count: int, metric: str) -> None:
    if count == 0:
        raise ValueError(f"Expect at least one evaluated example for {metric}, got 0: {owner} has seen no "
                         f"examples (evaluated on empty data?)")


def _fmt(value_fn, spec: str) -> str:
    """``value_fn()`` formatted, or 'n/a' when the evaluation is empty."""
    try:
        return format(value_fn(), spec)
    except ValueError:
        return "n/a"


def _first_nonfinite(a: np.ndarray, what: str) -> None:
    bad = ~np.isfinite(a)
    if bad.any():
        idx = np.unravel_index(int(np.flatnonzero(bad)[0]), a.shape)
        raise ValueError(
            f"Expect finite {what}, got {a[idx]} at index {tuple(int(i) for i in idx)} "
            f"({int(bad.sum())} non-finite values)"
        )
