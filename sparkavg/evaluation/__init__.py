"""Mergeable evaluation metrics for classification and regression.

Every class keeps only sufficient statistics in plain numpy attributes, so
that partial evaluations computed on Spark executors pickle cheaply and
``merge`` into exactly the evaluation of the concatenated data (the
``treeAggregate`` pattern of DL4J's ``SparkDl4jMultiLayer.evaluate``)::

    ev = rdd.treeAggregate(Evaluation(10), seq_op, lambda a, b: a.merge(b))

:class:`Evaluation` accumulates a confusion matrix; accuracy, precision,
recall and F1 are derived from it. :class:`RegressionEvaluation` accumulates
per-column error sums and label moments; MSE, MAE, RMSE and R² are derived.

Of predicted probabilities: :class:`ROC` (ROC AUC and PR AUC, binary or
one-vs-rest; exact, or in bounded memory with a stated error bound),
:class:`TopKAccuracy`, :class:`LogLoss` and :class:`CalibrationError`
(expected calibration error). :class:`Loss` is the mean of a model's own
loss (its ``score``), which needs the model and not only its outputs:
``eval_model(model, x, y)``; a fit's validation loss. Their ``eval(labels, probabilities,
weights=None)`` takes per-example weights (scikit-learn's
``sample_weight``), and their values equal scikit-learn's on the same
predictions (its conventions are in each class's notes).

Every class is registered under ``"evaluation"``
(:func:`sparkavg.configurable.register`), so task results carry it as its
``to_dict()`` -- plain JSON, never pickle -- and ``from_dict`` rebuilds it,
naming any bad field.

A metric of an evaluation that has seen no examples is undefined and raises
``ValueError`` (as ``Network.score`` does on no data) rather than returning
NaN; ``count`` tells whether there is anything to ask, and ``stats()`` /
``repr()`` print ``n/a``.
"""
from .classification import Evaluation
from .loss import Loss
from .probabilistic import CalibrationError, LogLoss, TopKAccuracy
from .regression import RegressionEvaluation
from .roc import ROC

__all__ = ["Evaluation", "RegressionEvaluation", "ROC", "TopKAccuracy", "LogLoss", "CalibrationError", "Loss"]
