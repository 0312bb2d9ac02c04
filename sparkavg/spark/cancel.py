"""Cancelling a fit between its rounds.

Spark cancels the jobs that run.  A cancel that lands between two rounds of
a fit -- while the driver merges, ships the next state or writes a
checkpoint, and no job of the fit runs -- cancels nothing: the next round's
job would start as if nothing had happened, and the fit would run to its
end.  So, while a fit runs, the seam watches the driver's own cancel calls
(:meth:`~sparkavg.spark.seam.ClassicSpark.watch_cancels`: ``cancelAllJobs``,
``cancelJobGroup`` of the fit's job group, ``cancelJobsWithTag`` of one of
its tags; on Spark Connect ``interruptAll`` and ``interruptTag``) and
records the first in the runner's :class:`CancelRequest`, as
:meth:`SparkTrainer.cancel() <sparkavg.spark.SparkTrainer.cancel>` does;
the runner checks it before every round
(:meth:`~sparkavg.spark.runners.base.EpochRunner.run_epoch`).  Calls made
outside this driver process (the Spark UI's kill links) only cancel
running jobs, as before.
"""
from __future__ import annotations

import contextlib
import functools
import threading
from typing import Callable, Optional

from .errors import TrainingCancelled

__all__ = ["CancelRequest", "watching"]

_WATCHERS = "_sparkavg_cancel_watchers"


class CancelRequest:
    """Whether (and why) the running fit was asked to stop: thread-safe, the first reason kept."""

    def __init__(self):
        self._lock = threading.Lock()
        self._reason: Optional[str] = None

    def set(self, reason: str) -> None:
        with self._lock:
            if self._reason is None:
                self._reason = str(reason)

    def clear(self) -> None:
        with self._lock:
            self._reason = None

    @property
    def reason(self) -> Optional[str]:
        return self._reason

    def check(self, before: str, kept: str) -> None:
        """Raise :class:`TrainingCancelled` when a cancel was asked for.

        ``before`` names what will not start (``"round 3 of epoch 1"``),
        ``kept`` what the model holds (``"the state after round 2 of epoch 1"``)."""
        reason = self._reason
        if reason is not None:
            raise TrainingCancelled(f"the fit was cancelled ({reason}) between rounds: {before} did not start; the "
                                    f"model holds {kept}")


@contextlib.contextmanager
def watching(target, matchers: dict, on_cancel: Callable[[str], None]):
    """While the block runs, a call of one of ``target``'s methods named in
    ``matchers`` calls ``on_cancel(reason)`` first, when
    ``matchers[name](*args)`` gives a reason (a str; None: not this fit's).

    Each method is wrapped once per ``target`` (an instance attribute that
    calls the class's method after the watchers); with no fit watching, the
    wrapper only calls it."""
    watchers = target.__dict__.setdefault(_WATCHERS, [])
    for name in matchers:
        if name not in target.__dict__ and callable(getattr(target, name, None)):
            setattr(target, name, _wrapped(getattr(target, name), name, watchers))
    entry = (matchers, on_cancel)
    watchers.append(entry)
    try:
        yield
    finally:
        watchers.remove(entry)


def _wrapped(method, name: str, watchers: list):
    @functools.wraps(method)
    def call(*args, **kwargs):
        for matchers, on_cancel in list(watchers):
            matcher = matchers.get(name)
            reason = matcher(*args, **kwargs) if matcher is not None else None
            if reason is not None:
                on_cancel(reason)
        return method(*args, **kwargs)

    return call
