"""IDX reader/writer: round trips for every type code, and every kind of bad file."""
import gzip
import pickle
import re
import struct

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from sparkavg.data.idx import IdxFormatError, read_idx, read_idx_header, write_idx

DTYPES = [np.uint8, np.int8, np.int16, np.int32, np.float32, np.float64]


def _header(code: int, dims) -> bytes:
    return bytes([0, 0, code, len(dims)]) + struct.pack(f">{len(dims)}I", *dims)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_round_trip_every_dtype(tmp_path, dtype, suffix):
    info = np.iinfo(dtype) if np.dtype(dtype).kind in "iu" else np.finfo(dtype)
    a = np.array([[info.min, 0, 1], [info.max, 2, 3]], dtype=dtype)
    path = tmp_path / f"a.idx{suffix}"
    write_idx(path, a)
    b = read_idx(path)
    assert b.dtype == a.dtype and b.dtype.isnative
    assert b.shape == a.shape
    np.testing.assert_array_equal(a, b)


@given(
    hnp.arrays(
        dtype=st.sampled_from([np.dtype(d) for d in DTYPES]),
        shape=hnp.array_shapes(min_dims=1, max_dims=4, min_side=0, max_side=5),
    ),
    st.booleans(),
)
def test_round_trip_property(tmp_path_factory, a, gz):
    path = tmp_path_factory.mktemp("idx") / ("x.gz" if gz else "x")
    write_idx(path, a)
    b = read_idx(path)
    assert b.shape == a.shape and b.dtype == a.dtype
    # compare bit patterns so NaN payloads count as equal
    assert a.tobytes() == b.tobytes()


def test_gzip_detected_by_content_not_suffix(tmp_path):
    a = np.arange(12, dtype=np.int16).reshape(3, 4)
    gz = tmp_path / "a.gz"
    write_idx(gz, a)
    disguised = tmp_path / "a-idx2-short"  # gzip bytes, no .gz suffix
    disguised.write_bytes(gz.read_bytes())
    np.testing.assert_array_equal(read_idx(disguised), a)
    assert read_idx_header(disguised).gzipped


def test_header_only(tmp_path):
    path = tmp_path / "h"
    write_idx(path, np.zeros((7, 2, 3), np.float32))
    h = read_idx_header(path)
    assert h.shape == (7, 2, 3) and h.dtype == np.dtype(">f4")
    assert h.header_bytes == 16 and h.payload_bytes == 7 * 6 * 4 and not h.gzipped


@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_limit_reads_a_prefix(tmp_path, suffix):
    a = np.arange(60, dtype=np.int32).reshape(10, 6)
    path = tmp_path / f"a{suffix}"
    write_idx(path, a)
    np.testing.assert_array_equal(read_idx(path, limit=3), a[:3])
    np.testing.assert_array_equal(read_idx(path, limit=0), a[:0])
    np.testing.assert_array_equal(read_idx(path, limit=99), a)
    with pytest.raises(ValueError, match="limit"):
        read_idx(path, limit=-1)


def _expect_error(path, *fragments):
    with pytest.raises(IdxFormatError) as info:
        read_idx(path)
    msg = str(info.value)
    assert str(path) in msg, msg
    for frag in fragments:
        assert frag in msg, msg
    assert info.value.path == str(path)
    return msg


def test_wrong_magic(tmp_path):
    path = tmp_path / "bad-magic"
    path.write_bytes(b"\x01\x00\x08\x01" + struct.pack(">I", 2) + b"\x00\x00")
    _expect_error(path, "expected IDX magic 00 00", "01 00 08 01")


def test_unknown_type_code(tmp_path):
    path = tmp_path / "bad-type"
    path.write_bytes(_header(0x0A, [2]) + b"\x00\x00")
    _expect_error(path, "unknown IDX type code 0x0A", "0x08")


def test_zero_dimensions(tmp_path):
    path = tmp_path / "ndim0"
    path.write_bytes(b"\x00\x00\x08\x00")
    _expect_error(path, "expected at least 1 dimension")


def test_file_ends_in_header(tmp_path):
    path = tmp_path / "short-header"
    path.write_bytes(b"\x00\x00\x08\x03" + struct.pack(">I", 2))
    _expect_error(path, "expected 12 bytes, got 4")


def test_truncated_payload(tmp_path):
    path = tmp_path / "truncated"
    path.write_bytes(_header(0x0B, [3, 4]) + b"\x00" * 23)  # 24 expected
    _expect_error(path, "truncated", "24 payload bytes", "file has 23")


def test_trailing_bytes(tmp_path):
    path = tmp_path / "trailing"
    path.write_bytes(_header(0x08, [5]) + b"\x00" * 5 + b"junk")
    _expect_error(path, "trailing bytes", "5 payload bytes", "file has 9")


def test_truncated_payload_inside_valid_gzip(tmp_path):
    path = tmp_path / "truncated.gz"
    path.write_bytes(gzip.compress(_header(0x0C, [4]) + b"\x00" * 10, mtime=0))  # 16 expected
    _expect_error(path, "truncated", "16 payload bytes", "payload has 10")


def test_trailing_bytes_inside_valid_gzip(tmp_path):
    path = tmp_path / "trailing.gz"
    path.write_bytes(gzip.compress(_header(0x08, [4]) + b"\x00" * 7, mtime=0))
    _expect_error(path, "trailing bytes", "4 payload bytes", "payload has 7")


def test_truncated_gzip_stream(tmp_path):
    good = tmp_path / "good.gz"
    rng = np.random.default_rng(0)
    write_idx(good, rng.integers(0, 255, size=(50, 20), dtype=np.uint8))
    data = good.read_bytes()
    path = tmp_path / "cut.gz"
    path.write_bytes(data[: len(data) // 2])
    _expect_error(path, "corrupt or truncated gzip")


def test_corrupt_gzip_stream(tmp_path):
    good = tmp_path / "good.gz"
    write_idx(good, np.arange(1000, dtype=np.int32))
    data = bytearray(good.read_bytes())
    data[-8] ^= 0xFF  # break the CRC in the trailer
    path = tmp_path / "crc.gz"
    path.write_bytes(bytes(data))
    _expect_error(path, "corrupt or truncated gzip")


def test_impossible_gzip_size_refused_before_allocating(tmp_path):
    path = tmp_path / "huge.gz"
    path.write_bytes(gzip.compress(_header(0x0E, [100000, 100000]), mtime=0))
    _expect_error(path, "80000000000 payload bytes", "gzip file")


def test_missing_file_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_idx(tmp_path / "nope")


def test_error_pickles_with_its_path(tmp_path):
    err = IdxFormatError(tmp_path / "f", "expected x, got y")
    back = pickle.loads(pickle.dumps(err))
    assert isinstance(back, ValueError)
    assert back.path == err.path and str(back) == str(err)


def test_write_rejects_unsupported(tmp_path):
    with pytest.raises(TypeError, match="int64"):
        write_idx(tmp_path / "x", np.zeros(3, np.int64))
    with pytest.raises(ValueError, match="ndim=0"):
        write_idx(tmp_path / "x", np.uint8(3))


def test_write_gz_is_reproducible(tmp_path):
    a = np.arange(100, dtype=np.uint8)
    write_idx(tmp_path / "a.gz", a)
    write_idx(tmp_path / "b.gz", a)
    assert gzip.decompress((tmp_path / "a.gz").read_bytes()) == _header(0x08, [100]) + a.tobytes()
    assert (tmp_path / "a.gz").read_bytes()[4:8] == b"\x00\x00\x00\x00"  # mtime 0


def test_garbage_after_gzip_stream(tmp_path):
    path = tmp_path / "junk.gz"
    write_idx(path, np.arange(10, dtype=np.uint8))
    with open(path, "ab") as f:
        f.write(b"garbage!")
    _expect_error(path, "corrupt or truncated gzip")


@pytest.mark.parametrize("limit", [True, False, 2.0, "3"])
def test_limit_refuses_what_is_not_an_int(tmp_path, limit):
    from sparkavg.data.mnist import load_mnist

    path = tmp_path / "a"
    write_idx(path, np.arange(10, dtype=np.int32))
    expected = f"Expect limit to be None or an int >= 0, got {type(limit).__name__} {limit!r}"
    with pytest.raises(ValueError, match=re.escape(expected)):
        read_idx(path, limit=limit)  # before: True read one item, False none
    with pytest.raises(ValueError, match=re.escape(expected)):
        load_mnist(tmp_path, limit=limit)
