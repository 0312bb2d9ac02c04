"""Chrome trace-event JSON of a :class:`~.timeline.Recording`, for Perfetto or ``chrome://tracing``.

The Trace Event Format (JSON object form, ``{"traceEvents": [...]}``):

* one process (``pid``) per host, named by ``"M"`` ``process_name``
  events; the driver is a process of its own;
* one thread (``tid``) per lane, named by ``thread_name`` events and sorted
  like the HTML timeline; should a lane hold phases that overlap without
  nesting, the ones that do not fit go to extra threads ``"<lane> #2"`` ...
  so that every thread's ``"X"`` slices nest properly;
* ``"X"`` complete events for phases (category: compute, overhead, span,
  not training) and for worker tasks (category ``task``), times in
  microseconds since the stats' origin, epoch/round/fields in ``args``;
* ``"C"`` counter events for series points that carry a time, one counter
  track per series and lane, in the lane's process;
* counters, decisions and the summary under ``otherData``.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from .analysis import Analysis
from .export import strict_json
from .names import phase_kind
from .timeline import Recording, extent, lane_host, ordered_lanes

__all__ = ["to_trace", "write_trace", "TRACE_FORMAT"]

TRACE_FORMAT = "sparkavg.stats.trace/1"


def _us(seconds: float) -> float:
    return round(seconds * 1e6, 3)


def _pack(items: list[tuple[float, float, dict]]) -> list[int]:
    """Sub-track of each ``(start, end, event)`` (sorted by start, longest first) so that every
    sub-track nests properly: an event either contains or follows each earlier one."""
    tracks: list[list[float]] = []  # per sub-track, the end times of the slices still open
    placed = []
    for start, end, _ in items:
        for k, open_ends in enumerate(tracks):
            while open_ends and open_ends[-1] <= start:
                open_ends.pop()
            if not open_ends or end <= open_ends[-1]:
                open_ends.append(end)
                placed.append(k)
                break
        else:
            tracks.append([end])
            placed.append(len(tracks) - 1)
    return placed


def to_trace(recording: Recording, analysis: Analysis | None = None) -> dict:
    """The trace as a JSON-ready dict ``{"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}``.

    Times start at 0 at the stats' origin (or at the earliest event, if a
    worker lane was placed before it).
    """
    a = Analysis(recording) if analysis is None else analysis
    span = extent(recording.events, recording.tasks)
    shift = min(0.0, span[0]) if span else 0.0
    lanes = ordered_lanes(recording.events, recording.tasks)
    pids: dict[str, int] = {}
    for lane in lanes:
        pids.setdefault(lane_host(lane), len(pids) + 1)
    meta: list[dict] = []
    for host, pid in pids.items():
        meta.append({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": host}})
        meta.append({"ph": "M", "name": "process_sort_index", "pid": pid, "args": {"sort_index": pid}})

    items: dict[str, list[tuple[float, float, dict]]] = {lane: [] for lane in lanes}
    for t in recording.tasks:
        args = {"epoch": t.epoch, "round": t.round, "clock_correction_s": t.clock_correction}
        items[t.lane].append((_us(t.start - shift), _us(t.end - shift),
                              {"name": "task", "cat": "task", "args": _drop_none(args)}))
    for e in recording.events:
        args = dict(e.fields or {}, epoch=e.epoch, round=e.round)
        items[e.lane].append((_us(e.start - shift), _us(e.end - shift),
                              {"name": e.phase, "cat": phase_kind(e.phase), "args": _drop_none(args)}))

    slices: list[dict] = []
    tid = 0
    for lane in lanes:
        pid = pids[lane_host(lane)]
        lane_items = sorted(items[lane], key=lambda it: (it[0], -it[1]))
        placed = _pack(lane_items)
        tids = []
        for k in range(max(placed, default=0) + 1):
            tid += 1
            tids.append(tid)
            meta.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                         "args": {"name": lane if k == 0 else f"{lane} #{k + 1}"}})
            meta.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": tid}})
        for (start, end, event), k in zip(lane_items, placed):
            slices.append({**event, "ph": "X", "ts": start, "dur": round(end - start, 3), "pid": pid,
                           "tid": tids[k]})

    counters = []
    for name, by_lane in recording.series.items():
        for lane, points in by_lane.items():
            pid = pids.setdefault(lane_host(lane), len(pids) + 1)
            for _, value, t in points:
                if t is not None and _finite_number(value):
                    counters.append({"ph": "C", "name": f"{name} ({lane})", "ts": _us(t - shift), "pid": pid,
                                     "args": {name: value}})
    counters.sort(key=lambda c: c["ts"])
    return {
        "traceEvents": meta + slices + counters,
        "displayTimeUnit": "ms",
        "otherData": {
            "format": TRACE_FORMAT,
            "origin_wall": recording.origin_wall,
            "time_shift_s": shift,
            "counters": {k: v if _finite_number(v) else None for k, v in recording.counters.items()},
            "decisions": strict_json(recording.decisions),
            "summary": a.summary(),
        },
    }


def write_trace(data: dict, path: str | Path) -> Path:
    """Write a :func:`to_trace` result as strict JSON to ``path``; returns the path."""
    path = Path(path)
    path.write_text(json.dumps(data, allow_nan=False, separators=(",", ":")), encoding="utf-8")
    return path


def _drop_none(args: dict) -> dict:
    return {k: strict_json(v) for k, v in args.items() if v is not None}


def _finite_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
