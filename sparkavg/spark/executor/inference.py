"""Executor side of evaluation, scoring and prediction.

Prediction is one batch-in/batch-out function in the shape of pyspark's
``predict_batch_udf``: :func:`make_predict_fn` returns ``make_predict``,
which a task calls once to get ``predict(x) -> outputs`` over a whole
matrix of examples.  Every inference path feeds it matrices:

- :func:`predict_rows` -- an RDD's rows (classic ``SparkTrainer.predict``),
  gathered into matrices;
- :func:`predict_arrow` -- a DataFrame's Arrow record batches, one matrix
  each, with columns appended (Connect's ``predict`` and
  ``NetworkModel.transform`` on both flavours).

Every path runs where training does: ``device`` is the master's, as a
plain str (:func:`~.device.task_device` chooses; features cross to a GPU
chunk by chunk, outputs come back once per chunk).
"""
from __future__ import annotations

import copy
from typing import Callable, Iterable, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from ...backend import is_gpu_array, to_cpu
from ...data.validation import (DataSpec, DataValidationError, check_input_rows, count_examples, row_namer,
                                split_features, take_examples)
from ..errors import failure_aware, task_failure_guard
from .arrow import read_features
from .context import cached_network, load_state, task_partition
from .device import AUTO, task_device

__all__ = ["make_evaluator", "make_scorer", "merge_evaluations", "add_scores", "make_predict_fn", "predict_rows",
           "predict_arrow", "list_column"]

#: Rows of an RDD gathered into one ``predict`` call.
ROWS_PER_CALL = 1024


def _net(config_json: str, shipped, device: str):
    """This task's network on its device (:func:`~.device.task_device` of
    ``device``) with the shipped parameters (host -> device on a GPU)."""
    net = cached_network(config_json, task_device(device))
    load_state(net, shipped.value, with_updater=False)
    return net


def _encoded(x, encoding: Optional[dict]):
    """Features in the model's input encoding (``DataOptions(scale=,
    normalize=)``: :func:`~sparkavg.data.transforms.encode_inputs`); as
    they are without one."""
    if encoding is None:
        return x
    from ...data.transforms import encode_inputs

    return encode_inputs(x, encoding)


def _output(net, x, where):
    """``net.output(x)``; when the model refuses the chunk (a ``ValueError`` or
    ``TypeError``: an id beyond an Embedding's vocabulary, ...) and refuses a
    row of it on its own that others pass, a ``DataValidationError`` naming
    that row (``where(i)``: its partition and row) and the model's reason;
    the error as it is, with the chunk's rows named, when every row fails
    alike (the model's doing, not a row's)."""
    try:
        return net.output(x)
    except (ValueError, TypeError) as exc:
        n, refused = count_examples(x), []
        for i in range(n):
            try:
                net.output(take_examples(x, i, i + 1))
            except (ValueError, TypeError):
                refused.append(i)
        if refused and len(refused) < n:
            raise DataValidationError(f"Bad features at {where(refused[0])}: {exc}") from None
        exc.args = (f"{exc} [{where(0)} and the {n - 1} row(s) after it]",) + exc.args[1:]
        raise


def make_evaluator(config_json: str, shipped, evaluations: list, rebatch_fn, encoding: Optional[dict] = None,
                   device: str = AUTO):
    """Executor function: evaluate one partition into fresh copies of the
    given (empty) evaluations; yields one list of evaluations (or a
    :class:`TaskFailure`).  ``encoding``: the model's input encoding; ``eval_model`` evaluations get the model."""

    def run(index, rows):
        failures: list = []
        evals = None
        with task_failure_guard(failures, partition=index):
            net = _net(config_json, shipped, device)
            evals = copy.deepcopy(evaluations)
            given_model, first = [hasattr(ev, "eval_model") for ev in evals], 0
            for x, y in rebatch_fn(index, rows):
                x = _encoded(x, encoding)
                out = None if all(given_model) else _output(net, x, row_namer(index, first))
                if is_gpu_array(out):
                    out = to_cpu(out)  # device -> host sync: once for every evaluation of the batch
                first += len(y)
                for ev, model in zip(evals, given_model):
                    ev.eval_model(net, x, y) if model else ev.eval(y, out)
        yield failures[0] if failures else evals

    return run


@failure_aware
def merge_evaluations(a, b):
    """treeAggregate combiner of evaluation lists; a failure wins."""
    for x, y in zip(a, b):
        x.merge(y)
    return a


def make_scorer(config_json: str, shipped, rebatch_fn, encoding: Optional[dict] = None, device: str = AUTO):
    """Executor function: ``(loss_sum, examples)`` of one partition (``encoding``: the model's input encoding)."""

    def run(index, rows):
        failures: list = []
        total, n = 0.0, 0
        with task_failure_guard(failures, partition=index):
            net = _net(config_json, shipped, device)
            for x, y in rebatch_fn(index, rows):
                x = _encoded(x, encoding)
                try:
                    total += float(net.score(x, y)) * len(y)
                except (ValueError, TypeError):
                    _output(net, x, row_namer(index, n))  # names a row the model refuses
                    raise
                n += len(y)
        yield failures[0] if failures else (total, n)

    return run


@failure_aware
def add_scores(a, b):
    """treeAggregate combiner of ``(loss_sum, examples)``; a failure wins."""
    return a[0] + b[0], a[1] + b[1]


def make_predict_fn(config_json: str, shipped, batch_size: int, encoding: Optional[dict] = None,
                    device: str = AUTO) -> Callable[[], Callable]:
    """The network's batch inference, as pyspark's ``predict_batch_udf`` takes it.

    Returns ``make_predict``: called once inside a task, it loads the
    network (``shipped.value``: ``(iteration, params, None)``) and returns
    ``predict(x, where=None)``, which runs the network over ``x`` (a dict by
    input name) in chunks of ``batch_size`` and returns its outputs as one
    host array of shape ``(n, k)``, ``x`` first in the model's input
    ``encoding`` (``DataOptions(scale=, normalize=)``; None: as it is);
    ``where(i)`` names row ``i`` of ``x`` when the model refuses it.  Plain
    values only: it ships to executors.
    ``device``: see the module doc (``"gpu"`` without a usable GPU raises
    :class:`~.device.DeviceError` from ``make_predict``).
    """

    def make_predict() -> Callable[[np.ndarray], np.ndarray]:
        net = _net(config_json, shipped, device)

        def predict(x: dict, where=None) -> np.ndarray:
            n = count_examples(x)
            if n == 0:
                return np.zeros((0, 1), np.float32)
            x, where = _encoded(x, encoding), where or (lambda i: f"row {i} of the batch")
            parts = [np.asarray(to_cpu(_output(net, take_examples(x, s, s + batch_size),
                                               lambda i, s=s: where(s + i)))) for s in range(0, n, batch_size)]
            return (parts[0] if len(parts) == 1 else np.concatenate(parts)).reshape(n, -1)

        return predict

    return make_predict


def _row_matrices(rows: Iterable, inputs, partition: int) -> Iterator[Tuple[list, dict, Callable]]:
    """Rows gathered into validated matrices by input name (the rules of
    training data: numbers, the input's size, finite; partition and row
    named), each with the namer of its rows."""
    spec = DataSpec(tuple(inputs[0].shape), 1, inputs=tuple(inputs))
    keys, xs, first = [], [], 0
    for record in rows:
        key, x = split_features(record)
        keys.append(key)
        xs.append(x)
        if len(xs) == ROWS_PER_CALL:
            where = row_namer(partition, first)
            yield keys, check_input_rows(xs, spec, where), where
            first += len(xs)
            keys, xs = [], []
    if xs:
        where = row_namer(partition, first)
        yield keys, check_input_rows(xs, spec, where), where


def predict_rows(make_predict: Callable[[], Callable], inputs: Sequence):
    """``mapPartitionsWithIndex`` function: ``predict`` over an RDD's rows,
    gathered into matrices of the model's ``inputs`` (a tuple of
    :class:`~sparkavg.data.validation.NamedInput`; features checked as for
    training: a NaN or a row of another size raises ``DataValidationError``
    naming partition and row); ``(key, features)`` rows give ``(key,
    output)``, bare features give ``output`` (one row of ``(k,)``).  Each
    row's features are a dict by input name, or a one-input model's array."""

    def run(index, rows):
        predict = make_predict()
        for keys, x, where in _row_matrices(rows, inputs, index):
            for key, row in zip(keys, predict(x, where)):
                yield row if key is None else (key, row)

    return run


def list_column(out: np.ndarray):
    """An ``(n, k)`` matrix as an Arrow ``list<float>`` column of ``n`` rows."""
    import pyarrow as pa

    n, k = out.shape
    offsets = pa.array(np.arange(0, n * k + 1, k, dtype=np.int32))
    return pa.ListArray.from_arrays(offsets, pa.array(np.ascontiguousarray(out, np.float32).reshape(-1), pa.float32()))


def predict_arrow(make_predict: Callable[[], Callable], features_col, columns: Callable[[np.ndarray], List[tuple]]):
    """``mapInArrow`` function: each record batch's features (``features_col``:
    the model's inputs with their columns, each read at its own shape and
    dtype) validated at once (partition and row named on error), ``predict``
    over them, and the batch back with ``columns(outputs)`` -- ``[(name,
    pyarrow array of n rows), ...]`` -- appended."""

    def run(batches: Iterable) -> Iterator:
        predict = make_predict()
        partition = task_partition() or 0
        row = 0
        for batch in batches:
            n, where = batch.num_rows, row_namer(partition, row)
            x = read_features(batch, features_col, where)
            for name, column in columns(predict(x, where)):
                batch = batch.append_column(name, column)
            yield batch
            row += n

    return run
