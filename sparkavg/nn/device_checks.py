"""Checks of data already on a GPU, deferred from a training step to the next read.

Class labels that arrive on the device (a user's CuPy labels; the executors'
come from the host and are checked there) need their range checked, and
reading ``min`` and ``max`` back would make every step wait for the device.
Inside a training step (:func:`deferring`, entered by
:meth:`~sparkavg.nn.flatstate.FlatState.fit_batch`) the range is computed
on the device and the verdict waits here (:func:`defer`); the labels are
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

__all__ = ["MAX_PENDING", "deferring", "active", "defer", "clip_labels", "resolve", "resolve_if_full", "pending"]

#: Deferred checks at most before a step resolves them (one device read per this many steps).
MAX_PENDING = 64

_STATE = threading.local()


def _pending() -> list:
    items = getattr(_STATE, "pending", None)
    if items is None:
        items = _STATE.pending = []
    return items


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


def defer(low_high, units: int) -> None:
    """Keep ``low_high`` (a 2-value device array: the batch's smallest and
    largest class label) to check against ``[0, units)`` at the next
    :func:`resolve`."""
    _pending().append((low_high, int(units)))


#: Where no label has been seen yet: the neutral start of (smallest, largest).
_EMPTY = (np.iinfo(np.int64).max, np.iinfo(np.int64).min)


def _slots(xp):
    """This thread's (MAX_PENDING, 2) device array of (smallest, largest)
    rows, one per :func:`clip_labels` check in order, made once per device
    and reset by :func:`resolve` (two fills per :data:`MAX_PENDING` steps,
    not an allocation and a fill a step)."""
    device = backend.cupy().cuda.Device().id
    if getattr(_STATE, "slots", None) is None or _STATE.slots_device != device:
        resolve()  # rows pending on another device are read first
        _STATE.slots = xp.empty((MAX_PENDING, 2), dtype=np.int64)
        _STATE.slots_device = device
        _STATE.used = 0
        _reset(_STATE.slots)
    return _STATE.slots


def _reset(slots) -> None:
    slots[:, 0].fill(_EMPTY[0])
    slots[:, 1].fill(_EMPTY[1])


def clip_labels(labels, units: int):
    """Class labels on the device (int64), clipped into ``[0, units)``, their
    range deferred to the next :func:`resolve`: one kernel, no read.  The
    check of a training step's labels (:func:`active`)."""
    from ..ops import _cuda

    resolve_if_full()  # a free row
    slots = _slots(backend.get_array_module(labels))
    row = slots[_STATE.used]
    clipped = _cuda.label_clip(labels, units - 1, row)
    _STATE.used += 1
    _pending().append((row, int(units)))
    return clipped


def pending() -> int:
    """Checks waiting in this thread."""
    return len(_pending())


def resolve() -> None:
    """Read every deferred verdict in one copy; raise ``ValueError`` for the
    first batch whose labels were out of range (its step trained on them
    clipped: the fit must stop).  Nothing pending: no device read."""
    items = _pending()
    if not items:
        return
    checks = list(items)
    items.clear()
    used = getattr(_STATE, "used", 0)
    if used == len(checks):  # every check is a clip_labels row, in order: no stack
        values = backend.to_cpu(_STATE.slots[:used]).tolist()  # device -> host sync: the one read
    else:
        xp = backend.get_array_module(checks[0][0])
        values = backend.to_cpu(xp.stack([c for c, _ in checks])).tolist()  # device -> host sync: the one read
    if used:
        _reset(_STATE.slots)
        _STATE.used = 0
    for back, ((low, high), (_, units)) in enumerate(zip(values, checks)):
        if low < 0 or high >= units:
            raise ValueError(f"Expect class labels in [0, {units}), got values from {int(low)} to {int(high)} "
                             f"(labels on the device, checked at the first read after their step: the batch "
                             f"{len(checks) - back} training step(s) before it)")


def resolve_if_full() -> None:
    """:func:`resolve` once :data:`MAX_PENDING` checks wait."""
    if len(_pending()) >= MAX_PENDING:
        resolve()
