"""Executor side of gradient sharing: one barrier task per worker per epoch.

The algorithm (residual, threshold, encode, apply) is
:mod:`sparkavg.sharing`; this module only connects it to a Spark barrier
task: it builds the UDP endpoint, learns its peers (the seam's meeting,
while it already trains: :class:`~sparkavg.transport.JoiningGroup`), runs :func:`~sparkavg.sharing.sharing_step`
each iteration with its phases recorded (its ``phase`` hook), flushes, leaves
together with its peers (:meth:`~sparkavg.transport.PeerGroup.leave`) and
returns its replica.  Every replica applies
exactly the same messages, so replicas agree at the end of the epoch (up
to the order of float additions).  With ``staleness=0`` (the default) a
replica applies its peers' messages of iteration k just before its step
k + 1, in (iteration, rank) order: a run is reproducible, whatever the
arrival times.  With ``Topology.TREE`` (decided on the driver) a rank
publishes every iteration's message into sums by recursive doubling
and applies one total per iteration, the same on every rank in the same
order (:class:`~sparkavg.transport.TreeGroup`), at the group's τ.
"""
from __future__ import annotations

import glob
import os
import tempfile
import time
from typing import Iterator, Optional

import numpy as np

from ...backend import get_array_module
from ...configurable import register
from ...sharing import (InOrder, SharingState, adapt_group_tau, apply_received, apply_totals, local_view,
                        merge_payloads, sharing_step, tree_step)
from ...transport import (JoiningGroup, KeyAgreement, PeerStalledError, ReliableEndpoint, Topology,
                          prompt_io_thread, select_address, wait_for_peers)
from ..errors import DivergenceError, register_error, task_failure_guard
from ...stats import CounterName, Phase, PhaseRecorder, SeriesName, task_lane
from ...data.storage import prefetch_depth
from ...data.validation import split_weights
from .averaging import check_finite
from .context import LossSum, Record, cached_network, host_copy, load_state
from .device import task_device
from .hooks import transport_limits
from .minibatches import recorded_minibatches

__all__ = ["SharingResult", "make_sharing_task", "replica_sample", "REPLICA_SAMPLE", "ResidentStateMissing",
           "keep_resident", "take_resident", "RESIDENT_DIR", "RESIDENT_MAX_AGE"]

register_error(PeerStalledError)


class ResidentStateMissing(RuntimeError):
    """A rank was told to continue from the state it kept on its executor
    at the end of the last epoch, and no such state is on this executor
    (it was lost with its executor, or the rank runs on another host): the
    driver ships the whole state and runs the epoch again."""


register_error(ResidentStateMissing)

#: Folder (under the executor's SparkFiles root) of the ranks' kept states.
RESIDENT_DIR = "sparkavg-resident"


def _resident_dir() -> str:
    from pyspark import SparkFiles

    try:
        root = SparkFiles.getRootDirectory()  # the executor's own folder, removed with the application
    except Exception:
        root = tempfile.gettempdir()
    path = os.path.join(root, RESIDENT_DIR)
    os.makedirs(path, exist_ok=True)
    return path


#: Seconds after which a kept state of ANY job is removed by the next state kept on the executor: finished
#: fits never claim theirs, and a fit that comes back later only misses it (its epoch reruns with the
#: driver's whole state, counter ``resident_state_misses``).
RESIDENT_MAX_AGE = 3600.0


def _resident_name(job_id: int, token: int, rank) -> str:
    return f"{job_id & 0xFFFFFFFF:08x}-{token:016x}-{rank}.npz"


def keep_resident(job_id: int, rank: int, token: int, net, state: SharingState) -> None:
    """Keep this rank's end-of-epoch state (parameters, updater state,
    buffers, sharing state) in a ``.npz`` file on its executor, named by the
    job, the epoch's ``token`` and the rank, for the next epoch's task; the
    job's files of older tokens are removed, and those of any job untouched
    for :data:`RESIDENT_MAX_AGE` (written whole, then renamed)."""
    folder = _resident_dir()
    live = net.state
    plain = state.to_plain()
    arrays = {"params": host_copy(live["params"]), "updater": host_copy(live["updater"]),
              "buffers": host_copy(live["buffers"])}
    arrays.update({f"sharing_{k}": np.asarray(v) for k, v in plain.items()})
    name = _resident_name(job_id, token, rank)
    partial = os.path.join(folder, f".{name}.{os.getpid()}.partial.npz")
    np.savez(partial, **arrays)
    os.replace(partial, os.path.join(folder, name))
    prefix = f"{job_id & 0xFFFFFFFF:08x}-"
    stale = time.time() - RESIDENT_MAX_AGE
    for old in glob.glob(os.path.join(folder, "*.npz*")) + glob.glob(os.path.join(folder, ".*.partial.npz")):
        base = os.path.basename(old)
        try:
            if (base.startswith(prefix) and base.endswith(".npz") and not base.startswith(f"{prefix}{token:016x}-")
                    or os.path.getmtime(old) < stale):  # this job's older epochs; any job's long untouched
                os.remove(old)
        except OSError:
            pass


def take_resident(job_id: int, rank: int, token: int) -> Optional[dict]:
    """The state a rank of this job kept at the end of the epoch of ``token``
    on this executor -- this rank's, else another rank's left on this host
    (ranks may trade hosts between epochs: each state is a whole replica's,
    so which rank continues it does not matter) -- claimed so no other rank
    takes it; None when there is none.  Returns ``params``, ``updater``,
    ``buffers`` and ``sharing`` (:meth:`~sparkavg.sharing.SharingState.to_plain` fields)."""
    folder = _resident_dir()
    own = os.path.join(folder, _resident_name(job_id, token, rank))
    others = sorted(glob.glob(os.path.join(folder, _resident_name(job_id, token, "*"))))
    for path in [own] + [p for p in others if p != own]:
        claimed = f"{path}.taken-{rank}-{os.getpid()}"
        try:
            os.rename(path, claimed)  # atomic: one rank gets it
        except OSError:
            continue
        try:
            with np.load(claimed, allow_pickle=False) as f:
                got = {k: f[k] for k in f.files}
        finally:
            os.remove(claimed)
        sharing = {k[len("sharing_"):]: (v if v.ndim else v.item()) for k, v in got.items() if k.startswith("sharing_")}
        return {"params": got["params"], "updater": got["updater"], "buffers": got["buffers"], "sharing": sharing}
    return None

#: Iterations between divergence checks (a full pass over the parameters).
FINITE_CHECK_EVERY = 50

#: Parameters ranks above 0 return for the driver's agreement check (rank 0 returns them all).
REPLICA_SAMPLE = 4096


def replica_sample(num_params: int):
    """Indices of the parameters every rank above 0 returns: :data:`REPLICA_SAMPLE`
    evenly spaced ones (all when fewer).  Replicas agree up to the order of
    float additions, so rank 0's replica is the result and the others only
    show that they agree -- without sending the driver a replica each."""
    if num_params <= REPLICA_SAMPLE:
        return np.arange(num_params, dtype=np.int64)
    return np.linspace(0, num_params - 1, REPLICA_SAMPLE).astype(np.int64)


@register("result")
class SharingResult(Record):
    """What one sharing worker returns at the end of an epoch (plain arrays;
    ``params``: rank 0's whole replica, other ranks' values at
    :func:`replica_sample`; ``devices``: this worker's
    :meth:`~sparkavg.spark.executor.device.DeviceChoice.to_plain`, in a list)."""

    __slots__ = ("rank", "params", "updater_state", "sharing_state", "loss_sum", "examples", "iterations", "stats",
                 "devices", "buffers")


def make_sharing_task(config_json: str, shipped, master, *, epoch: int, job_id: int, device: str = "auto",
                      hooks=None, meeting=None):
    """Executor function for ``rdd.barrier().mapPartitions``.

    ``shipped.value`` is ``{"state": network_state(...) (iteration and named vectors),
    "rank_states": per-rank SharingState.to_plain() or None, "update_scale": the factor of every update, "masking": whether a velocity is
    masked, "local_view": whether gradients are taken at the worker's own view}``
    (decided on the driver: :mod:`sparkavg.spark.policies.sharing`);
    ``master`` is the (frozen, plain) :class:`GradientSharing`.  No key is
    shipped: the ranks agree a key per pair when they meet -- the seam's
    ``meeting``: a :class:`~sparkavg.transport.rendezvous.Rendezvous`, or None
    (``allGather``) -- (:class:`~sparkavg.transport.KeyAgreement`).

    ``device`` is the master's ``device`` as a plain str (``"auto"``,
    ``"gpu"``, ``"cpu"``; :mod:`.device`).  On a GPU parameters, residual and
    updates stay on the device: a message is encoded there and only its
    bytes cross to the host; received bytes are copied to the device and
    applied there.
    """
    rule = master.threshold
    prefetch, staleness = prefetch_depth(master.data), master.staleness

    def run(items) -> Iterator:
        from pyspark import BarrierTaskContext

        if hooks is not None:
            hooks.on_task_start()
        ctx = BarrierTaskContext.get()
        rank = ctx.partitionId()
        # Every error fails the task (marked with its origin), and Spark aborts the barrier stage:
        # returned as a result, it would leave the other ranks waiting in allGather forever.
        with task_failure_guard(None, **{"worker rank": rank, "epoch": epoch + 1}), prompt_io_thread():
            result = _epoch(items, ctx, rank, task_device(device, ctx))
        yield result

    def _epoch(items, ctx, rank: int, choice) -> SharingResult:
        infos = ctx.getTaskInfos()
        world = len(infos)
        rec = PhaseRecorder(task_lane(rank))
        with rec.phase(Phase.FETCH):
            value = shipped.value
            resident = value.get("resident") or {}
            if resident.get("expect") is not None:  # continue from the state kept here last epoch
                kept = take_resident(job_id, rank, resident["expect"])
                if kept is None:
                    raise ResidentStateMissing(
                        f"worker rank {rank}: no state of the last epoch kept on this executor (lost with its "
                        f"executor, or the rank moved host): the driver ships the whole state")
                saved = kept["sharing"]
                start = {"iteration": value["state"]["iteration"], "epoch": value["state"].get("epoch", 0),
                         "params": kept["params"], "updater": kept["updater"], "buffers": kept["buffers"]}
            else:
                saved = value["rank_states"][rank] if value["rank_states"] else None
                start = value["state"]
        with rec.phase(Phase.MODEL_INIT):
            net = cached_network(config_json, choice)
            load_state(net, start, True)  # host -> device for a GPU network
            n = net.num_params
            flat = net.state["params"]  # the model's live parameter vector (the contract's state)
            xp = get_array_module(flat)
            state = SharingState(rule, n, xp=xp) if saved is None else SharingState.from_plain(rule, saved, xp=xp)
            state.reset_statistics()
            update = xp.zeros(n, xp.float32)
            # the update scale, decided on the driver: 1/workers or 1
            scale = float(value.get("update_scale", 1.0))
            scale = xp.float32(scale) if scale != 1.0 else 1.0
            # momentum masking: the velocity of the entries each message sent is cleared
            masked = bool(value.get("masking", False))
            velocity = net.state["updater"][net.updater.slot("velocity", n)] if masked else None  # a view: stays live
            # the local view: the replica's parameters live in `shared`, every message is applied there;
            # the network's own vector holds the view (shared + residual) its gradients are taken at
            view = bool(value.get("local_view", False))
            shared = flat.copy() if view else flat
            # PLAIN, or TREE: one total per iteration, summed on the way (decided on the driver)
            topology = Topology(value.get("topology", Topology.PLAIN.value))
            tree = topology is Topology.TREE
        spark_host = infos[rank].address.rsplit(":", 1)[0] if infos[rank].address else None
        host = select_address(network_mask=master.network_mask, fallback=spark_host)
        rec.decision("udp_address", host, f"worker rank {rank}: network_mask {master.network_mask!r}, else "
                     f"$SPARKAVG_IP, else the executor's Spark host {spark_host!r}")
        port = master.port + rank if master.port else 0
        # A fresh id per stage and attempt: sequence numbers restart with every endpoint, so
        # datagrams of an earlier epoch or a failed attempt must never be taken for new ones.
        stage_job = (job_id << 32) | ((ctx.stageId() & 0xFFFFFF) << 8) | (ctx.attemptNumber() & 0xFF)
        # A fresh X25519 key pair per stage attempt; the pair keys come with the peers' addresses (no key shipped).
        agreement = KeyAgreement(rank, stage_job)
        endpoint = ReliableEndpoint(rank, None, job_id=stage_job, host=host, port=port,
                                    limits=transport_limits(hooks, master.seed, rank, epoch))
        stall_timeout = endpoint.limits.stall_timeout
        try:
            # The peers' addresses come in a thread: train meanwhile.
            gather = ctx.allGather if meeting is None else meeting.gatherer(rank, world, agreement.context,
                                                                             stall_timeout)
            group = JoiningGroup(gather, endpoint, agreement, world, topology, stall_timeout,
                                 merge=(lambda parts: merge_payloads(parts, n)) if tree else None)

            def apply(payloads) -> None:
                if tree:
                    apply_totals(state, payloads, shared, world)
                else:
                    apply_received(state, payloads, shared)
            losses, examples, iterations = LossSum(), 0, 0
            start_iteration = net.iteration
            # staleness=0: peers' messages wait in `ordered` for their turn -- those of iteration k are applied
            # before step k + 1, in (iteration, rank) order -- so the run does not depend on arrival times.
            ordered = InOrder() if staleness == 0 else None
            if ordered is not None:
                def receive(timeout: float) -> None:
                    ordered.add(group.poll(timeout, numbered=True))

                def inbox() -> list:
                    receive(0)  # keeps acks and TREE relays flowing; applied at the next step's wait
                    return []
            else:
                def receive(timeout: float) -> None:
                    apply([p for _, p in group.poll(timeout)])

                def inbox() -> list:
                    return [p for _, p in group.poll(0)]
            for x, y in recorded_minibatches(items, prefetch, rec, value.get("transform"), rank):
                if staleness is not None and iterations > staleness:
                    with rec.phase(Phase.WAIT):
                        wait_for_peers(group, receive, iterations - staleness, stall_timeout)
                    if ordered is not None:
                        with rec.phase(Phase.APPLY):
                            apply(ordered.take(iterations))
                with rec.phase(Phase.FIT):
                    if shared is not flat:
                        local_view(state, shared, flat)
                    x, w = split_weights(x)
                    losses.add(net.compute_update(x, y, update, weights=w, sync=False), len(y))
                    if scale != 1.0:
                        update *= scale
                try:
                    if tree:
                        if staleness is not None and iterations > staleness:
                            adapt_group_tau(state)  # from the total the wait above applied: one τ for all ranks
                        tau = state.tau
                        tree_step(state, update, group.publish, phase=rec.phase, velocity=velocity)
                        with rec.phase(Phase.APPLY):
                            inbox_now = inbox()
                            if inbox_now:
                                apply(inbox_now)
                    else:
                        tau = state.tau
                        sharing_step(state, update, shared, group.publish, inbox, phase=rec.phase,
                                     always_publish=staleness is not None, velocity=velocity)
                except ValueError as exc:
                    _raise_if_diverged(state, exc, rank, net.iteration)
                    raise
                examples += len(y)  # x may be a dict of inputs by name
                iterations += 1
                # the series every sharing epoch records
                step = start_iteration + iterations - 1  # global iteration: series continue across epochs
                rec.series(SeriesName.THRESHOLD, step, tau)
                rec.series(SeriesName.SPARSITY, step, state.last_sparsity)
                if iterations % 10 == 1:
                    rec.series(SeriesName.RESIDUAL_NORM, step, float(xp.linalg.norm(state.residual)))
                if iterations % FINITE_CHECK_EVERY == 0:
                    check_finite(net, losses.value(), f"worker rank {rank}")
            if hooks is not None:
                hooks.on_epoch_end(rank)
            with rec.phase(Phase.WAIT):
                remaining = group.finish(stall_timeout, numbered=True)
            with rec.phase(Phase.APPLY):
                if ordered is not None:
                    ordered.add(remaining)
                    apply(ordered.take(None))
                else:
                    apply([p for _, _, p in remaining])
                if shared is not flat:
                    flat[...] = shared  # the replica's parameters: what the driver and the next epoch see
            with rec.phase(Phase.WAIT):  # not ctx.barrier(): Spark's polls once a second
                group.leave(stall_timeout)
            t = endpoint.stats()
            if tree:
                rec.count(CounterName.MERGE_SECONDS, group.group.merge_seconds)
        finally:
            endpoint.close()
        loss_sum = losses.value()
        check_finite(net, loss_sum, f"worker rank {rank}")
        if resident.get("store") is not None:  # the next epoch starts from here without the driver's copy
            keep_resident(job_id, rank, resident["store"], net, state)
        _count(rec, state, t, examples, iterations, n, world, tree)
        params = flat if rank == 0 else flat[xp.asarray(replica_sample(n))]
        live = net.state
        # Ranks keeping their state here continue with their own updater state: the driver takes rank 0's, as it
        # takes rank 0's parameters, and the others send none (each would cross the driver's link every epoch).
        keeps = resident.get("store") is not None
        updater = host_copy(live["updater"]) if rank == 0 or not keeps else np.zeros(0, np.float32)
        return SharingResult(rank, host_copy(params), updater, state.to_plain(),
                             loss_sum, examples, net.iteration - start_iteration, rec.to_payload(),
                             [choice.to_plain(rank)], host_copy(live["buffers"]))

    return run


def _raise_if_diverged(state: SharingState, exc: ValueError, rank: int, iteration: int) -> None:
    """Name a residual overflowed by huge updates (the encoder's ValueError) as divergence."""
    xp = get_array_module(state.residual)
    if not bool(xp.isfinite(state.residual).all()):
        raise DivergenceError(f"training diverged: non-finite residual (update too large) on worker rank {rank} "
                              f"at iteration {iteration}; lower the learning rate") from exc


def _count(rec, state: SharingState, t: dict, examples: int, iterations: int, n: int, world: int,
           tree: bool) -> None:
    rec.count(CounterName.EXAMPLES, examples)
    rec.count(CounterName.ITERATIONS, iterations)
    rec.count(CounterName.MESSAGES_SENT, state.messages_sent)
    rec.count(CounterName.MESSAGES_RECEIVED, state.messages_received)
    # PLAIN applies its own messages and every peer's; a tree's rank one total per iteration (its own inside)
    rec.count(CounterName.MESSAGES_APPLIED, state.messages_received + (0 if tree else state.messages_sent))
    rec.count(CounterName.ENTRIES_SENT, state.entries_sent)
    rec.count(CounterName.BYTES_SENT, t["wire_bytes_sent"])  # every datagram: retransmissions and acks included
    rec.count(CounterName.BYTES_RECEIVED, t["wire_bytes_received"])
    rec.count(CounterName.PAYLOAD_BYTES_SENT, t["payload_bytes_sent"])
    rec.count(CounterName.DENSE_BYTES_EQUIVALENT, 4 * n * (world - 1) * iterations)
    rec.count(CounterName.DATAGRAMS_SENT, t["datagrams_sent"])
    rec.count(CounterName.DATAGRAMS_RETRANSMITTED, t["datagrams_retransmitted"])
    rec.count(CounterName.DATAGRAMS_REJECTED, t["datagrams_rejected"])  # every datagram dropped, any reason
    rec.count(CounterName.DATAGRAMS_INVALID, t["datagrams_invalid"])
    rec.count(CounterName.DATAGRAMS_FORGED, t["rejected_bad_mac"])
    rec.count(CounterName.DATAGRAMS_REPLAYED, t["rejected_replay"])  # mostly late retransmissions: harmless

