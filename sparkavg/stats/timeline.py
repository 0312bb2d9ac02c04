"""The driver's timeline: events, tasks, lanes, clock alignment, and
:class:`Recording` -- everything recorded on it, the one thing the readers
below the facade take (analysis, JSON/CSV export, the trace, the HTML page).

Every event belongs to a *lane*: ``"driver"`` or a worker lane such as
``"host/pid/p3"`` (:func:`~.recorder.task_lane`). Within a lane, times come
from ``time.perf_counter()`` (monotonic, high resolution) relative to the
moment its recorder was created, so clock skew or an NTP step can never
reorder or stretch events within a lane. Each recorder also takes one
wall-clock anchor (``time.time()`` at creation).

On the driver all times are seconds since the stats were created (the
*origin*). Driver events map through the driver's own ``perf_counter``; a
worker payload is placed by its wall anchor: the task's start sits at
``wall_anchor - origin_wall``. The whole lane is shifted as one block, so
only its offset can be wrong, by the clock difference between the two
machines. When the driver also passes ``launched`` / ``returned`` (its own
``perf_counter`` readings around the Spark job), the offset is clamped so
that the task lies inside that window: a task cannot start before it was
launched nor end after its result came back. The correction applied is kept
per task (:attr:`Task.clock_correction`). No synchronised clocks (no NTP
server) are required.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, NamedTuple, Sequence

from .names import CounterName, Phase, SeriesName
from .recorder import DRIVER_LANE, PAYLOAD_FORMAT, PAYLOAD_FORMATS

__all__ = ["Event", "Task", "PlacedPayload", "place_payload", "ordered_lanes", "peak_concurrency",
           "extent", "lane_host", "Recording"]

logger = logging.getLogger(__name__)


class Event(NamedTuple):
    """One timed phase on the driver's timeline (seconds since the stats' origin)."""

    lane: str
    phase: str
    start: float
    duration: float
    epoch: int | None = None
    round: int | None = None
    fields: dict | None = None

    @property
    def end(self) -> float:
        return self.start + self.duration


class Task(NamedTuple):
    """The span of one worker payload (one Spark task) on the driver's timeline."""

    lane: str
    start: float
    end: float
    epoch: int | None = None
    round: int | None = None
    clock_correction: float = 0.0


class PlacedPayload(NamedTuple):
    """A worker payload moved onto the driver's timeline by :func:`place_payload`."""

    task: Task
    events: list[Event]
    counters: dict[str, Any]
    #: ``name -> [[step, value, time on the timeline or None], ...]``
    series: dict[str, list[list]]
    decisions: list[dict]


def _check_payload(payload: Any) -> None:
    if not isinstance(payload, Mapping) or payload.get("format") not in PAYLOAD_FORMATS:
        got = payload.get("format") if isinstance(payload, Mapping) else type(payload).__name__
        raise ValueError(f"Expect a PhaseRecorder.to_payload() dict (format {PAYLOAD_FORMAT!r}), got {got!r}")
    lane = payload.get("lane")
    try:
        for name in {e[0] for e in payload["events"]}:
            Phase.check(name)
        for name in payload["counters"]:
            CounterName.check(name)
        for name in payload["series"]:
            SeriesName.check(name)
    except ValueError as exc:
        raise ValueError(f"Payload of lane {lane!r}: {exc}") from None


def place_payload(payload: Mapping[str, Any], origin_wall: float, origin_perf: float, *,
                  epoch: int | None = None, round: int | None = None, launched: float | None = None,
                  returned: float | None = None) -> PlacedPayload:
    """Place one :meth:`~.recorder.PhaseRecorder.to_payload` result on the timeline (see module doc).

    Parameters
    ----------
    payload : dict
        As returned by the task (after crossing Spark).
    origin_wall, origin_perf : float
        ``time.time()`` and ``time.perf_counter()`` of the timeline's origin (driver).
    epoch, round : int, optional
        Attached to every event of the payload.
    launched, returned : float, optional
        Driver ``time.perf_counter()`` readings just before the Spark job was
        started and just after its results came back.

    Raises
    ------
    ValueError
        If ``payload`` is not a recorder payload or uses a name outside the enums.
    """
    _check_payload(payload)
    lane = str(payload["lane"])
    elapsed = float(payload["elapsed"])
    naive = float(payload["wall_anchor"]) - origin_wall
    origin = naive
    if returned is not None:
        origin = min(origin, returned - origin_perf - elapsed)
    if launched is not None:
        origin = max(origin, launched - origin_perf)
    correction = origin - naive
    if abs(correction) > 0.05:
        logger.debug("lane %s: clock offset corrected by %.3f s into the job window", lane, correction)
    events = [Event(lane, str(p), origin + s, d, epoch, round, f) for p, s, d, f in payload["events"]]
    series = {str(name): [[p[0], p[1], origin + p[2] if len(p) > 2 and p[2] is not None else None]
                          for p in points]
              for name, points in payload["series"].items()}
    return PlacedPayload(Task(lane, origin, origin + elapsed, epoch, round, correction), events,
                         {str(k): v for k, v in payload["counters"].items()}, series,
                         [dict(d) for d in payload.get("decisions", ())])


def ordered_lanes(events: Iterable[Event], tasks: Iterable[Task]) -> list[str]:
    """Lane names: the driver first (if it has events), then workers sorted."""
    names = {e.lane for e in events} | {t.lane for t in tasks}
    return ([DRIVER_LANE] if DRIVER_LANE in names else []) + sorted(names - {DRIVER_LANE})


def peak_concurrency(tasks: Sequence[Task]) -> int:
    """The most tasks running at one instant (a task ending as another starts does not overlap it)."""
    marks = sorted([(t.start, 1) for t in tasks] + [(t.end, -1) for t in tasks])  # ends sort before starts
    running = peak = 0
    for _, step in marks:
        running += step
        peak = max(peak, running)
    return peak


def extent(events: Sequence[Event], tasks: Sequence[Task]) -> tuple[float, float] | None:
    """``(first start, last end)`` over events and tasks; None if there are none."""
    starts = [e.start for e in events] + [t.start for t in tasks]
    ends = [e.end for e in events] + [t.end for t in tasks]
    return (min(starts), max(ends)) if starts else None


def lane_host(lane: str) -> str:
    """The host part of a ``"host/pid/pPART"`` lane; other lanes (``"driver"``) are their own host."""
    parts = lane.rsplit("/", 2)
    return parts[0] if len(parts) == 3 and parts[0] else lane


@dataclass
class Recording:
    """Raw statistics on the driver's timeline (times in seconds since the origin).

    Attributes
    ----------
    origin_wall, origin_perf : float
        ``time.time()`` and ``time.perf_counter()`` of the origin (driver process).
    workers : int or None
        Concurrent workers, if given by the user.
    train_seconds : float or None
        Training wall time, if set explicitly.
    events : list of Event
    tasks : list of Task
    counters : dict
        ``name -> value`` summed over lanes.
    series : dict
        ``name -> lane -> [[step, value, time or None], ...]``.
    decisions : list of dict
        ``{name, value, reason, epoch}`` in the order they were made.
    """

    origin_wall: float
    origin_perf: float
    workers: int | None = None
    train_seconds: float | None = None
    events: list[Event] = field(default_factory=list)
    tasks: list[Task] = field(default_factory=list)
    counters: dict[str, float] = field(default_factory=dict)
    series: dict[str, dict[str, list[list]]] = field(default_factory=dict)
    decisions: list[dict] = field(default_factory=list)

    def merge(self, placed: PlacedPayload) -> None:
        """Add one placed worker payload. A worker decision equal to one already held is not repeated
        (every task of a job tends to decide the same thing)."""
        self.events.extend(placed.events)
        self.tasks.append(placed.task)
        for name, value in placed.counters.items():
            self.counters[name] = self.counters.get(name, 0) + value
        lane = placed.task.lane
        for name, points in placed.series.items():
            self.series.setdefault(name, {}).setdefault(lane, []).extend(points)
        for decision in placed.decisions:
            if decision not in self.decisions:
                self.decisions.append(decision)

    def snapshot(self) -> "Recording":
        """A copy whose containers can be read while this one keeps growing."""
        return Recording(self.origin_wall, self.origin_perf, self.workers, self.train_seconds,
                         list(self.events), list(self.tasks), dict(self.counters),
                         {n: {lane: list(pts) for lane, pts in by.items()}
                          for n, by in self.series.items()},
                         [dict(d) for d in self.decisions])
