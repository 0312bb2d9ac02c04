"""Executor side of :meth:`NetworkModel.transform`: batched Arrow inference.

Each record batch's features become one float32 matrix (list offsets
reshaped to the network's input shape, validated, partition and row named
on error); the network runs over it in chunks of ``batch_size`` and the
batch comes back with two appended columns, built from numpy arrays in
one step each: ``prediction`` (double) and ``probability``
(``array<float>``).  Nothing is collected to the driver.
"""
from __future__ import annotations

from typing import Iterable, Iterator, Sequence

import numpy as np

__all__ = ["make_transformer"]


def make_transformer(config_json: str, shipped, features_col: str, input_shape: Sequence[int], batch_size: int,
                     classification: bool, prediction_col: str, probability_col: str):
    """The ``mapInArrow`` function of a model's ``transform``.

    Parameters
    ----------
    config_json : str
        The network's JSON configuration.
    shipped
        A handle whose ``value`` is ``(iteration, params, None)``.
    features_col : str
    input_shape : sequence of int
        One example's shape; flat features are reshaped to it.
    batch_size : int
        Examples per forward pass.
    classification : bool
        ``prediction`` is the arg-max class index (else the first output).
    prediction_col, probability_col : str
        Names of the appended columns.
    """
    shape = tuple(int(s) for s in input_shape)
    size = int(np.prod(shape))
    note = f" (input shape {shape})"

    def run(batches: Iterable) -> Iterator:
        import pyarrow as pa

        from ..backend import to_cpu
        from ..data.validation import row_namer
        from ..spark.executor.arrow import batch_column, features_matrix
        from ..spark.executor.context import cached_network, load_state, task_partition

        net = cached_network(config_json)
        load_state(net, shipped.value, with_updater=False)
        partition = task_partition() or 0
        row = 0
        for batch in batches:
            n = batch.num_rows
            x = features_matrix(batch_column(batch, features_col), size, row_namer(partition, row), note=note)
            x = x.reshape((n,) + shape)
            parts = [np.asarray(to_cpu(net.output(x[s:s + batch_size])), np.float32)
                     for s in range(0, n, batch_size)]
            out = np.concatenate(parts) if parts else np.zeros((0, 1), np.float32)
            out = out.reshape(n, -1)
            k = out.shape[1]
            prediction = np.argmax(out, axis=1) if classification else out[:, 0]
            offsets = pa.array(np.arange(0, n * k + 1, k, dtype=np.int32))
            probability = pa.ListArray.from_arrays(offsets, pa.array(out.reshape(-1), pa.float32()))
            yield (batch.append_column(prediction_col, pa.array(prediction.astype(np.float64), pa.float64()))
                   .append_column(probability_col, probability))
            row += n

    return run
