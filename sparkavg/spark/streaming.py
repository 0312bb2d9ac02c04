"""Data larger than memory: keep the prepared minibatches, or stream every epoch.

A fit normally prepares its minibatches once and keeps them for every
epoch (:mod:`sparkavg.spark.data`): as Spark blocks in the executors'
storage memory (spilling to disk when short), or as shared files.  When
they would not fit, keeping them means thrashing (blocks evicted to disk
and read back every epoch, executors short of memory) or failing.
:func:`storage_choice` decides -- decision ``data_storage``, logged and in
the fit's statistics -- between

* ``memory``: prepare once and keep (as always), and
* ``stream``: nothing of the whole set is kept.  A describing pass counts
  the source DataFrame's rows per partition (its label column only); every
  epoch then deals the source's partitions to rounds x workers
  (:func:`~sparkavg.data.deal.deal` over partitions: a seeded shuffle per
  epoch, so a resumed run deals the same), and each averaging round is one
  ``mapInArrow`` job over the round's partitions only, whose tasks read
  the partition's Arrow batches, cut them into minibatches as preparing
  would and fit them (:mod:`sparkavg.spark.executor.streaming`).  Every
  example trains exactly once per epoch; an executor lost mid-round costs
  its task, which Spark runs again from the source.

``DataOptions(storage="auto" | "memory" | "stream")`` forces either.

What streaming changes, and where it falls back to ``memory`` (the reason
says so):

* a round fits one source partition per worker: the round's size is the
  source's partition size (``spark.sql.files.maxPartitionBytes`` for
  files, or ``repartition`` the source), not ``averaging_frequency``; an
  ``auto`` frequency's probe rounds still run (two rounds of whole
  partitions, thrown away);
* only a DataFrame source on a classic session streams: an RDD of rows,
  and a Spark Connect session, keep their minibatches;
* gradient sharing keeps its minibatches (its epoch is one barrier stage of
  one task per worker, which cannot read an arbitrary set of the source's
  partitions).
"""
from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass, field, replace
from typing import ClassVar, Dict, List, Optional, Tuple

import numpy as np

from ..data.validation import DataSpec
from .data import check_columns, feature_columns, files_root, is_dataframe, require_arrow
from ..data.deal import deal
from .errors import executor_errors, raise_failures
from .sources import EpochDeal, MinibatchSource, in_order, tagged

__all__ = ["STORAGE_DECISION", "MEMORY_SHARE", "StorageChoice", "storage_choice", "prepared_bytes_per_example",
           "feature_value_bytes", "StreamedSource", "StreamDeal", "prepare_stream", "prepare_source"]

logger = logging.getLogger(__name__)

#: The decision's name in ``trainer.stats.decisions``.
STORAGE_DECISION = "data_storage"
#: ``auto`` keeps minibatches in Spark blocks only while their size is at
#: most this share of the executors' storage memory (files: of the shared
#: location's free disk).
MEMORY_SHARE = 0.8
#: Bytes of a label in a prepared minibatch (an int64 class index; one-hot
#: and regression rows count ``4 * num_outputs``).
_INDEX_LABEL_BYTES = 8


@dataclass(frozen=True)
class StorageChoice:
    """``stream`` or not, and why (the ``data_storage`` decision)."""

    stream: bool
    reason: str

    @property
    def value(self) -> str:
        return "stream" if self.stream else "memory"


def prepared_bytes_per_example(spec: DataSpec, value_bytes: int = 4) -> int:
    """Bytes one example takes in prepared minibatches: features of
    ``value_bytes`` a value (:func:`feature_value_bytes`; int64 ids: 8
    bytes) and its label."""
    feature = sum(i.size * (8 if i.ids else value_bytes) for i in spec.inputs)
    label = _INDEX_LABEL_BYTES if spec.classification else 4 * spec.num_outputs
    return feature + label


def feature_value_bytes(data, column: Optional[str], feature_dtype) -> int:
    """Bytes a prepared minibatch keeps per feature value of a DataFrame's
    ``column`` (``DataOptions.feature_dtype``): ``"auto"`` keeps a byte
    column, a binary column of encoded images, and at most 2 bytes of a
    short column (narrowed to uint8 when its values fit: Parquet's UINT_8);
    other columns are counted at float32's 4."""
    if feature_dtype is None or feature_dtype == "float32":
        return 4
    if feature_dtype != "auto":
        return int(np.dtype(feature_dtype).itemsize)
    try:
        from pyspark.sql.types import ArrayType, BinaryType, ByteType, ShortType

        t = data.schema[column].dataType
    except Exception:  # noqa: BLE001 -- an estimate: the column's own errors come when it is read
        return 4
    if isinstance(t, ArrayType):
        t = t.elementType
    if isinstance(t, (BinaryType, ByteType)):
        return 1
    return 2 if isinstance(t, ShortType) else 4


def _mb(n: float) -> str:
    return f"{n / 2 ** 20:,.0f} MiB"


def storage_choice(seam, data, options, spec: DataSpec, streams_master: bool,
                   features_col=None) -> StorageChoice:
    """Whether this fit streams its data (see the module docstring).

    Parameters
    ----------
    seam : the trainer's seam (its ``streams``: whether its flavour streams)
    data : the fit's data
    options : DataOptions
    spec : DataSpec
    streams_master : bool
        Whether the master's runner can train on streamed rounds (its ``streams``).
    features_col : tuple of NamedInput, optional
        The model's inputs with their DataFrame columns (default: ``spec``'s):
        the prepared bytes follow their types (:func:`feature_value_bytes`, the widest).
    """
    mode = options.storage
    if mode == "memory":
        return StorageChoice(False, "storage='memory': minibatches prepared once and kept for every epoch")
    why_not = None
    if not is_dataframe(data):
        why_not = "the data is an RDD, not a DataFrame: only a DataFrame's partitions are streamed"
    elif not seam.streams:
        why_not = "a Spark Connect session: streaming runs on classic sessions only"
    elif not streams_master:
        why_not = ("gradient sharing: its epoch is one barrier stage of one task per worker, which cannot read "
                   "the source's partitions round by round")
    if mode == "stream":
        if why_not is not None:
            logger.warning("DataOptions(storage='stream') falls back to memory: %s", why_not)
            return StorageChoice(False, f"storage='stream' falls back to memory: {why_not}")
        return StorageChoice(True, "storage='stream': every epoch reads the source DataFrame's partitions again; "
                                   "nothing of the whole set is kept")
    if why_not is not None:
        return StorageChoice(False, f"auto: {why_not}: minibatches prepared once and kept")
    room = _room(seam, options)
    if isinstance(room, str):
        return StorageChoice(False, f"auto: {room}: minibatches prepared once and kept")
    capacity, kept, where = room
    planned = _plan_bytes(data)
    if planned is not None and planned * _PLAN_SLACK <= MEMORY_SHARE * capacity:
        return StorageChoice(False, f"auto: Spark's plan puts the source at {_mb(planned)}; even {_PLAN_SLACK}x that "
                                    f"as {kept} fits {where}: kept")
    rows = data.count()
    per_example = prepared_bytes_per_example(spec, max(feature_value_bytes(data, i.column, options.feature_dtype)
                                                       for i in features_col or spec.inputs))
    need = rows * per_example
    what = f"{rows:,} examples x {per_example} B = {_mb(need)} as {kept} against {where}"
    if need <= MEMORY_SHARE * capacity:
        return StorageChoice(False, f"auto: {what}: kept")
    return StorageChoice(True, f"auto: {what} (over {MEMORY_SHARE:.0%}): streamed from the source every epoch "
                               f"instead of spilling or failing")


def _room(seam, options):
    """``(bytes, kept as, where)`` for kept minibatches: the shared
    location's free disk for files, else the executors' storage memory for
    Spark blocks (an epoch's deal reads them through a shuffle, not a second
    kept copy); a str saying why it is not known."""
    root = files_root(options, seam.local)
    if root is not None:
        free = _free_disk(root)
        if free is None:
            return "shared files at a location whose free space is not known"
        return free, "minibatch files", f"the shared location's {_mb(free)} free"
    try:
        memory, how = seam.storage_memory()
    except Exception as exc:  # noqa: BLE001 -- Spark's status store is internal API: never fail a fit on it
        logger.warning("could not read the executors' storage memory (%s): keeping the minibatches", exc)
        return f"the executors' storage memory could not be read ({type(exc).__name__})"
    return memory, "Spark blocks", f"{_mb(memory)} of storage memory on {how}"


#: How much larger than Spark's plan statistics prepared minibatches may be
#: (uint8 features become float32: 4x; compressed files: up to ~4x more)
#: for the statistics alone to decide ``memory`` without counting rows.
_PLAN_SLACK = 16


def _plan_bytes(df) -> Optional[int]:
    """Spark's own size estimate of ``df`` (its optimized plan's
    ``sizeInBytes``; no job), or None where it has none (an RDD's frame
    reports ``spark.sql.defaultSizeInBytes``, i.e. unknown)."""
    try:
        size = int(str(df._jdf.queryExecution().optimizedPlan().stats().sizeInBytes().toString()))
        unknown = int(df.sparkSession.conf.get("spark.sql.defaultSizeInBytes", str(2 ** 63 - 1)).rstrip("bB"))
    except Exception:  # noqa: BLE001 -- a statistic only; counting rows decides instead
        return None
    return None if size <= 0 or size >= unknown else size


def _free_disk(root: str) -> Optional[int]:
    if root.startswith("file://"):
        root = root[len("file://"):]
    if "://" in root:
        return None
    try:
        return int(shutil.disk_usage(root).free)
    except OSError:
        return None


@dataclass
class StreamedSource(MinibatchSource):
    """A streamed fit's data: the source's row count per partition and the
    minibatches each will be cut into (``sizes``; ids in partition order,
    ``batches[p]`` partition ``p``'s), nothing kept."""

    frame: object = None
    spec: Optional[DataSpec] = None
    batch_size: int = 0
    features_col: object = None
    label_col: str = "label"
    rows: Dict[int, int] = field(default_factory=dict)
    batches: Dict[int, List[int]] = field(default_factory=dict)
    #: Non-empty partitions, in order.
    parts: List[int] = field(default_factory=list)
    description: ClassVar[str] = "streamed"

    def deal_choice(self, options, workers: int) -> Tuple[bool, str]:
        return False, ("streamed: the source's partitions are dealt to rounds x workers afresh every epoch (a "
                       "seeded shuffle unless repartition='never')")

    def plan(self, workers, per_round, seed, local=False, weights=None, in_stage=False) -> "StreamDeal":
        """The epoch's deal of the source's partitions: one per worker per
        round, shuffled with ``seed`` (None: in order); a round is a whole
        partition, whatever ``per_round`` (nothing is local, no shares; no
        rounds inside one stage: a streamed deal has no ``barrier``)."""
        dealt = deal(len(self.parts), workers, 1, seed)
        parts = [[self.parts[s[0]] if s else None for s in shards] for shards in dealt]
        rounds = [[list(self.batches[p]) if p is not None else [] for p in r] for r in parts]
        return StreamDeal(rounds, self, parts=parts)

    def release(self) -> None:
        self.frame = None


@dataclass
class StreamDeal(EpochDeal):
    """One streamed epoch's deal: ``parts[r][w]`` the source partition
    worker ``w`` fits in round ``r`` (None: none left for it);
    ``rounds[r][w]`` its minibatch ids."""

    parts: List[List[Optional[int]]] = field(default_factory=list)

    def shards(self, r: int) -> List[Optional[int]]:
        return self.parts[r]

    def aggregate(self, r, task, combine, depth, what):
        """Run ``task`` over round ``r``'s partitions of the source (one
        ``mapInArrow`` job over those partitions only); combine the results."""
        from .executor.codec import RESULT_SCHEMA, decode_value
        from .executor.streaming import make_stream_round

        data: StreamedSource = self.source
        rows = {p: data.rows[p] for p in self.parts[r] if p is not None}
        frame = data.frame.mapInArrow(make_stream_round(task, data.spec, data.batch_size, data.features_col,
                                                        data.label_col, rows), RESULT_SCHEMA)
        with executor_errors(what):
            out = data.seam.run_job(frame.rdd, tagged(_result_rows), sorted(rows))
        results = [(p, decode_value(text, blobs)) for p, (text, blobs) in out]
        raise_failures([value for _, value in results], what)
        return in_order(results, self.parts[r].index, self.workers, combine)  # partition p is worker w's: parts[r][w]


def _result_rows(rows):
    return [(row[0], [bytes(b) for b in (row[1] or ())]) for row in rows]


def prepare_stream(seam, df, spec: DataSpec, batch_size: int, features_col, label_col: str) -> StreamedSource:
    """The describing pass of a streamed fit: rows per partition of ``df``
    (one ``mapInArrow`` over its label column), the minibatches each will
    be cut into; nothing is kept."""
    from .executor.streaming import ROW_COUNT_SCHEMA, make_row_counter

    check_columns(df, features_col, label_col)
    require_arrow()
    with executor_errors("counting the streamed source's rows"):
        counted = df.select(label_col).mapInArrow(make_row_counter(), ROW_COUNT_SCHEMA).collect()
    rows = {int(r[0]): int(r[1]) for r in counted}
    sizes, batches, parts = [], {}, []
    for p in sorted(rows):
        n = rows[p]
        if not n:
            continue
        parts.append(p)
        ids = []
        for start in range(0, n, batch_size):
            ids.append(len(sizes))
            sizes.append(min(batch_size, n - start))
        batches[p] = ids
    frame = df.select(*feature_columns(features_col), label_col)
    logger.info("streamed source: %d examples in %d partitions (%d minibatches of up to %d)", sum(rows.values()),
                len(parts), len(sizes), batch_size)
    return StreamedSource(sizes, seam, frame=frame, spec=spec, batch_size=batch_size, features_col=features_col,
                          label_col=label_col, rows=rows, batches=batches, parts=parts)


def prepare_source(seam, data, spec: DataSpec, master, streams: bool, features_col, label_col: str):
    """``(source, choice)``: ``data`` prepared where :func:`storage_choice`
    puts it (``streams``: whether the master's runner can train streamed
    rounds) and the ``data_storage`` choice, its reason completed."""
    choice = storage_choice(seam, data, master.data, spec, streams, features_col)
    if not choice.stream:
        return seam.prepare(data, spec, master.batch_size_per_worker, master.data, features_col, label_col), choice
    source = prepare_stream(seam, data, spec, master.batch_size_per_worker, features_col, label_col)
    per = [len(source.batches[p]) for p in source.parts]
    return source, replace(choice, reason=(
        f"{choice.reason}; {source.examples:,} examples in {len(source.parts)} source partitions of "
        f"{min(per, default=0)}-{max(per, default=0)} minibatches: each averaging round fits one partition per "
        f"worker (averaging_frequency does not apply)"))
