"""Where a fit's minibatches live: one protocol, one class per place.

A fit prepares its data once into a :class:`MinibatchSource`; every epoch
the runner asks it for the epoch's deal (:meth:`MinibatchSource.plan`, an
:class:`EpochDeal`) and runs each round through the deal (``aggregate``,
or ``barrier``: one barrier stage; ``aggregate`` sums in the all-reduce's
order).  Shared files: :class:`SharedFiles`,
``connect.ConnectFiles``; Spark blocks: :class:`SparkBlocks` (a local
checkpoint, prepared again when lost), ``connect.ConnectBlocks``; streamed:
``streaming.StreamedSource`` (nothing kept).  A source runs its jobs
through its seam's public methods; nothing else branches on where
minibatches live.
"""
from __future__ import annotations

import functools
import logging
import re
from dataclasses import dataclass, field
from typing import Callable, ClassVar, List, Optional, Sequence, Tuple

import numpy as np

from ..data.storage import SharedLocation
from ..transport.summation import in_order, level_steps, node_sum
from ..data.deal import MAX_SHARD_LABEL_SKEW, deal_epoch, local_shards, shard_label_skew
from .errors import executor_errors
from .executor.context import task_partition
from .session import size_bytes

__all__ = ["MinibatchSource", "EpochDeal", "SharedFiles", "SparkBlocks", "LINEAGE_REASON", "lost_checkpoint_blocks",
           "read_to_end", "tagged"]

logger = logging.getLogger(__name__)


@dataclass
class EpochDeal:
    """One epoch's deal: ``rounds[r][w]`` the minibatch ids worker ``w``
    fits in round ``r``, every id once.  A deal of kept minibatches also
    has ``barrier(r, task, what)``: the round as one barrier stage.  A deal
    for rounds inside one stage has one round of every worker's whole
    shard and ``counts[r][w]``, the minibatches of each of its rounds."""

    rounds: List[List[List[int]]]
    source: "MinibatchSource"
    counts: Optional[List[List[int]]] = None

    @property
    def workers(self) -> int:
        return len(self.rounds[0]) if self.rounds else 0

    def shards(self, r: int) -> list:
        """What each worker's task of round ``r`` reads, one entry per worker."""
        raise NotImplementedError

    def aggregate(self, r: int, task: Callable, combine: Callable, depth: int, what: str):
        """Run ``task`` over each worker's shard of round ``r``; its results summed in the all-reduce's order."""
        raise NotImplementedError

    def drop(self) -> None:
        """Release what the deal persisted (default: nothing)."""

    def failed_jobs(self) -> list:
        """The Spark jobs of the barrier round that failed last, where the session can see them."""
        return []


@dataclass
class MinibatchSource:
    """A fit's minibatches: ``sizes[i]`` examples in minibatch ``i``; ``layout[i]`` the
    ``(host, partition)`` that made it and ``labels[i]`` its examples per class, where
    known (a local deal's); ``seam`` runs the source's jobs."""

    sizes: List[int]
    seam: object = field(default=None, repr=False)
    layout: Optional[List[tuple]] = None
    labels: Optional[np.ndarray] = None
    _sharded: Optional[tuple] = field(default=None, init=False, repr=False)  # (shard sets, kept): see _by_shards
    #: Where the minibatches live, as the trainer logs it.
    description: ClassVar[str] = ""
    #: The class of its epochs' deals.
    Deal: ClassVar[type] = EpochDeal

    @property
    def examples(self) -> int:
        return int(sum(self.sizes))

    def deal_choice(self, options, workers: int) -> Tuple[bool, str]:
        """``(local, reason)``: whether epochs deal each worker's shard in
        place or reshuffle all minibatches (``DataOptions.repartition``)."""
        repartition = getattr(options.repartition, "value", options.repartition)
        if repartition != "auto":
            return repartition == "local", f"repartition={repartition!r}"
        return self.auto_deal(workers)

    def auto_deal(self, workers: int) -> Tuple[bool, str]:
        return False, f"auto: {self.description}: balanced"

    def plan(self, workers: int, per_round: int, seed: Optional[int], local: bool = False,
             weights: Optional[Sequence[float]] = None, in_stage: bool = False) -> EpochDeal:
        """The epoch's deal (:func:`~.deal.deal_epoch`: ``local`` keeps each
        worker's shard in place, ``weights`` cut shares by speed); ``in_stage``:
        its rounds joined into one, their lengths in ``counts``."""
        rounds = deal_epoch(len(self.sizes), workers, per_round, seed, local, self.layout, weights)
        if not in_stage or not rounds:
            return self.Deal(rounds, self)
        joined = [[i for shards in rounds for i in shards[w]] for w in range(len(rounds[0]))]
        return self.Deal([joined], self, counts=[[len(s) for s in shards] for shards in rounds])

    def _by_shards(self, shards: List[List[int]], make: Callable, drop: Callable = lambda kept: None):
        """``make(shards)``, kept while the shards hold the same minibatches (a local deal's, every epoch);
        the one kept before is ``drop``ped when they change."""
        sets = tuple(frozenset(s) for s in shards)
        if self._sharded is None or self._sharded[0] != sets:
            if self._sharded is not None:
                drop(self._sharded[1])
            self._sharded = (sets, make(shards))
        return self._sharded[1]

    def decisions(self) -> List[tuple]:
        """``(name, value, reason)`` the trainer records once the data is prepared."""
        return []

    def rebuild(self) -> None:
        """Prepare kept minibatches again after Spark lost them with an executor; nothing
        to do where Spark keeps none it could lose (files; a streamed source keeps nothing)."""

    def release(self) -> None:
        """Drop what the source keeps on the cluster (idempotent)."""


def read_to_end(task: Callable) -> Callable:
    """``task`` (a ``mapPartitions`` function), after which the rest of its partition is read.

    Spark returns a task's Python worker to its pool only when the task read its partition to
    the end; the rounds inside one barrier stage read exactly the minibatches of their
    ``counts``, which left each worker to exit after every such epoch, and the next job (the
    validation pass, the next epoch's stage) to fork fresh ones that import torch and build the
    model again.  What is left is normally only the partition's end."""

    def run(items):
        items = iter(items)
        yield from task(items)
        for _ in items:
            pass

    return run


def tagged(task: Callable) -> Callable:
    """``task`` whose results come as ``(partition, result)``, to be summed in the workers' order."""
    return lambda items: ((task_partition(), value) for value in task(items))


class ClassicDeal(EpochDeal):
    """A deal on a classic session, whose barrier rounds recover from a failed attempt."""

    _failed = None  # (round, job ids) of a barrier round that failed

    def barrier(self, r: int, task: Callable, what: str) -> list:
        """``task`` once per worker of round ``r`` in one barrier stage; all results.  Run
        again after a failure, it first waits for the failed attempt's tasks and gets the
        round's data back (:meth:`recover`): a barrier task killed in ``allGather`` takes
        its executor down with its blocks (exit code 50); only a plain job recomputes them."""
        seam = self.source.seam
        failed, self._failed = self._failed, None
        if failed is not None and failed[0] == r:
            seam.wait_for_jobs(failed[1])
            self.recover(r)
        before = seam.job_ids()
        try:
            with executor_errors(what):
                return self._barrier(r, read_to_end(task), what)
        except BaseException:
            self._failed = (r, sorted(seam.job_ids() - before))
            raise

    def recover(self, r: int) -> None:
        """Before a failed barrier round runs again: nothing to get back."""

    def failed_jobs(self) -> list:
        return list(self._failed[1]) if self._failed else []


# ------------------------------------------------------------ shared files
class FilesDeal(ClassicDeal):
    def shards(self, r: int) -> List[List[str]]:
        """The paths of round ``r``, one list per worker."""
        return [[self.source.paths[i] for i in shard] for shard in self.rounds[r]]

    def aggregate(self, r, task, combine, depth, what):
        with executor_errors(what):  # partition w is worker w's; the tree's lower levels summed on the executors
            rdd = self.source.seam.parallelize(self.shards(r)).mapPartitions(tagged(task))
            steps, below = level_steps(self.workers, depth, combine)  # as treeAggregate of depth would
            for child, node, count in steps:
                rdd = rdd.map(child).groupByKey(count, partitionFunc=int).map(node)
            return node_sum(dict(rdd.collect()), self.workers, below, add=combine)

    def _barrier(self, r, task, what):
        return self.source.seam.parallelize(self.shards(r)).barrier().mapPartitions(task).collect()


@dataclass
class SharedFiles(MinibatchSource):
    """Minibatch files (``paths[i]``) at a ``location`` every host reads, released with them."""

    paths: List[str] = field(default_factory=list)
    location: Optional[SharedLocation] = None
    description: ClassVar[str] = "shared files"
    Deal: ClassVar[type] = FilesDeal

    @classmethod
    def write(cls, seam, location: SharedLocation, job: Callable[[str], list]) -> "SharedFiles":
        """The files ``job(folder)`` writes under ``location`` (it returns
        ``(key, examples, path)`` per minibatch), in key order; the location
        is released when it fails."""
        try:
            meta = sorted(job(location.make()))
        except BaseException:
            location.release()
            raise
        return cls([m[1] for m in meta], seam, paths=[m[2] for m in meta], location=location)

    def auto_deal(self, workers: int) -> Tuple[bool, str]:
        return False, "auto: shared files (every host reads them from the shared location): balanced"

    def release(self) -> None:
        location, self.location = self.location, None
        if location is not None:
            location.release()


# ------------------------------------------------------------ Spark blocks
#: Why prepared Spark blocks are local checkpoints (the ``data_lineage`` decision's reason).
LINEAGE_REASON = ("Spark blocks: lineage truncated after preparing (localCheckpoint), so no epoch's task "
                  "carries the source's partitions (a parallelized collection's hold its data: it would cross "
                  "the driver's link in every epoch); blocks lost with an executor are prepared again from the "
                  "source")

_LOST_BLOCK_RE = re.compile(r"CHECKPOINT_RDD_BLOCK_ID_NOT_FOUND|Checkpoint block rdd_\d+_\d+ not found")


def lost_checkpoint_blocks(exc: BaseException) -> bool:
    """Whether a failed job (or an error it caused) says a locally
    checkpointed block is gone -- its executor was lost."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if _LOST_BLOCK_RE.search(str(exc)):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def blocks_deal(source: MinibatchSource, workers: int) -> Tuple[bool, str]:
    """``auto`` for Spark blocks: local -- each worker keeps its host's
    minibatches -- unless the shards' class mixes differ (data partitioned
    by label, say; skew over :data:`~.deal.MAX_SHARD_LABEL_SKEW`), where
    fixed shards would average models fitted to different classes."""
    skew = shard_label_skew(local_shards(len(source.sizes), workers, source.layout), source.labels)
    if skew is not None and skew > MAX_SHARD_LABEL_SKEW:
        return False, (f"auto: the per-host shards' class mixes differ from the data's by {skew:.2f} "
                       f"(total variation, > {MAX_SHARD_LABEL_SKEW}): balanced, the data crosses hosts every "
                       f"epoch; shuffle the input's partitions to keep it on its hosts")
    what = "class mixes not counted" if skew is None else f"class mixes within {skew:.3f} of the data's"
    return True, f"auto: Spark blocks, per-host shards' {what}: local, each worker keeps its host's minibatches"


def _in_deal_order(target: dict, memory: str, task: Callable) -> Callable:
    """``task`` reading its shard's ``(key, block)`` items as blocks in the deal's order (``target``), sorted as
    ``repartitionAndSortWithinPartitions`` sorts: in memory up to ``memory`` (its worker memory), then spilling."""
    from pyspark.shuffle import ExternalSorter

    limit = size_bytes(memory) / 2**20 * 0.9  # MiB, as PySpark's own sort
    return lambda items: task(block for _, block in ExternalSorter(limit).sorted(items, key=lambda kv: target[kv[0]]))


@dataclass
class BlocksDeal(ClassicDeal):
    """The deal and its RDD, shuffled once into one partition per (round, worker)."""

    rdd: object = None

    def __post_init__(self):
        if self.rounds:
            self.shuffle()

    def shards(self, r: int) -> List[int]:
        """The partitions of round ``r``, one per worker."""
        return [r * self.workers + w for w in range(self.workers)]

    def shuffle(self) -> None:
        """(Re)build the deal's RDD from the source's blocks (again after :meth:`SparkBlocks.rebuild`).
        An epoch of one round (rounds inside one stage) reads the blocks partitioned by shard
        (:meth:`SparkBlocks.sharded`: a local deal's shards stay, so later epochs re-read the first
        one's shuffle), each task sorting its shard into the deal's order."""
        source, rounds, workers = self.source, self.rounds, self.workers
        # (partition, position in shard) per minibatch key; sorting keeps each shard's dealt order.
        target = {source.key_of(i): (r * workers + w, pos) for r, shards in enumerate(rounds)
                  for w, shard in enumerate(shards) for pos, i in enumerate(shard)}
        if len(rounds) == 1:
            self.rdd = source.sharded(rounds[0])
            memory = source.seam.conf("spark.python.worker.memory", "512m")
            self._task = functools.partial(_in_deal_order, target, memory)
            return
        # Not persisted: each (round, worker) partition is read once, by its round's job or barrier stage (a retry
        # reads the shuffle again); a kept copy cost a pickle pass and the storage memory of the data again.
        self.rdd = (source.rdd.map(lambda kv: (target[kv[0]], kv[1]))
                    .repartitionAndSortWithinPartitions(len(rounds) * workers, lambda key: key[0]).values())
        self._task = lambda task: task

    def _on_blocks(self, what: str, job: Callable):
        """``job()``, once more after blocks lost with an executor were
        prepared again and the deal's RDD rebuilt (nothing of the failed job
        reached the driver)."""
        try:
            return job()
        except Exception as exc:
            if not lost_checkpoint_blocks(exc):
                raise
            logger.warning("%s: prepared minibatch blocks were lost with an executor; preparing them again from "
                           "the source", what)
            self.source.rebuild()
            self.shuffle()
        return job()

    def aggregate(self, r, task, combine, depth, what):
        with executor_errors(what):
            parts = self._on_blocks(what, lambda: self.source.seam.run_job(self.rdd, tagged(self._task(task)),
                                                                           self.shards(r)))
            return in_order(parts, lambda partition: partition - r * self.workers, self.workers, combine)

    def _barrier(self, r, task, what):
        # Blocks lost before the barrier stage started (its shuffle's map stage): nothing ran yet.
        return self._on_blocks(what, lambda: self.rdd.barrier().mapPartitions(self._task(task)).collect())

    def recover(self, r: int) -> None:
        """Compute the round's partitions in a plain job (it recomputes lost shuffle outputs)."""
        what = "recomputing the minibatches of a failed barrier round"
        with executor_errors(what):
            self._on_blocks(what, lambda: self.source.seam.run_job(self.rdd, lambda rows: [sum(1 for _ in rows)],
                                                                   self.shards(r)))


@dataclass
class SparkBlocks(MinibatchSource):
    """Persisted blocks ``(keys[i], (x, y))`` of ``rdd`` (``keys`` None: ``i``), a local
    checkpoint (:data:`LINEAGE_REASON`): lost blocks are prepared again (:meth:`rebuild`)."""

    rdd: object = None
    keys: Optional[List[int]] = None
    remake: Optional[Callable[[], "SparkBlocks"]] = field(default=None, repr=False)
    description: ClassVar[str] = "Spark blocks"
    Deal: ClassVar[type] = BlocksDeal

    auto_deal = blocks_deal

    def key_of(self, i: int) -> int:
        return i if self.keys is None else self.keys[i]

    def sharded(self, shards: List[List[int]]):
        """The blocks ``(key, block)`` in one partition per shard (``shards[w]``: minibatch ids), the
        shuffle made once per set of shards (:meth:`_by_shards`)."""

        def shuffle(shards):
            owner = {self.key_of(i): w for w, shard in enumerate(shards) for i in shard}
            return self.rdd.map(lambda kv: (owner[kv[0]], kv)).partitionBy(len(shards), lambda w: w).values()

        return self._by_shards(shards, shuffle)

    def decisions(self) -> List[tuple]:
        return [("data_lineage", "local_checkpoint", LINEAGE_REASON)]

    def rebuild(self) -> None:
        """Prepare the blocks again from the source.  The minibatches must
        come out as before (the running epoch's deal refers to their ids and
        sizes); a source that changed raises."""
        fresh = self.remake()
        if fresh.sizes != self.sizes:
            fresh.release()
            raise RuntimeError(
                f"Spark lost prepared minibatch blocks with an executor and preparing the data again gave other "
                f"minibatches (expect {len(self.sizes)} with {self.examples} examples, got {len(fresh.sizes)} with "
                f"{fresh.examples}): the source is not deterministic; persist it reliably or use "
                f"DataOptions(shared_dir=...)")
        old = self.rdd
        self.rdd, self.keys, self.layout, self._sharded = fresh.rdd, fresh.keys, fresh.layout, None
        old.unpersist()

    def release(self) -> None:
        rdd, self.rdd, self._sharded = self.rdd, None, None
        if rdd is not None:  # blocking: the next fit's blocks find the storage memory free, not being freed
            rdd.unpersist(blocking=True)
