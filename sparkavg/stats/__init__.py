"""Training statistics: per-phase timings, counters, series and decisions, from the workers to one report.

Two halves, neither of which imports pyspark (nor does any module here):

* :class:`PhaseRecorder` lives in a Spark task. It records phases
  (``with rec.phase(Phase.FIT, minibatch=i): ...``), counters
  (``rec.count(CounterName.BYTES_SENT, n)``) and per-iteration series
  (``rec.series(SeriesName.THRESHOLD, step, tau)``), and turns them into a
  payload of plain dicts, lists, strings and numbers that the task returns
  to the driver with its result.
* :class:`TrainingStats` lives on the driver. It records the driver's own
  phases (:meth:`TrainingStats.timed`) and decisions
  (:meth:`TrainingStats.decision`), merges worker payloads
  (:meth:`TrainingStats.add_worker_payload`), and answers the question users
  of DL4J could not answer: *where did the time go, and is Spark worth it
  here?* (:meth:`TrainingStats.summary`). It exports JSON, CSV, a Chrome
  trace and one self-contained HTML page.

Names are closed sets: :class:`Phase`, :class:`CounterName` and
:class:`SeriesName` (``str`` enums); a name outside them raises ``ValueError``.

Modules, each using only those listed before it: :mod:`.names` (the
vocabulary), :mod:`.recorder` (executor side, lane names), :mod:`.timeline`
(events, tasks, clock alignment and the :class:`~.timeline.Recording` of
them all), :mod:`.analysis` (time split, verdict, summary), :mod:`.export` (JSON, CSV),
:mod:`.trace` (Chrome trace), :mod:`.markup` and :mod:`.html` (the page),
:mod:`.training_stats` (the facade).
"""
from . import names as _names
from .analysis import (NEAR_LINEAR_SECONDS, SINGLE_MACHINE_SECONDS, WORTH_IT_SECONDS, Regime, datagram_breakdown,
                       format_bytes, format_seconds, iteration_verdict)
from .names import (COMPUTE_PHASES, DRIVER_PHASES, NON_TRAINING_PHASES, SHARING_PHASES, SPAN_PHASES, WORKER_PHASES,
                    CounterName, DecisionName, Phase, SeriesName, phase_kind)
from .recorder import DRIVER_LANE, PhaseRecorder, task_lane
from .timeline import Event, Task
from .training_stats import TrainingStats

__all__ = [
    *_names.__all__,  # the vocabulary
    "Regime",
    "DRIVER_LANE",
    "NEAR_LINEAR_SECONDS",
    "WORTH_IT_SECONDS",
    "SINGLE_MACHINE_SECONDS",
    "Event",
    "Task",
    "PhaseRecorder",
    "TrainingStats",
    "task_lane",
    "iteration_verdict",
    "datagram_breakdown",
    "format_seconds",
    "format_bytes",
]
