"""Minibatch files at a location every host shares.

Minibatches go to disk only where the user says every host can read and
write: a mounted path (NFS, a cluster filesystem) or a URL of any
filesystem ``fsspec`` knows (``file://``, ``hdfs://``, ``s3://``, ...;
the protocol's own package must be installed).  Each minibatch is one
uncompressed ``.npz`` (``x``, ``y``) written atomically and read with
``allow_pickle=False``.  Without a shared location minibatches stay in
Spark as persisted blocks (:mod:`sparkavg.spark.data`).
"""
from __future__ import annotations

import io
import os
import posixpath
import tempfile
import uuid
from typing import Tuple

import numpy as np

from ..data.validation import DataValidationError

__all__ = ["SharedLocation", "save_minibatch", "load_minibatch", "is_url"]


def is_url(location: str) -> bool:
    """Whether ``location`` names a filesystem by protocol (``scheme://...``, read through fsspec)."""
    return "://" in location


def save_minibatch(location: str, x: np.ndarray, y: np.ndarray) -> None:
    """Write one minibatch to ``location`` (a path or URL), atomically where the
    filesystem allows (tmp + rename)."""
    buf = io.BytesIO()
    np.savez(buf, x=x, y=y)
    data = buf.getvalue()
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


def load_minibatch(location: str) -> Tuple[np.ndarray, np.ndarray]:
    """Read a minibatch written by :func:`save_minibatch` (never unpickles)."""
    try:
        if is_url(location):
            import fsspec

            with fsspec.open(location, "rb") as fh:
                data = fh.read()
            source = io.BytesIO(data)
        else:
            source = location
        with np.load(source, allow_pickle=False) as z:
            return z["x"], z["y"]
    except Exception as exc:
        raise DataValidationError(
            f"Cannot read minibatch {location}: {type(exc).__name__}: {exc}. Expected an .npz written by "
            "sparkavg at a location every host can read (DataOptions.shared_dir)") from exc


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
        """A temporary folder on this machine (shared only with local-mode executors)."""
        return cls(tempfile.mkdtemp(prefix="sparkavg-export-"), owned=True)

    def make(self) -> str:
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
