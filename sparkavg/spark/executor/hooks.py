"""Fault-injection hooks for the tests, off in production.

The driver reads the job-local properties named below (``sparkavg.test.*``;
``udp_loss``: drop, duplicate and reorder this fraction of the sharing
transport's datagrams) once per job (:meth:`TestHooks.from_properties`) and
ships the result with the task; a production task gets ``None`` and runs
no hook code at all.
"""
from __future__ import annotations

import os
import threading
from typing import Callable, Optional

from ...transport import FaultInjection

__all__ = ["TestHooks", "KILL_MARKER", "STALL_RANK", "HOLD_MARKER", "SLOW_WORKER", "UDP_LOSS", "STALL_TIMEOUT",
           "RETRANSMIT_TIMEOUT", "STAGE_ATTEMPTS", "KILL_ROUND", "AVERAGING_PATH", "MEETING", "ALL_GATHER",
           "transport_limits", "stage_attempts", "MAX_STAGE_ATTEMPTS"]

KILL_MARKER = "sparkavg.test.kill_marker"
STALL_RANK = "sparkavg.test.stall_rank"
HOLD_MARKER = "sparkavg.test.hold_marker"
#: ``"s0,s1,..."``: the averaging task of worker ``w`` (its partition modulo the list's length)
#: sleeps ``s_w`` seconds after each minibatch (slow workers).
SLOW_WORKER = "sparkavg.test.slow_worker"
#: A fraction in [0, 1): the sharing transport drops it, and duplicates and reorders half of it.
UDP_LOSS = "sparkavg.test.udp_loss"
#: Seconds: the sharing transport's stall and retransmit timeouts.
STALL_TIMEOUT = "sparkavg.test.stall_timeout"
RETRANSMIT_TIMEOUT = "sparkavg.test.retransmit_timeout"
#: Attempts of a gradient-sharing epoch whose stage failed (the default is :data:`MAX_STAGE_ATTEMPTS`).
STAGE_ATTEMPTS = "sparkavg.test.stage_attempts"
#: A round number: averaging's rounds inside one stage claim the kill marker at its start, not at the task's.
KILL_ROUND = "sparkavg.test.kill_round"
#: ``"in_stage"`` or ``"jobs"``: averaging's rounds so, whatever the decision ``averaging_path`` would be.
AVERAGING_PATH = "sparkavg.test.averaging_path"
#: ``"allGather"``: in-stage averaging's ranks meet through Spark's, not the driver's rendezvous (seam ``meeting``).
MEETING, ALL_GATHER = "sparkavg.test.meeting", "allGather"
#: Spark never retries a failed barrier stage, so the driver does: a lost worker restarts the epoch
#: from its starting state, up to this many attempts in all.
MAX_STAGE_ATTEMPTS = 3
_NUMBERS = {"udp_loss": UDP_LOSS, "stall_timeout": STALL_TIMEOUT, "retransmit_timeout": RETRANSMIT_TIMEOUT,
            "stage_attempts": STAGE_ATTEMPTS, "kill_round": KILL_ROUND}


class TestHooks:
    """Plain values telling a task to die or hang (as crashed or stuck executors do)."""

    __test__ = False  # not a pytest test class
    __slots__ = ("kill_marker", "stall_rank", "hold_marker", "slow_worker", "numbers", "averaging_path", "meeting")

    def __init__(self, kill_marker: Optional[str] = None, stall_rank: Optional[int] = None,
                 hold_marker: Optional[str] = None, slow_worker: Optional[str] = None, numbers=None,
                 averaging_path: Optional[str] = None, meeting: Optional[str] = None):
        self.kill_marker, self.stall_rank, self.hold_marker = kill_marker, stall_rank, hold_marker
        self.slow_worker, self.averaging_path, self.meeting = slow_worker, averaging_path, meeting
        self.numbers = dict(numbers or {})  # udp_loss, stall_timeout, retransmit_timeout, stage_attempts, kill_round

    def __reduce__(self):
        return (TestHooks, (self.kill_marker, self.stall_rank, self.hold_marker, self.slow_worker, self.numbers,
                            self.averaging_path, self.meeting))

    @classmethod
    def from_properties(cls, get: Callable[[str], Optional[str]]) -> Optional["TestHooks"]:
        marker, stall, hold, slow = get(KILL_MARKER), get(STALL_RANK), get(HOLD_MARKER), get(SLOW_WORKER)
        numbers, path, meeting = {}, get(AVERAGING_PATH), get(MEETING)
        for name, key in _NUMBERS.items():  # each property read once
            value = get(key)
            if value:
                numbers[name] = float(value)
        if not marker and stall is None and not hold and not slow and not numbers and not path and not meeting:
            return None
        return cls(marker or None, int(stall) if stall is not None else None, hold or None, slow or None, numbers,
                   path or None, meeting or None)

    def minibatch_delay(self, partition: int) -> float:
        """Seconds the averaging task of ``partition`` sleeps after each minibatch (0: none)."""
        if not self.slow_worker:
            return 0.0
        seconds = [float(s) for s in self.slow_worker.split(",")]
        return seconds[partition % len(seconds)]

    def on_task_start(self) -> None:
        """The first task to claim the marker file kills its Python worker; Spark must retry it."""
        if self.kill_marker and "kill_round" not in self.numbers:
            self._kill()
        if self.hold_marker:  # every task says it runs, then waits to be cancelled
            with open(f"{self.hold_marker}.{os.getpid()}", "w"):
                pass
            threading.Event().wait()

    def on_round(self, round_no: int) -> None:
        """Averaging's rounds inside one stage: the kill marker's claim at the start of round ``kill_round``."""
        if self.kill_marker and self.numbers.get("kill_round") == round_no:
            self._kill()

    def _kill(self) -> None:
        try:
            os.rename(self.kill_marker, self.kill_marker + ".claimed")
        except OSError:
            return
        os._exit(17)

    def on_epoch_end(self, rank: int) -> None:
        """The named rank hangs before its last exchange; its peers must name it."""
        if self.stall_rank is not None and self.stall_rank == rank:
            threading.Event().wait()


def transport_limits(hooks: Optional[TestHooks], seed: int, rank: int, epoch: int) -> dict:
    """The tests' timeouts and simulated loss for a sharing rank's endpoint
    (``ReliableEndpoint(..., limits=)``); empty: the transport's own."""
    numbers = hooks.numbers if hooks is not None else {}
    changes = {name: numbers[name] for name in ("stall_timeout", "retransmit_timeout") if name in numbers}
    if "retransmit_timeout" in changes:
        changes["min_retransmit_timeout"] = min(changes["retransmit_timeout"], 0.05)
    p = numbers.get("udp_loss", 0.0)
    if p:
        changes["faults"] = FaultInjection(loss=p, duplicate=p / 2, reorder=p / 2, seed=seed * 1000 + rank + 17 * epoch)
    return changes


def stage_attempts(hooks: Optional[TestHooks]) -> int:
    """Attempts of a gradient-sharing epoch (:data:`MAX_STAGE_ATTEMPTS`, or the tests' own)."""
    if hooks is not None and "stage_attempts" in hooks.numbers:
        return int(hooks.numbers["stage_attempts"])
    return MAX_STAGE_ATTEMPTS
