"""X25519 Diffie-Hellman (RFC 7748, section 5), in pure Python.

Python's standard library has no X25519 and the transport may not depend
on a third-party package, so the function is written out here: the
Montgomery ladder of RFC 7748 over GF(2**255 - 19) on Python integers.
It is checked against the RFC's test vectors (``tests/test_transport_keys.py``).

Python integer arithmetic does not run in constant time: the ladder's time
may depend on the bits of the scalar.  The transport uses only ephemeral
scalars (a fresh key pair per rank and stage attempt,
:mod:`~sparkavg.transport.keys`), each used for a few exchanges within
seconds, which leaves a timing attacker little to measure; do not use this
module for long-lived keys.
"""
from __future__ import annotations

import secrets

__all__ = ["KEY_BYTES", "x25519", "private_key", "public_key", "shared_secret"]

#: Bytes of a scalar, a u-coordinate and a shared secret.
KEY_BYTES = 32

_P = 2 ** 255 - 19
_A24 = 121665
_BASE_POINT = (9).to_bytes(KEY_BYTES, "little")


def _bytes(value, what: str) -> bytes:
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise TypeError(f"Expect {what} as {KEY_BYTES} bytes, got {type(value).__name__}")
    value = bytes(value)
    if len(value) != KEY_BYTES:
        raise ValueError(f"Expect {what} of {KEY_BYTES} bytes, got {len(value)}")
    return value


def _decode_scalar(k: bytes) -> int:
    """RFC 7748 decodeScalar25519: clear the 3 low bits and the top bit, set bit 254."""
    b = bytearray(k)
    b[0] &= 248
    b[31] &= 127
    b[31] |= 64
    return int.from_bytes(b, "little")


def _decode_u(u: bytes) -> int:
    """RFC 7748 decodeUCoordinate: the top bit masked; non-canonical values reduced mod p."""
    b = bytearray(u)
    b[31] &= 127
    return int.from_bytes(b, "little") % _P


def x25519(k, u) -> bytes:
    """The X25519 function of RFC 7748: scalar ``k`` times the point of u-coordinate ``u``.

    Parameters
    ----------
    k, u : bytes
        32 bytes each, little-endian, decoded as the RFC says (scalar
        clamping; the u-coordinate's top bit ignored).

    Returns
    -------
    bytes
        The resulting u-coordinate, 32 bytes.
    """
    scalar = _decode_scalar(_bytes(k, "an X25519 scalar"))
    x1 = _decode_u(_bytes(u, "an X25519 u-coordinate"))
    p = _P
    x2, z2, x3, z3 = 1, 0, x1, 1
    swap = 0
    for t in range(254, -1, -1):
        bit = (scalar >> t) & 1
        swap ^= bit
        if swap:
            x2, x3 = x3, x2
            z2, z3 = z3, z2
        swap = bit
        a = x2 + z2
        aa = a * a % p
        b = x2 - z2
        bb = b * b % p
        e = aa - bb
        c = x3 + z3
        d = x3 - z3
        da = d * a % p
        cb = c * b % p
        x3 = (da + cb) ** 2 % p
        z3 = x1 * ((da - cb) ** 2 % p) % p
        x2 = aa * bb % p
        z2 = e * (aa + _A24 * e) % p
    if swap:
        x2, x3 = x3, x2
        z2, z3 = z3, z2
    return (x2 * pow(z2, p - 2, p) % p).to_bytes(KEY_BYTES, "little")


def private_key() -> bytes:
    """A fresh random scalar (32 bytes from :func:`secrets.token_bytes`)."""
    return secrets.token_bytes(KEY_BYTES)


def public_key(private) -> bytes:
    """The public key of ``private``: X25519 of it and the base point 9."""
    return x25519(private, _BASE_POINT)


def shared_secret(private, peer_public) -> bytes:
    """X25519 of our ``private`` scalar and a peer's public key.

    Raises
    ------
    ValueError
        If the result is all zeros (RFC 7748 section 6.1): the peer's
        public key is a point of small order, which would make the secret
        known to anyone.
    """
    secret = x25519(private, peer_public)
    if not any(secret):
        raise ValueError("Expect a peer's X25519 public key of large order, got one of small order "
                         "(the shared secret is all zeros)")
    return secret
