"""One self-contained HTML page for :class:`~sparkavg.spark.stats.TrainingStats`.

Everything is inline (SVG and CSS, no script, no external reference of any
kind), every piece of recorded text goes through :func:`html.escape`, and the
page stays small for large runs: the timeline draws at most ``max_bars``
bars (lanes with too many events are binned in time) and each series line at
most ``max_points`` points.
"""
from __future__ import annotations

import html
import logging
import math
import time
import zlib
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from .stats import (COMPUTE_PHASES, DRIVER_LANE, NON_TRAINING_PHASES, SPAN_PHASES, Phase,
                    format_seconds)

if TYPE_CHECKING:
    from .stats import TrainingStats

__all__ = ["render_html", "phase_colour", "PHASE_COLOURS"]

logger = logging.getLogger(__name__)

PHASE_COLOURS = {
    Phase.FIT: "#4e79a7", Phase.BROADCAST: "#f28e2b", Phase.AGGREGATE: "#e15759",
    Phase.AVERAGE: "#76b7b2", Phase.EXPORT: "#59a14f", Phase.CHECKPOINT: "#edc948",
    Phase.EVALUATE: "#b07aa1", Phase.FETCH: "#ff9da7", Phase.MODEL_INIT: "#9c755f",
    Phase.DATA_LOAD: "#bab0ac", Phase.ENCODE: "#8cd17d", Phase.SEND: "#d4a017",
    Phase.APPLY: "#499894", Phase.IDLE: "#d7d7d7", Phase.WAIT: "#c0c0c0",
    Phase.ROUND: "#a0cbe8", Phase.EPOCH: "#ffbe7d", "task": "#cfd8dc",
}
_PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
            "#7f7f7f", "#bcbd22", "#17becf", "#393b79", "#637939", "#8c6d31", "#843c39")

_LABEL_W, _PLOT_W, _ROW_H, _STRIP_H, _BAR_H, _AXIS_H = 200, 1000, 22, 5, 13, 26
_MAX_LANE_ROWS = 200

_CSS = """
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222;max-width:1300px}
h1{font-size:1.4em}h2{font-size:1.15em;margin-top:1.6em;border-bottom:1px solid #ddd}
p.summary{background:#f6f8fa;padding:.8em;border-left:4px solid #4e79a7;line-height:1.45}
table{border-collapse:collapse;font-size:.85em}td,th{border:1px solid #ddd;padding:2px 8px;text-align:right}
td:first-child,th:first-child{text-align:left}.note{color:#666;font-size:.85em}
.legend span{display:inline-block;margin-right:1em;font-size:.85em}
.legend i{display:inline-block;width:.9em;height:.9em;margin-right:.3em;vertical-align:middle}
.charts{display:flex;flex-wrap:wrap;gap:1em}.chart{font-size:.8em}
svg text{font-size:11px;font-family:system-ui,sans-serif}
"""


def _esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def phase_colour(phase: str) -> str:
    """Fixed colour for the recommended phases, a stable palette colour otherwise."""
    colour = PHASE_COLOURS.get(phase)
    if colour is None:
        colour = _PALETTE[zlib.crc32(phase.encode("utf-8", "replace")) % len(_PALETTE)]
    return colour


def _nice_ticks(lo: float, hi: float, n: int = 8) -> list[float]:
    span = hi - lo
    if not span > 0:
        return [lo]
    raw = span / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step) + 1)]


def _short(label: str, limit: int = 30) -> str:
    return label if len(label) <= limit else label[: limit - 1] + "\u2026"


def _rect(x: float, y: float, w: float, h: float, fill: str, title: str, cls: str,
          opacity: float = 1.0) -> str:
    op = f' fill-opacity="{opacity:.2f}"' if opacity < 0.995 else ""
    if cls == "s":  # adjacent rounds/tasks touch: a hairline keeps them apart
        op += ' stroke="#fff" stroke-width="0.5"'
    return (f'<rect class="{cls}" x="{x:.1f}" y="{y:.1f}" width="{max(w, 0.5):.1f}" height="{h}" '
            f'fill="{fill}"{op}><title>{_esc(title)}</title></rect>')


def _lane_bars(starts: np.ndarray, durs: np.ndarray, kinds: Sequence[str], titles, budget: int,
               t0: float, t1: float, y: float, h: float, cls: str) -> tuple[list[str], bool]:
    """Bars of one lane row: one per item, or at most ``budget`` time bins if there are more items."""
    scale = _PLOT_W / (t1 - t0)
    n = len(starts)
    if n <= budget:
        return [_rect(_LABEL_W + (starts[i] - t0) * scale, y, durs[i] * scale, h, phase_colour(kinds[i]),
                      titles(i), cls) for i in range(n)], False
    nb = max(1, min(budget, _PLOT_W))
    width = (t1 - t0) / nb
    names = sorted(set(kinds))
    k = np.fromiter((names.index(x) for x in kinds), dtype=np.intp, count=n) if len(names) > 1 \
        else np.zeros(n, dtype=np.intp)
    ends = starts + durs
    b0 = np.clip(((starts - t0) / width).astype(np.intp), 0, nb - 1)
    b1 = np.clip(((ends - t0) / width).astype(np.intp), 0, nb - 1)
    busy = np.zeros((len(names), nb))
    count = np.zeros((len(names), nb), dtype=np.int64)
    np.add.at(count, (k, b0), 1)
    single = b0 == b1
    np.add.at(busy, (k[single], b0[single]), durs[single])
    for j in np.flatnonzero(~single):  # items spanning bins: split by overlap
        for b in range(b0[j], b1[j] + 1):
            lo, hi = t0 + b * width, t0 + (b + 1) * width
            busy[k[j], b] += max(0.0, min(ends[j], hi) - max(starts[j], lo))
    total = busy.sum(axis=0)
    bars = []
    for b in np.flatnonzero((total > 0) | (count.sum(axis=0) > 0)):
        lo = t0 + b * width
        occupancy = min(1.0, total[b] / width)
        order = np.argsort(-busy[:, b])
        mix = ", ".join(f"{names[i]} {format_seconds(busy[i, b])} ({count[i, b]} started)"
                        for i in order[:4] if busy[i, b] > 0 or count[i, b] > 0)
        title = f"{lo:.3f}-{lo + width:.3f} s: {occupancy:.0%} busy; {mix}"
        bars.append(_rect(_LABEL_W + b * width * scale, y, width * scale, h, phase_colour(names[order[0]]),
                          title, cls, 0.3 + 0.7 * occupancy))
    return bars, True


def _event_title(e) -> str:
    parts = [e.lane, e.phase, f"start {e.start:.4f} s", format_seconds(e.duration)]
    if e.epoch is not None:
        parts.append(f"epoch {e.epoch}")
    if e.round is not None:
        parts.append(f"round {e.round}")
    if e.fields:
        parts.extend(f"{k}={v}" for k, v in e.fields.items())
    return " \u00b7 ".join(parts)


def _timeline(stats: "TrainingStats", max_bars: int) -> str:
    lanes = stats.lanes
    events, tasks = stats.events, stats.tasks
    if not lanes:
        return '<p class="note">No events recorded.</p>'
    t0 = min([e.start for e in events] + [t.start for t in tasks])
    t1 = max([e.end for e in events] + [t.end for t in tasks])
    t1 = t1 if t1 > t0 else t0 + 1e-3
    main: dict[str, list] = {lane: [] for lane in lanes}
    strip: dict[str, list] = {lane: [] for lane in lanes}
    for e in events:
        (strip if e.phase in SPAN_PHASES else main)[e.lane].append(e)
    task_rows: dict[str, list] = {lane: [] for lane in lanes}
    for t in tasks:
        task_rows[t.lane].append(t)
    n_main = sum(map(len, main.values()))
    n_strip = sum(len(strip[lane]) + len(task_rows[lane]) for lane in lanes)
    strip_cap = max(1, max_bars // 5)
    main_budget = n_main if n_main <= max_bars else max(1, max_bars // len(lanes))
    strip_budget = n_strip if n_strip <= strip_cap else max(1, strip_cap // len(lanes))

    height = _AXIS_H + len(lanes) * _ROW_H + 4
    width = _LABEL_W + _PLOT_W + 10
    out = [f'<svg width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
           f'aria-label="timeline">']
    scale = _PLOT_W / (t1 - t0)
    for tick in _nice_ticks(t0, t1):
        x = _LABEL_W + (tick - t0) * scale
        out.append(f'<line x1="{x:.1f}" y1="{_AXIS_H - 6}" x2="{x:.1f}" y2="{height}" stroke="#eee"/>'
                   f'<text x="{x:.1f}" y="{_AXIS_H - 10}" text-anchor="middle">{tick:g} s</text>')
    binned_main = binned_strip = 0
    for row, lane in enumerate(lanes):
        y = _AXIS_H + row * _ROW_H
        out.append(f'<text x="4" y="{y + _STRIP_H + _BAR_H - 2}">{_esc(_short(lane))}<title>{_esc(lane)}</title></text>')
        items = main[lane]
        bars, binned = _lane_bars(np.array([e.start for e in items]), np.array([e.duration for e in items]),
                                  [e.phase for e in items], lambda i, items=items: _event_title(items[i]),
                                  main_budget, t0, t1, y + _STRIP_H + 1, _BAR_H, "b")
        binned_main += binned
        out.extend(bars)
        spans = [(t.start, t.end - t.start, "task",
                  f"{lane} \u00b7 task {format_seconds(t.end - t.start)} \u00b7 epoch {t.epoch} round {t.round}"
                  f" \u00b7 clock correction {t.clock_correction:+.3f} s") for t in task_rows[lane]]
        spans += [(e.start, e.duration, e.phase, _event_title(e)) for e in strip[lane]]
        bars, binned = _lane_bars(np.array([s[0] for s in spans]), np.array([s[1] for s in spans]),
                                  [s[2] for s in spans], lambda i, spans=spans: spans[i][3],
                                  strip_budget, t0, t1, y, _STRIP_H, "s")
        binned_strip += binned
        out.extend(bars)
    out.append("</svg>")

    present = sorted({e.phase for e in events} | ({"task"} if tasks else set()),
                     key=lambda p: (p in SPAN_PHASES or p == "task", p))
    legend = "".join(f'<span><i style="background:{phase_colour(p)}"></i>{_esc(p)}'
                     f'{" (thin strip)" if p in SPAN_PHASES or p == "task" else ""}</span>' for p in present)
    notes = []
    if binned_main:
        notes.append(f"{n_main:,} phase events exceed the cap of {max_bars:,} bars: {binned_main} lane(s) with "
                     f"more than {main_budget:,} events are drawn as at most {min(main_budget, _PLOT_W):,} time bins "
                     "each, coloured by the phase that dominates the bin, opacity = busy fraction; hover a bin "
                     "for its mix.")
    if binned_strip:
        notes.append(f"{n_strip:,} task/round/epoch spans exceed {strip_cap:,}: {binned_strip} lane strip(s) binned.")
    note_html = "".join(f'<p class="note">{_esc(n)}</p>' for n in notes)
    return (f'<div class="legend">{legend}</div><p class="note">One row per lane; the thin strip above each '
            f'row shows worker tasks (payload spans) and driver rounds/epochs. Times are seconds since the stats '
            f'were created; worker lanes are placed by their wall-clock anchor (see module docs). Hover for '
            f'details.</p>{note_html}' + "".join(out))


def _histogram(phase: str, d: np.ndarray) -> str:
    w, h, left, bottom, nbins = 320, 130, 34, 30, 30
    lo, hi = float(d.min()), float(d.max())
    log = lo > 0 and hi / lo > 50
    if not hi > lo:
        edges = np.array([lo, lo + max(abs(lo) * 1e-3, 1e-9)])
    elif log:
        edges = np.geomspace(lo, hi, nbins + 1)
    else:
        edges = np.linspace(lo, hi, nbins + 1)
    counts, _ = np.histogram(np.clip(d, edges[0], edges[-1]), bins=edges)
    top = max(int(counts.max()), 1)
    bw = (w - left - 6) / len(counts)
    colour = phase_colour(phase)
    out = [f'<div class="chart"><b>{_esc(phase)}</b> ({d.size:,} events{", log-spaced bins" if log else ""})<br>'
           f'<svg width="{w}" height="{h}" viewBox="0 0 {w} {h}">',
           f'<text x="2" y="12">{top}</text><text x="2" y="{h - bottom}">0</text>']
    for i, c in enumerate(counts):
        if c:
            bh = (h - bottom - 8) * c / top
            out.append(_rect(left + i * bw, h - bottom - bh, bw - 0.5, round(bh, 1), colour,
                             f"{format_seconds(edges[i])} - {format_seconds(edges[i + 1])}: {c:,}", "h"))
    out.append(f'<line x1="{left}" y1="{h - bottom}" x2="{w - 6}" y2="{h - bottom}" stroke="#999"/>'
               f'<text x="{left}" y="{h - bottom + 14}">{_esc(format_seconds(lo))}</text>'
               f'<text x="{w - 6}" y="{h - bottom + 14}" text-anchor="end">{_esc(format_seconds(hi))}</text>'
               '</svg></div>')
    return "".join(out)


def _series_chart(name: str, by_lane: dict[str, list], max_points: int) -> str:
    w, h, left, right, top_m, bottom = 620, 230, 70, 10, 10, 30
    lines, downsampled = {}, False
    for lane, pts in by_lane.items():
        try:
            a = np.asarray([[float(s), float(v)] for s, v in pts if v is not None], dtype=np.float64)
        except (TypeError, ValueError):
            continue
        a = a[np.isfinite(a).all(axis=1)] if a.size else a.reshape(0, 2)
        if len(a) > max_points:
            a = a[np.unique(np.linspace(0, len(a) - 1, max_points).round().astype(np.intp))]
            downsampled = True
        if len(a):
            lines[lane] = a
    if not lines:
        return f'<div class="chart"><b>{_esc(name)}</b>: no finite numeric values.</div>'
    allp = np.concatenate(list(lines.values()))
    log = bool((allp[:, 1] > 0).all() and allp[:, 1].max() / allp[:, 1].min() > 100)
    ys = {lane: (np.log10(a[:, 1]) if log else a[:, 1]) for lane, a in lines.items()}
    x0, x1 = allp[:, 0].min(), allp[:, 0].max()
    yv = np.concatenate(list(ys.values()))
    y0, y1 = yv.min(), yv.max()
    x1, y1 = (x1 if x1 > x0 else x0 + 1), (y1 if y1 > y0 else y0 + 1)
    sx, sy = (w - left - right) / (x1 - x0), (h - top_m - bottom) / (y1 - y0)
    label = (lambda v: f"{10 ** v:.3g}") if log else (lambda v: f"{v:.3g}")
    out = [f'<div class="chart"><b>{_esc(name)}</b>{" (log scale)" if log else ""}'
           f'{f" (downsampled to {max_points:,} points per line)" if downsampled else ""}<br>'
           f'<svg width="{w}" height="{h}" viewBox="0 0 {w} {h}">',
           f'<text x="{left - 4}" y="{top_m + 8}" text-anchor="end">{_esc(label(y1))}</text>'
           f'<text x="{left - 4}" y="{h - bottom}" text-anchor="end">{_esc(label(y0))}</text>'
           f'<text x="{left}" y="{h - bottom + 16}">{x0:g}</text>'
           f'<text x="{w - right}" y="{h - bottom + 16}" text-anchor="end">{x1:g} (step)</text>'
           f'<rect x="{left}" y="{top_m}" width="{w - left - right}" height="{h - top_m - bottom}" '
           'fill="none" stroke="#ccc"/>']
    legend = []
    for i, (lane, a) in enumerate(lines.items()):
        colour = _PALETTE[i % len(_PALETTE)]
        pts = " ".join(f"{left + (x - x0) * sx:.1f},{h - bottom - (y - y0) * sy:.1f}" for x, y in zip(a[:, 0], ys[lane]))
        out.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.2" points="{pts}">'
                   f'<title>{_esc(lane)}</title></polyline>')
        if i < 12:
            legend.append(f'<span><i style="background:{colour}"></i>{_esc(_short(lane))}</span>')
    if len(lines) > 12:
        legend.append(f"<span>and {len(lines) - 12} more lanes</span>")
    out.append(f'</svg><div class="legend">{"".join(legend)}</div></div>')
    return "".join(out)


def _table(header: Sequence[str], rows: list[Sequence[Any]]) -> str:
    head = "".join(f"<th>{_esc(c)}</th>" for c in header)
    body = "".join("<tr>" + "".join(f"<td>{_esc(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _phase_kind(phase: str) -> str:
    if phase in COMPUTE_PHASES:
        return "compute"
    if phase in SPAN_PHASES:
        return "span"
    if phase in NON_TRAINING_PHASES:
        return "not training"
    return "overhead"


def _lane_table(stats: "TrainingStats") -> str:
    per: dict[str, list] = {}
    for e in stats.events:
        row = per.setdefault(e.lane, [0, 0, 0.0, 0.0, 0.0])
        row[1] += 1
        if e.phase in COMPUTE_PHASES:
            row[2] += e.duration
        elif e.phase not in SPAN_PHASES:
            row[3] += e.duration
    for t in stats.tasks:
        row = per.setdefault(t.lane, [0, 0, 0.0, 0.0, 0.0])
        row[0] += 1
        row[4] = max(row[4], abs(t.clock_correction))
    lanes = sorted(per, key=lambda lane: (lane != DRIVER_LANE, -per[lane][1], lane))
    rows = [[lane, per[lane][0], per[lane][1], f"{per[lane][2]:.3f}", f"{per[lane][3]:.3f}", f"{per[lane][4]:.3f}"]
            for lane in lanes[:_MAX_LANE_ROWS]]
    note = (f'<p class="note">Showing {_MAX_LANE_ROWS} of {len(lanes)} lanes (most events first).</p>'
            if len(lanes) > _MAX_LANE_ROWS else "")
    return note + _table(["lane", "tasks", "events", "fit s", "overhead s", "max clock correction s"], rows)


def render_html(stats: "TrainingStats", *, max_bars: int = 5000, max_points: int = 2000,
                title: str = "sparkavg training statistics") -> str:
    """The report page as a string (see module docstring).

    Parameters
    ----------
    stats : TrainingStats
    max_bars : int
        Upper bound on timeline bars (phase rows); task/round/epoch strips get a fifth of it.
    max_points : int
        Upper bound on points per series line.
    title : str
    """
    if max_bars < 1 or max_points < 2:
        raise ValueError(f"Expect max_bars >= 1 and max_points >= 2, got {max_bars} and {max_points}")
    totals = stats.phase_totals()
    lane_seconds = sum(t["total"] for p, t in totals.items() if p not in SPAN_PHASES) or 1.0
    total_rows = [[p, _phase_kind(p), f"{t['count']:,}", f"{t['total']:.4f}", f"{t['mean'] * 1e3:.3f}",
                   f"{t['p50'] * 1e3:.3f}", f"{t['p95'] * 1e3:.3f}", f"{t['max'] * 1e3:.3f}",
                   "" if p in SPAN_PHASES else f"{100 * t['total'] / lane_seconds:.1f}%"] for p, t in totals.items()]
    hist = "".join(_histogram(p, stats.durations(p)) for p in totals)
    series = stats.series_data
    charts = "".join(_series_chart(name, by, max_points) for name, by in series.items())
    counters = stats.counters
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">', f"<title>{_esc(title)}</title>",
        f"<style>{_CSS}</style></head><body>", f"<h1>{_esc(title)}</h1>",
        f'<p class="summary">{_esc(stats.summary())}</p>',
        "<h2>Timeline</h2>", _timeline(stats, max_bars),
        "<h2>Phase totals</h2>",
        _table(["phase", "kind", "count", "total s", "mean ms", "p50 ms", "p95 ms", "max ms", "share of lane time"],
               total_rows) if totals else '<p class="note">No phases recorded.</p>',
        "<h2>Duration histograms</h2>", f'<div class="charts">{hist}</div>',
    ]
    if charts:
        parts += ["<h2>Series</h2>", f'<div class="charts">{charts}</div>']
    if counters:
        parts += ["<h2>Counters</h2>", _table(["counter", "value"], [[k, f"{v:,}"] for k, v in sorted(counters.items())])]
    parts += ["<h2>Lanes</h2>", _lane_table(stats),
              f'<p class="note">Generated {_esc(time.strftime("%Y-%m-%d %H:%M:%S"))} by sparkavg.spark.report_html.</p>',
              "</body></html>"]
    page = "\n".join(parts)
    logger.debug("HTML report: %d characters", len(page))
    return page
