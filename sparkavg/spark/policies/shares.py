"""Worker shares by measured speed: a slow worker (a busy or smaller host)
gets a smaller share of each epoch's minibatches, so synchronous rounds do
not wait for it (:func:`sparkavg.data.deal.share_choice`)."""
from __future__ import annotations

from typing import Optional

import numpy as np

from ...data.deal import share_choice
from . import Policy, record

__all__ = ["WorkerShares", "SPEED_MEMORY"]

#: How much the previous speed estimate counts against the rounds measured
#: since (per second measured): 0.5 halves the old evidence at every plan.
SPEED_MEMORY = 0.5


class WorkerShares(Policy):
    """Decision ``worker_shares`` ("equal" or "by speed") and the speeds it is cut from."""

    name = "worker_shares"

    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        # worker -> [examples, fit seconds, fixed seconds, tasks] since the last plan
        self._log: dict = {}
        # [(examples/s, seconds measured, fixed seconds per task) or None] per worker, for the next plan
        self.speeds: Optional[list] = None
        self.weights: Optional[list] = None  # the running epoch's shares (None: equal)

    def decide(self, prepared, workers: int, local: bool, per_round, stats, epoch: int):
        """The epoch's shares (None: equal), recorded when they change."""
        self._take_speeds()
        entries = self.speeds if self.speeds is not None and len(self.speeds) == workers else [None] * workers
        speeds = [None if e is None else e[0] for e in entries]
        measured = [0.0 if e is None else e[1] for e in entries]
        fixed = None if any(e is None for e in entries) else [e[2] for e in entries]
        examples = sum(prepared.sizes) / max(len(prepared.sizes), 1) * (per_round or 0) * workers
        weights, reason = share_choice(speeds, local, self.enabled, measured, fixed, examples or None)
        record(stats, self.name, "equal" if weights is None else "by speed", reason, epoch)
        self.weights = weights
        return weights, reason

    def _take_speeds(self) -> None:
        """Fold the rounds logged since the last plan into ``speeds``, smoothed:
        the previous estimate counts :data:`SPEED_MEMORY` as much as its measured
        seconds (one epoch's noise moves the shares less; a host that stays
        slow is followed within an epoch or two)."""
        if self._log:
            size, log = max(self._log) + 1, self._log
            old = self.speeds if self.speeds is not None and len(self.speeds) == size else [None] * size
            speeds = []
            for w in range(size):
                if w not in log or log[w][1] <= 0:
                    speeds.append(None)
                    continue
                examples, seconds, fixed = log[w][0], log[w][1], log[w][2] / max(log[w][3], 1)
                if old[w] is not None and np.isfinite(old[w][0]):
                    v, t, a = old[w]
                    examples += SPEED_MEMORY * v * t
                    fixed = (fixed * seconds + SPEED_MEMORY * a * t) / (seconds + SPEED_MEMORY * t)
                    seconds += SPEED_MEMORY * t
                speeds.append((examples / seconds, seconds, fixed))
            self.speeds = speeds
            self._log = {}

    def log(self, speeds, workers: int, launched: float, elapsed: float) -> None:
        """Log each worker's examples, fitting seconds and fixed seconds of a
        round (``speeds``: a round result's): everything else from the round's launch (``launched``, the
        driver's ``time.time()``) to the end of its task, bounded by the
        round's ``elapsed`` seconds (clocks of other hosts may disagree)."""
        for entry_ in speeds or ():
            partition, examples, seconds, task_seconds = entry_[:4]
            inside = max(0.0, task_seconds - seconds)  # the task's own part besides fitting
            if len(entry_) > 4:  # + its start after the launch, where the clocks allow
                start = entry_[4] - launched
                if 0.0 <= start and start + task_seconds <= elapsed:
                    inside += start
            entry = self._log.setdefault(int(partition) % workers, [0, 0.0, 0.0, 0])
            entry[0] += examples
            entry[1] += seconds
            entry[2] += inside
            entry[3] += 1

    def state_dict(self) -> dict:
        self._take_speeds()  # what the next epoch's shares are cut from, so a resume cuts the same
        if self.speeds is None:
            return {}
        return {"worker_speeds": np.asarray([(np.nan, 0.0, 0.0) if e is None else e for e in self.speeds],
                                            dtype=np.float64)}

    def load_state_dict(self, state: dict) -> None:
        speeds = state.get("worker_speeds")
        rows = [] if speeds is None else np.asarray(speeds, dtype=np.float64).reshape(-1, 3)
        self.speeds = None if speeds is None else [
            None if not np.isfinite(v) else (float(v), float(t), float(a)) for v, t, a in rows]
        self._log = {}
