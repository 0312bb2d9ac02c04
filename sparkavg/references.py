"""Code a configuration names, and when a loader may call it.

A model file, a checkpoint or a saved Pipeline is JSON plus arrays: it never
holds code.  It may *name* code, as an importable ``"package.module:function"``
string: a :class:`~sparkavg.torch.TorchModel`'s module factory, loss,
training step, optimizer and scheduler, a
:class:`~sparkavg.spark.DataOptions` transform.  Whoever wrote the file chose
those names, so a loader calls one only when **you** said it may:

* mark it where you define it -- ``@sparkavg.torch.factory``,
  ``@sparkavg.references.loss``, ``@sparkavg.references.transform``
  (also ``sparkavg.loss`` / ``sparkavg.transform``),
  ``@sparkavg.torch.optimizer``, ``@sparkavg.torch.scheduler``,
  ``@sparkavg.torch.training_step``; sparkavg's own zoo factories are
  marked, and the classes of ``torch.optim`` and
  ``torch.optim.lr_scheduler`` need no mark;
* or name it when you load: ``load_model(path, trusted={"mypkg.nets:small_cnn"})``,
  or around any loader (``PipelineModel.load``, ``mlflow.pyfunc.load_model``,
  ``fit(resume_from=...)``): ``with sparkavg.references.trusting({...}):``;
* or trust the whole file: ``trusted=True`` / ``trusting(True)``, for files
  you wrote yourself.

Anything else is refused with :class:`UntrustedReference`, which names the
reference and these three ways to allow it.

What a check costs: a name inside the standard library is refused without an
import (none of its functions is marked).  Any other name's module is
imported to look at the mark -- importing runs that module's top-level code,
as any ``import`` does -- and nothing in it is called unless it is marked.
A loader checks the file's header, declared sizes and digest before it
imports anything a file names.

What is not a loader: your own code.  ``TorchModel("mypkg.nets:small_cnn")``
or ``DataOptions(transform=...)`` written in your program is you naming the
code, so it is called as named.  Executors rebuild the driver's model and
master from configurations that travel inside the tasks Spark ships from the
driver (next to the task's own pickled function: whoever can change one can
change the other), so they rebuild under the driver's authority
(:func:`trusting` ``(True)``); the driver built those objects under the rules
above.  Spark's own authentication and encryption protect that channel.
"""
from __future__ import annotations

import contextlib
import contextvars
import importlib
import socket
import sys
from typing import Callable, Iterable, Optional, Union

from .configurable import ConfigError, constructor_hints

__all__ = ["KINDS", "factory", "loss", "transform", "optimizer", "scheduler", "training_step", "mark", "trusting",
           "check", "resolve", "reference_of", "parse", "UntrustedReference", "UnresolvedReference", "is_marked", "Names", "named_code"]

#: What a configuration may name, with the words messages use.
KINDS = {"factory": "torch module factory", "loss": "loss function", "transform": "transform",
         "optimizer": "torch optimizer", "scheduler": "learning-rate scheduler", "training_step": "training step"}
_DECORATOR = {"factory": "@sparkavg.torch.factory", "loss": "@sparkavg.loss", "transform": "@sparkavg.transform",
              "optimizer": "@sparkavg.torch.optimizer", "scheduler": "@sparkavg.torch.scheduler",
              "training_step": "@sparkavg.torch.training_step"}
_ATTRIBUTE = "__sparkavg_marked__"


class UnresolvedReference(ConfigError):
    """A reference that is malformed, does not import here, or names nothing
    callable; the message names it, the host and what to install."""


class UntrustedReference(ConfigError):
    """A loader refused to call code a configuration names that was not marked
    or trusted; the message names the reference and how to allow it."""


# ----------------------------------------------------------------- marking
def mark(kind: str) -> Callable:
    """A decorator marking a function (or class) as a ``kind`` loaders may call."""
    if kind not in KINDS:
        raise ValueError(f"Expect kind in {sorted(KINDS)}, got {kind!r}")

    def deco(fn):
        if not callable(fn):
            raise TypeError(f"Expect {_DECORATOR[kind]} on a function or class, got {type(fn).__name__}")
        kinds = vars(fn).get(_ATTRIBUTE, frozenset()) if hasattr(fn, "__dict__") else frozenset()
        setattr(fn, _ATTRIBUTE, frozenset(kinds) | {kind})
        return fn

    return deco


#: ``@factory``: a function returning a ``torch.nn.Module`` that loaders may call.
factory = mark("factory")
#: ``@loss``: a ``loss(outputs, targets)`` that loaders may call.
loss = mark("loss")
#: ``@transform``: a minibatch ``transform(x, y, rng)`` that loaders may call.
transform = mark("transform")
#: ``@optimizer``: a ``torch.optim.Optimizer`` subclass that loaders may build
#: (torch.optim's own classes need no mark).
optimizer = mark("optimizer")
#: ``@scheduler``: a learning-rate scheduler class that loaders may build
#: (torch.optim.lr_scheduler's own classes need no mark).
scheduler = mark("scheduler")
#: ``@training_step``: a ``fn(module, batch) -> loss`` that loaders may call.
training_step = mark("training_step")


def is_marked(obj, kind: str) -> bool:
    """Whether ``obj`` itself (not a base class) carries the ``kind`` mark."""
    own = vars(obj) if hasattr(obj, "__dict__") else {}
    return kind in own.get(_ATTRIBUTE, ())


# ----------------------------------------------------------------- policy
_ALL = True
_TRUST: contextvars.ContextVar = contextvars.ContextVar("sparkavg_trust", default=frozenset())


def _policy(trusted) -> Union[bool, frozenset]:
    if trusted is None:
        return frozenset()
    if trusted is True:
        return _ALL
    if isinstance(trusted, bool):
        raise ValueError("Expect trusted as True, None or a collection of 'package.module:function' names, "
                         "got False (leave it out for the default: marked functions only)")
    if isinstance(trusted, str):
        trusted = [trusted]
    if not isinstance(trusted, Iterable):
        raise ValueError(f"Expect trusted as True, None or a collection of 'package.module:function' names, got "
                         f"{type(trusted).__name__}")
    names = []
    for name in trusted:
        parse(name, "trusted name")
        names.append(name)
    return frozenset(names)


@contextlib.contextmanager
def trusting(trusted=None):
    """Within the block, loaders also call the references in ``trusted`` (a
    collection of ``"package.module:function"`` names), or every reference
    (``True``: files you wrote yourself).  ``None`` changes nothing.  Nested
    blocks add to the outer one."""
    policy = _policy(trusted)
    outer = _TRUST.get()
    if outer is _ALL or policy is _ALL:
        combined = _ALL
    else:
        combined = outer | policy
    token = _TRUST.set(combined)
    try:
        yield
    finally:
        _TRUST.reset(token)


def parse(reference, what: str = "reference") -> tuple:
    """``(module, qualname)`` of a well-formed ``"package.module:qualified.name"``."""
    if not isinstance(reference, str):
        raise UnresolvedReference(f"Expect the {what} as a 'package.module:function' string, got "
                                  f"{type(reference).__name__} {reference!r:.100}")
    module, sep, qualname = reference.partition(":")
    if not sep or not module or not qualname or any(not part.isidentifier()
                                                    for part in module.split(".") + qualname.split(".")):
        raise UnresolvedReference(f"Expect the {what} as 'package.module:function', got {reference!r:.200}")
    return module, qualname


def _trust_it(reference: str) -> str:
    return (f"if you trust this file, allow it when loading: load_model(path, trusted={{{reference!r}}}) or "
            f"`with sparkavg.trusting({{{reference!r}}}):` around the loader (trusted=True trusts every name "
            f"in the file)")


def _how_to_allow(reference: str, kind: str) -> str:
    return f"mark it where it is defined with {_DECORATOR[kind]}, or, {_trust_it(reference)}"


def check(reference, kind: str) -> str:
    """``reference``, once a loader may call it: trusted by the current
    :func:`trusting` block, or naming a ``kind``-marked object.

    Raises
    ------
    UnresolvedReference
        A malformed name, or one whose module does not import.
    UntrustedReference
        The name is neither trusted nor marked (a standard-library name is
        refused without importing it).
    """
    what = KINDS[kind]
    module, _ = parse(reference, what)
    policy = _TRUST.get()
    if policy is _ALL or reference in policy:
        return reference
    if module.partition(".")[0] in sys.stdlib_module_names:
        raise UntrustedReference(f"Refusing to call the {what} {reference!r} that a loaded configuration names: "
                                 f"it is in Python's standard library, never a marked {kind} (a model file, "
                                 f"checkpoint or saved Pipeline may only name code you marked or trusted); "
                                 f"{_trust_it(reference)}")
    obj = resolve(reference, kind)
    if not is_marked(obj, kind):
        raise UntrustedReference(f"Refusing to call the {what} {reference!r} that a loaded configuration names: "
                                 f"it is not marked as a {kind} loaders may call; {_how_to_allow(reference, kind)}")
    return reference


class Names:
    """Annotation metadata (``Annotated[str, Names("factory")]``) of a
    constructor argument that names code: :func:`sparkavg.configurable.from_config`
    (every loader's path) runs :func:`check` on it before anything is built.
    ``plain`` lists values that are names of built-ins, not references."""

    def __init__(self, kind: str, plain: Iterable[str] = ()):
        if kind not in KINDS:
            raise ValueError(f"Expect kind in {sorted(KINDS)}, got {kind!r}")
        self.kind, self.plain = kind, frozenset(plain)

    def check_config_value(self, where: str, value):
        if isinstance(value, str) and value not in self.plain:
            try:
                return check(value, self.kind)
            except ConfigError as exc:
                raise type(exc)(f"{where}: {exc}") from None
        return value

    def __repr__(self):
        return f"Names({self.kind!r})"


def named_code(obj) -> frozenset:
    """The references to code that ``obj``'s own configuration names (its
    ``Names``-annotated constructor arguments): what a loader may trust
    when it reads a file of the same object that the user built in code
    (a checkpoint resumed by the model it was written from)."""
    try:
        config = obj.to_config()
    except (ValueError, TypeError, AttributeError):
        return frozenset()
    hints = constructor_hints(type(obj))
    found = set()
    for key, hint in hints.items():
        value = config.get(key)
        for extra in getattr(hint, "__metadata__", ()):
            if isinstance(extra, Names) and isinstance(value, str) and value not in extra.plain:
                found.add(value)
    return frozenset(found)


def _where() -> str:
    return f"on host {socket.gethostname()} (python {sys.executable})"


def resolve(reference, kind: str = "factory") -> Callable:
    """The callable ``reference`` names, imported here (no trust check: see :func:`check`).

    Raises
    ------
    UnresolvedReference
        A malformed name, a module that does not import here, a missing
        attribute or an object that is not callable; the message names the
        reference, the host and what to install.
    """
    what = KINDS.get(kind, kind)
    module_name, qualname = parse(reference, what)
    hint = "install the package that provides it on every executor (and the driver)"
    try:
        obj = importlib.import_module(module_name)
    except ImportError as exc:
        raise UnresolvedReference(f"Cannot import the {what} {reference!r} {_where()}: {exc}; {hint}") from None
    for part in qualname.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise UnresolvedReference(f"Cannot find the {what} {reference!r} {_where()}: module {module_name!r} "
                                      f"has no attribute {qualname!r}; {hint} (a version that defines it)") from None
    if not callable(obj):
        raise UnresolvedReference(f"Expect the {what} {reference!r} to name a callable, got {type(obj).__name__}")
    return obj


def reference_of(fn) -> Optional[str]:
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
