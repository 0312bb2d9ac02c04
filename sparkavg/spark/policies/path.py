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

__all__ = ["AveragingPath", "IN_STAGE", "JOBS", "JOB_ROUND_S", "STAGE_ROUND_S", "MEETING_S", "RENDEZVOUS_MEETING_S"]

IN_STAGE, JOBS = "in_stage", "jobs"

#: Overhead of a Spark job per round before one is measured (s): the least a job's launch and results cost.
JOB_ROUND_S = 0.05
#: Overhead of a round inside the stage before one is measured (s): one all-reduce of a small model.
STAGE_ROUND_S = 0.01
#: What the stage's meeting costs before one is measured (s): ``allGather`` (Connect) answers on a one-second poll;
#: the driver's rendezvous (classic sessions) answers once every rank has registered (benchmarks/RESULTS.md).
MEETING_S, RENDEZVOUS_MEETING_S = 1.0, 0.05


class AveragingPath(Policy):
    """Decision ``averaging_path`` (preset ``"dl4j"``: always ``"jobs"``).

    An epoch inside one stage pays its ranks' meeting once (the rendezvous
    or ``allGather``, and the connections, run while round 1 trains: what is
    left of it after round 1's ``F`` minibatches) and saves, every round, a
    job's overhead less an all-reduce's: it runs inside the stage when
    ``rounds * (job - stage) > max(0, meeting - F * iteration)``, each figure
    the last measured (before a measurement, :data:`JOB_ROUND_S`,
    :data:`STAGE_ROUND_S`, :data:`RENDEZVOUS_MEETING_S` or :data:`MEETING_S`).
    Barrier mode needs every worker at once, and no dynamic allocation.
    """

    name = "averaging_path"

    def __init__(self, enabled: bool = True):
        self.enabled = enabled

    def decide(self, no_barrier: Optional[str], slots: Optional[int], workers: int, overheads: Mapping[str, float],
               rounds: int, frequency: int, iteration: Optional[float] = None, meeting: Optional[float] = None,
               forced: Optional[str] = None, at_driver: bool = False) -> Tuple[str, str]:
        """``(path, reason)``.

        Parameters
        ----------
        no_barrier : str or None
            Why this fit cannot run barrier stages (None: it can).
        slots : int or None
            Task slots Spark has for a barrier stage (None: unknown).
        overheads : mapping
            Path -> the last measured overhead of one of its rounds, seconds.
        rounds, frequency : int
            The epoch's rounds and minibatches per worker per round.
        iteration : float, optional
            Seconds per minibatch, measured.
        meeting : float, optional
            Seconds the last stage's meeting took, measured.
        forced : str, optional
            The tests' hook.
        at_driver : bool, default False
            The seam's ``meets_at_driver``: the meeting's figure before one is measured.
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
        j = JOB_ROUND_S if job is None else job
        st = STAGE_ROUND_S if stage is None else stage
        prior, how = (RENDEZVOUS_MEETING_S, "the driver's rendezvous") if at_driver else (MEETING_S, "allGather")
        m = prior if meeting is None else meeting
        hidden = frequency * (iteration or 0.0)
        saved, paid = rounds * (j - st), max(0.0, m - hidden)
        costs = (f"a Spark job per round {j * 1e3:.1f} ms of overhead ({'measured' if job is not None else 'assumed'}), "
                 f"a round inside one stage {st * 1e3:.1f} ms ({'measured' if stage is not None else 'assumed'}), "
                 f"the stage's meeting {m:.2f} s ({'measured' if meeting is not None else 'assumed'}, {how})"
                 + (f" less round 1's {hidden:.2f} s of training" if hidden else ""))
        if saved <= paid:
            return JOBS, (f"{rounds} round(s) this epoch would save {saved:.2f} s inside one stage and pay "
                          f"{paid:.2f} s for its meeting ({costs}): a Spark job per round")
        return IN_STAGE, (f"{rounds} round(s) this epoch save {saved:.2f} s inside one stage and pay {paid:.2f} s "
                          f"for its meeting ({costs}); barrier mode available, {workers} workers <= "
                          f"{'?' if slots is None else slots} task slots: one barrier stage per epoch whose workers "
                          f"average among themselves (an all-reduce between executors)")
