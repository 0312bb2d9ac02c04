"""What every sparkavg task on an executor starts from.

Everything in :mod:`sparkavg.spark.executor` runs inside Spark's Python
workers.  The task factories take plain values (JSON strings, numbers,
shipped handles) and return closures that capture only those: never a
SparkContext, never a trainer.

Each Python worker process keeps its network between rounds (Spark
reuses Python workers), so a round costs a parameter copy, not a network
construction, and pins its BLAS/OpenMP pool to the task's cores once.  It
also moves everything alive after its first network build (numpy,
pyspark, sparkavg: ~40k objects) out of the cyclic garbage collector's
reach with :func:`gc.freeze`: PySpark's daemon runs a full
``gc.collect()`` after every task of a reused worker, which otherwise
takes CPU from every task and delays the next round's task on it.

On a GPU (:mod:`.device`) the network lives on the task's CUDA device:
parameters, gradients and updater state stay there between rounds, and a
round's result crosses to the host once (:func:`host_copy`, into pinned
memory).  Spark may hand a reused worker process another GPU in a later
task, so the process keeps one network per device.
"""
from __future__ import annotations

import gc
import hashlib
import threading
from typing import Optional

import numpy as np

from ...nn import device_checks
from ...threads import set_threads

__all__ = ["cached_network", "load_state", "task_partition", "task_cpus", "Record", "host_copy", "LossSum"]

_NETWORKS: dict = {}
_PROCESS_PREPARED = [False]
_LOCK = threading.Lock()


def task_partition() -> Optional[int]:
    """The running Spark task's partition, or None outside a task."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    return ctx.partitionId() if ctx is not None else None


def task_cpus(default: int = 1) -> int:
    """Cores given to the running Spark task (``spark.task.cpus``), else ``default``."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    value = ctx.cpus() if ctx is not None and hasattr(ctx, "cpus") else None
    return int(value) if value else default


def cached_network(config_json: str, device=None):
    """This process's model for ``config_json`` on ``device`` (built once, reused).

    Parameters
    ----------
    config_json : str
        ``model.to_json()`` text of any registered model
        (:func:`sparkavg.nn.model_from_json`).
    device : DeviceChoice or None
        Where the network lives: None or a CPU choice, host memory; a GPU
        choice, CUDA device ``device.index`` (made current for this thread).
        One network per device is kept; a new configuration drops them all.
    """
    digest = hashlib.sha256(config_json.encode()).hexdigest()
    ordinal = device.index if device is not None and device.is_gpu else None
    key = (digest, ordinal)
    with _LOCK:
        if ordinal is not None:
            from ...backend import use_device

            use_device(ordinal)  # kernels run on the current device: the network's
        net = _NETWORKS.get(key)
        if net is None:
            from ...nn import model_from_json

            first = not _PROCESS_PREPARED[0]
            if first:
                set_threads(task_cpus(1))
            # The config travels inside the task the driver ships (beside the task's own
            # pickled function), built from a model the driver made under the loaders'
            # rules: executors rebuild it under the driver's authority (sparkavg.references).
            net = model_from_json(config_json, trusted=True)
            if ordinal is not None:
                net.to_gpu()  # host -> device copies, once per process and device
            for old in [k for k in _NETWORKS if k[0] != digest]:
                del _NETWORKS[old]  # one model per worker process: drop older ones
            _NETWORKS[key] = net
            if first:
                # Once per process: later tasks' garbage is still collected,
                # only this long-lived heap is no longer rescanned.
                gc.collect()
                gc.freeze()
                _PROCESS_PREPARED[0] = True
        return net


def load_state(net, state: dict, with_updater: bool) -> None:
    """Copy a shipped state (:func:`sparkavg.spark.runners.base.network_state`:
    ``iteration``, ``epoch`` and the named host vectors ``params``, ``updater``,
    ``buffers``) into ``net``, onto its device (host -> device copies on a GPU)."""
    vectors = {"params": state["params"], "buffers": state.get("buffers")}
    updater = state.get("updater")
    if with_updater and updater is not None and updater.size:
        vectors["updater"] = updater
    net.load_state(vectors)
    net.iteration = int(state["iteration"])
    net.epoch = int(state.get("epoch", 0))  # a schedule by epoch follows it


class LossSum:
    """``sum(loss * examples)`` over a task's steps.

    Losses from ``fit_batch(..., sync=False)`` on a GPU are 0-d device
    arrays: they are summed there (float64) and read back once, by
    :meth:`value`, so no step waits for the device.  Host losses add up as Python floats."""

    __slots__ = ("_host", "_device")

    def __init__(self):
        self._host, self._device = 0.0, None

    def add(self, loss, examples: int) -> None:
        if isinstance(loss, (float, int, np.generic, np.ndarray)):
            self._host += float(loss) * examples
            return
        term = loss.astype("float64") * examples  # on the device: no sync
        self._device = term if self._device is None else self._device + term

    def value(self) -> float:
        """The sum as a float (one device -> host sync for device losses; the steps' label checks too)."""
        device_checks.resolve()
        return self._host + (float(self._device) if self._device is not None else 0.0)


def host_copy(array) -> np.ndarray:
    """A float32 numpy copy of a (numpy or CuPy) flat vector.

    A CuPy vector crosses to the host in one copy, into page-locked memory
    from CuPy's pinned pool (reused once the previous result is released).
    """
    from ...backend import is_gpu_array, to_cpu, to_cpu_pinned

    if is_gpu_array(array):
        if array.dtype != np.float32:
            array = array.astype(np.float32)  # on the device: only float32 crosses
        return to_cpu_pinned(array)  # device -> host sync
    return np.array(to_cpu(array), dtype=np.float32, copy=True)


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
