"""Exceptions of the transport layer.

They may be raised inside Spark executors and travel back to the driver, so
every one of them pickles with its extra fields (``__reduce__``).
"""
from __future__ import annotations

__all__ = ["EndpointClosedError", "PeerStalledError", "TransportError"]


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
