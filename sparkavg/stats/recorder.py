"""Executor side: :class:`PhaseRecorder` and the lane names of the timeline.

A recorder lives in one Spark task. It records phases
(``with rec.phase(Phase.FIT, minibatch=i): ...``), counters
(``rec.count(CounterName.BYTES_SENT, n)``), per-iteration series
(``rec.series(SeriesName.THRESHOLD, step, tau)``) and decisions, and turns
them into a payload of plain dicts, lists, strings and numbers
(:meth:`PhaseRecorder.to_payload`) that the task returns with its result.

Times come from ``time.perf_counter()`` relative to the recorder's creation;
one ``time.time()`` reading (the wall anchor) lets the driver place the
whole lane on its timeline (:mod:`.timeline`).
"""
from __future__ import annotations

import os
import socket
import time
from typing import Any, Mapping

import numpy as np

from .names import CounterName, DecisionName, Phase, SeriesName

#: Every decision name (a closed set).
_DECISIONS = frozenset(m.value for m in DecisionName)

__all__ = ["PhaseRecorder", "DRIVER_LANE", "PAYLOAD_FORMAT", "task_lane", "json_value",
           "check_decision"]

#: Lane of everything the driver records.
DRIVER_LANE = "driver"
PAYLOAD_FORMAT = "sparkavg.stats.payload/2"
#: Older payloads (series points without time) are still read.
PAYLOAD_FORMATS = (PAYLOAD_FORMAT, "sparkavg.stats.payload/1")


def task_lane(partition: int | None = None) -> str:
    """Lane name ``"host/pid/pPART"`` of a task of the calling process.

    Parameters
    ----------
    partition : int, optional
        Spark partition id (``TaskContext.get().partitionId()``); ``"p-"`` if None.
    """
    part = "-" if partition is None else int(partition)
    return f"{socket.gethostname()}/{os.getpid()}/p{part}"


def json_value(value: Any) -> Any:
    """A JSON-ready copy of ``value``: numpy scalars unwrapped, ``str``/``int``/``float``
    subclasses (enums) reduced to their base type, tuples to lists, anything else ``str``."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, (list, tuple)):
        return [json_value(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): json_value(v) for k, v in value.items()}
    return str(value)


def json_fields(fields: Mapping[str, Any] | None) -> dict | None:
    """:func:`json_value` of each field; None for no fields."""
    if not fields:
        return None
    return {str(k): json_value(v) for k, v in fields.items()}


def check_decision(name: str, value: Any, reason: str, epoch: int | None) -> dict:
    """One decision as a plain dict ``{name, value, reason, epoch}``, checked.

    Raises
    ------
    ValueError
        If ``name`` or ``reason`` is empty or not a string, or ``epoch`` is not a non-negative int.
    """
    if name not in _DECISIONS:
        raise ValueError(f"Expect a decision name among {sorted(_DECISIONS)}, got {name!r}")
    if not isinstance(reason, str) or not reason.strip():
        raise ValueError(f"Expect a non-empty reason for decision {name!r}, got {reason!r}")
    if epoch is not None and (isinstance(epoch, bool) or not isinstance(epoch, (int, np.integer)) or epoch < 0):
        raise ValueError(f"Expect epoch to be None or an int >= 0 for decision {name!r}, got {epoch!r}")
    return {"name": str.__str__(name), "value": json_value(value), "reason": str.__str__(reason),
            "epoch": None if epoch is None else int(epoch)}


class _PhaseTimer:
    """Context manager behind :meth:`PhaseRecorder.phase`; kept tiny, it runs per minibatch."""

    __slots__ = ("_events", "_anchor", "_phase", "_fields", "_start")

    def __init__(self, events: list, anchor: float, phase: str, fields: dict):
        self._events, self._anchor, self._phase, self._fields = events, anchor, phase, fields

    def __enter__(self) -> "_PhaseTimer":
        self._start = time.perf_counter()
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        end = time.perf_counter()
        fields = self._fields
        if exc_type is not None:
            fields = dict(fields, failed=exc_type.__name__)
        self._events.append((self._phase, self._start - self._anchor, end - self._start, fields or None))
        return False


class PhaseRecorder:
    """Worker-side recorder of phases, counters, series and decisions; cheap and picklable.

    Create one per Spark task, inside the task (its clocks are read at
    creation), record into it, and return :meth:`to_payload` with the
    task's result. Names must be :class:`~.names.Phase`,
    :class:`~.names.CounterName` or :class:`~.names.SeriesName` members (or
    their exact string values); anything else raises ``ValueError``.

    Parameters
    ----------
    lane : str, optional
        Lane name shown on the timeline; default :func:`task_lane` of ``partition``.
    partition : int, optional
        Partition id for the default lane name.

    Attributes
    ----------
    lane : str
    wall_anchor : float
        ``time.time()`` at creation (places the lane on the driver's timeline).
    perf_anchor : float
        ``time.perf_counter()`` at creation; meaningful in this process only.
    """

    __slots__ = ("lane", "wall_anchor", "perf_anchor", "_events", "_counters", "_series", "_decisions")

    def __init__(self, lane: str | None = None, *, partition: int | None = None):
        self.wall_anchor = time.time()
        self.perf_anchor = time.perf_counter()
        self.lane = str(lane) if lane is not None else task_lane(partition)
        self._events: list[tuple] = []
        self._counters: dict[str, float] = {}
        self._series: dict[str, list[list]] = {}
        self._decisions: list[dict] = []

    def phase(self, name: Phase | str, **fields: Any) -> _PhaseTimer:
        """Time the ``with`` block as phase ``name``; ``fields`` (plain values) go with it.

        If the block raises, the event is still recorded with ``failed=<ExceptionName>``.
        """
        return _PhaseTimer(self._events, self.perf_anchor, Phase.check(name), fields)

    def add(self, phase: Phase | str, start: float, duration: float, **fields: Any) -> None:
        """Record a phase timed elsewhere.

        Parameters
        ----------
        phase : Phase or str
        start : float
            A ``time.perf_counter()`` reading taken in this process.
        duration : float
            Seconds, >= 0.
        """
        name = Phase.check(phase)
        if not duration >= 0:
            raise ValueError(f"Expect duration >= 0 seconds for phase {name!r}, got {duration}")
        self._events.append((name, float(start) - self.perf_anchor, float(duration), fields or None))

    def count(self, name: CounterName | str, value: float = 1) -> None:
        """Add ``value`` to counter ``name`` (bytes, messages, examples ...)."""
        key = CounterName.check(name)
        self._counters[key] = self._counters.get(key, 0) + value

    def series(self, name: SeriesName | str, step: int, value: float) -> None:
        """Append ``(step, value)`` to series ``name``; ``step`` should be a global iteration number.

        The time of the call is kept too (trace export places the point with it).
        """
        key = SeriesName.check(name)
        points = self._series.get(key)
        if points is None:
            points = self._series[key] = []
        points.append([step, value, time.perf_counter() - self.perf_anchor])

    def decision(self, name: str, value: Any, reason: str, epoch: int | None = None) -> None:
        """Record a choice made in this task (e.g. ``"device"``, ``"cpu"``, ``"no GPU assigned"``).

        The driver keeps one copy of identical worker decisions (see
        :meth:`~.training_stats.TrainingStats.add_worker_payload`).
        """
        self._decisions.append(check_decision(name, value, reason, epoch))

    def __len__(self) -> int:
        return len(self._events)

    def to_payload(self) -> dict:
        """Everything recorded, as plain dicts/lists/str/float/int (no custom classes).

        Call it in the process that created the recorder (it reads the
        elapsed time since creation).

        Returns
        -------
        dict
            Keys ``format``, ``lane``, ``wall_anchor``, ``elapsed``, ``events``
            (``[phase, start, duration, fields|None]`` rows, seconds since
            creation), ``counters``, ``series`` (``name -> [[step, value,
            seconds since creation], ...]``) and ``decisions`` (dicts).
        """
        elapsed = time.perf_counter() - self.perf_anchor
        events = [[p, float(s), float(d), json_fields(f)] for p, s, d, f in self._events]
        if events:
            elapsed = max(elapsed, max(s + d for _, s, d, _ in events))
        return {
            "format": PAYLOAD_FORMAT,
            "lane": self.lane,
            "wall_anchor": float(self.wall_anchor),
            "elapsed": float(elapsed),
            "events": events,
            "counters": {k: json_value(v) for k, v in self._counters.items()},
            "series": {k: [[json_value(s), json_value(v), float(t)] for s, v, t in pts]
                       for k, pts in self._series.items()},
            "decisions": [dict(d) for d in self._decisions],
        }

