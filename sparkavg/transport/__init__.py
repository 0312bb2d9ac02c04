"""UDP transport of the gradient-sharing master, and a TCP all-reduce.

Authenticated (HMAC-SHA256 per datagram, under a key each pair of ranks
agrees by X25519 -- :mod:`.keys`; nothing secret is shipped), chunked, acked
and retransmitted messages between ranks (:class:`ReliableEndpoint`), and an
all-to-all exchange over it (``PLAIN``: :class:`PeerGroup`), or sums of
every iteration's messages by recursive doubling (``TREE``: :class:`TreeGroup`).
No pickle anywhere: payloads are opaque bytes.  Its sizes and timers are
the library's (:mod:`.limits`): a cluster operator sets only the port and
the network mask, on :class:`~sparkavg.spark.GradientSharing`.  :class:`CollectiveGroup` is
a weighted all-reduce by recursive halving and doubling over authenticated
TCP connections to ``log2 W`` partners that averages parameters with the
driver's arithmetic (:mod:`.collective`; the one summation order:
:mod:`.summation`); its ranks meet at a
:class:`~.rendezvous.RendezvousServer` on the driver (classic sessions)
or through ``allGather``.

Examples
--------
One epoch of the gradient-sharing master inside a Spark barrier task::

    ctx = BarrierTaskContext.get()
    rank, world = ctx.partitionId(), len(ctx.getTaskInfos())
    job_id = (ctx.stageId() << 16) | ctx.stageAttemptNumber()  # fresh per stage attempt
    agreement = KeyAgreement(rank, job_id)                      # a fresh X25519 key pair
    endpoint = ReliableEndpoint(rank, None, job_id=job_id,      # a key per peer, below
                                host=select_address(network_mask))
    try:
        mine = json.dumps([*endpoint.address, agreement.public.hex()])
        gathered = [json.loads(a) for a in ctx.allGather(mine)]   # addresses and public keys only
        publics = {r: bytes.fromhex(g[2]) for r, g in enumerate(gathered)}
        endpoint.set_peers({r: (g[0], g[1]) for r, g in enumerate(gathered)},
                           keys=agreement.pair_keys(publics))
        group = PeerGroup(rank, world, endpoint, Topology.PLAIN)
        for batch in batches:
            payload = encode(compute_update(batch))   # apply own update locally
            group.publish(payload)
            for origin, message in group.poll():      # others' updates, each once
                decode(message, into=params)
        for origin, message in group.finish(stall_timeout=STALL_TIMEOUT):  # .limits
            decode(message, into=params)
        group.leave(stall_timeout=STALL_TIMEOUT)   # keep acking until every neighbour has finished
    finally:
        endpoint.close()
"""
from .address import ENV_VAR, local_ipv4_addresses, select_address
from .collective import CollectiveGroup
from .endpoint import ReliableEndpoint, prompt_io_thread
from .errors import (EndpointClosedError, FrameRejectedError, PeerLostError, PeerStalledError, RendezvousError,
                     TransportError)
from .faults import FaultInjection
from .group import PeerGroup, Topology, named_peers, wait_for_peers
from .joining import JoiningGroup, gather_peers
from .keys import KeyAgreement
from .protocol import RejectReason
from .tree import TreeGroup, contributors, exchange_partners

__all__ = [
    "CollectiveGroup",
    "ENV_VAR",
    "EndpointClosedError",
    "FaultInjection",
    "FrameRejectedError",
    "JoiningGroup",
    "KeyAgreement",
    "PeerGroup",
    "PeerLostError",
    "PeerStalledError",
    "RejectReason",
    "RendezvousError",
    "ReliableEndpoint",
    "Topology",
    "TransportError",
    "TreeGroup",
    "contributors",
    "exchange_partners",
    "gather_peers",
    "local_ipv4_addresses",
    "named_peers",
    "prompt_io_thread",
    "select_address",
    "wait_for_peers",
]
