"""Executor-side minibatch transforms: a user function applied to every
minibatch on the executors, every epoch (random crops and flips,
normalisation, decoding), with a seeded random generator.

A transform is a function::

    def transform(x, y, rng):     # x: (N, ...) features (several inputs: a dict by name), y: (N,) or (N, K) labels
        ...                       # rng: numpy.random.Generator, seeded per minibatch
        return x, y               # the same N; x in the network's input shape

named by its importable ``"package.module:function"`` string in
:class:`~sparkavg.spark.masters.DataOptions` (``transform=``; a module-level
function is taken as its name).  Nothing is pickled: the name is shipped and
saved with the master's configuration, and each executor imports it (the
package must be installed on every executor, as the model's own code is),
so classic and Connect sessions run it alike.

Seeds: minibatch ``k`` (0, 1, ... in the order a task reads them) of the
task of worker ``w`` whose round starts at network iteration ``i``, in
epoch ``e`` of a fit with master seed ``s``, gets
``numpy.random.default_rng([s, e, i, w, k])``.  The deal of an epoch is
seeded too (``seed + epoch``), so two runs with the same seed -- and a run
resumed from a checkpoint -- transform the same minibatch the same way; a
retried task draws the same numbers again.  ``w`` is the worker's index,
whichever path runs the round: a rank inside a stage, and in a job per
round its task's Spark partition modulo the plan's workers (a Spark-block
plan numbers them ``round * workers + worker``), so averaging's two paths
transform alike.

Compact minibatches and the input encoding (``DataOptions(feature_dtype=,
scale=, normalize=)``): features kept in a compact dtype (uint8 ...; by
default, ``"auto"``, integer and float16 features stay compact) are
converted to float32 as a task reads each minibatch, then scaled and
normalised (:func:`encode_inputs`) -- before the transform, so a transform
sees what the model sees.  ``evaluate``, ``predict`` and a fitted
``NetworkModel``'s ``transform`` apply the same encoding
(:func:`input_encoding`, a JSON-ready dict saved with the model).
"""
from __future__ import annotations

from typing import Callable, Dict, Iterable, Iterator, Optional

import numpy as np

from ..configurable import ConfigError
from ..references import resolve
from .validation import WEIGHTS, count_examples, split_weights

__all__ = ["TransformError", "transform_reference", "resolve_transform", "transform_plan", "transformed",
           "COMPACT_DTYPES", "check_encoding", "check_encoding_dict", "input_encoding", "encode_inputs"]

#: dtypes prepared minibatches may keep a DataFrame's features in (``DataOptions.feature_dtype``).
COMPACT_DTYPES = ("uint8", "int8", "uint16", "int16", "float16", "float32")


class TransformError(ValueError):
    """A transform that cannot be imported, or that returned something other
    than an ``(x, y)`` minibatch; the message names it and what was expected."""


def _check_reference(reference: str) -> str:
    module_name, sep, qualname = reference.partition(":")
    if not sep or not module_name or not qualname or any(
            not part.isidentifier() for part in module_name.split(".") + qualname.split(".")):
        raise TransformError(f"Expect transform as 'package.module:function', got {reference!r:.200}")
    return reference


def transform_reference(transform) -> Optional[str]:
    """``transform`` (None, a ``"package.module:function"`` string or a
    module-level function) as its importable name; checked, not imported
    for a string (the driver may lack the executors' packages)."""
    if transform is None:
        return None
    if isinstance(transform, str):
        return _check_reference(transform)
    module, qualname = getattr(transform, "__module__", None), getattr(transform, "__qualname__", None)
    if callable(transform) and module and qualname and module != "__main__" and "<" not in qualname:
        reference = f"{module}:{qualname}"
        if resolve_transform(reference) is transform:
            return reference
    raise TransformError(
        f"Expect transform as a 'package.module:function' name or a module-level function of an importable "
        f"module (executors import it by name; nothing is pickled), got {type(transform).__name__} "
        f"{transform!r:.200}: move it into a module installed on the executors")


_RESOLVED: Dict[str, Callable] = {}


def resolve_transform(reference: str) -> Callable:
    """The function ``reference`` names, imported here (cached per process)."""
    found = _RESOLVED.get(reference)
    if found is not None:
        return found
    try:
        obj = resolve(_check_reference(reference), "transform")
    except ConfigError as exc:
        raise TransformError(f"{exc}") from None
    _RESOLVED[reference] = obj
    return obj


def check_encoding(feature_dtype, scale, normalize) -> None:
    """Raise ``ValueError`` naming what is wrong with an input encoding
    (:class:`~sparkavg.spark.masters.DataOptions` fields)."""
    if feature_dtype is not None and feature_dtype != "auto" and feature_dtype not in COMPACT_DTYPES:
        raise ValueError(f"Expect feature_dtype 'auto', one of {list(COMPACT_DTYPES)} or None, "
                         f"got {feature_dtype!r}")
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float, np.floating))
                              or not np.isfinite(scale) or scale == 0):
        raise ValueError(f"Expect scale a finite non-zero number (1/255 for uint8 pixels) or None, got {scale!r}")
    if normalize is not None:
        ok = isinstance(normalize, (tuple, list)) and len(normalize) == 2 and all(
            isinstance(v, (int, float, np.floating)) and not isinstance(v, bool) and np.isfinite(v)
            for v in normalize)
        if not ok or normalize[1] <= 0:
            raise ValueError(f"Expect normalize as (mean, std), finite numbers with std > 0, or None, "
                             f"got {normalize!r}")


def input_encoding(options) -> Optional[dict]:
    """The model's input encoding of ``options`` (a ``DataOptions``) as a
    JSON-ready dict (``{"scale": s, "normalize": [mean, std]}``), or None
    when there is none (float32 features, as they are)."""
    scale, normalize = getattr(options, "scale", None), getattr(options, "normalize", None)
    if scale is None and normalize is None:
        return None
    return {"scale": None if scale is None else float(scale),
            "normalize": None if normalize is None else [float(v) for v in normalize]}


def check_encoding_dict(encoding, name: str) -> Optional[dict]:
    """``encoding`` read from a saved model (``name`` its file), checked."""
    if encoding is None:
        return None
    if not isinstance(encoding, dict) or set(encoding) - {"scale", "normalize"}:
        raise ValueError(f"{name}: expected the input encoding as {{'scale': number or null, 'normalize': "
                         f"[mean, std] or null}}, got {encoding!r:.120}")
    try:
        check_encoding(None, encoding.get("scale"), encoding.get("normalize"))
    except ValueError as exc:
        raise ValueError(f"{name}: its input encoding: {exc}") from None
    return {"scale": encoding.get("scale"), "normalize": encoding.get("normalize")}


def _encode_array(x: np.ndarray, encoding: Optional[dict]) -> np.ndarray:
    x = np.asarray(x)
    if x.dtype == np.int64:  # ids (embedding inputs): never scaled
        return x
    if x.dtype != np.float32:
        x = x.astype(np.float32)
    if not encoding:
        return x
    scale, normalize = encoding.get("scale"), encoding.get("normalize")
    if scale is not None:
        x = x * np.float32(scale)
    if normalize is not None:
        x = (x - np.float32(normalize[0])) / np.float32(normalize[1])
    return x


def encode_inputs(x, encoding: Optional[dict]) -> dict:
    """Features (a dict by input name) as the model takes them: a compact
    dtype (uint8 ...) converted to float32, then ``x * scale`` and
    ``(x - mean) / std`` of ``encoding`` (:func:`input_encoding`; None: the
    conversion only), all in float32; int64 id inputs unchanged."""
    return {k: _encode_array(v, encoding) for k, v in x.items()}


def transform_plan(options, seed: int, epoch: int, iteration: int, workers: int = 1) -> Optional[dict]:
    """What a round's tasks need to transform their minibatches (shipped
    with the round's state; plain values): the transform and the input
    encoding (:func:`input_encoding`), or None with neither; ``workers``
    the plan's (a task's worker is its partition modulo them)."""
    reference = getattr(options, "transform", None)
    encoding = input_encoding(options)
    if reference is None and encoding is None:
        return None
    return {"name": reference, "seed": int(seed), "epoch": int(epoch), "iteration": int(iteration),
            "encoding": encoding, "workers": max(1, int(workers))}


def _seed_word(value: int) -> int:
    return int(value) & 0xFFFFFFFFFFFFFFFF  # SeedSequence takes non-negative words


def _encoded(x, y, encoding):
    """A minibatch in the model's input encoding; its rows' weights as they are."""
    x, weights = split_weights(x)
    x = encode_inputs(x, encoding)
    if weights is not None:
        x[WEIGHTS] = weights
    return x, y


def transformed(minibatches: Iterable, plan: Optional[dict], worker: Optional[int]) -> Iterator:
    """``minibatches`` (``(x, y)`` pairs) in the model's dtype and input
    encoding (:func:`encode_inputs`), then through ``plan``'s transform, each
    with its own generator (see the module docstring); without a plan only
    a compact dtype is converted to float32."""
    encoding = plan.get("encoding") if plan else None
    minibatches = (_encoded(x, y, encoding) for x, y in minibatches)
    if not plan or plan.get("name") is None:
        yield from minibatches
        return
    name = plan["name"]
    fn = resolve_transform(name)
    head = [_seed_word(plan[k]) for k in ("seed", "epoch", "iteration")] + [
        _seed_word((worker or 0) % plan.get("workers", 1 << 62))]
    for k, (x, y) in enumerate(minibatches):
        x, weights = split_weights(x)  # the rows' weights pass a transform untouched
        alone = next(iter(x)) if len(x) == 1 else None  # a one-input model's transform takes and gives its array
        out = fn(x if alone is None else x[alone], y, np.random.default_rng(head + [k]))
        if not (isinstance(out, tuple) and len(out) == 2):
            raise TransformError(f"Expect the transform {name!r} to return an (x, y) tuple, got "
                                 f"{type(out).__name__}")
        tx, ty = out
        # numpy's default for arithmetic on ints is float64: the step's is float32
        tx = {n: v.astype(np.float32) if getattr(v, "dtype", None) == np.float64 else v
              for n, v in (tx.items() if alone is None else [(alone, tx)])}
        n = count_examples(tx)
        if n != len(ty) or n == 0:
            raise TransformError(f"Expect the transform {name!r} to return as many labels as examples (at least "
                                 f"one), got {n} examples and {len(ty)} labels from a minibatch of "
                                 f"{count_examples(x)}")
        if weights is not None:
            if n != len(weights):
                raise TransformError(f"Expect the transform {name!r} to keep the number of examples of a weighted "
                                     f"minibatch ({len(weights)}: each has its weight), got {n}")
            tx[WEIGHTS] = weights
        yield tx, ty
