"""Minibatch files at a location every host shares.

Minibatches go to disk only where the user says every host can read and
write: a mounted path (NFS, a cluster filesystem) or a URL of any
filesystem ``fsspec`` knows (``file://``, ``hdfs://``, ``s3://``, ...;
the protocol's own package must be installed).  Each minibatch is one
``.minibatch`` file (:data:`SUFFIX`), written atomically::

    b"SPKAVGMB" | version u8 (2) | header length u32 (little endian) |
    header: JSON {"x": [{"name": "input", "dtype": "<f4", "shape": [16, 784]}, ...],
                  "y": {"dtype": "<i8", "shape": [16]}} |
    each array 64-byte aligned (zero padding before it): the inputs', in the model's order, then y's

Features are a dict of arrays by input name (one input's too), each in
its own dtype (int64 ids stay integer).  Version 1 files -- one ``x``
array, ``{"x": {"dtype", "shape"}, "y": {...}}``, written before inputs
were named -- are read with ``x`` as the input ``"input"`` (a Network's and a
TorchModel's, :data:`~sparkavg.data.validation.DEFAULT_INPUT`).

Reading it is a JSON parse and a ``frombuffer`` view per array (an ``.npz``'s
zip and header parsing would cost as much as a small network's step); dtypes come from a short whitelist and
the sizes must add up to the file's length exactly -- never pickle, and a
truncated or foreign file is an error naming it.  Without a shared
location minibatches stay in Spark as persisted blocks
(:mod:`sparkavg.spark.data`).
"""
from __future__ import annotations

import json
import logging
import os
import posixpath
import shutil
import struct
import tempfile
import uuid
from typing import Mapping, Optional, Tuple

import numpy as np

from .validation import DEFAULT_INPUT, DataValidationError

__all__ = ["SharedLocation", "save_minibatch", "load_minibatch", "is_url", "is_remote", "SUFFIX", "encode_minibatch",
           "decode_minibatch", "release_live_locations", "prefetch_depth", "sweep_stale_exports"]

logger = logging.getLogger(__name__)

#: File name suffix of a minibatch file.
SUFFIX = ".minibatch"
_MAGIC, _VERSION, _NAMED_VERSION = b"SPKAVGMB", 1, 2
_PREFIX = struct.Struct("<8sBI")
_ALIGN = 64
#: dtypes a minibatch file may hold (features, labels): plain numbers only.
_DTYPES = {np.dtype(t).str: np.dtype(t) for t in ("<f4", "<f8", "<f2", "<i8", "<i4", "<i2", "<u2", "|i1", "|u1",
                                                  "|b1")}


def is_url(location: str) -> bool:
    """Whether ``location`` names a filesystem by protocol (``scheme://...``, read through fsspec)."""
    return "://" in location


def is_remote(location: str) -> bool:
    """Whether reading ``location`` waits on a network (a URL other than ``file://``)."""
    return is_url(location) and not location.startswith("file://")



#: Temporary export folders are named ``sparkavg-export-<pid>-<random>``.
_EXPORT_PREFIX = "sparkavg-export-"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def sweep_stale_exports(folder: Optional[str] = None) -> list:
    """Remove the temporary export folders (under ``folder``, the system's
    temporary folder by default) of driver processes that no longer run;
    returns the paths removed.  A folder of a live process, or one not named
    after a process, is left alone."""
    folder = folder or tempfile.gettempdir()
    removed = []
    try:
        names = os.listdir(folder)
    except OSError:
        return removed
    for name in names:
        if not name.startswith(_EXPORT_PREFIX):
            continue
        pid = name[len(_EXPORT_PREFIX):].split("-", 1)[0]
        if not pid.isdigit() or int(pid) == os.getpid() or _alive(int(pid)):
            continue
        path = os.path.join(folder, name)
        shutil.rmtree(path, ignore_errors=True)
        if not os.path.exists(path):
            removed.append(path)
            logger.info("removed %s, the minibatch export of process %s, which ended without removing it", path, pid)
    return removed


def prefetch_depth(options) -> int:
    """Minibatches a worker loads ahead in a background thread: 1 when they
    come from a remote ``shared_dir`` (the thread waits on I/O), else 0 (a
    task owns one core; a loader thread decoding local files or Spark
    blocks would take it from the training step)."""
    return 1 if options.shared_dir is not None and is_remote(options.shared_dir) else 0

def _plain(a: np.ndarray, name: str) -> np.ndarray:
    a = np.ascontiguousarray(a)
    if a.dtype.newbyteorder("<").str not in _DTYPES:
        raise ValueError(f"Expect minibatch {name} of a plain numeric dtype ({', '.join(_DTYPES)}), got {a.dtype}")
    return a.astype(a.dtype.newbyteorder("<"), copy=False)


def encode_minibatch(x: Mapping, y: np.ndarray) -> bytes:
    """One minibatch file's bytes (the format in the module docstring;
    ``x`` a dict of arrays by input name)."""
    arrays = [(str(k), _plain(np.asarray(v), f"x[{k!r}]")) for k, v in x.items()]
    ya = _plain(np.asarray(y), "y")
    header = json.dumps({"x": [{"name": k, "dtype": a.dtype.str, "shape": list(a.shape)} for k, a in arrays],
                         "y": {"dtype": ya.dtype.str, "shape": list(ya.shape)}}, separators=(",", ":")).encode()
    parts = [_PREFIX.pack(_MAGIC, _NAMED_VERSION, len(header)), header]
    at = _PREFIX.size + len(header)
    for a in [a for _, a in arrays] + [ya]:
        pad = -at % _ALIGN
        parts += [b"\0" * pad, a.tobytes()]
        at += pad + a.nbytes
    return b"".join(parts)


def decode_minibatch(data, name: str = "minibatch") -> Tuple[dict, np.ndarray]:
    """``(x, y)`` from :func:`encode_minibatch` bytes, ``x`` a dict by input
    name (views of ``data``: pass a ``bytearray`` for writeable arrays).
    Raises ``ValueError`` naming ``name`` and what was wrong."""
    view = memoryview(data)
    if len(view) < _PREFIX.size:
        raise ValueError(f"{name}: {len(view)} bytes, shorter than a minibatch file's {_PREFIX.size}-byte prefix")
    magic, version, length = _PREFIX.unpack_from(view)
    if magic != _MAGIC or version not in (_VERSION, _NAMED_VERSION):
        raise ValueError(f"{name}: expected a sparkavg minibatch file ({_MAGIC!r} version {_VERSION} or "
                         f"{_NAMED_VERSION}), got {bytes(magic)!r} version {version}")
    start = _PREFIX.size + length
    if start > len(view):
        raise ValueError(f"{name}: header of {length} bytes runs past the file's {len(view)} bytes (truncated)")
    header = bytes(view[_PREFIX.size:start])
    if version == _NAMED_VERSION:
        return _decode_named(view, header, start, name)
    layout = _LAYOUTS.get(header)
    if layout is None:
        layout = _parse_layout(header, start, name)
        if len(_LAYOUTS) < 64:  # a fit writes one or two shapes (the last minibatch may be short)
            _LAYOUTS[header] = layout
    (x_dtype, x_shape, x_offset, x_end), (y_dtype, y_shape, y_offset, y_end) = layout
    if y_end != len(view):
        for key, (dtype, shape, _, end) in zip("xy", layout):
            if end > len(view):
                raise ValueError(f"{name}: {key} {dtype} {shape} needs bytes up to {end}, the file has "
                                 f"{len(view)} (truncated)")
        raise ValueError(f"{name}: {len(view) - y_end} bytes after the arrays (expected exactly {y_end})")
    x = np.frombuffer(view, x_dtype, (x_end - x_offset) // x_dtype.itemsize, x_offset).reshape(x_shape)
    y = np.frombuffer(view, y_dtype, (y_end - y_offset) // y_dtype.itemsize, y_offset).reshape(y_shape)
    return {DEFAULT_INPUT: x}, y


#: Parsed headers (bytes -> array layouts): every minibatch of a fit has
#: one of a few headers, and parsing JSON cold after a training step costs
#: ~0.1 ms -- as much as reading the file.
_LAYOUTS: dict = {}


def _entry(entry, key: str, name: str):
    """``(dtype, shape)`` of a header entry, or a ValueError naming it."""
    dtype = _DTYPES.get(entry.get("dtype")) if isinstance(entry, dict) else None
    shape = entry.get("shape") if isinstance(entry, dict) else None
    if dtype is None or not isinstance(shape, list) or \
            not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise ValueError(f"{name}: expected {key!r} with a dtype of {sorted(_DTYPES)} and a shape of "
                         f"non-negative ints, got {entry!r}")
    return dtype, tuple(shape)


def _decode_named(view, header: bytes, start: int, name: str):
    """``({input: array}, y)`` of a version-2 file."""
    key = (_NAMED_VERSION, header)
    layout = _LAYOUTS.get(key)
    if layout is None:
        try:
            parsed = json.loads(header)
        except ValueError as exc:
            raise ValueError(f"{name}: header is not JSON ({exc})") from None
        xs = parsed.get("x") if isinstance(parsed, dict) else None
        if not isinstance(xs, list) or not xs or not all(isinstance(e, dict) and isinstance(e.get("name"), str)
                                                         for e in xs):
            raise ValueError(f"{name}: expected 'x' as a non-empty list of named arrays, got {xs!r:.200}")
        entries = [(e["name"], *_entry(e, f"x[{e['name']!r}]", name)) for e in xs]
        entries.append((None, *_entry(parsed.get("y"), "y", name)))
        at, layout = start, []
        for key_name, dtype, shape in entries:
            at += -at % _ALIGN
            end = at + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            layout.append((key_name, dtype, shape, at, end))
            at = end
        layout = tuple(layout)
        if len(_LAYOUTS) < 64:
            _LAYOUTS[key] = layout
    end = layout[-1][4]
    if end != len(view):
        raise ValueError(f"{name}: expected exactly {end} bytes for its arrays, the file has {len(view)}"
                         + (" (truncated)" if end > len(view) else ""))
    arrays = [np.frombuffer(view, dtype, (e - o) // dtype.itemsize, o).reshape(shape)
              for _, dtype, shape, o, e in layout]
    return {k: a for (k, *_), a in zip(layout[:-1], arrays)}, arrays[-1]


def _parse_layout(header: bytes, start: int, name: str):
    """``((dtype, shape, offset, end) for x, y)`` of a header ending at ``start``."""
    try:
        parsed = json.loads(header)
    except ValueError as exc:
        raise ValueError(f"{name}: header is not JSON ({exc})") from None
    offset = start + (-start % _ALIGN)
    layout = []
    for key in "xy":
        dtype, shape = _entry(parsed.get(key) if isinstance(parsed, dict) else None, key, name)
        end = offset + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        layout.append((dtype, shape, offset, end))
        offset = end
    return tuple(layout)


def save_minibatch(location: str, x, y: np.ndarray) -> None:
    """Write one minibatch to ``location`` (a path or URL), atomically where the
    filesystem allows (tmp + rename)."""
    data = encode_minibatch(x, y)
    if is_url(location):
        import fsspec

        with fsspec.open(location, "wb") as fh:  # object stores publish on close: atomic
            fh.write(data)
        return
    path = location
    tmp = f"{path}.{uuid.uuid4().hex[:8]}.tmp"
    with open(tmp, "wb") as fh:
        fh.write(data)
    os.replace(tmp, path)


def load_minibatch(location: str) -> Tuple[dict, np.ndarray]:
    """Read a minibatch written by :func:`save_minibatch` (never unpickles)."""
    try:
        if is_url(location):
            import fsspec

            with fsspec.open(location, "rb") as fh:
                data = bytearray(fh.read())
        else:
            data = _read_local(location)
        return decode_minibatch(data, location)
    except Exception as exc:
        raise DataValidationError(
            f"Cannot read minibatch {location}: {type(exc).__name__}: {exc}. Expected a {SUFFIX} file written "
            "by sparkavg at a location every host can read (DataOptions.shared_dir)") from exc


def _read_local(path: str) -> bytearray:
    """A local file's bytes, through the bare file descriptor: a Python file
    object costs ~25 us of a ~90 us read after a training step."""
    fd = os.open(path, os.O_RDONLY)
    try:
        data = bytearray(os.fstat(fd).st_size)
        view, got = memoryview(data), 0
        while got < len(data):
            n = os.readv(fd, [view[got:]])
            if n == 0:
                raise ValueError(f"read {got} of {len(data)} bytes (the file shrank while being read)")
            got += n
    finally:
        os.close(fd)
    return data


class SharedLocation:
    """A folder of one fit's minibatch files under a shared location.

    Parameters
    ----------
    root : str
        Shared path or URL; this fit writes into a fresh subfolder of it.
    owned : bool
        Remove the whole ``root`` on :meth:`release` (a temporary folder
        the trainer created) rather than only the subfolder.
    """

    def __init__(self, root: str, owned: bool = False):
        self.root, self.owned = root, owned
        self.folder = posixpath.join(root.rstrip("/"), f"sparkavg-{uuid.uuid4().hex[:12]}")
        self._made = False

    @classmethod
    def temporary(cls) -> "SharedLocation":
        """A temporary folder on this machine (shared only with local-mode
        executors), named after this process; the folders of processes that
        ended without removing theirs (a driver killed mid-fit) are swept first."""
        sweep_stale_exports()
        return cls(tempfile.mkdtemp(prefix=f"{_EXPORT_PREFIX}{os.getpid()}-"), owned=True)

    def make(self) -> str:
        _LIVE.add(self)
        if is_url(self.folder):
            import fsspec

            fs, path = fsspec.core.url_to_fs(self.folder)
            fs.makedirs(path, exist_ok=True)
        else:
            os.makedirs(self.folder, exist_ok=True)
        self._made = True
        return self.folder

    def release(self) -> None:
        """Remove what this fit wrote (idempotent, never raises)."""
        _LIVE.discard(self)
        target = self.root if self.owned else self.folder
        try:
            if is_url(target):
                import fsspec

                fs, path = fsspec.core.url_to_fs(target)
                if fs.exists(path):
                    fs.rm(path, recursive=True)
            else:
                import shutil

                shutil.rmtree(target, ignore_errors=True)
        except Exception:  # cleanup must not hide the error that got us here
            pass


#: Every location made and not yet released in this process (what a SIGTERM removes).
_LIVE: "set[SharedLocation]" = set()


def release_live_locations() -> None:
    """Release every location this process made and has not released
    (:mod:`sparkavg.spark.termination`: the process is about to end)."""
    for location in list(_LIVE):
        location.release()
