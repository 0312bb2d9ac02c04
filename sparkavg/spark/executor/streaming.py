"""Executor side of streamed epochs (:mod:`sparkavg.spark.streaming`).

A streamed round is one ``mapInArrow`` over the source DataFrame's
columns, run on the round's source partitions only: each partition's
Arrow batches are validated and cut into minibatches as preparing would
cut them (:func:`partition_minibatches`, the same ``read_features`` /
``label_array`` / ``cut_minibatches``), fed to the master's round task
unchanged, and its result leaves as a
:data:`~.codec.RESULT_SCHEMA` row.  Nothing of the partition is kept
after the task.  :func:`make_row_counter` is the describing pass: rows
per partition, from the label column alone.
"""
from __future__ import annotations

from typing import Callable, Iterable, Iterator, Mapping

from ...data.validation import DataValidationError, cut_minibatches
from .arrow import _partition, batch_column, label_array, numbered_batches, read_features
from .codec import results_batch

__all__ = ["ROW_COUNT_SCHEMA", "make_row_counter", "partition_minibatches", "make_stream_round"]

#: The describing pass's rows: a partition's index, its rows, the host that read it.
ROW_COUNT_SCHEMA = "partition int, n long, host string"


def make_row_counter():
    """The ``mapInArrow`` function counting a partition's rows (one row out,
    also for an empty partition)."""

    def run(batches: Iterable) -> Iterator:
        import socket

        import pyarrow as pa

        n = sum(b.num_rows for b in batches)
        yield pa.RecordBatch.from_pydict({"partition": pa.array([_partition()], pa.int32()),
                                          "n": pa.array([n], pa.int64()),
                                          "host": pa.array([socket.gethostname()], pa.string())})

    return run


def partition_minibatches(batches: Iterable, spec, batch_size: int, features_col, label_col: str, partition: int,
                          expected_rows: int) -> Iterator[tuple]:
    """A partition's ``(x, y)`` minibatches of ``batch_size`` (the last may
    be smaller), validated and cut as :func:`~.arrow.make_minibatcher` cuts
    them; raises when the partition holds other than ``expected_rows``
    rows (the source changed since the describing pass: the epoch's deal
    would no longer train every example once)."""
    seen = 0

    def chunks():
        nonlocal seen
        for batch, where in numbered_batches(batches, partition):
            seen += batch.num_rows
            x = read_features(batch, features_col, where)
            yield x, label_array(batch_column(batch, label_col), spec, where)

    yield from cut_minibatches(chunks(), batch_size, spec)
    if seen != expected_rows:
        raise DataValidationError(
            f"Expect {expected_rows} rows in partition {partition} of the streamed source (counted before the "
            f"fit), got {seen}: the source DataFrame changed between epochs; a streamed fit needs a "
            f"deterministic source (files that stay as they are), or use DataOptions(storage='memory')")


def make_stream_round(task: Callable, spec, batch_size: int, features_col, label_col: str,
                      rows: Mapping[int, int]):
    """The ``mapInArrow`` function of a streamed round: ``task`` (the
    master's round task, ``task(minibatches) -> results``) over the
    partition's minibatches; ``rows``: the rows each partition of the round
    holds.  A partition not in ``rows`` yields nothing (the round's job
    runs only its own; this is a guard)."""

    def run(batches: Iterable) -> Iterator:
        partition = _partition()
        if partition not in rows:
            return
        items = partition_minibatches(batches, spec, batch_size, features_col, label_col, partition,
                                      rows[partition])
        for value in task(items):
            yield results_batch([value])

    return run
