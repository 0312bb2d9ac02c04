"""Mergeable metrics of predicted probabilities: top-k accuracy, log loss and
expected calibration error."""
from __future__ import annotations

import logging
from typing import Optional

import numpy as np

from ..configurable import register
from ._common import (Batch, _ProbabilityMetric, _check_fields, _check_positive_int, _field_array, _fmt,
                      _require_examples)

__all__ = ["TopKAccuracy", "LogLoss", "CalibrationError"]

logger = logging.getLogger(__name__)


class _WeightedSums(_ProbabilityMetric):
    """The state every metric here shares: ``count`` examples, their total
    ``weight`` (the count when no weights were given) and the class's own
    float64 sums, each one array added on ``merge``.

    Subclasses name their sums in ``_SUMS`` (field name -> shape function of
    the instance) and their constructor arguments in ``_ARGUMENTS``, and
    compute the sums of one checked batch in ``_sums``.
    """

    _SUMS: dict = {}
    _ARGUMENTS: tuple = ()

    def _init_sums(self) -> None:
        self._count = 0
        self._weight = 0.0
        for name, shape in self._SUMS.items():
            setattr(self, "_" + name, np.zeros(shape(self)))

    @property
    def count(self) -> int:
        """Number of examples evaluated."""
        return self._count

    @property
    def total_weight(self) -> float:
        """Sum of the examples' weights (``count`` when none were given)."""
        return self._weight

    def _add(self, count: int, weight: float, **sums) -> None:
        self._count += count
        self._weight += weight
        for name, value in sums.items():
            setattr(self, "_" + name, getattr(self, "_" + name) + value)

    def _weighted(self, metric: str) -> float:
        """The total weight, checked non-zero for ``metric``."""
        _require_examples(f"the {type(self).__name__}", self._count, metric)
        if self._weight <= 0:
            raise ValueError(f"Expect a positive total weight for {metric}, got {self._weight} over "
                             f"{self._count} examples (all weights zero?)")
        return self._weight

    def merge(self, other):
        """Add another evaluation's sums into this one.

        Parameters
        ----------
        other
            Of the same class, with the same constructor arguments.

        Returns
        -------
        self
            Now the evaluation of both data sets together.
        """
        self._check_mergeable(other, *self._ARGUMENTS)
        self._add(other._count, other._weight, **{n: getattr(other, "_" + n) for n in self._SUMS})
        return self

    def to_dict(self) -> dict:
        """Plain-Python form: the constructor's arguments, ``count``, ``weight``
        and the sums (floats round-trip exactly through JSON)."""
        d = {"type": type(self).__name__, **{a: getattr(self, a) for a in self._ARGUMENTS},
             "count": self._count, "weight": self._weight}
        d.update({n: getattr(self, "_" + n).tolist() for n in self._SUMS})
        return d

    @classmethod
    def from_dict(cls, d: dict):
        """Rebuild from :meth:`to_dict` output, validating every field (the bad one is named)."""
        name = cls.__name__
        _check_fields(d, name, [*cls._ARGUMENTS, "count", "weight", *cls._SUMS])
        ev = cls(**{a: d[a] for a in cls._ARGUMENTS})
        ev._count = _check_positive_int(f"{name} field 'count'", d["count"], 0)
        ev._weight = float(_field_array(d, name, "weight", (), np.float64))
        for n, shape in cls._SUMS.items():
            setattr(ev, "_" + n, _field_array(d, name, n, shape(ev), np.float64))
        return ev

    def _accumulate(self, b: Batch) -> None:
        w = np.ones(b.labels.size) if b.weights is None else b.weights
        self._add(b.labels.size, float(w.sum()), **self._sums(b, w))

    def _sums(self, b: Batch, weights: np.ndarray) -> dict:
        """The class's sums over one checked batch (``weights``: 1 each when none were given)."""
        raise NotImplementedError


@register("evaluation")  # travels as to_dict() in task results (spark/executor/codec.py)
class TopKAccuracy(_WeightedSums):
    """Mergeable top-k accuracy: the share of examples whose true class is
    among the k highest-scored ones.

    Parameters
    ----------
    num_classes : int
        Number of classes C, at least 2.
    k : int, default 5
        How many of the highest scores count, 1 <= k <= C (k = C scores every
        example a hit, and logs a warning).

    Notes
    -----
    Equals scikit-learn's ``top_k_accuracy_score(labels, probabilities, k=k,
    labels=range(C), sample_weight=weights)``, ties included: among equal
    scores the higher class index ranks first (scikit-learn's stable
    ascending sort, reversed). Two-class probabilities given as (N,), the
    probability of class 1, predict class 1 when it is above 0.5, as
    scikit-learn does; given as (N, 2) they follow the rule above (class 1
    on a tie). Scores of an (N, C) input may be any finite numbers (logits
    too); an (N,) input must lie in [0, 1].
    """

    _SUMS = {"hits": lambda self: ()}
    _ARGUMENTS = ("num_classes", "k")

    def __init__(self, num_classes: int, k: int = 5):
        self.num_classes = _check_positive_int("num_classes", num_classes, 2)
        self.k = _check_positive_int("k", k, 1)
        if self.k > self.num_classes:
            raise ValueError(f"Expect k <= num_classes={self.num_classes}, got k={self.k}")
        if self.k == self.num_classes:
            logger.warning("TopKAccuracy with k == num_classes == %d counts every example a hit", self.k)
        self._init_sums()

    def _unit_interval(self, probabilities) -> bool:
        return np.ndim(probabilities) == 1  # (N, C) scores are ranked: logits will do

    def _sums(self, b: Batch, w: np.ndarray) -> dict:
        y, p = b.labels, b.probabilities
        if b.one_column:
            hits = (p[:, 1] > 0.5) == (y == 1) if self.k == 1 else np.ones(y.shape, bool)
        else:
            mine = p[np.arange(y.size), y][:, None]
            above = (p > mine) | ((p == mine) & (np.arange(self.num_classes) > y[:, None]))
            hits = above.sum(axis=1) < self.k
        return {"hits": float(np.dot(hits, w))}

    def accuracy(self) -> float:
        """Weighted share of examples whose class is among the top k (``ValueError``
        with no examples or a total weight of zero)."""
        return float(self._hits) / self._weighted("top-k accuracy")

    def __repr__(self):
        return (f"TopKAccuracy(num_classes={self.num_classes}, k={self.k}, count={self._count}, "
                f"accuracy={_fmt(self.accuracy, '.4f')})")


@register("evaluation")  # travels as to_dict() in task results (spark/executor/codec.py)
class LogLoss(_WeightedSums):
    """Mergeable log loss (cross-entropy): the weighted mean of
    ``-log(p[label])``, natural logarithm.

    Parameters
    ----------
    num_classes : int
        Number of classes C, at least 2.
    eps : float, optional
        Clip probabilities to ``[eps, 1 - eps]`` before the logarithm. By
        default scikit-learn's convention: the machine epsilon of the
        probabilities' dtype as given (float32: 2**-23, about 1.19e-7;
        float64: 2**-52, about 2.2e-16; float64's for other dtypes), per
        batch.

    Notes
    -----
    Equals scikit-learn's ``log_loss(labels, probabilities,
    labels=range(C), sample_weight=weights)`` for float64 probabilities.
    The logarithm is always taken in float64, so float32 probabilities give
    scikit-learn's value on the same probabilities in float64 clipped at
    float32's epsilon (scikit-learn itself computes in float32). Two-class
    probabilities given as (N,) are class 1's; class 0's is ``1 - p``.
    Probabilities must lie in [0, 1]; rows are not renormalised (nor does
    scikit-learn since 1.5).
    """

    _SUMS = {"loss": lambda self: ()}
    _ARGUMENTS = ("num_classes", "eps")

    def __init__(self, num_classes: int, eps: Optional[float] = None):
        self.num_classes = _check_positive_int("num_classes", num_classes, 2)
        if eps is not None and (isinstance(eps, bool) or not isinstance(eps, (int, float, np.floating))
                                or not 0 < eps < 0.5):
            raise ValueError(f"Expect eps None (the dtype's machine epsilon) or a float in (0, 0.5), got {eps!r}")
        self.eps = None if eps is None else float(eps)
        self._init_sums()

    def _sums(self, b: Batch, w: np.ndarray) -> dict:
        eps = b.eps if self.eps is None else self.eps
        losses = -np.log(np.clip(b.probabilities[np.arange(b.labels.size), b.labels], eps, 1 - eps))
        return {"loss": float(np.dot(losses, w))}

    def log_loss(self) -> float:
        """Weighted mean of ``-log(clip(p[label]))`` (``ValueError`` with no
        examples or a total weight of zero)."""
        return float(self._loss) / self._weighted("log loss")

    def __repr__(self):
        return f"LogLoss(num_classes={self.num_classes}, count={self._count}, log_loss={_fmt(self.log_loss, '.6g')})"


@register("evaluation")  # travels as to_dict() in task results (spark/executor/codec.py)
class CalibrationError(_WeightedSums):
    r"""Mergeable expected calibration error (ECE) in equal-width bins of
    confidence.

    Parameters
    ----------
    num_classes : int
        Number of classes C, at least 2.
    num_bins : int, default 15
        Number M of equal-width confidence bins over [0, 1].

    Notes
    -----
    Each example's prediction is its most probable class (the first on a
    tie) and its confidence that class's probability. Bin m (0-based) holds
    the confidences in ``(edges[m], edges[m + 1]]`` with ``edges =
    numpy.linspace(0, 1, M + 1)``; bin 0 also holds 0. With ``W_m`` the
    weight of bin m, ``acc_m`` its weighted share of correct predictions and
    ``conf_m`` its weighted mean confidence (Guo et al., 2017):

    .. math:: ECE = \sum_m \frac{W_m}{W} |acc_m - conf_m|

    which is ``sum_m |correct_m - confidence_m| / W`` over the per-bin
    weighted sums the class keeps (3 M floats; ``merge`` adds them).
    Two-class probabilities given as (N,) are class 1's (class 0's is
    ``1 - p``). Probabilities must lie in [0, 1].
    """

    _SUMS = {"bin_weight": lambda self: (self.num_bins,), "bin_correct": lambda self: (self.num_bins,),
             "bin_confidence": lambda self: (self.num_bins,)}
    _ARGUMENTS = ("num_classes", "num_bins")

    def __init__(self, num_classes: int, num_bins: int = 15):
        self.num_classes = _check_positive_int("num_classes", num_classes, 2)
        self.num_bins = _check_positive_int("num_bins", num_bins, 1)
        self._init_sums()

    @property
    def edges(self) -> np.ndarray:
        """The M + 1 bin edges, ``numpy.linspace(0, 1, M + 1)``."""
        return np.linspace(0.0, 1.0, self.num_bins + 1)

    def _sums(self, b: Batch, w: np.ndarray) -> dict:
        p, y = b.probabilities, b.labels
        predicted = np.argmax(p, axis=1)
        confidence = p[np.arange(y.size), predicted]
        bins = np.clip(np.searchsorted(self.edges, confidence, side="left") - 1, 0, self.num_bins - 1)

        def per_bin(values):
            return np.bincount(bins, weights=values, minlength=self.num_bins)

        return {"bin_weight": per_bin(w), "bin_correct": per_bin(w * (predicted == y)),
                "bin_confidence": per_bin(w * confidence)}

    def expected_calibration_error(self) -> float:
        """The ECE: weighted mean over examples of ``|acc_m - conf_m|`` of their
        bin (``ValueError`` with no examples or a total weight of zero)."""
        total = self._weighted("expected calibration error")
        return float(np.sum(np.abs(self._bin_correct - self._bin_confidence)) / total)

    def reliability(self) -> dict[str, np.ndarray]:
        """The reliability diagram's data, per bin.

        Returns
        -------
        dict
            ``edges`` (M + 1,), and (M,) arrays ``weight``, ``accuracy`` and
            ``confidence`` (NaN in bins without weight).
        """
        with np.errstate(invalid="ignore", divide="ignore"):
            has = self._bin_weight > 0
            return {"edges": self.edges, "weight": self._bin_weight.copy(),
                    "accuracy": np.where(has, self._bin_correct / self._bin_weight, np.nan),
                    "confidence": np.where(has, self._bin_confidence / self._bin_weight, np.nan)}

    def __repr__(self):
        return (f"CalibrationError(num_classes={self.num_classes}, num_bins={self.num_bins}, count={self._count}, "
                f"ece={_fmt(self.expected_calibration_error, '.4f')})")
