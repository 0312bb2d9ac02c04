"""Model files: an .npz archive, never pickle, read in bounded memory.

Members (all plain numeric ``.npy`` arrays, stored uncompressed):

===================  =========  ===============================================
name                 dtype      content
===================  =========  ===============================================
``config``           uint8      the network's JSON configuration (UTF-8),
                                :meth:`Network.to_config` (or the version-1
                                layout, which still loads)
``params``           float32/64 the flat parameter vector
``updater_state``    float32/64 the flat updater state
``buffers``          float32/64 the flat non-trainable state (BatchNorm's
                                running statistics); absent in files written
                                before models had buffers, which load when
                                the configuration has none
``counters``         int64      [iteration, epoch]
``sha256``           uint8      SHA-256 over a tag, the config bytes and each
                                array's dtype, shape and bytes
===================  =========  ===============================================

Loading trusts nothing it has not checked, in this order, so that a hostile
file costs little memory or time before it is refused, and no code it names
runs unless you allowed it:

1. the zip directory: exactly the members above, each stored or deflated
   (not encrypted, no other method), deflated ones expanding at most
   :data:`MAX_COMPRESSION_RATIO` times, each inside the file (the rules of
   :mod:`sparkavg.npzfile`, the one reader of every npz sparkavg opens);
2. the small members (config at most :data:`MAX_CONFIG_BYTES`, counters,
   digest), each by its ``.npy`` header and declared size first;
3. the ``.npy`` headers of ``params``, ``updater_state`` and ``buffers``
   (1-D float32/float64, no object dtype) and the zip entries' declared
   sizes: at most ``max_params`` (:data:`MAX_PARAMS` by default);
4. the digest, streamed over the file's bytes in 1 MiB chunks (nothing
   kept) -- so far nothing the configuration names is imported;
5. the JSON configuration, rebuilt as far as the sizes it implies
   (``planned_sizes`` of the model class the config names; a torch module
   is built on torch's ``meta`` device, without memory), which must equal
   the declared sizes.  A torch factory or loss the configuration names is
   imported and called only if it is marked (``@sparkavg.torch.factory``,
   ``@sparkavg.loss``) or trusted by the caller (``trusted=``); a name in
   Python's standard library is refused without an import
   (:mod:`sparkavg.references`);
6. then the network is built and the arrays streamed into it in 1 MiB
   chunks, hashed again; a mismatch discards it.

Anything wrong raises :class:`ModelFileError` (a ``ValueError``) naming the
file and what was expected.  A missing or unreadable path raises the usual
``OSError``.  The digest detects corruption and accidental edits, not a
forger (who could recompute it); the checks above are what bound a forger.
Non-finite parameters load (a diverged network is still what was saved)
with a warning.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile

import numpy as np

from .. import backend
from ..configurable import checked_arguments
from ..npzfile import MAX_COMPRESSION_RATIO, NpzArchive
from ..references import UntrustedReference, trusting

__all__ = ["ModelFileError", "save_network", "load_network", "FILE_TAG", "MAX_PARAMS", "MAX_CONFIG_BYTES",
           "MAX_COMPRESSION_RATIO"]

logger = logging.getLogger(__name__)

FILE_TAG = b"sparkavg.nn model v1"

#: Default ``max_params`` of :func:`load_network`: 2**29 parameters (2 GiB of float32).
MAX_PARAMS = 2**31 // 4
#: Most updater state vectors of ``num_params`` a file may declare per parameter (torch's
#: Adam with ``amsgrad`` or a centred RMSprop with momentum keep 3).
MAX_UPDATER_SLOTS = 4
#: Largest JSON configuration a model file may hold.
MAX_CONFIG_BYTES = 1 << 20
_MEMBERS = ("config", "params", "updater_state", "counters", "sha256")
#: Members a file may lack (written before they existed).
_OPTIONAL = ("buffers",)
#: State vectors in file order: (member name, name in ``model.state``).
_VECTORS = (("params", "params"), ("updater_state", "updater"), ("buffers", "buffers"))
_CHUNK = 1 << 20


class ModelFileError(ValueError):
    """A model file that cannot be trusted or read; the message names the
    file and what was expected."""


# ------------------------------------------------------------------ digest
def _digest_start(config_bytes: bytes):
    h = hashlib.sha256(FILE_TAG)
    h.update(len(config_bytes).to_bytes(8, "little"))
    h.update(config_bytes)
    return h


def _digest_meta(h, dtype, shape) -> None:
    meta = f"{np.dtype(dtype).str}{tuple(shape)}".encode()
    h.update(len(meta).to_bytes(8, "little"))
    h.update(meta)


def _digest(config_bytes: bytes, arrays) -> np.ndarray:
    """SHA-256 over the tag, the config and each array's dtype, shape and bytes, as (32,) uint8."""
    h = _digest_start(config_bytes)
    for a in arrays:
        _digest_meta(h, a.dtype, a.shape)
        h.update(np.ascontiguousarray(a).tobytes())
    return np.frombuffer(h.digest(), dtype=np.uint8)


# ------------------------------------------------------------------- write
def save_network(network, path) -> None:
    """Write a model (:class:`~sparkavg.nn.model.Model`) to ``path`` exactly
    (no '.npz' appended), atomically (a temporary file in the same folder,
    then a rename)."""
    path = os.fspath(path)
    config = network.to_json().encode("utf-8")
    state = network.state
    vectors = [backend.to_cpu(state[key]) for _, key in _VECTORS]  # device -> host syncs on GPU
    counters = np.array([network.iteration, network.epoch], dtype=np.int64)
    arrays = {"config": np.frombuffer(config, dtype=np.uint8)}
    arrays.update({member: v for (member, _), v in zip(_VECTORS, vectors)})
    arrays["counters"] = counters
    arrays["sha256"] = _digest(config, (*vectors, counters))
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


# -------------------------------------------------------------------- read
class _Archive(NpzArchive):
    """The checked zip directory of one model file (:mod:`sparkavg.npzfile`'s
    one bounded reader); every error is a :class:`ModelFileError` naming the file."""

    expectation = " for this configuration"

    def __init__(self, path: str, fh):
        super().__init__(path, fh, members=_MEMBERS, optional=_OPTIONAL, error=ModelFileError,
                         what="an .npz model archive")


def _declared(archive: _Archive, max_params: int):
    """``({state key: length}, dtype)`` of the state vectors as the file's
    ``.npy`` headers declare them, bounded by ``max_params`` -- read before
    the configuration is looked at."""
    limits = {"params": max_params, "updater": MAX_UPDATER_SLOTS * max_params, "buffers": max_params}
    sizes, dtypes = {}, set()
    for member, key in _VECTORS:
        if member not in archive.infos:
            continue
        # no byte bound here (the entry's own size must match its header and lie inside the file): the
        # length is checked below, with a message in parameters
        fp, shape, dtype = archive.open_plain(member, 1 << 62)
        fp.close()
        if len(shape) != 1 or dtype not in (np.dtype(np.float32), np.dtype(np.float64)):
            raise archive.error(f"{member} should be a 1-D float32 or float64 vector, got {dtype} of shape {shape}")
        if shape[0] > limits[key]:
            raise archive.error(f"the file declares {shape[0]:,} values in {member!r}, more than "
                                f"{limits[key]:,} (max_params={max_params:,}); pass a larger max_params to load a "
                                f"trusted file this large")
        sizes[key] = int(shape[0])
        dtypes.add(dtype)
    if "params" not in sizes or "updater" not in sizes:
        raise archive.error("expected members 'params' and 'updater_state'")
    if len(dtypes) != 1:
        raise archive.error(f"expected one dtype for every state vector, got {sorted(map(str, dtypes))}")
    return sizes, dtypes.pop()


def _check_digest(archive: _Archive, config_bytes: bytes, counters, expected, dtype, sizes) -> None:
    """The SHA-256 over the config and every vector, streamed from the file
    (nothing kept), against the stored one -- before the configuration
    builds anything."""
    digest = _digest_start(config_bytes)
    for member, key in _VECTORS:
        if key not in sizes:
            continue
        fp, _ = archive.open(member, dtype, shape=(sizes[key],))
        _digest_meta(digest, dtype, (sizes[key],))
        archive.hash_member(member, fp, sizes[key] * dtype.itemsize, digest)
    _digest_meta(digest, counters.dtype, counters.shape)
    digest.update(counters.tobytes())
    if digest.digest() != expected.tobytes():
        raise archive.error("SHA-256 mismatch: expected the digest stored in the file; the file was modified or "
                            "corrupted after it was saved")


def _network_plan(archive: _Archive, config_bytes: bytes, max_params: int, network_cls, upgrade):
    """The model class, its checked arguments and state sizes, from the
    config member -- no state vector allocated yet (a torch module is
    counted on torch's meta device).  ``network_cls`` (the caller's class,
    or None for any registered model) says what a config must build;
    ``upgrade`` (else the model class's ``upgrade_config``, if any), the
    model class's ``DTYPES`` and ``planned_sizes`` do the rest.  Code the
    config names is checked by :mod:`sparkavg.references` (marked or
    trusted) before it is called."""
    if upgrade is None:
        upgrade = getattr(network_cls, "upgrade_config", None)
    try:
        config = json.loads(config_bytes.decode("utf-8"))
        if upgrade is not None:
            config = upgrade(config)
        cls, args = checked_arguments(config, kind="network", expect=network_cls)
        sizes = cls.planned_sizes(args)
        num_params, state_size, num_buffers = sizes["params"], sizes["updater"], sizes["buffers"]
    except UntrustedReference as exc:
        raise archive.error(str(exc)) from None
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:  # ConfigError and JSONDecodeError included
        raise archive.error(f"expected a valid network configuration in member 'config' ({exc})") from None
    _DTYPES = getattr(cls, "DTYPES", ("float32",))
    dtype = args.get("dtype", "float32")
    if dtype not in _DTYPES:
        raise archive.error(f"expected a network dtype in {_DTYPES}, got {dtype!r:.50}")
    if num_params > max_params:
        raise archive.error(f"the configuration has {num_params:,} parameters, more than max_params="
                            f"{max_params:,}; pass a larger max_params to load a trusted file this large")
    if state_size > MAX_UPDATER_SLOTS * max_params:
        raise archive.error(f"the configuration's updater state has {state_size:,} values, more than "
                            f"{MAX_UPDATER_SLOTS} * max_params = {MAX_UPDATER_SLOTS * max_params:,}")
    if num_buffers > max_params:
        raise archive.error(f"the configuration has {num_buffers:,} buffer values, more than max_params="
                            f"{max_params:,}")
    return cls, args, {"params": num_params, "updater": state_size, "buffers": num_buffers}, np.dtype(dtype)


def load_network(path, network_cls, *, max_params: int | None = None, trusted=None, upgrade=None):
    """Read, verify and rebuild a network written by :func:`save_network`
    (what :meth:`Network.load <sparkavg.nn.network.Network.load>` calls).

    Parameters
    ----------
    path : str or os.PathLike
    network_cls : type or None
        The model class configs must build (a subclass is fine), or None for
        any registered model (:func:`sparkavg.nn.load_model`).
    max_params : int, optional
        Refuse configurations with more parameters (default :data:`MAX_PARAMS`).
    trusted : collection of str, True or None
        Code the file names (a torch factory or loss) that may be called
        besides marked functions (:mod:`sparkavg.references`); ``True``
        trusts every name in the file.
    upgrade : callable, optional
        Called with the parsed configuration once the digest has been
        checked, returns it in this version's layout
        (:func:`sparkavg.nn.load_model`'s also imports the module of an
        optional model type); default: ``network_cls.upgrade_config`` where
        the class has one.

    Returns
    -------
    Network
        On the CPU, with the saved parameters, updater state and counters.

    Raises
    ------
    ModelFileError
        The file is not a model file this library wrote, or was altered,
        truncated, is larger than allowed, or names code that is neither
        marked nor trusted; the message names the file.
    OSError
        ``path`` cannot be opened.
    """
    path = os.fspath(path)
    if max_params is None:
        max_params = MAX_PARAMS
    if isinstance(max_params, bool) or not isinstance(max_params, (int, np.integer)) or max_params < 1:
        raise ValueError(f"Expect max_params as an int >= 1, got {max_params!r}")
    max_params = int(max_params)
    with trusting(trusted), open(path, "rb") as fh:
        archive = _Archive(path, fh)
        with archive.zip:
            config = archive.read_small("config", np.uint8, max_length=MAX_CONFIG_BYTES)
            counters = archive.read_small("counters", np.int64, shape=(2,))
            expected_digest = archive.read_small("sha256", np.uint8, shape=(32,))
            config_bytes = config.tobytes()
            # What the file declares, then its digest, before the configuration imports or builds anything.
            declared, declared_dtype = _declared(archive, max_params)
            _check_digest(archive, config_bytes, counters, expected_digest, declared_dtype, declared)
            cls, args, sizes, dtype = _network_plan(archive, config_bytes, max_params, network_cls, upgrade)
            if "buffers" not in declared and sizes["buffers"]:
                raise archive.error(f"expected a member 'buffers' of {sizes['buffers']:,} values for this "
                                    f"configuration (a file written before models had buffers cannot hold them)")
            for member, key in _VECTORS:
                if key in declared and (declared[key] != sizes[key] or declared_dtype != dtype):
                    raise archive.error(f"{member} should be {dtype} of shape ({sizes[key]},) for this "
                                        f"configuration, got {declared_dtype} of shape ({declared[key]},)")
            try:
                network = cls(**args)
            except ValueError as exc:
                raise archive.error(f"expected a valid network configuration in member 'config' ({exc})") from None
            digest = _digest_start(config_bytes)
            state = network.state
            for member, key in _VECTORS:
                if key not in declared:
                    continue
                target = state[key]
                fp, _ = archive.open(member, dtype, shape=target.shape)
                _digest_meta(digest, target.dtype, target.shape)
                archive.read_into(member, fp, target, digest)
    _digest_meta(digest, counters.dtype, counters.shape)
    digest.update(counters.tobytes())
    if digest.digest() != expected_digest.tobytes():  # the file changed while it was read
        raise ModelFileError(f"{path}: SHA-256 mismatch: expected the digest stored in the file; the file was "
                             f"modified while it was read")
    iteration, epoch = (int(v) for v in counters)
    if iteration < 0 or epoch < 0:
        raise ModelFileError(f"{path}: counters should be >= 0, got iteration={iteration}, epoch={epoch}")
    network.iteration, network.epoch = iteration, epoch
    params = network.params
    bad = sum(int(params[i:i + _CHUNK].size - np.count_nonzero(np.isfinite(params[i:i + _CHUNK])))
              for i in range(0, params.size, _CHUNK))
    if bad:
        logger.warning("%s: %d of %d parameters are not finite (loaded as saved)", path, bad, network.num_params)
    return network
