"""Saving and loading :mod:`sparkavg.ml` stages: npz + JSON, never pickle.

A saved stage is a folder:

- ``metadata/`` -- pyspark's own ``DefaultParamsWriter`` metadata (class,
  uid, the plain params), written through Spark, so that
  ``Pipeline``/``PipelineModel`` save and load find the stage and its
  class as they do for pyspark's Python stages;
- ``network.npz`` -- ``model.save`` (any :class:`sparkavg.nn.Model`) (parameters,
  updater state, counters, JSON configuration, SHA-256);
- ``sparkavg.json`` -- what is neither: the estimator's master
  (``Master.to_config()``, rebuilt by ``from_config``) and early stopping
  (``EarlyStopping.to_config()``), or the model's training history and
  best epoch, and the network's fingerprint
  (:meth:`sparkavg.nn.Model.fingerprint`), compared on load: a
  ``network.npz`` swapped for another architecture's is refused.

The metadata goes where Spark writes; the other two files are written by
the driver (this Python process): ``path`` must name a place both reach --
a local path with a local master, or a URL of a shared filesystem that
``fsspec`` knows (``s3://``, ``hdfs://`` ...).
"""
from __future__ import annotations

import json
import os
import posixpath
import shutil
import tempfile

from pyspark.ml.util import DefaultParamsReader, DefaultParamsWriter, MLReader, MLWriter

from ..jsonfile import MAX_JSON_BYTES, parse_json

__all__ = ["NetworkWriter", "NetworkReader", "FORMAT"]

FORMAT = "sparkavg.ml/1"
_NETWORK = "network.npz"
_EXTRA = "sparkavg.json"
#: Params that are objects, saved as files rather than in pyspark's metadata.
_OBJECT_PARAMS = ("network", "master", "earlyStopping")


def _is_url(path: str) -> bool:
    return "://" in path and not path.startswith("file:")


def _local(path: str) -> str:
    if path.startswith("file://"):
        return path[len("file://"):]
    if path.startswith("file:"):
        return path[len("file:"):]
    return path


def _fs(path: str):
    import fsspec

    return fsspec.core.url_to_fs(path)


def _exists(path: str) -> bool:
    if _is_url(path):
        fs, p = _fs(path)
        return fs.exists(p)
    return os.path.exists(_local(path))


def _remove(path: str) -> None:
    if _is_url(path):
        fs, p = _fs(path)
        if fs.exists(p):
            fs.rm(p, recursive=True)
    else:
        shutil.rmtree(_local(path), ignore_errors=True)


def _write_bytes(path: str, data: bytes) -> None:
    if _is_url(path):
        fs, p = _fs(path)
        fs.makedirs(posixpath.dirname(p), exist_ok=True)
        with fs.open(p, "wb") as fh:
            fh.write(data)
        return
    path = _local(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as fh:
        fh.write(data)


def _read_bytes(path: str, limit: int = -1) -> bytes:
    """The file's bytes (at most ``limit`` of them when >= 0)."""
    if _is_url(path):
        fs, p = _fs(path)
        with fs.open(p, "rb") as fh:
            return fh.read(limit)
    with open(_local(path), "rb") as fh:
        return fh.read(limit)


def _save_network(network, path: str) -> None:
    if not _is_url(path):
        os.makedirs(os.path.dirname(_local(path)), exist_ok=True)
        network.save(_local(path))
        return
    with tempfile.TemporaryDirectory(prefix="sparkavg-model-") as tmp:
        local = os.path.join(tmp, _NETWORK)
        network.save(local)
        with open(local, "rb") as fh:
            _write_bytes(path, fh.read())


def _load_network(path: str):
    from ..nn import load_model

    if not _is_url(path):
        return load_model(_local(path))
    with tempfile.TemporaryDirectory(prefix="sparkavg-model-") as tmp:
        local = os.path.join(tmp, _NETWORK)
        with open(local, "wb") as fh:
            fh.write(_read_bytes(path))
        return load_model(local)


def _join(path: str, name: str) -> str:
    return posixpath.join(path.rstrip("/"), name) if _is_url(path) else os.path.join(path, name)


class NetworkWriter(MLWriter):
    """Writes a :class:`NetworkEstimator` or :class:`NetworkModel` (see the module docstring)."""

    def __init__(self, instance):
        super().__init__()
        self.instance = instance

    def _handleOverwrite(self, path: str) -> None:
        # The driver removes the folder (it writes there too) on either flavour:
        # pyspark's own helper needs a JVM in this process, which Connect has not.
        _remove(path)

    def save(self, path: str) -> None:
        if not isinstance(path, str):
            raise TypeError(f"Expect a path (str), got {type(path).__name__}")
        if not self.shouldOverwrite and _exists(path):
            raise FileExistsError(f"Expect a path that does not exist yet (or write().overwrite()), got existing "
                                  f"{path}")
        super().save(path)

    def saveImpl(self, path: str) -> None:
        from ..nn import Model

        instance = self.instance
        params = {p.name: v for p, v in instance._paramMap.items() if p.name not in _OBJECT_PARAMS and v is not None}
        DefaultParamsWriter.saveMetadata(instance, path, self.sparkSession, extraMetadata={"sparkavg": FORMAT},
                                         paramMap=params)
        extra = {"format": FORMAT, "class": type(instance).__name__}
        if hasattr(instance, "getMaster"):  # the estimator
            network = instance.getOrDefault(instance.network) if instance.isDefined(instance.network) else None
            extra["master"] = instance.getMaster().to_config()
            if instance.getEarlyStopping() is not None:  # estimators saved before it stay equal
                extra["early_stopping"] = instance.getEarlyStopping().to_config()
        else:
            network = instance.network
            extra["history"] = instance.history
            if getattr(instance, "best_epoch", None) is not None:
                extra["best_epoch"] = instance.best_epoch
            if getattr(instance, "input_encoding", None) is not None:  # models saved before it stay equal
                extra["input_encoding"] = instance.input_encoding
        extra["network"] = _NETWORK if isinstance(network, Model) else None
        if isinstance(network, Model):  # checked on load: a swapped network file is refused
            extra["fingerprint"] = network.fingerprint()
        if network is not None:
            _save_network(network, _join(path, _NETWORK))
        _write_bytes(_join(path, _EXTRA), json.dumps(extra, indent=1, default=_plain).encode())


def _plain(value):
    """JSON for numpy scalars in a history entry."""
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"Expect JSON values in a model's history, got {type(value).__name__}")


_EXTRA_FIELDS = {"history": (list, "a list of per-epoch summaries"),
                 "master": (dict, "a master configuration (a JSON object)"),
                 "network": ((str, type(None)), f"the name {_NETWORK!r} or null"),
                 "fingerprint": (str, "the network's fingerprint (a str)"),
                 "early_stopping": (dict, "an EarlyStopping configuration (a JSON object)"),
                 "best_epoch": (int, "the fit's best epoch (an int)")}


def _read_extra(name: str) -> dict:
    """``sparkavg.json`` read in bounded memory, its fields' types checked;
    a ``ValueError`` naming the file otherwise."""
    extra = parse_json(_read_bytes(name, MAX_JSON_BYTES + 1), name)
    for key, (kind, want) in _EXTRA_FIELDS.items():
        if key in extra and not isinstance(extra[key], kind):
            raise ValueError(f"{name}: expected {key!r} as {want}, got {type(extra[key]).__name__} "
                             f"{extra[key]!r:.80}")
    return extra


def _early_stopping(config: dict, name: str):
    from ..configurable import from_config
    from ..fitting.early_stopping import EarlyStopping

    try:
        return from_config(config, kind="early_stopping", expect=EarlyStopping)
    except ValueError as exc:  # ConfigError is a ValueError
        raise ValueError(f"{name}: its early stopping: {exc}") from exc


class NetworkReader(MLReader):
    """Reads what :class:`NetworkWriter` wrote, as ``cls``."""

    def __init__(self, cls):
        super().__init__()
        self.cls = cls

    def load(self, path: str):
        from ..spark.masters import master_from_config
        from ..data.transforms import check_encoding_dict

        metadata = DefaultParamsReader.loadMetadata(path, self.sparkSession)
        expected = f"{self.cls.__module__}.{self.cls.__name__}"
        if metadata.get("class") != expected:
            raise ValueError(f"Expect a saved {expected} at {path}, got {metadata.get('class')!r}")
        extra = _read_extra(_join(path, _EXTRA))
        if extra.get("format") != FORMAT:
            raise ValueError(f"Expect {_EXTRA} of format {FORMAT!r} at {path}, got {extra.get('format')!r}")
        instance = self.cls()
        instance._resetUid(metadata["uid"])
        DefaultParamsReader.getAndSetParams(instance, metadata)
        network = _load_network(_join(path, _NETWORK)) if extra.get("network") else None
        recorded = extra.get("fingerprint")
        if network is not None and recorded is not None and network.fingerprint() != recorded:
            raise ValueError(f"{_join(path, _NETWORK)} holds a model of fingerprint {network.fingerprint()}, but "
                             f"{_join(path, _EXTRA)} records {recorded}: the file was replaced by another "
                             "architecture's (save the stage again rather than swapping its network file)")
        if "master" in extra:
            try:
                master = master_from_config(extra["master"])
            except (ValueError, TypeError) as exc:  # ConfigError is a ValueError
                raise ValueError(f"{_join(path, _EXTRA)}: its master: {exc}") from exc
            instance._set(master=master)
            if "early_stopping" in extra:
                instance._set(earlyStopping=_early_stopping(extra["early_stopping"], _join(path, _EXTRA)))
            if network is not None:
                instance._set(network=network)
        else:
            instance.network = network
            instance.history = list(extra.get("history", []))
            instance.best_epoch = extra.get("best_epoch")
            instance.input_encoding = check_encoding_dict(extra.get("input_encoding"), _join(path, _EXTRA))
        return instance
