"""Which device a task trains on: the master's ``device``, Spark's GPU
assignment and whether CuPy works here.

Spark schedules GPUs like cores: with ``spark.executor.resource.gpu.amount``,
``spark.task.resource.gpu.amount`` and a discovery script, every task gets
the addresses of its GPUs in ``TaskContext.resources()["gpu"]``; two tasks
running at once on one executor never get the same address (unless a task
asks for a fraction of one).  :func:`select_device` turns the master's
``device`` and those resources into a :class:`DeviceChoice`:

- ``"cpu"``: the CPU; the resources are not read and CuPy is not imported;
- ``"auto"`` (default): the task's GPU when Spark assigned one and CuPy can
  use it, else the CPU, with the reason;
- ``"gpu"``: the task's GPU, else :class:`DeviceError` (permanent: the
  driver raises it as itself; retrying the task cannot help).

The choice and its reason are logged once per Python worker process and
travel back with each task's result, so that the driver records them once
(``trainer.stats`` decision ``device``; :func:`summarize_devices`).

Spark reuses Python workers and may give one worker process a different GPU
in a later task; :func:`~sparkavg.spark.executor.context.cached_network`
therefore keeps a network per device.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Iterable, List, Mapping, Optional, Tuple

from ... import backend
from ...configurable import ConfigError
from ..errors import register_error

__all__ = [
    "AUTO",
    "GPU",
    "CPU",
    "DEVICES",
    "GPU_RESOURCE",
    "DeviceError",
    "DeviceChoice",
    "as_device",
    "gpu_addresses",
    "cuda_ordinal",
    "select_device",
    "task_device",
    "log_choice",
    "summarize_devices",
]

logger = logging.getLogger(__name__)

#: The values of the master's ``device`` (:class:`~sparkavg.spark.masters.Device`), as
#: tasks get them: one plain str, never the driver's enum.
AUTO, GPU, CPU = "auto", "gpu", "cpu"
DEVICES = (AUTO, GPU, CPU)

#: The Spark resource name sparkavg reads (``spark.task.resource.gpu.amount``).
GPU_RESOURCE = "gpu"

_HOW_TO_REQUEST = (
    "Request GPUs from Spark with spark.executor.resource.gpu.amount (GPUs per executor), "
    "spark.task.resource.gpu.amount (GPUs per task, e.g. 1) and "
    "spark.executor.resource.gpu.discoveryScript (a script printing "
    '{"name": "gpu", "addresses": ["0", ...]}; standalone workers: spark.worker.resource.gpu.*), '
    "or train with device='auto' (CPU fallback) or device='cpu'"
)


class DeviceError(ConfigError):
    """``device="gpu"`` but this task cannot train on a GPU: Spark assigned
    it none, or CuPy cannot use the one it assigned.  Permanent: the task is
    not retried and the driver raises it as itself."""


register_error(DeviceError)


@dataclass(frozen=True)
class DeviceChoice:
    """Where one task trains, and why.

    Attributes
    ----------
    kind : str
        ``"cpu"`` or ``"gpu"``.
    index : int or None
        The CUDA device ordinal (``"gpu"`` only).
    reason : str
        Why, in words (no worker-specific numbers, so that equal reasons
        of different workers group together).
    address : str or None
        The GPU address Spark assigned the task, when it assigned one --
        also when the task trains on the CPU because CuPy cannot use it.
    """

    kind: str
    index: Optional[int]
    reason: str
    address: Optional[str] = None

    def __post_init__(self):
        if self.kind not in ("cpu", "gpu"):
            raise ValueError(f"Expect kind 'cpu' or 'gpu', got {self.kind!r}")
        if (self.kind == "gpu") != (self.index is not None):
            raise ValueError(f"Expect a CUDA device index exactly for kind 'gpu', got kind {self.kind!r} "
                             f"with index {self.index!r}")

    @property
    def is_gpu(self) -> bool:
        return self.kind == "gpu"

    @property
    def name(self) -> str:
        """``"cpu"`` or ``"gpu:<index>"``."""
        return "cpu" if self.index is None else f"gpu:{self.index}"

    def to_plain(self, worker=None) -> dict:
        """A plain dict for a task result (``worker``: its rank or partition)."""
        return {"worker": worker, "kind": self.kind, "index": self.index, "address": self.address,
                "reason": self.reason}


def as_device(requested) -> str:
    """``requested`` -- one of :data:`DEVICES` (a
    :class:`~sparkavg.spark.masters.Device`, a ``str`` enum, compares equal)
    -- as that plain str."""
    for device in DEVICES:
        if isinstance(requested, str) and requested == device:
            return device
    allowed = ", ".join(repr(d) for d in DEVICES)
    raise ValueError(f"Expect device in {{{allowed}}}, got {requested!r}")


def gpu_addresses(resources: Optional[Mapping]) -> List[str]:
    """The ``"gpu"`` addresses in a task's resources.

    ``resources`` maps resource names to pyspark ``ResourceInformation``
    (``TaskContext.resources()``) or to plain sequences of addresses.
    """
    if not resources:
        return []
    info = resources.get(GPU_RESOURCE)
    if info is None:
        return []
    return [str(a) for a in getattr(info, "addresses", info)]


def cuda_ordinal(address: str, visible_devices: Optional[str]) -> int:
    """The CUDA device ordinal of Spark GPU address ``address``.

    CUDA numbers the devices a process sees 0, 1, ...: when
    ``visible_devices`` (the process's ``CUDA_VISIBLE_DEVICES``) lists the
    address, the ordinal is its position there (``"2"`` in ``"2,3"`` is
    device 0); otherwise the address itself is the ordinal (what
    ``nvidia-smi``-based discovery scripts report).

    Raises
    ------
    ValueError
        An address that is neither listed nor a non-negative integer
        (e.g. a GPU UUID without ``CUDA_VISIBLE_DEVICES`` naming it).
    """
    listed = [e.strip() for e in visible_devices.split(",")] if visible_devices else []
    if address in listed:
        return listed.index(address)
    try:
        ordinal = int(address)
    except ValueError:
        ordinal = -1
    if ordinal < 0:
        raise ValueError(f"Expect a GPU address that is a CUDA device ordinal ('0', '1', ...) or an entry of "
                         f"CUDA_VISIBLE_DEVICES ({visible_devices!r}), got {address!r}")
    return ordinal


def _use_gpu(address: str) -> int:
    """Make the GPU of ``address`` current; its ordinal.  Raises with the reason when unusable."""
    why = backend.unavailable_reason()
    if why is not None:
        raise RuntimeError(why)
    ordinal = cuda_ordinal(address, os.environ.get("CUDA_VISIBLE_DEVICES"))
    count = backend.device_count()
    if ordinal >= count:
        raise RuntimeError(f"CUDA device {ordinal} is not visible to this process (CuPy sees {count} device(s))")
    backend.use_device(ordinal)
    return ordinal


def select_device(requested, resources: Optional[Mapping]) -> DeviceChoice:
    """Choose a task's device from the master's ``device`` and the task's
    Spark resources (see the module docstring).

    Parameters
    ----------
    requested : str
        ``"auto"``, ``"gpu"`` or ``"cpu"`` (:data:`DEVICES`).
    resources : mapping or None
        ``TaskContext.resources()``: ``{"gpu": ResourceInformation}`` (or
        ``{"gpu": ["0"]}``); not read for ``"cpu"``.  With several GPU
        addresses the task uses the first.

    Returns
    -------
    DeviceChoice
        For ``"gpu"`` kind, the device has been made current for this thread.

    Raises
    ------
    DeviceError
        ``"gpu"`` requested and no GPU assigned, or CuPy cannot use it.
    ValueError
        ``requested`` is not a device.
    """
    mode = as_device(requested)
    if mode == CPU:
        return DeviceChoice("cpu", None, "device='cpu' requested (Spark's GPU assignment is not read)")
    addresses = gpu_addresses(resources)
    if not addresses:
        if mode == AUTO:
            return DeviceChoice("cpu", None, "device='auto': no GPU assigned to this task by Spark")
        names = sorted(resources) if resources else []
        raise DeviceError(f"Expect a GPU assigned to this task by Spark for device='gpu', got none (the task's "
                          f"resources: {', '.join(map(repr, names)) if names else 'none'}). {_HOW_TO_REQUEST}")
    address = addresses[0]
    several = f" (the first of {len(addresses)} assigned)" if len(addresses) > 1 else ""
    try:
        ordinal = _use_gpu(address)
    except Exception as exc:  # CuPy missing, no driver, device out of range, bad address ...
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if mode == AUTO:
            return DeviceChoice("cpu", None, f"device='auto': Spark assigned this task a GPU{several}, but CuPy "
                                             f"cannot use it, so it trains on the CPU: {why}", address)
        raise DeviceError(f"Expect a usable GPU for device='gpu' (Spark assigned this task GPU address "
                          f"{address!r}{several}), got an error: {why}") from None
    return DeviceChoice("gpu", ordinal, f"device={mode!r}: the task's Spark-assigned GPU{several}", address)


def _outside_spark(mode: str) -> DeviceChoice:
    """No Spark task (executor functions called directly): ``"gpu"`` means
    the current CUDA device, ``"auto"`` the CPU."""
    if mode == AUTO:
        return DeviceChoice("cpu", None, "device='auto' outside a Spark task: no GPU assigned by Spark")
    why = backend.unavailable_reason()
    if why is not None:
        raise DeviceError(f"Expect CuPy with a CUDA device for device='gpu', got none: {why}")
    return DeviceChoice("gpu", backend.current_device(), "device='gpu' outside a Spark task: the current CUDA device")


def task_device(requested, ctx=None) -> DeviceChoice:
    """The running task's device: :func:`select_device` on
    ``TaskContext.resources()`` (or ``ctx.resources()``), logged once per
    process.  Outside a Spark task, ``"gpu"`` uses the current CUDA device
    and ``"auto"`` the CPU."""
    mode = as_device(requested)
    if mode == CPU:
        choice = select_device(mode, None)
    else:
        if ctx is None:
            from pyspark import TaskContext

            ctx = TaskContext.get()
        choice = _outside_spark(mode) if ctx is None else select_device(mode, ctx.resources())
    log_choice(choice)
    return choice


_LOGGED: set = set()


def log_choice(choice: DeviceChoice) -> bool:
    """Log ``choice`` at INFO the first time this process makes it (a new
    kind or reason); later ones at DEBUG.  True when logged at INFO."""
    key = (choice.kind, choice.reason)
    first = key not in _LOGGED
    _LOGGED.add(key)
    text = "task trains on %s (Spark GPU address %s): %s"
    args = (choice.name, choice.address if choice.address is not None else "none", choice.reason)
    if first:
        logger.info(text, *args)
    else:
        logger.debug(text, *args)
    return first


def summarize_devices(entries: Iterable[Mapping]) -> Tuple[str, str]:
    """``(value, reason)`` of a decision from tasks' :meth:`DeviceChoice.to_plain` entries.

    ``value`` is ``"cpu"``, ``"gpu"`` or ``"mixed"``; ``reason`` groups
    workers by kind and reason, with the GPU addresses Spark assigned them.
    """
    groups: dict = {}
    for e in entries:
        g = groups.setdefault((e["kind"], e["reason"]), {"workers": set(), "addresses": set()})
        if e.get("worker") is not None:
            g["workers"].add(e["worker"])
        if e.get("address") is not None:
            g["addresses"].add(str(e["address"]))
    if not groups:
        raise ValueError("Expect at least one device entry, got none")
    kinds = {kind for kind, _ in groups}
    value = kinds.pop() if len(kinds) == 1 else "mixed"
    parts = []
    for (kind, reason), g in sorted(groups.items()):
        workers = ", ".join(str(w) for w in sorted(g["workers"], key=str))
        where = f"{kind} on worker(s) {workers}" if workers else kind
        if g["addresses"]:
            where += f" (Spark GPU addresses {', '.join(sorted(g['addresses']))})"
        parts.append(f"{where}: {reason}")
    return value, "; ".join(parts)
