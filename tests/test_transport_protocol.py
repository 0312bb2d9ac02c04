"""Datagram format, the limits' validation, address selection and topology
helpers of sparkavg.transport (no sockets except address lookup)."""
from __future__ import annotations

import pickle
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sparkavg.transport import FaultInjection, PeerStalledError, ReliableEndpoint, select_address
from sparkavg.transport import address as address_mod
from sparkavg.transport.limits import endpoint_limits
from sparkavg.transport.protocol import (ACK_ENTRY, HEADER_BYTES, OVERHEAD_BYTES, TAG_BYTES,
                                         DatagramCodec, DatagramRejected, Header, MessageType,
                                         RejectReason)

KEY = bytes(range(32))
CODEC = DatagramCodec(KEY, job_id=77, max_datagram_bytes=4096)
U32, U64 = (1 << 32) - 1, (1 << 64) - 1


@st.composite
def datagrams(draw):
    """(header, payload) pairs that a sender may legitimately produce."""
    type_ = draw(st.sampled_from(MessageType))
    src, dst = draw(st.integers(0, U32)), draw(st.integers(0, U32))
    seq = draw(st.integers(0, U64))
    if type_ is MessageType.DATA:
        count = draw(st.integers(1, U32))
        index = draw(st.integers(0, count - 1))
        payload = draw(st.binary(max_size=CODEC.max_payload_bytes))
    else:
        count = index = 0
        entries = draw(st.lists(st.tuples(st.integers(0, U64), st.integers(0, U32)), max_size=40))
        payload = b"".join(ACK_ENTRY.pack(*e) for e in entries)
    return Header(type_, 77, src, dst, seq, index, count), payload


def _encode(header: Header, payload: bytes) -> bytes:
    return CODEC.encode(header.type, header.src, header.dst, header.seq, header.chunk_index,
                        header.chunk_count, payload)


def _reason(data) -> RejectReason:
    with pytest.raises(DatagramRejected) as info:
        CODEC.decode(data)
    return info.value.reason


@given(datagrams())
def test_header_and_payload_round_trip(case):
    header, payload = case
    data = _encode(header, payload)
    assert len(data) == OVERHEAD_BYTES + len(payload)
    decoded, body = CODEC.decode(data)
    assert decoded == header
    assert bytes(body) == payload


@given(datagrams(), st.data())
def test_any_single_bit_flip_is_rejected_as_bad_mac(case, data):
    raw = bytearray(_encode(*case))
    bit = data.draw(st.integers(0, len(raw) * 8 - 1), label="bit")
    raw[bit // 8] ^= 1 << (bit % 8)
    assert _reason(bytes(raw)) is RejectReason.BAD_MAC


@given(st.binary(max_size=5000))
def test_arbitrary_bytes_are_rejected_never_crash(raw):
    assert _reason(raw) in (RejectReason.TRUNCATED, RejectReason.OVERSIZED, RejectReason.BAD_MAC)


def test_length_checks_come_before_the_tag():
    assert _reason(b"\0" * (OVERHEAD_BYTES - 1)) is RejectReason.TRUNCATED
    assert _reason(b"\0" * 4097) is RejectReason.OVERSIZED
    good = _encode(Header(MessageType.DATA, 77, 1, 2, 3, 0, 1), b"payload")
    assert _reason(good[:-1]) is RejectReason.BAD_MAC  # cut short but still long enough


def test_other_key_and_other_job_are_rejected():
    header = Header(MessageType.DATA, 77, 1, 2, 3, 0, 1)
    forged = DatagramCodec(b"k" * 32, 77, 4096).encode(MessageType.DATA, 1, 2, 3, 0, 1, b"x")
    assert _reason(forged) is RejectReason.BAD_MAC
    other_job = DatagramCodec(KEY, 78, 4096).encode(MessageType.DATA, 1, 2, 3, 0, 1, b"x")
    assert _reason(other_job) is RejectReason.WRONG_JOB
    assert CODEC.decode(_encode(header, b"x"))[0] == header


def _signed(header_bytes: bytes, payload: bytes = b"") -> bytes:
    """Authentic datagram with arbitrary header bytes (as a peer with the key could send)."""
    import hashlib
    import hmac
    body = header_bytes + payload
    return body + hmac.new(KEY, body, hashlib.sha256).digest()


@pytest.mark.parametrize("fields", [
    dict(magic=b"XXXX"), dict(version=2), dict(type_=9), dict(flags=1), dict(length=5),
    dict(index=1, count=1), dict(index=0, count=0), dict(type_=2, index=0, count=1),
    dict(type_=2, index=0, count=0, payload=b"abc", length=3),
])
def test_authentic_but_inconsistent_headers_are_malformed(fields):
    f = dict(magic=b"SAVG", version=1, type_=1, flags=0, index=0, count=1, payload=b"", length=0)
    f.update(fields)
    header = struct.pack("!4sBBHQIIQIII", f["magic"], f["version"], f["type_"], f["flags"], 77, 1, 2,
                         0, f["index"], f["count"], f["length"])
    assert len(header) == HEADER_BYTES
    assert _reason(_signed(header, f["payload"])) is RejectReason.MALFORMED


def test_codec_validates_its_inputs():
    with pytest.raises(ValueError, match="at least 16 bytes, got 8"):
        DatagramCodec(b"x" * 8, 0, 4096)
    with pytest.raises(TypeError, match="as bytes"):
        DatagramCodec("a string key of some length", 0, 4096)
    with pytest.raises(ValueError, match=r"Expect max_datagram_bytes in \[512, 65507\], got 70000"):
        DatagramCodec(KEY, 0, 70000)
    with pytest.raises(ValueError, match="job_id"):
        DatagramCodec(KEY, -1, 4096)
    with pytest.raises(ValueError, match="payload of at most"):
        CODEC.encode(MessageType.DATA, 0, 1, 0, 0, 1, b"x" * (4096 - OVERHEAD_BYTES + 1))
    assert TAG_BYTES == 32


@pytest.mark.parametrize("kwargs, message", [
    (dict(max_datagram_bytes=70000), r"Expect max_datagram_bytes in \[512, 65507\], got 70000"),
    (dict(retransmit_timeout=0), r"Expect retransmit_timeout in \(0, 60\] seconds, got 0"),
    (dict(min_retransmit_timeout=2.0), "Expect min_retransmit_timeout in"),
    (dict(stall_timeout=-1), "Expect stall_timeout > 0 seconds, got -1"),
    (dict(send_window_messages=0), "Expect send_window_messages >= 1, got 0"),
    (dict(send_window_messages=300, recv_window_messages=200), "Expect recv_window_messages >= "),
    (dict(max_reassembly_bytes=1000), "Expect max_reassembly_bytes >= "),
    (dict(faults="lossy"), "Expect faults to be a FaultInjection or None, got str"),
])
def test_limit_overrides_say_what_was_expected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        endpoint_limits(kwargs)
    with pytest.raises(ValueError, match=message):
        ReliableEndpoint(0, b"k" * 32, limits=kwargs)  # refused before a socket is bound


def test_limits_are_the_modules_constants_and_no_configuration():
    from sparkavg import transport
    from sparkavg.configurable import Configurable
    from sparkavg.transport import limits

    cfg = endpoint_limits()
    assert (cfg.max_datagram_bytes, cfg.retransmit_timeout, cfg.stall_timeout) == (
        limits.MAX_DATAGRAM_BYTES, limits.RETRANSMIT_TIMEOUT, limits.STALL_TIMEOUT) == (60000, 1.0, 60.0)
    assert cfg.chunk_bytes == 60000 - OVERHEAD_BYTES
    assert cfg.max_chunks * cfg.chunk_bytes >= cfg.max_message_bytes
    with pytest.raises(ValueError, match=r"Expect transport limits among \[.*'stall_timeout'.*\], got \['stall'\]"):
        endpoint_limits({"stall": 1.0})
    # nothing of the transport is configured: no class a configuration could name, none exported
    assert "EndpointConfig" not in transport.__all__ and not hasattr(transport, "EndpointConfig")
    assert not [name for name in transport.__all__
                if isinstance(getattr(transport, name), type) and issubclass(getattr(transport, name), Configurable)]


@pytest.mark.parametrize("kwargs, message", [
    (dict(loss=1.0), r"Expect loss in \[0, 1\), got 1.0"),
    (dict(duplicate=-0.1), r"Expect duplicate in \[0, 1\), got -0.1"),
    (dict(reorder_delay=0), r"Expect reorder_delay in \(0, 10\] seconds, got 0"),
])
def test_fault_injection_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        FaultInjection(**kwargs)


def test_peer_stalled_error_pickles_with_its_fields():
    err = PeerStalledError("rank 3 stalled", [3], [("10.0.0.3", 4000)])
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is PeerStalledError and str(back) == "rank 3 stalled"
    assert back.ranks == (3,) and back.addresses == (("10.0.0.3", 4000),)


def test_select_address_order(monkeypatch):
    monkeypatch.setenv("SPARKAVG_IP", "10.9.9.9")
    assert select_address("127.0.0.0/8", explicit=" 192.168.1.7 ") == "192.168.1.7"
    monkeypatch.setattr(address_mod, "local_ipv4_addresses", lambda: ["10.1.2.3", "127.0.0.1"])
    assert select_address("127.0.0.0/8") == "127.0.0.1"
    assert select_address("10.1.2.0/24") == "10.1.2.3"
    assert select_address("172.16.0.0/12") == "10.9.9.9"  # no interface matches: env var
    assert select_address() == "10.9.9.9"
    monkeypatch.delenv("SPARKAVG_IP")
    monkeypatch.setattr(address_mod.socket, "gethostname", lambda: "localhost")
    assert select_address() == "127.0.0.1"
    with pytest.raises(ValueError, match="CIDR"):
        select_address("not-a-mask")


@pytest.mark.parametrize("ip_tool", [True, False], ids=["ip-json", "proc-fib-trie"])
def test_local_addresses_include_loopback(monkeypatch, ip_tool):
    if not ip_tool:
        monkeypatch.setattr(address_mod.shutil, "which", lambda name: None)
    assert "127.0.0.1" in address_mod.local_ipv4_addresses()
