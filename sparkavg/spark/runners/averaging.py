"""Parameter averaging: how its epoch distributes work.

Rounds of ``averaging_frequency`` minibatches per worker; per round the
shipped ``(iteration, params, updater state)`` is fitted by every worker on
its own shard, the weighted sums come back through ``treeAggregate`` and
the driver divides.  The rules of an epoch are policies
(:mod:`sparkavg.spark.policies`) chosen by the master's preset: the
frequency, block momentum, the moment correction and the workers' shares.

With ``averaging_frequency="auto"``, before the first epoch of a runner two
probe rounds of :data:`PROBE_MINIBATCHES` minibatches measure the costs
(real rounds on the epoch's data whose results are thrown away; their
examples still train exactly once, in the epoch); later epochs use the
previous epoch's rounds.
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
from ..masters import ParameterAveraging
from ..policies import record
from ..policies.block_momentum import BlockMomentum
from ..policies.frequency import AveragingFrequency, RoundCosts, busy_from_payloads, round_costs, rounds_from_events
from ..policies.moments import MomentCorrection
from ..policies.shares import WorkerShares
from ...data.storage import prefetch_depth
from .base import EpochRunner, Merged, network_state, runs, set_state

__all__ = ["AveragingRunner", "PROBE_MINIBATCHES", "PROBE_ROUNDS", "AGGREGATION_DEPTH"]

logger = logging.getLogger(__name__)

#: Minibatches per worker in a probe round.
PROBE_MINIBATCHES = 4
#: Probe rounds before the first epoch (the first also warms the workers' cached networks up).
PROBE_ROUNDS = 2
#: ``treeAggregate`` depth of a round's results.
AGGREGATION_DEPTH = 2


@runs(ParameterAveraging)
class AveragingRunner(EpochRunner):
    """Runs epochs of :class:`ParameterAveraging`."""

    master: ParameterAveraging
    streams = True

    def __init__(self, seam, master):
        super().__init__(seam, master)
        sparkavg = master.preset == "sparkavg"
        self.frequency_policy = AveragingFrequency(master.averaging_frequency, momentum_cap=sparkavg)
        self.block_momentum = BlockMomentum(enabled=sparkavg)
        self.moments = MomentCorrection(enabled=sparkavg)
        self.shares = WorkerShares(enabled=sparkavg)
        self.uniform = not sparkavg  # DL4J's unweighted mean of the workers' results
        self._costs: Optional[RoundCosts] = None  # the last measurement ("auto")
        self._frequency: Optional[int] = None  # the frequency of the running epoch
        self._epoch: Optional[int] = None  # the running epoch
        self._rounds_run = 0  # rounds this runner ran (the first is not a speed)

    # ------------------------------------------------------------ frequency
    def minibatches_per_round(self, prepared, workers, network, epoch, stats) -> int:
        m = self.master
        self._epoch = epoch
        updater = getattr(network, "updater", None)
        on, why = self.moments.decide(updater, workers, m.save_updater)  # before the probe's rounds
        record(stats, self.moments.name, on, why, epoch)
        if self.frequency_policy.auto and self._costs is None:
            self._costs = self._probe(prepared, workers, network, epoch, stats)
        per_worker = max(1, math.ceil(len(prepared.sizes) / workers))
        frequency, reason = self.frequency_policy.decide(self._costs, per_worker, workers, epoch, updater)
        if self.frequency_policy.auto:
            stats.decision("averaging_frequency", frequency, reason, epoch=epoch)
            logger.info("epoch %d: averaging_frequency %d: %s", epoch + 1, frequency, reason)
        self._frequency = frequency
        momentum, why = self.block_momentum.decide(frequency, updater, workers)
        record(stats, self.block_momentum.name, momentum, why, epoch)
        return frequency

    def _probe(self, prepared, workers, network, epoch, stats) -> Optional[RoundCosts]:
        """Run :data:`PROBE_ROUNDS` throw-away rounds of :data:`PROBE_MINIBATCHES`
        minibatches; their costs (the last round's: the first also warms up)."""
        plan = prepared.plan(workers, PROBE_MINIBATCHES, None,
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
        """Shares by measured speed (:class:`~sparkavg.spark.policies.shares.WorkerShares`)."""
        return self.shares.decide(prepared, workers, local, per_round, stats, epoch)[0]

    def epoch_done(self, summary, stats) -> None:
        weights = self.shares.weights
        summary["worker_shares"] = None if weights is None else [round(w / sum(weights), 4) for w in weights]
        summary["averaging_frequency"] = self._frequency
        if self.frequency_policy.auto:
            epoch = self._epoch
            costs = round_costs(rounds_from_events(stats.events, epoch), f"epoch {epoch + 1}")
            if costs is not None:  # else keep the last measurement
                self._costs = costs

    # ---------------------------------------------------------------- rounds
    def result_bytes(self, network) -> int:
        live = network.state
        state = live["updater"].size if self.master.save_updater else 0
        if state and self.moments.choice(getattr(network, "updater", None), 2, self.master.save_updater)[0]:
            state += live["params"].size  # the workers' m * m
        return 4 * (live["params"].size + state + live["buffers"].size)

    def shipped(self, network, epoch):
        state = network_state(network, self.master.save_updater)
        state["params"] = self.block_momentum.look_ahead(state["params"])  # the network keeps W
        return state

    def _run_round(self, plan, r, config_json, shipped, what):
        m = self.master
        task = make_round_task(config_json, shipped, round_no=r + 1, save_updater=m.save_updater,
                               uniform=self.uniform, collect_stats=True, prefetch=prefetch_depth(m.data),
                               device=m.device.value, hooks=self.seam.test_hooks(), moment_spread=self.moments.on)
        launched, began = time.time(), time.perf_counter()
        result = plan.aggregate(r, task, combine_results, AGGREGATION_DEPTH, what)
        if getattr(result, "weight", 1.0) <= 0:  # a weight_col of zeros (a failure has no weight)
            raise ValueError(f"Expect rows of a non-zero total weight in {what}, got {result.examples} rows weighing 0: "
                             f"every row's weight (weight_col) is 0")
        if self._rounds_run:  # the runner's first round warms the workers up: not a speed
            self.shares.log(result, plan.workers, launched, time.perf_counter() - began)
        self._rounds_run += 1
        return result

    def launch(self, plan, r, config_json, shipped, epoch, stats):
        return self._run_round(plan, r, config_json, shipped, f"averaging round {r + 1} of epoch {epoch + 1}")

    def merge(self, network, result, epoch, r, stats) -> Merged:
        MomentCorrection.correct(network, result)
        if not self.block_momentum.on:
            set_state(network, result.weight, result.max_iterations, params=result.params, updater=result.state,
                      buffers=result.buffers)
        else:
            inv = 1.0 / result.weight
            for value in (result.params, result.state, result.buffers):
                if value is not None and value.size:
                    ops.scale(value, inv)
            model = np.ascontiguousarray(to_cpu(network.state["params"]), dtype=np.float32)  # W: read only
            self.block_momentum.step(model, result.params)
            set_state(network, 1.0, result.max_iterations, params=result.params, updater=result.state,
                      buffers=result.buffers)
        stats.count("examples", result.examples)
        stats.count("minibatches", result.batches)
        return Merged(result.loss_sum, result.examples, result.stats)

    # ------------------------------------------------------------ checkpoint
    _COSTS = ("overhead", "iteration", "rounds", "source")

    def state_dict(self) -> dict:
        state = {**self.block_momentum.state_dict(), **self.shares.state_dict()}
        if self._costs is not None:
            state.update({f"round_costs_{k}": v for k, v in self._costs.to_plain().items()})
        return state

    def load_state_dict(self, state: dict) -> None:
        unknown = set(state) - {"block_momentum_delta", "worker_speeds"} - {f"round_costs_{k}" for k in self._COSTS}
        if unknown:
            raise ValueError(f"Expect averaging runner state (block_momentum_delta, worker_speeds, round_costs_*), "
                             f"got unknown keys {sorted(unknown)}")
        self.block_momentum.load_state_dict(state)
        self.shares.load_state_dict(state)
        if "round_costs_overhead" in state:
            self._costs = RoundCosts.from_plain({k: np.asarray(state[f"round_costs_{k}"]).item() for k in self._COSTS})
        else:
            self._costs = None

    def check_state_dict(self, state: dict, network) -> None:
        super().check_state_dict(state, network)
        delta = state.get("block_momentum_delta")
        if delta is not None and np.shape(delta) != (network.num_params,):
            raise ValueError(f"Expect block_momentum_delta of shape ({network.num_params},) (one value per "
                             f"parameter), got {np.shape(delta)}")
