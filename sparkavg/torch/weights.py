"""Pretrained weights for a :class:`~sparkavg.torch.TorchModel`, and the
digest that pins its frozen parameters.

:func:`read_state_dict` reads a ``state_dict`` file written by
``torch.save(module.state_dict(), path)`` with ``torch.load(...,
weights_only=True)`` (tensors and plain containers only: no code is
unpickled) or an ``.npz`` of arrays by the same names
(``numpy.load(..., allow_pickle=False)``); :func:`load_into` copies it
into a freshly built module, naming every key or shape that does not
match.  The model reads the file once, on the driver: its values become
the flat vectors that ship to the executors, whose factories build the
module and are never asked to load or download anything.

:func:`frozen_digest` is the SHA-256 of the frozen parameters
(``requires_grad=False``) as they sit in the flat ``buffers`` vector: a
model's configuration carries it, so a model rebuilt from that
configuration (an executor's, a loaded file's) knows which values it is to
receive (:meth:`TorchModel.load_state <sparkavg.torch.TorchModel.load_state>`).
"""
from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Mapping

import numpy as np

__all__ = ["read_state_dict", "load_into", "frozen_digest"]

logger = logging.getLogger(__name__)

#: Keys listed in a message before "... (N in all)".
_SHOWN = 10


def _listed(keys) -> str:
    keys = list(keys)
    shown = ", ".join(repr(k) for k in keys[:_SHOWN])
    return shown + (f" ... ({len(keys)} in all)" if len(keys) > _SHOWN else "")


def read_state_dict(source) -> dict:
    """``{name: tensor}`` from a ``state_dict`` file (``torch.load`` with
    ``weights_only=True``), an ``.npz`` of arrays, or a mapping given in code.

    Raises
    ------
    ValueError
        The file holds something other than a mapping of names to tensors
        (or arrays), naming the file and the first offending entry.
    OSError
        The file cannot be read.
    """
    import torch

    if isinstance(source, Mapping):
        where, state = "init_weights", dict(source)
    elif isinstance(source, (str, os.PathLike)):
        where = os.fspath(source)
        if where.endswith(".npz"):
            with np.load(where, allow_pickle=False) as archive:
                state = {name: torch.from_numpy(np.array(archive[name])) for name in archive.files}
        else:
            try:
                state = torch.load(where, map_location="cpu", weights_only=True)
            except Exception as exc:  # noqa: BLE001 -- torch raises an UnpicklingError, RuntimeError ...: named
                # torch's own text suggests weights_only=False: only the line naming what it refused is kept
                detail = next((line.strip() for line in str(exc).splitlines()
                               if "GLOBAL" in line or "Unpickler error" in line), type(exc).__name__)
                raise ValueError(f"Expect init_weights {where!r} to be a state_dict written by torch.save (tensors "
                                 f"only: it is read with torch.load(weights_only=True), never unpickling code) or an "
                                 f".npz, got a file it refused ({detail})") from None
            if not isinstance(state, Mapping):
                raise ValueError(f"Expect init_weights {where!r} to hold a state_dict (a mapping of names to tensors), "
                                 f"got {type(state).__name__}")
            state = dict(state)
    else:
        raise ValueError(f"Expect init_weights as a path to a state_dict or .npz file, or a mapping of names to "
                         f"tensors, got {type(source).__name__}")
    for name, value in state.items():
        if isinstance(value, np.ndarray):
            state[name] = torch.from_numpy(value)
        elif not torch.is_tensor(value):
            nested = " (a checkpoint holding a state_dict under this key: save that entry alone)" \
                if isinstance(value, Mapping) else ""
            raise ValueError(f"Expect init_weights {where!r} to map names to tensors, got {type(value).__name__} for "
                             f"{name!r}{nested}")
    return state


def load_into(module, state: dict, strict: bool, where: str) -> None:
    """Copy ``state`` into ``module``'s parameters and persistent buffers.

    Every key of ``state`` must be one of the module's, with its shape;
    with ``strict`` every one of the module's must be in ``state`` too
    (otherwise the missing ones keep the factory's values: a new head).

    Raises
    ------
    ValueError
        Naming the unexpected keys, the keys of another shape (both shapes)
        and, with ``strict``, the missing keys.
    """
    import torch

    own = module.state_dict()
    unexpected = [k for k in state if k not in own]
    shapes = [f"{k!r}: {tuple(state[k].shape)} in the file, {tuple(own[k].shape)} in the module"
              for k in state if k in own and tuple(state[k].shape) != tuple(own[k].shape)]
    missing = [k for k in own if k not in state]
    problems = []
    if unexpected:
        problems.append(f"keys the module does not have: {_listed(unexpected)}")
    if shapes:
        problems.append("shapes that differ: " + "; ".join(shapes[:_SHOWN])
                        + (f" ... ({len(shapes)} in all)" if len(shapes) > _SHOWN else ""))
    if missing and strict:
        problems.append(f"the module's keys the file lacks: {_listed(missing)} (init_strict=False keeps the "
                        f"factory's values for them)")
    if problems:
        raise ValueError(f"Expect init_weights {where} to match the module's state_dict, got " + "; ".join(problems))
    with torch.no_grad():
        for name, value in state.items():
            own[name].copy_(value)
    if missing:
        logger.info("init_weights %s: %d of the module's entries keep the factory's values: %s", where,
                    len(missing), _listed(missing))


def frozen_digest(buffers, ranges) -> str:
    """SHA-256 (hex) of the ``(start, stop)`` ranges of a host ``buffers`` vector."""
    digest = hashlib.sha256()
    for start, stop in ranges:
        digest.update(np.ascontiguousarray(buffers[start:stop]).tobytes())
    return digest.hexdigest()
