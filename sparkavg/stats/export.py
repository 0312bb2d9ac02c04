"""JSON and CSV export of a :class:`~.timeline.Recording`, and JSON import.

The JSON is strict (non-finite numbers become ``null``; NaN series values
come back as NaN) and carries a ``derived`` section (totals, verdict,
summary) for readers that do not load it back; :func:`from_dict` ignores it.
Format ``sparkavg.stats/2`` adds ``decisions`` and a time per series point;
``sparkavg.stats/1`` files still load.
"""
from __future__ import annotations

import csv
import json
import math
import re
import time
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from .analysis import Analysis, format_value
from .timeline import Event, Recording, Task, ordered_lanes

__all__ = ["STATS_FORMAT", "strict_json", "to_dict", "from_dict", "to_json", "from_json", "to_csv"]

STATS_FORMAT = "sparkavg.stats/2"
_READABLE = (STATS_FORMAT, "sparkavg.stats/1")


def _json_number(value: Any) -> Any:
    """Strict-JSON value: non-finite floats become None (read back as NaN in series)."""
    if isinstance(value, (float, np.floating)):
        return float(value) if math.isfinite(value) else None
    return value


def strict_json(value: Any) -> Any:
    """``value`` with every non-finite float, in lists and dicts too, replaced by None."""
    if isinstance(value, list):
        return [strict_json(v) for v in value]
    if isinstance(value, dict):
        return {k: strict_json(v) for k, v in value.items()}
    return _json_number(value)


def _finite_or_none(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def to_dict(recording: Recording, analysis: Analysis | None = None) -> dict:
    """Plain, JSON-ready dict of everything recorded plus a ``derived`` section.

    Parameters
    ----------
    recording : Recording
    analysis : Analysis, optional
        Of ``recording``; made here if not given.
    """
    a = Analysis(recording) if analysis is None else analysis
    lanes = ordered_lanes(recording.events, recording.tasks)
    index = {lane: i for i, lane in enumerate(lanes)}
    regime, _ = a.verdict()
    return {
        "format": STATS_FORMAT,
        "origin_wall": recording.origin_wall,
        "workers": recording.workers,
        "train_seconds_set": recording.train_seconds,
        "lanes": lanes,
        "events": [[index[e.lane], e.phase, e.start, e.duration, e.epoch, e.round, strict_json(e.fields)]
                   for e in recording.events],
        "tasks": [[index[t.lane], t.start, t.end, t.epoch, t.round, t.clock_correction] for t in recording.tasks],
        "counters": {k: _json_number(v) for k, v in recording.counters.items()},
        "series": {name: {lane: [[s, _json_number(v), t] for s, v, t in pts] for lane, pts in by.items()}
                   for name, by in recording.series.items()},
        "decisions": [strict_json(d) for d in recording.decisions],
        "derived": {
            "phase_totals": a.phase_totals(),
            "train_seconds": a.train_seconds,
            "examples": a.examples,
            "examples_per_second": a.examples_per_second,
            "compute_seconds": a.compute_seconds,
            "overhead_seconds": a.overhead_seconds,
            "compute_overhead_ratio": _finite_or_none(a.compute_overhead_ratio),
            "utilisation": a.utilisation,
            "mean_iteration_seconds": a.mean_iteration_seconds,
            "regime": regime.value,
            "compression_ratio": a.compression_ratio,
            "datagrams": a.datagrams,
            "max_clock_correction": a.max_clock_correction,
            "summary": a.summary(),
        },
    }


def from_dict(data: Mapping[str, Any]) -> Recording:
    """Rebuild a recording from :func:`to_dict` output (JSON-decoded or not; format 1 or 2).

    Names are not checked against the enums: files written before they existed still load.
    """
    if data.get("format") not in _READABLE:
        raise ValueError(f"Expect a TrainingStats.to_dict() dict (format {STATS_FORMAT!r}), "
                         f"got {data.get('format')!r}")
    lanes = data["lanes"]
    series = {}
    for name, by in data["series"].items():
        series[name] = {lane: [[p[0], math.nan if p[1] is None else p[1], p[2] if len(p) > 2 else None]
                               for p in pts] for lane, pts in by.items()}
    return Recording(
        origin_wall=float(data["origin_wall"]),
        origin_perf=time.perf_counter(),
        workers=data.get("workers"),
        train_seconds=data.get("train_seconds_set"),
        events=[Event(lanes[li], p, float(s), float(d), ep, rd, f) for li, p, s, d, ep, rd, f in data["events"]],
        tasks=[Task(lanes[li], float(s), float(e), ep, rd, float(c)) for li, s, e, ep, rd, c in data["tasks"]],
        counters=dict(data["counters"]),
        series=series,
        decisions=[{"name": d["name"], "value": d["value"], "reason": d["reason"], "epoch": d.get("epoch")}
                   for d in data.get("decisions", ())],
    )


def _json_default(obj: Any) -> Any:
    if isinstance(obj, np.generic):
        return obj.item()
    return str(obj)


def to_json(data: dict, path: str | Path | None = None, *, indent: int | None = None) -> str:
    """Strict JSON text of a :func:`to_dict` result; written to ``path`` if given."""
    text = json.dumps(data, indent=indent, allow_nan=False, default=_json_default)
    if path is not None:
        Path(path).write_text(text, encoding="utf-8")
    return text


def from_json(text_or_path: str | Path) -> Recording:
    """Inverse of :func:`to_json`: JSON text, or a path to a file holding it."""
    text = str(text_or_path)
    if not text.lstrip().startswith("{"):
        text = Path(text_or_path).read_text(encoding="utf-8")
    return from_dict(json.loads(text))


def _blank(value: Any) -> Any:
    return "" if value is None else value


def _write_csv(path: Path, header: list[str], rows) -> Path:
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def to_csv(recording: Recording, directory: str | Path, analysis: Analysis | None = None) -> list[Path]:
    """Write ``phase_<name>.csv`` per phase (one row per event, like DL4J's
    per-phase files), ``phase_totals.csv``, ``counters.csv``, ``series.csv``
    and ``decisions.csv``.

    Returns
    -------
    list of Path
        The files written.
    """
    a = Analysis(recording) if analysis is None else analysis
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    by_phase: dict[str, list[Event]] = {}
    for e in recording.events:
        by_phase.setdefault(e.phase, []).append(e)
    used: set[str] = set()
    for phase, events in by_phase.items():
        slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", phase).strip("._") or "phase"
        while slug in used:
            slug += "_"
        used.add(slug)
        keys = sorted({k for e in events if e.fields for k in e.fields})
        rows = ([e.lane, e.phase, _blank(e.epoch), _blank(e.round), f"{e.start:.6f}", f"{e.end:.6f}",
                 f"{e.duration:.6f}", *(_blank((e.fields or {}).get(k)) for k in keys)] for e in events)
        written.append(_write_csv(out / f"phase_{slug}.csv",
                                  ["lane", "phase", "epoch", "round", "start_s", "end_s", "duration_s", *keys], rows))
    written.append(_write_csv(out / "phase_totals.csv", ["phase", "count", "total_s", "mean_s", "p50_s", "p95_s",
                                                         "max_s"],
                              ([p, t["count"], t["total"], t["mean"], t["p50"], t["p95"], t["max"]]
                               for p, t in a.phase_totals().items())))
    written.append(_write_csv(out / "counters.csv", ["counter", "value"], sorted(recording.counters.items())))
    written.append(_write_csv(out / "series.csv", ["series", "lane", "step", "value", "time_s"],
                              ([name, lane, s, v, "" if t is None else f"{t:.6f}"]
                               for name, by in recording.series.items() for lane, pts in by.items()
                               for s, v, t in pts)))
    written.append(_write_csv(out / "decisions.csv", ["name", "value", "epoch", "reason"],
                              ([d["name"], format_value(d["value"]), _blank(d["epoch"]), d["reason"]]
                               for d in recording.decisions)))
    return written
