"""Mergeable regression metrics: per-column error sums and label moments."""
from __future__ import annotations

import json
import logging
from collections.abc import Sequence

import numpy as np

from ..backend import to_cpu
from ..configurable import register
from ._common import _check_names, _check_positive_int, _first_nonfinite, _fmt, _require_examples

__all__ = ["RegressionEvaluation"]

logger = logging.getLogger(__name__)


@register("evaluation")  # travels as to_dict() in task results (spark/executor/codec.py)
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
