"""Executor tasks inside Spark Connect ``mapInArrow`` jobs.

The averaging, sharing and evaluation tasks of :mod:`sparkavg.spark.executor`
take an iterator of minibatch sources or example rows and yield results;
these adapters feed them from Arrow record batches and turn what they
yield into :data:`~.codec.RESULT_SCHEMA` rows, so that the tasks run
unchanged on both Spark flavours.  Prediction reads Arrow batches itself
(:func:`~.inference.predict_arrow`).
"""
from __future__ import annotations

from typing import Callable, Iterable, Iterator, Optional, Sequence

from .arrow import examples_from_batches, from_npy, inputs_from_bytes
from .codec import results_batch
from .context import task_partition

__all__ = ["round_adapter", "examples_adapter"]


def _partition() -> int:
    return task_partition() or 0


def _single_results(task_output: Iterator) -> Iterator:
    """Each result as its own record batch (a round result can be large)."""
    for value in task_output:
        yield results_batch([value])


def round_adapter(task: Callable, shards: Optional[Sequence] = None, per_partition: bool = False):
    """``mapInArrow`` function running a round or sharing task per shard.

    With ``shards`` (shared files), the input is ``spark.range(workers)``
    and row ``w`` runs ``task`` over the paths ``shards[w]``.  Without,
    the input is the epoch's minibatch rows (``w``, ``x``, ``y``, sorted
    by worker and position) and each worker's rows run ``task`` in turn;
    ``per_partition`` (barrier stages: one task is one rank) runs ``task``
    exactly once per partition, over all its rows, even none.
    """

    def run(batches: Iterable) -> Iterator:
        if shards is not None:
            for batch in batches:
                for w in batch.column(0).to_numpy(zero_copy_only=False):
                    yield from _single_results(task(iter(shards[int(w)])))
            return
        rows = _minibatch_rows(batches)
        if per_partition:
            yield from _single_results(task(_one_worker(rows)))
            return
        current = next(rows, None)
        while current is not None:
            group = _Group(rows, current, current[0])
            yield from _single_results(task(group))
            group.drain()
            current = group.next_row

    return run


def _one_worker(rows: Iterator) -> Iterator[tuple]:
    """A barrier partition's minibatches; they must all be one worker's."""
    worker = None
    for w, x, y in rows:
        if worker is not None and w != worker:
            raise RuntimeError(f"Expect one worker's minibatches per barrier partition, got workers {worker} "
                               f"and {w} in partition {_partition()}")
        worker = w
        yield inputs_from_bytes(x), from_npy(y)


def _minibatch_rows(batches: Iterable) -> Iterator[tuple]:
    for batch in batches:
        workers = batch.column(batch.schema.get_field_index("w")).to_numpy(zero_copy_only=False)
        xs, ys = batch.column(batch.schema.get_field_index("x")), batch.column(batch.schema.get_field_index("y"))
        for i in range(batch.num_rows):
            yield int(workers[i]), xs[i], ys[i]


class _Group:
    """The minibatches of one worker from a stream of rows sorted by worker."""

    def __init__(self, rows: Iterator, first: tuple, worker: int):
        self.rows, self.pending, self.worker = rows, first, worker
        self.next_row = None

    def __iter__(self):
        return self

    def __next__(self):
        row = self.pending
        if row is None:
            raise StopIteration
        self.pending = next(self.rows, None)
        if self.pending is not None and self.pending[0] != self.worker:
            self.next_row, self.pending = self.pending, None
        return inputs_from_bytes(row[1]), from_npy(row[2])

    def drain(self) -> None:
        """Skip what the task left unread (it stopped early on an error)."""
        while self.pending is not None:
            self.pending = next(self.rows, None)
            if self.pending is not None and self.pending[0] != self.worker:
                self.next_row, self.pending = self.pending, None


def examples_adapter(task: Callable, features_col, label_col: str):
    """``mapInArrow`` function running an evaluation task ``task(partition, rows)``."""

    def run(batches: Iterable) -> Iterator:
        partition = _partition()
        yield results_batch(task(partition, examples_from_batches(batches, features_col, label_col, partition)))

    return run
