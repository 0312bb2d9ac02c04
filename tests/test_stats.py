"""Training statistics: names, worker recorder -> payload -> pickle -> driver stats -> analysis.

Durations are set explicitly (``PhaseRecorder.add``, ``TrainingStats.record``);
no assertion depends on how long real work took.
"""
from __future__ import annotations

import ast
import json
import os
import pickle
import socket
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import sparkavg.stats as stats_pkg
from sparkavg.stats import (CounterName, Phase, PhaseRecorder, Regime, SeriesName, TrainingStats,
                                  datagram_breakdown, iteration_verdict, task_lane)

PLAIN = (dict, list, str, float, int, bool, type(None))


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
    rec = _synthetic_recorder("h/1/p0", [mean_seconds] * n, [(Phase.FETCH, mean_seconds)])
    st_.add_worker_payload(_cross_spark(rec.to_payload()))
    return st_


# ---------------------------------------------------------------- names
def test_names_are_plain_strings_that_pickle_as_str():
    assert Phase.FIT == "fit" and "fit" == Phase.FIT and hash(Phase.FIT) == hash("fit")
    assert str(Phase.MODEL_INIT) == "model_init" and f"{CounterName.BYTES_SENT}" == "bytes_sent"
    back = pickle.loads(pickle.dumps(SeriesName.THRESHOLD))
    assert type(back) is str and back == "threshold", "members cross processes as plain str"
    assert json.dumps({Phase.FIT: CounterName.EXAMPLES}) == '{"fit": "examples"}'
    assert CounterName.DENSE_BYTES is CounterName.DENSE_BYTES_EQUIVALENT, "old alias kept"


def test_every_name_in_use_is_in_the_enums():
    phases = {"fetch", "model_init", "fit", "data_load", "encode", "send", "apply", "wait", "idle", "broadcast",
              "aggregate", "average", "export", "plan", "checkpoint", "round", "epoch", "evaluate"}
    counters = {"examples", "minibatches", "iterations", "messages_sent", "messages_received", "messages_applied",
                "entries_sent",
                "bytes_sent", "bytes_received", "payload_bytes_sent", "dense_bytes_equivalent", "datagrams_sent",
                "datagrams_retransmitted", "datagrams_rejected", "datagrams_invalid", "datagrams_forged",
                "datagrams_replayed", "stage_restarts", "resident_state_misses", "merge_seconds"}
    series = {"threshold", "sparsity", "residual_norm", "replica_max_abs_diff", "score", "learning_rate",
              "validation"}
    assert {m.value for m in Phase} == phases
    assert {m.value for m in CounterName} == counters
    assert {m.value for m in SeriesName} == series
    assert set(stats_pkg.DRIVER_PHASES) | set(stats_pkg.WORKER_PHASES) == set(Phase)


def test_task_lane_names_host_pid_and_partition():
    assert task_lane(3) == f"{socket.gethostname()}/{os.getpid()}/p3"
    assert task_lane(None).endswith("/p-")
    assert PhaseRecorder(partition=7).lane == task_lane(7)


# ---------------------------------------------------------------- unknown names
@pytest.mark.parametrize("call", [
    lambda r: r.phase("fti"),
    lambda r: r.add("FIT", r.perf_anchor, 0.1),
    lambda r: r.count("byte_sent", 1),
    lambda r: r.series("treshold", 0, 1.0),
], ids=["phase", "add", "count", "series"])
def test_recorder_rejects_unknown_names(call):
    rec = PhaseRecorder("w")
    with pytest.raises(ValueError, match=r"Expect a (Phase|CounterName|SeriesName) name, one of .*; got '\w+'"):
        call(rec)
    assert rec.to_payload()["events"] == [] and rec.to_payload()["counters"] == {}


def test_recorder_error_names_the_typo_and_the_closest_name():
    with pytest.raises(ValueError) as info:
        PhaseRecorder("w").phase("fti")
    message = str(info.value)
    assert "'fti'" in message and "did you mean 'fit'" in message
    assert all(p.value in message for p in Phase), "the message lists every allowed phase"


@pytest.mark.parametrize("call", [
    lambda s: s.record("brodcast", 1.0, 2.0),
    lambda s: s.count("example", 3),
    lambda s: s.series("sparsity ", 0, 0.1),
    lambda s: s.count(Phase.FIT, 1),
], ids=["record", "count", "series", "phase-as-counter"])
def test_training_stats_rejects_unknown_names(call):
    s = TrainingStats()
    with pytest.raises(ValueError, match="Expect a (Phase|CounterName|SeriesName) name"):
        call(s)
    assert s.events == [] and s.counters == {} and s.series_data == {}


def test_timed_rejects_an_unknown_phase_before_running_the_block():
    ran = []
    with pytest.raises(ValueError, match="got 'checkpiont'"):
        with TrainingStats().timed("checkpiont"):
            ran.append(1)
    assert ran == [], "the block must not run under a misspelt phase"


def test_members_and_exact_strings_are_both_accepted_and_stored_plain():
    rec = PhaseRecorder("w")
    rec.add("fit", rec.perf_anchor, 0.1)
    rec.add(Phase.FIT, rec.perf_anchor + 0.1, 0.1)
    rec.count("examples", 2)
    rec.count(CounterName.EXAMPLES, 3)
    payload = rec.to_payload()
    _assert_plain(payload)
    assert [type(e[0]) for e in payload["events"]] == [str, str]
    assert payload["counters"] == {"examples": 5}


def test_payload_with_an_unknown_name_is_rejected_naming_its_lane():
    payload = PhaseRecorder("h/9/p1").to_payload()
    payload["events"] = [["fitt", 0.0, 0.1, None]]
    with pytest.raises(ValueError, match=r"Payload of lane 'h/9/p1': Expect a Phase name.*got 'fitt'"):
        TrainingStats().add_worker_payload(payload)


# ---------------------------------------------------------------- worker side
def test_recorder_records_real_blocks_in_order_and_ships_plain_data():
    rec = PhaseRecorder(partition=3)
    assert rec.lane.endswith("/p3") and rec.lane.count("/") == 2
    with rec.phase(Phase.FETCH):
        pass
    for i in range(3):
        with rec.phase(Phase.FIT, minibatch=np.int64(i)):
            sum(range(100))
    rec.count(CounterName.BYTES_SENT, np.int64(10))
    rec.count(CounterName.BYTES_SENT, 5)
    rec.series(SeriesName.THRESHOLD, 0, np.float32(1e-3))
    payload = _cross_spark(rec.to_payload())
    _assert_plain(payload)
    assert [e[0] for e in payload["events"]] == ["fetch", "fit", "fit", "fit"]
    starts = [e[1] for e in payload["events"]]
    assert starts == sorted(starts) and starts[0] >= 0, "events within a lane keep their order"
    assert all(e[2] >= 0 for e in payload["events"])
    assert payload["events"][2][3] == {"minibatch": 1}
    assert payload["counters"] == {"bytes_sent": 15}
    (step, value, t), = payload["series"]["threshold"]
    assert step == 0 and value == pytest.approx(1e-3) and t >= starts[-1]
    assert payload["elapsed"] >= max(e[1] + e[2] for e in payload["events"])


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
    rec_a = _synthetic_recorder("h/1/p0", fits_a, [(Phase.FETCH, 0.005), (Phase.ENCODE, 0.002)])
    rec_b = _synthetic_recorder("h/2/p1", fits_b, [(Phase.FETCH, 0.007)])
    rec_a.count(CounterName.EXAMPLES, 64)
    rec_b.count(CounterName.EXAMPLES, 32)
    rec_a.series(SeriesName.SPARSITY, 1, 0.01)
    rec_b.series(SeriesName.SPARSITY, 1, 0.02)
    s = TrainingStats()
    t = s.origin_perf
    s.record(Phase.BROADCAST, t, t + 0.004, epoch=0, round=0)
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
    assert s.compute_seconds == pytest.approx(0.21)
    # round is a span (not counted); fetch + encode + aggregate + broadcast are overhead
    assert s.overhead_seconds == pytest.approx(0.012 + 0.002 + 0.003 + 0.004)
    assert s.compute_overhead_ratio == pytest.approx(0.21 / 0.021)
    assert s.mean_iteration_seconds == pytest.approx(0.035)
    assert s.counters[CounterName.EXAMPLES] == 96
    assert s.train_seconds == pytest.approx(1.0), "the driver's round span is the training wall time"
    assert s.examples_per_second == pytest.approx(96.0)
    assert set(s.series_data[SeriesName.SPARSITY]) == {"h/1/p0", "h/2/p1"}
    assert s.series_data["sparsity"]["h/1/p0"] == [[1, 0.01]]
    assert s.lanes == ["driver", "h/1/p0", "h/2/p1"]
    assert {e.epoch for e in s.events} == {0}


@given(st.lists(st.floats(min_value=0.0, max_value=10.0, allow_nan=False), min_size=1, max_size=50))
def test_phase_totals_match_numpy(durations):
    s = TrainingStats()
    s.add_worker_payload(_synthetic_recorder("w", durations).to_payload())
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
    rec = _synthetic_recorder("skewed", [0.01, 0.02], [(Phase.SEND, 0.005)])
    rec.wall_anchor = s.origin_wall + 2.0 + 100.0  # started 2 s after the driver; its clock runs 100 s ahead
    payload = _cross_spark(rec.to_payload())
    launched, returned = s.origin_perf + 1.5, s.origin_perf + 3.0 + payload["elapsed"]
    s.add_worker_payload(payload, launched=launched, returned=returned)
    task = s.tasks[0]
    lo, hi = launched - s.origin_perf, returned - s.origin_perf
    assert lo - 1e-9 <= task.start and task.end <= hi + 1e-9, "task must lie inside its job window"
    assert task.clock_correction == pytest.approx(-99.0, abs=1e-6), "shifted just far enough to end on return"
    assert s.max_clock_correction == pytest.approx(99.0, abs=1e-6)
    events = s.events
    assert [e.phase for e in events] == ["fit", "fit", "send"]
    assert all(a.end <= b.start + 1e-9 for a, b in zip(events, events[1:])), "skew must not reorder a lane (1 ns: float sums of clock readings)"
    # without a window the wall anchor is trusted as is
    s2 = TrainingStats()
    s2.add_worker_payload(payload)
    assert s2.tasks[0].start == pytest.approx(rec.wall_anchor - s2.origin_wall)
    # a task that claims to start before launch is moved to the launch
    s3 = TrainingStats()
    early = dict(payload, wall_anchor=s3.origin_wall - 50.0)
    s3.add_worker_payload(early, launched=s3.origin_perf + 1.0, returned=s3.origin_perf + 1000.0)
    assert s3.tasks[0].start == pytest.approx(1.0) and s3.tasks[0].clock_correction == pytest.approx(51.0)


def test_concurrent_tasks_give_worker_count_and_utilisation():
    s = TrainingStats()
    for lane in ("h/1/p0", "h/2/p1"):
        rec = _synthetic_recorder(lane, [0.1] * 5)
        rec.wall_anchor = s.origin_wall
        s.add_worker_payload(rec.to_payload())
    assert s.n_workers == 2
    s.train_seconds = 1.0
    assert s.utilisation == pytest.approx(1.0 / (1.0 * 2))
    assert TrainingStats(workers=4).n_workers == 4
    with pytest.raises(ValueError, match="Expect workers >= 1"):
        TrainingStats(workers=0)
    with pytest.raises(ValueError, match="Expect train_seconds >= 0"):
        s.train_seconds = -1.0


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


def test_decision_when_changed_records_a_name_only_when_its_value_changes():
    s = TrainingStats()
    assert s.decision("sharing_state", "shipped", "first epoch", epoch=0, when_changed=True)
    assert not s.decision("sharing_state", "shipped", "again", epoch=1, when_changed=True)
    assert s.decision("device", "cpu", "another name in between")
    assert s.decision("sharing_state", "executors", "kept", epoch=2, when_changed=True)
    assert s.decision("sharing_state", "executors", "always recorded without when_changed", epoch=3)
    assert [(d["name"], d["value"], d["epoch"]) for d in s.decisions] == [
        ("sharing_state", "shipped", 0), ("device", "cpu", None), ("sharing_state", "executors", 2),
        ("sharing_state", "executors", 3)]


def test_stats_object_pickles_with_its_data():
    s = _stats_with_fit_mean(0.2)
    s.decision("device", "cpu", "no GPU assigned")
    back = pickle.loads(pickle.dumps(s))
    assert back.events == s.events and back.decisions == s.decisions and back.summary() == s.summary()
    back.count(CounterName.EXAMPLES, 1)  # the lock was recreated
    assert back.counters["examples"] == 1


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
    assert "\n" not in summary, "without decisions the summary is one paragraph"


def test_verdict_edges():
    assert iteration_verdict(0.12)[0] is Regime.NEAR_LINEAR
    assert "150 ms" in iteration_verdict(0.12)[1], "100-150 ms is flagged borderline"
    assert "150 ms" not in iteration_verdict(0.2)[1]
    assert iteration_verdict(0.1)[0] is Regime.NEAR_LINEAR
    assert iteration_verdict(0.0999)[0] is Regime.SUB_LINEAR
    assert iteration_verdict(0.001)[0] is Regime.SINGLE_MACHINE
    assert iteration_verdict(0.0011)[0] is Regime.SUB_LINEAR
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
    rec.count(CounterName.DENSE_BYTES_EQUIVALENT, 2_000_000)
    s.add_worker_payload(rec.to_payload())
    assert s.compression_ratio == pytest.approx(1000.0)
    summary = s.summary()
    assert "compression 1,000.0x" in summary
    assert "encode + send + apply" in summary and "3 ms per iteration" in summary
    assert "datagrams" not in summary, "no datagram counters, no datagram sentence"


# ---------------------------------------------------------------- datagrams_rejected
def test_datagrams_rejected_is_the_total_of_every_drop():
    # transport view: 2 bad MAC + 1 malformed = 3 invalid; 5 replays; 4 out of window / buffer full
    s = TrainingStats()
    s.add_worker_payload(_synthetic_recorder("w", [0.1]).to_payload())
    for name, value in [("datagrams_rejected", 12), ("datagrams_invalid", 3), ("datagrams_forged", 2),
                        ("datagrams_replayed", 5), ("datagrams_retransmitted", 7)]:
        s.count(name, value)
    d = s.datagrams
    assert d == {"rejected": 12, "invalid": 3, "forged": 2, "replayed": 5, "retransmitted": 7,
                 "flow_control": 4, "consistent": True}
    summary = s.summary()
    assert ("dropped 12 received datagrams (3 failed authentication or validation, 2 of them forged; "
            "5 repeated delivered messages") in summary
    assert "4 flow control" in summary and "inconsistent" not in summary


def test_datagram_counters_under_the_old_meaning_are_flagged():
    # old worker: datagrams_rejected = invalid only, so rejected < invalid + replayed
    d = datagram_breakdown({"datagrams_rejected": 3, "datagrams_invalid": 3, "datagrams_replayed": 5})
    assert d["consistent"] is False and d["flow_control"] == 0
    assert datagram_breakdown({"datagrams_forged": 4, "datagrams_invalid": 1,
                               "datagrams_rejected": 9})["consistent"] is False, "forged is part of invalid"
    assert datagram_breakdown({"examples": 3}) is None
    s = TrainingStats()
    s.add_worker_payload(_synthetic_recorder("w", [0.1]).to_payload())
    s.count(CounterName.DATAGRAMS_REJECTED, 3)
    s.count(CounterName.DATAGRAMS_REPLAYED, 5)
    assert "datagram counters are inconsistent: expect forged <= invalid and invalid + replayed <= rejected" \
        in s.summary()


def test_datagram_definitions_are_documented_in_names():
    doc = stats_pkg.names.__doc__
    assert "``datagrams_rejected``\n    Every received datagram that was dropped, for any reason" in doc
    assert "``invalid + replayed <= rejected``" in doc


# ---------------------------------------------------------------- structure
def test_stats_modules_do_not_import_pyspark_and_stay_small():
    files = sorted(Path(stats_pkg.__file__).parent.glob("*.py"))
    assert len(files) >= 9, [f.name for f in files]
    for path in files:
        source = path.read_text()
        tree = ast.parse(source)
        names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        assert not [n for n in names if n.split(".")[0] == "pyspark"], f"{path.name} imports pyspark"
        assert source.count("\n") < 500, f"{path.name} has {source.count(chr(10))} lines"


def test_public_names_are_importable_from_the_package():
    for name in stats_pkg.__all__:
        assert hasattr(stats_pkg, name), name
    assert {"Phase", "CounterName", "SeriesName", "PhaseRecorder", "TrainingStats", "Regime", "Event",
            "iteration_verdict", "format_seconds", "task_lane", "DRIVER_LANE"} <= set(stats_pkg.__all__)
