"""Training statistics: worker recorder -> payload -> pickle -> driver stats -> reports."""
from __future__ import annotations

import ast
import csv
import json
import math
import pickle
import re
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sparkavg.spark import report_html, stats
from sparkavg.spark.stats import (CounterName, Phase, PhaseRecorder, Regime, SeriesName, TrainingStats,
                                  iteration_verdict)

PLAIN = (dict, list, str, float, int, bool, type(None))


def _spin(n: int) -> int:
    """Busy loop of known size: real, short, CPU-bound work."""
    x = 0
    for i in range(n):
        x += i
    return x


def _assert_plain(obj, where="payload"):
    assert type(obj) in PLAIN, f"{where} holds a {type(obj).__name__}, not plain data"
    if isinstance(obj, dict):
        for k, v in obj.items():
            assert type(k) is str, f"{where} has key {k!r} of type {type(k).__name__}"
            _assert_plain(v, f"{where}[{k!r}]")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            _assert_plain(v, f"{where}[{i}]")


def _cross_spark(payload):
    """What a Spark return value goes through."""
    return pickle.loads(pickle.dumps(payload))


def _synthetic_recorder(lane, fit_durations, overhead=(), examples=16):
    """Recorder with exact, known durations: fits back to back, then overhead phases."""
    rec = PhaseRecorder(lane)
    t = rec.perf_anchor
    for i, d in enumerate(fit_durations):
        rec.add(Phase.FIT, t, d, minibatch=i, examples=examples)
        t += d
    for phase, d in overhead:
        rec.add(phase, t, d)
        t += d
    return rec


def _stats_with_fit_mean(mean_seconds, n=20):
    st_ = TrainingStats()
    rec = _synthetic_recorder("h/1/0", [mean_seconds] * n, [(Phase.FETCH, mean_seconds)])
    st_.add_worker_payload(_cross_spark(rec.to_payload()))
    return st_


# ---------------------------------------------------------------- worker side
def test_recorder_times_real_work_and_ships_plain_data():
    rec = PhaseRecorder(partition=3)
    assert rec.lane.endswith("/3") and rec.lane.count("/") == 2
    with rec.phase(Phase.FETCH):
        _spin(1_000)
    for i in range(3):
        with rec.phase(Phase.FIT, minibatch=np.int64(i)):
            _spin(20_000 * (i + 1))
    rec.count(CounterName.BYTES_SENT, np.int64(10))
    rec.count(CounterName.BYTES_SENT, 5)
    rec.series(SeriesName.THRESHOLD, 0, np.float32(1e-3))
    payload = _cross_spark(rec.to_payload())
    _assert_plain(payload)
    phases = [e[0] for e in payload["events"]]
    assert phases == ["fetch", "fit", "fit", "fit"]
    starts = [e[1] for e in payload["events"]]
    assert starts == sorted(starts) and starts[0] >= 0, "events within a lane must keep their order"
    fits = [e[2] for e in payload["events"][1:]]
    assert all(d > 0 for d in fits)
    assert fits[2] > fits[0], "a 3x larger busy loop should take longer"
    assert payload["events"][2][3] == {"minibatch": 1}
    assert payload["counters"] == {"bytes_sent": 15}
    assert payload["elapsed"] >= starts[-1] + fits[-1]


def test_recorder_itself_pickles_and_records_failures():
    rec = PhaseRecorder("lane-a")
    with pytest.raises(ZeroDivisionError):
        with rec.phase(Phase.FIT, minibatch=0):
            1 / 0
    assert rec.to_payload()["events"][0][3] == {"minibatch": 0, "failed": "ZeroDivisionError"}
    clone = pickle.loads(pickle.dumps(rec))
    assert clone.lane == "lane-a" and len(clone) == 1
    with pytest.raises(ValueError, match="Expect duration >= 0"):
        rec.add(Phase.FIT, rec.perf_anchor, -1.0)


# ---------------------------------------------------------------- driver side
def test_payloads_merge_into_totals_percentiles_and_ratio():
    fits_a = [0.010, 0.020, 0.030, 0.040]
    fits_b = [0.050, 0.060]
    rec_a = _synthetic_recorder("h/1/0", fits_a, [(Phase.FETCH, 0.005), (Phase.ENCODE, 0.002)])
    rec_b = _synthetic_recorder("h/2/1", fits_b, [(Phase.FETCH, 0.007)])
    rec_a.count(CounterName.EXAMPLES, 64)
    rec_b.count(CounterName.EXAMPLES, 32)
    rec_a.series(SeriesName.SPARSITY, 1, 0.01)
    rec_b.series(SeriesName.SPARSITY, 1, 0.02)
    s = TrainingStats()
    t = time.perf_counter()
    with s.timed(Phase.BROADCAST, epoch=0, round=0):
        _spin(1_000)
    s.record(Phase.AGGREGATE, t, t + 0.003, epoch=0, round=0)
    s.record(Phase.ROUND, t, t + 1.0, epoch=0, round=0)
    s.add_worker_payloads([_cross_spark(r.to_payload()) for r in (rec_a, rec_b)], epoch=0, round=0)

    totals = s.phase_totals()
    all_fits = np.array(fits_a + fits_b)
    assert totals["fit"]["count"] == 6
    assert totals["fit"]["total"] == pytest.approx(all_fits.sum())
    assert totals["fit"]["p50"] == pytest.approx(np.percentile(all_fits, 50))
    assert totals["fit"]["p95"] == pytest.approx(np.percentile(all_fits, 95))
    assert totals["fit"]["max"] == pytest.approx(0.060)
    assert totals["fetch"]["count"] == 2 and totals["fetch"]["total"] == pytest.approx(0.012)
    broadcast = totals["broadcast"]["total"]
    assert s.compute_seconds == pytest.approx(0.21)
    # round is a span (not counted); fetch + encode + aggregate + broadcast are overhead
    assert s.overhead_seconds == pytest.approx(0.012 + 0.002 + 0.003 + broadcast)
    assert s.compute_overhead_ratio == pytest.approx(0.21 / s.overhead_seconds)
    assert s.mean_iteration_seconds == pytest.approx(0.035)
    assert s.counters[CounterName.EXAMPLES] == 96
    assert s.train_seconds == pytest.approx(1.0), "the driver's round span is the training wall time"
    assert s.examples_per_second == pytest.approx(96.0)
    assert set(s.series_data[SeriesName.SPARSITY]) == {"h/1/0", "h/2/1"}
    assert s.lanes == ["driver", "h/1/0", "h/2/1"]
    assert {e.epoch for e in s.events} == {0}


@given(st.lists(st.floats(min_value=0.0, max_value=10.0, allow_nan=False), min_size=1, max_size=50))
def test_phase_totals_match_numpy(durations):
    s = TrainingStats()
    rec = _synthetic_recorder("w", durations)
    s.add_worker_payload(rec.to_payload())
    t = s.phase_totals()["fit"]
    d = np.asarray(durations)
    assert t["count"] == d.size
    assert t["total"] == pytest.approx(d.sum(), abs=1e-12)
    assert t["mean"] == pytest.approx(d.mean(), abs=1e-12)
    assert t["p50"] == pytest.approx(np.percentile(d, 50), abs=1e-12)
    assert t["p95"] == pytest.approx(np.percentile(d, 95), abs=1e-12)
    assert t["max"] == d.max()


def test_lane_alignment_clamps_skewed_worker_clock_into_job_window():
    s = TrainingStats()
    launched = time.perf_counter()
    rec = _synthetic_recorder("skewed", [0.01, 0.02], [(Phase.SEND, 0.005)])
    rec.wall_anchor += 100.0  # the worker's clock runs 100 s ahead
    payload = _cross_spark(rec.to_payload())
    returned = max(time.perf_counter(), launched + payload["elapsed"])
    s.add_worker_payload(payload, launched=launched, returned=returned)
    task = s.tasks[0]
    lo, hi = launched - s.origin_perf, returned - s.origin_perf
    assert lo - 1e-9 <= task.start and task.end <= hi + 1e-9, "task must lie inside its job window"
    assert s.max_clock_correction == pytest.approx(100.0, abs=1.0)
    events = s.events
    assert [e.phase for e in events] == ["fit", "fit", "send"]
    assert all(a.end <= b.start + 1e-12 for a, b in zip(events, events[1:])), "skew must not reorder a lane"
    # without a window the wall anchor is trusted as is
    s2 = TrainingStats()
    s2.add_worker_payload(payload)
    assert s2.tasks[0].start == pytest.approx(rec.wall_anchor - s2.origin_wall)


def test_concurrent_tasks_give_worker_count_and_utilisation():
    s = TrainingStats()
    for lane in ("h/1/0", "h/2/1"):
        s.add_worker_payload(_synthetic_recorder(lane, [0.1] * 5).to_payload())
    assert s.n_workers == 2
    s.train_seconds = 1.0
    assert s.utilisation == pytest.approx(1.0 / (1.0 * 2))
    assert TrainingStats(workers=4).n_workers == 4
    with pytest.raises(ValueError, match="Expect workers >= 1"):
        TrainingStats(workers=0)


def test_bad_payload_is_rejected_clearly():
    with pytest.raises(ValueError, match="Expect a PhaseRecorder.to_payload"):
        TrainingStats().add_worker_payload({"lane": "x"})
    with pytest.raises(ValueError, match="Expect end >= start"):
        TrainingStats().record(Phase.BROADCAST, 2.0, 1.0)


def test_timed_records_even_when_the_block_raises():
    s = TrainingStats()
    with pytest.raises(RuntimeError):
        with s.timed(Phase.CHECKPOINT, epoch=1):
            raise RuntimeError("disk full")
    (event,) = s.events
    assert event.phase == "checkpoint" and event.epoch == 1 and event.fields == {"failed": "RuntimeError"}


# ---------------------------------------------------------------- verdicts
@pytest.mark.parametrize("mean, regime, phrase", [
    (0.0005, Regime.SINGLE_MACHINE, "single machine is probably faster"),
    (0.010, Regime.SUB_LINEAR, "sub-linear"),
    (0.200, Regime.NEAR_LINEAR, "likely to pay"),
])
def test_verdict_for_each_regime(mean, regime, phrase):
    s = _stats_with_fit_mean(mean)
    assert s.mean_iteration_seconds == pytest.approx(mean)
    got, text = s.verdict()
    assert got is regime
    summary = s.summary()
    assert phrase in text and phrase in summary
    assert "examples/s" in summary and "overhead" in summary
    assert "\n" not in summary, "the summary is one paragraph"


def test_verdict_edges():
    assert iteration_verdict(0.12)[0] is Regime.NEAR_LINEAR
    assert "150 ms" in iteration_verdict(0.12)[1], "100-150 ms is flagged borderline"
    assert "150 ms" not in iteration_verdict(0.2)[1]
    assert iteration_verdict(0.001)[0] is Regime.SINGLE_MACHINE
    assert iteration_verdict(None)[0] is Regime.UNKNOWN
    assert TrainingStats().summary() == "No training statistics were recorded."


def test_summary_reports_compression_and_sharing_overhead():
    s = TrainingStats()
    rec = _synthetic_recorder("w", [0.2] * 4)
    t = rec.perf_anchor + 1.0
    for phase in (Phase.ENCODE, Phase.SEND, Phase.APPLY):
        rec.add(phase, t, 0.004)
        t += 0.004
    rec.count(CounterName.BYTES_SENT, 2_000)
    rec.count(CounterName.DENSE_BYTES, 2_000_000)
    s.add_worker_payload(rec.to_payload())
    assert s.compression_ratio == pytest.approx(1000.0)
    summary = s.summary()
    assert "compression 1,000.0x" in summary
    assert "encode + send + apply" in summary and "3 ms per iteration" in summary


# ---------------------------------------------------------------- exports
def _rich_stats():
    s = TrainingStats()
    t = time.perf_counter()
    s.record(Phase.EPOCH, t, t + 2.0, epoch=0)
    s.record(Phase.BROADCAST, t, t + 0.01, epoch=0, round=0, bytes=123)
    for w in range(2):
        rec = _synthetic_recorder(f"h/{w}/{w}", [0.01, 0.02, 0.03], [(Phase.FETCH, 0.001)])
        rec.series(SeriesName.THRESHOLD, 0, 1e-3)
        rec.series(SeriesName.THRESHOLD, 1, float("nan"))
        rec.series(SeriesName.THRESHOLD, 2, 2e-3)
        rec.count(CounterName.EXAMPLES, 48)
        s.add_worker_payload(_cross_spark(rec.to_payload()), epoch=0, round=0)
    return s


def test_json_round_trip_is_strict_and_lossless(tmp_path):
    s = _rich_stats()
    path = tmp_path / "stats.json"
    text = s.to_json(path)
    assert path.read_text() == text
    json.loads(text, parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))
    back = TrainingStats.from_json(path)
    assert back.events == s.events and back.tasks == s.tasks
    assert back.phase_totals() == s.phase_totals()
    assert back.summary() == s.summary()
    assert back.counters == s.counters
    assert math.isnan(back.series_data["threshold"]["h/0/0"][1][1]), "NaN goes out as null, comes back as NaN"
    assert TrainingStats.from_dict(json.loads(text)).to_dict()["events"] == json.loads(text)["events"]
    with pytest.raises(ValueError, match="Expect a TrainingStats.to_dict"):
        TrainingStats.from_dict({"format": "other"})


def test_csv_one_file_per_phase(tmp_path):
    s = _rich_stats()
    files = {p.name for p in s.to_csv(tmp_path)}
    assert {"phase_fit.csv", "phase_fetch.csv", "phase_broadcast.csv", "phase_epoch.csv",
            "phase_totals.csv", "counters.csv", "series.csv"} <= files
    with open(tmp_path / "phase_fit.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 6 and {r["lane"] for r in rows} == {"h/0/0", "h/1/1"}
    assert rows[0]["minibatch"] == "0" and float(rows[1]["duration_s"]) == pytest.approx(0.02)


def test_html_is_self_contained_with_one_lane_per_worker_and_escaped(tmp_path):
    s = _rich_stats()
    evil = "<script>alert(1)</script>"
    s.add_worker_payload(_synthetic_recorder(evil, [0.01]).to_payload())
    page = s.to_html(tmp_path / "report.html")
    assert (tmp_path / "report.html").read_text(encoding="utf-8") == page
    assert page.startswith("<!DOCTYPE html>")
    for external in ("http://", "https://", "src=", "href=", "@import", "url("):
        assert external not in page, f"the page must not reference anything outside it ({external})"
    assert "<script" not in page.lower(), "no script at all, and the lane name must be escaped"
    assert html_escaped(evil) in page
    assert "<svg" in page and "<polyline" in page, "timeline and series charts are inline SVG"
    labels = re.findall(r'<text x="4" y="[\d.]+">(.*?)<title>(.*?)</title></text>', page)
    assert [full for _, full in labels] == [html_escaped(l) for l in s.lanes]
    assert len(labels) == 4, "driver + two workers + the evil lane"
    for phase in ("fit", "fetch", "broadcast"):
        assert f"<b>{phase}</b>" in page, f"histogram for {phase}"
    assert s.summary().split(":")[0] in page.replace("&#x27;", "'")
    assert page.count('class="b"') == sum(e.phase not in stats.SPAN_PHASES for e in s.events)


def html_escaped(text):
    import html

    return html.escape(text, quote=True)


def test_html_caps_bars_for_a_large_run():
    s = TrainingStats()
    n_lanes, per_lane = 8, 12_500  # 100k fit events plus 4 sharing phases on one lane
    for w in range(n_lanes):
        rec = PhaseRecorder(f"host{w}/{w}/{w}")
        t = rec.perf_anchor
        for i in range(per_lane):
            rec.add(Phase.FIT, t, 0.0004, minibatch=i)
            t += 0.0005
            if w == 0:
                rec.series(SeriesName.THRESHOLD, i, 1e-3 * (1 + (i % 7)))
        s.add_worker_payload(rec.to_payload(), epoch=0)
    assert len(s.events) == n_lanes * per_lane
    started = time.perf_counter()
    page = s.to_html(max_bars=2000, max_points=500)
    elapsed = time.perf_counter() - started
    assert page.count('class="b"') <= 2000
    assert page.count('class="b"') >= n_lanes, "every lane still shows something"
    assert "exceed the cap of 2,000 bars" in page
    assert "downsampled to 500 points" in page
    assert len(page.encode()) < 2_000_000, f"page is {len(page.encode()):,} bytes"
    assert elapsed < 10, f"rendering 100k events took {elapsed:.1f} s"


def test_stats_modules_do_not_import_pyspark():
    for module in (stats, report_html):
        tree = ast.parse(Path(module.__file__).read_text())
        names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        assert not [n for n in names if n.split(".")[0] == "pyspark"], f"{module.__name__} imports pyspark"
