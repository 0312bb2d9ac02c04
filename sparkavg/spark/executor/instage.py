"""Executor side of parameter averaging with an epoch's rounds inside one barrier stage: the ranks meet once
(the seam's ``meeting``: the driver's rendezvous, :mod:`sparkavg.transport.rendezvous`, or ``allGather`` on
Connect) and connect a TCP mesh (:class:`~sparkavg.transport.CollectiveGroup`: X25519 keys, no key shipped)
in the background while they train round 1 of :func:`sparkavg.averaging.rounds.run_rounds`.  Rank 0
returns the epoch's final state; every rank its rounds' statistics."""
from __future__ import annotations

from typing import Iterator

import numpy as np

from ...averaging.rounds import run_rounds
from ...configurable import register
from ...stats import Phase, PhaseRecorder, task_lane
from ...transport import CollectiveGroup, KeyAgreement, PeerLostError, RendezvousError, select_address
from ...transport.limits import STALL_TIMEOUT
from ..errors import register_error, task_failure_guard
from ..policies.block_momentum import BlockMomentum
from .averaging import check_finite
from .context import LossSum, Record, cached_network, host_copy, load_state
from .device import task_device
from .minibatches import minibatch_sources, prefetched

__all__ = ["StageResult", "make_stage_task"]

register_error(PeerLostError)
register_error(RendezvousError)


@register("result")
class StageResult(Record):
    """One rank's epoch: rank 0's final ``params``, ``state`` (the
    updater's), ``buffers`` and block velocity ``delta`` (empty arrays on
    other ranks, None without), the ``iterations`` the epoch advanced, and
    :class:`~sparkavg.averaging.rounds.EpochLog`'s ``rounds``, ``stats``
    (its payloads) and ``speeds``; ``devices`` as a round result's;
    ``meeting`` the seconds the rank's meeting (the rendezvous or
    ``allGather``) and connections took (they run while round 1 trains)."""

    __slots__ = ("rank", "params", "state", "buffers", "delta", "iterations", "rounds", "stats", "devices",
                 "speeds", "meeting")


def make_stage_task(config_json: str, shipped, counts, *, save_updater: bool, uniform: bool, moment_spread: bool,
                    momentum, prefetch: int, device: str = "auto", hooks=None, meeting=None):
    """Executor function for ``barrier().mapPartitions``: rank ``partitionId``
    runs its minibatches of every round (``counts[r][w]`` each).

    ``shipped.value`` is the round state (``network_state``; ``params`` the
    block momentum look-ahead when on, then also ``model``, ``W``, and
    ``delta``); ``momentum`` ``(mu, block_lr, nesterov)`` or None; ``meeting``
    the seam's: a :class:`~sparkavg.transport.rendezvous.Rendezvous`, or None (``allGather``).
    """

    def run(items) -> Iterator:
        from pyspark import BarrierTaskContext

        if hooks is not None:
            hooks.on_task_start()
        ctx = BarrierTaskContext.get()
        rank = ctx.partitionId()
        # Every error fails the task: returned as a result, it would leave the peers waiting at their meeting.
        with task_failure_guard(None, **{"worker rank": rank}):
            result = _stage(items, ctx, rank)
        yield result

    def _stage(items, ctx, rank: int) -> StageResult:
        lane = task_lane(rank)
        rec = PhaseRecorder(lane)
        with rec.phase(Phase.FETCH):
            value = shipped.value
        with rec.phase(Phase.MODEL_INIT):
            choice = task_device(device, ctx)
            net = cached_network(config_json, choice)
            load_state(net, value, save_updater)
            first = net.iteration
        bm = None
        if momentum is not None:
            bm = BlockMomentum()
            bm.on, (bm.momentum, bm.block_lr, bm.nesterov) = True, momentum
            bm.delta = None if value.get("delta") is None else np.array(value["delta"], dtype=np.float32)
        infos = ctx.getTaskInfos()
        spark_host = infos[rank].address.rsplit(":", 1)[0] if infos[rank].address else None
        stall = float((hooks.numbers if hooks is not None else {}).get("stall_timeout", STALL_TIMEOUT))
        # A fresh key pair per stage attempt: a rank of a failed attempt cannot join this one.
        agreement = KeyAgreement(rank, (ctx.stageId() << 16) | (ctx.attemptNumber() & 0xFFFF))
        group = CollectiveGroup(agreement, len(infos), host=select_address(fallback=spark_host), stall_timeout=stall)
        # The rendezvous keys entries by the attempt's context: a retried stage's never mix with a stale attempt's.
        gather = ctx.allGather if meeting is None else meeting.gatherer(rank, len(infos), agreement.context, stall)
        made = [rec]  # round 0's recorder holds the task's start
        try:
            # The ranks meet once, while round 1 trains (allGather would answer on a one-second poll).
            group.join_in_background(gather)
            log = run_rounds(net, prefetched(minibatch_sources(items), prefetch), counts, rank, group,
                             recorder=lambda: made.pop() if made else PhaseRecorder(lane), copy=host_copy,
                             losses=LossSum, check=check_finite, save_updater=save_updater, uniform=uniform,
                             moment_spread=moment_spread, momentum=bm, model=value.get("model"),
                             transform=value.get("transform"), hooks=hooks,
                             delay=hooks.minibatch_delay(rank) if hooks is not None else 0.0)
        finally:
            group.close()
        live, empty = net.state, np.zeros(0, np.float32)
        state = host_copy(live["updater"]) if save_updater and rank == 0 else (None if not save_updater else empty)
        delta = None if bm is None or bm.delta is None else (bm.delta if rank == 0 else empty)
        return StageResult(rank, host_copy(live["params"]) if rank == 0 else empty, state,
                           host_copy(live["buffers"]) if rank == 0 else empty, delta, net.iteration - first,
                           log.rounds, log.payloads, [choice.to_plain(rank)], log.speeds, group.joined_in)

    return run
