"""The ranks of one stage agree their datagram keys; no key is ever shipped.

Construction (one stage attempt, ``context`` = its 8-byte session id, the
endpoints' ``job_id``):

1. Each rank ``i`` makes a fresh X25519 key pair ``(a_i, A_i = X25519(a_i, 9))``
   (:mod:`~sparkavg.transport.x25519`) and publishes ``A_i`` with its address
   (Spark's ``allGather``, or the driver's :mod:`~sparkavg.transport.rendezvous`).
   Only public keys cross any wire.
2. For each peer ``j``, both ``i`` and ``j`` compute the same shared secret
   ``s = X25519(a_i, A_j) = X25519(a_j, A_i)`` (an all-zero ``s``, a peer key of
   small order, is refused) and from it the pair's key::

       K_ij = HKDF-SHA256(IKM = s, salt = "sparkavg-udp-v1" || context,
                          info = "pair" || u32(lo) || u32(hi) || A_lo || A_hi, L = 32)

   where ``lo < hi`` are the two ranks and ``A_lo, A_hi`` their public keys:
   the key is bound to the stage attempt, to both ranks and to both public
   keys (RFC 5869 HKDF, one expansion block).
3. Every datagram from ``i`` to ``j`` (data, acks) carries an HMAC-SHA256 tag
   under ``K_ij`` (:class:`~sparkavg.transport.protocol.DatagramCodec`); ``j``
   picks the key by the datagram's source rank and drops one whose tag does
   not verify.  A datagram ``j`` accepts thus comes from the rank holding
   ``a_i``: a rank of this stage.

A passive observer of the broadcast, the task and the ``allGather`` sees
``A_i`` only; computing ``K_ij`` needs ``a_i`` or ``a_j`` (the X25519
Diffie-Hellman problem).  An active attacker who can replace the public
keys in Spark's own channels (the driver relays ``allGather``; the
rendezvous's secret travels in the task closure) can still sit in the
middle: that is what Spark's own authentication (``spark.authenticate``)
and encryption protect.
"""
from __future__ import annotations

import hashlib
import hmac
import struct
from collections.abc import Mapping

from . import x25519

__all__ = ["KeyAgreement", "hkdf_sha256", "pair_key"]

_SALT = b"sparkavg-udp-v1"
_RANK = struct.Struct("!I")
_CONTEXT = struct.Struct("!Q")


def hkdf_sha256(ikm: bytes, salt: bytes, info: bytes, length: int = 32) -> bytes:
    """HKDF-SHA256 (RFC 5869): extract with ``salt``, expand with ``info`` to ``length`` bytes (<= 8160)."""
    if not 0 < length <= 255 * 32:
        raise ValueError(f"Expect an HKDF output length in [1, 8160], got {length}")
    prk = hmac.new(salt, ikm, hashlib.sha256).digest()
    out, block, counter = b"", b"", 1
    while len(out) < length:
        block = hmac.new(prk, block + info + bytes([counter]), hashlib.sha256).digest()
        out += block
        counter += 1
    return out[:length]


def pair_key(secret: bytes, context: int, rank_a: int, public_a: bytes, rank_b: int, public_b: bytes) -> bytes:
    """``K`` of the module docstring for the pair ``(rank_a, rank_b)``, in either order."""
    if rank_a == rank_b:
        raise ValueError(f"Expect two different ranks for a pair key, got {rank_a} twice")
    (lo, a_lo), (hi, a_hi) = sorted(((rank_a, public_a), (rank_b, public_b)))
    info = b"pair" + _RANK.pack(lo) + _RANK.pack(hi) + a_lo + a_hi
    return hkdf_sha256(secret, _SALT + _CONTEXT.pack(context), info)


class KeyAgreement:
    """One rank's ephemeral X25519 key pair for one stage attempt, and the
    pairwise datagram keys it derives from its peers' public keys (the
    module docstring).

    Parameters
    ----------
    rank : int
        This rank.
    context : int
        The stage attempt's session id in ``[0, 2**64)`` (the endpoints'
        ``job_id``): keys of another attempt never verify in this one.

    Attributes
    ----------
    public : bytes
        This rank's public key (32 bytes), to publish to its peers.
    """

    __slots__ = ("rank", "context", "public", "_private")

    def __init__(self, rank: int, context: int):
        if not 0 <= int(context) < 1 << 64:
            raise ValueError(f"Expect a key agreement context in [0, 2**64), got {context}")
        self.rank, self.context = int(rank), int(context)
        self._private = x25519.private_key()
        self.public = x25519.public_key(self._private)

    def pair_keys(self, publics: Mapping[int, bytes]) -> dict:
        """``{peer rank: K}`` for every rank in ``publics`` but this one.

        Raises
        ------
        ValueError
            Naming the rank whose public key is not 32 bytes or is of small
            order.
        """
        keys = {}
        for rank, public in publics.items():
            if rank == self.rank:
                continue
            try:
                secret = x25519.shared_secret(self._private, public)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"rank {self.rank}: the public key of rank {rank} is unusable: {exc}") from None
            keys[rank] = pair_key(secret, self.context, self.rank, self.public, rank, bytes(public))
        return keys

    def __repr__(self):
        return f"KeyAgreement(rank={self.rank}, context={self.context:#x}, public={self.public.hex()[:16]}...)"
