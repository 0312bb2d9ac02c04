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
import time
from typing import Callable, Optional

from ..data.validation import DataSpec
from .cancel import watching
from .data import (STORAGE_LEVEL, PreparedData, as_example_rdd, check_rdd, feature_rows, is_dataframe, lost_checkpoint_blocks,
                   placement_for, prepare)
from .deal import EpochPlan
from .errors import executor_errors
from .executor.hooks import TestHooks
from .executor.inference import predict_rows

__all__ = ["ClassicSpark", "seam_for"]

logger = logging.getLogger(__name__)


class ClassicSpark:
    """A classic session: SparkContext, broadcast + treeAggregate, barrier RDDs."""

    kind = "classic"

    def __init__(self, sc):
        self.sc = sc
        self._failed_barrier = None  # (plan, round, job ids) of a barrier round that failed

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

    def begin_fit(self) -> None:
        """Nothing to read: the test hooks are job-local properties, read per job."""

    def test_hooks(self) -> Optional[TestHooks]:
        """Fault-injection hooks the tests set as job-local properties (None in production)."""
        return TestHooks.from_properties(self.sc.getLocalProperty)

    def watch_cancels(self, on_cancel: Callable[[str], None]):
        """A context manager: while it is open, this driver's calls of
        ``sc.cancelAllJobs()``, ``sc.cancelJobGroup`` naming the calling
        thread's job group and ``sc.cancelJobsWithTag`` naming one of its
        job tags call ``on_cancel(reason)`` too (:mod:`.cancel`: a cancel
        between two rounds, when no job runs, is not lost)."""
        group = self.sc.getLocalProperty("spark.jobGroup.id")
        tags = set(self.sc.getJobTags()) if hasattr(self.sc, "getJobTags") else set()
        return watching(self.sc, {
            "cancelAllJobs": lambda *a, **k: "SparkContext.cancelAllJobs()",
            "cancelJobGroup": lambda group_id, *a, **k: (f"SparkContext.cancelJobGroup({group_id!r})"
                                                         if group is not None and group_id == group else None),
            "cancelJobsWithTag": lambda tag, *a, **k: (f"SparkContext.cancelJobsWithTag({tag!r})"
                                                       if tag in tags else None),
        }, on_cancel)

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
        return prepare(rdd, spec, batch_size, location, STORAGE_LEVEL, options.feature_dtype)

    def plan(self, prepared: PreparedData, workers: int, per_round: int, seed: Optional[int],
             local: bool = False, weights=None) -> EpochPlan:
        if getattr(prepared, "streamed", False):  # spark/streaming.py: the source's partitions, dealt
            return prepared.plan(workers, seed)
        return EpochPlan.plan(prepared, workers, per_round, seed, local, weights)

    # --------------------------------------------------------------- rounds
    def aggregate_round(self, plan: EpochPlan, r: int, task: Callable, combine: Callable, depth: int, what: str):
        """Run ``task`` over each worker's shard of round ``r``; combine the results."""
        if getattr(plan, "streamed", False):  # spark/streaming.py: the round's source partitions
            return plan.aggregate(self.sc, r, task, combine, what)
        with executor_errors(what):
            if plan.prepared.in_files:
                shards = plan.shard_paths(r)
                rdd = self.sc.parallelize(shards, len(shards)).mapPartitions(task)
                return rdd.treeAggregate(None, combine, combine, depth=depth)
            parts = self._on_blocks(plan, what, lambda: self.sc.runJob(plan.rdd, task, plan.partitions(r)))
            return functools.reduce(combine, parts, None)

    @staticmethod
    def _on_blocks(plan: EpochPlan, what: str, job: Callable):
        """``job()`` over ``plan.rdd``; when it failed because prepared blocks
        were lost with an executor (their lineage ends at a local checkpoint),
        prepare them again from the source, rebuild the plan's RDD with the
        same deal and run ``job()`` once more (nothing of the failed job
        reached the driver)."""
        try:
            return job()
        except Exception as exc:
            if plan.prepared.in_files or not lost_checkpoint_blocks(exc):
                raise
            logger.warning("%s: prepared minibatch blocks were lost with an executor; preparing them again from "
                           "the source", what)
            plan.prepared.rebuild()
            plan.shuffle()
        return job()

    def barrier_round(self, plan: EpochPlan, r: int, task: Callable, what: str) -> list:
        """Run ``task`` once per worker of round ``r`` in one barrier stage; all results.

        Run again after a failure (the caller's retry), it first gets the
        round's data back (:meth:`_recover_barrier_round`)."""
        failed, self._failed_barrier = self._failed_barrier, None
        if failed is not None and failed[0] is plan and failed[1] == r:
            self._recover_barrier_round(plan, r, failed[2])
        if plan.prepared.in_files:
            shards = plan.shard_paths(r)
            rdd = self.sc.parallelize(shards, len(shards))
        tracker, group = self.sc.statusTracker(), self.sc.getLocalProperty("spark.jobGroup.id")
        before = set(tracker.getJobIdsForGroup(group))
        try:
            with executor_errors(what):
                if plan.prepared.in_files:
                    return rdd.barrier().mapPartitions(task).collect()
                # Blocks lost before the barrier stage started (its shuffle's map stage): nothing ran yet.
                return self._on_blocks(plan, what, lambda: plan.rdd.barrier().mapPartitions(task).collect())
        except BaseException:
            self._failed_barrier = (plan, r, [j for j in tracker.getJobIdsForGroup(group) if j not in before])
            raise

    def barrier_tasks(self) -> dict:
        """``{rank: (host, executor, failed)}`` of the last failed barrier round's
        tasks, from Spark's status store (its listener may lag: a moment's wait
        for the failed one); empty when Spark cannot say."""
        tracker, out = self.sc.statusTracker(), {}
        try:
            stages = [max(tracker.getJobInfo(j).stageIds) for j in (self._failed_barrier or (0, 0, []))[2]]
            for _ in range(20):
                for stage in stages:
                    tasks = self.sc._jsc.sc().statusStore().taskList(
                        stage, tracker.getStageInfo(stage).currentAttemptId, 1 << 16)
                    for t in (tasks.apply(i) for i in range(tasks.size())):
                        out[t.index()] = (t.host(), t.executorId(), t.status() == "FAILED")
                if any(failed for _, _, failed in out.values()):
                    break
                time.sleep(0.1)
        except Exception as exc:  # a job or stage no longer tracked, another Spark: no names, not an error
            logger.debug("no task hosts of the failed barrier round: %s", exc)
        return out

    def barrier_slots(self, hosts) -> Optional[int]:
        """Task slots a barrier stage may take now on executors outside
        ``hosts`` (as Spark counts them for its barrier check); None when
        Spark cannot say."""
        try:
            jsc = self.sc._jsc.sc()
            total = jsc.maxNumConcurrentTasks(jsc.resourceProfileManager().defaultResourceProfile())
            on_hosts = [i.host() for i in jsc.statusTracker().getExecutorInfos() if i.host() in hosts]
            executors = jsc.getExecutorIds().size()  # without the driver: 0 in local mode, where it runs the tasks
        except Exception as exc:  # another Spark: the caller runs the stage again, as it would have
            logger.debug("no barrier slot count: %s", exc)
            return None
        return 0 if hosts and not executors and on_hosts else total - total * len(on_hosts) // max(executors, 1)

    def _recover_barrier_round(self, plan: EpochPlan, r: int, jobs: list, timeout: float = 120.0) -> None:
        """Before a failed barrier round runs again: wait until no task of the
        failed attempt still runs, then compute the round's partitions in a
        plain job.

        On a cluster, a barrier task killed while it waits in ``allGather``
        or ``barrier()`` (its peer died) takes its executor JVM down: PySpark's
        barrier server lets the TaskKilledException escape its thread (exit
        code 50), and the executor's cached minibatches and shuffle outputs
        go with it.  A barrier stage cannot recompute lost shuffle outputs
        ("Could not recover from a failed barrier ResultStage"), a plain job
        can -- once the driver knows the executor is gone, i.e. once the
        failed attempt has no task left running.
        """
        tracker = self.sc.statusTracker()
        stages = [s for j in jobs for s in (getattr(tracker.getJobInfo(j), "stageIds", None) or [])]
        deadline = time.monotonic() + timeout
        while any(getattr(tracker.getStageInfo(s), "numActiveTasks", 0) for s in stages):
            if time.monotonic() > deadline:
                logger.warning("tasks of the failed barrier stage(s) %s still run after %.0f s; retrying anyway",
                               stages, timeout)
                break
            time.sleep(0.1)
        if plan.rdd is not None:
            what = "recomputing the minibatches of a failed barrier round"
            with executor_errors(what):
                self._on_blocks(plan, what, lambda: self.sc.runJob(plan.rdd, lambda rows: [sum(1 for _ in rows)],
                                                                   plan.partitions(r)))

    # ----------------------------------------------------------- inference
    def aggregate_examples(self, data, task: Callable, combine: Callable, features_col: str, label_col: str,
                           what: str):
        """``task(partition, rows)`` over every partition of ``data``; results combined."""
        rdd = as_example_rdd(data, features_col, label_col)
        with executor_errors(what):
            return rdd.mapPartitionsWithIndex(task).treeAggregate(None, combine, combine, depth=2)

    def map_features(self, data, make_predict: Callable, features_col: str, input_shape):
        """An RDD of outputs, lazily: ``make_predict``'s ``predict`` over
        ``data``'s rows gathered into matrices of ``input_shape`` examples,
        checked as training features are (:func:`~.executor.inference.predict_rows`;
        an RDD, or a DataFrame's ``features_col`` read as Arrow batches: no
        Python object per row)."""
        if is_dataframe(data):
            data = feature_rows(data, features_col)
        rows = check_rdd(data, "features or (key, features) rows")
        if not isinstance(features_col, str):  # several named inputs: their shapes and dtypes
            input_shape = features_col
        return rows.mapPartitionsWithIndex(predict_rows(make_predict, input_shape))


def seam_for(spark_or_sc):
    """The seam for a SparkSession or SparkContext, or a Spark Connect session
    (:class:`~sparkavg.spark.connect.ConnectSpark`)."""
    if type(spark_or_sc).__module__.startswith("pyspark.sql.connect"):  # its .sparkContext raises
        from .connect import ConnectSpark

        return ConnectSpark(spark_or_sc)
    sc = getattr(spark_or_sc, "sparkContext", None) if not hasattr(spark_or_sc, "parallelize") else spark_or_sc
    if sc is None or not hasattr(sc, "parallelize"):
        raise TypeError(f"Expect a SparkSession or SparkContext, got {type(spark_or_sc).__name__}")
    return ClassicSpark(sc)
