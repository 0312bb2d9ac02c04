"""Layers initialised from another model, by name (DL4J's
``TransferLearning``): a pretrained feature extractor under a new head.
Layer names are :meth:`~sparkavg.nn.flat.LayerModel.layer_names`'s."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from .finetune import _name
from .loading import load_model

__all__ = ["transfer"]


def transfer(source, target, layers: Sequence | None = None, *, trusted=None) -> list:
    """Initialise ``target``'s layers from ``source``'s, by name: the
    parameters and buffers (a BatchNorm's statistics) of every layer both
    models have (or of ``layers``), which must match in shape.

    ``source`` is a model or a model file (read with
    :func:`~sparkavg.nn.load_model`, ``trusted`` as there).  Returns the
    names of the layers copied.  A name missing on either side, or a layer
    whose tensors differ in name or shape, is named in the error; nothing is
    copied then.
    """
    if not hasattr(source, "layer_names"):
        source = load_model(source, trusted=trusted)
    src, dst = _tensors(source), _tensors(target)
    names = [n for n in target.layer_names() if n in src] if layers is None else [_name(n) for n in layers]
    missing = [n for n in names if n not in src or n not in dst]
    if missing:
        raise ValueError(f"Expect layers both models have, got {missing}: the source has {list(src)}, the target "
                         f"{list(dst)}")
    if not names:
        raise ValueError(f"Expect at least one layer name both models have, got none (source {list(src)}, "
                         f"target {list(dst)})")
    bad = [f"{n}: {sorted(src[n].items())} -> {sorted(dst[n].items())}" for n in names
           if {k: v[2] for k, v in src[n].items()} != {k: v[2] for k, v in dst[n].items()}]
    if bad:
        raise ValueError("Expect the same tensors (name and shape) in each layer copied, got " + "; ".join(
            b.replace("), (", "); (") for b in bad))
    params, buffers = np.array(_host(target.params)), np.array(_host(target.buffers))
    from_params, from_buffers = _host(source.params), _host(source.buffers)
    for n in names:
        for key, (kind, src_range, _) in src[n].items():
            into = params if kind == "param" else buffers
            from_ = from_params if kind == "param" else from_buffers
            start, stop = dst[n][key][1]
            into[start:stop] = from_[src_range[0]:src_range[1]]
    target.load_state({"params": params, "buffers": buffers})
    return names


def _host(a):
    return np.asarray(a.get() if hasattr(a, "__cuda_array_interface__") else a)


def _tensors(model) -> dict:
    """``{layer name: {tensor name: (kind, (start, stop), shape)}}`` of a layer-built model."""
    names = model.layer_names()
    out = {n: {} for n in names}
    for kind, segments in (("param", model.param_segments), ("buffer", model.buffer_segments)):
        for seg in segments:
            out[names[seg.layer]][f"{kind}:{seg.name}"] = (kind, (seg.start, seg.stop), tuple(seg.shape))
    return out
