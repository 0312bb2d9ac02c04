"""The driver's rendezvous of :mod:`sparkavg.transport.rendezvous` over real
sockets on 127.0.0.1, ranks as threads: every rank's entry in rank order,
stage attempts kept apart, registrations and answers that do not verify
refused, missing ranks named within the timeout (issue 37)."""
from __future__ import annotations

import hashlib
import hmac
import json
import pickle
import socket
import struct
import threading
import time

import numpy as np
import pytest

from sparkavg.transport import CollectiveGroup, KeyAgreement, PeerStalledError
from sparkavg.transport.errors import RendezvousError
from sparkavg.transport.limits import RENDEZVOUS_FRAME_BYTES
from sparkavg.transport.rendezvous import Rendezvous, RendezvousServer

from .ranks import on_threads

WAIT = 30.0  # bound on any single wait on another thread


def _on_threads(fn, ranks):
    return on_threads(fn, ranks, WAIT)


def _entry(rank, context):
    return json.dumps({"rank": rank, "context": context, "public": f"{rank:064x}"})


def _raw_registration(secret: bytes, message: dict, alter: bool = False) -> bytes:
    """A registration as the module docstring specifies it, written here byte by byte."""
    body = json.dumps(message).encode()
    tag = hmac.new(secret, b"sparkavg-rdv-v1register" + body, hashlib.sha256).digest()
    if alter:
        body = body.replace(b'"rank": 0', b'"rank": 1')
    return struct.pack("!I", len(body)) + body + tag


def _read_answer(sock, secret: bytes) -> dict:
    sock.settimeout(WAIT)
    data = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    (length,) = struct.unpack("!I", data[:4])
    body, tag = data[4:4 + length], data[4 + length:]
    assert hmac.compare_digest(tag, hmac.new(secret, b"sparkavg-rdv-v1answer" + body, hashlib.sha256).digest())
    return json.loads(body)


def test_every_rank_gets_every_entry_in_rank_order_at_once():
    world = 5
    with RendezvousServer(world, host="127.0.0.1", timeout=10.0) as meet:
        began = time.perf_counter()
        out = _on_threads(lambda r: meet.gatherer(r, world, 7)(_entry(r, 7)), range(world))
        took = time.perf_counter() - began
    expected = [_entry(r, 7) for r in range(world)]
    assert {r: v for r, (v, e) in out.items()} == {r: expected for r in range(world)}
    assert took < 0.5  # no poll: the last registration is answered at once
    assert meet.secret.hex() not in repr(meet)


def test_a_second_attempts_entries_never_mix_with_a_stale_attempts():
    world, stale, fresh = 2, 0x10000, 0x20000
    with RendezvousServer(world, host="127.0.0.1", timeout=10.0) as meet:
        waiting = _Waiting(lambda: meet.gatherer(0, world, stale)(_entry(0, stale)))
        time.sleep(0.2)  # the stale attempt's rank 0 has registered (its rank 1 never came)
        out = _on_threads(lambda r: meet.gatherer(r, world, fresh)(_entry(r, fresh)), range(world))
        assert [out[r][0] for r in range(world)] == [[_entry(0, fresh), _entry(1, fresh)]] * world
        assert waiting.thread.is_alive()  # still waiting for its own attempt's rank 1
        late = meet.gatherer(1, world, stale)(_entry(1, stale))
        waiting.thread.join(WAIT)
    assert late == waiting.value == [_entry(0, stale), _entry(1, stale)]


class _Waiting:
    def __init__(self, fn):
        self.value = self.error = None

        def run():
            try:
                self.value = fn()
            except BaseException as exc:
                self.error = exc

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()


def test_a_registration_that_does_not_verify_is_refused_and_the_real_ranks_still_meet(caplog):
    world, context = 2, 3
    with RendezvousServer(world, host="127.0.0.1", timeout=10.0) as meet:
        forger = Rendezvous(meet.host, meet.port, b"\x00" * 32)  # the address, not the stage's secret
        with pytest.raises(RendezvousError) as info:
            forger.gatherer(0, world, context)(_entry(0, context))
        assert info.value.reason == "rejected" and info.value.address == meet.address  # it cannot read the refusal
        # a real rank's registration altered on the way: refused, and the rank is told why
        with socket.create_connection(meet.address, timeout=WAIT) as sock:
            sock.sendall(_raw_registration(meet.secret, {"version": 1, "context": context, "rank": 0, "world": world,
                                                         "entry": "x", "nonce": "0" * 32}, alter=True))
            answer = _read_answer(sock, meet.secret)
        assert "does not verify" in answer["refused"] and "entries" not in answer
        out = _on_threads(lambda r: meet.gatherer(r, world, context)(_entry(r, context)), range(world))
    assert [out[r][0] for r in range(world)] == [[_entry(0, context), _entry(1, context)]] * world
    refusals = [r.getMessage() for r in caplog.records if "refused a registration" in r.getMessage()]
    assert len(refusals) == 2 and all("does not verify" in m for m in refusals)


def test_a_second_registration_of_a_rank_and_an_oversized_one_are_refused():
    world, context = 2, 4
    with RendezvousServer(world, host="127.0.0.1", timeout=10.0) as meet:
        first = _Waiting(lambda: meet.gatherer(0, world, context)(_entry(0, context)))
        time.sleep(0.2)
        with pytest.raises(RendezvousError, match="registered twice") as info:
            meet.gatherer(0, world, context)(_entry(0, context))
        assert info.value.reason == "refused"
        with pytest.raises(RendezvousError, match="of a stage of 2 ranks"):
            meet.gatherer(1, world + 1, context)(_entry(1, context))
        with socket.create_connection(meet.address, timeout=WAIT) as sock:
            sock.sendall(struct.pack("!I", RENDEZVOUS_FRAME_BYTES + 1))  # refused on its length, before its body
            assert f"at most {RENDEZVOUS_FRAME_BYTES}" in _read_answer(sock, meet.secret)["refused"]
        with pytest.raises(ValueError, match=f"at most {RENDEZVOUS_FRAME_BYTES} bytes"):
            meet.gatherer(1, world, context)("x" * RENDEZVOUS_FRAME_BYTES)
        assert meet.gatherer(1, world, context)(_entry(1, context)) == [_entry(0, context), _entry(1, context)]
        first.thread.join(WAIT)
    assert first.value == [_entry(0, context), _entry(1, context)]


def test_the_missing_ranks_are_named_within_the_timeout():
    world, context, timeout = 4, 5, 1.0
    with RendezvousServer(world, host="127.0.0.1", timeout=timeout) as meet:
        began = time.perf_counter()
        out = _on_threads(lambda r: meet.gatherer(r, world, context, timeout=timeout)(_entry(r, context)),
                          [0, 2])
        took = time.perf_counter() - began
        with pytest.raises(RendezvousError, match="timed out") as late:  # the attempt is over: no table for it
            meet.gatherer(1, world, context)(_entry(1, context))
    for r in (0, 2):
        error = out[r][1]
        assert isinstance(error, PeerStalledError) and error.ranks == (1, 3)
        assert f"127.0.0.1:{meet.address[1]}" in str(error)
    assert timeout <= took < timeout + 2.0
    assert late.value.reason == "refused"


def test_a_failed_attempts_waiting_ranks_are_answered_at_once_and_the_next_attempt_meets():
    """The driver saw the stage attempt fail (``abandon``, run_barrier's hook): its ranks still waiting are
    answered now, naming the missing ones, not at the timeout -- they hold the task slots the next attempt needs."""
    server = RendezvousServer(2, host="127.0.0.1", timeout=WAIT)
    with server as meet:
        waiting = threading.Thread(target=lambda: out.update(
            _on_threads(lambda r: meet.gatherer(r, 2, 0x10000)(_entry(r, 0x10000)), [0])), daemon=True)
        out: dict = {}
        began = time.perf_counter()
        waiting.start()
        time.sleep(0.3)  # rank 0 registered; rank 1 died before it could
        server.abandon(RuntimeError("the Python worker crashed"))
        waiting.join(WAIT)
        took = time.perf_counter() - began
        error = out[0][1]
        assert isinstance(error, PeerStalledError) and error.ranks == (1,) and "failed" in str(error)
        assert took < 5.0, took
        again = _on_threads(lambda r: meet.gatherer(r, 2, 0x20000)(_entry(r, 0x20000)), [0, 1])
    assert [json.loads(t)["rank"] for t in again[1][0]] == [0, 1] and again[0][1] is None


def test_an_unreachable_rendezvous_is_named_by_its_address_within_the_timeout():
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    began = time.perf_counter()
    with pytest.raises(RendezvousError) as info:
        Rendezvous("127.0.0.1", port, b"k" * 32).gatherer(0, 2, 1, timeout=0.5)("{}")
    assert 0.5 <= time.perf_counter() - began < 3.0
    assert info.value.reason == "unreachable" and info.value.address == ("127.0.0.1", port)
    assert f"127.0.0.1:{port}" in str(info.value) and "spark.driver.host" in str(info.value)


def test_an_answer_that_does_not_verify_is_refused_naming_the_rendezvous():
    secret = b"s" * 32
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def impostor():  # answers every registration with a table tagged under another key
        sock, _ = listener.accept()
        with sock:
            sock.recv(65536)
            body = json.dumps({"context": 1, "rank": 0, "nonce": "0" * 32, "entries": ["{}", "{}"]}).encode()
            sock.sendall(struct.pack("!I", len(body)) + body + hmac.new(b"other", body, hashlib.sha256).digest())

    thread = threading.Thread(target=impostor, daemon=True)
    thread.start()
    try:
        with pytest.raises(RendezvousError, match="does not verify") as info:
            Rendezvous("127.0.0.1", port, secret).gatherer(0, 2, 1, timeout=5.0)("{}")
        assert info.value.reason == "rejected" and info.value.address == ("127.0.0.1", port)
    finally:
        thread.join(WAIT)
        listener.close()


def test_ranks_that_meet_at_the_rendezvous_all_reduce():
    world, context = 3, 0x5EED
    groups = [CollectiveGroup(KeyAgreement(r, context), world, host="127.0.0.1", stall_timeout=10.0)
              for r in range(world)]
    try:
        with RendezvousServer(world, host="127.0.0.1", timeout=10.0) as meet:
            for r, g in enumerate(groups):
                g.join_in_background(meet.gatherer(r, world, context, timeout=10.0))
            out = _on_threads(lambda r: groups[r].allreduce_weighted(np.full(5, r + 1.0, np.float32), 1.0),
                              range(world))
        for r in range(world):
            (vector, total), error = out[r]
            assert error is None and total == 3.0
            np.testing.assert_array_equal(vector, np.full(5, 2.0, np.float32))
            assert groups[r].joined_in is not None and groups[r].joined_in < 1.0
    finally:
        for g in groups:
            g.close()


def test_a_rendezvous_error_pickles_with_its_fields():
    back = pickle.loads(pickle.dumps(RendezvousError("m", ("h", 7), "refused")))
    assert (type(back), str(back), back.address, back.reason) == (RendezvousError, "m", ("h", 7), "refused")


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="world >= 1"):
        RendezvousServer(0, host="127.0.0.1")
    with pytest.raises(ValueError, match="timeout > 0"):
        RendezvousServer(2, host="127.0.0.1", timeout=0)
    with pytest.raises(OSError, match="spark.driver.host"):
        RendezvousServer(2, host="198.51.100.254")  # TEST-NET-2: not an address of this machine


@pytest.mark.parametrize("reason, permanent", [("unreachable", True), ("closed", False), ("refused", False)])
def test_a_rendezvous_out_of_reach_ends_the_fit_at_once_and_other_failures_retry(reason, permanent):
    """An executor's RendezvousError reaches the driver as itself, with its reason (the executor's marked
    text, as Spark carries it); one no rank could reach is not retried: another attempt of the stage would
    wait the same stall timeout for the same address."""
    import sparkavg.spark.executor.instage  # noqa: F401  (registers RendezvousError, as the averaging runner does)
    from sparkavg.spark.errors import executor_errors, is_permanent, task_failure_guard

    with pytest.raises(RendezvousError) as marked:
        with task_failure_guard(None, **{"worker rank": 1}):
            raise RendezvousError("rank 1: no connection to the rendezvous at 10.0.0.1:4242", ("10.0.0.1", 4242),
                                  reason)
    with pytest.raises(RendezvousError) as rebuilt:
        with executor_errors("averaging epoch 1"):
            raise RuntimeError(f"org.apache.spark.api.python.PythonException: {marked.value}")
    assert rebuilt.value.reason == reason and rebuilt.value.address == ("10.0.0.1", 4242)
    assert "10.0.0.1:4242" in str(rebuilt.value) and "worker rank 1" in str(rebuilt.value)
    assert is_permanent(rebuilt.value) is permanent
