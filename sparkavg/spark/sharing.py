"""Gradient sharing: the driver side of one epoch.

One barrier stage per epoch with one task per worker.  The driver ships
the parameters, updater state and each worker's carried residual and
threshold state; it gets back every replica, keeps rank 0's parameters,
averages the updater state, checks that the replicas agree and keeps the
residuals and thresholds for the next epoch.
"""
from __future__ import annotations

import logging
import secrets
import time

import numpy as np

from .. import ops
from ..transport import PeerStalledError
from .config import DataApproach, GradientSharing
from .dataprep import EpochData, PreparedData
from .driver import broadcast_state, register_worker_error, worker_errors
from .sharing_worker import make_sharing_trainer

__all__ = ["SharingRunner"]

logger = logging.getLogger(__name__)

register_worker_error(PeerStalledError)


class SharingRunner:
    """Runs epochs of :class:`GradientSharing` for a trainer."""

    def __init__(self, sc, master: GradientSharing):
        self.sc = sc
        self.master = master
        self.key = secrets.token_bytes(32)  # per-job HMAC key, shipped by broadcast only
        self.job_id = secrets.randbits(32)
        self.carry = None  # per rank: (residual, threshold plain state)

    def run_epoch(self, network, prepared: PreparedData, epoch: int, workers: int, stats) -> dict:
        m = self.master
        num_batches = len(prepared.sizes)
        per_worker = -(-num_batches // workers)
        with stats.timed("plan", epoch=epoch):
            plan = EpochData.plan(prepared, workers, per_worker, m.seed + epoch)
        if self.carry is not None and len(self.carry) != workers:
            logger.warning("worker count changed (%d -> %d): residuals reset", len(self.carry), workers)
            self.carry = None
        settings = {
            "threshold": m.threshold, "clipping": m.residual_post_processor, "topology": m.topology.value,
            "port": m.port, "network_mask": m.network_mask, "max_datagram_bytes": m.max_datagram_bytes,
            "retransmit_timeout": m.retransmit_timeout, "stall_timeout": m.stall_timeout,
            "simulate_loss": m.simulate_loss, "seed": m.seed, "epoch": epoch, "collect_stats": m.collect_stats,
            "prefetch": 1, "job_id": self.job_id,
        }
        t_epoch = time.perf_counter()
        with stats.timed("broadcast", epoch=epoch):
            state_bc = broadcast_state(self.sc, network, with_updater=True)
            carry_bc = self.sc.broadcast(self.carry)
            key_bc = self.sc.broadcast(self.key)
        try:
            fn = make_sharing_trainer(network.to_json(), state_bc, carry_bc, key_bc, settings)
            if prepared.approach is DataApproach.EXPORT:
                shards = plan.shard_paths(0)
                rdd = self.sc.parallelize(shards, len(shards))
            else:
                rdd = plan.rdd
            for attempt in range(1, m.max_stage_attempts + 1):
                launched = time.perf_counter()
                try:
                    with worker_errors(f"gradient-sharing epoch {epoch + 1}"):
                        results = rdd.barrier().mapPartitions(fn).collect()
                    break
                except Exception as exc:
                    # Spark does not retry failed barrier result stages: restart the epoch from
                    # the broadcast state (nothing of the failed attempt reached the driver).
                    if attempt == m.max_stage_attempts:
                        raise
                    stats.count("stage_restarts", 1)
                    logger.warning("gradient-sharing epoch %d, attempt %d of %d failed (%s); restarting the "
                                   "epoch", epoch + 1, attempt, m.max_stage_attempts, str(exc).splitlines()[0][:300])
            returned = time.perf_counter()
        finally:
            for bc in (state_bc, carry_bc, key_bc):
                bc.destroy()
            plan.drop()
        results.sort(key=lambda r: r.rank)
        with stats.timed("average", epoch=epoch):
            reference = results[0].params
            diff = max((float(np.max(np.abs(r.params - reference))) if r.params.size else 0.0) for r in results)
            network.params = reference
            if results[0].updater_state.size:
                mean_state = np.zeros_like(results[0].updater_state)
                for r in results:
                    ops.accumulate(mean_state, r.updater_state)
                ops.scale(mean_state, 1.0 / len(results))
                network.updater_state = mean_state
            network.iteration = network.iteration + max(r.iterations for r in results)
            self.carry = [(r.residual, r.threshold) for r in results]
        for r in results:
            stats.add_worker_payload(r.stats, epoch=epoch, launched=launched, returned=returned)
        stats.series("replica_max_abs_diff", epoch, diff)
        loss_sum = sum(r.loss_sum for r in results)
        examples = sum(r.examples for r in results)
        stats.record("round", t_epoch, time.perf_counter(), epoch=epoch, round=0)
        logger.info("epoch %d: replicas agree to %.3g (max |difference|), thresholds %s", epoch + 1, diff,
                    ", ".join(f"{r.threshold['tau']:.3g}" for r in results))
        return {"loss": loss_sum / max(examples, 1), "examples": examples, "rounds": 1,
                "replica_max_abs_diff": diff}
