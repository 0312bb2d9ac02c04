"""Parameter averaging: how its epoch distributes work.

Rounds of ``averaging_frequency`` minibatches per worker, run one of two
ways (decision ``averaging_path``, :mod:`..policies.path`): a Spark job per
round -- the shipped ``(iteration, params, updater state)`` is fitted by
every worker on its own shard, the weighted sums come back summed in the
all-reduce's order (the deal's ``aggregate``) and the driver merges them --
or all of an epoch's rounds inside one barrier stage, whose ranks sum the
same weighted state with an all-reduce and each merge it as the driver would
(:mod:`sparkavg.averaging`; :mod:`..executor.instage`); the driver then gets
rank 0's final state and every round's statistics.  The rules of an epoch
are policies (:mod:`sparkavg.spark.policies`) chosen by the master's preset:
the path, the frequency, block momentum, the moment correction and the
workers' shares.

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
from ...averaging.merge import merge_sums, moment_blocks, start_of
from ...stats import Phase
from ..errors import raise_failures
from ..executor.averaging import combine_results, make_round_task
from ..executor.instage import make_stage_task
from ..masters import ParameterAveraging
from ..policies import record
from ..policies.block_momentum import BlockMomentum
from ..policies.frequency import AveragingFrequency, RoundCosts, busy_from_payloads, round_costs, rounds_from_events
from ..policies.moments import MomentCorrection
from ..policies.path import IN_STAGE, JOBS, STAGE_ROUND_S, AveragingPath
from ..policies.shares import WorkerShares
from ...data.storage import prefetch_depth
from .base import EpochRunner, Merged, network_state, runs

__all__ = ["AveragingRunner", "PROBE_MINIBATCHES", "PROBE_ROUNDS", "AGGREGATION_DEPTH"]

logger = logging.getLogger(__name__)

#: Minibatches per worker in a probe round.
PROBE_MINIBATCHES = 4
#: Probe rounds before the first epoch (the first also warms the workers' cached networks up).
PROBE_ROUNDS = 2
#: Depth of the tree a round's results are summed in (``treeAggregate``'s, in the all-reduce's order).
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
        self.path = AveragingPath(enabled=sparkavg)
        self.uniform = not sparkavg  # DL4J's unweighted mean of the workers' results
        self._overheads: dict = {}  # path -> its last measured overhead per round (s)
        self._meeting: Optional[float] = None  # seconds the last stage's ranks took to meet (s)
        self._no_barrier = None  # why this session runs no barrier stage ("": it does), read once
        self._launched = (0.0, 0.0)  # time.time(), time.perf_counter() of the running stage's launch
        self._counts: list = []  # the running in-stage epoch's minibatches per round and worker
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
            if self._costs is not None:
                self._overheads[JOBS] = self._costs.overhead
        per_worker = max(1, math.ceil(len(prepared.sizes) / workers))
        frequency, reason = self.frequency_policy.decide(self._costs, per_worker, workers, epoch, updater)
        self._decide_path(prepared, workers, epoch, stats, math.ceil(per_worker / frequency), frequency)
        costs = self._path_costs()
        if costs is not self._costs:  # the round's overhead on the path chosen, not the probe's jobs
            frequency, reason = self.frequency_policy.decide(costs, per_worker, workers, epoch, updater)
        if self.frequency_policy.auto:
            stats.decision("averaging_frequency", frequency, reason, epoch=epoch)
            logger.info("epoch %d: averaging_frequency %d: %s", epoch + 1, frequency, reason)
        self._frequency = frequency
        momentum, why = self.block_momentum.decide(frequency, updater, workers)
        record(stats, self.block_momentum.name, momentum, why, epoch)
        return frequency

    def _path_costs(self) -> Optional[RoundCosts]:
        """The measured costs with the overhead of a round on the path
        chosen (measured, or :data:`~..policies.path.STAGE_ROUND_S` inside a
        stage before one ran): after the probe's jobs, an epoch inside one
        stage averages as often as its cheaper rounds allow."""
        costs = self._costs
        if not self.frequency_policy.auto or costs is None:
            return costs
        path = IN_STAGE if self.in_stage else JOBS
        overhead = self._overheads.get(path)
        if overhead is None and not self.in_stage:
            return costs
        if overhead == costs.overhead:
            return costs
        where = "inside one stage" if self.in_stage else "as a Spark job"
        source = (f"{costs.source}, with the overhead of a round {where} "
                  f"{'measured' if overhead is not None else 'assumed'}")
        return RoundCosts(STAGE_ROUND_S if overhead is None else overhead, costs.iteration, costs.rounds, source)

    def _decide_path(self, prepared, workers, epoch, stats, rounds, frequency) -> None:
        """Decision ``averaging_path`` for the epoch (:class:`~..policies.path.AveragingPath`)."""
        if self._no_barrier is None:
            dynamic = str(self.seam.conf("spark.dynamicAllocation.enabled", "false")).lower() == "true"
            self._no_barrier = "dynamic allocation is on (a barrier stage needs its executors at once)" if dynamic \
                else ""
        no_barrier = self._no_barrier or (None if callable(getattr(prepared.Deal, "barrier", None)) else
                                          f"{prepared.description} minibatches run no barrier stage")
        slots = None if no_barrier else self.seam.barrier_slots(set())
        hooks = self.seam.test_hooks()
        path, why = self.path.decide(no_barrier, slots, workers, self._overheads, rounds, frequency,
                                     iteration=None if self._costs is None else self._costs.iteration,
                                     meeting=self._meeting,
                                     forced=hooks.averaging_path if hooks is not None else None,
                                     at_driver=self.seam.meets_at_driver)
        record(stats, self.path.name, path, why, epoch)
        self.in_stage = path == IN_STAGE

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
        summary["averaging_path"] = IN_STAGE if self.in_stage else JOBS
        if self.in_stage:
            summary["rounds"] = len(self._counts)
        epoch = self._epoch
        costs = round_costs(rounds_from_events(stats.events, epoch), f"epoch {epoch + 1}")
        if costs is not None:  # else keep the last measurement
            self._overheads[IN_STAGE if self.in_stage else JOBS] = costs.overhead
            if self.frequency_policy.auto:
                self._costs = costs

    # ---------------------------------------------------------------- rounds
    def result_bytes(self, network) -> int:
        live = network.state
        state = live["updater"].size if self.master.save_updater else 0
        if state and self.moments.choice(getattr(network, "updater", None), 2, self.master.save_updater)[0]:
            state += len(moment_blocks(network))  # the workers' sums of m * m, one per block
        return 4 * (live["params"].size + state + live["buffers"].size)

    def shipped(self, network, epoch):
        state = network_state(network, self.master.save_updater)
        if self.in_stage and self.block_momentum.on:  # the ranks keep W and the velocity
            state["model"], state["delta"] = state["params"], self.block_momentum.delta
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
            self.shares.log(getattr(result, "speeds", None), plan.workers, launched, time.perf_counter() - began)
        self._rounds_run += 1
        return result

    def launch(self, plan, r, config_json, shipped, epoch, stats):
        if not self.in_stage:
            return self._run_round(plan, r, config_json, shipped, f"averaging round {r + 1} of epoch {epoch + 1}")
        m, bm, hooks = self.master, self.block_momentum, self.seam.test_hooks()
        self._counts = plan.counts
        def make_task(meeting):
            return make_stage_task(config_json, shipped, plan.counts, save_updater=m.save_updater, uniform=self.uniform,
                                   moment_spread=self.moments.on, prefetch=prefetch_depth(m.data), device=m.device.value,
                                   momentum=(bm.momentum, bm.block_lr, bm.nesterov) if bm.on else None, hooks=hooks,
                                   meeting=meeting)
        self._launched = (time.time(), time.perf_counter())
        what = f"averaging epoch {epoch + 1} ({len(plan.counts)} rounds in one barrier stage)"
        return self.run_barrier(plan, 0, make_task, what, stats, hooks)

    def merge(self, network, result, epoch, r, stats) -> Merged:
        if self.in_stage:
            return self._merge_stage(network, result, epoch, stats)
        merge_sums(network, {"params": result.params, "updater": result.state, "buffers": result.buffers},
                   result.weight, result.max_iterations, start=start_of(network), workers=len(result.speeds),
                   batches=result.batches, moment_sq=result.moment_sq,
                   momentum=self.block_momentum if self.block_momentum.on else None)
        stats.count("examples", result.examples)
        stats.count("minibatches", result.batches)
        return Merged(result.loss_sum, result.examples, result.stats)

    def _merge_stage(self, network, results, epoch, stats) -> Merged:
        """Rank 0's final state; every round recorded as the job path records its rounds."""
        results = sorted(results, key=lambda x: x.rank)
        first = results[0]
        met = [x.meeting for x in results if x.meeting is not None]
        if met:
            self._meeting = max(met)
        network.load_state({"params": first.params, "updater": first.state, "buffers": first.buffers})
        network.iteration = network.iteration + first.iterations
        if self.block_momentum.on:
            self.block_momentum.delta = first.delta
        (wall, launched), returned = self._launched, time.perf_counter()
        loss_sum = examples = 0
        for r, rows in enumerate(zip(*(x.rounds for x in results))):
            began = min(max(launched, launched + rows[0][3] - wall), returned)  # rank 0's clock on the driver's
            ended = min(max(began, launched + rows[0][4] - wall), returned)
            stats.add_worker_payloads([x.stats[r] for x in results], epoch=epoch, round=r, launched=launched,
                                      returned=returned)
            stats.record(Phase.ROUND, began, ended, epoch=epoch, round=r)
            merged = Merged(sum(row[0] for row in rows), sum(row[1] for row in rows), [x.stats[r] for x in results])
            loss_sum, examples = loss_sum + merged.loss_sum, examples + merged.examples
            self._emit_round(epoch, r, len(self._counts), merged, loss_sum, examples,
                             time.perf_counter() - (ended - began))
        self.shares.log([s for x in results for s in x.speeds], len(results), wall, returned - launched)
        stats.count("examples", examples)
        stats.count("minibatches", sum(row[2] for x in results for row in x.rounds))
        return Merged(loss_sum, examples, [], recorded=True)

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
