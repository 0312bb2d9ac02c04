"""Executor side of :meth:`NetworkModel.transform`: batched Arrow inference.

:func:`~sparkavg.spark.executor.inference.predict_arrow` with the
network's batch inference (:func:`~sparkavg.spark.executor.inference.make_predict_fn`):
each record batch's features become one validated float32 matrix, the
network runs over it in chunks of ``batch_size`` and the batch comes back
with two appended columns, built from numpy arrays in one step each:
``prediction`` (double) and ``probability`` (``array<float>``).  Nothing is
collected to the driver.
"""
from __future__ import annotations

import numpy as np

from ..spark.executor.inference import list_column, make_predict_fn, predict_arrow

__all__ = ["make_transformer"]


def make_transformer(config_json: str, shipped, features_col, batch_size: int, classification: bool,
                     prediction_col: str, probability_col: str, encoding=None):
    """The ``mapInArrow`` function of a model's ``transform``.

    Parameters
    ----------
    config_json : str
        The network's JSON configuration.
    shipped
        A handle whose ``value`` is ``(iteration, params, None)``.
    features_col : tuple of NamedInput
        The model's inputs with their columns (:func:`~sparkavg.spark.data.resolve_features`);
        flat features are reshaped to each input's shape.
    batch_size : int
        Examples per forward pass.
    classification : bool
        ``prediction`` is the arg-max class index (else the first output).
    prediction_col, probability_col : str
        Names of the appended columns.
    encoding : dict, optional
        The model's input encoding (``DataOptions(scale=, normalize=)`` of
        its fit), applied to the features before the network.
    """
    def columns(out: np.ndarray) -> list:
        import pyarrow as pa

        prediction = np.argmax(out, axis=1) if classification else out[:, 0]
        return [(prediction_col, pa.array(prediction.astype(np.float64), pa.float64())),
                (probability_col, list_column(out))]

    return predict_arrow(make_predict_fn(config_json, shipped, batch_size, encoding), features_col, columns)
