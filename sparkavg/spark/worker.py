"""Executor-side code shared by every master.

Everything here runs inside Spark's Python workers.  The factories take
plain values (JSON strings, numbers, Broadcast handles) and return
closures that capture only those: never a SparkContext, never a trainer.

Each Python worker process keeps its network between rounds (Spark
reuses Python workers), so a round costs a parameter copy, not a
network construction, and pins its BLAS/OpenMP pool to the task's cores
once.  It also moves everything alive after its first network build
(numpy, pyspark, sparkavg: ~40k objects) out of the cyclic garbage
collector's reach with :func:`gc.freeze`: PySpark's daemon runs a full
``gc.collect()`` after every task of a reused worker, which otherwise
costs 15-60 ms of CPU per task and delays the next round's task on it.
"""
from __future__ import annotations

import copy
import gc
import hashlib
import logging
import os
import socket
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Iterable, Iterator, List, Optional

import numpy as np

from .. import ops
from ..data.spark_data import load_minibatch, split_features
from ..threads import set_threads, task_cpus
from .stats import PhaseRecorder

__all__ = [
    "cached_network",
    "lane_name",
    "minibatch_sources",
    "recorded_minibatches",
    "Record",
    "RoundResult",
    "combine_results",
    "make_round_trainer",
    "make_evaluator",
    "make_predictor",
    "make_scorer",
]

logger = logging.getLogger(__name__)

_NETWORKS: dict = {}
_PROCESS_PREPARED = [False]
_LOCK = threading.Lock()


def cached_network(config_json: str):
    """This process's network for ``config_json`` (built once, reused)."""
    key = hashlib.sha256(config_json.encode()).hexdigest()
    with _LOCK:
        net = _NETWORKS.get(key)
        if net is None:
            from ..nn import Network

            first = not _PROCESS_PREPARED[0]
            if first:
                set_threads(task_cpus(1))
            net = Network.from_json(config_json)
            _NETWORKS.clear()  # one model per worker process: drop older ones
            _NETWORKS[key] = net
            if first:
                # Once per process: later tasks' garbage is still collected,
                # only this long-lived heap is no longer rescanned.
                gc.collect()
                gc.freeze()
                _PROCESS_PREPARED[0] = True
        return net


def lane_name() -> str:
    """``host/pid/partition`` of the running task (one timeline lane)."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    part = ctx.partitionId() if ctx is not None else -1
    return f"{socket.gethostname()}/{os.getpid()}/p{part}"


def load_state(net, state: tuple, with_updater: bool) -> None:
    """Copy broadcast ``(iteration, params, updater_state)`` into ``net``."""
    iteration, params, updater_state = state
    net.params = params
    if with_updater and updater_state is not None and updater_state.size:
        net.updater_state = updater_state
    net.iteration = int(iteration)


def minibatch_sources(items: Iterable) -> Iterator:
    """Flatten a partition's items into minibatch sources: a path string
    (an exported .npz) or an ``(x, y)`` tuple (direct approach)."""
    for item in items:
        if isinstance(item, list):
            yield from item
        else:
            yield item


def _materialize(source):
    return load_minibatch(source) if isinstance(source, str) else source


def prefetched(sources: Iterator, depth: int) -> Iterator:
    """Load minibatches ``depth`` ahead in one background thread."""
    if depth <= 0:
        for s in sources:
            yield _materialize(s)
        return
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sparkavg-prefetch")
    try:
        pending: List = []
        for s in sources:
            pending.append(pool.submit(_materialize, s))
            if len(pending) > depth:
                yield pending.pop(0).result()
        for fut in pending:
            yield fut.result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def recorded_minibatches(items: Iterable, prefetch: int, rec: PhaseRecorder) -> Iterator:
    """A task's ``(x, y)`` minibatches, loaded ``prefetch`` ahead, each wait
    for the next one recorded as the ``data_load`` phase."""
    source = prefetched(minibatch_sources(items), prefetch)
    while True:
        with rec.phase("data_load"):
            mb = next(source, None)
        if mb is None:
            return
        yield mb


class Record:
    """A plain result record: positional fields named by ``__slots__``,
    pickled as a tuple (no ``__dict__``, cheap to ship back through Spark)."""

    __slots__ = ()

    def __init__(self, *values):
        if len(values) != len(self.__slots__):
            raise TypeError(f"Expect {len(self.__slots__)} fields {self.__slots__}, got {len(values)}")
        for name, value in zip(self.__slots__, values):
            setattr(self, name, value)

    def __reduce__(self):
        return (type(self), tuple(getattr(self, s) for s in self.__slots__))


class RoundResult(Record):
    """What one worker returns from a round: weighted sums, ready to add.

    ``params`` and ``state`` hold ``weight * value``; the driver divides the
    aggregated sums by the aggregated ``weight``.
    """

    __slots__ = ("weight", "params", "state", "loss_sum", "examples", "batches", "max_iterations", "stats")


def combine_results(a: Optional[RoundResult], b: Optional[RoundResult]) -> Optional[RoundResult]:
    """Sum two round results in place (``a`` is reused): the treeAggregate combiner."""
    if a is None:
        return b
    if b is None:
        return a
    ops.accumulate(a.params, b.params)
    if a.state is not None and b.state is not None:
        ops.accumulate(a.state, b.state)
    a.weight += b.weight
    a.loss_sum += b.loss_sum
    a.examples += b.examples
    a.batches += b.batches
    a.max_iterations = max(a.max_iterations, b.max_iterations)
    a.stats = a.stats + b.stats
    return a


def fault_hook() -> None:
    """Test hook: when the job's local property ``sparkavg.test.kill_marker``
    names a file that exists, the first task to claim it kills its Python
    worker (as a crashed executor would).  Spark must retry the task."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    marker = ctx.getLocalProperty("sparkavg.test.kill_marker") if ctx is not None else None
    if marker:
        try:
            os.rename(marker, marker + ".claimed")
        except OSError:
            return
        os._exit(17)


def stall_hook(rank: int) -> None:
    """Test hook: when the job's local property ``sparkavg.test.stall_rank``
    equals ``rank``, this task hangs (as a stuck executor would); its peers
    must end the stage with an error naming it."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    value = ctx.getLocalProperty("sparkavg.test.stall_rank") if ctx is not None else None
    if value is not None and int(value) == rank:
        threading.Event().wait()


def make_round_trainer(config_json: str, state_bc, *, save_updater: bool, uniform: bool,
                       collect_stats: bool, prefetch: int):
    """Executor function for one averaging round: fit every minibatch of
    this worker's shard, return one :class:`RoundResult` (none if empty)."""

    def run(items) -> Iterator[RoundResult]:
        fault_hook()
        rec = PhaseRecorder(lane_name())
        with rec.phase("fetch"):
            state = state_bc.value
        with rec.phase("model_init"):
            net = cached_network(config_json)
            load_state(net, state, save_updater)
        start_iteration = net.iteration
        loss_sum, examples, batches = 0.0, 0, 0
        for x, y in recorded_minibatches(items, prefetch, rec):
            with rec.phase("fit"):
                loss = net.fit_batch(x, y)
            loss_sum += float(loss) * len(x)
            examples += len(x)
            batches += 1
        if examples == 0:
            return
        weight = 1.0 if uniform else float(examples)
        params = np.array(net.params, dtype=np.float32, copy=True)
        ops.scale(params, weight)
        updater_state = None
        if save_updater and net.updater_state.size:
            updater_state = np.array(net.updater_state, dtype=np.float32, copy=True)
            ops.scale(updater_state, weight)
        yield RoundResult(weight, params, updater_state, loss_sum, examples, batches,
                          net.iteration - start_iteration, [rec.to_payload()] if collect_stats else [])

    return run


def _batches(rows: Iterable, batch_size: int):
    keys, xs = [], []
    for record in rows:
        key, x = split_features(record)
        keys.append(key)
        xs.append(np.asarray(x, dtype=np.float32))
        if len(xs) == batch_size:
            yield keys, np.stack(xs)
            keys, xs = [], []
    if xs:
        yield keys, np.stack(xs)


def make_evaluator(config_json: str, state_bc, evaluations: list, rebatch_fn):
    """Executor function: evaluate one partition into fresh copies of the
    given (empty) evaluations; yields one list of evaluations."""

    def run(index, rows):
        net = cached_network(config_json)
        load_state(net, state_bc.value, with_updater=False)
        evals = copy.deepcopy(evaluations)
        for x, y in rebatch_fn(index, rows):
            out = net.output(x)
            for ev in evals:
                ev.eval(y, out)
        yield evals

    return run


def make_scorer(config_json: str, state_bc, rebatch_fn):
    """Executor function: (loss_sum, examples) of one partition."""

    def run(index, rows):
        net = cached_network(config_json)
        load_state(net, state_bc.value, with_updater=False)
        total, n = 0.0, 0
        for x, y in rebatch_fn(index, rows):
            total += float(net.score(x, y)) * len(x)
            n += len(x)
        yield total, n

    return run


def make_predictor(config_json: str, state_bc, batch_size: int):
    """Executor function: network outputs for each row; ``(key, features)``
    rows give ``(key, output)``, bare features give ``output``."""

    def run(rows):
        net = cached_network(config_json)
        load_state(net, state_bc.value, with_updater=False)
        for keys, x in _batches(rows, batch_size):
            out = np.asarray(net.output(x))
            for key, row in zip(keys, out):
                yield row if key is None else (key, row)

    return run
