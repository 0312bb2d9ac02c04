"""The one seam between sparkavg and Spark.

Runners and the trainer never call Spark directly: they ask a seam to ship
a value to executors, minibatch a fit's data, run one round of tasks and
combine their results, run one barrier stage, or map a function over data
for evaluation and inference.  :class:`ClassicSpark` does this with a
SparkContext (broadcast, treeAggregate, barrier RDDs); a Spark Connect
session (DataFrames only) plugs in here with the same methods, so the
masters never branch on the flavour.
"""
from __future__ import annotations

import functools
import logging
from typing import Callable, Optional

from ..data.validation import DataSpec
from .data import EpochPlan, PreparedData, as_example_rdd, placement_for, prepare
from .errors import executor_errors
from .executor.hooks import TestHooks

__all__ = ["ClassicSpark", "seam_for"]

logger = logging.getLogger(__name__)


class ClassicSpark:
    """A classic session: SparkContext, broadcast + treeAggregate, barrier RDDs."""

    kind = "classic"

    def __init__(self, sc):
        self.sc = sc

    # ------------------------------------------------------------- cluster
    @property
    def default_parallelism(self) -> int:
        return int(self.sc.defaultParallelism)

    @property
    def local(self) -> bool:
        """Whether every executor runs on the driver's machine (``local[N]``)."""
        return str(self.sc.master).startswith("local")

    def conf(self, key: str, default: Optional[str] = None) -> Optional[str]:
        return self.sc.getConf().get(key, default)

    def test_hooks(self) -> Optional[TestHooks]:
        """Fault-injection hooks the tests set as job-local properties (None in production)."""
        return TestHooks.from_properties(self.sc.getLocalProperty)

    # -------------------------------------------------------------- values
    def ship(self, value):
        """Make ``value`` readable on executors as ``handle.value``; the caller
        calls ``handle.destroy()`` when its jobs are done."""
        return self.sc.broadcast(value)

    # ---------------------------------------------------------------- data
    def prepare(self, data, spec: DataSpec, batch_size: int, options, features_col: str,
                label_col: str) -> PreparedData:
        rdd = as_example_rdd(data, features_col, label_col)
        location = placement_for(options, self.local)
        return prepare(rdd, spec, batch_size, location, options.storage_level)

    def plan(self, prepared: PreparedData, workers: int, per_round: int, seed: Optional[int]) -> EpochPlan:
        return EpochPlan.plan(prepared, workers, per_round, seed)

    # --------------------------------------------------------------- rounds
    def aggregate_round(self, plan: EpochPlan, r: int, task: Callable, combine: Callable, depth: int, what: str):
        """Run ``task`` over each worker's shard of round ``r``; combine the results."""
        with executor_errors(what):
            if plan.prepared.in_files:
                shards = plan.shard_paths(r)
                rdd = self.sc.parallelize(shards, len(shards)).mapPartitions(task)
                return rdd.treeAggregate(None, combine, combine, depth=depth)
            parts = self.sc.runJob(plan.rdd, task, plan.partitions(r))
            return functools.reduce(combine, parts, None)

    def barrier_round(self, plan: EpochPlan, r: int, task: Callable, what: str) -> list:
        """Run ``task`` once per worker of round ``r`` in one barrier stage; all results."""
        if plan.prepared.in_files:
            shards = plan.shard_paths(r)
            rdd = self.sc.parallelize(shards, len(shards))
        else:
            rdd = plan.rdd
        with executor_errors(what):
            return rdd.barrier().mapPartitions(task).collect()

    # ----------------------------------------------------------- inference
    def aggregate_examples(self, data, task: Callable, combine: Callable, features_col: str, label_col: str,
                           what: str):
        """``task(partition, rows)`` over every partition of ``data``; results combined."""
        rdd = as_example_rdd(data, features_col, label_col)
        with executor_errors(what):
            return rdd.mapPartitionsWithIndex(task).treeAggregate(None, combine, combine, depth=2)

    def map_features(self, data, task: Callable, features_col: str):
        """``task(rows)`` lazily over ``data``'s rows (an RDD; a DataFrame's ``features_col``)."""
        if hasattr(data, "columns") and hasattr(data, "select"):
            import numpy as np

            data = data.select(features_col).rdd.map(
                lambda row: np.asarray(row[0].toArray() if hasattr(row[0], "toArray") else row[0], np.float32))
        return data.mapPartitions(task)


def seam_for(spark_or_sc):
    """The seam for a SparkSession or SparkContext."""
    sc = getattr(spark_or_sc, "sparkContext", None) if not hasattr(spark_or_sc, "parallelize") else spark_or_sc
    if sc is None or not hasattr(sc, "parallelize"):
        raise TypeError(f"Expect a SparkSession or SparkContext, got {type(spark_or_sc).__name__}")
    return ClassicSpark(sc)
