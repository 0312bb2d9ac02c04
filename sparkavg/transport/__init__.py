"""UDP transport of the gradient-sharing master.

Authenticated (HMAC-SHA256 per datagram, per-job key), chunked, acked and
retransmitted messages between ranks (:class:`ReliableEndpoint`), and an
all-to-all exchange over it with PLAIN or MESH topology (:class:`PeerGroup`).
No pickle anywhere: payloads are opaque bytes.

Examples
--------
One epoch of the gradient-sharing master inside a Spark barrier task
(``key`` comes from ``sc.broadcast(secrets.token_bytes(32))``)::

    ctx = BarrierTaskContext.get()
    rank, world = ctx.partitionId(), len(ctx.getTaskInfos())
    endpoint = ReliableEndpoint(
        rank, key_bc.value,
        job_id=(ctx.stageId() << 16) | ctx.stageAttemptNumber(),  # fresh per stage attempt
        host=select_address(network_mask), config=endpoint_config)
    try:
        addresses = [tuple(json.loads(a)) for a in ctx.allGather(json.dumps(endpoint.address))]
        endpoint.set_peers(dict(enumerate(addresses)))
        group = PeerGroup(rank, world, endpoint, Topology.PLAIN)
        for batch in batches:
            payload = encode(compute_update(batch))   # apply own update locally
            group.publish(payload)
            for origin, message in group.poll():      # others' updates, each once
                decode(message, into=params)
        for origin, message in group.finish(stall_timeout=120.0):
            decode(message, into=params)
        ctx.barrier()   # keep acking until every rank has finished
    finally:
        endpoint.close()
"""
from .address import ENV_VAR, local_ipv4_addresses, select_address
from .config import EndpointConfig
from .endpoint import ReliableEndpoint
from .errors import EndpointClosedError, PeerStalledError, TransportError
from .faults import FaultInjection
from .group import PeerGroup, Topology, tree_neighbours
from .protocol import RejectReason

__all__ = [
    "ENV_VAR",
    "EndpointClosedError",
    "EndpointConfig",
    "FaultInjection",
    "PeerGroup",
    "PeerStalledError",
    "RejectReason",
    "ReliableEndpoint",
    "Topology",
    "TransportError",
    "local_ipv4_addresses",
    "select_address",
    "tree_neighbours",
]
