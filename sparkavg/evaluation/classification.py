"""Mergeable classification metrics: a confusion matrix and what derives from it."""
from __future__ import annotations

import json
import logging
from collections.abc import Sequence

import numpy as np

from ..configurable import register
from ._common import _AVERAGES, _check_names, _check_positive_int, _class_indices, _fmt, _require_examples

__all__ = ["Evaluation"]

logger = logging.getLogger(__name__)


@register("evaluation")  # travels as to_dict() in task results (spark/executor/codec.py)
class Evaluation:
    """Mergeable multi-class classification metrics over a confusion matrix.

    Parameters
    ----------
    num_classes : int
        Number of classes C, at least 2.
    labels : sequence of str, optional
        Class names (length C) used by :meth:`stats`.

    Attributes
    ----------
    num_classes : int
    labels : list of str or None

    Notes
    -----
    Edge cases, after DL4J's ``Evaluation``:

    * Per class, precision is ``TP / (TP + FP)`` and is 0.0 when the class was
      never predicted; recall is ``TP / (TP + FN)`` and is 0.0 when the class
      has no examples; F1 is ``2PR / (P + R)`` and is 0.0 when either of P, R
      is undefined (or both are 0).
    * The macro average (the default) is the unweighted mean over the
      classes for which the metric is defined: classes never predicted are
      excluded from macro precision, classes without examples from macro
      recall, and classes with either from macro F1; :meth:`excluded_classes`
      lists them and :meth:`stats` warns about them. If data was seen but no
      class qualifies, the macro average is 0.0.
    * With no data at all (``count == 0``) every metric raises ``ValueError``
      (:meth:`stats` prints ``n/a``).
    * Unlike DL4J we never switch to "positive class only" for two classes:
      binary problems are macro-averaged too; ask ``precision(1)`` for the
      positive class.
    """

    def __init__(self, num_classes: int, labels: Sequence[str] | None = None):
        self.num_classes = _check_positive_int("num_classes", num_classes, 2)
        self.labels = _check_names("labels", labels, self.num_classes)
        self._confusion = np.zeros((self.num_classes, self.num_classes), dtype=np.int64)

    # ------------------------------------------------------------------ input
    def _as_class_indices(self, a, what: str) -> np.ndarray:
        return _class_indices(a, self.num_classes, what)

    def eval(self, y_true, y_pred) -> "Evaluation":
        """Add a batch of examples.

        Parameters
        ----------
        y_true : array_like
            Shape (N,) integer class indices, or (N, C) one-hot (argmax taken).
        y_pred : array_like
            Shape (N, C) probabilities or scores (argmax taken), or (N,)
            predicted class indices. numpy or CuPy arrays.

        Returns
        -------
        Evaluation
            ``self``, for chaining.

        Raises
        ------
        ValueError
            Wrong shapes, N mismatch, NaN/inf scores, or class indices out of
            range (naming the first bad index and value).
        """
        actual = self._as_class_indices(y_true, "y_true")
        predicted = self._as_class_indices(y_pred, "y_pred")
        if actual.shape[0] != predicted.shape[0]:
            raise ValueError(
                f"Expect y_true and y_pred with the same number of examples, "
                f"got {actual.shape[0]} and {predicted.shape[0]}"
            )
        c = self.num_classes
        self._confusion += np.bincount(actual * c + predicted, minlength=c * c).reshape(c, c)
        return self

    # ------------------------------------------------------------ statistics
    @property
    def confusion_matrix(self) -> np.ndarray:
        """Copy of the confusion matrix, (C, C) int64: rows actual, columns predicted."""
        return self._confusion.copy()

    @property
    def count(self) -> int:
        """Number of examples evaluated."""
        return int(self._confusion.sum())

    def true_positives(self) -> np.ndarray:
        """Per-class true positives, (C,) int64."""
        return np.diagonal(self._confusion).copy()

    def false_positives(self) -> np.ndarray:
        """Per-class false positives (predicted as the class, actually another), (C,) int64."""
        return self._confusion.sum(axis=0) - np.diagonal(self._confusion)

    def false_negatives(self) -> np.ndarray:
        """Per-class false negatives (actually the class, predicted another), (C,) int64."""
        return self._confusion.sum(axis=1) - np.diagonal(self._confusion)

    def class_count(self) -> np.ndarray:
        """Per-class number of actual examples, (C,) int64."""
        return self._confusion.sum(axis=1)

    # --------------------------------------------------------------- metrics
    def _check_cls(self, cls) -> int:
        if isinstance(cls, bool) or not isinstance(cls, (int, np.integer)) or not 0 <= cls < self.num_classes:
            raise ValueError(f"Expect a class index in 0..{self.num_classes - 1}, got {cls!r}")
        return int(cls)

    @staticmethod
    def _check_average(average: str) -> None:
        if average not in _AVERAGES:
            raise ValueError(f"Expect average in {_AVERAGES}, got {average!r}")

    def _per_class(self, metric: str) -> tuple[np.ndarray, np.ndarray]:
        """Per-class values (0.0 where undefined) and a mask of where defined."""
        tp = self.true_positives().astype(np.float64)
        fp = self.false_positives().astype(np.float64)
        fn = self.false_negatives().astype(np.float64)
        has_pred, has_true = (tp + fp) > 0, (tp + fn) > 0
        with np.errstate(invalid="ignore", divide="ignore"):
            p = np.where(has_pred, tp / np.where(has_pred, tp + fp, 1), 0.0)
            r = np.where(has_true, tp / np.where(has_true, tp + fn, 1), 0.0)
        if metric == "precision":
            return p, has_pred
        if metric == "recall":
            return r, has_true
        defined = has_pred & has_true
        denom = p + r
        f1 = np.where(defined & (denom > 0), 2 * p * r / np.where(denom > 0, denom, 1), 0.0)
        return f1, defined

    def _metric(self, metric: str, cls, average: str) -> float:
        self._check_average(average)
        if cls is not None:
            cls = self._check_cls(cls)
        _require_examples("the Evaluation", self.count, metric)
        if cls is not None:
            return float(self._per_class(metric)[0][cls])
        if average == "micro":
            # Single-label multi-class: micro P = micro R = micro F1 = accuracy.
            return self.accuracy()
        values, defined = self._per_class(metric)
        return float(values[defined].mean()) if defined.any() else 0.0

    def accuracy(self) -> float:
        """Fraction of examples predicted correctly.

        Raises
        ------
        ValueError
            No examples were evaluated.
        """
        n = self.count
        _require_examples("the Evaluation", n, "accuracy")
        return float(np.trace(self._confusion)) / n

    def precision(self, cls: int | None = None, average: str = "macro") -> float:
        """Precision of class ``cls``, or its average over classes.

        Parameters
        ----------
        cls : int, optional
            Class index; ``None`` averages over classes.
        average : {'macro', 'micro'}
            Averaging when ``cls`` is ``None`` (see the class notes for the
            classes excluded from the macro average).

        Returns
        -------
        float

        Raises
        ------
        ValueError
            No examples were evaluated, or a bad ``cls`` / ``average``.
        """
        return self._metric("precision", cls, average)

    def recall(self, cls: int | None = None, average: str = "macro") -> float:
        """Recall of class ``cls``, or its average over classes (see :meth:`precision`)."""
        return self._metric("recall", cls, average)

    def f1(self, cls: int | None = None, average: str = "macro") -> float:
        """F1 score of class ``cls``, or its average over classes (see :meth:`precision`)."""
        return self._metric("f1", cls, average)

    def excluded_classes(self, metric: str) -> list[int]:
        """Classes left out of the macro average of ``metric``.

        Parameters
        ----------
        metric : {'precision', 'recall', 'f1'}

        Returns
        -------
        list of int
            Never-predicted classes (precision), classes without examples
            (recall), or either (f1).
        """
        if metric not in ("precision", "recall", "f1"):
            raise ValueError(f"Expect metric 'precision', 'recall' or 'f1', got {metric!r}")
        return [int(i) for i in np.flatnonzero(~self._per_class(metric)[1])]

    # ----------------------------------------------------------------- merge
    def merge(self, other: "Evaluation") -> "Evaluation":
        """Add another evaluation's counts into this one.

        Parameters
        ----------
        other : Evaluation
            Same ``num_classes``; labels must agree when both have them.

        Returns
        -------
        Evaluation
            ``self``, now the evaluation of both data sets together.
        """
        if not isinstance(other, Evaluation):
            raise TypeError(f"Expect an Evaluation to merge, got {type(other).__name__}")
        if other.num_classes != self.num_classes:
            raise ValueError(
                f"Expect an Evaluation with num_classes={self.num_classes} to merge, got {other.num_classes}"
            )
        if self.labels is None:
            self.labels = None if other.labels is None else list(other.labels)
        elif other.labels is not None and other.labels != self.labels:
            raise ValueError(f"Expect matching labels to merge, got {self.labels!r} and {other.labels!r}")
        self._confusion += other._confusion
        return self

    def __eq__(self, other):
        if not isinstance(other, Evaluation):
            return NotImplemented
        return (
            self.num_classes == other.num_classes
            and self.labels == other.labels
            and np.array_equal(self._confusion, other._confusion)
        )

    __hash__ = None  # mutable

    def __repr__(self):
        return f"Evaluation(num_classes={self.num_classes}, count={self.count}, accuracy={_fmt(self.accuracy, '.4f')})"

    # ------------------------------------------------------------------ text
    def _label(self, i: int) -> str:
        return self.labels[i] if self.labels is not None else str(i)

    def stats(self, confusion: bool = True) -> str:
        """Human-readable summary in the manner of DL4J's ``Evaluation.stats()``.

        Parameters
        ----------
        confusion : bool, default True
            Append the confusion matrix.

        Returns
        -------
        str
        """
        c = self.num_classes
        lines = [
            "========================Evaluation Metrics========================",
            f" # of classes:    {c}",
            f" # of examples:   {self.count}",
            f" Accuracy:        {_fmt(self.accuracy, '.4f')}",
            f" Precision:       {_fmt(self.precision, '.4f')}",
            f" Recall:          {_fmt(self.recall, '.4f')}",
            f" F1 Score:        {_fmt(self.f1, '.4f')}",
            f"Precision, recall & F1: macro-averaged (equally weighted avg. of {c} classes)",
        ]
        if self.count:
            for metric, why in (("precision", "never predicted by the model"), ("recall", "never present in the data")):
                excluded = self.excluded_classes(metric)
                if excluded:
                    lines.append(
                        f"Warning: {len(excluded)} class{'es were' if len(excluded) > 1 else ' was'} {why} "
                        f"and excluded from average {metric}: {excluded}"
                    )
        if confusion:
            lines += ["", "=========================Confusion Matrix========================="]
            width = max(len(str(int(self._confusion.max(initial=0)))), len(str(c - 1))) + 1
            lines.append("".join(f"{j:>{width}d}" for j in range(c)))
            lines.append("-" * (width * c + 1))
            for i in range(c):
                row = "".join(f"{v:>{width}d}" for v in self._confusion[i])
                lines.append(f"{row} | {i} = {self._label(i)}")
            lines += ["", "Confusion matrix format: Actual (rowClass) predicted as (columnClass) N times"]
        lines.append("==================================================================")
        return "\n".join(lines)

    # --------------------------------------------------------- serialization
    def to_dict(self) -> dict:
        """Plain-Python form: ``type``, ``num_classes``, ``labels``, ``confusion_matrix`` (list of lists)."""
        return {
            "type": "Evaluation",
            "num_classes": self.num_classes,
            "labels": None if self.labels is None else list(self.labels),
            "confusion_matrix": self._confusion.tolist(),
        }

    @classmethod
    def from_dict(cls, d: dict) -> "Evaluation":
        """Rebuild from :meth:`to_dict` output, validating the matrix."""
        if not isinstance(d, dict) or d.get("type") != "Evaluation":
            raise ValueError(f"Expect a dict with type 'Evaluation', got {d.get('type') if isinstance(d, dict) else d!r}")
        ev = cls(d["num_classes"], d.get("labels"))
        m = np.asarray(d["confusion_matrix"])
        c = ev.num_classes
        if m.shape != (c, c) or (m.size and m.dtype.kind not in "iu") or (m < 0).any():
            raise ValueError(
                f"Expect confusion_matrix of {c}x{c} non-negative integers, got shape {m.shape} dtype {m.dtype}"
            )
        ev._confusion = m.astype(np.int64)
        return ev

    def to_json(self, **kwargs) -> str:
        """JSON text of :meth:`to_dict`; ``kwargs`` go to :func:`json.dumps`."""
        return json.dumps(self.to_dict(), **kwargs)

    @classmethod
    def from_json(cls, text: str) -> "Evaluation":
        """Rebuild from :meth:`to_json` output."""
        return cls.from_dict(json.loads(text))
