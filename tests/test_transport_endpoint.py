"""ReliableEndpoint over real UDP sockets on 127.0.0.1 (endpoints in this
process; see test_transport_processes.py for separate processes): chunking,
exactly-once under injected faults, hostile raw datagrams, bounded buffers
under a flood, back-pressure."""
from __future__ import annotations

import collections
import hashlib
import hmac
import random
import secrets
import socket
import struct
import time
import threading
import tracemalloc

import pytest

from sparkavg.transport import (EndpointClosedError, FaultInjection,
                                ReliableEndpoint)
from sparkavg.transport.protocol import ACK_ENTRY, DatagramCodec, MessageType

WAIT = 10.0
KEY = secrets.token_bytes(32)
JOB = 1234


@pytest.fixture
def pair(request):
    """Two connected endpoints, ranks 0 and 1, with the limits given by indirect param."""
    config = getattr(request, "param", None) or dict(stall_timeout=WAIT)
    a = ReliableEndpoint(0, KEY, JOB, limits=config)
    b = ReliableEndpoint(1, KEY, JOB, limits=config)
    table = {0: a.address, 1: b.address}
    a.set_peers(table)
    b.set_peers(table)
    try:
        yield a, b
    finally:
        a.close()
        b.close()


def _receive_n(endpoint, n):
    out = []
    for _ in range(n):
        item = endpoint.receive(timeout=WAIT)
        assert item is not None, f"only {len(out)} of {n} messages arrived within {WAIT} s"
        out.append(item)
    return out


FAULTY = dict(stall_timeout=WAIT, retransmit_timeout=0.25,
                        faults=FaultInjection(loss=0.3, duplicate=0.3, reorder=0.3, seed=3))


@pytest.mark.parametrize("pair", [FAULTY], indirect=True)
def test_messages_of_every_size_arrive_once_and_intact_both_ways_under_faults(pair):
    a, b = pair
    chunk = a.limits.chunk_bytes
    rng = random.Random(0)
    sizes = [0, 1, chunk - 1, chunk, chunk + 1, 250_000, 1_000_003] + [rng.randrange(4000) for _ in range(40)]
    to_b = [rng.randbytes(n) for n in sizes]
    to_a = [rng.randbytes(n) for n in reversed(sizes)]
    sender = threading.Thread(target=lambda: [a.send(1, m) for m in to_b], daemon=True)
    sender.start()
    for m in to_a:
        b.send(0, m)
    got_b = _receive_n(b, len(to_b))
    got_a = _receive_n(a, len(to_a))
    sender.join(WAIT)
    a.flush(WAIT)
    b.flush(WAIT)
    assert collections.Counter(got_b) == collections.Counter((0, m) for m in to_b)
    assert collections.Counter(got_a) == collections.Counter((1, m) for m in to_a)
    assert a.poll() == [] and b.poll() == [], "nothing may be delivered twice"
    sa, sb = a.stats(), b.stats()
    assert sa["messages_sent"] == sb["messages_delivered"] == len(to_b)
    assert sa["payload_bytes_sent"] == sb["payload_bytes_received"] == sum(sizes)
    assert sa["datagrams_retransmitted"] > 0 and sa["injected_loss"] > 0
    assert sb["rejected_replay"] + sb["duplicates_dropped"] > 0, "duplicates were injected"
    assert sa["datagrams_invalid"] == sb["datagrams_invalid"] == 0
    for usage in (a.buffer_usage(), b.buffer_usage()):
        assert usage["unacked_messages"] == usage["reassembly_bytes"] == usage["inbox_bytes"] == 0


def test_large_message_is_cut_into_chunks(pair):
    a, b = pair
    message = secrets.token_bytes(300_000)
    a.send(1, message)
    assert b.receive(WAIT) == (0, message)
    a.flush(WAIT)
    chunks = -(-len(message) // a.limits.chunk_bytes)
    assert chunks == 6 and b.stats()["datagrams_received"] == chunks
    assert a.stats()["wire_bytes_sent"] <= a.limits.max_datagram_bytes * chunks


class _RawPeer:
    """A plain UDP socket that speaks the protocol by hand (holds the key)."""

    def __init__(self, key=KEY, job=JOB, max_datagram_bytes=60000):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(WAIT)
        self.address = self.sock.getsockname()
        self.codec = DatagramCodec(key, job, max_datagram_bytes)

    def data(self, src, dst, seq, payload=b"", index=0, count=1, codec=None):
        return (codec or self.codec).encode(MessageType.DATA, src, dst, seq, index, count, payload)

    def send(self, datagram, to):
        self.sock.sendto(datagram, to)

    def recv_ack(self):
        """Next ACK addressed to this socket: (cum, entries)."""
        header, payload = self.codec.decode(self.sock.recv(65536))
        assert header.type is MessageType.ACK
        return header.seq, [tuple(e) for e in ACK_ENTRY.iter_unpack(payload)]

    def close(self):
        self.sock.close()


def test_hostile_datagrams_are_dropped_counted_and_never_delivered():
    b = ReliableEndpoint(1, KEY, JOB, limits=dict(stall_timeout=WAIT))
    raw = _RawPeer()
    try:
        b.set_peers({0: raw.address})
        to = b.address
        good = raw.data(0, 1, 0, b"hello")
        raw.send(DatagramCodec(secrets.token_bytes(32), JOB, 60000).encode(
            MessageType.DATA, 0, 1, 0, 0, 1, b"forged"), to)
        raw.send(b"\x00" * 10, to)                                  # truncated
        raw.send(good[:-1], to)                                     # cut short: tag fails
        raw.send(b"\x00" * 60001, to)                               # oversized
        raw.send(raw.data(0, 1, 0, b"x", codec=DatagramCodec(KEY, JOB + 1, 60000)), to)  # wrong job
        raw.send(raw.data(7, 1, 0, b"early"), to)                   # unknown peer: kept until named
        raw.send(raw.data(0, 5, 0, b"x"), to)                       # misrouted
        header = struct.pack("!4sBBHQIIQIII", b"EVIL", 1, 1, 0, JOB, 0, 1, 0, 0, 1, 0)
        raw.send(header + hmac.new(KEY, header, hashlib.sha256).digest(), to)  # malformed
        raw.send(good, to)
        # Datagrams from one socket arrive in order on loopback: all above were handled first.
        assert b.receive(WAIT) == (0, b"hello")
        assert raw.recv_ack() == (1, [(0, 0)]), "the receiver acks to the registered peer address"
        for _ in range(3):
            raw.send(good, to)                                      # replays
        raw.send(raw.data(0, 1, 1, b"again"), to)
        assert b.receive(WAIT) == (0, b"again")
        assert b.poll() == [], "forged or replayed datagrams must never be delivered"
        s = b.stats()
        expected = dict(bad_mac=2, truncated=1, oversized=1, wrong_job=1, unknown_peer=0, misrouted=1,
                        malformed=1, replay=3)
        assert {k: s[f"rejected_{k}"] for k in expected} == expected
        assert s["datagrams_invalid"] == 7 and s["messages_delivered"] == 2
        # Rank 7's authentic datagram was kept: a peer that learnt the table first loses no time.
        b.set_peers({0: raw.address, 7: raw.address})
        assert b.receive(WAIT) == (7, b"early")
        while True:  # acks owed to rank 0 for the replays above may come first
            header, payload = raw.codec.decode(raw.sock.recv(65536))
            if header.type is MessageType.ACK and header.dst == 7:
                break
        assert header.seq == 1, "taken in and acked once its rank is known"
        b.set_peers({0: raw.address})
        received = b.stats()["datagrams_received"]
        raw.send(raw.data(7, 1, 1, b"late"), to)
        deadline = time.monotonic() + WAIT
        while b.stats()["datagrams_received"] == received and time.monotonic() < deadline:
            time.sleep(0.01)
        b.set_peers({0: raw.address, 3: raw.address})  # names another rank: rank 7's is refused now
        assert b.stats()["rejected_unknown_peer"] == 1 and b.poll() == []
    finally:
        b.close()
        raw.close()


SMALL = dict(stall_timeout=WAIT, max_datagram_bytes=1100, max_message_bytes=32_000,
                       send_window_bytes=32_000, max_reassembly_bytes=32_000, send_window_messages=16,
                       recv_window_messages=16, max_inbox_bytes=8_000)


def test_flood_keeps_every_buffer_bounded():
    b = ReliableEndpoint(1, KEY, JOB, limits=SMALL)
    flooder, marker = _RawPeer(max_datagram_bytes=1100), _RawPeer(max_datagram_bytes=1100)
    try:
        b.set_peers({0: flooder.address, 2: flooder.address, 4: marker.address})
        to = b.address
        marker.send(marker.data(4, 1, 0, b"m"), to)
        assert b.receive(WAIT) == (4, b"m")
        marker.recv_ack()

        def sync():
            """Replay rank 4's message; its ack means B has handled everything sent before."""
            flooder.send(marker.data(4, 1, 0, b"m"), to)
            assert marker.recv_ack()[0] == 1

        tracemalloc.start()
        try:
            sync()
            base = tracemalloc.get_traced_memory()[0]
            rng = random.Random(1)
            for _ in range(15):               # 3000 garbage datagrams, ~15 MB
                for _ in range(200):
                    flooder.send(rng.randbytes(rng.randrange(0, 9000)), to)
                sync()
            for seq in range(300):            # 3 of 8 chunks of 300 messages from rank 0
                for index in range(3):
                    flooder.send(flooder.data(0, 1, seq, b"p" * 1000, index=index, count=8), to)
                if seq % 100 == 99:
                    sync()
            for seq in range(300):            # 300 complete messages from rank 2 nobody receives
                flooder.send(flooder.data(2, 1, seq, b"q" * 1000), to)
            sync()
            sync()  # the ack of the first comes while B still holds that batch; this one frees it
            growth = tracemalloc.get_traced_memory()[0] - base
        finally:
            tracemalloc.stop()
        usage, s = b.buffer_usage(), b.stats()
        assert s["rejected_bad_mac"] + s["rejected_truncated"] + s["rejected_oversized"] == 3000
        # Rank 0: 16 messages in the window; 32 chunks (of 11 of them) fill the 32 kB budget.
        assert usage["reassembly_messages"] == 11
        assert usage["reassembly_bytes"] == SMALL["max_reassembly_bytes"]
        # Rank 2: 8 messages fill the 8 kB inbox; the window then ends at 8 + 16.
        assert usage["inbox_bytes"] == SMALL["max_inbox_bytes"]
        assert s["rejected_buffer_full"] == 16 + (24 - 8)
        assert s["rejected_out_of_window"] == 3 * (300 - 16) + (300 - 24)
        assert usage["timers"] == usage["unacked_messages"] == 0
        # Held legitimately: 32 kB reassembly + 8 kB inbox (+ interpreter free lists); 15 MB went in.
        assert growth < 300_000, f"memory grew by {growth} bytes under the flood"
        assert all(src == 2 for src, _ in b.poll()), "only authentic complete messages are delivered"
    finally:
        b.close()
        flooder.close()
        marker.close()


BACKPRESSURE = dict(stall_timeout=WAIT, send_window_messages=2, max_inbox_bytes=350,
                              retransmit_timeout=0.5)


@pytest.mark.parametrize("pair", [BACKPRESSURE], indirect=True)
def test_send_blocks_while_the_window_is_full_and_resumes(pair):
    a, b = pair
    messages = [bytes([i]) * 100 for i in range(10)]
    sent = 0
    cv = threading.Condition()

    def sender():
        nonlocal sent
        for m in messages:
            a.send(1, m)
            with cv:
                sent += 1
                cv.notify_all()

    thread = threading.Thread(target=sender, daemon=True)
    thread.start()
    # B's application reads nothing: its inbox takes 4 messages, refuses the next two
    # (unacked), so with a window of 2 the 7th send must block.
    with cv:
        assert cv.wait_for(lambda: sent == 6, timeout=WAIT), f"only {sent} sends returned"
        assert not cv.wait_for(lambda: sent > 6, timeout=0.5), "send must block on a full window"
    assert a.pending() == {1: 2}
    got = _receive_n(b, len(messages))       # draining the inbox lets the retransmissions in
    thread.join(WAIT)
    assert not thread.is_alive() and sent == len(messages)
    assert sorted(p for _, p in got) == sorted(messages)
    a.flush(WAIT)
    assert b.stats()["rejected_buffer_full"] >= 2


@pytest.mark.parametrize("pair", [BACKPRESSURE], indirect=True)
def test_a_send_that_may_not_block_says_so_when_the_window_is_full(pair):
    a, b = pair
    b.close()  # nothing is acknowledged: two messages fill the window
    assert a.send(1, b"0", block=False) is True and a.send(1, b"1", block=False) is True
    began = time.monotonic()
    assert a.send(1, b"2", block=False) is False and time.monotonic() - began < 0.5 * WAIT
    assert a.pending() == {1: 2}


def test_a_handler_takes_every_message_on_the_io_thread(pair):
    """deliver_to: messages already waiting first, then each as it arrives, on the I/O thread; receive and
    poll then find nothing."""
    a, b = pair
    a.send(1, b"early")
    deadline = time.monotonic() + WAIT
    while not b.buffer_usage()["inbox_messages"] and time.monotonic() < deadline:
        time.sleep(0.01)
    got, threads, cv = [], set(), threading.Condition()

    def handler(src, payload):
        with cv:
            got.append((src, bytes(payload)))
            threads.add(threading.current_thread().name)
            cv.notify_all()

    b.deliver_to(handler)
    for m in (b"one", b"two"):
        a.send(1, m)
    with cv:
        assert cv.wait_for(lambda: len(got) == 3, timeout=WAIT), got
    assert got == [(0, b"early"), (0, b"one"), (0, b"two")] and threads == {"sparkavg-udp-1"}
    assert b.poll() == [] and b.receive(0.01) is None
    with pytest.raises(TypeError, match="handler"):
        b.deliver_to(None)


def test_misuse_gets_errors_that_say_what_was_expected(pair):
    a, b = pair
    with pytest.raises(ValueError, match=r"Expect a peer rank in \[1\], got 9"):
        a.send(9, b"x")
    with pytest.raises(ValueError, match="at most max_message_bytes"):
        a.send(1, bytes(a.limits.max_message_bytes + 1))
    with pytest.raises(ValueError, match=r"as \(host, port\)"):
        a.set_peers({1: "localhost"})
    with pytest.raises(ValueError, match="Expect rank to be an int"):
        ReliableEndpoint(-1, KEY)
    with pytest.raises(ValueError, match="at least 16 bytes"):
        ReliableEndpoint(0, b"short")
    assert a.receive(timeout=0.01) is None
    a.flush(0)  # nothing outstanding: returns at once
    a.close()
    a.close()  # idempotent
    with pytest.raises(EndpointClosedError):
        a.send(1, b"x")
    with pytest.raises(EndpointClosedError):
        a.receive(0)
