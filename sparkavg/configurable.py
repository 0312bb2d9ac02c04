"""One configuration vocabulary: ``to_config()`` / :func:`from_config`.

Everything that is saved, checkpointed or shipped as configuration -- layers,
updaters, networks, masters, threshold rules -- is a *configurable*: its class
is registered under a kind ("layer", "updater", "network", "master", ...) and
a type name, ``obj.to_config()`` returns ``{"type": name, **arguments}``
(JSON-ready: tuples as lists, numpy scalars as Python numbers, enums as their
values, nested configurables as their configs), and :func:`from_config`
rebuilds it, checking the type name against the kind and every argument
against the constructor's annotations before anything is built.  A value of
the wrong JSON type (``"0.1"`` for a float, say) is a :class:`ConfigError`
that names the field, the type expected and the value found::

    >>> from_config({"type": "Adam", "lr": "0.001"}, kind="updater")
    ConfigError: Expect Adam.lr to be float or a Schedule config, got str '0.001'

Annotations understood: ``int`` (numpy integers too, never ``bool``),
``float`` (ints accepted), ``str``, ``bool``, ``Optional[...]`` and unions,
``tuple[int, int]`` / ``tuple[int, ...]`` / ``Sequence[X]`` / ``list[X]``
(a JSON list; elements checked, reported as ``field[i]``), ``dict[str, X]``,
``Literal[...]``, enums (the constructor converts and names the choices),
configurable classes (a nested ``{"type": ...}`` dict is rebuilt from that
class's kind), and ``Annotated[X, check]`` where ``check`` has a
``check_config_value(where, value)`` method run after ``X``'s check (e.g.
:class:`sparkavg.references.Names`: a field that names code).  Anything else is left to the constructor, whose
``ValueError`` / ``TypeError`` becomes a :class:`ConfigError` naming the type.

Frozen dataclasses get :meth:`Configurable.to_config` for free; other classes
override :meth:`Configurable.config_arguments`.  A base class may set
``_config_kind`` so that an annotation naming the base rebuilds nested configs
from the right registry.
"""
from __future__ import annotations

import collections.abc
import dataclasses
import enum
import inspect
import logging
import numbers
import types
import typing
from typing import Any, Dict, Optional, Type

import numpy as np

__all__ = ["Configurable", "register", "from_config", "checked_arguments", "registered", "ConfigError", "constructor_hints"]

logger = logging.getLogger(__name__)


class ConfigError(ValueError):
    """A configuration dict that does not describe a known, valid object; the
    message names the type, the field, what was expected and what was got."""


_REGISTRY: Dict[str, Dict[str, type]] = {}
_HINTS: Dict[type, dict] = {}


def register(kind: str, name: Optional[str] = None):
    """Class decorator: make ``cls`` rebuildable by :func:`from_config`.

    Parameters
    ----------
    kind : str
        The registry ("layer", "updater", "network", "master", ...).
    name : str, optional
        The ``"type"`` written in configs; the class name by default.
    """

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
    """The classes registered under ``kind`` (a copy), by type name."""
    return dict(_REGISTRY.get(kind, {}))


def _json_ready(value: Any) -> Any:
    """``value`` in JSON-ready form."""
    if isinstance(value, Configurable):
        return value.to_config()
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, np.ndarray):
        return _json_ready(value.tolist())
    if isinstance(value, (list, tuple)):
        return [_json_ready(v) for v in value]
    if isinstance(value, dict):
        return {k: _json_ready(v) for k, v in value.items()}
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    return value


class Configurable:
    """Mixin: the one serialization verb, :meth:`to_config`."""

    _config_kind: str = ""
    _config_name: str = ""

    def config_arguments(self) -> dict:
        """Constructor arguments that rebuild this object (default: the init
        fields of a dataclass)."""
        if dataclasses.is_dataclass(self):
            return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.init}
        raise NotImplementedError(f"{type(self).__name__} must define config_arguments()")

    def to_config(self) -> dict:
        """JSON-ready ``{"type": name, **arguments}`` (a fresh dict).

        Raises
        ------
        ConfigError
            ``self`` is an unregistered subclass of a registered class: its
            configuration would rebuild the parent, silently.
        """
        cls = type(self)
        name = cls._config_name or cls.__name__
        kind = getattr(cls, "_config_kind", None)
        owner = _REGISTRY.get(kind, {}).get(name) if kind else None
        if owner is not None and owner is not cls:
            raise ConfigError(f"Expect a registered {kind} type, got {cls.__qualname__}, a subclass of {name} that is "
                              f"not registered: its configuration would rebuild a plain {name}. Decorate it with "
                              f"@sparkavg.configurable.register({kind!r})")
        return {"type": name, **{k: _json_ready(v) for k, v in self.config_arguments().items()}}


# --------------------------------------------------------------- checking
_UNIONS = (typing.Union, types.UnionType)
_SEQUENCES = (list, tuple, collections.abc.Sequence, collections.abc.MutableSequence)
_MAPPINGS = (dict, collections.abc.Mapping, collections.abc.MutableMapping)


def _describe(annotation: Any) -> str:
    """A short human name for an annotation: ``int or [int, int]``."""
    if annotation is type(None):
        return "null"
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in _UNIONS:
        return " or ".join(_describe(a) for a in args if a is not type(None))
    if origin is tuple and args and not (len(args) == 2 and args[1] is Ellipsis):
        return "[" + ", ".join(_describe(a) for a in args) + "]"
    if origin in _SEQUENCES:
        return f"a list of {_describe(args[0])}" if args else "a list"
    if origin in _MAPPINGS:
        return f"a dict of {_describe(args[1])}" if len(args) == 2 else "a dict"
    if origin is typing.Literal:
        return f"one of {list(args)}"
    if isinstance(annotation, type) and issubclass(annotation, Configurable):
        return f"a {annotation.__name__} config"
    if isinstance(annotation, type):
        return annotation.__name__
    return str(annotation)


def _mismatch(where: str, annotation: Any, value: Any) -> ConfigError:
    return ConfigError(f"Expect {where} to be {_describe(annotation)}, got {type(value).__name__} {value!r:.200}")


def _scalar_ok(annotation: type, value: Any) -> bool:
    if annotation is bool:
        return isinstance(value, (bool, np.bool_))
    if isinstance(value, (bool, np.bool_)):
        return False
    if annotation is int:
        return isinstance(value, numbers.Integral)
    if annotation is float:
        return isinstance(value, numbers.Real)
    return isinstance(value, annotation)  # str


def _names_subclass(annotation: Any, type_name: Any) -> bool:
    """Whether ``type_name`` is registered for a subclass of configurable ``annotation``."""
    if not (isinstance(annotation, type) and issubclass(annotation, Configurable) and isinstance(type_name, str)):
        return False
    tables = [_REGISTRY.get(annotation._config_kind, {})] if annotation._config_kind else _REGISTRY.values()
    return any(type_name in t and issubclass(t[type_name], annotation) for t in tables)


def _check_value(where: str, annotation: Any, value: Any) -> Any:
    """``value`` checked against ``annotation`` (``where`` names it in errors,
    e.g. ``"Conv2D.kernel_size"``); JSON lists become tuples where a tuple is
    annotated and nested configs are rebuilt."""
    if isinstance(annotation, str) or annotation is Any:
        return value  # unresolved forward reference or anything: the constructor validates
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        value = _check_value(where, args[0], value)
        for extra in annotation.__metadata__:
            if hasattr(extra, "check_config_value"):
                value = extra.check_config_value(where, value)
        return value
    if origin in _UNIONS:
        if value is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        errors = []
        for option in options:
            try:
                return _check_value(where, option, value)
            except ConfigError as exc:
                errors.append(exc)
        if len(options) == 1:
            raise errors[0]
        for option, exc in zip(options, errors):  # a nested config's own error is the useful one
            if isinstance(value, dict) and _names_subclass(option, value.get("type")):
                raise exc
        raise _mismatch(where, annotation, value)
    if origin is typing.Literal:
        if value not in args:
            raise _mismatch(where, annotation, value)
        return value
    if origin in _SEQUENCES or annotation in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise _mismatch(where, annotation, value)
        if origin is tuple and args and not (len(args) == 2 and args[1] is Ellipsis):
            if len(value) != len(args):
                raise _mismatch(where, annotation, value)
            return tuple(_check_value(f"{where}[{i}]", a, v) for i, (a, v) in enumerate(zip(args, value)))
        element = args[0] if args else Any
        items = [_check_value(f"{where}[{i}]", element, v) for i, v in enumerate(value)]
        return tuple(items) if (origin is tuple or annotation is tuple) else items
    if origin in _MAPPINGS or annotation is dict:
        if not isinstance(value, dict):
            raise _mismatch(where, annotation, value)
        if len(args) == 2:
            return {k: _check_value(f"{where}[{k!r}]", args[1], v) for k, v in value.items()}
        return value
    if not isinstance(annotation, type):
        return value
    if issubclass(annotation, Configurable):
        if isinstance(value, annotation):
            return value
        if isinstance(value, dict):
            try:
                return from_config(value, kind=annotation._config_kind or None, expect=annotation)
            except ConfigError as exc:
                raise ConfigError(f"{where}: {exc}") from None
        raise _mismatch(where, annotation, value)
    if issubclass(annotation, enum.Enum):
        return value  # the constructor turns values into members and names the choices
    if annotation in (int, float, str, bool):
        if not _scalar_ok(annotation, value):
            raise _mismatch(where, annotation, value)
    return value


def constructor_hints(cls: type) -> dict:
    """The resolved annotations of ``cls.__init__``, ``Annotated`` extras kept (cached per class)."""
    hints = _HINTS.get(cls)
    if hints is None:
        try:
            hints = typing.get_type_hints(cls.__init__, include_extras=True)
        except (NameError, TypeError, AttributeError) as exc:
            # Only the pre-checks are lost: the constructor still validates.
            logger.debug("annotations of %s.__init__ unresolvable (%s); arguments not pre-checked",
                         cls.__name__, exc)
            hints = {}
        _HINTS[cls] = hints
    return hints


def from_config(config: Any, kind: Optional[str] = None, *, expect: Optional[Type] = None):
    """Rebuild an object from :meth:`Configurable.to_config` output.

    Parameters
    ----------
    config : dict
        ``{"type": name, **arguments}``.
    kind : str, optional
        Registry to look the name up in ("layer", "updater", "network",
        "master", ...); every registry when None.
    expect : type, optional
        The result must be an instance of this class.

    Returns
    -------
    object
        A new instance of the registered class.

    Raises
    ------
    ConfigError
        Unknown type, missing, unknown or badly typed arguments, or a
        constructor that rejected them -- always naming the type and the field.
    """
    cls, args = checked_arguments(config, kind, expect=expect)
    try:
        return cls(**args)
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"Bad {cls._config_name or cls.__name__} config: {exc}") from None


def checked_arguments(config: Any, kind: Optional[str] = None, *, expect: Optional[Type] = None):
    """The first half of :func:`from_config`: the class a config names and its
    checked constructor arguments (nested configs already rebuilt), without
    calling the constructor -- for callers that must bound what it would
    allocate first (e.g. loading a model file).

    Returns
    -------
    (type, dict)
        ``cls`` and ``args`` such that ``cls(**args)`` is what
        :func:`from_config` returns.

    Raises
    ------
    ConfigError
        As :func:`from_config`, except for the constructor's own checks.
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
        raise ConfigError(f"Expect a {what} type in {known}, got {name!r:.100}")
    if expect is not None and not issubclass(cls, expect):
        raise ConfigError(f"Expect a {expect.__name__} config, got type {name!r}")
    params = inspect.signature(cls).parameters
    takes_kwargs = any(p.kind is p.VAR_KEYWORD for p in params.values())
    named = {k: p for k, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    unknown = [k for k in args if k not in named]
    if unknown and not takes_kwargs:
        raise ConfigError(f"Expect {name} arguments among {list(named)}, got unknown {unknown}")
    missing = [k for k, p in named.items() if p.default is p.empty and k not in args]
    if missing:
        raise ConfigError(f"Expect {name} config with {missing}, got keys {sorted(args)}")
    hints = constructor_hints(cls)
    for key, value in list(args.items()):
        if key in hints:
            args[key] = _check_value(f"{name}.{key}", hints[key], value)
    return cls, args
