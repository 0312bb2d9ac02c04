"""Mergeable ROC AUC and PR AUC (average precision): exact, or in bounded memory."""
from __future__ import annotations

import logging
from typing import Optional

import numpy as np

from ..configurable import register
from ._common import (_AREA_AVERAGES, Batch, _ProbabilityMetric, _check_fields, _check_positive_int, _field_array,
                      _fmt, _require_examples)

__all__ = ["ROC"]

logger = logging.getLogger(__name__)

#: The most scores the exact mode keeps by default (8 MB of float64).
DEFAULT_MAX_COUNT = 1_000_000


def _curve(scores: np.ndarray, positive: np.ndarray, weights: Optional[np.ndarray]):
    """``(tps, fps)``: the weight of positives and of negatives scoring at
    least each distinct score, in descending order of score (scikit-learn's
    ``_binary_clf_curve``: tied scores are one point of the curves)."""
    if weights is not None:
        keep = weights > 0  # zero-weight examples move no point (scikit-learn drops them too)
        scores, positive, weights = scores[keep], positive[keep], weights[keep]
    if scores.size == 0:
        return np.zeros(0), np.zeros(0)
    order = np.argsort(scores, kind="mergesort")[::-1]
    s, pos = scores[order], positive[order]
    ends = np.r_[np.flatnonzero(np.diff(s)), s.size - 1]  # the last index of each tie group
    if weights is None:
        tps = np.cumsum(pos, dtype=np.float64)[ends]
        return tps, (ends + 1) - tps
    w = weights[order]
    return np.cumsum(np.where(pos, w, 0.0))[ends], np.cumsum(np.where(pos, 0.0, w))[ends]


def _roc_auc(tps: np.ndarray, fps: np.ndarray) -> float:
    """Trapezoidal area under (fps / N, tps / P) from (0, 0); NaN unless P, N > 0."""
    if tps.size == 0 or tps[-1] <= 0 or fps[-1] <= 0:
        return float("nan")
    return float(np.trapezoid(np.r_[0.0, tps] / tps[-1], np.r_[0.0, fps] / fps[-1]))


def _average_precision(tps: np.ndarray, fps: np.ndarray) -> float:
    """``sum((R_i - R_{i-1}) * P_i)`` over the curve's points (scikit-learn's
    ``average_precision_score``, no interpolation); NaN unless P > 0."""
    if tps.size == 0 or tps[-1] <= 0:
        return float("nan")
    ps = tps + fps
    precision = np.divide(tps, ps, out=np.zeros_like(tps), where=ps > 0)
    return float(max(0.0, np.sum(np.diff(np.r_[0.0, tps / tps[-1]]) * precision)))


def _binned_bounds(pos: np.ndarray, neg: np.ndarray) -> tuple[float, float]:
    """The AUC and PR AUC error bounds of one class's bins (see :class:`ROC`);
    the last bin, scores of exactly 1.0, is one tie group and adds no error."""
    p_total, n_total = pos.sum(), neg.sum()
    auc_bound = (0.5 * float(np.dot(pos[:-1] / p_total, neg[:-1] / n_total))
                 if p_total > 0 and n_total > 0 else float("nan"))
    if p_total <= 0:
        return auc_bound, float("nan")
    p, n = pos[-2::-1], neg[-2::-1]  # the ranged bins, from the top down
    above_p = pos[-1] + np.cumsum(p) - p  # A: positive weight in the bins above
    above_n = neg[-1] + np.cumsum(n) - n  # B
    has = p > 0
    binned = p * np.divide(above_p + p, above_p + above_n + p + n, out=np.zeros_like(p), where=has)
    high = p * np.divide(above_p + p, above_p + above_n + p, out=np.zeros_like(p), where=has)
    c = above_p + above_n + n
    with np.errstate(over="ignore"):  # p / c of subnormal weights: the logarithm is inf, the bound 0
        below = (above_n + n) * np.log1p(np.divide(p, c, out=np.zeros_like(p), where=c > 0))
    low = np.where(above_n + n > 0, np.clip(p - below, 0.0, p), p)  # the integral of (A + k) / (c + k), k in [0, p]
    gap = np.where(has, np.maximum(high - binned, binned - low), 0.0)
    return auc_bound, float(np.sum(gap) / p_total)


@register("evaluation")  # travels as to_dict() in task results (spark/executor/codec.py)
class ROC(_ProbabilityMetric):
    r"""Mergeable ROC AUC and PR AUC (average precision), binary or one-vs-rest.

    With two classes the curves are those of class 1's probability (labels
    1 positive, 0 negative). With C > 2 classes each class c has its own
    one-vs-rest curves (column c of the probabilities, labels equal to c
    positive), averaged by :meth:`auc` and :meth:`pr_auc`.

    Parameters
    ----------
    num_classes : int, default 2
        Number of classes C, at least 2.
    threshold_steps : int, optional
        ``None`` (the default): the **exact** mode, which keeps every score.
        An int N >= 1: the **bounded-memory** mode (DL4J's thresholded
        ``ROC(thresholdSteps)``), which keeps weighted counts of positives and
        negatives in N equal-width score bins per class.
    max_count : int, default 1_000_000
        The exact mode's limit on the scores it keeps: one per example with
        two classes, C per example with C > 2 (8 bytes each in memory, about
        20 as JSON in a task result). An ``eval`` or ``merge`` that would pass
        it raises ``ValueError``, naming the limit and the bounded mode.
        Ignored by the bounded mode.

    Attributes
    ----------
    num_classes : int
    threshold_steps : int or None
    max_count : int

    Notes
    -----
    **Exact mode.** ``eval`` keeps each example's label, score(s) and weight;
    ``merge`` concatenates. :meth:`auc` is scikit-learn's ``roc_auc_score``
    and :meth:`pr_auc` its ``average_precision_score`` on the same data
    (with ``multi_class="ovr"`` and the same ``average`` for C > 2): tied
    scores form one point of the curves, so a tied (positive, negative) pair
    counts one half in the AUC, and a positive's precision is that of the
    lowest threshold reaching it. Scores may be any finite numbers (only
    their order matters).

    **Bounded-memory mode.** A score ``s`` in [0, 1] falls in bin
    ``min(floor(s * N), N - 1)``; the curves are evaluated at the N + 1
    thresholds ``j / N``, as if the scores of one bin were tied (the
    metrics equal scikit-learn's on the bin indices). Memory is
    ``C x N x 2`` floats whatever the number of examples, and ``merge``
    adds counts: exactly, for unweighted examples (integer counts below
    2**53), and to floating-point rounding for fractional weights.

    *Error bounds.* Binning is monotone (``s < t`` puts ``s`` in the same
    bin as ``t`` or a lower one), so only pairs within one bin can be
    ordered differently from their scores. With ``p_b`` and ``n_b`` the
    weight of a class's positives and negatives in bin b, and P, N their
    totals:

    * The AUC is the mean, over (positive, negative) pairs weighted by the
      product of their weights, of 1 when the positive scores higher, 1/2
      when tied, 0 when lower. The binned AUC gives every pair within one
      bin 1/2, where the exact scores give 0, 1/2 or 1; every other pair
      counts the same. Hence

      .. math:: |AUC - AUC_{binned}| \le \frac{1}{2} \sum_b \frac{p_b n_b}{P N}

      (:meth:`auc_error_bound`), and the bound is attained when, in every
      bin, all positives score above all negatives (or all below).
    * The average precision is the mean, over positives weighted by their
      weight, of the precision at the threshold that first includes them.
      For a positive in bin b, with A and B the positive and negative weight
      in the bins above, that precision is ``(A + k) / (A + B + k + m)`` for
      some k in (0, p_b] and m in [0, n_b]; the binned mode uses
      ``f_b = (A + p_b) / (A + B + p_b + n_b)``. The exact value lies
      between ``lo_b = A / (A + B + n_b)`` (1 when that is 0 / 0) and
      ``hi_b = (A + p_b) / (A + B + p_b)``, hence

      .. math:: |AP - AP_{binned}| \le \sum_b \frac{p_b}{P}
                \max(hi_b - f_b, f_b - lo_b)

      (:meth:`pr_auc_error_bound`). Both bounds are computed from the bin
      counts, shrink as N grows for scores with a density, and are 0.0 in
      the exact mode. Averages over classes bound their error by the same
      average of the classes' bounds.

    **Undefined values.** A class's AUC needs positive and negative weight,
    its PR AUC positive weight. Asked for one class (or the binary value),
    an undefined metric raises ``ValueError``; the macro and weighted
    averages leave such classes out (:meth:`excluded_classes` lists them;
    scikit-learn would return NaN) and raise when none is left. The
    weighted average weights each class by its positive weight. With no
    examples every metric raises ``ValueError``.

    Examples
    --------
    >>> roc = ROC().eval([0, 1, 1, 0], [0.2, 0.9, 0.6, 0.6])
    >>> roc.auc()
    0.875
    >>> big = ROC(num_classes=10, threshold_steps=1000)  # bounded memory
    """

    def __init__(self, num_classes: int = 2, threshold_steps: Optional[int] = None,
                 max_count: int = DEFAULT_MAX_COUNT):
        self.num_classes = _check_positive_int("num_classes", num_classes, 2)
        if threshold_steps is not None:
            if isinstance(threshold_steps, bool) or not isinstance(threshold_steps, (int, np.integer)) \
                    or threshold_steps < 1:
                raise ValueError(f"Expect threshold_steps None (the exact mode) or an int >= 1 (the number of "
                                 f"score bins), got {threshold_steps!r}")
            threshold_steps = int(threshold_steps)
        self.threshold_steps = threshold_steps
        self.max_count = _check_positive_int("max_count", max_count, 1)
        self._count = 0
        self._chunks: list = []  # exact: (labels (n,) int64, scores (n, K) float64, weights (n,) or None)
        self._bins = None if threshold_steps is None else np.zeros((self._columns, threshold_steps + 1, 2))
        self._summary = None

    # ------------------------------------------------------------------ state
    @property
    def _columns(self) -> int:
        """K: one score column (class 1's) with two classes, C with more."""
        return 1 if self.num_classes == 2 else self.num_classes

    @property
    def exact(self) -> bool:
        """True in the exact mode (``threshold_steps is None``)."""
        return self.threshold_steps is None

    @property
    def count(self) -> int:
        """Number of examples evaluated."""
        return self._count

    def _check_room(self, extra_examples: int) -> None:
        kept = (self._count + extra_examples) * self._columns
        if self.exact and kept > self.max_count:
            raise ValueError(
                f"Expect at most max_count={self.max_count} scores in an exact ROC, got {kept} "
                f"({self._count + extra_examples} examples x {self._columns} score"
                f"{'s' if self._columns > 1 else ''}): the exact mode keeps every score; use "
                f"ROC(threshold_steps=N) for bounded memory (its error is auc_error_bound()), or a larger max_count"
            )

    def _positives(self, labels: np.ndarray) -> np.ndarray:
        """(n, K) bool: which examples are positive for each score column."""
        if self.num_classes == 2:
            return (labels == 1)[:, None]
        return labels[:, None] == np.arange(self.num_classes)

    def _data(self):
        """The exact mode's (labels, scores, weights), as one chunk."""
        if len(self._chunks) > 1:
            weighted = any(w is not None for _, _, w in self._chunks)
            self._chunks = [(
                np.concatenate([y for y, _, _ in self._chunks]),
                np.concatenate([s for _, s, _ in self._chunks]),
                np.concatenate([np.ones(len(y)) if w is None else w for y, _, w in self._chunks]) if weighted else None,
            )]
        if not self._chunks:
            return np.zeros(0, np.int64), np.zeros((0, self._columns)), None
        return self._chunks[0]

    def _unit_interval(self, probabilities) -> bool:
        return not self.exact  # the exact mode ranks any finite scores

    def _accumulate(self, b: Batch) -> None:
        scores = b.probabilities[:, 1:] if self.num_classes == 2 else b.probabilities
        n = b.labels.shape[0]
        if self.exact:
            self._check_room(n)
            if n:  # copies: the caller's arrays may be its own (or reused) buffers
                self._chunks.append((np.array(b.labels), np.array(scores),
                                     None if b.weights is None else np.array(b.weights)))
        elif n:
            k, steps = self._columns, self.threshold_steps
            bins = np.where(scores == 1.0, steps, np.minimum(np.floor(scores * steps), steps - 1)).astype(np.int64)
            flat = (np.arange(k) * (steps + 1) + bins) * 2 + self._positives(b.labels)
            w = None if b.weights is None else np.repeat(b.weights, k)
            self._bins += np.bincount(flat.ravel(), weights=w, minlength=k * (steps + 1) * 2).reshape(k, steps + 1, 2)
        self._count += n
        self._summary = None

    def merge(self, other: "ROC") -> "ROC":
        """Add another ROC's examples into this one.

        Parameters
        ----------
        other : ROC
            Same ``num_classes`` and ``threshold_steps``.

        Returns
        -------
        ROC
            ``self``, now the ROC of both data sets together (exact mode:
            ``other``'s examples after this one's, within ``max_count``).
        """
        self._check_mergeable(other, "num_classes", "threshold_steps")
        if self.exact:
            self._check_room(other._count)
            self._chunks.extend(other._chunks)
        else:
            self._bins += other._bins
        self._count += other._count
        self._summary = None
        return self

    # --------------------------------------------------------------- metrics
    def _per_class(self) -> dict:
        """Per score column: ``auc``, ``pr_auc``, their bounds (NaN where
        undefined), the positive and negative weight; computed once per state."""
        if self._summary is not None:
            return self._summary
        k = self._columns
        out = {key: np.full(k, np.nan) for key in ("auc", "pr_auc", "auc_bound", "pr_auc_bound")}
        out["positives"], out["negatives"] = np.zeros(k), np.zeros(k)
        if self.exact:
            labels, scores, weights = self._data()
            positive = self._positives(labels)
            for c in range(k):
                tps, fps = _curve(scores[:, c], positive[:, c], weights)
                out["auc"][c], out["pr_auc"][c] = _roc_auc(tps, fps), _average_precision(tps, fps)
                if tps.size:
                    out["positives"][c], out["negatives"][c] = tps[-1], fps[-1]
            out["auc_bound"] = np.where(np.isnan(out["auc"]), np.nan, 0.0)
            out["pr_auc_bound"] = np.where(np.isnan(out["pr_auc"]), np.nan, 0.0)
        else:
            for c in range(k):
                neg, pos = self._bins[c, :, 0], self._bins[c, :, 1]
                tps, fps = np.cumsum(pos[::-1]), np.cumsum(neg[::-1])
                out["auc"][c], out["pr_auc"][c] = _roc_auc(tps, fps), _average_precision(tps, fps)
                out["auc_bound"][c], out["pr_auc_bound"][c] = _binned_bounds(pos, neg)
                out["positives"][c], out["negatives"][c] = tps[-1], fps[-1]
        self._summary = out
        return out

    def _check_cls(self, cls) -> Optional[int]:
        """``cls`` as a score column, or None for an average (binary: column 0)."""
        binary = self.num_classes == 2
        if cls is None:
            return 0 if binary else None
        if isinstance(cls, bool) or not isinstance(cls, (int, np.integer)) \
                or not (cls == 1 if binary else 0 <= cls < self.num_classes):
            expected = ("None or 1 (the positive class of a two-class ROC)" if binary
                        else f"in 0..{self.num_classes - 1}, or None for an average")
            raise ValueError(f"Expect cls {expected}, got {cls!r}")
        return 0 if binary else int(cls)

    def _value(self, key: str, metric: str, cls, average: str) -> float:
        if average not in _AREA_AVERAGES:
            raise ValueError(f"Expect average in {_AREA_AVERAGES}, got {average!r}")
        column = self._check_cls(cls)
        _require_examples("the ROC", self._count, metric)
        summary = self._per_class()
        values = summary[key]
        needs = "positive and negative" if key.startswith("auc") else "positive"
        if column is not None:
            if np.isnan(values[column]):
                cls_name = 1 if self.num_classes == 2 else column
                raise ValueError(f"Expect {needs} examples (of non-zero weight) of class {cls_name} for its "
                                 f"{metric}, got positive weight {summary['positives'][column]:g} and negative "
                                 f"weight {summary['negatives'][column]:g} in {self._count} examples: the {metric} "
                                 f"is undefined")
            return float(values[column])
        defined = ~np.isnan(values)
        if not defined.any():
            raise ValueError(f"Expect at least one class with {needs} examples for the {average} {metric}, "
                             f"got none in {self._count} examples")
        weights = None if average == "macro" else summary["positives"][defined]
        return float(np.average(values[defined], weights=weights))

    def auc(self, cls: Optional[int] = None, average: str = "macro") -> float:
        """Area under the ROC curve.

        Parameters
        ----------
        cls : int, optional
            With C > 2 classes, one class's one-vs-rest AUC; ``None`` averages
            them. With two classes only ``None`` or 1 (the one binary AUC).
        average : {'macro', 'weighted'}
            Average over classes when ``cls`` is ``None`` and C > 2: the plain
            mean, or weighted by each class's positive weight (classes with
            an undefined AUC left out, see the class notes).

        Returns
        -------
        float
            The area, in [0, 1]: 1 ranks every positive above every negative.

        Raises
        ------
        ValueError
            No examples, a bad ``cls`` or ``average``, or the AUC is undefined.
        """
        return self._value("auc", "ROC AUC", cls, average)

    def pr_auc(self, cls: Optional[int] = None, average: str = "macro") -> float:
        """Area under the precision-recall curve: the average precision
        (step-wise, not interpolated; arguments as :meth:`auc`)."""
        return self._value("pr_auc", "PR AUC", cls, average)

    def auc_error_bound(self, cls: Optional[int] = None, average: str = "macro") -> float:
        """Bound on ``|auc(cls, average) - exact AUC|``: 0.0 in the exact
        mode; in the bounded mode half the weighted share of (positive,
        negative) pairs that fall in one bin (see the class notes)."""
        return self._value("auc_bound", "ROC AUC error bound", cls, average)

    def pr_auc_error_bound(self, cls: Optional[int] = None, average: str = "macro") -> float:
        """Bound on ``|pr_auc(cls, average) - exact PR AUC|``: 0.0 in the
        exact mode; from the bin counts in the bounded mode (see the class notes)."""
        return self._value("pr_auc_bound", "PR AUC error bound", cls, average)

    def excluded_classes(self, metric: str = "auc") -> list[int]:
        """Classes whose ``metric`` is undefined, left out of its averages.

        Parameters
        ----------
        metric : {'auc', 'pr_auc'}

        Returns
        -------
        list of int
            With two classes, ``[1]`` when the binary value is undefined.
        """
        if metric not in ("auc", "pr_auc"):
            raise ValueError(f"Expect metric 'auc' or 'pr_auc', got {metric!r}")
        if self._count == 0:
            return [1] if self.num_classes == 2 else list(range(self.num_classes))
        undefined = np.flatnonzero(np.isnan(self._per_class()[metric]))
        return [1] if self.num_classes == 2 and undefined.size else [int(c) for c in undefined]

    def __repr__(self):
        mode = "exact" if self.exact else f"threshold_steps={self.threshold_steps}"
        return f"ROC(num_classes={self.num_classes}, {mode}, count={self._count}, auc={_fmt(self.auc, '.4f')})"

    # --------------------------------------------------------- serialization
    def to_dict(self) -> dict:
        """Plain-Python form: the constructor's arguments, ``count`` and, in the
        exact mode, ``targets`` (class indices), ``scores`` ((N,) for two
        classes, else (N, C)) and ``weights`` (None when none were given);
        in the bounded mode ``bins`` ((K, N, 2) weighted negative and positive
        counts, K = 1 for two classes, else C)."""
        d = {"type": "ROC", "num_classes": self.num_classes, "threshold_steps": self.threshold_steps,
             "max_count": self.max_count, "count": self._count}
        if self.exact:
            labels, scores, weights = self._data()
            d.update(targets=labels.tolist(), scores=(scores[:, 0] if self._columns == 1 else scores).tolist(),
                     weights=None if weights is None else weights.tolist())
        else:
            d["bins"] = self._bins.tolist()
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "ROC":
        """Rebuild from :meth:`to_dict` output, validating every field (the bad one is named)."""
        exact = isinstance(d, dict) and d.get("threshold_steps") is None
        common = ["num_classes", "threshold_steps", "max_count", "count"]
        _check_fields(d, "ROC", common + (["targets", "scores", "weights"] if exact else ["bins"]))
        roc = cls(d["num_classes"], d["threshold_steps"], d["max_count"])
        count = _check_positive_int("ROC field 'count'", d["count"], 0)
        if exact:
            k = roc._columns
            labels = _field_array(d, "ROC", "targets", (count,), np.int64)
            if (labels >= roc.num_classes).any():
                raise ValueError(f"Expect ROC field 'targets' in 0..{roc.num_classes - 1}, got {labels.max()}")
            scores = _field_array(d, "ROC", "scores", (count,) if k == 1 else (count, k), np.float64,
                                  nonnegative=False).reshape(count, k)
            weights = None if d["weights"] is None else _field_array(d, "ROC", "weights", (count,), np.float64)
            roc._check_room(count)
            if count:
                roc._chunks = [(labels, scores, weights)]
        else:
            roc._bins = _field_array(d, "ROC", "bins", (roc._columns, roc.threshold_steps + 1, 2), np.float64)
        roc._count = count
        return roc
