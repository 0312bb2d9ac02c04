"""Training data on Spark: read once, minibatch once per fit, deal per epoch.

A fit's data (an RDD of ``(features, label)`` pairs or ``(x, y)``
minibatches, or a DataFrame) is validated and cut into minibatches of
``batch_size_per_worker`` in one Spark job (:func:`prepare`).  The
minibatches live where :class:`~sparkavg.spark.masters.DataOptions` says:

* **shared files** -- written once as ``.npz`` under a location every host
  reaches; a round's job ships only its paths;
* **Spark blocks** (the default on clusters) -- a persisted RDD of
  ``(id, (x, y))``; each epoch it is shuffled once into one partition per
  (round, worker) so a round's job runs on its own partitions only.

:func:`deal` assigns minibatch ids to ``rounds[r][w]``; every id appears
exactly once, so every example trains exactly once per epoch (DL4J's
oversized-partition flaw fixed).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import List, Optional

import numpy as np

from ..data.validation import DataSpec, DataValidationError, rebatch_partition
from .errors import TaskFailure, executor_errors, guarded_partitions, raise_failures
from .storage import SharedLocation, load_minibatch, save_minibatch

__all__ = ["as_example_rdd", "PreparedData", "prepare", "deal", "EpochPlan", "placement_for", "load_minibatch"]

logger = logging.getLogger(__name__)


def is_dataframe(data) -> bool:
    return hasattr(data, "columns") and hasattr(data, "select")


def as_example_rdd(data, features_col: str = "features", label_col: str = "label"):
    """An RDD whose rows are ``(features, label)`` pairs or minibatches.

    A DataFrame is read from ``features_col`` (array or ML vector column)
    and ``label_col``; an RDD is returned as it is.
    """
    if is_dataframe(data):
        missing = [c for c in (features_col, label_col) if c not in data.columns]
        if missing:
            raise DataValidationError(
                f"Expect DataFrame columns {features_col!r} (features) and {label_col!r} (label), "
                f"missing {missing}; columns are {data.columns}")
        return data.select(features_col, label_col).rdd.map(_row_to_pair)
    if hasattr(data, "mapPartitions"):
        return data
    raise TypeError(f"Expect an RDD of (features, label) pairs or minibatches, or a DataFrame, "
                    f"got {type(data).__name__}")


def _row_to_pair(row):
    features, label = row[0], row[1]
    if hasattr(features, "toArray"):  # pyspark.ml.linalg.Vector
        features = features.toArray()
    return np.asarray(features, dtype=np.float32), label


@dataclass
class PreparedData:
    """Minibatched training data: ``sizes[i]`` examples in minibatch ``i``,
    held as ``paths[i]`` (shared files) or as ``rdd`` rows ``(i, (x, y))``."""

    sizes: List[int]
    paths: Optional[List[str]] = None
    rdd: object = None
    location: Optional[SharedLocation] = None
    _epoch_rdds: list = field(default_factory=list)

    @property
    def examples(self) -> int:
        return int(sum(self.sizes))

    @property
    def in_files(self) -> bool:
        return self.paths is not None

    def release(self) -> None:
        """Drop persisted blocks and the files this fit wrote (idempotent)."""
        for r in self._epoch_rdds:
            r.unpersist()
        self._epoch_rdds.clear()
        if self.rdd is not None:
            self.rdd.unpersist()
            self.rdd = None
        if self.location is not None:
            self.location.release()
            self.location = None


def _write_partition(spec: DataSpec, batch_size: int, folder: str):
    rebatch = rebatch_partition(spec, batch_size)

    def run(index, rows):
        for j, (x, y) in enumerate(rebatch(index, rows)):
            path = f"{folder}/p{index:05d}-b{j:06d}.npz"
            save_minibatch(path, x, y)
            yield path, int(x.shape[0])

    return guarded_partitions(run)


def prepare(rdd, spec: DataSpec, batch_size: int, location: Optional[SharedLocation],
            storage_level: str) -> PreparedData:
    """Validate and minibatch ``rdd`` once (one Spark job).

    With a ``location`` the minibatches are written there (the location is
    released with the data); else they are persisted as Spark blocks.
    """
    if location is not None:
        try:
            folder = location.make()
            with executor_errors("writing minibatches to the shared location"):
                meta = rdd.mapPartitionsWithIndex(_write_partition(spec, batch_size, folder)).collect()
            raise_failures(meta, "minibatching")
        except BaseException:
            location.release()
            raise
        meta.sort()
        return PreparedData([n for _, n in meta], paths=[p for p, _ in meta], location=location)
    from pyspark import StorageLevel

    mb = rdd.mapPartitionsWithIndex(guarded_partitions(rebatch_partition(spec, batch_size)))
    mb = mb.zipWithIndex().map(lambda t: (t[1], t[0])).persist(getattr(StorageLevel, storage_level))
    try:
        with executor_errors("minibatching"):
            meta = mb.map(lambda kv: kv[1] if isinstance(kv[1], TaskFailure) else (kv[0], int(kv[1][0].shape[0])))
            meta = meta.collect()
        raise_failures(meta, "minibatching")
    except BaseException:
        mb.unpersist()
        raise
    meta.sort()
    return PreparedData([n for _, n in meta], rdd=mb)


def deal(num_batches: int, workers: int, per_round: int, seed: Optional[int]) -> List[List[List[int]]]:
    """Assign minibatch ids to ``rounds[r][w]``.

    Every id appears exactly once.  Each round holds ``workers * per_round``
    minibatches except the last, whose leftovers are dealt round-robin so
    shards differ by at most one minibatch (nothing is skipped, DL4J's flaw).
    ``seed=None`` keeps the data's order.
    """
    order = np.arange(num_batches)
    if seed is not None:
        np.random.default_rng(seed).shuffle(order)
    step = workers * per_round
    rounds = []
    for start in range(0, num_batches, step):
        chunk = order[start:start + step].tolist()
        rounds.append([chunk[w::workers] for w in range(workers)])
    return rounds


@dataclass
class EpochPlan:
    """One epoch's deal and, for Spark blocks, its shuffled RDD with one
    partition per (round, worker)."""

    rounds: List[List[List[int]]]
    prepared: PreparedData
    rdd: object = None

    @property
    def workers(self) -> int:
        return len(self.rounds[0]) if self.rounds else 0

    def shard_paths(self, r: int) -> List[List[str]]:
        """Shared-file plan: the paths of round ``r``, one list per worker."""
        return [[self.prepared.paths[i] for i in shard] for shard in self.rounds[r]]

    def partitions(self, r: int) -> List[int]:
        """Spark-block plan: the partitions of round ``r``, one per worker."""
        return [r * self.workers + w for w in range(self.workers)]

    def shards_for(self, r: int) -> list:
        """What worker ``w`` of round ``r`` reads: its paths, or its block partition number."""
        return self.shard_paths(r) if self.prepared.in_files else self.partitions(r)

    @classmethod
    def plan(cls, prepared: PreparedData, workers: int, per_round: int, seed: Optional[int]) -> "EpochPlan":
        rounds = deal(len(prepared.sizes), workers, per_round, seed)
        epoch = cls(rounds, prepared)
        if not prepared.in_files and rounds:
            # (partition, position in shard) per minibatch id; sorting keeps each shard's dealt order.
            target = {}
            for r, shards in enumerate(rounds):
                for w, shard in enumerate(shards):
                    for pos, i in enumerate(shard):
                        target[i] = (r * workers + w, pos)
            n = len(rounds) * workers
            epoch.rdd = (prepared.rdd.map(lambda kv: (target[kv[0]], kv[1]))
                         .repartitionAndSortWithinPartitions(n, partitionFunc=lambda key: key[0])
                         .values().persist(prepared.rdd.getStorageLevel()))
            prepared._epoch_rdds.append(epoch.rdd)
        return epoch

    def drop(self) -> None:
        if self.rdd is not None:
            self.rdd.unpersist()
            if self.rdd in self.prepared._epoch_rdds:
                self.prepared._epoch_rdds.remove(self.rdd)
            self.rdd = None


def placement_for(options, local_master: bool) -> Optional[SharedLocation]:
    """Where a fit's minibatches go (see :class:`~sparkavg.spark.masters.DataOptions`):
    a shared location, or None for Spark blocks."""
    placement = getattr(options.placement, "value", options.placement)
    if placement == "spark":
        return None
    if options.shared_dir is not None:
        return SharedLocation(options.shared_dir)
    if local_master:  # every executor runs on this machine: its temp folder is shared
        return SharedLocation.temporary()
    return None

