"""Where parameter averaging's rounds run (decision ``averaging_path``).

``"in_stage"``: one barrier stage per epoch whose tasks average among
themselves every ``F`` minibatches (an all-reduce between executors,
:mod:`sparkavg.averaging.rounds`); the driver gets one result per epoch.
``"jobs"``: a Spark job per round, every worker's state through the
driver (DL4J's; it needs no barrier mode and a lost task costs a round,
not an epoch).  Both give the same parameters for the same frequency.
"""
from __future__ import annotations

from typing import Mapping, Optional, Tuple

from . import Policy

__all__ = ["AveragingPath", "IN_STAGE", "JOBS"]

IN_STAGE, JOBS = "in_stage", "jobs"


class AveragingPath(Policy):
    """Decision ``averaging_path`` (preset ``"dl4j"``: always ``"jobs"``)."""

    name = "averaging_path"

    def __init__(self, enabled: bool = True):
        self.enabled = enabled

    def decide(self, no_barrier: Optional[str], slots: Optional[int], workers: int, overheads: Mapping[str, float],
               forced: Optional[str] = None) -> Tuple[str, str]:
        """``(path, reason)``.

        Parameters
        ----------
        no_barrier : str or None
            Why this fit cannot run barrier stages (None: it can).
        slots : int or None
            Task slots Spark has for a barrier stage (None: unknown).
        overheads : mapping
            Path -> the last measured overhead of one of its rounds, seconds.
        forced : str, optional
            The tests' hook.
        """
        if forced is not None:
            if forced not in (IN_STAGE, JOBS):
                raise ValueError(f"Expect the averaging_path test hook to be {IN_STAGE!r} or {JOBS!r}, got {forced!r}")
            return forced, "set by the tests' hook"
        if not self.enabled:
            return JOBS, "preset 'dl4j': a Spark job per round, every worker's state through the driver, as DL4J"
        if no_barrier is not None:
            return JOBS, f"{no_barrier}: a Spark job per round"
        if slots is not None and slots < workers:
            return JOBS, (f"{workers} workers but {slots} task slot(s): a barrier stage needs every worker at once; "
                          f"a Spark job per round")
        job, stage = overheads.get(JOBS), overheads.get(IN_STAGE)
        if job is not None and stage is not None and stage > job:
            return JOBS, (f"a round inside one stage measured {stage * 1e3:.1f} ms of overhead, a Spark job per "
                          f"round {job * 1e3:.1f} ms")
        measured = "" if job is None else f" instead of a Spark job per round ({job * 1e3:.1f} ms of overhead measured)"
        if stage is not None:
            measured += f"; {stage * 1e3:.1f} ms measured inside the stage"
        return IN_STAGE, (f"barrier mode available, {workers} workers <= {'?' if slots is None else slots} task slots: "
                          f"one barrier stage per epoch whose workers average among themselves (an all-reduce "
                          f"between executors){measured}")
