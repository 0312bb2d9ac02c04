"""What a network expects of its data, and examples checked against it.

:class:`DataSpec` says what one example must look like.  Each rule is
written once, vectorised over a chunk of ``n`` examples, and names the
partition and row of the first example that breaks it (after
scikit-learn's ``check_array``): :func:`check_features`,
:func:`check_labels` and the rules they are made of
(:func:`check_numbers`, :func:`check_widths`, :func:`check_finite`,
:func:`check_label_values`).
Both ways examples arrive call them: :func:`rebatch_partition` (RDD rows --
``(features, label)`` pairs or ``(x, y)`` minibatches -- gathered into
chunks) and :mod:`sparkavg.spark.executor.arrow` (DataFrame columns decoded
per Arrow record batch).  No pyspark here: the Spark adapters live in
:mod:`sparkavg.spark.data`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, List, Optional, Sequence, Tuple

import numpy as np

__all__ = [
    "DataValidationError",
    "DataSpec",
    "row_namer",
    "shape_note",
    "check_numbers",
    "check_widths",
    "check_finite",
    "check_label_values",
    "as_arrays",
    "check_features",
    "check_feature_rows",
    "check_labels",
    "cut_minibatches",
    "rebatch_partition",
    "split_features",
]

#: Rows of ``(features, label)`` pairs validated together.
_PAIRS_PER_CHUNK = 256

Where = Callable[[int], str]


class DataValidationError(ValueError):
    """Training data that does not fit the network: raised on executors
    before any training happens, re-raised on the driver with the same text."""


@dataclass(frozen=True)
class DataSpec:
    """What a network expects of one example (plain values: ships to executors).

    Parameters
    ----------
    input_shape : tuple of int
        Shape of one example's features (e.g. ``(1, 28, 28)``); any array
        with the same number of elements is accepted and reshaped.
    num_outputs : int
        Classes (``loss='nll'``) or regression targets (``loss='mse'``).
    loss : str
        ``'nll'`` (labels are class indices or one-hot rows) or ``'mse'``.
    """

    input_shape: Tuple[int, ...]
    num_outputs: int
    loss: str = "nll"

    @classmethod
    def of(cls, model_spec) -> "DataSpec":
        """The spec of a model with one input and one output (a
        :class:`sparkavg.nn.ModelSpec`; several inputs or outputs are
        refused, naming them)."""
        inp, out = model_spec.single_input(), model_spec.single_output()
        return cls(tuple(inp.shape), int(out.units), out.loss)

    @property
    def input_size(self) -> int:
        return int(math.prod(self.input_shape))

    @property
    def classification(self) -> bool:
        return self.loss != "mse"

    @property
    def shape_note(self) -> str:
        """What follows an expected feature count in messages (:func:`shape_note`)."""
        return shape_note(self.input_shape)

    @property
    def label_note(self) -> str:
        """What follows an expected label width in messages."""
        return f" ({self.label_want})"

    @property
    def label_want(self) -> str:
        """What a label must be, as messages say it."""
        if self.classification:
            return (f"a class index in [0, {self.num_outputs}) or a one-hot row of length "
                    f"{self.num_outputs}")
        return f"{self.num_outputs} finite regression target(s)"


def shape_note(input_shape) -> str:
    """What follows an expected feature count in messages: `` (input shape (1, 28, 28))``."""
    return f" (input shape {tuple(int(s) for s in input_shape)})"


def row_namer(partition: int, first_row: int) -> Where:
    """``where(i)`` naming row ``i`` of a chunk that starts at ``first_row``."""
    return lambda i: f"partition {partition}, row {first_row + i}"


def _first(mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask)[0])


# ------------------------------------------------------------------ rules
def _first_non_numeric(dtypes: Iterable[np.dtype]) -> Optional[int]:
    for i, dtype in enumerate(dtypes):
        if dtype.kind not in "iubf":
            return i
    return None


def check_numbers(dtypes: Sequence[np.dtype], where: Where, what: str = "features") -> None:
    """Values are numbers (bool, int, float): ``dtypes[i]`` is row ``i``'s
    dtype (one entry for a whole array)."""
    i = _first_non_numeric(dtypes)
    if i is not None:
        raise DataValidationError(f"Bad {what} at {where(i)}: expected numbers, got dtype {dtypes[i]}")


def check_widths(sizes: np.ndarray, width: int, where: Where, shown: Callable[[int], str], what: str = "features",
                 note: str = "") -> None:
    """Every row holds ``width`` values: ``sizes[i]`` is row ``i``'s count;
    ``shown(i)`` says what row ``i`` was ("shape (15,)")."""
    bad = np.asarray(sizes) != width
    if np.any(bad):
        i = _first(bad)
        raise DataValidationError(f"Bad {what} at {where(i)}: expected {width} values{note}, got {shown(i)}")


def check_finite(x: np.ndarray, where: Where, what: str = "features") -> None:
    """No NaN or inf in ``x`` (rows along axis 0)."""
    finite = np.isfinite(x)
    if not finite.all():
        bad = ~finite.reshape(len(x), -1)
        i = _first(bad.any(axis=1))
        raise DataValidationError(f"Bad {what} at {where(i)}: {int(np.count_nonzero(bad[i]))} NaN/inf "
                                  "value(s); expected finite numbers")


def as_arrays(values: Iterable, where: Where, what: str, want: str) -> List[np.ndarray]:
    """Each row's value as an array; a ragged nested sequence (rows of
    different lengths, which numpy refuses) is named by its row."""
    out = []
    for value in values:
        try:
            out.append(np.asarray(value))
        except ValueError as exc:
            raise DataValidationError(f"Bad {what} at {where(len(out))}: expected {want}, got a ragged nested "
                                      f"sequence ({str(exc).split('. ')[-1].rstrip('.')})") from None
    return out


def check_feature_rows(values: Sequence, input_shape, where: Where) -> np.ndarray:
    """Rows of features (one array-like each) as one float32
    ``(n, *input_shape)`` matrix: numbers, the input's size each, finite."""
    shape = tuple(int(s) for s in input_shape)
    size, note = int(np.prod(shape, dtype=np.int64)), shape_note(shape)
    xs = as_arrays(values, where, "features", f"{size} values{note}")
    check_numbers([a.dtype for a in xs], where)
    check_widths(np.fromiter((a.size for a in xs), np.int64, len(xs)), size, where,
                 lambda i: f"shape {xs[i].shape}", note=note)
    flat = np.stack([a.reshape(-1) for a in xs]) if xs else np.zeros((0, size), np.float32)
    check_finite(flat, where)
    return flat.astype(np.float32, copy=False).reshape((len(xs),) + shape)


def _label_error(spec: DataSpec, where: str, value) -> DataValidationError:
    value = np.asarray(value)
    shown = repr(value.item()) if value.ndim == 0 else repr(value)
    return DataValidationError(f"Bad label at {where}: expected {spec.label_want}, got {shown:.200}")


def check_label_values(values: np.ndarray, spec: DataSpec, where: Where) -> np.ndarray:
    """One number per example: class indices (int64 ``(n,)``; integer-valued
    floats accepted) or, for one regression target, float32 ``(n, 1)``."""
    values = np.asarray(values)
    if values.dtype.kind not in "iubf":
        raise _label_error(spec, where(0), values[0])
    if spec.classification:
        ok = (values >= 0) & (values < spec.num_outputs)
        if values.dtype.kind == "f":
            ok &= np.isfinite(values) & (values == np.round(values))
        if not ok.all():
            i = _first(~ok)
            raise _label_error(spec, where(i), values[i])
        return values.astype(np.int64)
    if spec.num_outputs != 1:
        raise _label_error(spec, where(0), values[0])
    check_finite(values, where, "label")
    return values.astype(np.float32).reshape(-1, 1)


def _label_rows(y: np.ndarray, spec: DataSpec, where: Where) -> np.ndarray:
    """One-hot rows or regression targets: float32 ``(n, num_outputs)``, finite."""
    if y.dtype.kind not in "iubf":
        raise _label_error(spec, where(0), y[0])
    rows = y.reshape(len(y), -1)
    check_widths(np.full(len(y), rows.shape[1]), spec.num_outputs, where, lambda i: f"shape {y.shape[1:]}",
                 "label", spec.label_note)
    check_finite(rows, where, "label")
    return rows.astype(np.float32, copy=False)


def check_features(x: np.ndarray, spec: DataSpec, where: Where) -> np.ndarray:
    """A chunk of examples' features, ``(n, ...)``, as float32 ``(n, *input_shape)``:
    numbers, ``input_size`` values each, all finite."""
    x = np.asarray(x)
    check_numbers([x.dtype], where)
    flat = x.reshape(len(x), -1)
    check_widths(np.full(len(x), flat.shape[1]), spec.input_size, where, lambda i: f"shape {x.shape[1:]}",
                 note=spec.shape_note)
    check_finite(flat, where)
    return flat.astype(np.float32, copy=False).reshape((len(x),) + tuple(spec.input_shape))


def check_labels(y: np.ndarray, spec: DataSpec, where: Where) -> np.ndarray:
    """A chunk of labels, ``(n,)`` numbers or ``(n, k)`` rows: class indices
    as int64 ``(n,)``, one-hot rows and regression targets as float32
    ``(n, num_outputs)``."""
    y = np.asarray(y)
    if y.ndim == 1:
        return check_label_values(y, spec, where)
    return _label_rows(y, spec, where)


# ------------------------------------------------------------------ rows
def split_features(record):
    """``(key, features)`` -> (key, features); bare features -> (None, features)."""
    if isinstance(record, tuple) and len(record) == 2 and not isinstance(record[0], np.ndarray):
        return record[0], record[1]
    return None, record


def _is_minibatch(record, spec: DataSpec, where: Callable[[], str]) -> bool:
    """Whether a record is an ``(x, y)`` minibatch rather than a
    ``(features, label)`` pair.  A pair whose ``x`` holds several examples
    (a whole number of them, more values than one example has) and whose
    ``y`` holds another number of labels is refused as a length mismatch,
    not as one example of the wrong size."""
    if not (isinstance(record, tuple) and len(record) == 2):
        return False
    try:
        x, y = np.asarray(record[0]), np.asarray(record[1])
    except ValueError:  # ragged: a pair, whose check names it
        return False
    if not (x.ndim >= 1 and y.ndim >= 1 and x.size == x.shape[0] * spec.input_size):
        return False
    if x.shape[0] == y.shape[0]:
        return not (x.shape[0] == spec.input_size and y.ndim == 1 and y.size == spec.num_outputs and x.ndim == 1)
    if x.shape[0] >= 2:
        raise DataValidationError(f"Bad minibatch at {where()}: expected one label per example, got {x.shape[0]} "
                                  f"examples and {y.shape[0]} labels (x of shape {x.shape}, y of shape {y.shape})")
    return False


def _pair_chunk(spec: DataSpec, pairs: List[tuple], where: Where) -> Tuple[np.ndarray, np.ndarray]:
    """``(features, label)`` pairs as one checked ``(x, y)`` chunk."""
    x = check_feature_rows([f for f, _ in pairs], spec.input_shape, where)
    labels = as_arrays((label for _, label in pairs), where, "label", spec.label_want)
    i = _first_non_numeric(a.dtype for a in labels)
    if i is not None:
        raise _label_error(spec, where(i), labels[i])
    scalar = np.fromiter((a.ndim == 0 for a in labels), bool, len(labels))
    if scalar.all() and spec.classification:
        return x, check_label_values(np.stack(labels), spec, where)
    # Rows (one-hot or targets); with classification, class indices among them become one-hot rows.
    y = np.zeros((len(labels), spec.num_outputs), np.float32)
    index = np.flatnonzero(scalar) if spec.classification else np.zeros(0, np.int64)
    if len(index):
        classes = check_label_values(np.stack([labels[i] for i in index]), spec, lambda j: where(int(index[j])))
        y[index, classes] = 1.0
    rows = np.flatnonzero(~scalar) if spec.classification else np.arange(len(labels))
    if len(rows):
        check_widths(np.fromiter((labels[i].size for i in rows), np.int64, len(rows)), spec.num_outputs,
                     lambda j: where(int(rows[j])), lambda j: f"shape {labels[rows[j]].shape}", "label",
                     spec.label_note)
        y[rows] = _label_rows(np.stack([labels[i].reshape(-1) for i in rows]), spec, lambda j: where(int(rows[j])))
    return x, y


def _checked_chunks(spec: DataSpec, index: int, rows: Iterable) -> Iterator[Tuple[np.ndarray, np.ndarray]]:
    """A partition's rows as checked ``(x, y)`` chunks in order: each
    minibatch record as one, runs of pairs gathered into chunks."""
    row_no = 0
    pairs: List[tuple] = []

    def pair_chunk():
        nonlocal row_no
        chunk = _pair_chunk(spec, pairs, row_namer(index, row_no))
        row_no += len(pairs)
        pairs.clear()
        return chunk

    for record in rows:
        if _is_minibatch(record, spec, lambda: f"partition {index}, row {row_no + len(pairs)}"):
            if pairs:
                yield pair_chunk()
            bx, by = np.asarray(record[0]), np.asarray(record[1])
            where = row_namer(index, row_no)
            yield check_features(bx, spec, where), check_labels(by, spec, where)
            row_no += len(bx)
        elif isinstance(record, tuple) and len(record) == 2:
            pairs.append(record)
            if len(pairs) == _PAIRS_PER_CHUNK:
                yield pair_chunk()
        else:
            raise DataValidationError(
                f"Bad record at partition {index}, row {row_no + len(pairs)}: expected a (features, label) "
                f"pair or an (x, y) minibatch, got {type(record).__name__}"
            )
    if pairs:
        yield pair_chunk()


def _concat_labels(ys: Sequence[np.ndarray], spec: DataSpec) -> np.ndarray:
    """Labels of several chunks as one array; class indices become one-hot
    rows when another chunk holds rows."""
    if len(ys) == 1:
        return ys[0]
    if all(y.ndim == 1 for y in ys) or all(y.ndim == 2 for y in ys):
        return np.concatenate(ys)
    eye = np.eye(spec.num_outputs, dtype=np.float32)
    return np.concatenate([eye[y] if y.ndim == 1 else y for y in ys])


def cut_minibatches(chunks: Iterable[Tuple[np.ndarray, np.ndarray]], batch_size: int,
                    spec: DataSpec) -> Iterator[Tuple[np.ndarray, np.ndarray]]:
    """Checked ``(x, y)`` chunks of any size re-cut into minibatches of
    exactly ``batch_size`` examples, in order (the last may be smaller;
    nothing is dropped)."""
    xs: List[np.ndarray] = []
    ys: List[np.ndarray] = []
    held = 0
    for x, y in chunks:
        if not len(x):
            continue
        xs.append(x)
        ys.append(y)
        held += len(x)
        if held >= batch_size:
            x_all, y_all = np.concatenate(xs) if len(xs) > 1 else xs[0], _concat_labels(ys, spec)
            full = (held // batch_size) * batch_size
            for s in range(0, full, batch_size):
                yield x_all[s:s + batch_size], y_all[s:s + batch_size]
            xs, ys = ([x_all[full:]], [y_all[full:]]) if full < held else ([], [])
            held -= full
    if held:
        yield (np.concatenate(xs) if len(xs) > 1 else xs[0]), _concat_labels(ys, spec)


def rebatch_partition(spec: DataSpec, batch_size: int):
    """Executor function ``(partition_index, rows) -> minibatches``.

    Validates every example (:func:`check_features`, :func:`check_labels`;
    runs of pairs are checked together, a minibatch record at once) and
    yields ``(x float32 (b, *input_shape), y)`` minibatches of exactly
    ``batch_size`` examples (the partition's last may be smaller; nothing
    is dropped).  Rows may be pairs or already-made minibatches.
    """

    def run(index: int, rows) -> Iterator[tuple]:
        return cut_minibatches(_checked_chunks(spec, index, rows), batch_size, spec)

    return run
