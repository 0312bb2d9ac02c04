"""Reading and writing IDX files (the MNIST container format).

An IDX file is a 4-byte magic ``0x00 0x00 <type code> <ndim>``, then ``ndim``
big-endian uint32 dimensions, then exactly ``prod(dims)`` big-endian items of
the coded type, row-major. Files may be gzip-compressed; compression is
detected from the gzip magic bytes (``1f 8b``), not from the file name.

The reader is strict: a wrong magic, an unknown type code, a payload shorter
or longer than the dimensions say, or a corrupt gzip stream raise
:class:`IdxFormatError` naming the file and what was expected. The payload is
read in chunks straight into the output array, so a file is never held in
memory twice.
"""
from __future__ import annotations

import gzip
import logging
import math
import os
import struct
import zlib
from typing import BinaryIO, NamedTuple

import numpy as np

__all__ = [
    "IdxFormatError",
    "IdxHeader",
    "IDX_TYPE_CODES",
    "read_idx",
    "read_idx_header",
    "write_idx",
]

logger = logging.getLogger(__name__)

#: IDX type code -> big-endian numpy dtype.
IDX_TYPE_CODES: dict[int, np.dtype] = {
    0x08: np.dtype(">u1"),
    0x09: np.dtype(">i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}
_CODE_FOR_KIND = {(dt.kind, dt.itemsize): code for code, dt in IDX_TYPE_CODES.items()}

_GZIP_MAGIC = b"\x1f\x8b"
# Deflate cannot expand data by more than ~1032:1; a header promising more than
# this from a compressed file is certainly lying, so we refuse before allocating.
_MAX_DEFLATE_RATIO = 1100
# gzip raises BadGzipFile on a bad header or CRC, EOFError on a cut stream and
# zlib.error on corrupt deflate data; other OSErrors (permissions...) propagate.
_GZIP_ERRORS = (gzip.BadGzipFile, EOFError, zlib.error)
_CHUNK = 1 << 22  # 4 MiB per read: bounds the temporary buffers gzip allocates


class IdxFormatError(ValueError):
    """A file is not a well-formed IDX file.

    Parameters
    ----------
    path : str
        The offending file.
    message : str
        What was expected and what was found.
    """

    def __init__(self, path, message: str):
        self.path = str(path)
        self.reason = message
        super().__init__(f"{self.path}: {message}")

    def __reduce__(self):  # keep `path` when pickled across Spark executors
        return (type(self), (self.path, self.reason))


class IdxHeader(NamedTuple):
    """What an IDX header declares.

    Attributes
    ----------
    dtype : numpy.dtype
        Big-endian item dtype of the payload.
    shape : tuple of int
        Dimensions, outermost first.
    header_bytes : int
        Size of magic plus dimensions: ``4 + 4 * ndim``.
    gzipped : bool
        Whether the file is gzip-compressed.
    """

    dtype: np.dtype
    shape: tuple
    header_bytes: int
    gzipped: bool

    @property
    def payload_bytes(self) -> int:
        """Number of payload bytes the dimensions require."""
        return math.prod(self.shape) * self.dtype.itemsize


def _is_gzip(path) -> bool:
    with open(path, "rb") as f:
        return f.read(2) == _GZIP_MAGIC


def _open(path) -> tuple[BinaryIO, bool]:
    gz = _is_gzip(path)
    return (gzip.open(path, "rb") if gz else open(path, "rb")), gz


def _read_exact(f: BinaryIO, n: int, path, what: str) -> bytes:
    data = f.read(n)
    if len(data) != n:
        raise IdxFormatError(path, f"file ends inside the {what}: expected {n} bytes, got {len(data)}")
    return data


def _parse_header(f: BinaryIO, path, gz: bool) -> IdxHeader:
    magic = _read_exact(f, 4, path, "4-byte magic number")
    if magic[0] != 0 or magic[1] != 0:
        raise IdxFormatError(
            path, f"expected IDX magic 00 00 <type> <ndim>, got {magic.hex(' ')}"
        )
    code, ndim = magic[2], magic[3]
    if code not in IDX_TYPE_CODES:
        known = ", ".join(f"0x{c:02X} ({IDX_TYPE_CODES[c].name})" for c in IDX_TYPE_CODES)
        raise IdxFormatError(path, f"unknown IDX type code 0x{code:02X}; expected one of {known}")
    if ndim < 1:
        raise IdxFormatError(path, f"expected at least 1 dimension in the IDX magic, got {ndim}")
    dims = struct.unpack(f">{ndim}I", _read_exact(f, 4 * ndim, path, f"{ndim} dimension sizes"))
    return IdxHeader(IDX_TYPE_CODES[code], tuple(int(d) for d in dims), 4 + 4 * ndim, gz)


def read_idx_header(path) -> IdxHeader:
    """Read and validate only the header of an IDX file (``.gz`` or raw).

    Parameters
    ----------
    path : str or os.PathLike
        The IDX file.

    Returns
    -------
    IdxHeader
        Declared dtype, shape, header size and compression.

    Raises
    ------
    IdxFormatError
        Wrong magic, unknown type code, zero dimensions, or a file that ends
        inside the header.
    """
    path = os.fspath(path)
    try:
        f, gz = _open(path)
        with f:
            return _parse_header(f, path, gz)
    except _GZIP_ERRORS as exc:
        raise IdxFormatError(path, f"corrupt or truncated gzip stream ({type(exc).__name__}: {exc})") from exc


def read_idx(path, limit: int | None = None) -> np.ndarray:
    """Read an IDX file (``.gz`` or raw) into a native-endian numpy array.

    Parameters
    ----------
    path : str or os.PathLike
        The IDX file. Gzip compression is detected from the content.
    limit : int, optional
        Read only the first ``limit`` items along axis 0 (all when ``None``
        or when the file has fewer). With a limit, a raw file's total size is
        still checked (from the file system, cheaply) but the unread tail of a
        gzip file is not decompressed and so not verified.

    Returns
    -------
    numpy.ndarray
        Shape ``dims`` from the header (axis 0 cut to ``limit``), dtype one of
        uint8, int8, int16, int32, float32, float64 in native byte order.

    Raises
    ------
    IdxFormatError
        Wrong magic, unknown type code, truncated payload, trailing bytes
        after the payload, or a corrupt/truncated gzip stream. The message
        names the file and expected versus actual byte counts.
    FileNotFoundError
        The file does not exist.
    """
    if limit is not None and (not isinstance(limit, (int, np.integer)) or isinstance(limit, (bool, np.bool_))
                              or limit < 0):
        raise ValueError(f"Expect limit to be None or an int >= 0, got {type(limit).__name__} {limit!r}")
    path = os.fspath(path)
    try:
        f, gz = _open(path)
        with f:
            return _read_payload(f, path, gz, limit)
    except _GZIP_ERRORS as exc:
        raise IdxFormatError(path, f"corrupt or truncated gzip stream ({type(exc).__name__}: {exc})") from exc


def _read_payload(f: BinaryIO, path: str, gz: bool, limit: int | None) -> np.ndarray:
    header = _parse_header(f, path, gz)
    expected = header.payload_bytes
    file_size = os.path.getsize(path)
    if not gz:
        actual = file_size - header.header_bytes
        if actual != expected:
            kind = "truncated" if actual < expected else "trailing bytes after the payload"
            raise IdxFormatError(
                path,
                f"{kind}: header declares shape {header.shape} of {header.dtype.name} "
                f"= {expected} payload bytes, file has {actual}",
            )
    elif expected > _MAX_DEFLATE_RATIO * file_size + 1024:
        raise IdxFormatError(
            path,
            f"header declares shape {header.shape} = {expected} payload bytes, which cannot "
            f"come from a {file_size}-byte gzip file (truncated or corrupt)",
        )

    shape = header.shape
    if limit is not None and limit < shape[0]:
        shape = (int(limit),) + shape[1:]
    out = np.empty(shape, dtype=header.dtype)
    want = out.nbytes
    got = _readinto_chunks(f, memoryview(out.reshape(-1).view(np.uint8)))
    if got != want:
        raise IdxFormatError(
            path,
            f"truncated: header declares shape {header.shape} of {header.dtype.name} = "
            f"{expected} payload bytes, the {'decompressed ' if gz else ''}payload has {got}",
        )
    if want == expected:  # the whole payload was read: nothing may follow it
        extra = _count_remaining(f)
        if extra:
            raise IdxFormatError(
                path,
                f"trailing bytes after the payload: header declares {expected} payload bytes, "
                f"the {'decompressed ' if gz else ''}payload has {expected + extra}",
            )
    if out.dtype.itemsize > 1:  # big-endian -> native, in place (no second copy)
        out.byteswap(inplace=True)
        out = out.view(out.dtype.newbyteorder("="))
    else:
        out = out.view(out.dtype.newbyteorder("="))
    logger.debug("read %s: shape %s dtype %s (gzip=%s)", path, out.shape, out.dtype, gz)
    return out


def _readinto_chunks(f: BinaryIO, buf: memoryview) -> int:
    total = 0
    n = len(buf)
    while total < n:
        got = f.readinto(buf[total : min(n, total + _CHUNK)])
        if not got:
            break
        total += got
    return total


def _count_remaining(f: BinaryIO) -> int:
    extra = 0
    while True:
        chunk = f.read(_CHUNK)
        if not chunk:
            return extra
        extra += len(chunk)


def write_idx(path, array) -> None:
    """Write an array as an IDX file; gzip-compressed when ``path`` ends in ``.gz``.

    Parameters
    ----------
    path : str or os.PathLike
        Destination file (overwritten).
    array : array_like
        At least 1-D, at most 255-D, each dimension < 2**32, dtype one of
        uint8, int8, int16, int32, float32, float64.

    Raises
    ------
    TypeError
        The dtype has no IDX type code.
    ValueError
        Zero dimensions, more than 255, or a dimension too large.
    """
    path = os.fspath(path)
    arr = np.asarray(array)
    code = _CODE_FOR_KIND.get((arr.dtype.kind, arr.dtype.itemsize))
    if code is None:
        supported = ", ".join(dt.name for dt in IDX_TYPE_CODES.values())
        raise TypeError(f"Expect an array of dtype {supported} for IDX, got {arr.dtype} (writing {path})")
    if not 1 <= arr.ndim <= 255:
        raise ValueError(f"Expect an array with 1..255 dimensions for IDX, got ndim={arr.ndim} (writing {path})")
    if any(d >= 2**32 for d in arr.shape):
        raise ValueError(f"Expect every dimension < 2**32 for IDX, got shape {arr.shape} (writing {path})")
    big = np.ascontiguousarray(arr, dtype=IDX_TYPE_CODES[code])
    header = bytes([0, 0, code, arr.ndim]) + struct.pack(f">{arr.ndim}I", *arr.shape)
    with open(path, "wb") as raw:
        # mtime=0 keeps .gz fixtures byte-for-byte reproducible
        f = gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) if path.endswith(".gz") else raw
        try:
            f.write(header)
            f.write(memoryview(big.reshape(-1).view(np.uint8)))
        finally:
            if f is not raw:
                f.close()
    logger.debug("wrote %s: shape %s dtype %s", path, arr.shape, arr.dtype)
