"""Saved model configurations of an older layout, as this version's.

The one older layout is the version-1 ``Network`` configuration, written
before configs carried a ``"type"``.  A configuration read back (a model
file, JSON text) goes through :func:`upgrade_config` before
:func:`~sparkavg.configurable.from_config` sees it wherever it may be one:
in ``Network.load`` (``Network.upgrade_config``),
:meth:`FlatModel.from_json <sparkavg.nn.flat.FlatModel.from_json>` and the
loaders of :mod:`sparkavg.nn.loading`.
"""
from __future__ import annotations

from ..configurable import ConfigError

__all__ = ["upgrade_config"]

#: The layout before configs carried a "type": {"format": ..., "version": 1, ...}.
_V1_FORMAT = "sparkavg.nn.Network"
_V1_KEYS = frozenset({"format", "version", "input_shape", "layers", "updater", "l2", "l2_bias",
                      "weight_decay", "seed", "dtype"})


def upgrade_config(config):
    """A network config in the current layout (``{"type": "Network", ...}``).

    Version-1 configs (``{"format": "sparkavg.nn.Network", "version": 1,
    ...}``, written before configs carried a ``"type"``) are translated; any
    other value is returned unchanged for :func:`~sparkavg.configurable.from_config`
    to judge.

    Raises
    ------
    ConfigError
        A version-1 config with another format, version or unknown keys.
    """
    if not isinstance(config, dict) or "type" in config or "format" not in config:
        return config
    if config.get("format") != _V1_FORMAT or config.get("version") != 1:
        raise ConfigError(f"Expect a network config of format {_V1_FORMAT!r} version 1 (or with a 'type'), "
                          f"got format {config.get('format')!r:.100} version {config.get('version')!r:.100}")
    unknown = sorted(set(config) - _V1_KEYS)
    if unknown:
        raise ConfigError(f"Expect version-1 network config keys among {sorted(_V1_KEYS)}, got unknown {unknown}")
    upgraded = {k: v for k, v in config.items() if k not in ("format", "version")}
    return {"type": "Network", **upgraded}
