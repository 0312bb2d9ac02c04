"""Driver side: :class:`TrainingStats`, the one object users and masters hold.

It records the driver's own phases, counters, series and decisions, merges
worker payloads onto one timeline (:mod:`.timeline`), answers *where did the
time go, and is Spark worth it here?* (:mod:`.analysis`), and exports JSON,
CSV (:mod:`.export`), a Chrome trace (:mod:`.trace`) and one self-contained
HTML page (:mod:`.html`).
"""
from __future__ import annotations

import os
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

import numpy as np

from . import export, html, trace
from .analysis import Analysis, Regime
from .names import CounterName, Phase, SeriesName
from .recorder import DRIVER_LANE, check_decision, json_fields
from .timeline import Event, Recording, Task, place_payload

__all__ = ["TrainingStats"]


class TrainingStats:
    """Driver-side collection of phase timings, counters, series and decisions, with reports.

    Names must be :class:`~.names.Phase`, :class:`~.names.CounterName` or
    :class:`~.names.SeriesName` members or their exact string values; any
    other name raises ``ValueError`` (a typo must not count as overhead).
    Thread-safe for recording.

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
        self._rec = Recording(origin_wall=time.time(), origin_perf=time.perf_counter(),
                              workers=None if workers is None else int(workers))
        self._lock = threading.Lock()
        self._version = 0
        self._cache: tuple[int, Analysis] | None = None

    @classmethod
    def _of(cls, recording: Recording) -> "TrainingStats":
        stats = cls.__new__(cls)
        stats._rec, stats._lock, stats._version, stats._cache = recording, threading.Lock(), 0, None
        return stats

    def __getstate__(self) -> dict:
        return {"recording": self._rec}

    def __setstate__(self, state: dict) -> None:
        self._rec, self._lock, self._version, self._cache = state["recording"], threading.Lock(), 0, None

    # ------------------------------------------------------------------ plain attributes
    @property
    def workers(self) -> int | None:
        """Concurrent workers as given at creation (None: inferred, see :attr:`n_workers`)."""
        return self._rec.workers

    @workers.setter
    def workers(self, value: int | None) -> None:
        if value is not None and int(value) < 1:
            raise ValueError(f"Expect workers >= 1 or None, got {value}")
        with self._lock:
            self._rec.workers = None if value is None else int(value)
            self._changed()

    @property
    def origin_wall(self) -> float:
        return self._rec.origin_wall

    @origin_wall.setter
    def origin_wall(self, value: float) -> None:
        self._rec.origin_wall = float(value)
        self._changed()

    @property
    def origin_perf(self) -> float:
        return self._rec.origin_perf

    def _changed(self) -> None:
        self._version += 1

    def _analysis(self) -> Analysis:
        cache = self._cache
        if cache is not None and cache[0] == self._version:
            return cache[1]
        with self._lock:
            version, snapshot = self._version, self._rec.snapshot()
        analysis = Analysis(snapshot)
        self._cache = (version, analysis)
        return analysis

    # ------------------------------------------------------------------ recording
    def record(self, phase: Phase | str, start: float, end: float, lane: str = DRIVER_LANE,
               epoch: int | None = None, round: int | None = None, **fields: Any) -> None:
        """Record a phase from ``start`` to ``end``, both ``time.perf_counter()`` readings on the driver."""
        name = Phase.check(phase)
        if not end >= start:
            raise ValueError(f"Expect end >= start for phase {name!r}, got start={start}, end={end}")
        event = Event(str(lane), name, start - self._rec.origin_perf, end - start, epoch, round, json_fields(fields))
        with self._lock:
            self._rec.events.append(event)
            self._changed()

    @contextmanager
    def timed(self, phase: Phase | str, lane: str = DRIVER_LANE, epoch: int | None = None,
              round: int | None = None, **fields: Any) -> Iterator[None]:
        """Context manager: record the ``with`` block as ``phase`` (also if it raises).

        An unknown ``phase`` raises ``ValueError`` before the block runs.
        """
        name = Phase.check(phase)
        start = time.perf_counter()
        try:
            yield
        except BaseException as exc:
            fields = dict(fields, failed=type(exc).__name__)
            raise
        finally:
            self.record(name, start, time.perf_counter(), lane, epoch, round, **fields)

    def count(self, name: CounterName | str, value: float = 1) -> None:
        """Add ``value`` to counter ``name``."""
        key = CounterName.check(name)
        with self._lock:
            self._rec.counters[key] = self._rec.counters.get(key, 0) + value
            self._changed()

    def series(self, name: SeriesName | str, step: int, value: float, lane: str = DRIVER_LANE) -> None:
        """Append ``(step, value)`` to series ``name`` of ``lane`` (the time of the call is kept too)."""
        key = SeriesName.check(name)
        t = time.perf_counter() - self._rec.origin_perf
        with self._lock:
            self._rec.series.setdefault(key, {}).setdefault(str(lane), []).append([step, value, t])
            self._changed()

    def decision(self, name: str, value: Any, reason: str, epoch: int | None = None, *,
                 when_changed: bool = False) -> bool:
        """Record a choice the library made, and why.

        Parameters
        ----------
        name : str
            What was decided, e.g. ``"averaging_frequency"`` or ``"device"``.
        value
            The choice; stored as plain JSON (numpy scalars unwrapped, tuples as lists,
            other objects as ``str``).
        reason : str
            Why, in words: ``"no GPU assigned to the task"``.
        epoch : int, optional
            The epoch it applies to, if any.
        when_changed : bool, default False
            Record only when this name's last recorded value differs (a
            choice made every epoch, recorded when it changes).

        Returns
        -------
        bool
            Whether it was recorded.
        """
        entry = check_decision(name, value, reason, epoch)
        with self._lock:
            if when_changed:
                last = next((d for d in reversed(self._rec.decisions) if d["name"] == name), None)
                if last is not None and last["value"] == entry["value"]:
                    return False
            self._rec.decisions.append(entry)
            self._changed()
        return True

    def add_worker_payload(self, payload: Mapping[str, Any], epoch: int | None = None,
                           round: int | None = None, launched: float | None = None,
                           returned: float | None = None) -> None:
        """Merge one :meth:`~.recorder.PhaseRecorder.to_payload` result.

        Parameters
        ----------
        payload : dict
            As returned by the task (after crossing Spark).
        epoch, round : int, optional
            Attached to every event of the payload.
        launched, returned : float, optional
            Driver ``time.perf_counter()`` readings just before the Spark job
            was started and just after its results came back; the lane is
            shifted into this window if the clocks disagree (:mod:`.timeline`).

        Notes
        -----
        Worker decisions equal to one already recorded are kept once.
        """
        placed = place_payload(payload, self._rec.origin_wall, self._rec.origin_perf, epoch=epoch, round=round,
                               launched=launched, returned=returned)
        with self._lock:
            self._rec.merge(placed)
            self._changed()

    def add_worker_payloads(self, payloads: Iterable[Mapping[str, Any]], **kwargs: Any) -> None:
        """:meth:`add_worker_payload` for each payload, with the same keyword arguments."""
        for payload in payloads:
            self.add_worker_payload(payload, **kwargs)

    # ------------------------------------------------------------------ raw views
    @property
    def events(self) -> list[Event]:
        """All events (a copy), in recording order."""
        return list(self._rec.events)

    @property
    def tasks(self) -> list[Task]:
        """One span per merged worker payload (a copy)."""
        return list(self._rec.tasks)

    @property
    def counters(self) -> dict[str, float]:
        """Counters summed over all lanes (a copy)."""
        return dict(self._rec.counters)

    @property
    def series_data(self) -> dict[str, dict[str, list[list]]]:
        """``name -> lane -> [[step, value], ...]`` (a copy)."""
        return {n: {lane: [[p[0], p[1]] for p in pts] for lane, pts in by.items()}
                for n, by in self._rec.series.items()}

    @property
    def decisions(self) -> list[dict]:
        """Every decision as ``{"name", "value", "reason", "epoch"}``, in order (copies)."""
        return [dict(d) for d in self._rec.decisions]

    @property
    def lanes(self) -> list[str]:
        """Lane names: the driver first (if it has events), then workers sorted."""
        return self._analysis().lanes

    def durations(self, phase: Phase | str) -> np.ndarray:
        """Durations in seconds (float64) of every event of ``phase``."""
        return self._analysis().durations(phase)

    # ------------------------------------------------------------------ derived (see analysis.Analysis)
    def phase_totals(self) -> dict[str, dict[str, float]]:
        """Per phase: ``count``, ``total``, ``mean``, ``p50``, ``p95``, ``max`` (seconds), largest total first."""
        return self._analysis().phase_totals()

    @property
    def compute_seconds(self) -> float:
        """Lane-seconds spent fitting minibatches."""
        return self._analysis().compute_seconds

    def overhead_breakdown(self) -> dict[str, float]:
        """Lane-seconds per overhead phase (not compute, span or non-training), largest first."""
        return self._analysis().overhead_breakdown()

    @property
    def overhead_seconds(self) -> float:
        """Lane-seconds in every phase that is not compute, a span, or evaluation."""
        return self._analysis().overhead_seconds

    @property
    def compute_overhead_ratio(self) -> float | None:
        """``compute_seconds / overhead_seconds``; inf without overhead, None without compute."""
        return self._analysis().compute_overhead_ratio

    @property
    def train_seconds(self) -> float | None:
        """Training wall time: set explicitly, else the driver's ``"epoch"`` spans,
        else its ``"round"`` spans, else the extent of all events; None if empty."""
        return self._analysis().train_seconds

    @train_seconds.setter
    def train_seconds(self, seconds: float | None) -> None:
        if seconds is not None and not seconds >= 0:
            raise ValueError(f"Expect train_seconds >= 0 or None, got {seconds}")
        with self._lock:
            self._rec.train_seconds = None if seconds is None else float(seconds)
            self._changed()

    @property
    def examples(self) -> int | None:
        """Examples trained: counter ``"examples"``, else the ``examples`` fields of fit events."""
        return self._analysis().examples

    @property
    def examples_per_second(self) -> float | None:
        return self._analysis().examples_per_second

    @property
    def n_workers(self) -> int | None:
        """``workers`` if given, else the most worker tasks seen running at once, else worker lanes."""
        return self._analysis().n_workers

    @property
    def utilisation(self) -> float | None:
        """Fraction of worker wall time spent fitting: ``compute / (train_seconds * n_workers)``."""
        return self._analysis().utilisation

    @property
    def mean_iteration_seconds(self) -> float | None:
        """Mean per-minibatch ``"fit"`` time, None if none was recorded."""
        return self._analysis().mean_iteration_seconds

    def verdict(self) -> tuple[Regime, str]:
        """Scaling regime and one sentence, from :attr:`mean_iteration_seconds` (:func:`~.analysis.iteration_verdict`)."""
        return self._analysis().verdict()

    @property
    def compression_ratio(self) -> float | None:
        """``dense_bytes_equivalent / bytes_sent`` when both counters exist."""
        return self._analysis().compression_ratio

    @property
    def datagrams(self) -> dict[str, Any] | None:
        """Dropped datagrams by cause (:func:`~.analysis.datagram_breakdown`); None without datagram counters."""
        return self._analysis().datagrams

    @property
    def max_clock_correction(self) -> float:
        """Largest absolute lane shift applied to fit a task into its job window (seconds)."""
        return self._analysis().max_clock_correction

    def summary(self) -> str:
        """One paragraph (throughput, time split, iteration time, whether Spark is likely to pay),
        then ``Decisions:`` and one line per decision name with its latest value, if any."""
        return self._analysis().summary()

    # ------------------------------------------------------------------ export
    def to_dict(self) -> dict:
        """Plain, JSON-ready dict of everything recorded plus a ``derived`` section (ignored by :meth:`from_dict`)."""
        a = self._analysis()
        return export.to_dict(a.recording, a)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "TrainingStats":
        """Rebuild from :meth:`to_dict` output (JSON-decoded or not; older formats too)."""
        return cls._of(export.from_dict(data))

    def to_json(self, path: str | os.PathLike | None = None, *, indent: int | None = None) -> str:
        """JSON text of :meth:`to_dict` (strict JSON: non-finite numbers become null); written to ``path`` if given."""
        return export.to_json(self.to_dict(), path, indent=indent)

    @classmethod
    def from_json(cls, text_or_path: str | os.PathLike) -> "TrainingStats":
        """Inverse of :meth:`to_json`: JSON text, or a path to a file holding it."""
        return cls._of(export.from_json(text_or_path))

    def to_csv(self, directory: str | os.PathLike) -> list[Path]:
        """Write ``phase_<name>.csv`` per phase, ``phase_totals.csv``, ``counters.csv``, ``series.csv``
        and ``decisions.csv``; returns the files written."""
        a = self._analysis()
        return export.to_csv(a.recording, directory, a)

    def to_trace(self, path: str | os.PathLike | None = None) -> dict:
        """Chrome trace-event JSON (Perfetto, ``chrome://tracing``; see :mod:`.trace`); written to ``path`` if given.

        Returns
        -------
        dict
            ``{"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}``.
        """
        a = self._analysis()
        data = trace.to_trace(a.recording, a)
        if path is not None:
            trace.write_trace(data, path)
        return data

    def to_html(self, path: str | os.PathLike | None = None, *, max_bars: int = 5000,
                max_points: int = 2000, title: str = "sparkavg training statistics") -> str:
        """One self-contained HTML page (inline SVG and CSS, nothing fetched; see :mod:`.html`).

        Summary, decisions, timeline (one lane per worker plus the driver;
        binned when more than ``max_bars`` events), per-phase duration
        histograms and totals, series line charts (at most ``max_points``
        points per line), counters and lanes. Written to ``path`` if given.
        """
        a = self._analysis()
        text = html.render_html(a.recording, a, max_bars=max_bars, max_points=max_points, title=title)
        if path is not None:
            Path(path).write_text(text, encoding="utf-8")
        return text

    def __repr__(self) -> str:
        rec = self._rec
        return (f"TrainingStats(events={len(rec.events)}, tasks={len(rec.tasks)}, lanes={len(self.lanes)}, "
                f"counters={len(rec.counters)}, series={len(rec.series)}, decisions={len(rec.decisions)})")

