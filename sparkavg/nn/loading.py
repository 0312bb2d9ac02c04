"""Loading a model of whichever type a configuration or file names.

:func:`model_from_config`, :func:`model_from_json` and :func:`load_model`
(re-exported by :mod:`sparkavg.nn`) rebuild any model registered under the
kind ``"network"`` of :mod:`sparkavg.configurable`: a configuration of an
older layout is upgraded first (:mod:`.upgrades`), and the module of an
optional model type (:data:`OPTIONAL_TYPES`: ``Graph``, ``TorchModel``) is
imported when a configuration names it.  Code a configuration names (a
torch factory or loss) is called only if it is marked or trusted by the
caller (``trusted=``, :mod:`sparkavg.references`).

The contract the loaded models implement is :mod:`.model`; model files are
:mod:`.serialization`.
"""
from __future__ import annotations

import importlib
import json
from typing import Mapping

from ..configurable import ConfigError, from_config
from ..references import trusting
from .model import Model
from .serialization import load_network
from .upgrades import upgrade_config

__all__ = ["OPTIONAL_TYPES", "import_model_type", "model_from_config", "model_from_json", "load_model"]


#: Model types registered by optional modules, imported when a configuration names them
#: (an executor rebuilding a model has imported only :mod:`sparkavg.nn`).
OPTIONAL_TYPES = {"Graph": "sparkavg.nn.graph", "TorchModel": "sparkavg.torch"}


def import_model_type(config) -> None:
    """Import the optional module that registers ``config``'s model type, if any."""
    name = config.get("type") if isinstance(config, Mapping) else None
    if name in OPTIONAL_TYPES:
        importlib.import_module(OPTIONAL_TYPES[name])


def model_from_config(config: Mapping, *, trusted=None) -> Model:
    """A freshly initialised model of whichever registered type ``config``
    names (``{"type": "Network" | "Graph" | "TorchModel", ...}``).

    Code the configuration names (a torch factory or loss) is called only
    if it is marked or in ``trusted`` (see :mod:`sparkavg.references`)."""
    with trusting(trusted):
        import_model_type(config)
        model = from_config(upgrade_config(dict(config)) if isinstance(config, Mapping) else config,
                            kind="network")
    if not isinstance(model, Model):
        raise ConfigError(f"Expect a configuration of a model, got one of {type(model).__name__}")
    return model


def model_from_json(text: str, *, trusted=None) -> Model:
    """Inverse of ``model.to_json()``, whatever the model's type.

    Parameters
    ----------
    text : str
    trusted : collection of str, True or None
        Code the configuration names that may be called besides marked
        functions (:mod:`sparkavg.references`); ``True`` trusts every name.

    Raises
    ------
    ConfigError
        Text that is not JSON, or a configuration that does not describe a
        valid model (the message names the type and field);
        :class:`~sparkavg.references.UntrustedReference` for code it names
        that is neither marked nor trusted.
    """
    try:
        config = json.loads(text)
    except (TypeError, ValueError, RecursionError) as exc:
        raise ConfigError(f"Expect a JSON model configuration, got text that does not parse: {exc}") from None
    return model_from_config(config, trusted=trusted)


def load_model(path, *, max_params: int | None = None, trusted=None) -> Model:
    """Read a model file written by ``model.save(path)``, whatever the
    model's type, verifying it in bounded memory (see
    :mod:`sparkavg.nn.serialization`).  Code the file names (a torch
    factory or loss) is called only if it is marked or in ``trusted``
    (``{"package.module:function", ...}``, or ``True`` for a file you wrote
    yourself): see :mod:`sparkavg.references`."""
    return load_network(path, None, max_params=max_params, trusted=trusted, upgrade=_upgrade_any)


def _upgrade_any(config):
    """A model file's configuration, whatever the model's type, in this
    version's layout, the module of its optional type imported (after the
    file's digest is checked: see :mod:`sparkavg.nn.serialization`)."""
    config = upgrade_config(config)  # the version-1 layout predates "type"
    import_model_type(config)
    return config
