"""The mean loss of a model over a data set, mergeable: a fit's validation loss."""
from __future__ import annotations

import numpy as np

from ..configurable import register
from ._common import _check_fields, _check_positive_int, _fmt, _require_examples

__all__ = ["Loss"]


def _examples(y) -> int:
    """Examples in a batch of labels: an array's rows, or the rows of each
    output's labels (a dict by output name, all of one length)."""
    if isinstance(y, dict):
        y = next(iter(y.values()))
    return int(np.shape(y)[0])


@register("evaluation")  # travels as to_dict() in task results (spark/executor/codec.py)
class Loss:
    """Mergeable mean of a model's loss: over any split of the data into
    batches, the example-weighted mean of ``model.score(x, y)`` -- the
    loss the model trains on, its L2 penalty included, as a fit reports the
    training loss.

    Unlike the metrics of outputs, it needs the model: :meth:`eval_model`
    takes the model and a batch (``SparkTrainer.evaluate`` calls it on the
    executors, next to the other evaluations' ``eval``).  A non-finite
    batch loss (a diverged model) is kept: :meth:`loss` is then NaN or inf,
    which early stopping reads as an invalid score.
    """

    def __init__(self):
        self._count = 0
        self._total = 0.0

    @property
    def count(self) -> int:
        """Number of examples evaluated."""
        return self._count

    def eval_model(self, model, x, y) -> "Loss":
        """Add a batch: ``model.score(x, y)`` weighted by its examples.

        Parameters
        ----------
        model : sparkavg.nn.Model
        x : array or dict of arrays
            Features in the model's input encoding, ``(N, *input_shape)``.
        y : array or dict of arrays
            The batch's labels, N rows.
        """
        n = _examples(y)
        if n:
            self._total += float(model.score(x, y)) * n
            self._count += n
        return self

    def eval(self, y_true, y_pred):
        """Not available: the loss needs the model (:meth:`eval_model`)."""
        raise TypeError("Expect Loss to be given the model: eval_model(model, x, y) (SparkTrainer.evaluate calls "
                        "it), got eval(labels, outputs), which cannot compute the model's loss")

    def loss(self) -> float:
        """The mean loss (``ValueError`` with no examples)."""
        _require_examples("the Loss", self._count, "the loss")
        return self._total / self._count

    def merge(self, other: "Loss") -> "Loss":
        """Add another Loss's examples into this one; returns ``self``."""
        if not isinstance(other, Loss):
            raise TypeError(f"Expect a Loss to merge, got {type(other).__name__}")
        self._count += other._count
        self._total += other._total
        return self

    def to_dict(self) -> dict:
        """Plain-Python form (the total as a float: NaN or inf when a batch's loss was)."""
        return {"type": "Loss", "count": self._count, "total": self._total}

    @classmethod
    def from_dict(cls, d: dict) -> "Loss":
        """Rebuild from :meth:`to_dict` output, naming a bad field."""
        _check_fields(d, "Loss", ["count", "total"])
        ev = cls()
        ev._count = _check_positive_int("Loss field 'count'", d["count"], 0)
        total = d["total"]
        if isinstance(total, bool) or not isinstance(total, (int, float)):
            raise ValueError(f"Expect Loss field 'total' to be a number (NaN or inf for a diverged model), got "
                             f"{type(total).__name__} {total!r:.80}")
        ev._total = float(total)
        return ev

    def __repr__(self) -> str:
        return f"Loss(count={self._count}, loss={_fmt(self.loss, '.6g')})"
