"""Executor side of :meth:`NetworkModel.transform`: batched Arrow inference.

:func:`~sparkavg.spark.executor.inference.predict_arrow` with the
network's batch inference (:func:`~sparkavg.spark.executor.inference.make_predict_fn`):
each record batch's features become one validated float32 matrix, the
network runs over it in chunks of ``batch_size`` and the batch comes back
with the columns of Spark's own classifiers appended, each built from
numpy arrays in one step: ``prediction`` (double), ``rawPrediction`` and
``probability`` (``pyspark.ml.linalg`` dense Vectors: VectorUDT's struct of
``type``, ``size``, ``indices`` and ``values``).  Nothing is collected to
the driver.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from ..nn.losses import predicted
from ..spark.executor.inference import make_predict_fn, predict_arrow

__all__ = ["make_transformer", "vector_column"]


def vector_column(out: np.ndarray):
    """An ``(n, k)`` matrix as an Arrow column of ``n`` dense ml Vectors
    (``VectorUDT``'s storage: ``type`` 1, ``size`` and ``indices`` null,
    ``values`` the row as float64)."""
    import pyarrow as pa

    n, k = out.shape
    offsets = pa.array(np.arange(0, n * k + 1, k, dtype=np.int32))
    values = pa.ListArray.from_arrays(offsets, pa.array(np.ascontiguousarray(out, np.float64).reshape(-1)))
    return pa.StructArray.from_arrays(
        [pa.array(np.ones(n, np.int8)), pa.nulls(n, pa.int32()), pa.nulls(n, pa.list_(pa.int32())), values],
        names=["type", "size", "indices", "values"])


def make_transformer(config_json: str, shipped, features_col, batch_size: int, target: str,
                     columns: Mapping[str, str], encoding=None, device: str = "auto"):
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
    target : {"classes", "binary", "values"}
        What the model's output is (:data:`sparkavg.nn.model.TARGETS`):
        ``prediction`` is the arg-max class, a binary output's 0/1 at the
        0.5 threshold, or the first output; a one-label binary output's
        vectors are ``[1 - p, p]``, as Spark's binary classifiers write them.
    columns : mapping
        The columns to append, in order: ``{"prediction" | "rawPrediction" |
        "probability": column name}``.
    encoding : dict, optional
        The model's input encoding (``DataOptions(scale=, normalize=)`` of
        its fit), applied to the features before the network.
    device : {"auto", "gpu", "cpu"}, default "auto"
        Where the network runs (the fit's master's ``device``; see
        :func:`~sparkavg.spark.executor.inference.make_predict_fn`).
    """
    columns = dict(columns)

    def appended(out: np.ndarray) -> list:
        import pyarrow as pa

        result, vectors = [], None
        for kind, name in columns.items():
            if kind == "prediction":
                prediction = predicted(target, out)
                result.append((name, pa.array(prediction.astype(np.float64), pa.float64())))
            else:  # rawPrediction and probability: the same outputs (immutable Arrow arrays, built once)
                if vectors is None:
                    vectors = vector_column(np.hstack([1 - out, out]) if target == "binary" and out.shape[1] == 1
                                            else out)
                result.append((name, vectors))
        return result

    return predict_arrow(make_predict_fn(config_json, shipped, batch_size, encoding, device), features_col, appended)
