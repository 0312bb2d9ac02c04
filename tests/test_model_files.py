"""Hostile and damaged model files: every one is refused with a ModelFileError
that names the file and what was expected, before loading allocates more than
a few MiB (zip bombs, forged configurations and forged .npy headers included).

The files are built here byte by byte (a small zip writer, .npy headers and
the digest re-implemented from the format's description in
sparkavg/nn/serialization.py), so a forger's file is exactly what a test
says it is.  Attack files carry the version-1 config layout (which the
loader still reads) where the attack is not about the config itself.
"""
from __future__ import annotations

import hashlib
import io
import json
import logging
import re
import resource
import struct
import tracemalloc
import zlib

import numpy as np
import pytest

from sparkavg.nn import Adam, Dense, ModelFileError, Network, Output

TAG = b"sparkavg.nn model v1"
MEMORY_LIMIT = 32 << 20  # traced allocations while a refused file loads
RSS_LIMIT = 200 << 20  # growth of the process's peak resident memory
STORED, DEFLATED = 0, 8
BIG = 2**28  # float32 values in 1 GiB


# ------------------------------------------------------------- file pieces
def small_net() -> Network:
    """4 -> 3 tanh -> 2 softmax with Adam: 23 parameters, 46 state values."""
    return Network((4,), [Dense(3, activation="tanh"), Output(2)], updater=Adam(1e-2), seed=1)


def npy(array) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.asarray(array), allow_pickle=True)
    return buf.getvalue()


def npy_header(dtype, shape) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)),
                                               "fortran_order": False, "shape": tuple(shape)})
    return buf.getvalue()


def digest(config: bytes, arrays) -> np.ndarray:
    h = hashlib.sha256(TAG)
    h.update(len(config).to_bytes(8, "little"))
    h.update(config)
    for a in arrays:
        meta = f"{a.dtype.str}{a.shape}".encode()
        h.update(len(meta).to_bytes(8, "little"))
        h.update(meta)
        h.update(np.ascontiguousarray(a).tobytes())
    return np.frombuffer(h.digest(), np.uint8)


def v1_config(net: Network) -> dict:
    """The layout written before configs carried a "type"."""
    config = {k: v for k, v in json.loads(net.to_json()).items() if k not in ("type", "format", "version")}
    return {"format": "sparkavg.nn.Network", "version": 1, **config}


def members(net: Network, config: dict | None = None, params=None, state=None, counters=(3, 1)) -> dict:
    """name -> array of a model file with a VALID digest over what it holds."""
    text = json.dumps(v1_config(net) if config is None else config).encode()
    params = net.params.copy() if params is None else params
    state = net.updater_state.copy() if state is None else state
    counters = np.array(counters, np.int64)
    return {"config": np.frombuffer(text, np.uint8), "params": params, "updater_state": state,
            "counters": counters, "sha256": digest(text, (params, state, counters))}


class Entry:
    """One zip entry exactly as written: ``data`` as stored, sizes and flags as declared."""

    def __init__(self, name, data: bytes, *, method=STORED, crc=None, size=None, flags=0, version=20):
        self.name = name.encode()
        self.data, self.method, self.flags, self.version = data, method, flags, version
        self.crc = zlib.crc32(data) if crc is None else crc
        self.size = len(data) if size is None else size


def stored(arrays: dict) -> list:
    return [Entry(f"{k}.npy", npy(v)) for k, v in arrays.items()]


def write_zip(path, entries) -> None:
    """A plain zip (no zip64) of ``entries``, trusting every declared field."""
    out, central = bytearray(), bytearray()
    for e in entries:
        offset = len(out)
        out += struct.pack("<4s5H3L2H", b"PK\x03\x04", e.version, e.flags, e.method, 0, 0x21,
                           e.crc, len(e.data), e.size, len(e.name), 0) + e.name + e.data
        central += struct.pack("<4s6H3L5H2L", b"PK\x01\x02", 20, e.version, e.flags, e.method, 0, 0x21,
                               e.crc, len(e.data), e.size, len(e.name), 0, 0, 0, 0, 0, offset) + e.name
    out += central + struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, len(entries), len(entries),
                                 len(central), len(out), 0)
    path.write_bytes(bytes(out))


def assert_refused(path, *patterns, max_params=None):
    """Network.load(path) raises ModelFileError naming the file and matching
    every pattern, with little memory spent on the way."""
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    tracemalloc.start()
    try:
        with pytest.raises(ModelFileError) as info:
            Network.load(path) if max_params is None else Network.load(path, max_params=max_params)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    rss_growth = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - rss_before
    assert peak < MEMORY_LIMIT, f"refusing the file allocated {peak / 2**20:.0f} MiB first"
    assert rss_growth < RSS_LIMIT, f"refusing the file grew peak RSS by {rss_growth / 2**20:.0f} MiB"
    message = str(info.value)
    assert str(path) in message, message
    for pattern in patterns:
        assert re.search(pattern, message), f"{pattern!r} not in {message!r}"
    return message


@pytest.fixture()
def net():
    n = small_net()
    x = np.random.default_rng(0).random((6, 4), dtype=np.float32)
    n.fit_batch(x, np.arange(6) % 2)
    return n


# ------------------------------------------------------------------ formats
def test_new_files_carry_the_typed_config_and_round_trip(net, tmp_path):
    path = tmp_path / "m.npz"
    net.save(path)
    with np.load(path, allow_pickle=False) as z:
        assert json.loads(z["config"].tobytes())["type"] == "Network"
    back = Network.load(path)
    assert back.to_json() == net.to_json() and np.array_equal(back.params, net.params)
    assert np.array_equal(back.updater_state, net.updater_state) and (back.iteration, back.epoch) == (1, 0)


def test_version_1_files_still_load(net, tmp_path):
    path = tmp_path / "v1.npz"
    write_zip(path, stored(members(net)))
    back = Network.load(path)
    assert back.to_json() == net.to_json()
    assert np.array_equal(back.params, net.params) and np.array_equal(back.updater_state, net.updater_state)
    assert (back.iteration, back.epoch) == (3, 1)


def test_non_finite_parameters_load_with_a_warning(net, tmp_path, caplog):
    params = net.params.copy()
    params[[2, 5]] = np.nan
    path = tmp_path / "nan.npz"
    write_zip(path, stored(members(net, params=params)))
    with caplog.at_level(logging.WARNING, logger="sparkavg.nn.serialization"):
        back = Network.load(path)
    assert np.isnan(back.params).sum() == 2
    assert f"{path}: 2 of 23 parameters are not finite" in caplog.text


# -------------------------------------------------------------- zip bombs
def _zero_bomb(header: bytes, zero_bytes: int):
    """A raw deflate stream of ``header`` + ``zero_bytes`` zeros (1 MiB
    blocks, each compressed once and repeated) and its CRC-32."""
    block = bytes(1 << 20)
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    head = c.compress(header) + c.flush(zlib.Z_FULL_FLUSH)
    body = c.compress(block) + c.flush(zlib.Z_FULL_FLUSH)  # the same bytes for every block after a full flush
    data = head + body * (zero_bytes >> 20) + c.flush()
    crc = zlib.crc32(header)
    for _ in range(zero_bytes >> 20):
        crc = zlib.crc32(block, crc)
    return data, crc, len(header) + zero_bytes


def test_zip_bomb_is_refused_before_it_is_decompressed(tmp_path):
    # A 1 MiB file whose params member inflates to 1 GiB, shaped exactly as
    # its (legitimate, if large) configuration says: only the expansion
    # ratio gives it away before reading.
    bomb_net_config = {"format": "sparkavg.nn.Network", "version": 1, "input_shape": [BIG // 16384 - 1], "layers": [
        {"type": "Output", "units": 16384}], "updater": {"type": "SGD", "lr": 0.1}}
    config_bytes = json.dumps(bomb_net_config).encode()
    assert 16384 * (BIG // 16384 - 1) + 16384 == BIG  # weights + biases; SGD has no state
    data, crc, size = _zero_bomb(npy_header("<f4", (BIG,)), BIG * 4)
    counters = np.zeros(2, np.int64)
    entries = [Entry("config.npy", npy(np.frombuffer(config_bytes, np.uint8))),
               Entry("params.npy", data, method=DEFLATED, crc=crc, size=size),
               Entry("updater_state.npy", npy(np.zeros(0, np.float32))),
               Entry("counters.npy", npy(counters)),
               Entry("sha256.npy", npy(np.zeros(32, np.uint8)))]
    path = tmp_path / "bomb.npz"
    write_zip(path, entries)
    assert path.stat().st_size < 2 << 20
    assert_refused(path, r"member 'params' expands [\d,]+ compressed bytes to 1,073,741,952",
                   r"expected a ratio of at most 100", "zip bomb")


def test_deflated_members_within_the_ratio_load(net, tmp_path):
    entries = stored(members(net))
    for e in entries:
        if e.name == b"params.npy":  # random floats hardly compress
            c = zlib.compressobj(9, zlib.DEFLATED, -15)
            raw = e.data
            e.data, e.method, e.size, e.crc = c.compress(raw) + c.flush(), DEFLATED, len(raw), zlib.crc32(raw)
    path = tmp_path / "deflated.npz"
    write_zip(path, entries)
    assert np.array_equal(Network.load(path).params, net.params)


# ------------------------------------------------------- forged configuration
@pytest.mark.parametrize("layout", ["v1", "typed"])
def test_forged_config_with_10_to_the_12_params_allocates_nothing(net, tmp_path, layout):
    config = {"type": "Network", "input_shape": [10**6], "layers": [{"type": "Output", "units": 10**6}],
              "updater": {"type": "Adam", "lr": 0.001}, "seed": 1, "dtype": "float32"}
    if layout == "v1":
        config = {"format": "sparkavg.nn.Network", "version": 1,
                  **{k: v for k, v in config.items() if k != "type"}}
    path = tmp_path / "forged.npz"
    write_zip(path, stored(members(net, config=config)))  # a valid digest: a forger recomputes it
    assert_refused(path, "the configuration has 1,000,001,000,000 parameters, more than max_params=536,870,912")


def test_max_params_bounds_a_legitimate_file_too(net, tmp_path):
    path = tmp_path / "m.npz"
    net.save(path)
    assert_refused(path, r"declares 23 values in .params., more than 22 \(max_params=22\)", max_params=22)
    assert Network.load(path, max_params=23).num_params == 23
    with pytest.raises(ValueError, match="Expect max_params as an int >= 1, got 0"):
        Network.load(path, max_params=0)


@pytest.mark.parametrize("edit,expected", [
    (lambda c: c["layers"][0].update(units="3"),
     r"member 'config' \(Network.layers\[0\]: Expect Dense.units to be int, got str '3'\)"),
    (lambda c: c["layers"][0].update(type="Conv3D"), r"Expect a layer type in \[.*\], got 'Conv3D'"),
    (lambda c: c.update(updater={"type": "Adam", "lr": "0.001"}), "Expect Adam.lr to be float or a Schedule config, got str '0.001'"),
    (lambda c: c.update(dtype="float16"), r"expected a network dtype in \('float32', 'float64'\), got 'float16'"),
    (lambda c: c.update(version=7), "format 'sparkavg.nn.Network' version 1"),
])
def test_invalid_configurations_are_refused_by_name(net, tmp_path, edit, expected):
    config = v1_config(net)
    edit(config)
    path = tmp_path / "bad-config.npz"
    write_zip(path, stored(members(net, config=config)))
    assert_refused(path, expected)


def _with_config_bytes(net, text: bytes) -> dict:
    m = members(net)
    m["config"] = np.frombuffer(text, np.uint8)
    m["sha256"] = digest(text, (m["params"], m["updater_state"], m["counters"]))
    return m


def test_config_that_is_not_json_or_too_large(net, tmp_path):
    path = tmp_path / "deep.npz"
    write_zip(path, stored(_with_config_bytes(net, b"[" * 50_000)))  # RecursionError inside json
    assert_refused(path, "expected a valid network configuration in member 'config'")
    write_zip(path, stored(_with_config_bytes(net, b"\xff\xfe not utf-8")))
    assert_refused(path, "expected a valid network configuration in member 'config'.*utf-8")
    write_zip(path, stored(_with_config_bytes(net, b" " * ((1 << 20) + 1))))
    assert_refused(path, r"config should be 1-D uint8 of at most 1,048,576 values")


# ------------------------------------------------------------- truncation
def test_truncated_files_are_refused(net, tmp_path):
    path = tmp_path / "m.npz"
    net.save(path)
    data = path.read_bytes()
    for cut in (0, 20, len(data) // 3, len(data) // 2, len(data) - 10, len(data) - 1):
        path.write_bytes(data[:cut])
        assert_refused(path, "expected an .npz model archive|truncated")


def test_truncated_member_is_refused_by_its_declared_size(net, tmp_path):
    m = stored(members(net))
    for e in m:
        if e.name == b"params.npy":
            e.data = e.data[:-40]  # consistent zip entry, short array
            e.size, e.crc = len(e.data), zlib.crc32(e.data)
    path = tmp_path / "short.npz"
    write_zip(path, m)
    assert_refused(path, r"member 'params' declares [\d,]+ bytes; expected [\d,]+ \(a 128-byte header and "
                         r"float32 of shape \(23,\)\)")


def test_truncated_member_with_a_forged_large_header_allocates_nothing(net, tmp_path):
    # A few bytes of data behind a header that claims 1 GiB: old loaders
    # allocated the claimed array before finding the data missing.
    m = stored(members(net))
    m[1] = Entry("params.npy", npy_header("<f4", (BIG,)) + bytes(64))
    path = tmp_path / "claims.npz"
    write_zip(path, m)
    assert_refused(path, r"member 'params' declares 192 bytes; expected 1,073,741,952 \(a 128-byte header and "
                         r"float32 of shape \(268435456,\)\)")


# ------------------------------------------------------------- not a zip
@pytest.mark.parametrize("content", [b"", b"definitely not a zip", npy(np.zeros(3)),
                                     b"PK\x05\x06" + bytes(18)], ids=["empty", "junk", "npy", "empty-zip"])
def test_files_that_are_not_model_archives(tmp_path, content):
    path = tmp_path / "junk.npz"
    path.write_bytes(content)
    assert_refused(path, "expected an .npz model archive|expected exactly the members")


@pytest.mark.parametrize("field,value,expected", [
    ("flags", 0x1, "member 'params' is encrypted; expected a plain entry"),
    ("method", 9, r"member 'params' uses compression method 9; expected stored \(0\) or deflated \(8\)"),
    ("method", 99, "uses compression method 99"),
    ("version", 210, r"expected an .npz model archive \(a zip file\), got unreadable data \(zip file version 21.0\)"),
])
def test_zip_entries_this_library_never_writes(net, tmp_path, field, value, expected):
    # Old loaders let zipfile's RuntimeError / NotImplementedError escape,
    # without the file's name.
    m = stored(members(net))
    setattr(m[1], field, value)
    path = tmp_path / "odd.npz"
    write_zip(path, m)
    assert_refused(path, expected)


def test_missing_repeated_and_extra_members(net, tmp_path):
    path = tmp_path / "m.npz"
    m = stored(members(net))
    write_zip(path, m[:2] + m[3:])
    assert_refused(path, r"expected exactly the members .* missing \['updater_state'\]")
    write_zip(path, m + [m[1]])
    assert_refused(path, r"unexpected or repeated \['params.npy'\]")
    write_zip(path, m + [Entry("evil.pkl", b"cos\nsystem\n")])
    assert_refused(path, r"unexpected or repeated \['evil.pkl'\]")


# ------------------------------------------------------------ object dtype
@pytest.mark.parametrize("member", ["params", "config", "sha256"])
def test_object_arrays_are_never_unpickled(net, tmp_path, member):
    m = members(net)
    m[member] = np.array([{"evil": "payload"}], dtype=object)
    path = tmp_path / "pickle.npz"
    write_zip(path, stored(m))
    assert_refused(path, rf"member '{member}' is a pickled object array \(dtype object\); expected",
                   "never unpickled")


def test_structured_dtype_with_an_object_field_is_refused(net, tmp_path):
    m = members(net)
    m["params"] = np.zeros(23, dtype=[("a", "<f4"), ("b", "O")])
    path = tmp_path / "pickle.npz"
    write_zip(path, stored(m))
    assert_refused(path, "member 'params' is a pickled object array")


# --------------------------------------------------------- mismatched shapes
@pytest.mark.parametrize("name,array,expected", [
    ("params", np.zeros(22, np.float32), r"params should be float32 of shape \(23,\) .* got float32 of shape \(22,\)"),
    ("params", np.zeros(23, np.float64), r"expected one dtype for every state vector, got \['float32', 'float64'\]"),
    ("params", np.zeros(23, ">f4"), r"params should be a 1-D float32 or float64 vector, got >f4 of shape \(23,\)"),
    ("params", np.zeros((23, 1), np.float32), r"got float32 of shape \(23, 1\)"),
    ("updater_state", np.zeros(23, np.float32), r"updater_state should be float32 of shape \(46,\) .* \(23,\)"),
    ("counters", np.zeros(3, np.int64), r"counters should be int64 of shape \(2,\) .* got int64 of shape \(3,\)"),
])
def test_mismatched_shapes_are_refused_even_with_a_valid_digest(net, tmp_path, name, array, expected):
    m = members(net)
    m[name] = array
    text = m["config"].tobytes()
    m["sha256"] = digest(text, (m["params"], m["updater_state"], m["counters"]))
    path = tmp_path / "shape.npz"
    write_zip(path, stored(m))
    assert_refused(path, expected)


def test_forged_large_state_header_allocates_nothing(net, tmp_path):
    m = stored(members(net))
    m[2] = Entry("updater_state.npy", npy_header("<f4", (BIG,)) + bytes(184))
    path = tmp_path / "state.npz"
    write_zip(path, m)
    assert_refused(path, r"member 'updater_state' declares 312 bytes; expected 1,073,741,952")


# ------------------------------------------------------------------ checksum
def test_tampered_values_fail_the_digest(net, tmp_path):
    m = members(net)
    m["params"] = m["params"].copy()
    m["params"][0] += 1e-3
    path = tmp_path / "tampered.npz"
    write_zip(path, stored(m))
    assert_refused(path, "SHA-256 mismatch: expected the digest stored in the file")
    m = members(net, counters=(3, 1))
    m["counters"] = np.array([4, 1], np.int64)
    write_zip(path, stored(m))
    assert_refused(path, "SHA-256 mismatch")


def test_flipped_data_byte_fails_the_entry_crc(net, tmp_path):
    m = stored(members(net))
    data = bytearray(m[1].data)
    data[-5] ^= 0x40
    m[1].data = bytes(data)  # the declared CRC-32 is the original's
    path = tmp_path / "flip.npz"
    write_zip(path, m)
    assert_refused(path, r"member 'params' is (truncated or )?corrupt.*Bad CRC-32 for file 'params.npy'")


def test_forged_large_digest_header_allocates_nothing(net, tmp_path):
    m = stored(members(net))
    m[4] = Entry("sha256.npy", npy_header("|u1", (1 << 30,)) + bytes(32))
    path = tmp_path / "digest.npz"
    write_zip(path, m)
    assert_refused(path, r"sha256 should be uint8 of shape \(32,\) .* got uint8 of shape \(1073741824,\)")
