"""What a network expects of its data, and rows checked against it.

:class:`DataSpec` says what one example must look like;
:func:`rebatch_partition` turns rows -- ``(features, label)`` pairs or
``(x, y)`` minibatches -- into validated minibatches of one size, naming
the partition and row of anything that does not fit.  No pyspark here:
the Spark adapters live in :mod:`sparkavg.spark.data`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterator, Tuple

import numpy as np

__all__ = [
    "DataValidationError",
    "DataSpec",
    "rebatch_partition",
    "split_features",
]


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


def split_features(record):
    """``(key, features)`` -> (key, features); bare features -> (None, features)."""
    if isinstance(record, tuple) and len(record) == 2 and not isinstance(record[0], np.ndarray):
        return record[0], record[1]
    return None, record


def _label_error(spec: DataSpec, where: str, label) -> DataValidationError:
    if spec.classification:
        want = f"a class index in [0, {spec.num_outputs}) or a one-hot row of length {spec.num_outputs}"
    else:
        want = f"{spec.num_outputs} finite regression target(s)"
    return DataValidationError(f"Bad label at {where}: expected {want}, got {np.asarray(label)!r:.200}")


def _check_label(spec: DataSpec, label, where: str):
    """Return the label as an int (class index) or a float32 vector."""
    arr = np.asarray(label)
    if spec.classification and arr.ndim == 0:
        if arr.dtype.kind in "iub" or (arr.dtype.kind == "f" and float(arr).is_integer()):
            value = int(arr)
            if 0 <= value < spec.num_outputs:
                return value
        raise _label_error(spec, where, label)
    if arr.dtype.kind not in "iubf":
        raise _label_error(spec, where, label)
    vec = arr.astype(np.float32).reshape(-1)
    if vec.size != spec.num_outputs or not np.all(np.isfinite(vec)):
        raise _label_error(spec, where, label)
    return vec


def _check_features(spec: DataSpec, features, where: str) -> np.ndarray:
    x = np.asarray(features)
    if x.dtype.kind not in "iubf":
        raise DataValidationError(f"Bad features at {where}: expected numbers, got dtype {x.dtype}")
    if x.size != spec.input_size:
        raise DataValidationError(
            f"Bad features at {where}: expected {spec.input_size} values (input shape {spec.input_shape}), "
            f"got shape {x.shape}"
        )
    x = x.astype(np.float32, copy=False).reshape(spec.input_shape)
    if not np.all(np.isfinite(x)):
        bad = int(np.count_nonzero(~np.isfinite(x)))
        raise DataValidationError(f"Bad features at {where}: {bad} NaN/inf value(s); expected finite numbers")
    return x


def _is_minibatch(record, spec: DataSpec) -> bool:
    if not (isinstance(record, tuple) and len(record) == 2):
        return False
    x, y = np.asarray(record[0]), np.asarray(record[1])
    return x.ndim >= 1 and y.ndim >= 1 and x.size == x.shape[0] * spec.input_size and x.shape[0] == y.shape[0] \
        and not (x.shape[0] == spec.input_size and y.ndim == 1 and y.size == spec.num_outputs and x.ndim == 1)


def _stack_labels(labels, spec: DataSpec) -> np.ndarray:
    if spec.classification and all(isinstance(v, int) for v in labels):
        return np.asarray(labels, dtype=np.int64)
    rows = []
    for v in labels:
        if isinstance(v, int):
            row = np.zeros(spec.num_outputs, np.float32)
            row[v] = 1.0
            rows.append(row)
        else:
            rows.append(v)
    return np.stack(rows).astype(np.float32, copy=False)


def rebatch_partition(spec: DataSpec, batch_size: int):
    """Executor function ``(partition_index, rows) -> minibatches``.

    Validates every example (features size and finiteness, label range)
    and yields ``(x float32 (b, *input_shape), y)`` minibatches of exactly
    ``batch_size`` examples (the partition's last may be smaller; nothing
    is dropped).  Rows may be pairs or already-made minibatches.
    """

    def run(index: int, rows) -> Iterator[tuple]:
        xs, ys = [], []
        row_no = 0
        for record in rows:
            if _is_minibatch(record, spec):
                bx, by = np.asarray(record[0]), np.asarray(record[1])
                items = zip(bx, by if by.ndim > 1 else by.tolist())
            elif isinstance(record, tuple) and len(record) == 2:
                items = (record,)
            else:
                raise DataValidationError(
                    f"Bad record at partition {index}, row {row_no}: expected a (features, label) pair "
                    f"or an (x, y) minibatch, got {type(record).__name__}"
                )
            for features, label in items:
                where = f"partition {index}, row {row_no}"
                xs.append(_check_features(spec, features, where))
                ys.append(_check_label(spec, label, where))
                row_no += 1
                if len(xs) == batch_size:
                    yield np.stack(xs), _stack_labels(ys, spec)
                    xs, ys = [], []
        if xs:
            yield np.stack(xs), _stack_labels(ys, spec)

    return run
