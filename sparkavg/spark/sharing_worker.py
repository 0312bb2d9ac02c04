"""Executor side of gradient sharing: one barrier task per worker per epoch.

Each iteration the worker computes its updater step, adds it to its
residual, threshold-encodes it, publishes the message to its peers over
authenticated reliable UDP and applies its own and every received
message.  Every replica applies exactly the same messages, so replicas
agree at the end of the epoch (up to the order of float additions).
"""
from __future__ import annotations

import json
from typing import Iterator

import numpy as np

from .. import ops
from ..transport import EndpointConfig, FaultInjection, PeerGroup, ReliableEndpoint, Topology, select_address
from .stats import PhaseRecorder
from .threshold import ThresholdState
from .worker import Record, cached_network, fault_hook, lane_name, load_state, recorded_minibatches, stall_hook

__all__ = ["SharingResult", "make_sharing_trainer"]


class SharingResult(Record):
    """What one sharing worker returns at the end of an epoch (plain arrays)."""

    __slots__ = ("rank", "params", "updater_state", "residual", "threshold", "loss_sum", "examples",
                 "iterations", "stats")


def _apply(payload: bytes, params) -> int:
    message = np.frombuffer(payload, dtype="<i4")
    ops.decode(message, params)
    return ops.encoded_count(message)


def make_sharing_trainer(config_json: str, state_bc, carry_bc, key_bc, settings: dict):
    """Executor function for ``rdd.barrier().mapPartitions``.

    ``settings`` holds plain values only: threshold algorithm and clipping
    (frozen dataclasses), topology, port, network mask, transport limits,
    fault injection rate, seed, epoch, collect_stats, prefetch.
    """

    def run(items) -> Iterator[SharingResult]:
        from pyspark import BarrierTaskContext

        fault_hook()
        ctx = BarrierTaskContext.get()
        rank = ctx.partitionId()
        world = len(ctx.getTaskInfos())
        rec = PhaseRecorder(lane_name())
        with rec.phase("fetch"):
            state = state_bc.value
            carry = carry_bc.value[rank] if carry_bc.value else None
        with rec.phase("model_init"):
            net = cached_network(config_json)
            load_state(net, state, True)
            n = net.num_params
            residual = np.zeros(n, np.float32) if carry is None else np.array(carry[0], np.float32)
            threshold = ThresholdState.from_plain(settings["threshold"], settings["clipping"],
                                                  carry[1] if carry else None)
            update = np.zeros(n, np.float32)
            encoding = ops.EncodingState()
        loss_rate = settings["simulate_loss"]
        faults = None
        if loss_rate > 0:
            faults = FaultInjection(loss=loss_rate, duplicate=loss_rate / 2, reorder=loss_rate / 2,
                                    seed=settings["seed"] * 1000 + rank + 17 * settings["epoch"])
        config = EndpointConfig(max_datagram_bytes=settings["max_datagram_bytes"],
                                retransmit_timeout=settings["retransmit_timeout"],
                                stall_timeout=settings["stall_timeout"], faults=faults)
        host = select_address(network_mask=settings["network_mask"])
        port = settings["port"] + rank if settings["port"] else 0
        # A fresh id per stage and attempt: sequence numbers restart with every endpoint, so
        # datagrams of an earlier epoch or a failed attempt must never be taken for new ones.
        job_id = (settings["job_id"] << 32) | ((ctx.stageId() & 0xFFFFFF) << 8) | (ctx.attemptNumber() & 0xFF)
        endpoint = ReliableEndpoint(rank, key_bc.value, job_id=job_id, host=host, port=port, config=config)
        try:
            with rec.phase("wait"):
                gathered = ctx.allGather(json.dumps({"rank": rank, "host": endpoint.address[0],
                                                     "port": endpoint.address[1]}))
            peers = {}
            for text in gathered:
                entry = json.loads(text)
                peers[int(entry["rank"])] = (entry["host"], int(entry["port"]))
            endpoint.set_peers({r: a for r, a in peers.items() if r != rank})
            group = PeerGroup(rank, world, endpoint, Topology(settings["topology"]))
            loss_sum, examples, iterations = 0.0, 0, 0
            received = 0
            start_iteration = net.iteration
            for x, y in recorded_minibatches(items, settings["prefetch"], rec):
                with rec.phase("fit"):
                    loss = net.compute_update(x, y, update)
                with rec.phase("encode"):
                    ops.accumulate(residual, update)
                    message = ops.encode(residual, threshold.tau, encoding)
                entries = 0
                if message is not None:
                    entries = ops.encoded_count(message)
                    with rec.phase("send"):
                        group.publish(np.ascontiguousarray(message, dtype="<i4").tobytes())
                    with rec.phase("apply"):
                        ops.decode(message, net.params)
                with rec.phase("apply"):
                    for _origin, payload in group.poll(0):
                        _apply(payload, net.params)
                        received += 1
                if settings["collect_stats"]:
                    step = start_iteration + iterations  # global iteration: series continue across epochs
                    rec.series("threshold", step, threshold.tau)
                    rec.series("sparsity", step, entries / n)
                    if iterations % 10 == 0:
                        rec.series("residual_norm", step, float(np.linalg.norm(residual)))
                threshold.after_step(entries, n, residual)
                loss_sum += float(loss) * len(x)
                examples += len(x)
                iterations += 1
            stall_hook(rank)
            with rec.phase("wait"):
                remaining = group.finish(settings["stall_timeout"])
            with rec.phase("apply"):
                for _origin, payload in remaining:
                    _apply(payload, net.params)
                    received += 1
            with rec.phase("wait"):
                ctx.barrier()
            t = endpoint.stats()
        finally:
            endpoint.close()
        rec.count("examples", examples)
        rec.count("iterations", iterations)
        rec.count("messages_sent", encoding.messages)  # this epoch's; the encoder state is per epoch
        rec.count("messages_received", received)
        rec.count("entries_sent", encoding.values_sent)
        rec.count("bytes_sent", t["wire_bytes_sent"])  # every datagram: retransmissions and acks included
        rec.count("bytes_received", t["wire_bytes_received"])
        rec.count("payload_bytes_sent", t["payload_bytes_sent"])
        rec.count("dense_bytes_equivalent", 4 * n * (world - 1) * iterations)
        rec.count("datagrams_sent", t["datagrams_sent"])
        rec.count("datagrams_retransmitted", t["datagrams_retransmitted"])
        rec.count("datagrams_rejected", t["datagrams_invalid"])  # failed authentication or validation
        rec.count("datagrams_forged", t["rejected_bad_mac"])
        rec.count("datagrams_replayed", t["rejected_replay"])  # mostly late retransmissions: harmless
        yield SharingResult(rank, np.array(net.params, np.float32), np.array(net.updater_state, np.float32),
                            residual, threshold.to_plain(), loss_sum, examples, net.iteration - start_iteration,
                            rec.to_payload())

    return run
