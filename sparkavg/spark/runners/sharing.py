"""Gradient sharing: how its epoch distributes work.

One round per epoch: one barrier stage with one task per worker.  The
driver ships the network state and each rank's sharing state (residual,
threshold), never a key: the ranks agree their datagram keys among
themselves (:mod:`sparkavg.transport.keys`; the driver warns once when
Spark's own channels are in clear, :func:`~..session.check_security`).
It gets back rank 0's parameters and updater state (the others send a
sample of theirs: replicas agree up to float rounding), checks that the
replicas agree and keeps every rank's residual and threshold for the next
epoch and its checkpoints (:meth:`SharingRunner.state_dict`).  Spark never
retries a failed barrier stage, so the driver restarts the epoch -- unless
the error is one retrying cannot fix.

Between epochs each rank keeps its whole state on its executor
(:func:`~sparkavg.spark.executor.sharing.keep_resident`); while the
driver's copy is the one the last epoch left (a fingerprint of the
network's state), the next epoch ships a token and the iteration, not the
state (decision ``sharing_state``).  A rank whose state is not on its
executor fails the stage at its start; the driver then ships the whole
state and runs the epoch again (counter ``resident_state_misses``).
"""
from __future__ import annotations

import hashlib
import logging
import secrets

import numpy as np

from ... import ops
from ..errors import TaskFailure
from ..executor.sharing import ResidentStateMissing, make_sharing_task, replica_sample
from ..masters import DEFAULT_THRESHOLD, GradientSharing
from ..policies import record
from ..policies.sharing import LocalView, MomentumMasking, ThresholdChoice, UpdateScale
from ..policies.topology import TopologyChoice
from ..session import check_security
from .base import EpochRunner, Merged, network_state, runs

__all__ = ["SharingRunner", "state_fingerprint"]

logger = logging.getLogger(__name__)


def state_fingerprint(state: dict) -> bytes:
    """A digest of a :func:`~.base.network_state` (iteration and vectors):
    whether the driver's state is still the one an epoch left."""
    h = hashlib.blake2b(digest_size=16)
    h.update(str(int(state["iteration"])).encode())
    for name in ("params", "updater", "buffers"):
        value = state.get(name)
        if value is not None:
            h.update(name.encode())
            h.update(np.ascontiguousarray(value, dtype=np.float32).data)
    return h.digest()


@runs(GradientSharing)
class SharingRunner(EpochRunner):
    """Runs epochs of :class:`GradientSharing`."""

    master: GradientSharing
    round_name = "gradient-sharing stage"

    def __init__(self, seam, master):
        super().__init__(seam, master)
        self.job_id = secrets.randbits(32)  # names the ranks' kept states; the datagrams' session id
        self._security_checked = False
        self.rank_states = None  # per rank: SharingState.to_plain()
        # (token, fingerprint of the driver's state) the ranks kept on their executors at the last epoch's end
        self._resident = None
        self._full = self._sent = None  # the running epoch's whole state and what was shipped
        self._storing = None  # the running epoch's token
        sparkavg = master.preset == "sparkavg"
        self.scale_policy, self.masking_policy = UpdateScale(sparkavg), MomentumMasking(sparkavg)
        self.view_policy, self.threshold_policy = LocalView(sparkavg), ThresholdChoice()
        self.topology_policy = TopologyChoice()
        # decided on the driver each epoch, shipped to the ranks: the factor of each worker's update,
        # whether a Nesterov velocity is masked, whether gradients are taken at the worker's own view
        self.decided = {"update_scale": 1.0, "masking": False, "local_view": False, "topology": "plain"}

    def check_model(self, network) -> None:
        """Gradient sharing trains float32 models only: the residual, the
        threshold encoding and its wire format are float32 (a float64 model
        failed on every executor with "Expect out of dtype float64")."""
        dtype = np.dtype(getattr(network.state["params"], "dtype", np.float32))
        if dtype != np.float32:
            raise ValueError(
                f"Expect a float32 model for GradientSharing (its residuals, threshold encoding and wire format are "
                f"float32), got {type(network).__name__} with {dtype} parameters: build the model with "
                f"dtype='float32', or train it with ParameterAveraging")

    def minibatches_per_round(self, prepared, workers, network, epoch, stats) -> int:
        if self.rank_states is not None and len(self.rank_states) != workers:
            logger.warning("worker count changed (%d -> %d): residuals reset", len(self.rank_states), workers)
            self.rank_states = None
        if self.rank_states is None:
            self._resident = None
        updater = getattr(network, "updater", None)
        scale, why = self.scale_policy.decide(updater, workers, epoch)
        stats.decision(self.scale_policy.name, scale, why, epoch=epoch)
        masking, why = self.masking_policy.decide(updater)
        record(stats, self.masking_policy.name, masking, why, epoch)
        view, why = self.view_policy.decide()
        record(stats, self.view_policy.name, view, why, epoch)
        topology, why = self.topology_policy.decide(self.master.topology, workers, self.master.staleness)
        record(stats, self.topology_policy.name, topology.value, why, epoch)
        self.decided = {"update_scale": scale, "masking": masking, "local_view": view, "topology": topology.value}
        if epoch == 0 or self.rank_states is None:  # the rule in use (its τ then carries over between epochs)
            rule, why = self.threshold_policy.decide(self.master.threshold, DEFAULT_THRESHOLD)
            stats.decision(self.threshold_policy.name, rule, why, epoch=epoch)
        return -(-len(prepared.sizes) // workers)  # the whole epoch in one round

    def _decide_state(self, epoch, stats) -> None:
        """Record (decision ``sharing_state``) where this epoch's ranks start from, when it changes."""
        value = "executors" if (self._sent.get("resident") or {}).get("expect") is not None else "shipped"
        why = ("each rank continues from the state it kept on its executor at the last epoch's end: only a token "
               "crosses the driver's link, not the parameters, updater state and residuals (a rank whose state is "
               "missing fails the stage at its start and the epoch runs again with the whole state)"
               if value == "executors" else
               "the driver ships the network's state and every rank's residual: the first epoch of this runner, "
               "or the driver's state changed since the ranks kept theirs (a resume, a recovery, a new fit's "
               "network)")
        if stats.decision("sharing_state", value, why, epoch=epoch, when_changed=True):
            logger.info("epoch %d: sharing state %s: %s", epoch + 1, value, why)

    def result_bytes(self, network) -> int:
        live = network.state  # rank 0: replica, residual, updater state, buffers
        return 4 * (2 * live["params"].size + live["updater"].size + live["buffers"].size)

    def shipped(self, network, epoch):
        state = network_state(network, with_updater=True)
        self._storing = secrets.randbits(63)
        self._full = {"state": state, "rank_states": self.rank_states,
                      "resident": {"expect": None, "store": self._storing}, **self.decided}
        value = self._full
        if self._resident is not None and self._resident[1] == state_fingerprint(state):
            value = {"state": {"iteration": state["iteration"], "epoch": state["epoch"]}, "rank_states": None,
                     "resident": {"expect": self._resident[0], "store": self._storing}, **self.decided}
        self._resident = None  # until this epoch's ranks kept theirs (merge)
        self._sent = value
        return value

    def launch(self, plan, r, config_json, shipped, epoch, stats):
        m = self.master
        if not self._security_checked:  # once per runner; it warns once per process
            check_security(self.seam.conf)
            self._security_checked = True
        hooks = self.seam.test_hooks()
        what = f"gradient-sharing epoch {epoch + 1}"
        self._decide_state(epoch, stats)
        whole = []  # the whole state, shipped after a rank found none kept

        def task_of(value):
            return lambda meeting: make_sharing_task(config_json, value, m, epoch=epoch, job_id=self.job_id,
                                                     device=m.device.value, hooks=hooks, meeting=meeting)

        def ship_whole(exc):
            if not isinstance(exc, ResidentStateMissing):
                return None
            if whole:
                raise exc
            stats.count("resident_state_misses", 1)
            logger.warning("%s: %s; running it again with the whole state", what, str(exc).splitlines()[0])
            whole.append(self.seam.ship({**self._full, "transform": self._sent.get("transform")}))
            return task_of(whole[0])
        try:
            return self.run_barrier(plan, r, task_of(shipped), what, stats, hooks, ship_whole)
        finally:
            for value in whole:
                value.destroy()

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
        self._resident = None  # the driver's state no longer is the one the ranks kept
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
        # Replicas agree on the parameters (rank 0's are kept); the updater states the ranks returned are
        # averaged (only rank 0's while ranks keep their states on their executors: each continues with its own).
        returned = [x.updater_state for x in results if x.updater_state.size == results[0].updater_state.size]
        if results[0].updater_state.size:
            mean_state = np.zeros_like(results[0].updater_state)
            for value in returned:
                ops.accumulate(mean_state, value)
            ops.scale(mean_state, 1.0 / len(returned))
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
        stored = self._sent and (self._sent.get("resident") or {}).get("store")
        if stored is not None and len(results) == len(self.rank_states):  # every rank kept its state
            self._resident = (stored, state_fingerprint(network_state(network, with_updater=True)))
        stats.series("replica_max_abs_diff", epoch, diff)
        logger.info("epoch %d: replicas agree to %.3g (max |difference|), thresholds %s", epoch + 1, diff,
                    ", ".join(f"{x.sharing_state['tau']:.3g}" for x in results))
        return Merged(sum(x.loss_sum for x in results), sum(x.examples for x in results),
                      [x.stats for x in results], {"replica_max_abs_diff": diff})
