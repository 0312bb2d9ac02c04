"""Building a :class:`~sparkavg.torch.TorchModel`'s module and laying out
its flat vectors (what the constructor and ``planned_sizes`` share): the
inputs it takes, the factory called under its seed, the trainable
parameters, the persistent buffers and the frozen parameters."""
from __future__ import annotations

import logging
import numbers
from collections.abc import Mapping

import numpy as np

from ..nn.flatstate import check_dtype, check_seed, segments_of
from ..references import reference_of, resolve

__all__ = ["Plan", "INPUT", "INPUT_DTYPES", "callable_or_reference"]

logger = logging.getLogger(__name__)

#: The name of the one input of a model given ``input_shape``.
INPUT = "input"

#: Input dtypes a module may take (``int64``: ids, as ``nn.Embedding`` reads them).
INPUT_DTYPES = ("float32", "int64")


def _torch():
    import torch

    return torch


def check_shape(input_shape, what="input_shape"):
    shape = input_shape.tolist() if isinstance(input_shape, np.ndarray) else input_shape
    if not isinstance(shape, (tuple, list)) or not shape or not all(
            isinstance(d, numbers.Integral) and not isinstance(d, bool) and d >= 1 for d in shape):
        raise ValueError(f"Expect {what} as a non-empty sequence of positive ints, got {input_shape!r}")
    return tuple(int(d) for d in shape)


def check_inputs(args) -> dict:
    """``{name: shape}`` of the module's inputs: ``inputs`` (several, named)
    or ``input_shape`` (one, named ``"input"``)."""
    inputs, shape = args.get("inputs"), args.get("input_shape", ())
    if inputs is None:
        return {INPUT: check_shape(shape)}
    if shape not in ((), [], None):
        raise ValueError(f"Expect input_shape or inputs, got both ({shape!r} and {inputs!r:.100})")
    if isinstance(inputs, Mapping):
        pairs = list(inputs.items())
    else:  # [name, shape] pairs: a configuration's order-keeping form
        try:
            pairs = [(n, s) for n, s in inputs]
        except (TypeError, ValueError):
            pairs = None
    if not pairs or not all(isinstance(n, str) and n for n, _ in pairs) or len({n for n, _ in pairs}) != len(pairs):
        raise ValueError(f"Expect inputs as a non-empty dict of distinct input names -> shape, got {inputs!r:.200}")
    return {name: check_shape(s, f"the shape of input {name!r}") for name, s in pairs}


def check_dtypes(input_dtypes, names) -> dict:
    dtypes = dict(input_dtypes or {})
    unknown = [k for k in dtypes if k not in names]
    bad = {k: v for k, v in dtypes.items() if v not in INPUT_DTYPES}
    if unknown or bad:
        raise ValueError(f"Expect input_dtypes of the inputs {names} in {list(INPUT_DTYPES)}, got "
                         + (f"unknown inputs {unknown}" if unknown else f"{bad}"))
    return {name: dtypes.get(name, "float32") for name in names}


def callable_or_reference(value, kind, what):
    """``(reference or None, callable)`` for a factory or loss given either way."""
    if isinstance(value, str):
        return value, resolve(value, kind)
    if callable(value):
        return reference_of(value), value
    raise ValueError(f"Expect the {what} as a 'package.module:function' string or a callable, got "
                     f"{type(value).__name__}")


class Plan:
    """A built module and its layout (what the constructor and ``planned_sizes`` share).

    ``meta=True`` builds the module on torch's ``meta`` device: shapes
    without memory, so a loader counts a file's parameters before it
    allocates them (a factory that cannot build there is built on the CPU).
    The buffers vector holds the persistent buffers, then the frozen
    parameters."""

    def __init__(self, args: dict, meta: bool = False):
        torch = _torch()
        self.inputs = check_inputs(args)
        self.input_dtypes = check_dtypes(args.get("input_dtypes"), list(self.inputs))
        self.factory_ref, factory = callable_or_reference(args["factory"], "factory", "module factory")
        kwargs = args.get("factory_kwargs") or {}
        if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
            raise ValueError(f"Expect factory_kwargs as a dict of keyword arguments, got {kwargs!r:.100}")
        self.factory, self.kwargs = factory, dict(kwargs)
        self.dtype = check_dtype(str(args.get("dtype", "float32")))
        dtype = str(self.dtype)
        seed = check_seed(args.get("seed", 123))
        name = self.factory_ref or getattr(factory, "__qualname__", repr(factory))
        module = None
        if meta:
            try:
                with torch.device("meta"):
                    module = factory(**self.kwargs)
            except Exception as exc:  # noqa: BLE001 -- any failure: count on the CPU instead
                logger.debug("the factory %r does not build on torch's meta device (%s: %s); counting its "
                             "parameters on the CPU", name, type(exc).__name__, exc)
                module = None
        if module is None:
            with torch.random.fork_rng(devices=[]):  # the user's global RNG is left as it was
                torch.manual_seed(int(seed))
                module = factory(**self.kwargs)
        if not isinstance(module, torch.nn.Module):
            raise ValueError(f"Expect the factory {name!r} to return a torch.nn.Module, got "
                             f"{type(module).__name__}")
        self.module = module.to(getattr(torch, dtype))
        self.params = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        self.frozen = [(n, p) for n, p in module.named_parameters() if not p.requires_grad]
        persistent = set(module.state_dict(keep_vars=True))
        self.buffers = [(n, b) for n, b in module.named_buffers() if n in persistent]
        # each parameter (buffer) tensor is its own owner; weights are those of two or more dimensions
        self.segments, self.num_params = segments_of([(n, tuple(p.shape), p.dim() > 1)] for n, p in self.params)
        self.buffer_segments, self.num_buffers = segments_of(
            [(n, tuple(b.shape), False)] for n, b in self.buffers + self.frozen)
