"""Checks of data already on a GPU, deferred from a training step to the next read.

Class labels that arrive on the device (a user's CuPy labels; the executors'
come from the host and are checked there) need their range checked, and
reading ``min`` and ``max`` back would make every step wait for the device.
Inside a training step (:func:`deferring`, entered by
:meth:`~sparkavg.nn.flatstate.FlatState.fit_batch`) the range is computed
on the device and the verdict waits here (:func:`clip_labels`); the labels are
clipped into range meanwhile, so no kernel indexes out of bounds.  The
verdicts are read, all in one copy, by :func:`resolve` -- when a step's
loss is read anyway (``sync=True``), when a task reads its loss sum, and
after :data:`MAX_PENDING` deferred steps at the latest -- which raises the
error the step would have raised, naming how far back it may lie.  Outside
a training step (scoring, evaluating) labels are checked at once.
Per thread: a task's steps and its reads run in one thread.
"""
from __future__ import annotations

import contextlib
import threading

import numpy as np

from .. import backend

__all__ = ["MAX_PENDING", "deferring", "active", "clip_labels", "resolve", "resolve_if_full", "pending"]

#: Deferred checks at most before a step resolves them (one device read per this many steps).
MAX_PENDING = 64
#: Where no label has been seen yet: the neutral start of (smallest, largest).
_EMPTY = (np.iinfo(np.int64).max, np.iinfo(np.int64).min)

_STATE = threading.local()


def _units() -> list:
    """This thread's pending checks: the classes each one's labels must lie in, in order."""
    units = getattr(_STATE, "units", None)
    if units is None:
        units = _STATE.units = []
    return units


@contextlib.contextmanager
def deferring():
    """Within: device label checks are deferred (a training step's loss)."""
    depth = getattr(_STATE, "depth", 0)
    _STATE.depth = depth + 1
    try:
        yield
    finally:
        _STATE.depth = depth


def active() -> bool:
    """Whether a device label check made now is deferred."""
    return getattr(_STATE, "depth", 0) > 0


def _slots(xp):
    """This thread's (MAX_PENDING, 2) array of (smallest, largest) rows, one
    per pending check in order, made once per device and reset by
    :func:`resolve` (two fills per :data:`MAX_PENDING` steps, not an
    allocation and a fill a step)."""
    device = None if xp is np else backend.cupy().cuda.Device().id
    if getattr(_STATE, "slots", None) is None or _STATE.slots_device != device:
        resolve()  # rows pending on another device are read first
        _STATE.slots = xp.empty((MAX_PENDING, 2), dtype=np.int64)
        _STATE.slots_device = device
        _reset(_STATE.slots)
    return _STATE.slots


def _reset(slots) -> None:
    slots[:, 0].fill(_EMPTY[0])
    slots[:, 1].fill(_EMPTY[1])


def clip_labels(labels, units: int):
    """Class labels (int64), clipped into ``[0, units)``, their range kept
    for the next :func:`resolve`: on a GPU one kernel and no read.  The
    check of a training step's labels (:func:`active`)."""
    resolve_if_full()  # a free row
    xp = backend.get_array_module(labels)
    row = _slots(xp)[len(_units())]
    if xp is np:  # the kernel's numpy twin
        row[0], row[1] = min(row[0], labels.min()), max(row[1], labels.max())
        clipped = np.clip(labels, 0, units - 1)
    else:
        from ..ops import _cuda

        clipped = _cuda.label_clip(labels, units - 1, row)
    _units().append(int(units))
    return clipped


def pending() -> int:
    """Checks waiting in this thread."""
    return len(_units())


def resolve() -> None:
    """Read every deferred verdict in one copy; raise ``ValueError`` for the
    first batch whose labels were out of range (its step trained on them
    clipped: the fit must stop).  Nothing pending: no device read."""
    units = _units()
    if not units:
        return
    checks = list(units)
    units.clear()
    values = backend.to_cpu(_STATE.slots[:len(checks)]).tolist()  # device -> host sync: the one read
    _reset(_STATE.slots)
    for back, ((low, high), limit) in enumerate(zip(values, checks)):
        if low < 0 or high >= limit:
            raise ValueError(f"Expect class labels in [0, {limit}), got values from {int(low)} to {int(high)} "
                             f"(labels on the device, checked at the first read after their step: the batch "
                             f"{len(checks) - back} training step(s) before it)")


def resolve_if_full() -> None:
    """:func:`resolve` once :data:`MAX_PENDING` checks wait."""
    if len(_units()) >= MAX_PENDING:
        resolve()
