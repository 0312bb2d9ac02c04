"""Fault-injection hooks for the tests, off in production.

The driver reads the job-local properties ``sparkavg.test.kill_marker``,
``sparkavg.test.stall_rank``, ``sparkavg.test.hold_marker`` and
``sparkavg.test.slow_worker`` once per job (:meth:`TestHooks.from_properties`)
and ships the result with the task; a production task gets ``None`` and
runs no hook code at all.
"""
from __future__ import annotations

import os
import threading
from typing import Callable, Optional

__all__ = ["TestHooks", "KILL_MARKER", "STALL_RANK", "HOLD_MARKER", "SLOW_WORKER"]

KILL_MARKER = "sparkavg.test.kill_marker"
STALL_RANK = "sparkavg.test.stall_rank"
HOLD_MARKER = "sparkavg.test.hold_marker"
#: ``"s0,s1,..."``: the averaging task of worker ``w`` (its partition modulo the list's length)
#: sleeps ``s_w`` seconds after each minibatch (slow workers).
SLOW_WORKER = "sparkavg.test.slow_worker"


class TestHooks:
    """Plain values telling a task to die or hang (as crashed or stuck executors do)."""

    __test__ = False  # not a pytest test class
    __slots__ = ("kill_marker", "stall_rank", "hold_marker", "slow_worker")

    def __init__(self, kill_marker: Optional[str] = None, stall_rank: Optional[int] = None,
                 hold_marker: Optional[str] = None, slow_worker: Optional[str] = None):
        self.kill_marker, self.stall_rank, self.hold_marker = kill_marker, stall_rank, hold_marker
        self.slow_worker = slow_worker

    def __reduce__(self):
        return (TestHooks, (self.kill_marker, self.stall_rank, self.hold_marker, self.slow_worker))

    @classmethod
    def from_properties(cls, get: Callable[[str], Optional[str]]) -> Optional["TestHooks"]:
        marker, stall, hold, slow = get(KILL_MARKER), get(STALL_RANK), get(HOLD_MARKER), get(SLOW_WORKER)
        if not marker and stall is None and not hold and not slow:
            return None
        return cls(marker or None, int(stall) if stall is not None else None, hold or None, slow or None)

    def minibatch_delay(self, partition: int) -> float:
        """Seconds the averaging task of ``partition`` sleeps after each minibatch (0: none)."""
        if not self.slow_worker:
            return 0.0
        seconds = [float(s) for s in self.slow_worker.split(",")]
        return seconds[partition % len(seconds)]

    def on_task_start(self) -> None:
        """The first task to claim the marker file kills its Python worker; Spark must retry it."""
        if self.kill_marker:
            try:
                os.rename(self.kill_marker, self.kill_marker + ".claimed")
            except OSError:
                return
            os._exit(17)
        if self.hold_marker:  # every task says it runs, then waits to be cancelled
            with open(f"{self.hold_marker}.{os.getpid()}", "w"):
                pass
            threading.Event().wait()

    def on_epoch_end(self, rank: int) -> None:
        """The named rank hangs before its last exchange; its peers must name it."""
        if self.stall_rank is not None and self.stall_rank == rank:
            threading.Event().wait()
