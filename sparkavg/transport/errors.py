"""Exceptions of the transport layer.

They may be raised inside Spark executors and travel back to the driver, so
every one of them pickles with its extra fields (``__reduce__``).
"""
from __future__ import annotations

__all__ = ["EndpointClosedError", "FrameRejectedError", "PeerLostError", "PeerStalledError", "RendezvousError",
           "TransportError"]


class TransportError(RuntimeError):
    """Base class of every error raised by :mod:`sparkavg.transport`."""


class EndpointClosedError(TransportError):
    """The endpoint was closed (or its I/O thread died) while in use."""


class PeerStalledError(TransportError):
    """One or more peers made no progress within the stall timeout.

    Raised by ``send`` (send window full), ``flush`` (messages unacked) and
    ``PeerGroup.finish`` (origins incomplete) instead of waiting forever.

    Parameters
    ----------
    message : str
        Human-readable description; it names the ranks and addresses.
    ranks : tuple of int
        Ranks that stalled, ascending.
    addresses : tuple of (str, int)
        Their ``(host, port)`` where known, in the order of ``ranks``
        (``None`` for a rank whose address is unknown, e.g. a relayed origin).
    """

    def __init__(self, message: str, ranks=(), addresses=()):
        super().__init__(message)
        self.ranks = tuple(int(r) for r in ranks)
        self.addresses = tuple(None if a is None else (str(a[0]), int(a[1])) for a in addresses)

    def __reduce__(self):
        return (type(self), (self.args[0], self.ranks, self.addresses))


def _address(a):
    return None if a is None else (str(a[0]), int(a[1]))


class PeerLostError(TransportError):
    """A peer of a TCP collective group is gone: it closed or reset its
    connection, or sent (or took) nothing for the stall timeout.

    Parameters
    ----------
    message : str
        Human-readable description; it names the rank and its address.
    rank : int
        The rank that was lost.
    address : (str, int) or None
        Its ``(host, port)``.
    reason : str
        ``"closed"`` (end of stream or reset), ``"stalled"`` (nothing for the
        stall timeout), ``"connect"`` (never connected) or ``"failed"`` (it
        reported its own failure).
    reported_by : int or None
        The rank whose notice named ``rank`` when this rank did not observe
        the loss itself (another survivor saw it first and said so), else None.
    """

    def __init__(self, message: str, rank: int, address=None, reason: str = "closed", reported_by=None):
        super().__init__(message)
        self.rank, self.address, self.reason = int(rank), _address(address), str(reason)
        self.reported_by = None if reported_by is None else int(reported_by)

    def __reduce__(self):
        return (type(self), (self.args[0], self.rank, self.address, self.reason, self.reported_by))


class FrameRejectedError(TransportError):
    """A frame from a peer of a TCP collective group was refused: its tag did
    not verify under the pair's key and the next sequence number (forged,
    altered, replayed or reordered), or it was not the frame the protocol
    expects next.

    Parameters
    ----------
    message : str
        Human-readable description; it names the rank, its address and what
        was expected.
    rank : int
        The rank the frame came from (the other end of the connection).
    address : (str, int) or None
        Its ``(host, port)``.
    reason : str
        ``"tag"``, ``"kind"``, ``"round"``, ``"phase"``, ``"offset"``,
        ``"length"`` or ``"handshake"``: the first check that failed.
    """

    def __init__(self, message: str, rank: int, address=None, reason: str = "tag"):
        super().__init__(message)
        self.rank, self.address, self.reason = int(rank), _address(address), str(reason)

    def __reduce__(self):
        return (type(self), (self.args[0], self.rank, self.address, self.reason))


class RendezvousError(TransportError):
    """A rank's registration at the driver's rendezvous
    (:mod:`~sparkavg.transport.rendezvous`) failed on the rank's side: the
    rendezvous could not be reached, refused the registration, or answered
    with something that does not verify.  (Ranks missing at its timeout are
    a :class:`PeerStalledError` naming them.)

    Parameters
    ----------
    message : str
        Human-readable description; it names the rendezvous's address.
    address : (str, int) or None
        The rendezvous's ``(host, port)``.
    reason : str
        ``"unreachable"`` (no connection within the stall timeout),
        ``"closed"`` (the connection broke or no answer came in time),
        ``"refused"`` (the rendezvous refused the registration, saying why)
        or ``"rejected"`` (its answer did not verify, or was not the one
        expected).
    """

    def __init__(self, message: str, address=None, reason: str = "unreachable"):
        super().__init__(message)
        self.address, self.reason = _address(address), str(reason)

    def __reduce__(self):
        return (type(self), (self.args[0], self.address, self.reason))
