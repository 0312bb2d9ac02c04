"""Model files: an .npz archive, never pickle.

Members (all plain numeric arrays):

===================  =========  ===============================================
name                 dtype      content
===================  =========  ===============================================
``config``           uint8      the network's JSON configuration (UTF-8)
``params``           float32/64 the flat parameter vector
``updater_state``    float32/64 the flat updater state
``counters``         int64      [iteration, epoch]
``sha256``           uint8      SHA-256 over a tag, the config bytes and each
                                array's dtype, shape and bytes
===================  =========  ===============================================

Loading reads with ``allow_pickle=False``, rebuilds the network from the
config, checks every array's dtype and shape against it and verifies the
digest; anything wrong raises :class:`ModelFileError` naming the file and
the problem.  The digest detects corruption and accidental edits, not a
forger (who could recompute it).
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
import zipfile
import zlib

import numpy as np

from .. import backend

__all__ = ["ModelFileError", "save_network", "load_network", "FILE_TAG"]

FILE_TAG = b"sparkavg.nn model v1"
_MEMBERS = ("config", "params", "updater_state", "counters", "sha256")


class ModelFileError(ValueError):
    """A model file that cannot be trusted or read; the message names the
    file and what was wrong."""


def _digest(config_bytes: bytes, arrays) -> np.ndarray:
    h = hashlib.sha256(FILE_TAG)
    h.update(len(config_bytes).to_bytes(8, "little"))
    h.update(config_bytes)
    for a in arrays:
        meta = f"{a.dtype.str}{a.shape}".encode()
        h.update(len(meta).to_bytes(8, "little"))
        h.update(meta)
        h.update(np.ascontiguousarray(a).tobytes())
    return np.frombuffer(h.digest(), dtype=np.uint8)


def save_network(network, path) -> None:
    """Write ``network`` to ``path`` exactly (no '.npz' appended), atomically
    (a temporary file in the same folder, then a rename)."""
    path = os.fspath(path)
    config = network.to_json().encode("utf-8")
    params = backend.to_cpu(network.params)  # device -> host sync on GPU
    state = backend.to_cpu(network.updater_state)
    counters = np.array([network.iteration, network.epoch], dtype=np.int64)
    arrays = {
        "config": np.frombuffer(config, dtype=np.uint8),
        "params": params,
        "updater_state": state,
        "counters": counters,
        "sha256": _digest(config, (params, state, counters)),
    }
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".sparkavg-model-", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as fh:
            np.savez(fh, **arrays)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _read_members(path):
    """Every expected member as a numpy array, or ModelFileError."""
    try:
        archive = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:
        raise ModelFileError(f"{path}: not a readable .npz model archive ({exc})") from None
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise ModelFileError(f"{path}: holds a single array, not an .npz model archive")
    with archive:
        names = set(archive.files)
        missing = [m for m in _MEMBERS if m not in names]
        extra = sorted(names - set(_MEMBERS))
        if missing or extra:
            raise ModelFileError(f"{path}: expected members {list(_MEMBERS)}, missing {missing}, "
                                 f"unexpected {extra}")
        members = {}
        for name in _MEMBERS:
            try:
                members[name] = archive[name]
            except ValueError as exc:
                if "allow_pickle" in str(exc) or "Object arrays" in str(exc):
                    raise ModelFileError(f"{path}: member {name!r} is a pickled object array; "
                                         f"refusing to unpickle a model file") from None
                raise ModelFileError(f"{path}: member {name!r} is unreadable ({exc})") from None
            except (OSError, EOFError, zipfile.BadZipFile, zlib.error) as exc:
                raise ModelFileError(f"{path}: member {name!r} is truncated or corrupt ({exc})") from None
    return members


def _expect(path, name, array, dtype, shape):
    if array.dtype != np.dtype(dtype) or array.shape != shape:
        raise ModelFileError(f"{path}: {name} should be {np.dtype(dtype)} of shape {shape} for "
                             f"this configuration, got {array.dtype} of shape {array.shape}")


def load_network(path):
    """Read, verify and rebuild a network written by :func:`save_network`."""
    from ..configurable import from_config
    from .network import Network, upgrade_config

    path = os.fspath(path)
    m = _read_members(path)
    if m["config"].dtype != np.uint8 or m["config"].ndim != 1:
        raise ModelFileError(f"{path}: config should be a 1-D uint8 array, got {m['config'].dtype} "
                             f"of shape {m['config'].shape}")
    _expect(path, "sha256", m["sha256"], np.uint8, (32,))
    _expect(path, "counters", m["counters"], np.int64, (2,))
    config_bytes = m["config"].tobytes()
    # The digest first: a corrupted config should be reported as corruption.
    digest = _digest(config_bytes, (m["params"], m["updater_state"], m["counters"]))
    if not np.array_equal(digest, m["sha256"]):
        raise ModelFileError(f"{path}: SHA-256 mismatch: the file was modified or corrupted "
                             f"after it was saved")
    try:
        config = upgrade_config(json.loads(config_bytes.decode("utf-8")))
        network = from_config(config, kind="network", expect=Network)
    except (UnicodeDecodeError, json.JSONDecodeError, ValueError) as exc:
        raise ModelFileError(f"{path}: invalid network configuration ({exc})") from None
    _expect(path, "params", m["params"], network.dtype, (network.num_params,))
    _expect(path, "updater_state", m["updater_state"], network.dtype, network.updater_state.shape)
    iteration, epoch = (int(v) for v in m["counters"])
    if iteration < 0 or epoch < 0:
        raise ModelFileError(f"{path}: counters should be >= 0, got iteration={iteration}, epoch={epoch}")
    network.params = m["params"]
    network.updater_state = m["updater_state"]
    network.iteration, network.epoch = iteration, epoch
    return network
