"""Validation metrics by name: what a fit computes on its validation data after every epoch.

A fit with ``validation_data`` always records the validation loss
(``val_loss``: the mean of the model's own loss, :class:`~sparkavg.evaluation.Loss`)
and, for a classifier, the accuracy -- for a regression model (an MSE
output) the MSE, MAE and R² --; ``metrics=[...]`` names more.  Each
metric is read from one mergeable evaluation filled on the executors in
the same pass (several metrics share one: accuracy, precision, recall and
F1 one confusion matrix), and lands in the epoch's history entry as
``val_<name>``.

=====================  ==============  =====================================================
name                   model           value (better)
=====================  ==============  =====================================================
``accuracy``           classifier      share of examples predicted right (higher)
``precision``,         classifier      macro averages over classes (higher)
``recall``, ``f1``
``auc``, ``pr_auc``    classifier      ROC AUC and PR AUC, one-vs-rest macro average (higher)
``log_loss``           classifier      cross-entropy of the probabilities (lower)
``top5_accuracy``      > 5 classes     the true class among the 5 highest scores (higher)
``calibration_error``  classifier      expected calibration error, 15 bins (lower)
``mse``, ``mae``,      regression      over all output columns (lower)
``rmse``
``r2``                 regression      R², mean over output columns (higher)
=====================  ==============  =====================================================
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence

from ..evaluation import ROC, CalibrationError, Evaluation, LogLoss, Loss, RegressionEvaluation, TopKAccuracy

__all__ = ["METRICS", "LOSS", "VALIDATION_PREFIX", "ValidationPlan", "monitor_names", "higher_is_better",
           "check_metrics", "evaluated_as", "default_evaluation"]

logger = logging.getLogger(__name__)

#: The training loss's name in a history entry (and a monitor that needs no validation data).
LOSS = "loss"
#: What validation metrics' names start with in a history entry.
VALIDATION_PREFIX = "val_"


@dataclass(frozen=True)
class _Metric:
    task: str  # "classification" or "regression"
    evaluation: str  # the key of the evaluation it reads (one evaluation serves several metrics)
    value: Callable
    higher_is_better: bool


#: The evaluations metrics read, built for a model of ``units`` outputs.
_EVALUATIONS: Dict[str, Callable[[int], object]] = {
    "confusion": Evaluation,
    "roc": ROC,
    "log_loss": LogLoss,
    "top5": lambda units: TopKAccuracy(units, k=5),
    "calibration": CalibrationError,
    "regression": RegressionEvaluation,
}

#: Every metric a fit can name, as documented in the module's table.
METRICS: Dict[str, _Metric] = {
    "accuracy": _Metric("classification", "confusion", lambda e: e.accuracy(), True),
    "precision": _Metric("classification", "confusion", lambda e: e.precision(), True),
    "recall": _Metric("classification", "confusion", lambda e: e.recall(), True),
    "f1": _Metric("classification", "confusion", lambda e: e.f1(), True),
    "auc": _Metric("classification", "roc", lambda e: e.auc(), True),
    "pr_auc": _Metric("classification", "roc", lambda e: e.pr_auc(), True),
    "log_loss": _Metric("classification", "log_loss", lambda e: e.log_loss(), False),
    "top5_accuracy": _Metric("classification", "top5", lambda e: e.accuracy(), True),
    "calibration_error": _Metric("classification", "calibration", lambda e: e.expected_calibration_error(), False),
    "mse": _Metric("regression", "regression", lambda e: e.mse(), False),
    "mae": _Metric("regression", "regression", lambda e: e.mae(), False),
    "rmse": _Metric("regression", "regression", lambda e: e.rmse(), False),
    "r2": _Metric("regression", "regression", lambda e: e.r2(), True),
}

#: What every validation pass computes besides the loss.
DEFAULT_METRICS = {"classification": ("accuracy",), "regression": ("mse", "mae", "r2")}


def evaluated_as(spec) -> tuple:
    """``(classification, units)`` as the metrics see a model of data spec
    ``spec``: a classifier of its classes; a one-label binary output
    (``loss="bce"``) a classifier of two classes at the 0.5 threshold;
    several binary labels or regression outputs per column (for binary
    labels the MSE is the Brier score)."""
    if spec.target == "binary" and spec.num_outputs == 1:
        return True, 2
    return spec.classification, spec.num_outputs


def default_evaluation(spec):
    """What ``evaluate`` fills by default: an :class:`Evaluation` or a
    :class:`RegressionEvaluation`, as :func:`evaluated_as` sees the model."""
    classification, units = evaluated_as(spec)
    return Evaluation(units) if classification else RegressionEvaluation(units)


def monitor_names(classification: Optional[bool] = None, validation: bool = True) -> List[str]:
    """The names a fit's history entries may carry and early stopping may
    monitor: ``loss``, and with validation ``val_loss`` and ``val_<metric>``
    (of a classifier's or a regression model's metrics; both when
    ``classification`` is None)."""
    names = [LOSS]
    if validation:
        tasks = ("classification", "regression") if classification is None else \
            ("classification" if classification else "regression",)
        names += [VALIDATION_PREFIX + LOSS] + [VALIDATION_PREFIX + n for n, m in METRICS.items() if m.task in tasks]
    return names


def higher_is_better(name: str) -> bool:
    """Whether a larger value of monitor ``name`` is better (``loss``,
    ``val_loss`` and the errors: no)."""
    metric = METRICS.get(name[len(VALIDATION_PREFIX):]) if name.startswith(VALIDATION_PREFIX) else None
    return metric is not None and metric.higher_is_better


def check_metrics(metrics) -> List[str]:
    """``metrics`` (None or a list of names, ``val_`` optional) as a list of known metric names, loss left out."""
    if metrics is None:
        return []
    if isinstance(metrics, str) or not isinstance(metrics, Sequence):
        raise TypeError(f"Expect metrics as a list of metric names (e.g. ['accuracy', 'auc']), got "
                        f"{type(metrics).__name__} {metrics!r:.80}")
    names = []
    for m in metrics:
        if not isinstance(m, str):
            raise TypeError(f"Expect metric names as str, got {type(m).__name__} {m!r:.80} in {list(metrics)!r:.200}")
        name = m[len(VALIDATION_PREFIX):] if m.startswith(VALIDATION_PREFIX) else m
        if name == LOSS:
            continue  # always computed
        if name not in METRICS:
            raise ValueError(f"Expect metric names among {sorted(METRICS)} (and 'loss'), got {m!r}")
        if name not in names:
            names.append(name)
    return names


class ValidationPlan:
    """The evaluations one fit's validation pass runs, and how to read them.

    Parameters
    ----------
    classification : bool
        A classifier (a softmax output) or a regression model (MSE).
    units : int
        Classes, or regression outputs.
    metrics : list of str, optional
        Metrics named by the user (with or without ``val_``), on top of the
        defaults (:data:`DEFAULT_METRICS`); ``ValueError`` for an unknown
        one or one of the other kind of model, naming those that fit.
    """

    def __init__(self, classification: bool, units: int, metrics: Optional[Sequence[str]] = None):
        self.task = "classification" if classification else "regression"
        self.units = int(units)
        names = list(DEFAULT_METRICS[self.task])
        for name in check_metrics(metrics):
            if METRICS[name].task != self.task:
                fits = sorted(n for n, m in METRICS.items() if m.task == self.task)
                raise ValueError(f"Expect metrics of a {self.task} model, {fits}, got {name!r} (a "
                                 f"{METRICS[name].task} metric)")
            if name == "top5_accuracy" and self.units <= 5:
                raise ValueError(f"Expect top5_accuracy for a model of more than 5 classes, got {self.units}")
            if name not in names:
                names.append(name)
        self.metrics = names
        self._keys = list(dict.fromkeys(METRICS[n].evaluation for n in names))

    @property
    def names(self) -> List[str]:
        """The history keys a pass fills: ``val_loss`` and ``val_<metric>`` for each metric."""
        return [VALIDATION_PREFIX + LOSS] + [VALIDATION_PREFIX + n for n in self.metrics]

    def evaluations(self) -> list:
        """Fresh, empty evaluations for one pass: the :class:`Loss` first, then one per evaluation the metrics read."""
        return [Loss()] + [_EVALUATIONS[key](self.units) for key in self._keys]

    def values(self, evaluations: Sequence) -> Dict[str, Optional[float]]:
        """``{val_loss: ..., val_<metric>: ...}`` read from a pass's merged
        :meth:`evaluations`; a metric the data leaves undefined (an AUC with
        one class present) is None, and logged."""
        by_key = dict(zip(self._keys, evaluations[1:]))
        out = {VALIDATION_PREFIX + LOSS: evaluations[0].loss()}
        for name in self.metrics:
            try:
                value = float(METRICS[name].value(by_key[METRICS[name].evaluation]))
            except ValueError as exc:
                logger.warning("validation metric %s is undefined on this data: %s", name, exc)
                value = None
            out[VALIDATION_PREFIX + name] = value
        return out

    @staticmethod
    def describe(entry: dict) -> str:
        """The validation values of a history entry for a log line: ``", val_loss 0.31, val_accuracy 0.91"``."""
        parts = [f"{k} {v:.4g}" for k, v in entry.items() if k.startswith(VALIDATION_PREFIX) and isinstance(v, float)]
        return "".join(", " + p for p in parts)
