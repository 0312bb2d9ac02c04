"""Training statistics out of the process: decisions, JSON, CSV, Chrome trace and the HTML page."""
from __future__ import annotations

import csv
import html
import json
import math
import pickle
import re

import numpy as np
import pytest

from sparkavg.stats import SPAN_PHASES, CounterName, Phase, PhaseRecorder, SeriesName, TrainingStats


def _recorder(lane, fits, overhead=(), start=0.0):
    """Recorder whose events start ``start`` seconds after its anchor, with exact durations."""
    rec = PhaseRecorder(lane)
    t = rec.perf_anchor + start
    for i, d in enumerate(fits):
        rec.add(Phase.FIT, t, d, minibatch=i, examples=16)
        t += d
    for phase, d in overhead:
        rec.add(phase, t, d)
        t += d
    return rec


def _rich_stats():
    s = TrainingStats()
    t = s.origin_perf
    s.record(Phase.EPOCH, t, t + 2.0, epoch=0)
    s.record(Phase.BROADCAST, t, t + 0.01, epoch=0, round=0, bytes=123)
    for w in range(2):
        rec = _recorder(f"h{w}/10{w}/p{w}", [0.01, 0.02, 0.03], [(Phase.FETCH, 0.001)])
        rec.wall_anchor = s.origin_wall + 0.05
        rec.series(SeriesName.THRESHOLD, 0, 1e-3)
        rec.series(SeriesName.THRESHOLD, 1, float("nan"))
        rec.series(SeriesName.THRESHOLD, 2, 2e-3)
        rec.count(CounterName.EXAMPLES, 48)
        s.add_worker_payload(pickle.loads(pickle.dumps(rec.to_payload())), epoch=0, round=0)
    s.series(SeriesName.REPLICA_MAX_ABS_DIFF, 0, 1e-7)
    s.decision("averaging_frequency", 8, "measured 0.2 s per round against 20 ms per iteration", epoch=0)
    s.decision("device", "cpu", "no GPU assigned to the task")
    s.decision("averaging_frequency", np.int64(4), "rounds got cheaper", epoch=1)
    return s


# ---------------------------------------------------------------- decisions
def test_decisions_are_plain_dicts_in_order():
    s = _rich_stats()
    assert s.decisions == [
        {"name": "averaging_frequency", "value": 8, "reason": "measured 0.2 s per round against 20 ms per iteration",
         "epoch": 0},
        {"name": "device", "value": "cpu", "reason": "no GPU assigned to the task", "epoch": None},
        {"name": "averaging_frequency", "value": 4, "reason": "rounds got cheaper", "epoch": 1},
    ]
    assert type(s.decisions[2]["value"]) is int, "numpy scalars are unwrapped"
    s.decisions[0]["value"] = 99
    assert s.decisions[0]["value"] == 8, "the property hands out copies"


def test_summary_has_one_line_per_latest_decision():
    lines = _rich_stats().summary().split("\n")
    assert "\n" not in lines[0] and lines[0].startswith("Training took")
    assert lines[1:] == ["Decisions:",
                         "- averaging_frequency = 4 (epoch 1): rounds got cheaper",
                         "- device = cpu: no GPU assigned to the task"]


@pytest.mark.parametrize("args, message", [
    (("", 1, "why"), "Expect a decision name among ['averaging_frequency', "),
    (("note", 1, "why"), "got 'note'"),  # decision names are a closed set (stats.DecisionName)
    (("device", "cpu", "  "), "Expect a non-empty reason for decision 'device'"),
    (("device", "cpu", "why", -1), "Expect epoch to be None or an int >= 0 for decision 'device', got -1"),
    (("device", "cpu", "why", 1.5), "got 1.5"),
])
def test_bad_decisions_are_rejected(args, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        TrainingStats().decision(*args)


def test_worker_decisions_merge_once():
    s = TrainingStats()
    for part in range(3):
        rec = PhaseRecorder(f"h/1/p{part}")
        rec.decision("device", "cpu", "no GPU assigned to the task")
        s.add_worker_payload(rec.to_payload())
    rec = PhaseRecorder("h/1/p3")
    rec.decision("device", "gpu", "task was assigned GPU 0")
    s.add_worker_payload(rec.to_payload())
    assert [d["value"] for d in s.decisions] == ["cpu", "gpu"]


# ---------------------------------------------------------------- JSON and CSV
def test_json_round_trip_is_strict_and_lossless(tmp_path):
    s = _rich_stats()
    path = tmp_path / "stats.json"
    text = s.to_json(path)
    assert path.read_text() == text
    data = json.loads(text, parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))
    assert data["counters"] == {"examples": 96}, "the counters key keeps its shape"
    assert data["decisions"] == s.decisions
    back = TrainingStats.from_json(path)
    assert back.events == s.events and back.tasks == s.tasks
    assert back.phase_totals() == s.phase_totals()
    assert back.summary() == s.summary()
    assert back.counters == s.counters
    assert back.decisions == s.decisions
    assert math.isnan(back.series_data["threshold"]["h0/100/p0"][1][1]), "NaN goes out as null, comes back as NaN"
    assert TrainingStats.from_dict(data).to_dict()["events"] == data["events"]
    assert back.to_trace()["traceEvents"] == s.to_trace()["traceEvents"], "series times survive the round trip"
    with pytest.raises(ValueError, match="Expect a TrainingStats.to_dict"):
        TrainingStats.from_dict({"format": "other"})


def test_format_1_files_still_load():
    old = {"format": "sparkavg.stats/1", "origin_wall": 1.7e9, "workers": 2, "train_seconds_set": None,
           "lanes": ["driver", "h/1/0"],
           "events": [[0, "round", 0.0, 1.0, 0, 0, None], [1, "fit", 0.1, 0.2, 0, 0, {"minibatch": 0}]],
           "tasks": [[1, 0.05, 0.5, 0, 0, 0.0]], "counters": {"examples": 10},
           "series": {"threshold": {"h/1/0": [[0, 0.001], [1, None]]}}, "derived": {}}
    s = TrainingStats.from_dict(old)
    assert s.train_seconds == 1.0 and s.examples == 10 and s.decisions == []
    assert s.series_data["threshold"]["h/1/0"][0] == [0, 0.001] and math.isnan(s.series_data["threshold"]["h/1/0"][1][1])
    assert s.to_dict()["format"] == "sparkavg.stats/2"


def test_csv_one_file_per_phase(tmp_path):
    s = _rich_stats()
    files = {p.name for p in s.to_csv(tmp_path)}
    assert {"phase_fit.csv", "phase_fetch.csv", "phase_broadcast.csv", "phase_epoch.csv",
            "phase_totals.csv", "counters.csv", "series.csv", "decisions.csv"} <= files
    with open(tmp_path / "phase_fit.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 6 and {r["lane"] for r in rows} == {"h0/100/p0", "h1/101/p1"}
    assert rows[0]["minibatch"] == "0" and float(rows[1]["duration_s"]) == pytest.approx(0.02)
    with open(tmp_path / "decisions.csv", newline="") as fh:
        decisions = list(csv.DictReader(fh))
    assert decisions[1] == {"name": "device", "value": "cpu", "epoch": "", "reason": "no GPU assigned to the task"}


# ---------------------------------------------------------------- trace
def test_trace_is_valid_trace_event_json_with_lanes_as_threads(tmp_path):
    s = _rich_stats()
    path = tmp_path / "trace.json"
    data = s.to_trace(path)
    loaded = json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(f"non-standard constant {c}"))
    assert loaded == data
    events = data["traceEvents"]
    assert {e["ph"] for e in events} == {"M", "X", "C"}
    process = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    thread = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert sorted(process.values()) == ["driver", "h0", "h1"], "one process per host"
    assert sorted(thread.values()) == sorted(s.lanes), "one thread per lane"
    for (pid, _), lane in thread.items():
        assert process[pid] == lane.split("/")[0], f"lane {lane} sits in its host's process"
    slices = [e for e in events if e["ph"] == "X"]
    assert len(slices) == len(s.events) + len(s.tasks)
    by_lane = {}
    for e in slices:
        by_lane.setdefault(thread[(e["pid"], e["tid"])], []).append(e)
    fits = [e for e in by_lane["h0/100/p0"] if e["name"] == "fit"]
    assert [e["dur"] for e in fits] == pytest.approx([1e4, 2e4, 3e4]), "durations in microseconds"
    assert fits[0]["ts"] == pytest.approx(0.05e6) and fits[0]["cat"] == "compute"
    assert fits[1]["args"] == {"minibatch": 1, "examples": 16, "epoch": 0, "round": 0}
    assert {e["name"] for e in by_lane["h0/100/p0"]} == {"task", "fit", "fetch"}
    assert next(e for e in by_lane["driver"] if e["name"] == "epoch")["cat"] == "span"
    counters = [e for e in events if e["ph"] == "C"]
    names = {e["name"] for e in counters}
    assert names == {"threshold (h0/100/p0)", "threshold (h1/101/p1)", "replica_max_abs_diff (driver)"}
    assert len(counters) == 5, "NaN points are left out of counter tracks"
    assert all(isinstance(v, float) for e in counters for v in e["args"].values())
    assert data["otherData"]["decisions"] == s.decisions and data["otherData"]["counters"] == {"examples": 96}


def test_trace_slices_nest_on_every_thread():
    s = TrainingStats()
    t = s.origin_perf
    s.record(Phase.EPOCH, t, t + 3.0, epoch=0)
    s.record(Phase.ROUND, t, t + 1.0, epoch=0, round=0)
    s.record(Phase.BROADCAST, t, t + 0.5, epoch=0, round=0)
    s.record(Phase.EVALUATE, t + 2.5, t + 4.0, epoch=0)  # overlaps the epoch's end without nesting in it
    events = s.to_trace()["traceEvents"]
    threads = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert sorted(threads.values()) == ["driver", "driver #2"]
    slices = sorted((e for e in events if e["ph"] == "X"), key=lambda e: (e["ts"], -e["dur"]))
    for tid in threads:
        stack = []
        for e in (e for e in slices if e["tid"] == tid):
            while stack and stack[-1] <= e["ts"]:
                stack.pop()
            assert not stack or e["ts"] + e["dur"] <= stack[-1], f"{e['name']} overlaps its parent on {threads[tid]}"
            stack.append(e["ts"] + e["dur"])
    evaluate = next(e for e in slices if e["name"] == "evaluate")
    assert threads[evaluate["tid"]] == "driver #2"


# ---------------------------------------------------------------- HTML
def test_html_is_self_contained_with_one_lane_per_worker_and_escaped(tmp_path):
    s = _rich_stats()
    evil = "<script>alert(1)</script>"
    s.add_worker_payload(_recorder(evil, [0.01]).to_payload())
    s.decision("device", "<b>x</b>", "because <i>reasons</i>")
    page = s.to_html(tmp_path / "report.html")
    assert (tmp_path / "report.html").read_text(encoding="utf-8") == page
    assert page.startswith("<!DOCTYPE html>")
    for external in ("http://", "https://", "src=", "href=", "@import", "url("):
        assert external not in page, f"the page must not reference anything outside it ({external})"
    assert "<script" not in page.lower(), "no script at all, and the lane name must be escaped"
    assert html.escape(evil, quote=True) in page
    assert "<b>x</b>" not in page and "&lt;b&gt;x&lt;/b&gt;" in page, "decision values are escaped"
    assert "<svg" in page and "<polyline" in page, "timeline and series charts are inline SVG"
    labels = re.findall(r'<text x="4" y="[\d.]+">(.*?)<title>(.*?)</title></text>', page)
    assert [full for _, full in labels] == [html.escape(lane, quote=True) for lane in s.lanes]
    assert len(labels) == 4, "driver + two workers + the evil lane"
    for phase in ("fit", "fetch", "broadcast"):
        assert f"<b>{phase}</b>" in page, f"histogram for {phase}"
    assert s.summary().split(":")[0] in page.replace("&#x27;", "'")
    assert page.count('class="b"') == sum(e.phase not in SPAN_PHASES for e in s.events)


def test_html_shows_decisions_as_a_table():
    page = _rich_stats().to_html()
    assert "<h2>Decisions</h2>" in page
    table = page[page.index('<table class="decisions">'):]
    table = table[:table.index("</table>")]
    rows = re.findall(r"<tr>(.*?)</tr>", table)
    assert len(rows) == 4, "header + every decision, not only the latest"
    assert re.findall(r"<td>(.*?)</td>", rows[1]) == [
        "averaging_frequency", "8", "0", "measured 0.2 s per round against 20 ms per iteration"]
    assert "<h2>Decisions</h2>" not in TrainingStats().to_html(), "no empty section"


def test_html_caps_bars_for_a_large_run():
    s = TrainingStats()
    n_lanes, per_lane = 8, 12_500  # 100k fit events
    for w in range(n_lanes):
        rec = PhaseRecorder(f"host{w}/{w}/p{w}")
        t = rec.perf_anchor
        for i in range(per_lane):
            rec.add(Phase.FIT, t, 0.0004, minibatch=i)
            t += 0.0005
            if w == 0:
                rec.series(SeriesName.THRESHOLD, i, 1e-3 * (1 + (i % 7)))
        s.add_worker_payload(rec.to_payload(), epoch=0)
    assert len(s.events) == n_lanes * per_lane
    page = s.to_html(max_bars=2000, max_points=500)
    assert page.count('class="b"') <= 2000
    assert page.count('class="b"') >= n_lanes, "every lane still shows something"
    assert "exceed the cap of 2,000 bars" in page
    assert "downsampled to 500 points" in page
    assert len(page.encode()) < 2_000_000, f"page is {len(page.encode()):,} bytes"
    with pytest.raises(ValueError, match="Expect max_bars >= 1 and max_points >= 2, got 0 and 500"):
        s.to_html(max_bars=0, max_points=500)
