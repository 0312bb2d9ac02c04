"""Mergeable evaluation metrics for classification and regression.

Both classes keep only sufficient statistics in plain numpy attributes, so
that partial evaluations computed on Spark executors pickle cheaply and
``merge`` into exactly the evaluation of the concatenated data (the
``treeAggregate`` pattern of DL4J's ``SparkDl4jMultiLayer.evaluate``)::

    ev = rdd.treeAggregate(Evaluation(10), seq_op, lambda a, b: a.merge(b))

:class:`Evaluation` accumulates a confusion matrix; accuracy, precision,
recall and F1 are derived from it. :class:`RegressionEvaluation` accumulates
per-column error sums and label moments; MSE, MAE, RMSE and R² are derived.

A metric of an evaluation that has seen no examples is undefined and raises
``ValueError`` (as ``Network.score`` does on no data) rather than returning
NaN; ``count`` tells whether there is anything to ask, and ``stats()`` /
``repr()`` print ``n/a``.
"""
from __future__ import annotations

import json
import logging
from collections.abc import Sequence

import numpy as np

from .backend import to_cpu

__all__ = ["Evaluation", "RegressionEvaluation"]

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
        a = to_cpu(a)
        c = self.num_classes
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


class RegressionEvaluation:
    """Mergeable per-column regression metrics: MSE, MAE, RMSE and R².

    Parameters
    ----------
    num_columns : int
        Number of output columns C, at least 1.
    column_names : sequence of str, optional
        Names (length C) used by :meth:`stats`.

    Notes
    -----
    Kept per column, in float64: the sums of squared and of absolute errors,
    and the label mean and sum of squared deviations (merged with Chan et
    al.'s parallel formula, which avoids the cancellation of a raw sum of
    squares). Merging is therefore exact up to floating-point rounding.

    R² is ``1 - SSE / SST`` with ``SST`` the labels' sum of squared
    deviations. For constant labels (``SST == 0``) R² is 1.0 when the
    predictions are perfect and 0.0 otherwise (scikit-learn's
    ``force_finite`` convention). With no data every metric raises
    ``ValueError`` (:meth:`stats` prints ``n/a``).
    ``column=None`` in a metric averages the per-column values, as DL4J's
    ``averageMeanSquaredError`` and friends do.
    """

    def __init__(self, num_columns: int, column_names: Sequence[str] | None = None):
        self.num_columns = _check_positive_int("num_columns", num_columns, 1)
        self.column_names = _check_names("column_names", column_names, self.num_columns)
        c = self.num_columns
        self.count = 0
        self.sum_squared_error = np.zeros(c)
        self.sum_absolute_error = np.zeros(c)
        self.label_mean = np.zeros(c)
        self.label_m2 = np.zeros(c)

    def _as_matrix(self, a, what: str) -> np.ndarray:
        a = np.asarray(to_cpu(a), dtype=np.float64)
        if a.ndim == 1 and self.num_columns == 1:
            a = a[:, None]
        if a.ndim != 2 or a.shape[1] != self.num_columns:
            raise ValueError(
                f"Expect {what} of shape (N, {self.num_columns})"
                f"{' or (N,)' if self.num_columns == 1 else ''}, got shape {a.shape}"
            )
        _first_nonfinite(a, what)
        return a

    def eval(self, y_true, y_pred) -> "RegressionEvaluation":
        """Add a batch of examples.

        Parameters
        ----------
        y_true, y_pred : array_like
            Shape (N, C), or (N,) when C == 1; any real dtype (computed in
            float64); numpy or CuPy arrays.

        Returns
        -------
        RegressionEvaluation
            ``self``, for chaining.

        Raises
        ------
        ValueError
            Wrong shapes, N mismatch, or NaN/inf values (naming the first).
        """
        t = self._as_matrix(y_true, "y_true")
        p = self._as_matrix(y_pred, "y_pred")
        if t.shape[0] != p.shape[0]:
            raise ValueError(
                f"Expect y_true and y_pred with the same number of examples, got {t.shape[0]} and {p.shape[0]}"
            )
        n = t.shape[0]
        if n == 0:
            return self
        err = p - t
        mean = t.mean(axis=0)
        self._combine(n, np.einsum("ij,ij->j", err, err), np.abs(err).sum(axis=0), mean,
                      ((t - mean) ** 2).sum(axis=0))
        return self

    def _combine(self, n_b: int, sse_b, sae_b, mean_b, m2_b) -> None:
        n_a = self.count
        n = n_a + n_b
        if n == 0:
            return
        delta = mean_b - self.label_mean
        self.label_mean = self.label_mean + delta * (n_b / n)
        self.label_m2 = self.label_m2 + m2_b + delta**2 * (n_a * n_b / n)
        self.sum_squared_error = self.sum_squared_error + sse_b
        self.sum_absolute_error = self.sum_absolute_error + sae_b
        self.count = n

    def merge(self, other: "RegressionEvaluation") -> "RegressionEvaluation":
        """Add another evaluation's statistics into this one; returns ``self``."""
        if not isinstance(other, RegressionEvaluation):
            raise TypeError(f"Expect a RegressionEvaluation to merge, got {type(other).__name__}")
        if other.num_columns != self.num_columns:
            raise ValueError(
                f"Expect a RegressionEvaluation with num_columns={self.num_columns} to merge, got {other.num_columns}"
            )
        if self.column_names is None:
            self.column_names = None if other.column_names is None else list(other.column_names)
        elif other.column_names is not None and other.column_names != self.column_names:
            raise ValueError(
                f"Expect matching column_names to merge, got {self.column_names!r} and {other.column_names!r}"
            )
        self._combine(other.count, other.sum_squared_error, other.sum_absolute_error,
                      other.label_mean, other.label_m2)
        return self

    # --------------------------------------------------------------- metrics
    def _pick(self, key: str, column) -> float:
        """Metric ``key`` of ``column``, or its mean over columns (argument checked first)."""
        if column is not None and (isinstance(column, bool) or not isinstance(column, (int, np.integer))
                                   or not 0 <= column < self.num_columns):
            raise ValueError(f"Expect a column index in 0..{self.num_columns - 1}, got {column!r}")
        values = self.metrics()[key]
        return float(values.mean() if column is None else values[int(column)])

    def metrics(self) -> dict[str, np.ndarray]:
        """Per-column metrics: ``{'mse', 'mae', 'rmse', 'r2'}`` -> (C,) float64 arrays.

        Raises
        ------
        ValueError
            No examples were evaluated.
        """
        _require_examples("the RegressionEvaluation", self.count, "regression metrics")
        mse = self.sum_squared_error / self.count
        sst = self.label_m2
        with np.errstate(divide="ignore", invalid="ignore"):
            r2 = np.where(sst > 0, 1.0 - self.sum_squared_error / np.where(sst > 0, sst, 1.0),
                          np.where(self.sum_squared_error == 0, 1.0, 0.0))
        return {"mse": mse, "mae": self.sum_absolute_error / self.count, "rmse": np.sqrt(mse), "r2": r2}

    def mse(self, column: int | None = None) -> float:
        """Mean squared error of ``column``, or the mean over columns (ValueError with no examples)."""
        return self._pick("mse", column)

    def mae(self, column: int | None = None) -> float:
        """Mean absolute error of ``column``, or the mean over columns."""
        return self._pick("mae", column)

    def rmse(self, column: int | None = None) -> float:
        """Root mean squared error of ``column``, or the mean of per-column RMSEs."""
        return self._pick("rmse", column)

    def r2(self, column: int | None = None) -> float:
        """Coefficient of determination of ``column``, or the mean over columns."""
        return self._pick("r2", column)

    def _name(self, i: int) -> str:
        return self.column_names[i] if self.column_names is not None else f"col_{i}"

    def stats(self) -> str:
        """Human-readable per-column table in the manner of DL4J's ``RegressionEvaluation.stats()``
        (``n/a`` for every metric with no examples)."""
        width = max([6] + [len(self._name(i)) for i in range(self.num_columns)]) + 2
        lines = [f"{'Column':<{width}}{'MSE':<15}{'MAE':<15}{'RMSE':<15}{'R^2'}"]
        m = self.metrics() if self.count else None
        for i in range(self.num_columns):
            cells = [f"{m[k][i]:<15.5e}" if m else f"{'n/a':<15}" for k in ("mse", "mae", "rmse", "r2")]
            lines.append(f"{self._name(i):<{width}}" + "".join(cells).rstrip())
        lines.append(f"({self.count} examples)")
        return "\n".join(lines)

    def __eq__(self, other):
        if not isinstance(other, RegressionEvaluation):
            return NotImplemented
        return self.to_dict() == other.to_dict()

    __hash__ = None  # mutable

    def __repr__(self):
        return (f"RegressionEvaluation(num_columns={self.num_columns}, count={self.count}, "
                f"mse={_fmt(self.mse, '.6g')})")

    # --------------------------------------------------------- serialization
    def to_dict(self) -> dict:
        """Plain-Python form of the sufficient statistics (floats round-trip exactly through JSON)."""
        return {
            "type": "RegressionEvaluation",
            "num_columns": self.num_columns,
            "column_names": None if self.column_names is None else list(self.column_names),
            "count": self.count,
            "sum_squared_error": self.sum_squared_error.tolist(),
            "sum_absolute_error": self.sum_absolute_error.tolist(),
            "label_mean": self.label_mean.tolist(),
            "label_m2": self.label_m2.tolist(),
        }

    @classmethod
    def from_dict(cls, d: dict) -> "RegressionEvaluation":
        """Rebuild from :meth:`to_dict` output, validating lengths."""
        if not isinstance(d, dict) or d.get("type") != "RegressionEvaluation":
            raise ValueError(
                f"Expect a dict with type 'RegressionEvaluation', got {d.get('type') if isinstance(d, dict) else d!r}"
            )
        ev = cls(d["num_columns"], d.get("column_names"))
        ev.count = _check_positive_int("count", d["count"], 0)
        for key in ("sum_squared_error", "sum_absolute_error", "label_mean", "label_m2"):
            v = np.asarray(d[key], dtype=np.float64)
            if v.shape != (ev.num_columns,):
                raise ValueError(f"Expect {key} of length {ev.num_columns}, got shape {v.shape}")
            setattr(ev, key, v)
        return ev

    def to_json(self, **kwargs) -> str:
        """JSON text of :meth:`to_dict`; ``kwargs`` go to :func:`json.dumps`."""
        return json.dumps(self.to_dict(), **kwargs)

    @classmethod
    def from_json(cls, text: str) -> "RegressionEvaluation":
        """Rebuild from :meth:`to_json` output."""
        return cls.from_dict(json.loads(text))
