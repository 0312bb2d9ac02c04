"""The one seam between sparkavg and Spark.

Runners and the trainer never call Spark directly: they ask a seam to ship
a value to executors, minibatch a fit's data into a minibatch source
(:mod:`.sources`, whose epoch deals run the rounds through the seam's job
methods), or map a function over data for evaluation and inference.
:class:`ClassicSpark` does this with a SparkContext (broadcast,
treeAggregate, barrier RDDs); a Spark Connect session (DataFrames only)
plugs in here with the same methods, so the masters never branch on the
flavour.
"""
from __future__ import annotations

import contextlib
import logging
import time
from typing import Callable, Optional

from ..data.validation import DataSpec
from .cancel import watching
from .data import STORAGE_LEVEL, as_example_rdd, check_rdd, feature_rows, is_dataframe, placement_for, prepare
from .errors import executor_errors
from ..transport.rendezvous import RendezvousServer
from .executor.hooks import ALL_GATHER, TestHooks
from .executor.inference import predict_rows

__all__ = ["ClassicSpark", "seam_for"]

logger = logging.getLogger(__name__)


class ClassicSpark:
    """A classic session: SparkContext, broadcast + treeAggregate, barrier RDDs."""

    #: Whether a fit's data may be streamed (:mod:`.streaming`) and a barrier stage's ranks meet at the driver.
    streams = meets_at_driver = True

    def __init__(self, sc):
        self._sc = sc

    # ------------------------------------------------------------- cluster
    @property
    def default_parallelism(self) -> int:
        return int(self._sc.defaultParallelism)

    @property
    def local(self) -> bool:
        """Whether every executor runs on the driver's machine (``local[N]``)."""
        return str(self._sc.master).startswith("local")

    def conf(self, key: str, default: Optional[str] = None) -> Optional[str]:
        # One key from the context's own conf: getConf() copies every entry, a Py4J call each.
        return self._sc._conf.get(key, default)

    def begin_fit(self) -> None:
        """Nothing to read: the test hooks are job-local properties, read per job."""

    def test_hooks(self) -> Optional[TestHooks]:
        """Fault-injection hooks the tests set as job-local properties (None in production)."""
        return TestHooks.from_properties(self._sc.getLocalProperty)

    def watch_cancels(self, on_cancel: Callable[[str], None]):
        """A context manager: while it is open, this driver's calls of
        ``sc.cancelAllJobs()``, ``sc.cancelJobGroup`` naming the calling
        thread's job group and ``sc.cancelJobsWithTag`` naming one of its
        job tags call ``on_cancel(reason)`` too (:mod:`.cancel`: a cancel
        between two rounds, when no job runs, is not lost)."""
        group = self._sc.getLocalProperty("spark.jobGroup.id")
        tags = set(self._sc.getJobTags()) if hasattr(self._sc, "getJobTags") else set()
        return watching(self._sc, {
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
        return self._sc.broadcast(value)

    # ---------------------------------------------------------------- data
    def prepare(self, data, spec: DataSpec, batch_size: int, options, features_col: str,
                label_col: str):
        """``data`` validated and minibatched once: a :class:`~.sources.MinibatchSource`."""
        rdd = as_example_rdd(data, features_col, label_col)
        location = placement_for(options, self.local)
        return prepare(self, rdd, spec, batch_size, location, STORAGE_LEVEL, options.feature_dtype)

    def meeting(self, world: int, timeout: float):
        """Where a barrier stage's ``world`` ranks meet: the driver's :class:`~..transport.rendezvous.RendezvousServer`
        at ``spark.driver.host`` (executors reach the driver there), or None (``allGather``) under the tests' hook."""
        if (self.test_hooks() or TestHooks()).meeting == ALL_GATHER:
            return contextlib.nullcontext()
        host = self.conf("spark.driver.host")
        bind = self.conf("spark.driver.bindAddress") or host
        return RendezvousServer(world, host=bind, advertise=host, timeout=timeout)

    # ------------------------------------------------- jobs (for the sources)
    def parallelize(self, items: list):
        """An RDD of ``items``, one per partition."""
        return self._sc.parallelize(items, len(items))

    def run_job(self, rdd, fn: Callable, partitions: list) -> list:
        """``fn`` over the given partitions of ``rdd`` only; its outputs."""
        return self._sc.runJob(rdd, fn, partitions)

    def job_ids(self) -> set:
        """The ids of the jobs of the calling thread's job group so far."""
        return set(self._sc.statusTracker().getJobIdsForGroup(self._sc.getLocalProperty("spark.jobGroup.id")))

    def barrier_tasks(self, jobs) -> dict:
        """``{rank: (host, executor, failed)}`` of the tasks of a failed barrier
        round's ``jobs``, from Spark's status store (its listener may lag: a
        moment's wait for the failed one); empty when Spark cannot say."""
        tracker, out = self._sc.statusTracker(), {}
        try:
            stages = [max(tracker.getJobInfo(j).stageIds) for j in jobs]
            for _ in range(20):
                for stage in stages:
                    tasks = self._sc._jsc.sc().statusStore().taskList(
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
            jsc = self._sc._jsc.sc()
            total = jsc.maxNumConcurrentTasks(jsc.resourceProfileManager().defaultResourceProfile())
            on_hosts = [i.host() for i in jsc.statusTracker().getExecutorInfos() if i.host() in hosts]
            executors = jsc.getExecutorIds().size()  # without the driver: 0 in local mode, where it runs the tasks
        except Exception as exc:  # another Spark: the caller runs the stage again, as it would have
            logger.debug("no barrier slot count: %s", exc)
            return None
        return 0 if hosts and not executors and on_hosts else total - total * len(on_hosts) // max(executors, 1)

    def wait_for_jobs(self, jobs: list, timeout: float = 120.0) -> None:
        """Wait until no task of ``jobs`` still runs (at most ``timeout`` s)."""
        tracker = self._sc.statusTracker()
        stages = [s for j in jobs for s in (getattr(tracker.getJobInfo(j), "stageIds", None) or [])]
        deadline = time.monotonic() + timeout
        while any(getattr(tracker.getStageInfo(s), "numActiveTasks", 0) for s in stages):
            if time.monotonic() > deadline:
                logger.warning("tasks of the failed barrier stage(s) %s still run after %.0f s; retrying anyway",
                               stages, timeout)
                break
            time.sleep(0.1)

    def storage_memory(self) -> tuple:
        """``(bytes, how)``: the executors' block managers' maximum storage memory (Spark's
        status store), the driver's excluded unless it is the only one (``local[N]``)."""
        it = self._sc._jsc.sc().statusStore().executorList(True).iterator()
        entries = []
        while it.hasNext():
            e = it.next()
            entries.append((str(e.id()), int(e.maxMemory())))
        executors = [(k, v) for k, v in entries if k != "driver"]
        if executors:
            return sum(v for _, v in executors), f"{len(executors)} executors' block managers"
        return sum(v for _, v in entries), "the driver's block manager (local mode: it holds the blocks)"

    # ----------------------------------------------------------- inference
    def aggregate_examples(self, data, task: Callable, combine: Callable, features_col: str, label_col: str,
                           what: str):
        """``task(partition, rows)`` over every partition of ``data``; results combined."""
        rdd = as_example_rdd(data, features_col, label_col)
        with executor_errors(what):
            return rdd.mapPartitionsWithIndex(task).treeAggregate(None, combine, combine, depth=2)

    def map_features(self, data, make_predict: Callable, inputs: tuple):
        """An RDD of outputs, lazily: ``make_predict``'s ``predict`` over
        ``data``'s rows gathered into matrices, checked as training features
        are against ``inputs`` (:func:`~.executor.inference.predict_rows`;
        an RDD, or a DataFrame's columns of ``inputs`` read as Arrow batches:
        no Python object per row)."""
        if is_dataframe(data):
            data = feature_rows(data, inputs)
        return check_rdd(data, "features or (key, features) rows").mapPartitionsWithIndex(
            predict_rows(make_predict, inputs))


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
