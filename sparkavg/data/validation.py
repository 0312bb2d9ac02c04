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
from dataclasses import dataclass, replace
from typing import Callable, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from ..nn.model import Targeted

__all__ = [
    "WEIGHTS",
    "weight_input",
    "split_weights",
    "check_weights",
    "DataValidationError",
    "DataSpec",
    "row_namer",
    "shape_note",
    "check_numbers",
    "check_widths",
    "check_finite",
    "check_float32_range",
    "check_label_values",
    "as_arrays",
    "check_features",
    "check_feature_rows",
    "check_labels",
    "cut_minibatches",
    "rebatch_partition",
    "split_features",
    "NamedInput",
    "DEFAULT_INPUT",
    "as_named",
    "check_input_rows",
    "check_ids",
    "count_examples",
    "label_counts",
    "take_examples",
    "concat_examples",
    "compact_features",
    "kept_features",
]

#: Rows of ``(features, label)`` pairs validated together.
_PAIRS_PER_CHUNK = 256

Where = Callable[[int], str]


class DataValidationError(ValueError):
    """Training data that does not fit the network: raised on executors
    before any training happens, re-raised on the driver with the same text."""


#: Input dtypes a model may declare: features (any float or int values, cast) and integer ids (kept integer).
INPUT_DTYPES = ("float32", "int64")
#: The input name of a :class:`DataSpec` made without inputs (a Network's and a TorchModel's one input).
DEFAULT_INPUT = "input"


@dataclass(frozen=True)
class NamedInput:
    """One named input of a model, and where it is read from.

    Parameters
    ----------
    name : str
        The model's input name (:class:`sparkavg.nn.InputSpec`).
    shape : tuple of int
        One example's shape (``(F,)``, ``(T, F)``, ``(T,)`` ids, ...).
    dtype : {"float32", "int64"}
        ``"int64"`` for integer ids (an Embedding's input): kept integer
        from the column to the minibatch, never rounded through float32.
    column : str or None
        The DataFrame column it is read from (None: data that is not a DataFrame).
    sole : bool
        The model's only input: messages call it ``features``.
    """

    name: str
    shape: Tuple[int, ...]
    dtype: str = "float32"
    column: Optional[str] = None
    sole: bool = False

    @property
    def size(self) -> int:
        return int(math.prod(self.shape))

    @property
    def ids(self) -> bool:
        """Whether this input holds integer ids."""
        return self.dtype == "int64"

    @property
    def what(self) -> str:
        """This input in messages: ``features column 'age' (input 'numeric')``; ``features`` when it is the only one."""
        if self.sole:
            return "features"
        if self.column is not None:
            return f"features column {self.column!r} (input {self.name!r})"
        return f"features of input {self.name!r}"


@dataclass(frozen=True)
class DataSpec(Targeted):
    """What a network expects of one example (plain values: ships to executors).

    Parameters
    ----------
    input_shape : tuple of int
        Shape of one example's features (e.g. ``(1, 28, 28)``); any array
        with the same number of elements is accepted and reshaped.
    num_outputs : int
        Classes (``loss='nll'``), binary labels (``'bce'``) or regression
        targets (``'mse'``, ``'mae'``, ``'huber'``).
    loss : str
        The output's loss (:data:`sparkavg.nn.model.TARGETS` says what its
        labels are: class indices or one-hot rows, values in [0, 1], or
        finite values).
    dtype : {"float32", "int64"}
        The first input's dtype: ``"int64"`` keeps integer ids integer.
    inputs : tuple of NamedInput
        The model's inputs by name; examples' features are a dict of
        arrays by input name, one input's too (a mapping of one).  Empty:
        one input named :data:`DEFAULT_INPUT` of ``input_shape`` and ``dtype``.
    """

    input_shape: Tuple[int, ...]
    num_outputs: int
    loss: str = "nll"
    dtype: str = "float32"
    inputs: Tuple[NamedInput, ...] = ()

    def __post_init__(self):
        inputs = tuple(self.inputs) or (NamedInput(DEFAULT_INPUT, tuple(self.input_shape), self.dtype),)
        object.__setattr__(self, "inputs", (replace(inputs[0], sole=True),) if len(inputs) == 1 else inputs)

    @classmethod
    def of(cls, model_spec) -> "DataSpec":
        """The spec of a model with one output (a :class:`sparkavg.nn.ModelSpec`;
        several outputs are refused, naming them), its inputs by name."""
        out = model_spec.single_output()
        ins = [NamedInput(i.name, tuple(int(d) for d in i.shape), _input_dtype(i)) for i in model_spec.inputs]
        return cls(ins[0].shape, int(out.units), out.loss, ins[0].dtype, tuple(ins))

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
        if self.target == "binary":
            return "a label in [0, 1]" if self.num_outputs == 1 else f"{self.num_outputs} labels in [0, 1]"
        return f"{self.num_outputs} finite regression target(s)"


def _input_dtype(spec) -> str:
    dtype = str(getattr(spec, "dtype", "float32"))
    return "int64" if dtype.startswith(("int", "uint")) else "float32"


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
    """No NaN or inf in ``x`` (rows along axis 0), and no value a float32
    cannot hold (:func:`check_float32_range`)."""
    finite = np.isfinite(x)
    if not finite.all():
        bad = ~finite.reshape(len(x), -1)
        i = _first(bad.any(axis=1))
        raise DataValidationError(f"Bad {what} at {where(i)}: {int(np.count_nonzero(bad[i]))} NaN/inf "
                                  "value(s); expected finite numbers")
    check_float32_range(x, where, what)


#: The largest float32: a wider float beyond it becomes inf in a float32 minibatch.
FLOAT32_MAX = float(np.finfo(np.float32).max)


def check_float32_range(x: np.ndarray, where: Where, what: str = "features") -> None:
    """Values of a float dtype wider than float32 (rows along axis 0) fit
    float32: ``|v| <= 3.4028235e+38``.  One beyond is finite here but inf
    once the minibatch is float32 (features and targets train as float32),
    and the fit would end as a divergence far from its cause."""
    x = np.asarray(x)
    if x.dtype.kind != "f" or x.dtype.itemsize <= 4 or not x.size:
        return
    flat = x.reshape(len(x), -1)
    big = (np.abs(flat) > FLOAT32_MAX) & np.isfinite(flat)  # NaN/inf: the finite check's (one message either path)
    if big.any():
        i = _first(big.any(axis=1))
        value = flat[i][big[i]][0].item()
        raise DataValidationError(f"Bad {what} at {where(i)}: expected numbers a float32 holds (|value| <= "
                                  f"{FLOAT32_MAX:.8g}), got {value!r}")


def compact_features(x: np.ndarray, dtype: str, where: Where, what: str = "features") -> np.ndarray:
    """``x`` (finite numbers in their own dtype) in ``dtype``: integers
    must be integral and in the dtype's range, float16 values within its
    range; else a :class:`DataValidationError` naming the first bad row,
    the dtype and what it takes."""
    target = np.dtype(dtype)
    if x.dtype == target:
        return x
    if target.kind in "iu":
        info = np.iinfo(target)
        if x.dtype.kind == "f":
            bad = (x != np.floor(x)) | (x < info.min) | (x > info.max)
        elif x.dtype.kind in "iu" and (np.iinfo(x.dtype).min < info.min or np.iinfo(x.dtype).max > info.max):
            bad = (x < info.min) | (x > info.max)
        else:
            bad = None
        if bad is not None and bad.any():
            flat = int(np.flatnonzero(bad.reshape(len(x), -1).any(axis=1))[0])
            value = x.reshape(len(x), -1)[flat][bad.reshape(len(x), -1)[flat]][0]
            raise DataValidationError(f"Bad {what} at {where(flat)}: expected integers in [{info.min}, {info.max}] "
                                      f"for feature_dtype={dtype!r}, got {value.item()!r}")
        return x.astype(target)
    if target == np.float16:
        bad = np.abs(x) > np.finfo(np.float16).max
        if bad.any():
            row = int(np.flatnonzero(bad.reshape(len(x), -1).any(axis=1))[0])
            raise DataValidationError(f"Bad {what} at {where(row)}: expected values within +-65504 for "
                                      f"feature_dtype='float16', got {x.reshape(len(x), -1)[row].max().item()!r}")
    return x.astype(target)


#: Integer dtypes ``feature_dtype="auto"`` keeps features in, narrowest first.
_AUTO_INTEGERS = tuple(np.dtype(d) for d in ("uint8", "int8", "uint16", "int16"))


def kept_features(x: np.ndarray, feature_dtype: Optional[str], where: Where, what: str = "features") -> np.ndarray:
    """Checked features (finite numbers in their own dtype) in the dtype
    prepared minibatches keep them in (``DataOptions.feature_dtype``).

    None or ``"float32"``: float32.  ``"auto"``: integers in the narrowest
    of uint8, int8, uint16, int16 that holds these values (Spark reads a
    Parquet ``UINT_8`` column as ``smallint``: its 0..255 come back to
    uint8), float16 as it is, anything else float32 -- every value converts
    to the same float32 as before.  Another compact dtype:
    :func:`compact_features` (values that do not fit are an error)."""
    if feature_dtype is None or feature_dtype == "float32":
        return x.astype(np.float32, copy=False)
    if feature_dtype != "auto":
        return compact_features(x, feature_dtype, where, what)
    if x.dtype == np.float16:
        return x
    if x.dtype.kind in "iu" and x.size:
        lo, hi = x.min(), x.max()
        for target in _AUTO_INTEGERS:
            info = np.iinfo(target)
            if info.min <= lo and hi <= info.max:
                return x.astype(target, copy=False)
    return x.astype(np.float32, copy=False)


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


def check_feature_rows(values: Sequence, input_shape, where: Where, dtype: str = "float32",
                       what: str = "features", feature_dtype: Optional[str] = None) -> np.ndarray:
    """Rows of features (one array-like each) as one float32
    ``(n, *input_shape)`` matrix: numbers, the input's size each, finite
    (``dtype="int64"``: integer ids, :func:`check_ids`; ``feature_dtype``:
    kept as :func:`kept_features` says)."""
    shape = tuple(int(s) for s in input_shape)
    size, note = int(np.prod(shape, dtype=np.int64)), shape_note(shape)
    xs = as_arrays(values, where, what, f"{size} values{note}")
    check_numbers([a.dtype for a in xs], where, what)
    check_widths(np.fromiter((a.size for a in xs), np.int64, len(xs)), size, where,
                 lambda i: f"shape {xs[i].shape}", what, note)
    flat = np.stack([a.reshape(-1) for a in xs]) if xs else np.zeros((0, size), np.float32)
    if dtype == "int64":
        return check_ids(flat, where, what).reshape((len(xs),) + shape)
    check_finite(flat, where, what)
    return kept_features(flat, feature_dtype, where, what).reshape((len(xs),) + shape)


def as_named(x, spec: DataSpec):
    """Features as the library holds them, a dict of arrays by input name:
    a one-input model's bare features (what users give) become a mapping of one."""
    return x if isinstance(x, Mapping) or len(spec.inputs) > 1 else {spec.inputs[0].name: x}


def check_input_rows(values: Sequence, spec: DataSpec, where: Where, feature_dtype: Optional[str] = None) -> dict:
    """Rows of one example's features each (dicts by input name, :func:`as_named`)
    as one checked chunk (:func:`check_feature_rows` per input)."""
    values = [as_named(v, spec) for v in values]
    names = [i.name for i in spec.inputs]
    for r, value in enumerate(values):
        if not isinstance(value, Mapping) or sorted(value) != sorted(names):
            got = f"keys {list(value)}" if isinstance(value, Mapping) else type(value).__name__
            raise DataValidationError(f"Bad features at {where(r)}: expected a dict keyed by the inputs {names}, "
                                      f"got {got}")
    return {i.name: check_feature_rows([v[i.name] for v in values], i.shape, where, i.dtype, i.what, feature_dtype)
            for i in spec.inputs}


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
    _check_binary(values.reshape(-1, 1), spec, where)
    return values.astype(np.float32).reshape(-1, 1)


def _check_binary(rows: np.ndarray, spec: DataSpec, where: Where) -> None:
    """Binary labels (``loss='bce'``) lie in [0, 1]."""
    if spec.target == "binary":
        bad = ((rows < 0) | (rows > 1)).any(axis=1)
        if bad.any():
            i = _first(bad)
            raise _label_error(spec, where(i), rows[i] if rows.shape[1] > 1 else rows[i, 0])


def _label_rows(y: np.ndarray, spec: DataSpec, where: Where) -> np.ndarray:
    """One-hot rows or regression targets: float32 ``(n, num_outputs)``, finite."""
    if y.dtype.kind not in "iubf":
        raise _label_error(spec, where(0), y[0])
    rows = y.reshape(len(y), -1)
    check_widths(np.full(len(y), rows.shape[1]), spec.num_outputs, where, lambda i: f"shape {y.shape[1:]}",
                 "label", spec.label_note)
    check_finite(rows, where, "label")
    _check_binary(rows, spec, where)
    return rows.astype(np.float32, copy=False)


def check_ids(x: np.ndarray, where: Where, what: str = "features") -> np.ndarray:
    """Integer ids, ``(n, ...)``, as int64: integers, or integer-valued
    floats (finite), none negative."""
    x = np.asarray(x)
    check_numbers([x.dtype], where, what)
    flat = x.reshape(len(x), -1)
    if x.dtype.kind == "f":
        check_finite(flat, where, what)
        fractional = (flat != np.floor(flat)).any(axis=1)
        if fractional.any():
            i = _first(fractional)
            raise DataValidationError(f"Bad {what} at {where(i)}: expected integer ids, got "
                                      f"{flat[i][flat[i] != np.floor(flat[i])][0].item()!r}")
    negative = (flat < 0).any(axis=1)
    if negative.any():
        i = _first(negative)
        got = flat[i][flat[i] < 0][0].item()
        raise DataValidationError(f"Bad {what} at {where(i)}: expected ids >= 0, got {got!r}")
    return x.astype(np.int64, copy=False)


def _check_input(x, shape, dtype: str, where: Where, what: str, feature_dtype: Optional[str] = None) -> np.ndarray:
    """One input's chunk as ``(n, *shape)`` float32 features (``feature_dtype``:
    :func:`kept_features`) or int64 ids."""
    x = np.asarray(x)
    check_numbers([x.dtype], where, what)
    shape = tuple(int(s) for s in shape)
    size = int(math.prod(shape))
    flat = x.reshape(len(x), -1)
    check_widths(np.full(len(x), flat.shape[1]), size, where, lambda i: f"shape {x.shape[1:]}", what,
                 shape_note(shape))
    if dtype == "int64":
        return check_ids(flat, where, what).reshape((len(x),) + shape)
    check_finite(flat, where, what)
    return kept_features(flat, feature_dtype, where, what).reshape((len(x),) + shape)


def check_features(x, spec: DataSpec, where: Where, feature_dtype: Optional[str] = None) -> dict:
    """A chunk of examples' features (a dict by input name), each input
    ``(n, ...)`` as float32 ``(n, *shape)``: numbers, the input's size each,
    all finite (``int64`` ids for an id input; ``feature_dtype``: kept as
    :func:`kept_features` says), errors naming the input; one count of examples."""
    names = [i.name for i in spec.inputs]
    if sorted(x) != sorted(names):
        raise DataValidationError(f"Bad features at {where(0)}: expected arrays keyed by the inputs {names}, "
                                  f"got keys {list(x)}")
    out = {i.name: _check_input(x[i.name], i.shape, i.dtype, where, i.what, feature_dtype) for i in spec.inputs}
    counts = {k: len(v) for k, v in out.items()}
    if len(set(counts.values())) > 1:
        raise DataValidationError(f"Bad features at {where(0)}: expected one count of examples for every input, "
                                  f"got {counts}")
    return out


#: The name per-row weights travel under with the features (a column of
#: the training data, ``SparkTrainer(weight_col=)``), until the model step.
WEIGHTS = "__weight__"


def weight_input(column: str) -> "NamedInput":
    """The weight column as one more input of the training data: one number per row."""
    return NamedInput(WEIGHTS, (1,), "float32", column)


def split_weights(x: Mapping):
    """``(features, weights or None)``: the per-row weights (``(n,)``) taken out of a chunk of features."""
    if WEIGHTS not in x:
        return x, None
    rest = {k: v for k, v in x.items() if k != WEIGHTS}
    return rest, np.asarray(x[WEIGHTS]).reshape(-1)


def check_weights(w: np.ndarray, where: Where) -> None:
    """Per-row weights are finite and >= 0 (naming the first row that is not)."""
    w = np.asarray(w).reshape(len(w), -1)[:, 0]
    bad = ~(np.isfinite(w) & (w >= 0))
    if bad.any():
        i = _first(bad)
        raise DataValidationError(f"Bad weight at {where(i)}: expected a finite number >= 0, got {w[i].item()!r}")


def count_examples(x: Mapping) -> int:
    """Examples in a chunk of features (a dict of arrays by input name)."""
    return len(next(iter(x.values()))) if x else 0


def label_counts(y, classes: Optional[int]) -> Optional[List[float]]:
    """Examples per class in a minibatch's labels (class indices or one-hot
    rows); None for regression (``classes`` None)."""
    if classes is None:
        return None
    y = np.asarray(y)
    if y.ndim == 1:
        return np.bincount(y.astype(np.int64), minlength=classes)[:classes].astype(float).tolist()
    return y.reshape(len(y), -1).sum(axis=0, dtype=np.float64)[:classes].tolist()


def take_examples(x: Mapping, start: int, stop: int) -> dict:
    """Examples ``start:stop`` of each input of a chunk of features."""
    return {k: v[start:stop] for k, v in x.items()}


def concat_examples(xs: Sequence) -> dict:
    """Chunks of features (dicts of arrays by input name) as one."""
    return xs[0] if len(xs) == 1 else {k: np.concatenate([x[k] for x in xs]) for k in xs[0]}


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


def _is_minibatch(x: Mapping, y, spec: DataSpec, where: Callable[[], str]) -> bool:
    """Whether a record ``(x, y)`` (``x`` by input name) is an ``(x, y)``
    minibatch rather than one example's features and label.  A pair whose
    inputs hold several examples (a whole number of them, more values than
    one example has) and whose ``y`` holds another number of labels is
    refused as a length mismatch, not as one example of the wrong size."""
    try:
        y = np.asarray(y)
        xs = [(i, np.asarray(x[i.name])) for i in spec.inputs]
    except (KeyError, IndexError, TypeError, ValueError):  # not by input name, or ragged: a pair, whose check names it
        return False
    if y.ndim == 0 or not all(a.ndim >= 1 and a.size == a.shape[0] * i.size for i, a in xs):
        return False
    counts = {a.shape[0] for _, a in xs}
    if counts == {y.shape[0]}:
        one = all(a.ndim == 1 and a.shape[0] == i.size for i, a in xs)
        return not (one and y.ndim == 1 and y.size == spec.num_outputs)
    if len(counts) == 1 and xs[0][1].shape[0] >= 2:
        a = xs[0][1]
        raise DataValidationError(f"Bad minibatch at {where()}: expected one label per example, got {a.shape[0]} "
                                  f"examples and {y.shape[0]} labels (x of shape {a.shape}, y of shape {y.shape})")
    return False


def _pair_chunk(spec: DataSpec, pairs: List[tuple], where: Where,
                feature_dtype: Optional[str] = None) -> Tuple[np.ndarray, np.ndarray]:
    """``(features, label)`` pairs as one checked ``(x, y)`` chunk."""
    x = check_input_rows([f for f, _ in pairs], spec, where, feature_dtype)
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


def _checked_chunks(spec: DataSpec, index: int, rows: Iterable,
                    feature_dtype: Optional[str] = None) -> Iterator[Tuple[np.ndarray, np.ndarray]]:
    """A partition's rows as checked ``(x, y)`` chunks in order: each
    minibatch record as one, runs of pairs gathered into chunks."""
    row_no = 0
    pairs: List[tuple] = []

    def pair_chunk():
        nonlocal row_no
        chunk = _pair_chunk(spec, pairs, row_namer(index, row_no), feature_dtype)
        row_no += len(pairs)
        pairs.clear()
        return chunk

    for record in rows:
        if not (isinstance(record, tuple) and len(record) == 2):
            raise DataValidationError(
                f"Bad record at partition {index}, row {row_no + len(pairs)}: expected a (features, label) "
                f"pair or an (x, y) minibatch, got {type(record).__name__}"
            )
        x = as_named(record[0], spec)  # the one input's bare features become a mapping of one
        if _is_minibatch(x, record[1], spec, lambda: f"partition {index}, row {row_no + len(pairs)}"):
            if pairs:
                yield pair_chunk()
            by = np.asarray(record[1])
            where = row_namer(index, row_no)
            yield check_features(x, spec, where, feature_dtype), check_labels(by, spec, where)
            row_no += len(by)
        else:
            pairs.append((x, record[1]))
            if len(pairs) == _PAIRS_PER_CHUNK:
                yield pair_chunk()
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
        n = count_examples(x)
        if not n:
            continue
        xs.append(x)
        ys.append(y)
        held += n
        if held >= batch_size:
            x_all, y_all = concat_examples(xs), _concat_labels(ys, spec)
            full = (held // batch_size) * batch_size
            for s in range(0, full, batch_size):
                yield take_examples(x_all, s, s + batch_size), y_all[s:s + batch_size]
            xs, ys = ([take_examples(x_all, full, held)], [y_all[full:]]) if full < held else ([], [])
            held -= full
    if held:
        yield concat_examples(xs), _concat_labels(ys, spec)


def rebatch_partition(spec: DataSpec, batch_size: int, feature_dtype: Optional[str] = None):
    """Executor function ``(partition_index, rows) -> minibatches``.

    Validates every example (:func:`check_features`, :func:`check_labels`;
    runs of pairs are checked together, a minibatch record at once) and
    yields ``(x, y)`` minibatches (``x`` by input name, float32 ``(b, *shape)`` each) of exactly
    ``batch_size`` examples (the partition's last may be smaller; nothing
    is dropped).  Rows may be pairs or already-made minibatches.
    ``feature_dtype`` (``DataOptions.feature_dtype``; None: float32): the
    features kept as :func:`kept_features` says (``"auto"``: integers in
    the narrowest compact integer dtype, float16 as it is).
    """

    def run(index: int, rows) -> Iterator[tuple]:
        return cut_minibatches(_checked_chunks(spec, index, rows, feature_dtype), batch_size, spec)

    return run
