"""The one reader of ``.npz`` archives (and ``.npy`` blobs): bounded memory, never pickle.

Every ``.npz`` sparkavg opens -- model files (:mod:`sparkavg.nn.serialization`),
a checkpoint's ``runner.npz``, ``.npy`` minibatch blobs -- goes through
:class:`NpzArchive`, which trusts nothing it has not checked:

1. the zip directory: each entry stored or deflated (not encrypted, no
   other method), a stored entry's two sizes equal, a deflated entry
   expanding at most :data:`MAX_COMPRESSION_RATIO` times, and every entry's
   compressed bytes inside the file (a 1 KB file cannot declare a 1 GB
   member);
2. a member's ``.npy`` header (a plain dtype: no object, no structured
   field; the shape the caller expects, or at most the bytes it allows)
   and the entry's declared size against that header -- before anything
   is allocated;
3. then the data is streamed into the allocated array in 1 MiB chunks
   (zipfile never returns more than the declared size; reading to the end
   makes it check the CRC-32).

So the memory a file can make the reader allocate is bounded by what the
caller allows and by the file's own size (times the compression ratio),
never by what a forged header or directory declares.  Errors are
:class:`NpzError` (a ``ValueError``; callers may pass their own subclass)
naming the file and what was expected.
"""
from __future__ import annotations

import collections
import hashlib
import io
import math
import os
import struct
import zipfile
import zlib
from typing import Dict, Iterable, Optional

import numpy as np

__all__ = ["NpzError", "NpzArchive", "load_npz", "load_npy_bytes", "MAX_COMPRESSION_RATIO"]

#: A deflated member may expand at most this many times (sparkavg stores
#: members uncompressed; deflate itself tops out near 1032).
MAX_COMPRESSION_RATIO = 100

CHUNK = 1 << 20
MAX_NPY_HEADER = 10_000  # numpy's own default limit
#: What reading a corrupt zip member can raise, besides our own errors.
READ_ERRORS = (zipfile.BadZipFile, zlib.error, EOFError, OSError, ValueError, KeyError, NotImplementedError,
               RuntimeError, struct.error, OverflowError, SyntaxError, TypeError)
_PLAIN_KINDS = "biufcSU"  # bool, integers, floats, complex, bytes and unicode strings
_LOCAL_HEADER = 30  # bytes of a zip local file header before its name and extra field


class NpzError(ValueError):
    """An ``.npz`` archive (or ``.npy`` blob) that cannot be trusted or read;
    the message names the file and what was expected."""


def _plain(dtype: np.dtype) -> bool:
    return dtype.kind in _PLAIN_KINDS and dtype.names is None and dtype.subdtype is None and not dtype.hasobject


def _read_header(fp):
    """``(shape, fortran_order, dtype, header bytes)`` of the ``.npy`` stream ``fp``."""
    version = np.lib.format.read_magic(fp)
    if version == (1, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(fp, MAX_NPY_HEADER)
    elif version == (2, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_2_0(fp, MAX_NPY_HEADER)
    else:
        raise NpzError(f".npy format {version}; expected 1.0 or 2.0")
    return shape, fortran, dtype, fp.tell()


class NpzArchive:
    """The checked zip directory of one ``.npz`` file opened as ``fh``.

    Parameters
    ----------
    path : str
        Named in every error.
    fh : binary file object
        Seekable; its size bounds what the entries may declare.
    members : iterable of str, optional
        The member names (without ``.npy``) the archive must hold exactly
        (besides ``optional``); default: any ``.npy`` members, each once.
    optional : iterable of str
        Members that may be there too.
    error : type, default NpzError
        The exception class raised (a subclass of ``ValueError``).
    what : str
        What the file should be, for the message of an unreadable one.
    """

    def __init__(self, path: str, fh, *, members: Optional[Iterable[str]] = None, optional: Iterable[str] = (),
                 error: type = NpzError, what: str = "an .npz archive"):
        self.path, self._error = path, error
        try:
            self.zip = zipfile.ZipFile(fh)
            infos = self.zip.infolist()
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
        except READ_ERRORS as exc:
            raise self.error(f"expected {what} (a zip file), got unreadable data ({exc})") from None
        counts = collections.Counter(i.filename for i in infos)
        if members is not None:
            members, optional = tuple(members), tuple(optional)
            expected = [f"{m}.npy" for m in members + optional]
            missing = [m for m in members if f"{m}.npy" not in counts]
            extra = sorted(n for n, k in counts.items() if n not in expected or k > 1)
            if missing or extra:
                shown = extra[:10] + ([f"... {len(extra) - 10} more"] if len(extra) > 10 else [])
                raise self.error(f"expected exactly the members {list(members)}"
                                 f"{f' (and optionally {list(optional)})' if optional else ''}, missing {missing}, "
                                 f"unexpected or repeated {shown}")
        else:
            extra = sorted(n for n, k in counts.items() if not n.endswith(".npy") or k > 1)
            if extra:
                raise self.error(f"expected .npy members, each once, got {extra[:10]}")
        # The central directory follows every entry's data: nothing may end past it.
        self._data_end = min(int(getattr(self.zip, "start_dir", size)), size)
        self.infos = {i.filename[:-4]: i for i in infos}
        for name, info in self.infos.items():
            self._check_entry(name, info)

    def error(self, message: str) -> ValueError:
        return self._error(f"{self.path}: {message}")

    def __enter__(self) -> "NpzArchive":
        return self

    def __exit__(self, *exc) -> None:
        self.zip.close()

    @property
    def names(self) -> list:
        return list(self.infos)

    def _check_entry(self, name: str, info) -> None:
        if info.flag_bits & 0x1:
            raise self.error(f"member {name!r} is encrypted; expected a plain entry")
        if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            raise self.error(f"member {name!r} uses compression method {info.compress_type}; expected stored (0) "
                             f"or deflated (8)")
        if info.compress_type == zipfile.ZIP_STORED and info.compress_size != info.file_size:
            raise self.error(f"member {name!r} is stored with {info.compress_size} bytes but declares "
                             f"{info.file_size}; expected equal sizes")
        if info.compress_type == zipfile.ZIP_DEFLATED and \
                info.file_size > max(CHUNK, MAX_COMPRESSION_RATIO * info.compress_size):
            raise self.error(f"member {name!r} expands {info.compress_size:,} compressed bytes to {info.file_size:,} "
                             f"(ratio {info.file_size / max(info.compress_size, 1):,.0f}); expected a ratio of at "
                             f"most {MAX_COMPRESSION_RATIO} -- refusing a possible zip bomb")
        end = info.header_offset + _LOCAL_HEADER + len(info.filename.encode()) + info.compress_size
        if end > self._data_end:
            raise self.error(f"member {name!r} declares {info.compress_size:,} bytes of data at offset "
                             f"{info.header_offset:,}, past the {self._data_end:,} bytes the file holds before its "
                             f"zip directory; expected every member inside the file (truncated or forged)")

    #: Said after what a member should be (a model file: " for this configuration").
    expectation = ""

    def open(self, name: str, dtype, shape=None, max_length: Optional[int] = None):
        """Open member ``name`` and check its ``.npy`` header and declared size
        (``dtype``; ``shape`` exact, or a 1-D length of at most ``max_length``)
        without reading the data.  Returns ``(stream positioned at the data, shape)``."""
        fp, got_shape, _ = self._open(name, dtype, shape, max_length, None)
        return fp, got_shape

    def open_plain(self, name: str, max_bytes: int):
        """Open member ``name``: any plain dtype (no object, no fields) and
        shape of at most ``max_bytes`` bytes, checked as :meth:`open` does.
        Returns ``(stream positioned at the data, shape, dtype)``."""
        return self._open(name, None, None, None, max_bytes)

    def _open(self, name, dtype, shape, max_length, max_bytes):
        info = self.infos[name]
        want_dtype = None if dtype is None else np.dtype(dtype)
        try:
            fp = self.zip.open(info)
            try:
                got_shape, fortran, got_dtype, header_bytes = _read_header(fp)
            except BaseException:
                fp.close()
                raise
        except NpzError as exc:
            raise self.error(f"member {name!r} is {exc}") from None
        except READ_ERRORS as exc:
            raise self.error(f"member {name!r} is corrupt: expected an .npy header ({exc})") from None
        if shape is not None:
            want = f"{want_dtype} of shape {shape}"
        elif max_length is not None:
            want = f"1-D {want_dtype} of at most {max_length:,} values"
        else:
            want = f"a plain array of at most {max_bytes:,} bytes"
        if got_dtype.hasobject:
            fp.close()
            raise self.error(f"member {name!r} is a pickled object array (dtype {got_dtype}); expected {want} "
                             f"(sparkavg files are never unpickled)")
        ok = (got_dtype == want_dtype if want_dtype is not None else _plain(got_dtype)) \
            and not (fortran and len(got_shape) > 1)
        if shape is not None:
            ok = ok and got_shape == shape
        elif max_length is not None:
            ok = ok and len(got_shape) == 1 and got_shape[0] <= max_length
        else:
            ok = ok and max_bytes is not None and math.prod(got_shape) * got_dtype.itemsize <= max_bytes
        if not ok:
            fp.close()
            raise self.error(f"{name} should be {want}{self.expectation}, got {got_dtype} of shape {got_shape}")
        nbytes = math.prod(got_shape) * got_dtype.itemsize
        if info.file_size != header_bytes + nbytes:
            fp.close()
            raise self.error(f"member {name!r} declares {info.file_size:,} bytes; expected {header_bytes + nbytes:,} "
                             f"(a {header_bytes}-byte header and {got_dtype} of shape {got_shape})")
        return fp, got_shape, got_dtype

    def read_into(self, name: str, fp, out: np.ndarray, digest=None) -> None:
        """Stream the data of an opened member into ``out`` in chunks (hashing
        it into ``digest`` when given); reading to the end makes zipfile
        check the entry's CRC-32."""
        view = memoryview(out.reshape(-1).view(np.uint8))
        try:
            with fp:
                for start in range(0, len(view), CHUNK):
                    want = min(CHUNK, len(view) - start)
                    chunk = fp.read(want)  # fewer bytes only at the end of the entry
                    if len(chunk) != want:
                        raise EOFError(f"data ends after {start + len(chunk):,} of {len(view):,} bytes")
                    view[start:start + want] = chunk
                    if digest is not None:
                        digest.update(chunk)
                if fp.read(1):
                    raise ValueError("data continues past the array")
        except READ_ERRORS as exc:
            raise self.error(f"member {name!r} is truncated or corrupt ({exc})") from None

    def hash_member(self, name: str, fp, nbytes: int, digest) -> None:
        """Stream the ``nbytes`` of an opened member's data into ``digest``
        in chunks, keeping none of it (a digest checked before anything is
        built from the data)."""
        try:
            with fp:
                done = 0
                while done < nbytes:
                    chunk = fp.read(min(CHUNK, nbytes - done))
                    if not chunk:
                        raise EOFError(f"data ends after {done:,} of {nbytes:,} bytes")
                    digest.update(chunk)
                    done += len(chunk)
                if fp.read(1):
                    raise ValueError("data continues past the array")
        except READ_ERRORS as exc:
            raise self.error(f"member {name!r} is truncated or corrupt ({exc})") from None

    def read_small(self, name: str, dtype, shape=None, max_length=None) -> np.ndarray:
        """A small member, checked by header first, read whole."""
        fp, got_shape = self.open(name, dtype, shape, max_length)
        out = np.empty(got_shape, dtype=dtype)
        self.read_into(name, fp, out, hashlib.sha256())
        return out

    def read(self, name: str, max_bytes: int) -> np.ndarray:
        """Member ``name``: any plain dtype and shape of at most ``max_bytes`` bytes."""
        fp, got_shape, got_dtype = self.open_plain(name, max_bytes)
        out = np.empty(got_shape, dtype=got_dtype)
        self.read_into(name, fp, out)
        return out


def load_npz(path, *, max_bytes: int, error: type = NpzError) -> Dict[str, np.ndarray]:
    """Every member of the ``.npz`` file ``path`` (name -> array), in bounded memory.

    Parameters
    ----------
    path : str or os.PathLike
    max_bytes : int
        The most array bytes all members together may declare; checked
        against the zip directory before anything is read.
    error : type, default NpzError

    Raises
    ------
    NpzError (or ``error``)
        A damaged, forged or too large archive; the message names the file.
    OSError
        ``path`` cannot be opened.
    """
    path = os.fspath(path)
    with open(path, "rb") as fh, NpzArchive(path, fh, error=error) as archive:
        declared = sum(info.file_size for info in archive.infos.values())
        if declared > max_bytes:
            raise archive.error(f"its members declare {declared:,} bytes; expected at most {max_bytes:,}")
        out, left = {}, max_bytes
        for name in archive.names:
            out[name] = array = archive.read(name, max_bytes=left)
            left -= array.nbytes
        return out


def load_npy_bytes(data, *, what: str = ".npy data", max_bytes: Optional[int] = None) -> np.ndarray:
    """The plain array of one in-memory ``.npy`` blob (bytes or a buffer),
    its header checked against the blob's length before anything is allocated."""
    view = memoryview(data).cast("B")
    fp = io.BytesIO(view)
    try:
        shape, fortran, dtype, header_bytes = _read_header(fp)
    except NpzError as exc:
        raise NpzError(f"{what}: {exc}") from None
    except READ_ERRORS as exc:
        raise NpzError(f"{what}: expected an .npy header ({exc})") from None
    nbytes = math.prod(shape) * dtype.itemsize
    if not _plain(dtype) or header_bytes + nbytes != len(view) or (max_bytes is not None and nbytes > max_bytes):
        raise NpzError(f"{what}: expected a plain array filling the {len(view):,}-byte blob"
                       f"{f' of at most {max_bytes:,} bytes' if max_bytes is not None else ''}, got a header "
                       f"declaring {dtype} of shape {shape}")
    out = np.frombuffer(view, dtype=dtype, count=math.prod(shape), offset=header_bytes)
    return out.reshape(shape, order="F" if fortran else "C").copy()
