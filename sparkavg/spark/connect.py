"""The seam for a Spark Connect session: DataFrames only.

A Connect session (``SparkSession.builder.remote(...)``) has no
SparkContext, no RDDs, no broadcast and no job-local properties.
:class:`ConnectSpark` gives the runners and the trainer the same methods
as :class:`~sparkavg.spark.seam.ClassicSpark`, with DataFrame operations
only:

- **ship**: the value travels inside the job's closure, encoded as JSON
  and raw array bytes (:class:`ShippedValue`; LeNet's parameters and Adam
  state are 5 MB);
- **prepare**: one ``mapInArrow`` validates and minibatches the
  DataFrame (:func:`~sparkavg.spark.data.minibatch_frame`, shared with
  the classic flavour); the minibatches are ``.minibatch`` files at a shared
  location (:class:`ConnectFiles`), or a persisted DataFrame of ``.npy``
  blobs (:class:`ConnectBlocks`), the Connect variants of :mod:`.sources`;
- **rounds**: one ``mapInArrow`` job per round (:class:`ConnectDeal`;
  gradient sharing's is ``barrier=True``, its tasks meet through
  ``BarrierTaskContext.allGather``), results as Arrow rows
  (:data:`~sparkavg.spark.executor.codec.RESULT_SCHEMA`: JSON and float32
  bytes, never pickle) combined on the driver;
- **evaluate / score / predict**: ``mapInArrow`` over the DataFrame;
  ``predict`` returns a DataFrame (Connect has no RDDs): the input's
  columns plus ``output`` (``array<float>``).

The executor tasks are the classic flavour's own, unchanged; the adapters
in :mod:`sparkavg.spark.executor.adapters` feed them.
"""
from __future__ import annotations

import contextlib
import functools
import ipaddress
import logging
import re
import socket
from dataclasses import dataclass
from typing import Callable, ClassVar, List, Optional

import numpy as np

from ..data.validation import DataSpec
from .data import (STORAGE_LEVEL, check_columns, describe_data, feature_columns, frame_failures, frame_files,
                   is_dataframe, minibatch_frame, placement_for)
from .sources import EpochDeal, FilesDeal, MinibatchSource, SharedFiles, blocks_deal, in_order, read_to_end, tagged
from .cancel import watching
from .errors import executor_errors
from .executor.adapters import examples_adapter, round_adapter
from .executor.codec import RESULT_SCHEMA, decode_value, encode_value, results_from_table
from .executor.hooks import TestHooks
from .executor.inference import list_column, predict_arrow

__all__ = ["ConnectSpark", "ShippedValue", "ConnectFiles", "ConnectBlocks", "OUTPUT_COL"]

logger = logging.getLogger(__name__)

#: The column Connect's ``predict`` appends.
OUTPUT_COL = "output"

_UNREAD = object()


class ShippedValue:
    """A value that travels inside the task closure, as JSON and raw bytes.

    ``handle.value`` decodes it (on the executor; arrays come back
    writable); ``destroy()`` has nothing to release: the job carries it.
    """

    __slots__ = ("_text", "_blobs")

    def __init__(self, value=None, *, _encoded=None):
        self._text, self._blobs = _encoded if _encoded is not None else encode_value(value)

    @property
    def value(self):
        return decode_value(self._text, self._blobs)

    def destroy(self) -> None:
        """Nothing to release (the value lives in the job's closure)."""

    def __reduce__(self):
        return (_shipped, (self._text, self._blobs))


def _shipped(text, blobs) -> ShippedValue:
    return ShippedValue(_encoded=(text, blobs))


def _unpersist(frame, blocking: bool = False) -> None:
    try:
        frame.unpersist(blocking=blocking)
    except Exception:  # a stopped session has dropped it already
        pass


class ConnectDeal(EpochDeal):
    """A deal on a Connect session: a round is one ``mapInArrow`` job
    (``_round_frame``: partition ``w`` is worker ``w``'s), its results Arrow rows combined on the driver."""

    def aggregate(self, r, task, combine, depth, what):
        """``depth`` is the classic treeAggregate's: unused."""
        with executor_errors(what):
            table = self._round_frame(r, tagged(task), barrier=False).toArrow()
        return in_order(results_from_table(table), int, self.workers, combine)

    def barrier(self, r, task, what) -> list:
        """One ``mapInArrow(..., barrier=True)`` stage, a task per worker; all results."""
        with executor_errors(what):  # read to the end, as a classic barrier task: Spark reuses the worker
            table = self._round_frame(r, read_to_end(task), barrier=True).toArrow()
        return results_from_table(table)


class ConnectFilesDeal(ConnectDeal):
    shards = FilesDeal.shards

    def _round_frame(self, r, task, barrier: bool):
        """Row ``w`` of ``spark.range(workers)`` reads worker ``w``'s paths."""
        return self.source.seam.worker_rows(self.workers).mapInArrow(round_adapter(task, self.shards(r)),
                                                                      RESULT_SCHEMA, barrier=barrier)


class ConnectFiles(SharedFiles):
    Deal = ConnectFilesDeal


@dataclass
class ConnectBlocksDeal(ConnectDeal):
    """The deal and the epoch's minibatches, one partition per worker, rows
    ``(r, w, x, y)`` sorted; a round filters its own.  An epoch of one round
    sorts the source's kept partitioning by shard (:meth:`ConnectBlocks.sharded`)
    into its order, as the classic ``BlocksDeal`` does: no row moves."""

    frame: object = None

    def __post_init__(self):
        if self.rounds:
            source, seam = self.source, self.source.seam
            self.frame = (seam.in_deal_order(source.sharded(self.rounds[0]), source.ids, self.rounds[0])
                          if len(self.rounds) == 1 else seam.dealt_frame(source.frame, source.ids, self.rounds,
                                                                          self.workers))

    def shards(self, r: int) -> list:
        """The minibatch ids of round ``r``, one list per worker."""
        return self.rounds[r]

    def _round_frame(self, r, task, barrier: bool):
        source = self.frame.where(self.frame["r"] == r).select("w", "x", "y")
        return source.mapInArrow(round_adapter(task, per_partition=barrier), RESULT_SCHEMA, barrier=barrier)

    def drop(self) -> None:
        if self.frame is not None and len(self.rounds) > 1:  # one round: the source keeps what it sorts
            _unpersist(self.frame)
        self.frame = None


@dataclass
class ConnectBlocks(MinibatchSource):
    """Minibatches in a persisted DataFrame ``frame`` whose row ``ids[i]`` is
    minibatch ``i`` (Connect does not say where a block lives: a local
    deal's shards follow partition order)."""

    frame: object = None
    ids: Optional[np.ndarray] = None
    description: ClassVar[str] = "Spark blocks"
    Deal: ClassVar[type] = ConnectBlocksDeal

    auto_deal = blocks_deal

    def sharded(self, shards: List[List[int]]):
        """The minibatch rows in one partition per shard (``shards[w]``: minibatch ids), persisted once per set
        of shards (:meth:`_by_shards`)."""
        return self._by_shards(shards, lambda s: self.seam.dealt_frame(self.frame, self.ids, [s], len(s)), _unpersist)

    def release(self) -> None:
        kept, self._sharded = self._sharded, None
        if kept is not None:
            _unpersist(kept[1], blocking=True)
        if self.frame is not None:
            _unpersist(self.frame, blocking=True)  # the next fit's blocks find the memory free
            self.frame = None


def _loopback_or_here(host: str) -> bool:
    """Whether ``host`` is this machine (a loopback address or one of its own)."""
    host = host.strip("[]")
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except OSError:
        return False
    own = {"127.0.0.1", "::1"}
    try:
        own.update(socket.gethostbyname_ex(socket.gethostname())[2])
    except OSError:
        pass
    return any(ipaddress.ip_address(a.split("%")[0]).is_loopback or a in own for a in addresses)


class ConnectSpark:
    """A Spark Connect session: DataFrame jobs only (see the module docstring)."""

    #: Streaming (:mod:`.streaming`) and a barrier stage's meeting at the driver run on classic sessions only.
    streams = meets_at_driver = False

    def __init__(self, spark):
        self._spark = spark
        self._parallelism: Optional[int] = None
        self._keys: dict = {}
        self._hooks = _UNREAD

    # ------------------------------------------------------------- cluster
    @property
    def default_parallelism(self) -> int:
        """Spark's default parallelism: ``N`` of ``local[N]``, else the partitions of a ``range``."""
        if self._parallelism is None:
            match = re.fullmatch(r"local\[(\d+)(?:,\s*\d+)?\]", self.conf("spark.master", "") or "")
            if match:
                self._parallelism = int(match.group(1))
            else:
                from pyspark.sql.connect import functions as F

                p = self._spark.range(0, 1 << 20).select(F.spark_partition_id().alias("p")).agg(F.max("p"))
                self._parallelism = int(p.first()[0]) + 1
        return self._parallelism

    @property
    def local(self) -> bool:
        """Whether the executors run on this machine: a ``local`` master reached at a local address."""
        master = self.conf("spark.master", "") or ""
        return master.startswith("local") and _loopback_or_here(str(self._spark.client.host))

    def conf(self, key: str, default: Optional[str] = None) -> Optional[str]:
        return self._spark.conf.get(key, default)

    def begin_fit(self) -> None:
        """Read the tests' fault-injection hooks for this fit: session confs of
        the same names (Connect has no job-local properties), the two keys
        alone, once per fit (a round trip to the server each)."""
        self._hooks = TestHooks.from_properties(lambda key: self._spark.conf.get(key, None))

    def test_hooks(self) -> Optional[TestHooks]:
        """The hooks :meth:`begin_fit` read (None in production)."""
        if self._hooks is _UNREAD:
            self.begin_fit()
        return self._hooks

    def watch_cancels(self, on_cancel: Callable[[str], None]):
        """A context manager: while it is open, this client's
        ``spark.interruptAll()`` and ``spark.interruptTag`` naming one of the
        calling thread's tags call ``on_cancel(reason)`` too (:mod:`.cancel`)."""
        tags = set(self._spark.getTags())
        return watching(self._spark, {
            "interruptAll": lambda *a, **k: "SparkSession.interruptAll()",
            "interruptTag": lambda tag, *a, **k: f"SparkSession.interruptTag({tag!r})" if tag in tags else None,
        }, on_cancel)

    # -------------------------------------------------------------- values
    def ship(self, value) -> ShippedValue:
        """``value`` in the job's closure (no broadcast on Connect)."""
        return ShippedValue(value)

    # ---------------------------------------------------------------- data
    @staticmethod
    def _frame(data):
        if not (is_dataframe(data) and type(data).__module__.startswith("pyspark.sql.connect")):
            raise TypeError(f"Expect a Spark Connect DataFrame (pyspark.sql.connect.dataframe.DataFrame) on a Spark "
                            f"Connect session (Connect has no RDDs), got {describe_data(data)}")
        return data

    def prepare(self, data, spec: DataSpec, batch_size: int, options, features_col: str,
                label_col: str) -> MinibatchSource:
        from pyspark.storagelevel import StorageLevel

        df = self._frame(data)
        location = placement_for(options, self.local)
        if location is not None:
            return frame_files(self, location, df, spec, batch_size, features_col, label_col, options.feature_dtype,
                               ConnectFiles)
        frame = minibatch_frame(df, spec, batch_size, features_col, label_col, feature_dtype=options.feature_dtype)
        frame = frame.persist(getattr(StorageLevel, STORAGE_LEVEL))
        try:
            with executor_errors("minibatching"):
                table = frame.select("id", "n", "error").toArrow()
            frame_failures(table.column("error").to_pylist(), "minibatching")
        except BaseException:
            frame.unpersist()
            raise
        order = np.argsort(table.column("id").to_numpy(), kind="stable")
        return ConnectBlocks(table.column("n").to_numpy()[order].tolist(), self, frame=frame,
                             ids=table.column("id").to_numpy()[order])

    def worker_rows(self, workers: int):
        """``spark.range(workers)``, a row per partition."""
        return self._spark.range(0, workers, 1, workers)

    def _partition_keys(self, workers: int) -> List[int]:
        """A long ``k_w`` per worker that Spark's hash partitioning into
        ``workers`` partitions sends to partition ``w``: ``pmod(hash(k), n)``
        is the partition id expression of ``repartition(n, col)``."""
        if workers not in self._keys:
            from pyspark.sql.connect import functions as F

            table = self._spark.range(0, 64 * workers).select(
                "id", F.pmod(F.hash("id"), F.lit(workers)).alias("p")).toArrow()
            found: dict = {}
            for k, p in zip(table.column("id").to_pylist(), table.column("p").to_pylist()):
                found.setdefault(int(p), int(k))
            if len(found) < workers:
                raise RuntimeError(f"Expect a partition key for each of {workers} workers, found {len(found)}")
            self._keys[workers] = [found[w] for w in range(workers)]
        return self._keys[workers]

    def dealt_frame(self, frame, ids, rounds, workers: int):
        """The epoch's minibatches (``frame``'s rows ``ids[i]``, dealt as
        ``rounds``), one partition per worker, sorted by (round, position)."""
        import pyarrow as pa
        from pyspark.storagelevel import StorageLevel

        keys = self._partition_keys(workers)
        rows = [(int(ids[i]), r, w, pos, keys[w])
                for r, shards in enumerate(rounds) for w, shard in enumerate(shards) for pos, i in enumerate(shard)]
        cols = list(zip(*rows))
        mapping = self._spark.createDataFrame(pa.table({
            "id": pa.array(cols[0], pa.int64()), "r": pa.array(cols[1], pa.int32()),
            "w": pa.array(cols[2], pa.int32()), "pos": pa.array(cols[3], pa.int32()),
            "k": pa.array(cols[4], pa.int64())}))
        dealt = (frame.select("id", "x", "y").join(mapping, "id").repartition(workers, "k")
                 .sortWithinPartitions("r", "w", "pos").select("id", "r", "w", "x", "y"))
        level = frame.storageLevel
        dealt = dealt.persist(level if level is not None else StorageLevel.MEMORY_AND_DISK)
        with executor_errors("dealing the epoch's minibatches"):
            dealt.count()
        return dealt

    def in_deal_order(self, kept, ids, shards):
        """``kept`` (a :meth:`dealt_frame` of one round) with each partition's rows in ``shards``' order: a
        broadcast join of the positions and a sort within partitions -- no row moves between partitions."""
        import pyarrow as pa
        from pyspark.sql.connect import functions as F

        order = [(int(ids[i]), pos) for shard in shards for pos, i in enumerate(shard)]
        positions = self._spark.createDataFrame(pa.table({"id": pa.array([i for i, _ in order], pa.int64()),
                                                          "pos": pa.array([p for _, p in order], pa.int32())}))
        return kept.join(F.broadcast(positions), "id").sortWithinPartitions("pos").select("r", "w", "x", "y")

    def meeting(self, world: int, timeout: float):
        """None: the ranks meet through ``allGather`` (the executors may not reach the client)."""
        return contextlib.nullcontext()

    def barrier_tasks(self, jobs) -> dict:
        """Nothing: a Connect client cannot see Spark's tasks."""
        return {}

    def barrier_slots(self, hosts) -> None:
        """Unknown: a Connect client cannot see Spark's executors (the caller runs the stage again)."""

    # ----------------------------------------------------------- inference
    def aggregate_examples(self, data, task: Callable, combine: Callable, features_col: str, label_col: str,
                           what: str):
        """``task(partition, rows)`` over every partition of ``data``; results combined."""
        df = self._frame(data)
        check_columns(df, features_col, label_col)
        with executor_errors(what):
            table = df.select(*feature_columns(features_col), label_col).mapInArrow(
                examples_adapter(task, features_col, label_col), RESULT_SCHEMA).toArrow()
        return functools.reduce(combine, results_from_table(table), None)

    def map_features(self, data, make_predict: Callable, features_col: tuple):
        """A DataFrame: ``data``'s columns plus :data:`OUTPUT_COL` (``array<float>``),
        ``make_predict``'s ``predict`` run lazily over each Arrow batch of
        ``features_col`` (resolved inputs) at once (:func:`~.executor.inference.predict_arrow`)."""
        from pyspark.sql.types import ArrayType, FloatType, StructField, StructType

        df = self._frame(data)
        check_columns(df, features_col, None)
        if OUTPUT_COL in df.columns:
            raise ValueError(f"Expect no column named {OUTPUT_COL!r} in the data (predict appends it), "
                             f"got columns {df.columns}")
        schema = StructType(list(df.schema.fields) + [StructField(OUTPUT_COL, ArrayType(FloatType()), True)])
        output_col = OUTPUT_COL
        return df.mapInArrow(predict_arrow(make_predict, features_col, lambda out: [(output_col, list_column(out))]),
                             schema)
