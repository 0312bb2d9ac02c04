"""One configuration vocabulary: ``to_config()`` / :func:`from_config`.

Everything that is saved, checkpointed or shipped as configuration -- layers,
updaters, masters, threshold rules -- is a *configurable*: its class is
registered under a kind ("layer", "updater", "master", ...) and a type name,
``obj.to_config()`` returns ``{"type": name, **arguments}`` (JSON-ready:
enums as their values, nested configurables as their configs), and
:func:`from_config` rebuilds it, checking the type name against the kind and
every argument against the constructor before anything is built.  A value of
the wrong JSON type (``"0.1"`` for a float, say) is an error that names the
field, the type expected and the value found.

Frozen dataclasses get :meth:`Configurable.to_config` for free; other classes
override :meth:`Configurable.config_arguments`.
"""
from __future__ import annotations

import dataclasses
import enum
import inspect
import numbers
import typing
from typing import Any, Dict, Optional, Type

__all__ = ["Configurable", "register", "from_config", "registered", "ConfigError"]


class ConfigError(ValueError):
    """A configuration dict that does not describe a known, valid object."""


_REGISTRY: Dict[str, Dict[str, type]] = {}


def register(kind: str, name: Optional[str] = None):
    """Class decorator: make ``cls`` rebuildable by :func:`from_config` under ``kind``."""

    def deco(cls):
        type_name = name or cls.__name__
        table = _REGISTRY.setdefault(kind, {})
        if table.get(type_name, cls) is not cls:
            raise ValueError(f"Expect one {kind} class named {type_name!r}, got a second: {cls!r}")
        table[type_name] = cls
        cls._config_kind = kind
        cls._config_name = type_name
        return cls

    return deco


def registered(kind: str) -> Dict[str, type]:
    """The classes registered under ``kind`` (a copy)."""
    return dict(_REGISTRY.get(kind, {}))


def _plain(value: Any) -> Any:
    if isinstance(value, Configurable):
        return value.to_config()
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return float(value)
    return value


class Configurable:
    """Mixin: the one serialization verb, :meth:`to_config`."""

    _config_kind: str = ""
    _config_name: str = ""

    def config_arguments(self) -> dict:
        """Constructor arguments that rebuild this object (default: dataclass fields)."""
        if dataclasses.is_dataclass(self):
            return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.init}
        raise NotImplementedError(f"{type(self).__name__} must define config_arguments()")

    def to_config(self) -> dict:
        """JSON-ready ``{"type": name, **arguments}``."""
        name = type(self)._config_name or type(self).__name__
        return {"type": name, **{k: _plain(v) for k, v in self.config_arguments().items()}}


_JSON_KINDS = {float: (numbers.Real,), int: (numbers.Integral,), str: (str,), bool: (bool,)}


def _check_value(owner: str, field: str, annotation: Any, value: Any) -> Any:
    """Check ``value`` against a simple annotation; nested configs are rebuilt."""
    if isinstance(annotation, str):
        return value  # unresolved forward reference: the constructor validates
    origin = typing.get_origin(annotation)
    if origin is typing.Union:
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if value is None:
            return None
        errors = []
        for arg in args:
            try:
                return _check_value(owner, field, arg, value)
            except ConfigError as exc:
                errors.append(str(exc))
        if errors:
            raise ConfigError(errors[0])
        return value
    if isinstance(value, dict) and "type" in value and isinstance(annotation, type) \
            and issubclass(annotation, Configurable):
        return from_config(value, kind=annotation._config_kind or None)
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return value  # the constructor turns values into members and names the choices
    if annotation in _JSON_KINDS:
        ok = isinstance(value, _JSON_KINDS[annotation])
        if annotation is not bool and isinstance(value, bool):
            ok = False
        if annotation is float and isinstance(value, numbers.Integral) and not isinstance(value, bool):
            ok = True
        if not ok:
            raise ConfigError(f"Expect {owner}.{field} to be {annotation.__name__}, got {type(value).__name__} "
                              f"{value!r}")
    return value


def from_config(config: Any, kind: Optional[str] = None, *, expect: Optional[Type] = None):
    """Rebuild an object from :meth:`Configurable.to_config` output.

    Parameters
    ----------
    config : dict
        ``{"type": name, **arguments}``.
    kind : str, optional
        Registry to look the name up in ("layer", "updater", "master", ...);
        every registry when None.
    expect : type, optional
        The result must be an instance of this class.

    Raises
    ------
    ConfigError
        Unknown type, unknown or badly typed arguments, or a constructor that
        rejected them -- always naming the type and the field.
    """
    what = kind or "object"
    if not isinstance(config, dict) or "type" not in config:
        raise ConfigError(f"Expect a {what} config dict with a 'type', got {config!r:.200}")
    args = dict(config)
    name = args.pop("type")
    tables = [_REGISTRY.get(kind, {})] if kind else list(_REGISTRY.values())
    cls = next((t[name] for t in tables if isinstance(name, str) and name in t), None)
    if cls is None:
        known = sorted({n for t in tables for n in t})
        raise ConfigError(f"Expect a {what} type in {known}, got {name!r}")
    if expect is not None and not issubclass(cls, expect):
        raise ConfigError(f"Expect a {expect.__name__} config, got type {name!r}")
    try:
        hints = typing.get_type_hints(cls.__init__)
    except Exception:  # unresolvable annotations: let the constructor judge
        hints = {}
    params = inspect.signature(cls).parameters
    takes_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    unknown = [k for k in args if k not in params]
    if unknown and not takes_kwargs:
        allowed = [k for k, p in params.items() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        raise ConfigError(f"Expect {name} arguments among {allowed}, got unknown {unknown}")
    for key, value in list(args.items()):
        if key in hints:
            args[key] = _check_value(name, key, hints[key], value)
    try:
        return cls(**args)
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"Bad {name} config: {exc}") from None
