"""Minibatch once per fit, deal minibatches to rounds × workers per epoch.

``export`` writes every minibatch once as an .npz (the RDD of a round
holds only that round's paths); ``direct`` persists a minibatch RDD and
shuffles it once per epoch into one partition per (round, worker), so a
round's job runs only on its own partitions.  Both masters use this.
"""
from __future__ import annotations

import logging
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from typing import List, Optional

import numpy as np

from ..data.spark_data import DataSpec, as_example_rdd, rebatch_partition, save_minibatch
from .config import DataApproach
from .driver import worker_errors

__all__ = ["PreparedData", "prepare", "deal", "EpochData"]

logger = logging.getLogger(__name__)


@dataclass
class PreparedData:
    """Minibatched training data.

    ``sizes[i]`` is the number of examples in minibatch ``i``; ``paths[i]``
    its file (export) -- or, for ``direct``, ``rdd`` holds ``(i, (x, y))``.
    """

    approach: DataApproach
    sizes: List[int]
    paths: Optional[List[str]] = None
    rdd: object = None
    directory: Optional[str] = None
    owns_directory: bool = False
    _epoch_rdds: list = field(default_factory=list)

    @property
    def examples(self) -> int:
        return int(sum(self.sizes))

    def release(self) -> None:
        """Drop cached RDDs and the export folder we created."""
        for r in self._epoch_rdds:
            r.unpersist()
        self._epoch_rdds.clear()
        if self.rdd is not None:
            self.rdd.unpersist()
        if self.owns_directory and self.directory:
            shutil.rmtree(self.directory, ignore_errors=True)


def _export_partition(spec: DataSpec, batch_size: int, directory: str, run_id: str):
    rebatch = rebatch_partition(spec, batch_size)

    def run(index, rows):
        out = []
        for j, (x, y) in enumerate(rebatch(index, rows)):
            path = os.path.join(directory, f"{run_id}-p{index:05d}-b{j:06d}.npz")
            save_minibatch(path, x, y)
            out.append((path, int(x.shape[0])))
        return out

    return run


def prepare(sc, data, spec: DataSpec, batch_size: int, approach: DataApproach,
            export_dir: Optional[str] = None, storage_level: str = "MEMORY_ONLY",
            features_col: str = "features", label_col: str = "label") -> PreparedData:
    """Validate and minibatch ``data`` once (one Spark job)."""
    rdd = as_example_rdd(data, features_col, label_col)
    if approach is DataApproach.EXPORT:
        owns = export_dir is None
        directory = export_dir or tempfile.mkdtemp(prefix="sparkavg-export-")
        os.makedirs(directory, exist_ok=True)
        run_id = f"rdd{rdd.id()}-{os.getpid()}-{np.random.randint(1 << 30):08x}"
        with worker_errors("exporting minibatches"):
            meta = rdd.mapPartitionsWithIndex(_export_partition(spec, batch_size, directory, run_id)).collect()
        meta.sort()
        return PreparedData(approach, [n for _, n in meta], paths=[p for p, _ in meta], directory=directory,
                            owns_directory=owns)
    from pyspark import StorageLevel

    mb = rdd.mapPartitionsWithIndex(rebatch_partition(spec, batch_size))
    mb = mb.zipWithIndex().map(lambda t: (t[1], t[0])).persist(getattr(StorageLevel, storage_level))
    with worker_errors("minibatching"):
        meta = mb.map(lambda kv: (kv[0], int(kv[1][0].shape[0]))).collect()
    meta.sort()
    return PreparedData(approach, [n for _, n in meta], rdd=mb)


def deal(num_batches: int, workers: int, per_round: int, seed: Optional[int]) -> List[List[List[int]]]:
    """Assign minibatch ids to ``rounds[r][w]``.

    Every id appears exactly once.  Each round holds ``workers * per_round``
    minibatches except the last, whose leftovers are dealt round-robin so
    shards differ by at most one minibatch (nothing is skipped, DL4J's flaw).
    ``seed=None`` keeps the export order.
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
class EpochData:
    """One epoch's plan and, for ``direct``, its shuffled RDD with one
    partition per (round, worker)."""

    rounds: List[List[List[int]]]
    prepared: PreparedData
    rdd: object = None

    @property
    def workers(self) -> int:
        return len(self.rounds[0]) if self.rounds else 0

    def shard_paths(self, r: int) -> List[List[str]]:
        return [[self.prepared.paths[i] for i in shard] for shard in self.rounds[r]]

    def partitions(self, r: int) -> List[int]:
        return [r * self.workers + w for w in range(self.workers)]

    @classmethod
    def plan(cls, prepared: PreparedData, workers: int, per_round: int, seed: Optional[int]) -> "EpochData":
        rounds = deal(len(prepared.sizes), workers, per_round, seed)
        epoch = cls(rounds, prepared)
        if prepared.approach is DataApproach.DIRECT and rounds:
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
