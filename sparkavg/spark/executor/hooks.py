"""Fault-injection hooks for the tests, off in production.

The driver reads the job-local properties ``sparkavg.test.kill_marker``,
``sparkavg.test.stall_rank`` and ``sparkavg.test.hold_marker`` once per job (:meth:`TestHooks.from_properties`)
and ships the result with the task; a production task gets ``None`` and
runs no hook code at all.
"""
from __future__ import annotations

import os
import threading
from typing import Callable, Optional

__all__ = ["TestHooks", "KILL_MARKER", "STALL_RANK", "HOLD_MARKER"]

KILL_MARKER = "sparkavg.test.kill_marker"
STALL_RANK = "sparkavg.test.stall_rank"
HOLD_MARKER = "sparkavg.test.hold_marker"


class TestHooks:
    """Plain values telling a task to die or hang (as crashed or stuck executors do)."""

    __test__ = False  # not a pytest test class
    __slots__ = ("kill_marker", "stall_rank", "hold_marker")

    def __init__(self, kill_marker: Optional[str] = None, stall_rank: Optional[int] = None,
                 hold_marker: Optional[str] = None):
        self.kill_marker, self.stall_rank, self.hold_marker = kill_marker, stall_rank, hold_marker

    def __reduce__(self):
        return (TestHooks, (self.kill_marker, self.stall_rank, self.hold_marker))

    @classmethod
    def from_properties(cls, get: Callable[[str], Optional[str]]) -> Optional["TestHooks"]:
        marker, stall, hold = get(KILL_MARKER), get(STALL_RANK), get(HOLD_MARKER)
        if not marker and stall is None and not hold:
            return None
        return cls(marker or None, int(stall) if stall is not None else None, hold or None)

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
