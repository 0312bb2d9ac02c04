"""Gradient sharing: how its epoch distributes work.

One round per epoch: one barrier stage with one task per worker.  The
driver ships the network state, each rank's sharing state
(residual, threshold) and the per-job HMAC key; it gets back rank 0's
replica (the others send a sample of theirs: they agree up to float
rounding), averages the updater state, checks that the replicas agree and
keeps the sharing states for the next epoch (and its checkpoints:
:meth:`SharingRunner.state_dict`, so a resumed fit continues with the
residuals and thresholds it stopped at).
Spark never retries a failed barrier stage, so the driver restarts the
epoch -- unless the error is one retrying cannot fix.
"""
from __future__ import annotations

import logging
import secrets

import numpy as np

from ... import ops
from ..errors import TaskFailure, is_permanent
from ..executor.sharing import make_sharing_task, replica_sample
from ..masters import GradientSharing
from . import runs
from .base import EpochRunner, Merged, network_state

__all__ = ["SharingRunner"]

logger = logging.getLogger(__name__)


@runs(GradientSharing)
class SharingRunner(EpochRunner):
    """Runs epochs of :class:`GradientSharing`."""

    master: GradientSharing
    round_name = "gradient-sharing stage"

    def __init__(self, seam, master):
        super().__init__(seam, master)
        self.key = secrets.token_bytes(32)  # per-job HMAC key, shipped with the job only
        self.job_id = secrets.randbits(32)
        self.rank_states = None  # per rank: SharingState.to_plain()
        self.update_scale = 1.0  # each worker's update is multiplied by it (GradientSharing.scale_for)

    def minibatches_per_round(self, prepared, workers, network, epoch, stats) -> int:
        if self.rank_states is not None and len(self.rank_states) != workers:
            logger.warning("worker count changed (%d -> %d): residuals reset", len(self.rank_states), workers)
            self.rank_states = None
        self.update_scale, why = self.master.scale_for(getattr(network, "updater", None), workers)
        stats.decision("update_scale", self.update_scale, why, epoch=epoch)
        return -(-len(prepared.sizes) // workers)  # the whole epoch in one round

    def result_bytes(self, network) -> int:
        live = network.state  # rank 0: replica, residual, updater state, buffers
        return 4 * (2 * live["params"].size + live["updater"].size + live["buffers"].size)

    def shipped(self, network, epoch):
        return {"state": network_state(network, with_updater=True), "rank_states": self.rank_states, "key": self.key,
                "update_scale": self.update_scale}

    def launch(self, plan, r, config_json, shipped, epoch, stats):
        m = self.master
        task = make_sharing_task(config_json, shipped, m, epoch=epoch, job_id=self.job_id, device=m.device.value,
                                 hooks=self.seam.test_hooks())
        what = f"gradient-sharing epoch {epoch + 1}"
        for attempt in range(1, m.max_stage_attempts + 1):
            try:
                return self.seam.barrier_round(plan, r, task, what)
            except Exception as exc:
                # Nothing of a failed attempt reached the driver: restart from the shipped state.
                if attempt == m.max_stage_attempts or is_permanent(exc):
                    raise
                stats.count("stage_restarts", 1)
                logger.warning("%s, attempt %d of %d failed (%s); restarting the epoch", what, attempt,
                               m.max_stage_attempts, str(exc).splitlines()[0][:300])

    # ------------------------------------------------------------ checkpoint
    def state_dict(self) -> dict:
        """Every rank's sharing state (:meth:`~sparkavg.sharing.SharingState.to_plain`),
        one array per field with a row per rank: ``sharing_residual`` is
        (workers, N) float32."""
        if self.rank_states is None:
            return {}
        states = self.rank_states
        return {f"sharing_{k}": np.asarray([plain[k] for plain in states]) for k in states[0]}

    def load_state_dict(self, state: dict) -> None:
        keys = {k for k in state if k.startswith("sharing_")}
        if set(state) - keys:
            raise ValueError(f"Expect gradient-sharing runner state (sharing_*), got unknown keys "
                             f"{sorted(set(state) - keys)}")
        if not keys:
            self.rank_states = None
            return
        columns = {k[len("sharing_"):]: np.asarray(state[k]) for k in keys}
        ranks = len(columns["residual"])
        self.rank_states = [{k: (v[rank].copy() if v.ndim > 1 else v[rank].item()) for k, v in columns.items()}
                      for rank in range(ranks)]

    def check_state_dict(self, state: dict, network) -> None:
        super().check_state_dict(state, network)
        residual = state.get("sharing_residual")
        if residual is not None and (np.ndim(residual) != 2 or np.shape(residual)[1] != network.num_params):
            raise ValueError(f"Expect sharing_residual of shape (ranks, {network.num_params}) (a residual per "
                             f"rank and parameter), got {np.shape(residual)}")

    def merge(self, network, results, epoch, r, stats) -> Merged:
        results = sorted((x for x in results if not isinstance(x, TaskFailure)), key=lambda x: x.rank)
        reference = results[0].params
        if reference.size != network.num_params:
            raise RuntimeError(f"Expect rank 0 of gradient sharing to return {network.num_params} parameters, "
                               f"got {reference.size}")
        sampled = reference[replica_sample(reference.size)]
        diff = max((float(np.max(np.abs(x.params - sampled))) if x.params.size else 0.0) for x in results[1:]
                   ) if len(results) > 1 else 0.0
        # Replicas agree on the parameters (rank 0's are kept); updater states are averaged.
        if results[0].updater_state.size:
            mean_state = np.zeros_like(results[0].updater_state)
            for x in results:
                ops.accumulate(mean_state, x.updater_state)
            ops.scale(mean_state, 1.0 / len(results))
            network.load_state({"updater": mean_state})
        network.load_state({"params": reference})
        if results[0].buffers.size:  # never shared while training: averaged here, weighted by examples
            total = sum(x.examples for x in results)
            mean_buffers = np.zeros_like(results[0].buffers)
            for x in results:
                ops.accumulate(mean_buffers, x.buffers, x.examples / max(total, 1))
            network.load_state({"buffers": mean_buffers})
        network.iteration = network.iteration + max(x.iterations for x in results)
        self.rank_states = [x.sharing_state for x in results]
        stats.series("replica_max_abs_diff", epoch, diff)
        logger.info("epoch %d: replicas agree to %.3g (max |difference|), thresholds %s", epoch + 1, diff,
                    ", ".join(f"{x.sharing_state['tau']:.3g}" for x in results))
        return Merged(sum(x.loss_sum for x in results), sum(x.examples for x in results),
                      [x.stats for x in results], {"replica_max_abs_diff": diff})
