"""Parameter averaging: how its epoch distributes work.

Rounds of ``averaging_frequency`` minibatches per worker; per round the
shipped ``(iteration, params, updater state)`` is fitted by every worker on
its own shard, the weighted sums come back through ``treeAggregate`` and
the driver divides.
"""
from __future__ import annotations

from ..executor.averaging import combine_results, make_round_task
from ..masters import ParameterAveraging, Weighting
from .base import EpochRunner, Merged, network_state, set_state

__all__ = ["AveragingRunner"]


class AveragingRunner(EpochRunner):
    """Runs epochs of :class:`ParameterAveraging`."""

    master: ParameterAveraging

    def minibatches_per_round(self, prepared, workers, network, epoch, stats) -> int:
        return self.master.averaging_frequency

    def result_bytes(self, network) -> int:
        state = network.updater_state.size if self.master.save_updater else 0
        return 4 * (network.num_params + state)

    def shipped(self, network, epoch):
        return network_state(network, self.master.save_updater)

    def launch(self, plan, r, config_json, shipped, epoch, stats):
        m = self.master
        task = make_round_task(config_json, shipped, round_no=r + 1, save_updater=m.save_updater,
                               uniform=m.weighting is Weighting.UNIFORM, collect_stats=m.collect_stats,
                               prefetch=m.data.prefetch, hooks=self.seam.test_hooks())
        return self.seam.aggregate_round(plan, r, task, combine_results, m.aggregation_depth,
                                         f"averaging round {r + 1} of epoch {epoch + 1}")

    def merge(self, network, result, epoch, r, stats) -> Merged:
        set_state(network, result.params, result.state, result.weight, result.max_iterations)
        stats.count("examples", result.examples)
        stats.count("minibatches", result.batches)
        return Merged(result.loss_sum, result.examples, result.stats)
