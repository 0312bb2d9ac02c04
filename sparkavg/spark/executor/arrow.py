"""Arrow on the executors: DataFrame columns in, task results out.

Both Spark flavours read a DataFrame's examples the same way: each Arrow
record batch of a ``mapInArrow`` task becomes numpy arrays in a few
vectorised steps -- no Python object per row.

- :func:`features_matrix` turns a features column (``array<float>``,
  ``array<double>``, any numeric array, or an ml ``Vector``: Spark's
  ``struct<type, size, indices, values>``, dense or sparse) into a
  float32 ``(n, width)`` matrix through the list offsets; :func:`label_array`
  reads class indices, one-hot rows or regression targets.  What is
  Arrow's -- nulls, column types, list lengths, sparse vectors -- is
  checked here; the rules on the values (widths, finiteness, labels) are
  :mod:`sparkavg.data.validation`'s, the same calls
  :func:`~sparkavg.data.validation.rebatch_partition` makes, naming the
  partition and row of the first bad value.
- :func:`make_minibatcher` is the ``mapInArrow`` function that validates
  and cuts a partition into minibatches of ``batch_size`` once per fit:
  rows ``(id, n, x, y)`` with ``.npy`` bytes, or ``(id, n, path)`` for
  minibatches written to a shared location.
- :func:`examples_from_batches` gives the evaluation tasks ``(x, y)``
  chunks, one per record batch (their own ``rebatch`` validates them).

Task results travel as :mod:`.codec` values; :mod:`.adapters` runs the
tasks inside Spark Connect jobs.
"""
from __future__ import annotations

import io
import json
from typing import Callable, Iterable, Iterator, Optional

import numpy as np

from ...data.validation import (DataSpec, DataValidationError, NamedInput, check_finite, check_float32_range, check_ids,
                                check_label_values, check_widths, compact_features, count_examples, cut_minibatches,
                                kept_features, label_counts, row_namer, shape_note, WEIGHTS, check_weights)
from ...npzfile import load_npy_bytes
from ..errors import TaskFailure, task_failure_guard
from .context import task_partition

__all__ = [
    "MINIBATCH_SCHEMA",
    "MINIBATCH_FILE_SCHEMA",
    "EXAMPLE_SCHEMA",
    "features_matrix",
    "compact_features",
    "read_features",
    "inputs_bytes",
    "inputs_from_bytes",
    "label_array",
    "batch_column",
    "make_minibatcher",
    "make_example_decoder",
    "examples_from_batches",
    "npy_bytes",
    "from_npy",
    "failure_from_row",
    "ipc_batches",
    "frame_blocks",
]

#: Prepared minibatches kept in Spark: id = partition << 32 | index in the partition;
#: a permanent error ends a partition with one row holding only ``error`` (JSON).
MINIBATCH_SCHEMA = "id long, n int, x binary, y binary, error string"
#: Prepared minibatches written to a shared location.
MINIBATCH_FILE_SCHEMA = "id long, n int, path string, error string"
#: Unvalidated example chunks for evaluation (flat features, raw labels).
EXAMPLE_SCHEMA = "x binary, y binary, error string"
#: Rows of :func:`make_feature_decoder`: a record batch's features (.npy) or a failure.
FEATURE_SCHEMA = "x binary, error string"

#: Minibatches per output record batch (bounds an Arrow binary column's size).
_ROWS_PER_BATCH = 16


def _pa():
    import pyarrow

    return pyarrow


def _partition() -> int:
    return task_partition() or 0


# ---------------------------------------------------------------- columns
def _first(mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask)[0])


def _null_rows(column) -> Optional[np.ndarray]:
    if column.null_count == 0:
        return None
    return ~np.asarray(column.is_valid().to_numpy(zero_copy_only=False), dtype=bool)


def _numeric_values(values, where: Callable[[int], str], what: str, native: bool = False) -> np.ndarray:
    """A flat numeric Arrow array as float32 numpy (nulls named by ``where``;
    ``native``: in its own dtype, for ids)."""
    pa = _pa()
    if not (pa.types.is_floating(values.type) or pa.types.is_integer(values.type)
            or pa.types.is_boolean(values.type)):
        raise DataValidationError(f"Bad {what}: expected numbers, got {values.type} values")
    nulls = _null_rows(values)
    if nulls is not None:
        raise DataValidationError(f"Bad {what} at {where(_first(nulls))}: expected numbers, got a null element")
    out = np.asarray(values.to_numpy(zero_copy_only=False))
    if native:
        return out
    check_float32_range(out, where, what)  # before the cast, which would make such a value inf
    return out.astype(np.float32, copy=False)


def _list_parts(column):
    """``(lengths, flat values, starts)`` of a list-typed Arrow array (slices respected)."""
    pa = _pa()
    if pa.types.is_fixed_size_list(column.type):
        size = column.type.list_size
        lengths = np.full(len(column), size, np.int64)
        return lengths, column.flatten(), np.arange(len(column), dtype=np.int64) * size
    offsets = np.asarray(column.offsets.to_numpy(zero_copy_only=False), dtype=np.int64)
    starts = offsets[:-1] - offsets[0]
    return np.diff(offsets), column.flatten(), starts


def _element_rows(starts: np.ndarray, where: Callable[[int], str]) -> Callable[[int], str]:
    """``where`` for an element index of a list column's flat values."""
    return lambda e: where(int(np.searchsorted(starts, e, side="right") - 1))


def _common_width(sizes: np.ndarray, width: Optional[int], where, what: str, note: str,
                  shown: Callable[[int], str]) -> Optional[int]:
    """The one row width of ``sizes``: ``width`` when given (a row of another
    size is an error naming it: :func:`~sparkavg.data.validation.check_widths`),
    else the first row's, or None when rows differ."""
    if width is None:
        width = int(sizes[0]) if len(sizes) else 0
        if len(sizes) and np.any(sizes != width):
            return None
    check_widths(sizes, width, where, lambda i: shown(int(sizes[i])), what, note)
    return width


def _vector_matrix(column, width: Optional[int], where, what: str, note: str, native: bool = False):
    """Rows of an ml Vector column (struct type/size/indices/values) as float32 (n, width)
    (``native``: float64, for ids)."""
    kind_arr, size_arr, idx_arr, val_arr = column.flatten()
    n = len(column)
    kinds = np.asarray(kind_arr.to_numpy(zero_copy_only=False), dtype=np.int64)
    v_len, v_flat, v_starts = _list_parts(val_arr)
    values = _numeric_values(v_flat, _element_rows(v_starts, where), what, native)
    dense = kinds == 1
    sizes = np.where(dense, v_len, np.asarray(size_arr.fill_null(-1).to_numpy(zero_copy_only=False), np.int64))
    width = _common_width(sizes, width, where, what, note, lambda size: f"a vector of size {size}")
    if width is None:
        return None
    x = np.zeros((n, width), values.dtype if native else np.float32)
    row_of = np.repeat(np.arange(n), v_len)
    element_dense = dense[row_of]
    pos = np.arange(len(values)) - np.repeat(np.cumsum(v_len) - v_len, v_len)
    x[row_of[element_dense], pos[element_dense]] = values[element_dense]
    if not np.all(dense):
        i_len, i_flat, _ = _list_parts(idx_arr)
        indices = np.asarray(i_flat.to_numpy(zero_copy_only=False), np.int64)
        sparse_rows = row_of[~element_dense]
        mismatch = (~dense) & (i_len != v_len)
        if np.any(mismatch) or len(indices) != len(sparse_rows):
            i = _first(mismatch) if np.any(mismatch) else 0
            raise DataValidationError(f"Bad {what} at {where(i)}: expected a sparse vector with as many indices "
                                      f"as values, got {int(i_len[i])} and {int(v_len[i])}")
        out_of_range = (indices < 0) | (indices >= width)
        if np.any(out_of_range):
            i = int(sparse_rows[_first(out_of_range)])
            raise DataValidationError(f"Bad {what} at {where(i)}: expected sparse indices in [0, {width}), "
                                      f"got {int(indices[_first(out_of_range)])}")
        x[sparse_rows, indices] = values[~element_dense]
    return x


def features_matrix(column, width: Optional[int], where: Callable[[int], str], what: str = "features",
                    note: str = "", ids: bool = False, native: bool = False,
                    dtype: Optional[str] = None, kinds: Optional[str] = None) -> Optional[np.ndarray]:
    """An Arrow features column as a float32 ``(n, width)`` matrix (``ids``:
    int64 ids, never rounded through float32: integers, or integer-valued
    floats, none negative -- :func:`~sparkavg.data.validation.check_ids`).

    Parameters
    ----------
    column : pyarrow.Array
        ``list``/``large_list``/``fixed_size_list`` of numbers, an ml
        ``Vector`` struct, or plain numbers (one value per row).
    width : int or None
        Values each row must have; ``None`` takes the first row's and
        returns ``None`` when rows differ (the caller splits them).
    where : callable
        ``where(i)`` names row ``i`` of the batch in messages
        ("partition 3, row 1207").
    what, note : str
        The value's name in messages, and what follows the expected count
        (" (input shape (1, 28, 28))").
    ids : bool
        Integer ids: int64, checked (:func:`~sparkavg.data.validation.check_ids`).
    native : bool
        Keep the values' own dtype (integers stay integer), unchecked
        beyond nulls and finiteness: the task's validation checks them.
    dtype : str, optional
        The dtype to keep the features in (``DataOptions.feature_dtype``:
        :func:`~sparkavg.data.validation.kept_features`; ``"auto"`` keeps
        integer and float16 columns compact); None: float32.
    kinds : str, optional
        What the column may be, in the message for a column of another
        type (default: the column types features may have).

    Raises
    ------
    DataValidationError
        A null row or element, a row with the wrong number of values, or a
        NaN/inf value (with the row).
    """
    pa = _pa()
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    n = len(column)
    nulls = _null_rows(column)
    if nulls is not None:
        raise DataValidationError(f"Bad {what} at {where(_first(nulls))}: expected numbers, got null")
    t = column.type
    if pa.types.is_struct(t) and [f.name for f in t] == ["type", "size", "indices", "values"]:
        x = _vector_matrix(column, width, where, what, note, ids or native)
        if x is None:
            return None
    elif pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        lengths, flat, starts = _list_parts(column)
        width = _common_width(lengths, width, where, what, note, lambda size: f"shape ({size},)")
        if width is None:
            return None
        x = _numeric_values(flat, _element_rows(starts, where), what, ids or native).reshape(n, width)
    elif pa.types.is_floating(t) or pa.types.is_integer(t) or pa.types.is_boolean(t):
        if width not in (None, 1):
            raise DataValidationError(f"Bad {what} at {where(0)}: expected {width} values{note}, got one number "
                                      f"(column type {t})")
        x = _numeric_values(column, where, what, ids or native).reshape(n, 1)
    else:
        if kinds is None:
            kinds = "array<int>, array<long> or a long" if ids else "array<float>, array<double> or an ml Vector"
        raise DataValidationError(f"Bad {what} column: expected {kinds}, got {t}")
    if ids:
        return check_ids(x, where, what)
    if x.dtype.kind == "f":
        check_finite(x, where, what)
    if dtype is not None:
        return kept_features(x, dtype, where, what)
    return x.astype(np.int64, copy=False) if x.dtype.kind in "iu" else x


def _auto_keeps(t) -> bool:
    """Whether ``feature_dtype="auto"`` reads a features column of Arrow type
    ``t`` in its own dtype (integers or float16, plain or in lists), to keep
    it compact; other columns (float32/float64, ml Vectors) become float32
    as they are read."""
    pa = _pa()
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        t = t.value_type
    return pa.types.is_integer(t) or pa.types.is_float16(t)


def _native_for(column, dtype: Optional[str]) -> bool:
    """Whether features of ``dtype`` (``DataOptions.feature_dtype``) are read
    in the column's own dtype (then checked and kept by
    :func:`~sparkavg.data.validation.kept_features`)."""
    if dtype is None:
        return False
    return dtype != "auto" or _auto_keeps(column.type)


def _binary(t) -> bool:
    pa = _pa()
    return pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t)


def _images(column, i: NamedInput, where: Callable[[int], str], dtype: Optional[str]) -> np.ndarray:
    """A binary features column's encoded images as ``(n, *shape)`` uint8 of
    input ``i``, kept as ``dtype`` says (``kept_features``: ``"auto"`` keeps uint8)."""
    from ...data.images import decode_images

    pa = _pa()
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    nulls = _null_rows(column)
    if nulls is not None:
        raise DataValidationError(f"Bad {i.what} at {where(_first(nulls))}: expected an encoded image, got null")
    if i.ids:
        raise DataValidationError(f"Bad {i.what} column: expected integer ids (array<int>, array<long>) for this "
                                  f"model's embedding input, got {column.type} (encoded images)")
    return kept_features(decode_images(column.to_pylist(), i.shape, where, i.what), dtype, where, i.what)


def read_features(batch, inputs, where: Callable[[int], str], dtype: Optional[str] = None) -> dict:
    """A record batch's features, a dict by input name: each input
    (``inputs``, :class:`~sparkavg.data.validation.NamedInput` with its
    column) read from its column as ``(n, *shape)`` -- float32, int64 for
    an id input, encoded images decoded --, checked against its shape and
    dtype, errors naming it.  ``dtype``: float features kept in that
    compact dtype (:func:`compact_features`)."""
    n = batch.num_rows
    out = {}
    for i in inputs:
        column = batch_column(batch, i.column)
        if _binary(column.type):  # encoded images: decoded here, on the executor (sparkavg.data.images)
            out[i.name] = _images(column, i, where, dtype)
            continue
        if i.name == WEIGHTS:  # per-row weights: float32, never kept compact
            out[i.name] = features_matrix(column, 1, where, f"weight column {i.column!r}", "", False)
            check_weights(out[i.name], where)
            continue
        out[i.name] = features_matrix(column, i.size, where, i.what, shape_note(i.shape), i.ids,
                                      native=_native_for(column, dtype),
                                      dtype=None if i.ids else dtype).reshape((n,) + tuple(i.shape))
    return out


def inputs_bytes(x) -> bytes:
    """Features (a dict of arrays by input name) as bytes in a binary
    column: a ``.minibatch`` blob without labels -- each keeps its dtype;
    never pickle."""
    from ...data.storage import encode_minibatch

    return encode_minibatch(x, np.zeros(0, np.int8))


def inputs_from_bytes(data) -> dict:
    """The features of :func:`inputs_bytes` output (bytes, a buffer, an Arrow scalar)."""
    from ...data.storage import decode_minibatch

    if hasattr(data, "as_buffer"):
        data = data.as_buffer()
    return decode_minibatch(bytearray(data), "a minibatch blob of features")[0]


def label_array(column, spec: Optional[DataSpec], where: Callable[[int], str]) -> Optional[np.ndarray]:
    """An Arrow label column as numpy, checked against ``spec``.

    Class indices become int64 ``(n,)`` (integer-valued floats accepted);
    one-hot rows and regression targets float32 ``(n, k)``
    (:func:`~sparkavg.data.validation.check_label_values`, or
    :func:`features_matrix` at ``spec.num_outputs`` values).  Without a
    spec, numbers come back as they are and rows of numbers as a float32
    matrix (``None`` when their lengths differ).
    """
    pa = _pa()
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    nulls = _null_rows(column)
    if nulls is not None:
        want = spec.label_want if spec is not None else "a label"
        raise DataValidationError(f"Bad label at {where(_first(nulls))}: expected {want}, got null")
    t = column.type
    if pa.types.is_floating(t) or pa.types.is_integer(t) or pa.types.is_boolean(t):
        values = np.asarray(column.to_numpy(zero_copy_only=False))
        return values if spec is None else check_label_values(values, spec, where)
    if spec is None:
        return features_matrix(column, None, where, what="label", kinds=_LABEL_KINDS)
    kinds = f"{_LABEL_KINDS} ({spec.label_want})"
    return features_matrix(column, spec.num_outputs, where, what="label", note=spec.label_note, kinds=kinds)


#: What a label column may be, in messages.
_LABEL_KINDS = ("a numeric column (int, long, double: one class index or target per row), or array<float>, "
                "array<double> or an ml Vector (one-hot rows, or several targets)")


# ------------------------------------------------------------ minibatches
def npy_bytes(a: np.ndarray) -> bytes:
    """``a`` as ``.npy`` bytes (no pickle)."""
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(a), allow_pickle=False)
    return buf.getvalue()


def from_npy(data) -> np.ndarray:
    """The array of :func:`npy_bytes` output (bytes, a buffer, an Arrow scalar)."""
    if hasattr(data, "as_buffer"):
        data = data.as_buffer()
    return load_npy_bytes(data, what="a minibatch blob")


def batch_column(batch, name: str):
    """Column ``name`` of an Arrow record batch (DataValidationError naming the columns if absent)."""
    index = batch.schema.get_field_index(name)
    if index < 0:
        raise DataValidationError(f"Expect a column {name!r}, got columns {batch.schema.names}")
    return batch.column(index)


def make_minibatcher(spec: DataSpec, batch_size: int, features_col, label_col: str,
                     folder: Optional[str] = None, feature_dtype: Optional[str] = None):
    """The ``mapInArrow`` function that validates a partition's examples and
    cuts them into minibatches of ``batch_size`` (the last may be smaller).

    Rows out: :data:`MINIBATCH_SCHEMA` (``x`` by input name, each ``(n, *shape)``,
    as :func:`inputs_bytes`, ``y`` as ``.npy`` bytes), or with ``folder``
    :data:`MINIBATCH_FILE_SCHEMA` (one ``.minibatch`` file per minibatch written
    there, named as the RDD path names them).  ``feature_dtype``: float
    features kept in that compact dtype (``DataOptions.feature_dtype``).
    """
    def run(batches: Iterable) -> Iterator:
        partition = _partition()
        failures: list = []
        with task_failure_guard(failures, partition=partition):
            yield from _cut(batches, partition)
        if failures:
            yield _failure_batch(failures[0], MINIBATCH_FILE_SCHEMA if folder is not None else MINIBATCH_SCHEMA)

    def _cut(batches: Iterable, partition: int) -> Iterator:
        pa = _pa()
        from ...data.storage import SUFFIX, save_minibatch

        j = 0
        out: dict = {"id": [], "n": [], "x": [], "y": [], "path": []}

        def emit(x, y):
            nonlocal j
            out["id"].append((partition << 32) | j)
            out["n"].append(count_examples(x))
            if folder is not None:
                path = f"{folder}/p{partition:05d}-b{j:06d}{SUFFIX}"
                save_minibatch(path, x, y)
                out["path"].append(path)
            else:
                out["x"].append(inputs_bytes(x))
                out["y"].append(npy_bytes(y))
            j += 1

        def flush():
            if not out["id"]:
                return None
            cols = {"id": pa.array(out["id"], pa.int64()), "n": pa.array(out["n"], pa.int32())}
            if folder is not None:
                cols["path"] = pa.array(out["path"], pa.string())
            else:
                cols["x"] = pa.array(out["x"], pa.binary())
                cols["y"] = pa.array(out["y"], pa.binary())
            cols["error"] = pa.nulls(len(out["id"]), pa.string())
            for v in out.values():
                v.clear()
            return pa.RecordBatch.from_pydict(cols)

        def chunks():
            for batch, where in numbered_batches(batches, partition):
                x = read_features(batch, features_col, where, feature_dtype)
                yield x, label_array(batch_column(batch, label_col), spec, where)

        for x, y in cut_minibatches(chunks(), batch_size, spec):
            emit(x, y)
            if len(out["id"]) >= _ROWS_PER_BATCH:
                yield flush()
        last = flush()
        if last is not None:
            yield last

    return run


def _failure_batch(failure: TaskFailure, schema: str):
    """One row holding only ``error``: the failure as JSON."""
    pa = _pa()
    names = [part.split()[0] for part in schema.split(",")]
    text = json.dumps({"kind": failure.kind, "message": failure.message, "where": failure.where})
    return pa.RecordBatch.from_pydict({name: pa.array([text if name == "error" else None],
                                                      pa.string() if name in ("error", "path") else
                                                      pa.binary() if name in ("x", "y") else
                                                      pa.int64() if name == "id" else pa.int32())
                                       for name in names})


def failure_from_row(error: Optional[str]) -> Optional[TaskFailure]:
    """The :class:`TaskFailure` of a row's ``error`` column (None when empty)."""
    if not error:
        return None
    note = json.loads(error)
    return TaskFailure(note["kind"], note["message"], note["where"])


def _chunks(x: dict, y: Optional[np.ndarray], batch, features_col, labels, where) -> Iterator[tuple]:
    """A decoded batch as (x, y) minibatch records; rows whose labels a
    matrix could not hold (ragged lengths) as single (features, label)
    records, so that the task's validation names them."""
    if y is not None:
        yield x, y
        return
    for i in range(batch.num_rows):
        one = batch.slice(i, 1)
        fx = {k: v[0] for k, v in read_features(one, features_col, lambda _: where(i)).items()}
        fy = label_array(labels.slice(i, 1), None, lambda _: where(i))
        yield fx, (fy[0] if fy.ndim > 1 else fy[0].item())


def numbered_batches(batches: Iterable, partition: int) -> Iterator[tuple]:
    """A partition's non-empty Arrow batches, each with the ``where`` that
    names its rows (``partition P, row R``) for validation messages."""
    row = 0
    for batch in batches:
        if batch.num_rows:
            yield batch, row_namer(partition, row)
            row += batch.num_rows


def examples_from_batches(batches: Iterable, features_col, label_col: str, partition: int) -> Iterator[tuple]:
    """A partition's Arrow batches as ``(x, y)`` records for the evaluation
    tasks (their ``rebatch`` validates the labels against the network):
    ``x`` by input name (``features_col``: :func:`read_features`' inputs)."""
    for batch, where in numbered_batches(batches, partition):
        x = read_features(batch, features_col, where)
        y = label_array(batch_column(batch, label_col), None, where)
        yield from _chunks(x, y, batch, features_col, batch_column(batch, label_col), where)


def make_example_decoder(features_col, label_col: str):
    """The ``mapInArrow`` function giving :data:`EXAMPLE_SCHEMA` rows: one
    ``(x, y)`` chunk per record batch, for a classic RDD of examples."""

    def run(batches: Iterable) -> Iterator:
        pa = _pa()
        partition = _partition()
        failures: list = []
        with task_failure_guard(failures, partition=partition):
            for x, y in examples_from_batches(batches, features_col, label_col, partition):
                yield pa.RecordBatch.from_pydict({
                    "x": pa.array([inputs_bytes(x)], pa.binary()),
                    "y": pa.array([npy_bytes(np.asarray(y))], pa.binary()),
                    "error": pa.array([None], pa.string())})
        if failures:
            yield _failure_batch(failures[0], EXAMPLE_SCHEMA)

    return run


def make_feature_decoder(features_col):
    """The ``mapInArrow`` function giving :data:`FEATURE_SCHEMA` rows: each
    record batch's checked features (:func:`read_features`), for a classic
    RDD of feature rows (``SparkTrainer.predict`` on a DataFrame)."""

    def run(batches: Iterable) -> Iterator:
        pa = _pa()
        partition = _partition()
        failures: list = []
        with task_failure_guard(failures, partition=partition):
            for batch, where in numbered_batches(batches, partition):
                x = read_features(batch, features_col, where)
                yield pa.RecordBatch.from_pydict({"x": pa.array([inputs_bytes(x)], pa.binary()),
                                                  "error": pa.array([None], pa.string())})
        if failures:
            yield _failure_batch(failures[0], FEATURE_SCHEMA)

    return run


def ipc_batches(raw: Iterable, schema: str, large: bool = False) -> Iterator:
    """Record batches of ``schema`` (a ``"name type, ..."`` string of
    :data:`MINIBATCH_SCHEMA`'s types) from the schema-less Arrow IPC
    messages of ``Dataset.toArrowBatchRdd`` (``large``: Spark's
    ``spark.sql.execution.arrow.useLargeVarTypes``)."""
    pa = _pa()
    types = {"long": pa.int64(), "int": pa.int32(), "binary": pa.large_binary() if large else pa.binary(),
             "string": pa.large_string() if large else pa.string()}
    arrow_schema = pa.schema([(name, types[kind]) for name, kind in (part.split() for part in schema.split(","))])
    for message in raw:
        yield pa.ipc.read_record_batch(pa.py_buffer(message), arrow_schema)


def frame_blocks(large: bool, classes: Optional[int], notes):
    """The classic session's ``mapPartitionsWithIndex`` function over the
    Arrow batches of a :data:`MINIBATCH_SCHEMA` frame: ``(id, (x, y))``
    blocks, telling ``notes`` (an accumulator of lists) each block's
    ``(id, n, host, partition, labels per class)`` -- or the failure a row
    carries -- in one pass (no second Python pass reads the blocks back)."""

    def run(partition: int, raw: Iterable) -> Iterator:
        import socket

        host, told = socket.gethostname(), []
        for batch in ipc_batches(raw, MINIBATCH_SCHEMA, large):
            ids, sizes = batch.column(0).to_pylist(), batch.column(1).to_pylist()
            xs, ys, errors = batch.column(2), batch.column(3), batch.column(4).to_pylist()
            for i in range(batch.num_rows):
                failure = failure_from_row(errors[i])
                if failure is not None:
                    told.append(failure)
                    continue
                x, y = inputs_from_bytes(xs[i]), from_npy(ys[i])
                told.append((ids[i], sizes[i], host, partition, label_counts(y, classes)))
                yield ids[i], (x, y)
        notes.add(told)

    return run
