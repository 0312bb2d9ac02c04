"""Module factories by name: ``"package.module:function"`` <-> the callable.

A :class:`~sparkavg.torch.TorchModel` ships and saves its module as the
importable name of the function that builds it, plus JSON keyword
arguments; an executor (or a later process loading a model file) imports
that name and calls it.  Nothing is pickled.
"""
from __future__ import annotations

import importlib
import socket
import sys
from typing import Callable

from ..configurable import ConfigError
from ..spark.errors import register_error

__all__ = ["resolve", "reference_of", "FactoryError"]

_HINT = "install the package that provides it on every executor (and the driver)"


@register_error  # raised on an executor, rebuilt as itself on the driver
class FactoryError(ConfigError):
    """A factory (or loss) name that cannot be imported here; the message says
    which name, on which host and interpreter, and what to install."""


def _where() -> str:
    return f"on host {socket.gethostname()} (python {sys.executable})"


def resolve(reference: str, what: str = "module factory") -> Callable:
    """The callable that ``reference`` (``"package.module:qualified.name"``) names.

    Raises
    ------
    FactoryError
        A malformed name, a module that does not import here, a missing
        attribute or an object that is not callable; the message names the
        reference, the host and what to install.
    """
    if not isinstance(reference, str):
        raise FactoryError(f"Expect the {what} as a 'package.module:function' string, got "
                           f"{type(reference).__name__} {reference!r:.100}")
    module_name, sep, qualname = reference.partition(":")
    if not sep or not module_name or not qualname or any(not part.isidentifier() for part in
                                                         module_name.split(".") + qualname.split(".")):
        raise FactoryError(f"Expect the {what} as 'package.module:function', got {reference!r:.200}")
    try:
        obj = importlib.import_module(module_name)
    except ImportError as exc:
        raise FactoryError(f"Cannot import the torch {what} {reference!r} {_where()}: {exc}; {_HINT}") from None
    for part in qualname.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise FactoryError(f"Cannot find the torch {what} {reference!r} {_where()}: module {module_name!r} "
                               f"has no attribute {qualname!r}; {_HINT} (a version that defines it)") from None
    if not callable(obj):
        raise FactoryError(f"Expect the torch {what} {reference!r} to name a callable, got "
                           f"{type(obj).__name__}")
    return obj


def reference_of(fn) -> str | None:
    """``"module:qualname"`` when ``fn`` is importable by that name (a
    module-level function or class of a module other than ``__main__``),
    else None (a lambda, a closure, a bound method, a notebook's function)."""
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", None)
    if not module or not qualname or module == "__main__" or "<" in qualname:
        return None
    reference = f"{module}:{qualname}"
    try:
        found = resolve(reference)
    except ConfigError:
        return None
    return reference if found is fn else None
