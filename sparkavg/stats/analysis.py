"""Where did the time go, and is Spark worth it here?

How time is split
-----------------
``compute`` is the sum of all ``"fit"`` phases (one per minibatch) over all
lanes. ``overhead`` is the sum of every other phase except the *span* phases
(``"round"``, ``"epoch"``, which enclose other phases and would count them
twice) and ``"evaluate"`` (not training). Both are lane-seconds, i.e. summed
over lanes: four workers fitting for one second each are four seconds of
compute. Phases on one lane should therefore not nest, apart from span
phases. :attr:`Analysis.utilisation` relates compute to wall time:
``compute / (train_seconds * workers)``.

The verdict judges the mean per-minibatch fit time against DL4J's
guidance (DL4J's Spark documentation): >= 100 ms near-linear scaling (borderline
below 150 ms), 1 ms to 100 ms sub-linear, <= 1 ms one machine is probably
faster.
"""
from __future__ import annotations

import json
import math
from enum import Enum
from typing import Any

import numpy as np

from .names import COMPUTE_PHASES, NON_TRAINING_PHASES, SHARING_PHASES, SPAN_PHASES, CounterName, Phase
from .recorder import DRIVER_LANE
from .timeline import Recording, extent, ordered_lanes, peak_concurrency

__all__ = ["Analysis", "Regime", "iteration_verdict", "datagram_breakdown", "format_seconds", "format_bytes",
           "NEAR_LINEAR_SECONDS", "WORTH_IT_SECONDS", "SINGLE_MACHINE_SECONDS"]

# DL4J's guidance (its Spark documentation), per minibatch fit.
NEAR_LINEAR_SECONDS = 0.100
WORTH_IT_SECONDS = 0.150
SINGLE_MACHINE_SECONDS = 0.001


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


def format_bytes(n: float) -> str:
    """``"512 B"``, ``"2 KB"``, ``"1.5 MB"`` ... (powers of 1000)."""
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.3g} {unit}"
        n /= 1000.0
    return f"{n:.3g} TB"


class Regime(str, Enum):
    """What the mean iteration time says about scaling (DL4J's Spark documentation)."""

    NEAR_LINEAR = "near-linear"
    SUB_LINEAR = "sub-linear"
    SINGLE_MACHINE = "single-machine"
    UNKNOWN = "unknown"


def iteration_verdict(mean_iteration_seconds: float | None) -> tuple[Regime, str]:
    """Judge a mean per-minibatch fit time against DL4J's guidance.

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
            text += " (borderline: DL4J's documentation cautions that below ~150 ms Spark may not be worth it)"
        return Regime.NEAR_LINEAR, text
    if t > SINGLE_MACHINE_SECONDS:
        return Regime.SUB_LINEAR, (
            f"at {shown} per iteration (between 1 ms and 100 ms, DL4J's ~10 ms case) expect sub-linear scaling: "
            "per-round overhead eats much of the gain, and below ~150 ms Spark may not be worth it; "
            "larger minibatches (more work per iteration) help")
    return Regime.SINGLE_MACHINE, (
        f"at {shown} per iteration (<= 1 ms) a single machine is probably faster than Spark; "
        "train locally or make each iteration much larger")


def datagram_breakdown(counters: dict[str, float]) -> dict[str, Any] | None:
    """The dropped received datagrams by cause (definitions in :mod:`.names`); None without any counter.

    Returns
    -------
    dict or None
        ``rejected`` (all dropped), ``invalid``, ``forged``, ``replayed``,
        ``flow_control`` (the rest), ``retransmitted`` (sent again by this
        side), and ``consistent``: False when the parts exceed the total,
        i.e. the counters were not recorded under these definitions.
    """
    keys = {"rejected": CounterName.DATAGRAMS_REJECTED, "invalid": CounterName.DATAGRAMS_INVALID,
            "forged": CounterName.DATAGRAMS_FORGED, "replayed": CounterName.DATAGRAMS_REPLAYED,
            "retransmitted": CounterName.DATAGRAMS_RETRANSMITTED}
    if not any(k in counters for k in keys.values()):
        return None
    out: dict[str, Any] = {k: int(counters.get(name, 0)) for k, name in keys.items()}
    out["flow_control"] = max(0, out["rejected"] - out["invalid"] - out["replayed"])
    out["consistent"] = (out["forged"] <= out["invalid"]
                         and out["invalid"] + out["replayed"] <= out["rejected"])
    return out


class Analysis:
    """Derived figures of one :class:`~.timeline.Recording` (computed on demand, not updated).

    Parameters
    ----------
    recording : Recording
        Read, never changed; take a snapshot if it keeps growing.
    """

    def __init__(self, recording: Recording):
        self.recording = recording
        lists: dict[str, list[float]] = {}
        for e in recording.events:
            lists.setdefault(e.phase, []).append(e.duration)
        self._by_phase = {p: np.asarray(d, dtype=np.float64) for p, d in lists.items()}

    # ------------------------------------------------------------------ time split
    def durations(self, phase: str) -> np.ndarray:
        """Durations in seconds (float64) of every event of ``phase``."""
        return self._by_phase.get(phase, np.empty(0))

    def phase_totals(self) -> dict[str, dict[str, float]]:
        """Per phase: ``count``, ``total``, ``mean``, ``p50``, ``p95``, ``max`` (seconds), largest total first."""
        out = {}
        for phase, d in self._by_phase.items():
            p50, p95 = np.percentile(d, [50, 95])
            out[phase] = {"count": int(d.size), "total": float(d.sum()), "mean": float(d.mean()),
                          "p50": float(p50), "p95": float(p95), "max": float(d.max())}
        return dict(sorted(out.items(), key=lambda kv: -kv[1]["total"]))

    @property
    def compute_seconds(self) -> float:
        """Lane-seconds spent in compute phases (``"fit"``)."""
        return float(sum(d.sum() for p, d in self._by_phase.items() if p in COMPUTE_PHASES))

    def overhead_breakdown(self) -> dict[str, float]:
        """Lane-seconds per overhead phase (not compute, span or non-training), largest first."""
        excluded = COMPUTE_PHASES | SPAN_PHASES | NON_TRAINING_PHASES
        totals = {p: float(d.sum()) for p, d in self._by_phase.items() if p not in excluded}
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

    # ------------------------------------------------------------------ throughput
    @property
    def lanes(self) -> list[str]:
        """Lane names: the driver first (if it has events), then workers sorted."""
        return ordered_lanes(self.recording.events, self.recording.tasks)

    @property
    def train_seconds(self) -> float | None:
        """Training wall time: set explicitly, else the driver's ``"epoch"`` spans,
        else its ``"round"`` spans, else the extent of all events; None if empty."""
        rec = self.recording
        if rec.train_seconds is not None:
            return rec.train_seconds
        for span in (Phase.EPOCH, Phase.ROUND):
            d = [e.duration for e in rec.events if e.phase == span and e.lane == DRIVER_LANE]
            if d:
                return float(sum(d))
        span = extent(rec.events, rec.tasks)
        return float(span[1] - span[0]) if span else None

    @property
    def examples(self) -> int | None:
        """Examples trained: counter ``"examples"``, else the sum of the ``examples`` field of fit events."""
        counters = self.recording.counters
        if CounterName.EXAMPLES in counters:
            return int(counters[CounterName.EXAMPLES])
        n = [e.fields["examples"] for e in self.recording.events
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
        rec = self.recording
        if rec.workers is not None:
            return rec.workers
        if rec.tasks:
            return peak_concurrency(rec.tasks)
        return len([lane for lane in self.lanes if lane != DRIVER_LANE]) or None

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

    # ------------------------------------------------------------------ communication
    @property
    def compression_ratio(self) -> float | None:
        """``dense_bytes_equivalent / bytes_sent`` when both counters exist."""
        counters = self.recording.counters
        sent = counters.get(CounterName.BYTES_SENT)
        dense = counters.get(CounterName.DENSE_BYTES_EQUIVALENT)
        return dense / sent if sent and dense else None

    @property
    def datagrams(self) -> dict[str, Any] | None:
        """:func:`datagram_breakdown` of the counters."""
        return datagram_breakdown(self.recording.counters)

    @property
    def max_clock_correction(self) -> float:
        """Largest absolute lane shift applied to fit a task into its job window (seconds)."""
        return max((abs(t.clock_correction) for t in self.recording.tasks), default=0.0)

    def latest_decisions(self) -> list[dict]:
        """The latest decision of each name, in the order the names first appeared."""
        latest: dict[str, dict] = {}
        for d in self.recording.decisions:
            latest[d["name"]] = d
        first = {}
        for i, d in enumerate(self.recording.decisions):
            first.setdefault(d["name"], i)
        return sorted(latest.values(), key=lambda d: first[d["name"]])

    # ------------------------------------------------------------------ text
    def summary(self) -> str:
        """One paragraph: throughput, time split, iteration time and whether Spark is likely to pay;
        then one line per decision name (its latest value and reason), if any decision was recorded."""
        lines = [self.paragraph()]
        decisions = self.latest_decisions()
        if decisions:
            lines.append("Decisions:")
            lines += [f"- {d['name']} = {format_value(d['value'])}"
                      f"{'' if d['epoch'] is None else ' (epoch %d)' % d['epoch']}: {d['reason']}" for d in decisions]
        return "\n".join(lines)

    def paragraph(self) -> str:
        """The first part of :meth:`summary`: one paragraph, no line breaks."""
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
        split = (f"Time split over lanes: {format_seconds(compute)} fitting minibatches vs "
                 f"{format_seconds(overhead)} overhead")
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
        _, text = self.verdict()
        if fit.size:
            parts.append(f"Mean iteration (one minibatch fit) {format_seconds(float(fit.mean()))} "
                         f"(p95 {format_seconds(float(np.percentile(fit, 95)))}, {fit.size:,} iterations): {text}.")
        else:
            parts.append(text[0].upper() + text[1:] + ".")
        sharing = sum(self.durations(p).sum() for p in SHARING_PHASES)
        if sharing > 0 and fit.size:
            parts.append(f"Gradient-sharing overhead (encode + send + apply) is {format_seconds(sharing / fit.size)} "
                         f"per iteration.")
        counters = self.recording.counters
        ratio = self.compression_ratio
        if ratio is not None:
            parts.append(f"Updates sent {format_bytes(counters[CounterName.BYTES_SENT])} where dense "
                         f"updates would be {format_bytes(counters[CounterName.DENSE_BYTES_EQUIVALENT])} "
                         f"(compression {ratio:,.1f}x).")
        datagrams = self.datagrams
        if datagrams is not None:
            parts.append(_datagram_sentence(datagrams))
        return " ".join(parts)


def _datagram_sentence(d: dict[str, Any]) -> str:
    text = (f"The transport dropped {d['rejected']:,} received datagrams ({d['invalid']:,} failed authentication "
            f"or validation, {d['forged']:,} of them forged; {d['replayed']:,} repeated delivered messages, "
            f"mostly late retransmissions; {d['flow_control']:,} flow control) and retransmitted "
            f"{d['retransmitted']:,}.")
    if not d["consistent"]:
        text += (" These datagram counters are inconsistent: expect forged <= invalid and invalid + replayed "
                 f"<= rejected, got {d['forged']:,}, {d['invalid']:,}, {d['replayed']:,} and {d['rejected']:,} "
                 "(recorded under another definition of datagrams_rejected?).")
    return text


def format_value(value: Any) -> str:
    """A decision value for text: strings as they are, anything else as compact JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, allow_nan=True, separators=(", ", ": "), default=str)
