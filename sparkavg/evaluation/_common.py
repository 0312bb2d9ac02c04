"""Argument checks and formatting shared by the evaluations."""
from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import NamedTuple, Optional

import numpy as np

from ..backend import to_cpu


logger = logging.getLogger(__name__)

_AVERAGES = ("macro", "micro")
#: Averages of per-class areas (ROC AUC, PR AUC) over classes.
_AREA_AVERAGES = ("macro", "weighted")


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


def _class_indices(a, num_classes: int, what: str) -> np.ndarray:
    """(N,) int64 class indices from ``a``: (N,) indices (integer dtype, or
    floats holding integers) or an (N, C) matrix of scores or one-hot rows
    (argmax taken); the first bad value is named."""
    a = to_cpu(a)
    c = num_classes
    if c == 2 and a.ndim == 2 and a.shape[1] == 1:  # a binary output's one column: P(class 1), or 0/1 labels
        if a.dtype.kind == "f":
            _first_nonfinite(a, what)
            return (a[:, 0] > 0.5).astype(np.int64)
        a = a[:, 0]
    if a.ndim == 2 and a.shape[1] == c:
        if a.dtype.kind == "f":
            _first_nonfinite(a, what)
        return np.argmax(a, axis=1)
    if a.ndim != 1:
        raise ValueError(
            f"Expect {what} of shape (N,) class indices or (N, {c}) scores/one-hot, got shape {a.shape}"
        )
    if a.dtype.kind == "f":
        _first_nonfinite(a, what)
        if not np.array_equal(a, np.round(a)):
            i = int(np.flatnonzero(a != np.round(a))[0])
            raise ValueError(f"Expect integer class indices in {what}, got {a[i]} at index {i}")
    elif a.dtype.kind not in "iub" and a.size:
        raise ValueError(f"Expect integer class indices in {what}, got dtype {a.dtype}")
    a = a.astype(np.int64, copy=False)
    bad = np.flatnonzero((a < 0) | (a >= c))
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"Expect {what} in 0..{c - 1}, got {a[i]} at index {i}")
    return a


class Batch(NamedTuple):
    """One checked batch of a probabilistic metric's ``eval``.

    Attributes
    ----------
    labels : numpy.ndarray
        (N,) int64 class indices.
    probabilities : numpy.ndarray
        (N, C) float64; a two-class (N,) input ``p`` becomes ``[1 - p, p]``.
    weights : numpy.ndarray or None
        (N,) float64, non-negative; None when the caller gave none.
    one_column : bool
        The probabilities came as (N,), the probability of class 1.
    eps : float
        Machine epsilon of the probabilities' dtype as given (float64's for a
        non-float dtype): scikit-learn's clipping convention.
    """

    labels: np.ndarray
    probabilities: np.ndarray
    weights: Optional[np.ndarray]
    one_column: bool
    eps: float


def _checked_batch(num_classes: int, labels, probabilities, weights, unit_interval: bool = True) -> Batch:
    """``eval``'s arguments checked once for every probabilistic metric.

    ``probabilities``: (N, C), or (N,) for C == 2 (the probability of class
    1); finite, and in [0, 1] when ``unit_interval``.  ``labels``: as
    :func:`_class_indices`.  ``weights``: None or (N,) finite, non-negative.
    """
    c = num_classes
    p = to_cpu(probabilities)
    if p.dtype.kind not in "biuf":
        raise ValueError(f"Expect real probabilities, got dtype {p.dtype}")
    eps = float(np.finfo(p.dtype).eps) if p.dtype.kind == "f" else float(np.finfo(np.float64).eps)
    one_column = c == 2 and (p.ndim == 1 or (p.ndim == 2 and p.shape[1] == 1))
    if not one_column and (p.ndim != 2 or p.shape[1] != c):
        raise ValueError(f"Expect probabilities of shape (N, {c}){' or (N,) or (N, 1)' if c == 2 else ''}, "
                         f"got shape {p.shape}")
    p = p.reshape(-1) if one_column else p
    p = np.asarray(p, dtype=np.float64)
    _first_nonfinite(p, "probabilities")
    if unit_interval and p.size and (p.min() < 0 or p.max() > 1):
        i = int(np.flatnonzero((p.ravel() < 0) | (p.ravel() > 1))[0])
        idx = np.unravel_index(i, p.shape)
        raise ValueError(f"Expect probabilities in [0, 1], got {p[idx]} at index {tuple(int(j) for j in idx)}")
    if one_column:
        p = np.stack([1.0 - p, p], axis=1)
    y = _class_indices(labels, c, "labels")
    if y.shape[0] != p.shape[0]:
        raise ValueError(f"Expect labels and probabilities with the same number of examples, "
                         f"got {y.shape[0]} and {p.shape[0]}")
    w = None
    if weights is not None:
        w = np.asarray(to_cpu(weights), dtype=np.float64)
        if w.shape != (y.shape[0],):
            raise ValueError(f"Expect weights of shape ({y.shape[0]},), one per example, got shape {w.shape}")
        _first_nonfinite(w, "weights")
        negative = np.flatnonzero(w < 0)
        if negative.size:
            raise ValueError(f"Expect non-negative weights, got {w[negative[0]]} at index {int(negative[0])}")
    return Batch(y, p, w, one_column, eps)


def _check_fields(d, type_name: str, required: Sequence[str]) -> dict:
    """``d`` as a :meth:`to_dict` output of ``type_name``: a dict with that
    ``type`` and exactly the ``required`` fields (missing and unknown ones named)."""
    if not isinstance(d, dict) or d.get("type") != type_name:
        got = d.get("type") if isinstance(d, dict) else d
        raise ValueError(f"Expect a dict with type {type_name!r}, got {got!r}")
    missing = [k for k in required if k not in d]
    unknown = sorted(set(d) - set(required) - {"type"})
    if missing or unknown:
        raise ValueError(f"Expect the fields {list(required)} in a {type_name} dict, got "
                         f"{'missing ' + repr(missing) if missing else ''}"
                         f"{' and ' if missing and unknown else ''}{'unknown ' + repr(unknown) if unknown else ''}")
    return d


def _field_array(d: dict, type_name: str, key: str, shape: tuple, dtype, nonnegative: bool = True) -> np.ndarray:
    """Field ``key`` of a ``type_name`` dict as a finite array of ``shape``
    (``None`` in ``shape``: any length) and ``dtype`` (int: whole numbers)."""
    what = f"{type_name} field {key!r}"
    try:
        a = np.asarray(d[key], dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise ValueError(f"Expect {what} to be numbers of shape {shape}, got {type(d[key]).__name__}: {e}") from None
    if a.ndim != len(shape) or any(s is not None and s != n for s, n in zip(shape, a.shape)):
        raise ValueError(f"Expect {what} of shape {shape}, got shape {a.shape}")
    _first_nonfinite(a, what)
    if nonnegative and (a < 0).any():
        raise ValueError(f"Expect non-negative {what}, got {a[a < 0].flat[0]}")
    if np.dtype(dtype).kind == "i":
        if not np.array_equal(a, np.round(a)):
            raise ValueError(f"Expect whole numbers in {what}, got {a[a != np.round(a)].flat[0]}")
        return a.astype(dtype)
    return a


class _ProbabilityMetric:
    """What the metrics of predicted probabilities share: the one ``eval``
    (arguments checked by :func:`_checked_batch`, then ``_accumulate``),
    ``to_json``/``from_json`` and equality through ``to_dict``/``from_dict``,
    and the checks of ``merge``."""

    num_classes: int

    def _unit_interval(self, probabilities) -> bool:
        """Whether ``probabilities`` must lie in [0, 1] (by default they must)."""
        return True

    def _accumulate(self, batch: Batch) -> None:
        raise NotImplementedError

    def eval(self, labels, probabilities, weights=None):
        """Add a batch of examples.

        Parameters
        ----------
        labels : array_like
            Shape (N,) class indices, or (N, C) one-hot (argmax taken).
        probabilities : array_like
            Shape (N, C); with two classes also (N,), the probability of
            class 1. Finite, and in [0, 1] but where the class notes say
            (an exact :class:`ROC` and :class:`TopKAccuracy`'s (N, C) input
            rank any finite scores). numpy or CuPy arrays.
        weights : array_like, optional
            Shape (N,) non-negative example weights (scikit-learn's
            ``sample_weight``); 1 each by default.

        Returns
        -------
        self
            For chaining.

        Raises
        ------
        ValueError
            Wrong shapes, N mismatch, probabilities not finite or out of
            range, labels out of range, negative weights (the first bad value
            named), or more scores than an exact ROC's ``max_count``; nothing
            is added then.
        """
        self._accumulate(_checked_batch(self.num_classes, labels, probabilities, weights,
                                        self._unit_interval(probabilities)))
        return self

    def to_json(self, **kwargs) -> str:
        """JSON text of :meth:`to_dict`; ``kwargs`` go to :func:`json.dumps`."""
        return json.dumps(self.to_dict(), **kwargs)

    @classmethod
    def from_json(cls, text: str):
        """Rebuild from :meth:`to_json` output."""
        return cls.from_dict(json.loads(text))

    def __eq__(self, other):
        if type(other) is not type(self):
            return NotImplemented
        return self.to_dict() == other.to_dict()

    __hash__ = None  # mutable

    def _check_mergeable(self, other, *fields: str) -> None:
        """``other`` is of this class and agrees on ``fields`` (constructor arguments)."""
        name = type(self).__name__
        if type(other) is not type(self):
            raise TypeError(f"Expect a {name} to merge, got {type(other).__name__}")
        for f in fields:
            if getattr(other, f) != getattr(self, f):
                raise ValueError(f"Expect a {name} with {f}={getattr(self, f)!r} to merge, got {getattr(other, f)!r}")
