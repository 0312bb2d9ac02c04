"""Minibatch files (sparkavg.data.storage): round trips, and every corrupt or foreign file named."""
from __future__ import annotations

import json
import os
import struct

import numpy as np
import pytest

from sparkavg.data.validation import DataValidationError
from sparkavg.data.storage import SUFFIX, decode_minibatch, encode_minibatch, load_minibatch, save_minibatch


@pytest.mark.parametrize("x, y", [
    (np.random.default_rng(0).random((16, 1, 28, 28), dtype=np.float32), np.arange(16, dtype=np.int64)),
    (np.random.default_rng(1).random((3, 7)), np.eye(3, 4, dtype=np.float32)),
    (np.zeros((0, 5), np.float32), np.zeros(0, np.int64)),
    (np.arange(6, dtype=np.uint8).reshape(2, 3), np.array([True, False])),
])
def test_round_trip_keeps_dtype_shape_and_values(tmp_path, x, y):
    path = str(tmp_path / f"a{SUFFIX}")
    save_minibatch(path, {"input": x}, y)
    got, gy = load_minibatch(path)
    gx = got["input"]
    assert gx.dtype == x.dtype and gy.dtype == y.dtype and gx.shape == x.shape and gy.shape == y.shape
    np.testing.assert_array_equal(gx, x)
    np.testing.assert_array_equal(gy, y)
    assert gx.flags.writeable and gy.flags.writeable  # the training step may use them in place
    assert gx.flags.aligned and gy.flags.aligned  # the header is padded: no unaligned copies in the kernels
    url = (tmp_path / f"b{SUFFIX}").as_uri()  # the same through fsspec
    save_minibatch(url, {"input": x}, y)
    np.testing.assert_array_equal(load_minibatch(url)[0]["input"], x)


def test_big_endian_and_strided_inputs_are_stored_as_plain_little_endian(tmp_path):
    x = np.arange(12, dtype=">f4").reshape(3, 4)[:, ::2]
    got, gy = decode_minibatch(bytearray(encode_minibatch({"input": x}, np.arange(3, dtype=">i8"))))
    gx = got["input"]
    assert gx.dtype == np.dtype("<f4") and gy.dtype == np.dtype("<i8")
    np.testing.assert_array_equal(gx, x)


def test_objects_are_refused_when_writing():
    with pytest.raises(ValueError, match="plain numeric dtype"):
        encode_minibatch({"input": np.array([{"a": 1}], dtype=object)}, np.zeros(1))


def _with_header(header: dict, payload: bytes = b"") -> bytes:
    text = json.dumps(header).encode()
    start = struct.calcsize("<8sBI") + len(text)
    return struct.pack("<8sBI", b"SPKAVGMB", 1, len(text)) + text + b"\0" * (-start % 64) + payload


@pytest.mark.parametrize("data, message", [
    (b"SPK", "shorter than a minibatch file's 13-byte prefix"),
    (b"PK\x03\x04" + b"\0" * 40, "expected a sparkavg minibatch file"),
    (struct.pack("<8sBI", b"SPKAVGMB", 3, 2) + b"{}", "version 3"),
    (struct.pack("<8sBI", b"SPKAVGMB", 1, 500) + b"{}", "runs past the file's 15 bytes"),
    (_with_header({"x": {"dtype": "|O", "shape": [1]}, "y": {"dtype": "<i8", "shape": [1]}}), "'x' with a dtype"),
    (_with_header({"x": {"dtype": "<f4", "shape": [-1]}, "y": {"dtype": "<i8", "shape": [1]}}), "non-negative"),
    (_with_header({"x": {"dtype": "<f4", "shape": [2]}}, b"\0" * 8), "'y' with a dtype"),
    (_with_header({"x": {"dtype": "<f4", "shape": [4]}, "y": {"dtype": "<i8", "shape": [1]}}, b"\0" * 20),
     "truncated"),
    (_with_header({"x": {"dtype": "<f4", "shape": [1]}, "y": {"dtype": "<i8", "shape": [1]}}, b"\0" * 13),
     "1 bytes after the arrays"),
])
def test_corrupt_or_foreign_files_are_errors_naming_the_file(tmp_path, data, message):
    path = tmp_path / f"bad{SUFFIX}"
    path.write_bytes(data)
    with pytest.raises(DataValidationError, match=f"Cannot read minibatch {path}.*") as info:
        load_minibatch(str(path))
    assert message in str(info.value)


def test_a_truncated_real_file_is_an_error(tmp_path):
    path = tmp_path / f"t{SUFFIX}"
    save_minibatch(str(path), {"input": np.ones((4, 3), np.float32)}, np.arange(4))
    path.write_bytes(path.read_bytes()[:-5])
    with pytest.raises(DataValidationError, match="truncated"):
        load_minibatch(str(path))


def test_named_inputs_round_trip_with_their_own_dtypes(tmp_path):
    """Several inputs: version 2, each array 64-byte aligned; ids beyond float32's 2**24 stay exact."""
    big = 2 ** 24 + 1
    x = {"cats": np.array([[big, 1], [3, big + 2], [0, 5]], np.int64),
         "nums": np.arange(12, dtype=np.float32).reshape(3, 4)}
    path = str(tmp_path / f"named{SUFFIX}")
    save_minibatch(path, x, np.array([0, 1, 1]))
    got, y = load_minibatch(path)
    assert list(got) == ["cats", "nums"] and y.tolist() == [0, 1, 1]
    assert got["cats"].dtype == np.int64 and got["cats"].tolist() == x["cats"].tolist()
    np.testing.assert_array_equal(got["nums"], x["nums"])
    assert all(a.ctypes.data % 64 == got["cats"].ctypes.data % 64 for a in got.values())
    assert open(path, "rb").read()[8] == 2


def test_version_1_files_of_one_array_are_read_as_the_input_named_input(tmp_path):
    """Files written before inputs were named: one ``x`` array, read by the name a Network's input has."""
    x, y = np.arange(6, dtype=np.float32).reshape(2, 3), np.array([1, 0], np.int64)
    path = tmp_path / f"v1{SUFFIX}"
    path.write_bytes(_with_header({"x": {"dtype": "<f4", "shape": [2, 3]}, "y": {"dtype": "<i8", "shape": [2]}},
                                  x.tobytes() + y.tobytes()))
    got, gy = load_minibatch(str(path))
    assert list(got) == ["input"] and gy.tolist() == [1, 0]
    np.testing.assert_array_equal(got["input"], x)
    assert encode_minibatch(got, gy)[8] == 2  # written again: the one format, version 2


def test_a_truncated_named_file_is_an_error_naming_it(tmp_path):
    path = tmp_path / f"t{SUFFIX}"
    path.write_bytes(encode_minibatch({"a": np.ones((4, 3), np.float32)}, np.arange(4))[:-5])
    with pytest.raises(DataValidationError, match=f"Cannot read minibatch {path}.*truncated"):
        load_minibatch(str(path))


def test_stale_export_folders_of_ended_drivers_are_swept(tmp_path, monkeypatch):
    import subprocess
    import sys
    import tempfile

    from sparkavg.data.storage import SharedLocation, sweep_stale_exports

    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()  # a driver killed mid-fit: its pid no longer runs
    stale = tmp_path / f"sparkavg-export-{ended.pid}-abc123"
    (stale / "sub").mkdir(parents=True)
    (stale / "sub" / "0.minibatch").write_bytes(b"x" * 10)
    live = tmp_path / f"sparkavg-export-{os.getppid()}-def456"  # a process that runs (this one's parent)
    live.mkdir()
    unnamed = tmp_path / "sparkavg-export-legacyname"  # not named after a process: left alone
    unnamed.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    location = SharedLocation.temporary()  # sweeps first
    try:
        assert not stale.exists() and live.exists() and unnamed.exists()
        assert os.path.basename(location.root).startswith(f"sparkavg-export-{os.getpid()}-")
        assert sweep_stale_exports(str(tmp_path)) == []  # its own folder is this live process's
    finally:
        location.release()
