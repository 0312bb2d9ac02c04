"""Parameter averaging: how its epoch distributes work.

Rounds of ``averaging_frequency`` minibatches per worker; per round the
shipped ``(iteration, params, updater state)`` is fitted by every worker on
its own shard, the weighted sums come back through ``treeAggregate`` and
the driver divides -- then, with :class:`~sparkavg.spark.masters.BlockMomentum`,
applies block momentum (:func:`block_momentum_step`).

With ``averaging_frequency="auto"`` the frequency of each epoch is chosen
(:mod:`.frequency`) from the costs measured in the previous epoch's rounds;
before the first epoch of a runner, two probe rounds of
:data:`PROBE_MINIBATCHES` minibatches measure them.  A probe round is a
real round on the epoch's data whose result is thrown away (its examples
still train exactly once, in the epoch): it costs the first epoch about two
rounds' overhead, and with data in Spark blocks one more shuffle of the
minibatches.
"""
from __future__ import annotations

import logging
import math
import time
from typing import Optional

import numpy as np

from ... import ops
from ...backend import to_cpu
from ..errors import raise_failures
from ..executor.averaging import combine_results, make_round_task
from ..deal import share_choice
from ..masters import ParameterAveraging, Weighting
from . import runs
from .base import EpochRunner, Merged, network_state, set_state
from .frequency import (RoundCosts, busy_from_payloads, choose_frequency, convergence_bound, round_costs,
                        rounds_from_events)

__all__ = ["AveragingRunner", "block_momentum_step", "PROBE_MINIBATCHES", "PROBE_ROUNDS", "SPEED_MEMORY"]

logger = logging.getLogger(__name__)

#: Minibatches per worker in a probe round.
PROBE_MINIBATCHES = 4
#: Probe rounds before the first epoch (the first also warms the workers' cached networks up).
PROBE_ROUNDS = 2
#: How much the previous speed estimate counts against the rounds measured
#: since (per second measured): 0.5 halves the old evidence at every plan.
SPEED_MEMORY = 0.5


def block_momentum_step(model, averaged, delta, momentum: float, block_lr: float, nesterov: bool) -> None:
    """One BMUF update, in place on flat float32 vectors, no temporaries.

    Parameters
    ----------
    model : ndarray (n,)
        ``W``, the model before the round (read only).
    averaged : ndarray (n,)
        The workers' average ``W_avg`` on entry; ``W``'s successor on exit.
    delta : ndarray (n,)
        The block velocity ``Delta``, updated.
    momentum, block_lr : float
        ``mu`` and ``zeta``.
    nesterov : bool
        The round started from ``W + mu * Delta`` (else from ``W``).

    Notes
    -----
    ``G = W_avg - W_sent``; ``Delta = mu * Delta + zeta * G``;
    ``W = W + Delta`` (Chen & Huo 2016, eqs. 2-4).
    """
    ops.accumulate(averaged, model, -1.0)  # W_avg - W
    if nesterov:
        ops.accumulate(averaged, delta, -momentum)  # - mu * Delta: the round started from the look-ahead
    ops.scale(delta, momentum)
    ops.accumulate(delta, averaged, block_lr)
    np.copyto(averaged, model)
    ops.accumulate(averaged, delta)


def correct_moments(network, result) -> None:
    """The averaged updater state of ``result`` (weighted sums, in place)
    corrected for the workers' gradient noise
    (:meth:`~sparkavg.nn.updaters.Updater.correct_averaged_state`), while
    ``network`` still holds the state the round started from; nothing
    without the workers' first-moment spread (``moment_correction`` off, an
    updater without one) or with one worker."""
    workers = len(result.speeds)
    if result.state is None or getattr(result, "moment_sq", None) is None or workers < 2:
        return
    inv = 1.0 / result.weight
    state = result.state.astype(np.float64) * inv
    sent = np.asarray(to_cpu(network.state["updater"]), dtype=np.float64)
    segments = getattr(network, "param_segments", None)  # a contract model may have none: one block
    network.updater.correct_averaged_state(state, result.moment_sq.astype(np.float64) * inv, sent, workers,
                                           max(1, round(result.batches / workers)),
                                           [(seg.start, seg.stop) for seg in segments] if segments else None)
    result.state[...] = state * result.weight


@runs(ParameterAveraging)
class AveragingRunner(EpochRunner):
    """Runs epochs of :class:`ParameterAveraging`."""

    master: ParameterAveraging

    def __init__(self, seam, master):
        super().__init__(seam, master)
        self._delta: Optional[np.ndarray] = None  # BMUF block velocity, flat float32 (host)
        self._momentum: Optional[float] = None  # resolved block momentum
        self._costs: Optional[RoundCosts] = None  # the last measurement ("auto")
        self._frequency: Optional[int] = None  # the frequency of the running epoch
        self._epoch: Optional[int] = None  # the running epoch
        self._bm_on = False  # block momentum applies in the running epoch
        self._bm_recorded = None  # (stats id, on) last recorded
        self._corrects = False  # the running epoch's rounds correct the averaged updater state
        # worker -> [examples, fit seconds, fixed seconds, tasks] since the last plan (worker_shares)
        self._speed_log: dict = {}
        # [(examples/s, seconds measured, fixed seconds per task) or None] per worker, for the next plan
        self._speeds: Optional[list] = None
        self._shares = None  # (stats, key) of the last recorded worker_shares decision
        self._weights: Optional[list] = None  # the running epoch's shares (None: equal)
        self._rounds_run = 0  # rounds this runner ran (the first is not a speed)

    # ------------------------------------------------------------ frequency
    def minibatches_per_round(self, prepared, workers, network, epoch, stats) -> int:
        m = self.master
        self._epoch = epoch
        self._decide_moment_correction(workers, network, epoch, stats)  # before the probe's rounds
        if not m.auto_frequency:
            frequency = int(m.averaging_frequency)
        else:
            if self._costs is None:
                self._costs = self._probe(prepared, workers, network, epoch, stats)
            per_worker = max(1, math.ceil(len(prepared.sizes) / workers))
            bound = self.frequency_bound(per_worker, workers, epoch, getattr(network, "updater", None))
            if self._costs is None:  # the probe saw no minibatch fitted: nothing to measure
                frequency = min(m.max_averaging_frequency, bound[0])
                reason = f"no probe round fitted a minibatch: the bound; {bound[1]}"
            else:
                frequency, reason = choose_frequency(self._costs, m.target_overhead, m.max_averaging_frequency,
                                                     per_worker, bound)
            stats.decision("averaging_frequency", frequency, reason, epoch=epoch)
            logger.info("epoch %d: averaging_frequency %d: %s", epoch + 1, frequency, reason)
        self._frequency = frequency
        self._decide_block_momentum(frequency, workers, network, epoch, stats)
        return frequency

    def frequency_bound(self, per_worker: int, workers: int, epoch: int, updater=None):
        """The largest frequency ``"auto"`` may choose in ``epoch`` and why:
        the convergence bound (:func:`.frequency.convergence_bound`), and
        with an updater that has a momentum of its own (Nesterov, ...)
        averaged plainly -- block momentum never runs for it -- at most
        ``max_plain_momentum_frequency``: such a worker moves
        ``1 / (1 - momentum)`` times its learning rate a step, its replicas
        drift apart within a long round, and the average of drifted replicas
        lost 1.9 points against one process (DL4J's MnistMLP, Nesterov(0.9),
        60k x 3, mean of 8 seeds, at F = 157-375; benchmarks/RESULTS.md,
        issue 22)."""
        bound = convergence_bound(per_worker, workers, epoch)
        m = self.master
        own = float(getattr(updater, "momentum", 0.0) or 0.0)
        bm = m.block_momentum
        cap = m.max_plain_momentum_frequency
        if own <= 0.0 or (bm is not None and bm.with_momentum_updaters) or bound[0] <= cap:
            return bound
        return cap, (f"momentum bound {cap}: {type(updater).__name__} has its own momentum {own:g} and is "
                     f"averaged plainly (no block momentum), whose replicas drift apart in longer rounds "
                     f"(max_plain_momentum_frequency {cap}); the {bound[1]}")

    def _decide_block_momentum(self, frequency, workers, network, epoch, stats) -> None:
        """Whether block momentum runs this epoch (:meth:`BlockMomentum.applies`);
        recorded (decision ``block_momentum``: the momentum, 0.0 when off)
        and logged when it changes.  Off drops the block velocity."""
        bm = self.master.block_momentum
        if bm is None:
            self._bm_on = False
            return
        on, why = bm.applies(frequency, getattr(network, "updater", None))
        if on:
            if self._momentum is None:
                self._momentum = bm.momentum_for(workers)
            source = ("BlockMomentum(momentum=...)" if bm.momentum is not None
                      else f"1 - 1/workers with {workers} workers (Chen & Huo 2016)")
            why = (f"{why}; momentum {self._momentum:g} from {source}; block_lr {bm.block_lr}, "
                   f"{'Nesterov look-ahead' if bm.nesterov else 'classic'}")
        else:
            self._delta = None
        self._bm_on = on
        key = (id(stats), on)
        if key != self._bm_recorded:
            self._bm_recorded = key
            stats.decision("block_momentum", self._momentum if on else 0.0, why, epoch=epoch)
            logger.info("epoch %d: block momentum %s", epoch + 1, why)

    def _decide_moment_correction(self, workers, network, epoch, stats) -> None:
        """Whether this epoch's rounds correct the averaged updater state for
        the workers' gradient noise (:meth:`ParameterAveraging.corrects_moments`:
        the workers then also return their first moments' squares); recorded
        when it changes (decision ``moment_correction``)."""
        on, why = self.master.corrects_moments(getattr(network, "updater", None), workers)
        self._corrects = on
        if stats.decision("moment_correction", on, why, epoch=epoch, when_changed=True):
            logger.info("epoch %d: moment correction %s: %s", epoch + 1, "on" if on else "off", why)

    def _probe(self, prepared, workers, network, epoch, stats) -> Optional[RoundCosts]:
        """Run :data:`PROBE_ROUNDS` throw-away rounds of :data:`PROBE_MINIBATCHES`
        minibatches; their costs (the last round's: the first also warms up)."""
        plan = self.seam.plan(prepared, workers, PROBE_MINIBATCHES, None,
                              local=self.deals_locally(prepared, workers, epoch, stats))
        config_json = network.to_json()
        measured = []
        try:
            for r in range(min(PROBE_ROUNDS, len(plan.rounds))):
                start = time.perf_counter()
                shipped = self.seam.ship(self.shipped(network, epoch))
                try:
                    result = self._run_round(plan, r, config_json, shipped, f"probe round {r + 1} of epoch "
                                                                            f"{epoch + 1}")
                finally:
                    shipped.destroy()
                raise_failures(result, f"probe round {r + 1} of epoch {epoch + 1}")
                if result is None:
                    continue
                for value in (result.params, result.state, result.buffers):  # what a merge costs; then dropped
                    if value is not None and value.size:
                        ops.scale(value, 1.0 / result.weight)
                measured.append((time.perf_counter() - start, busy_from_payloads(result.stats)))
        finally:
            plan.drop()
        if not measured:
            return None
        return round_costs(measured[-1:], f"probe round {len(measured)} of {PROBE_MINIBATCHES} minibatches "
                                          f"before epoch {epoch + 1}")

    # ------------------------------------------------------ worker shares
    def plan_weights(self, prepared, workers, local, epoch, stats, per_round=None):
        """Shares by measured speed (:func:`~sparkavg.spark.deal.share_choice`),
        from the rounds since the last plan (the probe rounds before the
        first epoch); recorded (decision ``worker_shares``) when it changes."""
        self._take_speeds()
        entries = self._speeds if self._speeds is not None and len(self._speeds) == workers else [None] * workers
        speeds = [None if e is None else e[0] for e in entries]
        measured = [0.0 if e is None else e[1] for e in entries]
        fixed = None if any(e is None for e in entries) else [e[2] for e in entries]
        examples = sum(prepared.sizes) / max(len(prepared.sizes), 1) * (per_round or 0) * workers
        weights, reason = share_choice(speeds, local, self.master.worker_shares == "auto", measured, fixed,
                                       examples or None)
        key = (None if weights is None else tuple(round(w / sum(weights), 2) for w in weights), reason.split(":")[0])
        if self._shares is None or self._shares[0] is not stats or self._shares[1] != key:
            self._shares = (stats, key)
            value = "equal" if weights is None else "by speed"
            stats.decision("worker_shares", value, reason, epoch=epoch)
            logger.info("epoch %d: worker shares %s: %s", epoch + 1, value, reason)
        self._weights = weights
        return weights

    def _take_speeds(self) -> None:
        """Fold the rounds logged since the last plan into ``_speeds``,
        smoothed: the previous estimate counts :data:`SPEED_MEMORY` as much
        as its measured seconds (one epoch's noise -- a step delayed by a
        neighbour, a slow block fetch -- moves the shares less; a host that
        stays slow is followed within an epoch or two)."""
        if self._speed_log:
            size, log = max(self._speed_log) + 1, self._speed_log
            old = self._speeds if self._speeds is not None and len(self._speeds) == size else [None] * size
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
            self._speeds = speeds
            self._speed_log = {}

    def _log_speeds(self, result, workers: int, launched: float, elapsed: float) -> None:
        """Log each worker's examples, fitting seconds and fixed seconds:
        everything else from the round's launch (``launched``, the driver's
        ``time.time()``) to the end of its task -- its start (task launch,
        state fetch, the shard's first block: slower on a slow host too,
        whatever its share) and what follows the fit -- bounded by the
        round's ``elapsed`` seconds (clocks of other hosts may disagree)."""
        for entry_ in getattr(result, "speeds", None) or ():
            partition, examples, seconds, task_seconds = entry_[:4]
            inside = max(0.0, task_seconds - seconds)  # the task's own part besides fitting
            if len(entry_) > 4:  # + its start after the launch, where the clocks allow
                start = entry_[4] - launched
                if 0.0 <= start and start + task_seconds <= elapsed:
                    inside += start
            entry = self._speed_log.setdefault(int(partition) % workers, [0, 0.0, 0.0, 0])
            entry[0] += examples
            entry[1] += seconds
            entry[2] += inside
            entry[3] += 1

    def epoch_done(self, summary, stats) -> None:
        weights = self._weights
        summary["worker_shares"] = None if weights is None else [round(w / sum(weights), 4) for w in weights]
        summary["averaging_frequency"] = self._frequency
        if self.master.auto_frequency:
            epoch = self._epoch
            costs = round_costs(rounds_from_events(stats.events, epoch), f"epoch {epoch + 1}")
            if costs is not None:  # else keep the last measurement
                self._costs = costs

    # ---------------------------------------------------------------- rounds
    def result_bytes(self, network) -> int:
        live = network.state
        state = live["updater"].size if self.master.save_updater else 0
        if state and self.master.corrects_moments(getattr(network, "updater", None))[0]:
            state += live["params"].size  # the workers' m * m
        return 4 * (live["params"].size + state + live["buffers"].size)

    def shipped(self, network, epoch):
        state = network_state(network, self.master.save_updater)
        bm = self.master.block_momentum
        if self._bm_on and bm.nesterov and self._delta is not None:
            params = state["params"].copy()  # the look-ahead W + mu * Delta; the network keeps W
            ops.accumulate(params, self._delta, self._momentum)
            state["params"] = params
        return state

    def _run_round(self, plan, r, config_json, shipped, what):
        m = self.master
        task = make_round_task(config_json, shipped, round_no=r + 1, save_updater=m.save_updater,
                               uniform=m.weighting is Weighting.UNIFORM, collect_stats=m.collect_stats,
                               prefetch=m.data.prefetch_depth, device=m.device.value, hooks=self.seam.test_hooks(),
                               moment_spread=self._corrects)
        launched, began = time.time(), time.perf_counter()
        result = self.seam.aggregate_round(plan, r, task, combine_results, m.aggregation_depth, what)
        if self._rounds_run:  # the runner's first round warms the workers up: not a speed
            self._log_speeds(result, plan.workers, launched, time.perf_counter() - began)
        self._rounds_run += 1
        return result

    def launch(self, plan, r, config_json, shipped, epoch, stats):
        return self._run_round(plan, r, config_json, shipped, f"averaging round {r + 1} of epoch {epoch + 1}")

    def merge(self, network, result, epoch, r, stats) -> Merged:
        bm = self.master.block_momentum
        correct_moments(network, result)
        if not self._bm_on:
            set_state(network, result.weight, result.max_iterations, params=result.params, updater=result.state,
                      buffers=result.buffers)
        else:
            inv = 1.0 / result.weight
            for value in (result.params, result.state, result.buffers):
                if value is not None and value.size:
                    ops.scale(value, inv)
            model = np.ascontiguousarray(to_cpu(network.params), dtype=np.float32)  # W: read only
            if self._delta is None:
                self._delta = np.zeros_like(model)
            block_momentum_step(model, result.params, self._delta, self._momentum, bm.block_lr, bm.nesterov)
            set_state(network, 1.0, result.max_iterations, params=result.params, updater=result.state,
                      buffers=result.buffers)
        stats.count("examples", result.examples)
        stats.count("minibatches", result.batches)
        return Merged(result.loss_sum, result.examples, result.stats)

    # ------------------------------------------------------------ checkpoint
    def state_dict(self) -> dict:
        state = {}
        if self._delta is not None:
            state["block_momentum_delta"] = self._delta.copy()
        if self._costs is not None:
            state.update({f"round_costs_{k}": v for k, v in self._costs.to_plain().items()})
        self._take_speeds()  # what the next epoch's shares are cut from, so a resume cuts the same
        if self._speeds is not None:
            state["worker_speeds"] = np.asarray([(np.nan, 0.0, 0.0) if e is None else e for e in self._speeds],
                                                dtype=np.float64)
        return state

    def load_state_dict(self, state: dict) -> None:
        unknown = set(state) - {"block_momentum_delta", "worker_speeds"} - {f"round_costs_{k}" for k in
                                                           ("overhead", "iteration", "rounds", "source")}
        if unknown:
            raise ValueError(f"Expect averaging runner state (block_momentum_delta, round_costs_*), "
                             f"got unknown keys {sorted(unknown)}")
        delta = state.get("block_momentum_delta")
        self._delta = None if delta is None else np.array(delta, dtype=np.float32)
        speeds = state.get("worker_speeds")
        rows = [] if speeds is None else np.asarray(speeds, dtype=np.float64).reshape(-1, 3)
        self._speeds = None if speeds is None else [
            None if not np.isfinite(v) else (float(v), float(t), float(a)) for v, t, a in rows]
        self._speed_log = {}
        if "round_costs_overhead" in state:
            self._costs = RoundCosts.from_plain({k: np.asarray(state[f"round_costs_{k}"]).item()
                                                 for k in ("overhead", "iteration", "rounds", "source")})
        else:
            self._costs = None

    def check_state_dict(self, state: dict, network) -> None:
        super().check_state_dict(state, network)
        delta = state.get("block_momentum_delta")
        if delta is not None and np.shape(delta) != (network.num_params,):
            raise ValueError(f"Expect block_momentum_delta of shape ({network.num_params},) (one value per "
                             f"parameter), got {np.shape(delta)}")
