"""Everything a :class:`~.training_stats.TrainingStats` has recorded, as plain data.

:class:`Recording` is the one thing the readers below the facade take:
analysis, JSON/CSV export, the trace and the HTML page.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .timeline import Event, PlacedPayload, Task

__all__ = ["Recording"]


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
