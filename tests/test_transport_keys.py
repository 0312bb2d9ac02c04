"""The ranks agree their datagram keys (issue 39): X25519 against RFC 7748,
HKDF against RFC 5869, pair keys, endpoints with a key per peer over real
UDP sockets, and a real gradient-sharing fit on local[2] that ships no key
and rejects datagrams authenticated with another."""
from __future__ import annotations

import logging
import secrets
import socket
import threading
import time

import numpy as np
import pytest

from sparkavg.transport import KeyAgreement, ReliableEndpoint
from sparkavg.transport.limits import MAX_DATAGRAM_BYTES
from sparkavg.transport.keys import hkdf_sha256, pair_key
from sparkavg.transport.protocol import DatagramCodec, MessageType
from sparkavg.transport.x25519 import public_key, shared_secret, x25519

from .nets import blobs, small_net

WAIT = 10.0
h = bytes.fromhex


@pytest.mark.parametrize("scalar, u, out", [
    ("a546e36bf0527c9d3b16154b82465edd62144c0ac1fc5a18506a2244ba449ac4",
     "e6db6867583030db3594c1a424b15f7c726624ec26b3353b10a903a6d0ab1c4c",
     "c3da55379de9c6908e94ea4df28d084f32eccf03491c71f754b4075577a28552"),
    ("4b66e9d4d1b4673c5ad22691957d6af5c11b6421e0ea01d42ca4169e7918ba0d",
     "e5210f12786811d3f4b7959d0538ae2c31dbe7106fc03c3efc4cd549c715a493",  # top bit set: masked
     "95cbde9476e8907d7aade45cb4b873f88b595a68799fa152e6f8f7647aac7957"),
])
def test_x25519_matches_the_rfc_7748_vectors(scalar, u, out):
    assert x25519(h(scalar), h(u)) == h(out)


def test_x25519_iterated_as_rfc_7748_section_5_2():
    k = u = (9).to_bytes(32, "little")
    for i in range(1000):
        k, u = x25519(k, u), k
        if i == 0:
            assert k == h("422c8e7a6227d7bca1350b3e2bb7279f7897b87bb6854b783c60e80311ae3079")
    assert k == h("684cf59ba83309552800ef566f2f4d3c1c3887c49360e3875f2eb94d99532c51")


def test_x25519_diffie_hellman_of_rfc_7748_section_6_1():
    alice, bob = (h("77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a"),
                  h("5dab087e624a8a4b79e17f8b83800ee66f3bb1292618b6fd1c2f8b27ff88e0eb"))
    assert public_key(alice) == h("8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a")
    assert public_key(bob) == h("de9edb7d7b7dc1b4d35b61c2ece435373f8343c85b78674dadfc7e146f882b4f")
    shared = h("4a5d9d5ba4ce2de1728e3bf480350f25e07e21c947d19e3376f09b3c1e161742")
    assert shared_secret(alice, public_key(bob)) == shared_secret(bob, public_key(alice)) == shared


def test_a_public_key_of_small_order_or_wrong_size_is_refused():
    mine = secrets.token_bytes(32)
    for low_order in (bytes(32), (1).to_bytes(32, "little")):  # u = 0 and u = 1: every secret is zero
        with pytest.raises(ValueError, match="small order"):
            shared_secret(mine, low_order)
    with pytest.raises(ValueError, match="of 32 bytes, got 31"):
        x25519(mine, bytes(31))
    agreement = KeyAgreement(0, 7)
    with pytest.raises(ValueError, match="the public key of rank 3 is unusable.*small order"):
        agreement.pair_keys({3: bytes(32)})


def test_hkdf_sha256_matches_rfc_5869_test_case_1():
    okm = hkdf_sha256(bytes([0x0B] * 22), bytes(range(13)), bytes(range(0xF0, 0xFA)), 42)
    assert okm == h("3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf34007208d5b887185865")


def test_each_pair_of_ranks_derives_one_key_no_other_pair_or_stage_shares():
    ranks = [KeyAgreement(r, 0xABC) for r in range(3)]
    publics = {a.rank: a.public for a in ranks}
    keys = [a.pair_keys(publics) for a in ranks]
    assert sorted(keys[0]) == [1, 2] and sorted(keys[2]) == [0, 1]
    for i in range(3):
        for j in range(3):
            if i != j:
                assert keys[i][j] == keys[j][i] and len(keys[i][j]) == 32
    assert len({keys[0][1], keys[0][2], keys[1][2]}) == 3
    # Another stage attempt (context) with the same key pairs gives other keys.
    secret = shared_secret(ranks[0]._private, ranks[1].public)
    assert pair_key(secret, 0xABD, 0, ranks[0].public, 1, ranks[1].public) != keys[0][1]
    assert pair_key(secret, 0xABC, 1, ranks[1].public, 0, ranks[0].public) == keys[0][1]  # either order


def _agreed_endpoints(world: int, config: dict, context: int = 99):
    agreements = [KeyAgreement(r, context) for r in range(world)]
    endpoints = [ReliableEndpoint(r, None, context, limits=config) for r in range(world)]
    table = {e.rank: e.address for e in endpoints}
    publics = {a.rank: a.public for a in agreements}
    return endpoints, table, [a.pair_keys(publics) for a in agreements]


def test_endpoints_with_agreed_pair_keys_deliver_and_reject_every_other_key():
    config = dict(stall_timeout=WAIT)
    (a, b, c), table, keys = _agreed_endpoints(3, config)
    try:
        for e, k in zip((a, b, c), keys):
            e.set_peers(table, keys=k)
        a.send(1, b"from 0")
        c.send(1, b"from 2")
        got = {b.receive(WAIT), b.receive(WAIT)}
        assert got == {(0, b"from 0"), (2, b"from 2")}
        # Rank 2 holds its own pair keys only: it cannot pass for rank 0 at rank 1.
        forger = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            as_rank_2 = DatagramCodec(None, 99, MAX_DATAGRAM_BYTES)
            as_rank_2.set_keys({1: keys[2][1]})
            forged = bytearray(as_rank_2.encode(MessageType.DATA, 2, 1, 5, 0, 1, b"forged"))
            forged[16:20] = (0).to_bytes(4, "big")  # src rank 0, tag under K_21
            forger.sendto(bytes(forged), b.address)
            other = DatagramCodec(secrets.token_bytes(32), 99, MAX_DATAGRAM_BYTES)  # another key
            forger.sendto(other.encode(MessageType.DATA, 0, 1, 6, 0, 1, b"forged"), b.address)
            a.send(1, b"marker")  # datagrams of one host arrive in order on loopback
            assert b.receive(WAIT) == (0, b"marker")
        finally:
            forger.close()
        assert b.poll() == []
        s = b.stats()
        assert s["rejected_bad_mac"] == 2 and s["messages_delivered"] == 3
        for e in (a, c):
            e.flush(WAIT)
    finally:
        for e in (a, b, c):
            e.close()


def test_a_peer_whose_keys_come_later_takes_in_the_early_datagrams_without_a_retransmission():
    config = dict(stall_timeout=WAIT, retransmit_timeout=30.0, adaptive_retransmit=False)
    (a, b), table, keys = _agreed_endpoints(2, config)
    try:
        a.set_peers(table, keys=keys[0])
        a.send(1, b"early")
        deadline = time.monotonic() + WAIT
        while b.stats()["datagrams_received"] == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert b.stats()["datagrams_received"] == 1 and b.poll() == []  # held: no key for rank 0 yet
        b.set_peers(table, keys=keys[1])
        assert b.receive(WAIT) == (0, b"early")
        a.flush(WAIT)  # acked: long before the 30 s retransmission
        assert a.stats()["datagrams_retransmitted"] == 0
    finally:
        a.close()
        b.close()


def test_keys_and_peers_must_match_the_endpoints_kind():
    config = dict(stall_timeout=WAIT)
    with ReliableEndpoint(0, None, 1, limits=config) as per_peer, \
            ReliableEndpoint(1, secrets.token_bytes(32), 1, limits=config) as shared:
        with pytest.raises(ValueError, match=r"Expect keys=\{rank: key\} for the peers of an endpoint made without"):
            per_peer.set_peers({1: shared.address})
        with pytest.raises(ValueError, match=r"got none for rank\(s\) \[2\]"):
            per_peer.set_peers({1: shared.address, 2: shared.address}, keys={1: secrets.token_bytes(32)})
        with pytest.raises(ValueError, match="peer rank 1: Expect a job key of at least 16 bytes, got 4"):
            per_peer.set_peers({1: shared.address}, keys={1: b"abcd"})
        with pytest.raises(ValueError, match="Expect no per-peer keys for an endpoint made with one key"):
            shared.set_peers({0: per_peer.address}, keys={0: secrets.token_bytes(32)})


def _free_udp_ports(n: int) -> int:
    """A base port P with P .. P + n - 1 free for UDP on 127.0.0.1 right now."""
    for _ in range(50):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.bind(("127.0.0.1", 0))
            base = probe.getsockname()[1]
        if base + n >= 65535:
            continue
        taken = []
        try:
            for p in range(base, base + n):
                s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                taken.append(s)
                s.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
        finally:
            for s in taken:
                s.close()
    raise RuntimeError(f"no {n} consecutive free UDP ports found")


def _walk(value, path="shipped"):
    """Every (path, leaf) of a shipped value."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _walk(v, f"{path}[{k!r}]")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from _walk(v, f"{path}[{i}]")
    else:
        yield path, value


@pytest.mark.spark
def test_a_sharing_fit_ships_no_key_its_ranks_agree_and_datagrams_under_another_key_are_rejected(
        sc, monkeypatch, caplog):
    from sparkavg.spark import GradientSharing, SparkTrainer
    from sparkavg.spark import session

    monkeypatch.setattr(session, "_security_warned", set())  # this process may have warned already
    base = _free_udp_ports(2)
    x, y = blobs(200, seed=61)
    rdd = sc.parallelize(list(zip(x, y.tolist())), 2)
    trainer = SparkTrainer(sc, small_net(seed=62), GradientSharing(workers=2, batch_size_per_worker=10, port=base))
    stop = threading.Event()

    def spray():  # an attacker on the path: datagrams from "the other rank" under a key of its own
        codec = DatagramCodec(secrets.token_bytes(32), 0, 60000)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            seq = 0
            while not stop.is_set():
                for dst in (0, 1):
                    try:
                        s.sendto(codec.encode(MessageType.DATA, 1 - dst, dst, seq, 0, 1, b"forged"),
                                 ("127.0.0.1", base + dst))
                    except OSError:
                        pass
                seq += 1
                stop.wait(0.005)

    sprayer = threading.Thread(target=spray, daemon=True)
    with caplog.at_level(logging.WARNING, logger="sparkavg.spark.session"):
        sprayer.start()
        try:
            trainer.fit(rdd, epochs=2)
        finally:
            stop.set()
            sprayer.join()
        SparkTrainer(sc, small_net(seed=63), GradientSharing(workers=2, batch_size_per_worker=10)).fit(rdd)
    runner = trainer._runner
    assert not hasattr(runner, "key")
    for shipped in (runner._full, runner._sent):
        leaves = list(_walk(shipped))
        assert "key" not in shipped and not any("key" in p.lower() for p, _ in leaves)
        assert not [p for p, v in leaves if isinstance(v, (bytes, bytearray, memoryview))]
    c = trainer.stats.counters
    # Each rank verified every message of the other: the two derived the same pair key.
    assert c["messages_received"] == c["iterations"] == 40
    assert max(e["replica_max_abs_diff"] for e in trainer.history) < 1e-5
    assert c["datagrams_forged"] > 0, "the sprayed datagrams reached the ranks and were rejected"
    assert trainer.evaluate(rdd).accuracy() > 0.9
    warned = [r for r in caplog.records if "authentication or encryption is off" in r.getMessage()]
    assert len(warned) == 1, "once, not per fit or epoch"
    text = warned[0].getMessage()
    assert "spark.authenticate=false" in text and "agreed by the ranks" in text
    assert "task closure" in text and "broadcast of the parameters" in text and "in clear" in text
    assert np.isfinite(trainer.network.params).all()
