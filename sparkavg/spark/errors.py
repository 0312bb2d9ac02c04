"""Executor errors that explain themselves.

On an executor every sparkavg task runs inside :func:`task_failure_guard`.
An error that retrying cannot fix (bad data, bad configuration,
divergence: :func:`is_permanent`) does not fail the Spark task -- Spark
would retry it ``spark.task.maxFailures`` times -- but becomes a
:class:`TaskFailure` record that the task returns like a result; the
driver raises it (:func:`raise_failures`) as the error's own type, with
the executor's message and where it happened (worker rank, partition,
round).  Any other error fails the task as usual (a lost worker is
retried by Spark), with one marker line in its message that
:func:`executor_errors` reads back on the driver, so the user sees the
executor's exception type and message, not a source line of Py4J text.

Two failures are not the executor's doing and say so: a cancelled job
(``sc.cancelAllJobs()``, a job group or tag, a Connect interrupt) is
:class:`TrainingCancelled`, never retried; a Python worker that crashed with
no attempt left is :class:`WorkerCrashed`, naming the task, executor and
host, the exit code or signal when Spark reports one, and what to look at.
"""
from __future__ import annotations

import contextlib
import json
import logging
import re
import signal
from typing import Optional

from ..configurable import ConfigError
from ..data.validation import DataValidationError
from ..data.transforms import TransformError
from ..nn.schedules import ScheduleError
from ..references import UnresolvedReference, UntrustedReference
from ..transport.errors import RendezvousError

__all__ = [
    "WorkerFailure",
    "WorkerCrashed",
    "TrainingCancelled",
    "DivergenceError",
    "TaskFailure",
    "register_error",
    "is_permanent",
    "task_failure_guard",
    "guarded_partitions",
    "failure_aware",
    "raise_failures",
    "executor_errors",
]

logger = logging.getLogger(__name__)


class WorkerFailure(RuntimeError):
    """An executor failed with an error sparkavg cannot rebuild as its own type."""


class WorkerCrashed(WorkerFailure):
    """A Python worker died (crashed, killed, exited) and Spark had no attempt left."""


class TrainingCancelled(RuntimeError):
    """A Spark job of sparkavg's was cancelled (``cancelAllJobs``, a job group
    or tag, a Connect interrupt): the work stops, it is not retried."""


class DivergenceError(ArithmeticError):
    """A non-finite loss or parameter: training diverged (lower the learning rate)."""


_KNOWN = {cls.__name__: cls for cls in (DataValidationError, ConfigError, DivergenceError, UnresolvedReference,
                                        UntrustedReference, TransformError, ScheduleError)}
_PERMANENT = (DataValidationError, ConfigError, DivergenceError, TrainingCancelled, ValueError, TypeError, KeyError,
              IndexError, ArithmeticError)
_MARKER = "SPARKAVG-TASK-ERROR "
_MARKER_RE = re.compile(re.escape(_MARKER) + r"(\{.*?\})\s*$", re.M)


def register_error(cls) -> type:
    """Let the driver rebuild ``cls`` (by name) from executor failures."""
    _KNOWN[cls.__name__] = cls
    return cls


def is_permanent(exc: BaseException) -> bool:
    """Whether retrying the task cannot help (data, configuration, divergence, a rendezvous out of reach)."""
    return isinstance(exc, _PERMANENT) or isinstance(exc, RendezvousError) and exc.reason == "unreachable"


class TaskFailure:
    """A permanent executor error, returned as a task result (plain fields;
    ``fields``: the error's own after its message, such as the ranks a
    :class:`~sparkavg.transport.PeerStalledError` names)."""

    __slots__ = ("kind", "message", "where", "fields")

    def __init__(self, kind: str, message: str, where: str, fields=()):
        self.kind, self.message, self.where, self.fields = kind, message, where, list(fields or ())

    def __reduce__(self):
        return (TaskFailure, (self.kind, self.message, self.where, self.fields))

    def to_exception(self, what: str) -> BaseException:
        cls = _KNOWN.get(self.kind)
        text = f"{self.message} [{what}: {self.where}]" if self.where else f"{self.message} [{what}]"
        if cls is not None:
            return cls(text, *self.fields)
        return WorkerFailure(f"{what} failed on an executor: {self.kind}: {text}")


def _where(context: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in context.items() if v is not None)


def _fields(exc: BaseException) -> list:
    """An error's arguments after its message when it pickles with its own (``__reduce__``) and they are plain JSON."""
    try:
        return json.loads(json.dumps(list(exc.__reduce__()[1][1:]))) if type(exc).__reduce__ is not \
            BaseException.__reduce__ else []
    except (TypeError, ValueError, IndexError):
        return []


@contextlib.contextmanager
def task_failure_guard(failures: Optional[list], **context):
    """Executor side: turn a permanent error inside into a :class:`TaskFailure`
    appended to ``failures``; mark any other error with its origin and re-raise.

    With ``failures=None`` every error is marked and re-raised: a barrier
    task must fail, not return, or its peers would wait for it forever
    (Spark never retries a barrier stage; the driver decides)."""
    try:
        yield
    except Exception as exc:
        where = _where(context)
        if failures is not None and is_permanent(exc):
            failures.append(TaskFailure(type(exc).__name__, str(exc), where, _fields(exc)))
            return
        note = json.dumps({"kind": type(exc).__name__, "message": str(exc)[:2000], "where": where,
                           "fields": _fields(exc)})
        raise type(exc)(f"{exc}\n{_MARKER}{note}") if _can_rebuild(exc) else RuntimeError(
            f"{type(exc).__name__}: {exc}\n{_MARKER}{note}") from exc


def guarded_partitions(fn):
    """Wrap a ``(index, rows) -> iterator`` executor function: a permanent
    error ends the partition with a :class:`TaskFailure` element instead of
    failing the task (which Spark would retry)."""

    def run(index, rows):
        failures: list = []
        with task_failure_guard(failures, partition=index):
            yield from fn(index, rows)
        if failures:
            yield failures[0]

    return run


def failure_aware(combine):
    """A combiner of task results where ``None`` is empty and a :class:`TaskFailure` wins."""

    def run(a, b):
        if a is None or isinstance(b, TaskFailure):
            return b
        if b is None or isinstance(a, TaskFailure):
            return a
        return combine(a, b)

    return run


def _can_rebuild(exc: BaseException) -> bool:
    try:
        return type(exc)(str(exc)) is not None and len(exc.args) <= 1
    except Exception:
        return False


def raise_failures(results, what: str) -> None:
    """Driver side: raise the first :class:`TaskFailure` among ``results``."""
    for r in results if isinstance(results, (list, tuple)) else [results]:
        if isinstance(r, TaskFailure):
            raise r.to_exception(what)


@contextlib.contextmanager
def executor_errors(what: str):
    """Driver side: rebuild a failed Spark job's executor error.

    The marked error becomes its own type when sparkavg knows it, else a
    :class:`WorkerFailure` carrying the executor's exception type, message
    and location; the Spark error stays as ``__cause__``.  The library's
    own jobs run inside it; lazy outputs (``predict``'s, a
    ``NetworkModel.transform``'s) fail where they are read, as Spark's
    ``PythonException``, so read them inside it for sparkavg's error::

        with executor_errors("prediction"):
            rows = model.transform(df).collect()   # a bad row: DataValidationError naming partition and row
    """
    try:
        yield
    except Exception as exc:
        if isinstance(exc, tuple(_KNOWN.values())) or isinstance(exc, (WorkerFailure, TrainingCancelled)):
            raise
        text = str(exc)
        cancelled = cancellation(text)
        if cancelled is not None:
            raise TrainingCancelled(f"{what} was cancelled: {cancelled}") from exc
        found = _MARKER_RE.findall(text)
        if found:
            note = json.loads(found[-1])
            raise TaskFailure(note["kind"], note["message"], note["where"], note.get("fields")).to_exception(
                what) from exc
        for name, cls in _KNOWN.items():  # raised outside a guard (e.g. while reading data)
            hit = re.findall(rf"(?:\w+\.)*{name}: (.+)", text)
            if hit:
                raise cls(hit[-1].strip()) from exc
        crash = describe_crash(text)
        if crash is not None:
            raise WorkerCrashed(f"{what} failed: {crash}") from exc
        if "Py4J" in type(exc).__name__ or "PythonException" in type(exc).__name__ \
                or "SparkException" in type(exc).__name__:
            raise WorkerFailure(f"{what} failed on an executor: {_last_error_line(text)}") from exc
        raise


def _last_error_line(text: str) -> str:
    """The last ``SomeError: message`` line of a Python traceback inside Spark's text."""
    hits = re.findall(r"^\s*((?:\w+\.)*\w*(?:Error|Exception|Exit|Interrupt)\b.*)$", text, re.M)
    hits = [h for h in hits if not h.startswith(("org.apache", "py4j", "java."))]
    if hits:
        return hits[-1].strip()[:1000]
    first = next((ln for ln in text.splitlines() if ln.strip()), text[:300])
    return first.strip()[:1000]



_CANCELLED_RE = re.compile(r"\bJob \d+ cancelled\b[^\n]*|\bOPERATION_CANCELED\b[^\n]*")


def cancellation(text: str) -> Optional[str]:
    """Spark's reason when ``text`` (a failed job's error) says the job was
    cancelled (``Job 3 cancelled as part of cancellation of all jobs``,
    ``... part of cancelled job group g``, a Connect ``OPERATION_CANCELED``),
    else None."""
    hit = _CANCELLED_RE.search(text)
    if hit is None:
        return None
    return re.sub(r"\s*SQLSTATE: \w+\s*$", "", hit.group(0).strip().lstrip("] "))


_CRASH_RE = re.compile(r"Python worker exited unexpectedly \(crashed\)(?:[:\-]\s*(?P<detail>[^\n]*))?")
_LOST_RE = re.compile(r"Lost task (?P<attempt>[\d.]+) in stage (?P<stage>[\d.]+) \(TID (?P<tid>\d+)\) "
                      r"\((?P<host>[^ )]+) executor (?P<executor>[^)]+)\)")
_FAILED_RE = re.compile(r"Task (?P<index>\d+) in stage [\d.]+ failed (?P<times>\d+) times?")
_EXECUTOR_LOST_RE = re.compile(r"ExecutorLostFailure \(executor (?P<executor>\S+) exited(?P<why>[^)]*)\)"
                               r"(?: Reason: (?P<reason>[^\n]*))?")
_EXIT_RE = re.compile(r"exit(?:ed)?(?: with)? (?:code|status) (?P<code>-?\d+)", re.I)
_SIGNAL_RE = re.compile(r"\b(SIG[A-Z]{2,6})\b|Fatal Python error: (?P<fatal>[^\n]*)")


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def describe_crash(text: str) -> Optional[str]:
    """What a job failure ``text`` says about a Python worker (or its executor)
    that died with no attempt left: which task, partition, executor and host,
    the exit code or signal when Spark reports one, and what to look at.
    None when ``text`` is not such a failure."""
    crash, lost = _CRASH_RE.search(text), _EXECUTOR_LOST_RE.search(text)
    if crash is None and lost is None:
        return None
    task, failed = _LOST_RE.search(text), _FAILED_RE.search(text)
    parts = []
    if failed:
        parts.append(f"partition {failed.group('index')}")
    if task:
        parts.append(f"task {task.group('attempt')} of stage {task.group('stage')}, TID {task.group('tid')}")
    executor = lost.group("executor") if lost else (task.group("executor") if task else None)
    host = task.group("host") if task else None
    where = f" ({'; '.join(parts)})" if parts else ""
    place = (f" on executor {executor}" if executor else "") + (f" at host {host}" if host else "")
    times = f" {failed.group('times')} time(s), no attempt left" if failed else ""
    what = "the Python worker" if crash else "the executor"
    reason = ""
    exit_hit = _EXIT_RE.search(text)
    signal_hit = _SIGNAL_RE.search(text)
    if exit_hit:
        code = int(exit_hit.group("code"))
        reason = f"exit code {code}"
        if code > 128:
            reason += f" (killed by {_signal_name(code - 128)})"
        elif code < 0:
            reason += f" (killed by {_signal_name(-code)})"
    elif signal_hit:
        reason = signal_hit.group("fatal") or signal_hit.group(1)
        reason = f"fatal signal: {reason.strip()}"
    elif crash and crash.group("detail") and not crash.group("detail").startswith("Consider setting"):
        reason = crash.group("detail").strip()[:300]
    if lost and lost.group("reason"):
        reason = f"{reason}; Spark: {lost.group('reason').strip()[:300]}" if reason else \
            f"Spark: {lost.group('reason').strip()[:300]}"
    said = reason if reason else "Spark reported no exit code or signal"
    log = f"look at the stderr log of executor {executor or '(see the Spark UI)'}"
    memory = f"look at `dmesg` and the memory limit{' of ' + host if host else ''}"
    if signal_hit and not exit_hit:
        frame = re.search(r'File "([^"]+)", line (\d+) in (\S+)', text)
        hint = ("Native code crashed in the worker" + (f" (innermost Python frame: {frame.group(1)}:{frame.group(2)} "
                                                        f"in {frame.group(3)})" if frame else "") + f"; {log}.")
    elif "SIGKILL" in said:
        hint = f"The OS killed it, most often the out-of-memory killer: {memory}; {log}."
    else:
        hint = (f"A worker dies this way when the OS kills it (SIGKILL, most often the out-of-memory killer: "
                f"{memory}), when native code crashes (set spark.python.worker.faulthandler.enabled=true to get "
                f"its Python traceback), or on os._exit; {log}.")
    return f"{what}{where}{place} crashed{times}: {said}. {hint}"
