"""Training statistics: per-phase timings, counters and series, from the workers to one report.

Two halves, neither of which imports pyspark:

* :class:`PhaseRecorder` lives in a Spark task. It records phases
  (``with rec.phase("fit", minibatch=i): ...``), counters
  (``rec.count("bytes_sent", n)``) and per-iteration series
  (``rec.series("threshold", step, tau)``), and turns them into a payload of
  plain dicts, lists, strings and numbers (:meth:`PhaseRecorder.to_payload`)
  that the task returns to the driver with its result.
* :class:`TrainingStats` lives on the driver. It records the driver's own
  phases (:meth:`TrainingStats.timed`), merges worker payloads
  (:meth:`TrainingStats.add_worker_payload`), and answers the question users
  of DL4J could not answer: *where did the time go, and is Spark worth it
  here?* (:meth:`TrainingStats.summary`). It exports JSON, CSV and one
  self-contained HTML page (:meth:`TrainingStats.to_html`).

Clocks and lane alignment
-------------------------
Every event belongs to a *lane*: ``"driver"`` or a worker lane such as
``"host/pid/partition"`` (:func:`default_lane`). Within a lane, times come
from ``time.perf_counter()`` (monotonic, high resolution) relative to the
moment the recorder was created, so clock skew or an NTP step can never
reorder or stretch events within a lane. Each recorder also takes one
wall-clock anchor (``time.time()`` at creation). On the driver all times are
seconds since the :class:`TrainingStats` was created ("origin"); driver
events map through the driver's own ``perf_counter``, and a worker payload is
placed by its wall anchor: the task's start sits at ``wall_anchor -
origin_wall``. The whole lane is shifted as one block, so only its offset can
be wrong, by the clock difference between the two machines. When the driver
also passes ``launched`` / ``returned`` (its own ``perf_counter`` readings
around the Spark job), the offset is clamped so that the task lies inside
that window: a task cannot start before it was launched nor end after its
result came back. The correction applied is kept per task
(:attr:`TrainingStats.max_clock_correction`). No synchronised clocks (no NTP
server) are required.

How time is split
-----------------
``compute`` is the sum of all ``"fit"`` phases (one per minibatch) over all
lanes. ``overhead`` is the sum of every other phase except the *span* phases
(``"round"``, ``"epoch"``, which enclose other phases and would count them
twice) and ``"evaluate"`` (not training). Both are lane-seconds, i.e. summed
over lanes: four workers fitting for one second each are four seconds of
compute. Phases on one lane should therefore not nest, apart from span
phases. :attr:`TrainingStats.utilisation` relates compute to wall time:
``compute / (train_seconds * workers)``.
"""
from __future__ import annotations

import csv
import json
import logging
import math
import os
import re
import socket
import threading
import time
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, NamedTuple

import numpy as np

__all__ = [
    "Phase",
    "CounterName",
    "SeriesName",
    "Regime",
    "DRIVER_LANE",
    "DRIVER_PHASES",
    "WORKER_PHASES",
    "COMPUTE_PHASES",
    "SPAN_PHASES",
    "NON_TRAINING_PHASES",
    "SHARING_PHASES",
    "NEAR_LINEAR_SECONDS",
    "WORTH_IT_SECONDS",
    "SINGLE_MACHINE_SECONDS",
    "Event",
    "PhaseRecorder",
    "TrainingStats",
    "default_lane",
    "iteration_verdict",
    "format_seconds",
]

logger = logging.getLogger(__name__)


class Phase:
    """Recommended phase names (plain ``str`` constants, safe to pickle).

    Driver: ``BROADCAST`` (create/ship a broadcast), ``AGGREGATE``
    (treeAggregate / collect), ``AVERAGE`` (divide and set params), ``EXPORT``
    (minibatch export), ``CHECKPOINT``, ``ROUND`` and ``EPOCH`` (spans that
    enclose the others), ``EVALUATE``. Worker: ``FETCH`` (broadcast fetch /
    param load), ``MODEL_INIT``, ``FIT`` (one per minibatch), ``DATA_LOAD``,
    ``ENCODE``, ``SEND``, ``APPLY`` (gradient sharing), ``IDLE`` / ``WAIT``.
    Any other string works too; it counts as overhead.
    """

    BROADCAST = "broadcast"
    AGGREGATE = "aggregate"
    AVERAGE = "average"
    EXPORT = "export"
    CHECKPOINT = "checkpoint"
    ROUND = "round"
    EPOCH = "epoch"
    EVALUATE = "evaluate"
    FETCH = "fetch"
    MODEL_INIT = "model_init"
    FIT = "fit"
    DATA_LOAD = "data_load"
    ENCODE = "encode"
    SEND = "send"
    APPLY = "apply"
    IDLE = "idle"
    WAIT = "wait"


class CounterName:
    """Recommended counter names; :meth:`TrainingStats.summary` reads these."""

    EXAMPLES = "examples"
    BYTES_SENT = "bytes_sent"
    DENSE_BYTES = "dense_bytes_equivalent"
    MESSAGES_SENT = "messages_sent"
    MESSAGES_RECEIVED = "messages_received"
    DATAGRAMS_RETRANSMITTED = "datagrams_retransmitted"
    DATAGRAMS_REJECTED = "datagrams_rejected"


class SeriesName:
    """Recommended per-iteration series names (gradient sharing, DL4J issue 5931)."""

    THRESHOLD = "threshold"
    SPARSITY = "sparsity"
    RESIDUAL_NORM = "residual_norm"
    SCORE = "score"


DRIVER_LANE = "driver"
DRIVER_PHASES = (Phase.BROADCAST, Phase.AGGREGATE, Phase.AVERAGE, Phase.EXPORT,
                 Phase.CHECKPOINT, Phase.ROUND, Phase.EPOCH, Phase.EVALUATE)
WORKER_PHASES = (Phase.FETCH, Phase.MODEL_INIT, Phase.FIT, Phase.DATA_LOAD, Phase.ENCODE,
                 Phase.SEND, Phase.APPLY, Phase.IDLE, Phase.WAIT)
COMPUTE_PHASES = frozenset({Phase.FIT})
SPAN_PHASES = frozenset({Phase.ROUND, Phase.EPOCH})
NON_TRAINING_PHASES = frozenset({Phase.EVALUATE})
SHARING_PHASES = (Phase.ENCODE, Phase.SEND, Phase.APPLY)

# The seeds' guidance (REFERENCE.md section 2), per minibatch fit.
NEAR_LINEAR_SECONDS = 0.100
WORTH_IT_SECONDS = 0.150
SINGLE_MACHINE_SECONDS = 0.001

_PAYLOAD_FORMAT = "sparkavg.stats.payload/1"
_STATS_FORMAT = "sparkavg.stats/1"


def default_lane(partition: int | None = None) -> str:
    """Lane name ``"host/pid/partition"`` for the calling process.

    Parameters
    ----------
    partition : int, optional
        Spark partition id (``TaskContext.get().partitionId()``); ``"-"`` if None.
    """
    return f"{socket.gethostname()}/{os.getpid()}/{'-' if partition is None else partition}"


def format_seconds(seconds: float | None) -> str:
    """Human-readable duration: ``"850 us"``, ``"12.3 ms"``, ``"4.56 s"``, ``"2.1 min"``."""
    if seconds is None or not math.isfinite(seconds):
        return "n/a"
    s = abs(seconds)
    if s < 1e-3:
        return f"{seconds * 1e6:.0f} us"
    if s < 1.0:
        return f"{seconds * 1e3:.3g} ms"
    if s < 120.0:
        return f"{seconds:.3g} s"
    return f"{seconds / 60:.3g} min"


def _plain(value: Any) -> Any:
    """A value fit for a payload: numpy scalars unwrapped, anything else odd as str."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, np.generic):
        return value.item()
    # Subclasses (IntEnum, str-mixin Enum ...) become their base type: no custom classes in payloads.
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str.__str__(value)
    return str(value)


def _plain_fields(fields: Mapping[str, Any] | None) -> dict | None:
    if not fields:
        return None
    return {str(k): _plain(v) for k, v in fields.items()}


def _finite_or_none(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


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
    """Worker-side recorder of phases, counters and series; cheap and picklable.

    Create one per Spark task, inside the task (its clocks are read at
    creation), record into it, and return :meth:`to_payload` with the
    task's result.

    Parameters
    ----------
    lane : str, optional
        Lane name shown on the timeline; default :func:`default_lane` (partition).
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

    __slots__ = ("lane", "wall_anchor", "perf_anchor", "_events", "_counters", "_series")

    def __init__(self, lane: str | None = None, *, partition: int | None = None):
        self.wall_anchor = time.time()
        self.perf_anchor = time.perf_counter()
        self.lane = str(lane) if lane is not None else default_lane(partition)
        self._events: list[tuple] = []
        self._counters: dict[str, float] = {}
        self._series: dict[str, list[list]] = {}

    def phase(self, name: str, **fields: Any) -> _PhaseTimer:
        """Time the ``with`` block as phase ``name``; ``fields`` (plain values) go with it.

        If the block raises, the event is still recorded with ``failed=<ExceptionName>``.
        """
        return _PhaseTimer(self._events, self.perf_anchor, name, fields)

    def add(self, phase: str, start: float, duration: float, **fields: Any) -> None:
        """Record a phase timed elsewhere.

        Parameters
        ----------
        phase : str
        start : float
            A ``time.perf_counter()`` reading taken in this process.
        duration : float
            Seconds, >= 0.
        """
        if not duration >= 0:
            raise ValueError(f"Expect duration >= 0 seconds for phase {phase!r}, got {duration}")
        self._events.append((phase, float(start) - self.perf_anchor, float(duration), fields or None))

    def count(self, name: str, value: float = 1) -> None:
        """Add ``value`` to counter ``name`` (bytes, messages, examples ...)."""
        self._counters[name] = self._counters.get(name, 0) + value

    def series(self, name: str, step: int, value: float) -> None:
        """Append ``(step, value)`` to series ``name``; ``step`` should be a global iteration number."""
        points = self._series.get(name)
        if points is None:
            points = self._series[name] = []
        points.append([step, value])

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
            creation), ``counters``, ``series`` (``name -> [[step, value], ...]``).
        """
        elapsed = time.perf_counter() - self.perf_anchor
        events = [[p if type(p) is str else str(p), float(s), float(d), _plain_fields(f)]
                  for p, s, d, f in self._events]
        if events:
            elapsed = max(elapsed, max(s + d for _, s, d, _ in events))
        return {
            "format": _PAYLOAD_FORMAT,
            "lane": self.lane,
            "wall_anchor": float(self.wall_anchor),
            "elapsed": float(elapsed),
            "events": events,
            "counters": {str(k): _plain(v) for k, v in self._counters.items()},
            "series": {str(k): [[_plain(s), _plain(v)] for s, v in pts] for k, pts in self._series.items()},
        }


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


class Regime(str, Enum):
    """What the mean iteration time says about scaling (REFERENCE.md section 2)."""

    NEAR_LINEAR = "near-linear"
    SUB_LINEAR = "sub-linear"
    SINGLE_MACHINE = "single-machine"
    UNKNOWN = "unknown"


def iteration_verdict(mean_iteration_seconds: float | None) -> tuple[Regime, str]:
    """Judge a mean per-minibatch fit time against the seeds' guidance.

    >= 100 ms: near-linear scaling (borderline below 150 ms); between 1 ms
    and 100 ms (the "~10 ms" regime): sub-linear; <= 1 ms: one machine is
    probably faster.

    Returns
    -------
    (Regime, str)
        The regime and one sentence (no trailing period) saying it.
    """
    t = mean_iteration_seconds
    if t is None or not math.isfinite(t):
        return Regime.UNKNOWN, "no per-minibatch fit timings were recorded, so whether Spark pays is unknown"
    shown = format_seconds(t)
    if t >= NEAR_LINEAR_SECONDS:
        text = f"at {shown} per iteration (>= 100 ms) Spark is likely to pay: scaling should be near-linear"
        if t < WORTH_IT_SECONDS:
            text += " (borderline: the seeds caution that below ~150 ms Spark may not be worth it)"
        return Regime.NEAR_LINEAR, text
    if t > SINGLE_MACHINE_SECONDS:
        return Regime.SUB_LINEAR, (
            f"at {shown} per iteration (between 1 ms and 100 ms, the seeds' ~10 ms case) expect sub-linear scaling: "
            "per-round overhead eats much of the gain, and below ~150 ms Spark may not be worth it; "
            "larger minibatches (more work per iteration) help")
    return Regime.SINGLE_MACHINE, (
        f"at {shown} per iteration (<= 1 ms) a single machine is probably faster than Spark; "
        "train locally or make each iteration much larger")


class TrainingStats:
    """Driver-side collection of phase timings, counters and series, with reports.

    Parameters
    ----------
    workers : int, optional
        Number of concurrent workers, used for :attr:`utilisation`. Default:
        the largest number of worker tasks seen running at once.

    Attributes
    ----------
    origin_wall : float
        ``time.time()`` at creation; timeline times are seconds since then.
    origin_perf : float
        ``time.perf_counter()`` at creation (driver process only).
    """

    def __init__(self, *, workers: int | None = None):
        if workers is not None and int(workers) < 1:
            raise ValueError(f"Expect workers >= 1 or None, got {workers}")
        self.workers = None if workers is None else int(workers)
        self.origin_wall = time.time()
        self.origin_perf = time.perf_counter()
        self._events: list[Event] = []
        self._tasks: list[Task] = []
        self._counters: dict[str, float] = {}
        self._series: dict[str, dict[str, list[list]]] = {}
        self._train_seconds: float | None = None
        self._lock = threading.Lock()
        self._version = 0
        self._cache: tuple[int, dict] | None = None

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        del state["_lock"]
        state["_cache"] = None
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ recording
    def record(self, phase: str, start: float, end: float, lane: str = DRIVER_LANE,
               epoch: int | None = None, round: int | None = None, **fields: Any) -> None:
        """Record a phase from ``start`` to ``end``, both ``time.perf_counter()`` readings on the driver."""
        if not end >= start:
            raise ValueError(f"Expect end >= start for phase {phase!r}, got start={start}, end={end}")
        event = Event(str(lane), str(phase), start - self.origin_perf, end - start, epoch, round,
                      _plain_fields(fields))
        with self._lock:
            self._events.append(event)
            self._version += 1

    @contextmanager
    def timed(self, phase: str, lane: str = DRIVER_LANE, epoch: int | None = None,
              round: int | None = None, **fields: Any) -> Iterator[None]:
        """Context manager: record the ``with`` block as ``phase`` (also if it raises)."""
        start = time.perf_counter()
        try:
            yield
        except BaseException as exc:
            fields = dict(fields, failed=type(exc).__name__)
            raise
        finally:
            self.record(phase, start, time.perf_counter(), lane, epoch, round, **fields)

    def count(self, name: str, value: float = 1) -> None:
        """Add ``value`` to counter ``name``."""
        with self._lock:
            self._counters[name] = self._counters.get(name, 0) + value

    def series(self, name: str, step: int, value: float, lane: str = DRIVER_LANE) -> None:
        """Append ``(step, value)`` to series ``name`` of ``lane``."""
        with self._lock:
            self._series.setdefault(name, {}).setdefault(lane, []).append([step, value])

    def add_worker_payload(self, payload: Mapping[str, Any], epoch: int | None = None,
                           round: int | None = None, launched: float | None = None,
                           returned: float | None = None) -> None:
        """Merge one :meth:`PhaseRecorder.to_payload` result.

        Parameters
        ----------
        payload : dict
            As returned by the task (after crossing Spark).
        epoch, round : int, optional
            Attached to every event of the payload.
        launched, returned : float, optional
            Driver ``time.perf_counter()`` readings just before the Spark job
            was started and just after its results came back; the lane is
            shifted into this window if the clocks disagree (see module doc).
        """
        if not isinstance(payload, Mapping) or payload.get("format") != _PAYLOAD_FORMAT:
            got = payload.get("format") if isinstance(payload, Mapping) else type(payload).__name__
            raise ValueError(f"Expect a PhaseRecorder.to_payload() dict (format {_PAYLOAD_FORMAT!r}), got {got!r}")
        lane = str(payload["lane"])
        elapsed = float(payload["elapsed"])
        naive = float(payload["wall_anchor"]) - self.origin_wall
        origin = naive
        if returned is not None:
            origin = min(origin, returned - self.origin_perf - elapsed)
        if launched is not None:
            origin = max(origin, launched - self.origin_perf)
        correction = origin - naive
        if abs(correction) > 0.05:
            logger.debug("lane %s: clock offset corrected by %.3f s into the job window", lane, correction)
        events = [Event(lane, p, origin + s, d, epoch, round, f) for p, s, d, f in payload["events"]]
        with self._lock:
            self._events.extend(events)
            self._tasks.append(Task(lane, origin, origin + elapsed, epoch, round, correction))
            for name, value in payload["counters"].items():
                self._counters[name] = self._counters.get(name, 0) + value
            for name, points in payload["series"].items():
                self._series.setdefault(name, {}).setdefault(lane, []).extend(points)
            self._version += 1

    def add_worker_payloads(self, payloads: Iterable[Mapping[str, Any]], **kwargs: Any) -> None:
        """:meth:`add_worker_payload` for each payload, with the same keyword arguments."""
        for payload in payloads:
            self.add_worker_payload(payload, **kwargs)

    # ------------------------------------------------------------------ raw views
    @property
    def events(self) -> list[Event]:
        """All events (a copy), in recording order."""
        return list(self._events)

    @property
    def tasks(self) -> list[Task]:
        """One span per merged worker payload (a copy)."""
        return list(self._tasks)

    @property
    def counters(self) -> dict[str, float]:
        """Counters summed over all lanes (a copy)."""
        return dict(self._counters)

    @property
    def series_data(self) -> dict[str, dict[str, list[list]]]:
        """``name -> lane -> [[step, value], ...]`` (a copy)."""
        return {n: {lane: [list(p) for p in pts] for lane, pts in by.items()} for n, by in self._series.items()}

    @property
    def lanes(self) -> list[str]:
        """Lane names: the driver first (if it has events), then workers sorted."""
        names = {e.lane for e in self._events} | {t.lane for t in self._tasks}
        ordered = sorted(names - {DRIVER_LANE})
        return ([DRIVER_LANE] if DRIVER_LANE in names else []) + ordered

    def durations(self, phase: str) -> np.ndarray:
        """Durations in seconds (float64) of every event of ``phase``."""
        return self._by_phase().get(phase, np.empty(0))

    def _by_phase(self) -> dict[str, np.ndarray]:
        cache = self._cache
        if cache is not None and cache[0] == self._version:
            return cache[1]
        lists: dict[str, list[float]] = {}
        for e in self._events:
            lists.setdefault(e.phase, []).append(e.duration)
        arrays = {p: np.asarray(d, dtype=np.float64) for p, d in lists.items()}
        self._cache = (self._version, arrays)
        return arrays

    # ------------------------------------------------------------------ derived
    def phase_totals(self) -> dict[str, dict[str, float]]:
        """Per phase: ``count``, ``total``, ``mean``, ``p50``, ``p95``, ``max`` (seconds), largest total first."""
        out = {}
        for phase, d in self._by_phase().items():
            p50, p95 = np.percentile(d, [50, 95])
            out[phase] = {"count": int(d.size), "total": float(d.sum()), "mean": float(d.mean()),
                          "p50": float(p50), "p95": float(p95), "max": float(d.max())}
        return dict(sorted(out.items(), key=lambda kv: -kv[1]["total"]))

    @property
    def compute_seconds(self) -> float:
        """Lane-seconds spent in compute phases (``"fit"``)."""
        return float(sum(d.sum() for p, d in self._by_phase().items() if p in COMPUTE_PHASES))

    def overhead_breakdown(self) -> dict[str, float]:
        """Lane-seconds per overhead phase (not compute, span or non-training), largest first."""
        excluded = COMPUTE_PHASES | SPAN_PHASES | NON_TRAINING_PHASES
        totals = {p: float(d.sum()) for p, d in self._by_phase().items() if p not in excluded}
        return dict(sorted(totals.items(), key=lambda kv: -kv[1]))

    @property
    def overhead_seconds(self) -> float:
        """Lane-seconds in every phase that is not compute, a span, or evaluation."""
        return float(sum(self.overhead_breakdown().values()))

    @property
    def compute_overhead_ratio(self) -> float | None:
        """``compute_seconds / overhead_seconds``; inf without overhead, None without compute."""
        compute, overhead = self.compute_seconds, self.overhead_seconds
        if compute <= 0:
            return None
        return compute / overhead if overhead > 0 else math.inf

    @property
    def train_seconds(self) -> float | None:
        """Training wall time: set explicitly, else the driver's ``"epoch"`` spans,
        else its ``"round"`` spans, else the extent of all events; None if empty."""
        if self._train_seconds is not None:
            return self._train_seconds
        for span in (Phase.EPOCH, Phase.ROUND):
            d = [e.duration for e in self._events if e.phase == span and e.lane == DRIVER_LANE]
            if d:
                return float(sum(d))
        starts = [e.start for e in self._events] + [t.start for t in self._tasks]
        ends = [e.end for e in self._events] + [t.end for t in self._tasks]
        return float(max(ends) - min(starts)) if starts else None

    @train_seconds.setter
    def train_seconds(self, seconds: float | None) -> None:
        if seconds is not None and not seconds >= 0:
            raise ValueError(f"Expect train_seconds >= 0 or None, got {seconds}")
        self._train_seconds = None if seconds is None else float(seconds)

    @property
    def examples(self) -> int | None:
        """Examples trained: counter ``"examples"``, else the sum of the ``examples`` field of fit events."""
        if CounterName.EXAMPLES in self._counters:
            return int(self._counters[CounterName.EXAMPLES])
        n = [e.fields["examples"] for e in self._events
             if e.phase == Phase.FIT and e.fields and "examples" in e.fields]
        return int(sum(n)) if n else None

    @property
    def examples_per_second(self) -> float | None:
        """:attr:`examples` / :attr:`train_seconds`, None when either is unknown."""
        n, t = self.examples, self.train_seconds
        return n / t if n is not None and t else None

    @property
    def n_workers(self) -> int | None:
        """``workers`` if given, else the most worker tasks seen running at once, else worker lanes."""
        if self.workers is not None:
            return self.workers
        if self._tasks:
            marks = sorted([(t.start, 1) for t in self._tasks] + [(t.end, -1) for t in self._tasks],
                           key=lambda m: (m[0], m[1]))  # ends before starts at ties
            running = peak = 0
            for _, step in marks:
                running += step
                peak = max(peak, running)
            return peak
        workers = [lane for lane in self.lanes if lane != DRIVER_LANE]
        return len(workers) or None

    @property
    def utilisation(self) -> float | None:
        """Fraction of worker wall time spent fitting: ``compute / (train_seconds * n_workers)``."""
        t, n, compute = self.train_seconds, self.n_workers, self.compute_seconds
        return compute / (t * n) if t and n and compute > 0 else None

    @property
    def mean_iteration_seconds(self) -> float | None:
        """Mean per-minibatch ``"fit"`` time, None if none was recorded."""
        d = self.durations(Phase.FIT)
        return float(d.mean()) if d.size else None

    def verdict(self) -> tuple[Regime, str]:
        """:func:`iteration_verdict` of :attr:`mean_iteration_seconds`."""
        return iteration_verdict(self.mean_iteration_seconds)

    @property
    def compression_ratio(self) -> float | None:
        """``dense_bytes_equivalent / bytes_sent`` when both counters exist."""
        sent = self._counters.get(CounterName.BYTES_SENT)
        dense = self._counters.get(CounterName.DENSE_BYTES)
        return dense / sent if sent and dense else None

    @property
    def max_clock_correction(self) -> float:
        """Largest absolute lane shift applied to fit a task into its job window (seconds)."""
        return max((abs(t.clock_correction) for t in self._tasks), default=0.0)

    def summary(self) -> str:
        """One paragraph: throughput, time split, iteration time and whether Spark is likely to pay."""
        parts = []
        t, n, eps, workers = self.train_seconds, self.examples, self.examples_per_second, self.n_workers
        on = f" on {workers} worker{'s' if workers != 1 else ''}" if workers else ""
        if eps is not None:
            parts.append(f"Training took {format_seconds(t)} for {n:,} examples ({eps:,.0f} examples/s){on}.")
        elif t is not None:
            parts.append(f"Training took {format_seconds(t)}{on} (example count not recorded).")
        else:
            return "No training statistics were recorded."
        compute, breakdown = self.compute_seconds, self.overhead_breakdown()
        overhead = sum(breakdown.values())
        split = f"Time split over lanes: {format_seconds(compute)} fitting minibatches vs {format_seconds(overhead)} overhead"
        ratio = self.compute_overhead_ratio
        if ratio is not None and math.isfinite(ratio):
            split += f" (compute/overhead {ratio:.2f}" if ratio < 100 else f" (compute/overhead {ratio:,.0f}"
            top = [f"{p} {format_seconds(s)}" for p, s in list(breakdown.items())[:3] if s > 0]
            split += f"; largest: {', '.join(top)})" if top else ")"
        util = self.utilisation
        if util is not None:
            split += f"; workers spent {util:.0%} of the wall time fitting"
        parts.append(split + ".")
        fit = self.durations(Phase.FIT)
        regime, text = self.verdict()
        if fit.size:
            parts.append(f"Mean iteration (one minibatch fit) {format_seconds(float(fit.mean()))} "
                         f"(p95 {format_seconds(float(np.percentile(fit, 95)))}, {fit.size:,} iterations): {text}.")
        else:
            parts.append(text[0].upper() + text[1:] + ".")
        sharing = sum(self.durations(p).sum() for p in SHARING_PHASES)
        if sharing > 0 and fit.size:
            parts.append(f"Gradient-sharing overhead (encode + send + apply) is {format_seconds(sharing / fit.size)} "
                         f"per iteration.")
        ratio = self.compression_ratio
        if ratio is not None:
            parts.append(f"Updates sent {_format_bytes(self._counters[CounterName.BYTES_SENT])} where dense "
                         f"updates would be {_format_bytes(self._counters[CounterName.DENSE_BYTES])} "
                         f"(compression {ratio:,.1f}x).")
        return " ".join(parts)

    # ------------------------------------------------------------------ export
    def to_dict(self) -> dict:
        """Plain, JSON-ready dict of everything recorded plus a ``derived`` section (ignored by :meth:`from_dict`)."""
        lanes = self.lanes
        index = {lane: i for i, lane in enumerate(lanes)}
        ratio = self.compute_overhead_ratio
        regime, _ = self.verdict()
        return {
            "format": _STATS_FORMAT,
            "origin_wall": self.origin_wall,
            "workers": self.workers,
            "train_seconds_set": self._train_seconds,
            "lanes": lanes,
            "events": [[index[e.lane], e.phase, e.start, e.duration, e.epoch, e.round, _json_fields(e.fields)]
                       for e in self._events],
            "tasks": [[index[t.lane], t.start, t.end, t.epoch, t.round, t.clock_correction] for t in self._tasks],
            "counters": {k: _json_number(v) for k, v in self._counters.items()},
            "series": {name: {lane: [[s, _json_number(v)] for s, v in pts] for lane, pts in by.items()}
                       for name, by in self._series.items()},
            "derived": {
                "phase_totals": self.phase_totals(),
                "train_seconds": self.train_seconds,
                "examples": self.examples,
                "examples_per_second": self.examples_per_second,
                "compute_seconds": self.compute_seconds,
                "overhead_seconds": self.overhead_seconds,
                "compute_overhead_ratio": _finite_or_none(ratio),
                "utilisation": self.utilisation,
                "mean_iteration_seconds": self.mean_iteration_seconds,
                "regime": regime.value,
                "compression_ratio": self.compression_ratio,
                "max_clock_correction": self.max_clock_correction,
                "summary": self.summary(),
            },
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "TrainingStats":
        """Rebuild from :meth:`to_dict` output (JSON-decoded or not)."""
        if data.get("format") != _STATS_FORMAT:
            raise ValueError(f"Expect a TrainingStats.to_dict() dict (format {_STATS_FORMAT!r}), "
                             f"got {data.get('format')!r}")
        stats = cls(workers=data.get("workers"))
        stats.origin_wall = float(data["origin_wall"])
        stats._train_seconds = data.get("train_seconds_set")
        lanes = data["lanes"]
        stats._events = [Event(lanes[li], p, float(s), float(d), ep, rd, f)
                         for li, p, s, d, ep, rd, f in data["events"]]
        stats._tasks = [Task(lanes[li], float(s), float(e), ep, rd, float(c))
                        for li, s, e, ep, rd, c in data["tasks"]]
        stats._counters = dict(data["counters"])
        stats._series = {name: {lane: [[s, math.nan if v is None else v] for s, v in pts]
                                for lane, pts in by.items()} for name, by in data["series"].items()}
        stats._version += 1
        return stats

    def to_json(self, path: str | os.PathLike | None = None, *, indent: int | None = None) -> str:
        """JSON text of :meth:`to_dict` (strict JSON: non-finite numbers become null); written to ``path`` if given."""
        text = json.dumps(self.to_dict(), indent=indent, allow_nan=False, default=_json_default)
        if path is not None:
            Path(path).write_text(text, encoding="utf-8")
        return text

    @classmethod
    def from_json(cls, text_or_path: str | os.PathLike) -> "TrainingStats":
        """Inverse of :meth:`to_json`: JSON text, or a path to a file holding it."""
        text = str(text_or_path)
        if not text.lstrip().startswith("{"):
            text = Path(text_or_path).read_text(encoding="utf-8")
        return cls.from_dict(json.loads(text))

    def to_csv(self, directory: str | os.PathLike) -> list[Path]:
        """Write ``phase_<name>.csv`` per phase (one row per event, like DL4J's
        per-phase files), ``phase_totals.csv``, ``counters.csv`` and ``series.csv``.

        Returns
        -------
        list of Path
            The files written.
        """
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        written = []
        by_phase: dict[str, list[Event]] = {}
        for e in self._events:
            by_phase.setdefault(e.phase, []).append(e)
        used: set[str] = set()
        for phase, events in by_phase.items():
            slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", phase).strip("._") or "phase"
            while slug in used:
                slug += "_"
            used.add(slug)
            keys = sorted({k for e in events if e.fields for k in e.fields})
            path = out / f"phase_{slug}.csv"
            with open(path, "w", newline="", encoding="utf-8") as fh:
                w = csv.writer(fh)
                w.writerow(["lane", "phase", "epoch", "round", "start_s", "end_s", "duration_s", *keys])
                for e in events:
                    f = e.fields or {}
                    w.writerow([e.lane, e.phase, _blank(e.epoch), _blank(e.round), f"{e.start:.6f}",
                                f"{e.end:.6f}", f"{e.duration:.6f}", *(_blank(f.get(k)) for k in keys)])
            written.append(path)
        path = out / "phase_totals.csv"
        with open(path, "w", newline="", encoding="utf-8") as fh:
            w = csv.writer(fh)
            w.writerow(["phase", "count", "total_s", "mean_s", "p50_s", "p95_s", "max_s"])
            for phase, t in self.phase_totals().items():
                w.writerow([phase, t["count"], t["total"], t["mean"], t["p50"], t["p95"], t["max"]])
        written.append(path)
        path = out / "counters.csv"
        with open(path, "w", newline="", encoding="utf-8") as fh:
            w = csv.writer(fh)
            w.writerow(["counter", "value"])
            w.writerows(sorted(self._counters.items()))
        written.append(path)
        path = out / "series.csv"
        with open(path, "w", newline="", encoding="utf-8") as fh:
            w = csv.writer(fh)
            w.writerow(["series", "lane", "step", "value"])
            for name, by in self._series.items():
                for lane, pts in by.items():
                    w.writerows([name, lane, s, v] for s, v in pts)
        written.append(path)
        return written

    def to_html(self, path: str | os.PathLike | None = None, *, max_bars: int = 5000,
                max_points: int = 2000, title: str = "sparkavg training statistics") -> str:
        """One self-contained HTML page (inline SVG and CSS, nothing fetched).

        Timeline (one lane per worker plus the driver; binned when more than
        ``max_bars`` events), per-phase duration histograms, phase totals,
        the summary, counters, and line charts of every series (at most
        ``max_points`` points per line). Written to ``path`` if given.
        """
        from .report_html import render_html

        text = render_html(self, max_bars=max_bars, max_points=max_points, title=title)
        if path is not None:
            Path(path).write_text(text, encoding="utf-8")
        return text

    def __repr__(self) -> str:
        return (f"TrainingStats(events={len(self._events)}, tasks={len(self._tasks)}, "
                f"lanes={len(self.lanes)}, counters={len(self._counters)}, series={len(self._series)})")


def _format_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.3g} {unit}"
        n /= 1000.0
    return f"{n} B"  # unreachable


def _json_number(value: Any) -> Any:
    """Strict-JSON value: non-finite floats become None (read back as NaN in series)."""
    if isinstance(value, (float, np.floating)):
        return float(value) if math.isfinite(value) else None
    return value


def _json_fields(fields: dict | None) -> dict | None:
    if not fields:
        return None
    return {k: _json_number(v) for k, v in fields.items()}


def _json_default(obj: Any) -> Any:
    if isinstance(obj, np.generic):
        return obj.item()
    return str(obj)


def _blank(value: Any) -> Any:
    return "" if value is None else value
