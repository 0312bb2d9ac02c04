"""Training data on Spark: read and validated once, minibatched once per fit.

A fit's data (an RDD of ``(features, label)`` pairs or ``(x, y)``
minibatches, or a DataFrame) is validated and cut into minibatches of
``batch_size_per_worker`` in one Spark job (:func:`prepare`), kept where
:class:`~sparkavg.spark.masters.DataOptions` says (:func:`placement_for`):
``.minibatch`` files under a location every host reaches, or persisted
Spark blocks ``(key, (x, y))`` noting where each block was made and its
labels per class (what a local deal needs), their lineage truncated
(``localCheckpoint``, decision ``data_lineage``) -- the minibatch sources of
:mod:`.sources`, dealt to rounds and workers every epoch (:mod:`.deal`).

A DataFrame travels as Arrow record batches on both Spark flavours
(:func:`minibatch_frame`, :class:`ExampleFrame`; the executor side is
:mod:`sparkavg.spark.executor.arrow`): features and labels are validated
and reshaped per record batch, never row by row through Python objects.
Features travel as a dict of arrays by input name (one input's too),
each in its own dtype (int64 ids stay integer); a model with several
inputs reads one column per input (:func:`resolve_features`:
``features_col`` as ``{input: column}`` or a list in input order).
"""
from __future__ import annotations

import dataclasses
import logging
import tempfile
from typing import List, Mapping, Optional

import numpy as np

from ..data.validation import DataSpec, DataValidationError, count_examples, label_counts, rebatch_partition
from .errors import TaskFailure, executor_errors, guarded_partitions, raise_failures
from ..data.storage import SUFFIX, SharedLocation, load_minibatch, save_minibatch
from .sources import MinibatchSource, SharedFiles, SparkBlocks

__all__ = ["STORAGE_LEVEL", "as_example_rdd", "feature_rows", "ExampleFrame", "minibatch_frame", "check_columns",
           "require_arrow", "resolve_features", "feature_columns", "prepare", "files_root", "placement_for",
           "load_minibatch", "arrow_batch_rdd"]

logger = logging.getLogger(__name__)


def is_dataframe(data) -> bool:
    return hasattr(data, "columns") and hasattr(data, "select")


def describe_data(data) -> str:
    """What ``data`` is, for messages: its module and type (a pandas
    DataFrame and a pyspark one share a class name), and what to do with a
    pandas frame."""
    kind = type(data)
    name = f"{kind.__module__}.{kind.__qualname__}"
    if kind.__module__.split(".")[0] == "pandas":
        return (f"{name}: a pandas DataFrame lives in this process only; make it a Spark DataFrame with "
                "spark.createDataFrame(pdf)")
    return name


def check_rdd(data, what: str):
    """``data`` when it is an RDD, else a TypeError saying what ``what`` may be."""
    if hasattr(data, "mapPartitions"):
        return data
    raise TypeError(f"Expect an RDD of {what}, or a Spark DataFrame, got {describe_data(data)}")


def feature_columns(features_col) -> List[str]:
    """The DataFrame columns of resolved inputs (:func:`resolve_features`)."""
    return [i.column for i in features_col]


def resolve_features(features_col, spec: DataSpec) -> tuple:
    """Which DataFrame columns feed which model inputs.

    Parameters
    ----------
    features_col : str, dict or list of str
        One column (a model with one input: as always); a dict
        ``{input name: column}``; or a list of columns, one per input in the
        order of the model's inputs (``ModelSpec.inputs``).
    spec : DataSpec
        The model's (:meth:`DataSpec.of`).

    Returns
    -------
    tuple of NamedInput
        Each input with its column (features travel as a dict by input name).
    """
    names = [i.name for i in spec.inputs]
    if isinstance(features_col, str):
        if len(names) > 1:
            raise ValueError(f"Expect features_col as a dict {{input: column}} or a list of {len(names)} columns "
                             f"for the model's inputs {names}, got one column {features_col!r}")
        pairs = {names[0]: features_col}
    elif isinstance(features_col, Mapping):
        pairs = dict(features_col)
        if len(names) == 1 and len(pairs) == 1:  # the one input's column, whatever its key says
            pairs = {names[0]: next(iter(pairs.values()))}
    elif isinstance(features_col, (list, tuple)) and all(isinstance(c, str) for c in features_col):
        if len(features_col) != len(names):
            raise ValueError(f"Expect {len(names)} feature columns, one per model input {names} in order, got "
                             f"{len(features_col)}: {list(features_col)}" if len(names) > 1 else
                             f"Expect one feature column for a model with one input, got {list(features_col)}")
        pairs = dict(zip(names, features_col))
    else:
        raise TypeError(f"Expect features_col as a column name, a dict {{input: column}} or a list of columns, "
                        f"got {type(features_col).__name__} {features_col!r:.80}")
    bad = [c for c in pairs.values() if not isinstance(c, str)]
    if bad:
        raise TypeError(f"Expect column names (str) in features_col, got {bad}")
    if sorted(pairs) != sorted(names):
        raise ValueError(f"Expect features_col keyed by the model's inputs {names}, got keys {list(pairs)}")
    return tuple(dataclasses.replace(i, column=pairs[i.name]) for i in spec.inputs)


def check_columns(df, features_col, label_col: Optional[str]) -> None:
    """Raise :class:`DataValidationError` naming the columns ``df`` lacks."""
    wanted = feature_columns(features_col) + ([label_col] if label_col is not None else [])
    missing = [c for c in wanted if c not in df.columns]
    if missing:
        what = ", ".join(f"{i.column!r} ({'features' if i.sole else f'input {i.name!r}'})" for i in features_col)
        what += f" and {label_col!r} (label)" if label_col is not None else ""
        raise DataValidationError(f"Expect DataFrame columns {what}, missing {missing}; columns are {df.columns}")


def require_arrow() -> None:
    """DataFrames reach sparkavg through ``mapInArrow``: pyarrow and pandas (pyspark's needs)."""
    try:
        import pandas  # noqa: F401
        import pyarrow  # noqa: F401
    except ImportError as exc:
        raise ImportError(f"Expect pyarrow and pandas to read DataFrames (they travel as Arrow batches): "
                          f"pip install 'sparkavg[connect]'; got {exc}") from exc


def minibatch_frame(df, spec: DataSpec, batch_size: int, features_col, label_col: str,
                    folder: Optional[str] = None, feature_dtype: Optional[str] = None):
    """``df``'s examples validated and cut into minibatches by one ``mapInArrow``
    (both Spark flavours): rows ``(id, n, x, y, error)``, or with ``folder``
    ``(id, n, path, error)`` after writing each minibatch there.  Partitions
    keep their order; ``id`` is ``partition << 32 | index``; features in
    ``feature_dtype`` (``DataOptions.feature_dtype``; None: float32; ``"auto"``:
    integer and float16 columns stay compact)."""
    from .executor.arrow import MINIBATCH_FILE_SCHEMA, MINIBATCH_SCHEMA, make_minibatcher

    check_columns(df, features_col, label_col)
    require_arrow()
    schema = MINIBATCH_FILE_SCHEMA if folder is not None else MINIBATCH_SCHEMA
    return df.select(*feature_columns(features_col), label_col).mapInArrow(
        make_minibatcher(spec, batch_size, features_col, label_col, folder, feature_dtype), schema)


class ExampleFrame:
    """A DataFrame of examples read through Arrow (both Spark flavours).

    What :func:`as_example_rdd` returns for a DataFrame: :func:`prepare`
    validates and minibatches it in one ``mapInArrow`` job
    (:func:`minibatch_frame`), and the evaluation jobs see an RDD of
    ``(x, y)`` chunks, one per Arrow record batch, through
    :meth:`mapPartitionsWithIndex` -- never a Python object per row.
    """

    def __init__(self, df, features_col, label_col: str):
        check_columns(df, features_col, label_col)
        require_arrow()
        self.df, self.features_col, self.label_col = df, features_col, label_col

    def example_rdd(self):
        """An RDD (classic sessions) of ``(x, y)`` chunks in partition order."""
        from .executor.arrow import EXAMPLE_SCHEMA, from_npy, inputs_from_bytes, make_example_decoder

        frame = self.df.select(*feature_columns(self.features_col), self.label_col).mapInArrow(
            make_example_decoder(self.features_col, self.label_col), EXAMPLE_SCHEMA)

        def decode(rows):
            for row in _decoded(rows):
                yield inputs_from_bytes(row[0]), from_npy(row[1])

        return frame.rdd.mapPartitions(decode, preservesPartitioning=True)

    def mapPartitionsWithIndex(self, f):
        return self.example_rdd().mapPartitionsWithIndex(f)


def _decoded(rows):
    """Rows of an Arrow decoder (:mod:`sparkavg.spark.executor.arrow`), the
    failure its last column may carry raised as its own type."""
    from .executor.arrow import failure_from_row

    for row in rows:
        failure = failure_from_row(row[-1])
        if failure is not None:  # raised inside the task's own guard, as its own type
            raise failure.to_exception("reading the DataFrame")
        yield row


def feature_rows(df, features_col):
    """An RDD (classic sessions) of ``df``'s ``features_col`` rows, each a
    dict of arrays by input name, read as Arrow batches (no Python object
    per row), in partition order."""
    from .executor.arrow import FEATURE_SCHEMA, inputs_from_bytes, make_feature_decoder

    check_columns(df, features_col, None)
    require_arrow()

    def rows(chunks):
        for chunk in _decoded(chunks):
            x = inputs_from_bytes(chunk[0])
            for i in range(count_examples(x)):
                yield {k: v[i] for k, v in x.items()}

    return (df.select(*feature_columns(features_col)).mapInArrow(make_feature_decoder(features_col), FEATURE_SCHEMA)
            .rdd.mapPartitions(rows, preservesPartitioning=True))


def as_example_rdd(data, features_col="features", label_col: str = "label"):
    """Rows of ``(features, label)`` pairs or minibatches.

    A DataFrame becomes an :class:`ExampleFrame` (Arrow batches of its
    ``features_col``: array or ml Vector column, and ``label_col``); an RDD
    is returned as it is.
    """
    if is_dataframe(data):
        return ExampleFrame(data, features_col, label_col)
    return check_rdd(data, "(features, label) pairs or minibatches")


def frame_failures(rows, what: str) -> None:
    """Raise the first failure among collected rows' ``error`` column."""
    from .executor.arrow import failure_from_row

    raise_failures([failure_from_row(e) for e in rows if e], what)


#: Storage level of persisted minibatch blocks: a local checkpoint (their lineage no longer
#: reaches the source), so Spark also keeps them on disk when memory is short.
STORAGE_LEVEL = "MEMORY_AND_DISK"


def frame_files(seam, location: SharedLocation, df, spec: DataSpec, batch_size: int, features_col, label_col: str,
                feature_dtype: Optional[str] = None, kind=SharedFiles) -> SharedFiles:
    """``df``'s minibatches written under ``location`` by one ``mapInArrow``
    (:func:`minibatch_frame`; both Spark flavours): a ``kind`` source."""
    def write(folder):
        with executor_errors("writing minibatches to the shared location"):
            rows = minibatch_frame(df, spec, batch_size, features_col, label_col, folder, feature_dtype).collect()
        frame_failures([r[3] for r in rows], "minibatching")
        return [tuple(r[:3]) for r in rows]

    return kind.write(seam, location, write)


def _write_partition(spec: DataSpec, batch_size: int, folder: str, feature_dtype: Optional[str] = None):
    rebatch = rebatch_partition(spec, batch_size, feature_dtype)

    def run(index, rows):
        for j, (x, y) in enumerate(rebatch(index, rows)):
            path = f"{folder}/p{index:05d}-b{j:06d}{SUFFIX}"
            save_minibatch(path, x, y)
            yield path, count_examples(x)

    return guarded_partitions(run)


def prepare(seam, rdd, spec: DataSpec, batch_size: int, location: Optional[SharedLocation],
            storage_level: str, feature_dtype: Optional[str] = None) -> MinibatchSource:
    """Validate and minibatch ``rdd`` once (one Spark job) on a classic ``seam``:
    :class:`~.sources.SharedFiles` at ``location``, else :class:`~.sources.SparkBlocks`.
    A DataFrame (:class:`ExampleFrame`) is validated and cut through Arrow;
    features are kept in ``feature_dtype`` (``DataOptions.feature_dtype``,
    :func:`~sparkavg.data.validation.kept_features`; None: float32).
    """
    remake = lambda: prepare(seam, rdd, spec, batch_size, None, storage_level, feature_dtype)  # noqa: E731
    classes = spec.num_outputs if spec.classification else None
    if isinstance(rdd, ExampleFrame):
        args = (rdd.df, spec, batch_size, rdd.features_col, rdd.label_col)
        if location is not None:
            return frame_files(seam, location, *args, feature_dtype)
        # The Arrow job runs once, in _persist_frame_blocks' one pass (keys need no counting pass).
        return _persist_frame_blocks(seam, minibatch_frame(*args, feature_dtype=feature_dtype), storage_level,
                                     classes, remake)
    if location is not None:
        def write(folder):
            with executor_errors("writing minibatches to the shared location"):
                meta = rdd.mapPartitionsWithIndex(_write_partition(spec, batch_size, folder, feature_dtype)).collect()
            raise_failures(meta, "minibatching")
            return [(path, n, path) for path, n in meta]

        return SharedFiles.write(seam, location, write)
    rebatch = rebatch_partition(spec, batch_size, feature_dtype)
    return _persist_blocks(seam, rdd.mapPartitionsWithIndex(guarded_partitions(rebatch)), storage_level, classes,
                           remake)


def _keyed(partition: int, items):
    """``(partition << 32 | j, item)``: keys made where the minibatches are
    (no counting pass over the source, as ``zipWithIndex`` would run)."""
    for j, item in enumerate(items):
        yield (partition << 32) | j, item


def _persist_blocks(seam, mb, storage_level: str, classes: Optional[int], remake) -> SparkBlocks:
    """Persist an RDD of ``(x, y)`` minibatches as ``(key, (x, y))`` blocks,
    noting where each was made and its labels per class (for the deal).

    The blocks are a local checkpoint (:data:`~.sources.LINEAGE_REASON`): the
    describing job below is the one pass over the source."""
    from pyspark import StorageLevel

    mb = mb.mapPartitionsWithIndex(_keyed, preservesPartitioning=True).persist(getattr(StorageLevel, storage_level))
    mb.localCheckpoint()  # also keeps blocks on disk when memory is short: they cannot be recomputed

    def describe(partition, rows):
        import socket

        host = socket.gethostname()
        for kv in rows:
            yield kv[1] if isinstance(kv[1], TaskFailure) else (
                kv[0], count_examples(kv[1][0]), host, partition, label_counts(kv[1][1], classes))

    try:
        with executor_errors("minibatching"):
            meta = mb.mapPartitionsWithIndex(describe).collect()
        raise_failures(meta, "minibatching")
    except BaseException:
        mb.unpersist()
        raise
    return _blocks(seam, mb, meta, classes, remake)


class _ListParam:
    """An accumulator (pyspark ``AccumulatorParam``) of lists (what each task tells of the blocks it made)."""

    def zero(self, value):
        return []

    def addInPlace(self, a, b):
        a.extend(b)
        return a


def arrow_batch_rdd(frame):
    """``frame``'s Arrow record batches as an RDD of IPC message bytes
    (classic sessions: ``Dataset.toArrowBatchRdd``), no row crossing into
    Python objects -- what ``frame.rdd`` would pickle row by row."""
    from pyspark.rdd import RDD
    from pyspark.serializers import NoOpSerializer

    return RDD(frame._jdf.toArrowBatchRdd().toJavaRDD(), frame.sparkSession.sparkContext, NoOpSerializer())


def _persist_frame_blocks(seam, frame, storage_level: str, classes: Optional[int], remake) -> SparkBlocks:
    """The minibatch frame's rows as persisted ``(id, (x, y))`` blocks, in one
    pass: its Arrow batches (:func:`arrow_batch_rdd`) decoded by the task
    that keeps them, which tells where each block lives and its labels per
    class through an accumulator; the job itself is a JVM count of the
    persisted partitions, so no second Python pass reads the blocks back.
    A local checkpoint as :func:`_persist_blocks`'."""
    from pyspark import StorageLevel

    from .executor.arrow import frame_blocks

    sc = frame.sparkSession.sparkContext
    notes = sc.accumulator([], _ListParam())  # pyspark's AccumulatorParam: zero and addInPlace
    large = str(frame.sparkSession.conf.get("spark.sql.execution.arrow.useLargeVarTypes", "false")).lower() == "true"
    mb = (arrow_batch_rdd(frame).mapPartitionsWithIndex(frame_blocks(large, classes, notes), preservesPartitioning=True)
          .persist(getattr(StorageLevel, storage_level)))
    mb.localCheckpoint()
    try:
        with executor_errors("minibatching"):
            mb._jrdd.count()  # counts the persisted batches in the JVM: the blocks are not read back
        meta = list(notes.value)
        raise_failures(meta, "minibatching")
    except BaseException:
        mb.unpersist()
        raise
    return _blocks(seam, mb, {m[0]: m for m in meta}.values(), classes, remake)  # a task run twice tells twice


def _blocks(seam, mb, meta, classes: Optional[int], remake) -> SparkBlocks:
    """The blocks of ``mb`` from their ``(key, examples, host, partition, labels per class)``."""
    meta = sorted(meta)
    counts = None if classes is None else np.asarray([m[4] for m in meta], dtype=np.float64)
    return SparkBlocks([m[1] for m in meta], seam, [(m[2], m[3]) for m in meta], counts, rdd=mb,
                       keys=[m[0] for m in meta], remake=remake)


def files_root(options, local_master: bool) -> Optional[str]:
    """Where a fit's minibatch files go (see :class:`~sparkavg.spark.masters.DataOptions`):
    the shared folder, this machine's temp folder (``local[N]``: every executor runs here),
    or None for Spark blocks."""
    if getattr(options.placement, "value", options.placement) == "spark":
        return None
    return options.shared_dir if options.shared_dir is not None else tempfile.gettempdir() if local_master else None


def placement_for(options, local_master: bool) -> Optional[SharedLocation]:
    """The :class:`SharedLocation` of a fit's minibatch files (:func:`files_root`), or None for Spark blocks."""
    if files_root(options, local_master) is None:
        return None
    return SharedLocation(options.shared_dir) if options.shared_dir is not None else SharedLocation.temporary()
