"""Synchronous parameter averaging: the driver side of one epoch.

Per round: broadcast ``(iteration, params, updater state)``; each worker
fits its shard of that round; the weighted sums come back through
``treeAggregate`` (export) or the round's own partitions (direct) and are
added in place; the driver divides.  The broadcast is destroyed after
the round, so executor memory stays flat.
"""
from __future__ import annotations

import functools
import logging
import time

from .. import ops
from .config import DataApproach, ParameterAveraging, Weighting
from .dataprep import EpochData, PreparedData
from .driver import Progress, broadcast_state, worker_errors
from .session import check_session
from .worker import combine_results, make_round_trainer

__all__ = ["AveragingRunner"]

logger = logging.getLogger(__name__)


class AveragingRunner:
    """Runs epochs of :class:`ParameterAveraging` for a trainer."""

    def __init__(self, sc, master: ParameterAveraging):
        self.sc = sc
        self.master = master
        self._session_checked = False

    @property
    def batch_size(self) -> int:
        return self.master.batch_size_per_worker

    def run_epoch(self, network, prepared: PreparedData, epoch: int, workers: int, stats) -> dict:
        """Train one epoch in place on ``network``; returns a summary dict."""
        m = self.master
        if not self._session_checked:
            state = network.updater_state.size if m.save_updater else 0
            check_session(self.sc, 4 * (network.num_params + state))
            self._session_checked = True
        seed = None if m.repartition.value == "never" else m.seed + epoch
        with stats.timed("plan", epoch=epoch):
            plan = EpochData.plan(prepared, workers, m.averaging_frequency, seed)
        progress = Progress(f"epoch {epoch + 1} rounds", len(plan.rounds))
        config_json = network.to_json()
        loss_sum, examples = 0.0, 0
        try:
            for r in range(len(plan.rounds)):
                result = self._round(network, config_json, plan, r, epoch, stats)
                loss_sum += result.loss_sum
                examples += result.examples
                progress.update(r + 1, loss=loss_sum / max(examples, 1), examples=examples)
        finally:
            plan.drop()
        return {"loss": loss_sum / max(examples, 1), "examples": examples, "rounds": len(plan.rounds)}

    def _round(self, network, config_json, plan: EpochData, r: int, epoch: int, stats):
        m = self.master
        t_round = time.perf_counter()
        with stats.timed("broadcast", epoch=epoch, round=r):
            bc = broadcast_state(self.sc, network, m.save_updater)
        try:
            train = make_round_trainer(config_json, bc, save_updater=m.save_updater,
                                       uniform=m.weighting is Weighting.UNIFORM,
                                       collect_stats=m.collect_stats, prefetch=m.prefetch)
            launched = time.perf_counter()
            with worker_errors(f"averaging round {r}"):
                if m.data_approach is DataApproach.EXPORT:
                    shards = plan.shard_paths(r)
                    rdd = self.sc.parallelize(shards, len(shards)).mapPartitions(train)
                    result = rdd.treeAggregate(None, combine_results, combine_results, depth=m.aggregation_depth)
                else:
                    parts = self.sc.runJob(plan.rdd, train, plan.partitions(r))
                    result = functools.reduce(combine_results, parts, None)
            returned = time.perf_counter()
        finally:
            bc.destroy()
        if result is None:
            raise RuntimeError(f"averaging round {r} of epoch {epoch + 1} returned no result: every shard was empty")
        with stats.timed("average", epoch=epoch, round=r):
            inv = 1.0 / result.weight
            ops.scale(result.params, inv)
            network.params = result.params
            if result.state is not None:
                ops.scale(result.state, inv)
                network.updater_state = result.state
            network.iteration = network.iteration + result.max_iterations
        for payload in result.stats:
            stats.add_worker_payload(payload, epoch=epoch, round=r, launched=launched, returned=returned)
        stats.count("examples", result.examples)
        stats.count("minibatches", result.batches)
        stats.record("round", t_round, time.perf_counter(), epoch=epoch, round=r)
        return result
