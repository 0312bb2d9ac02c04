"""A native-engine model (:class:`~sparkavg.nn.Network`, :class:`~sparkavg.nn.Graph`)
as an ONNX graph, built with ``onnx.helper`` from its layers and flat vectors.

The graph computes ``model.output`` (inference mode: dropout is the
identity, BatchNorm uses its running statistics) in float32:

- one graph input per model input (``model.spec.inputs``), named as it,
  of shape ``(batch, *shape)`` in the user's convention ((C, H, W) images,
  (T, F) sequences, (features,)), float32 -- or int64 for an input only
  Embedding layers read (ids, which must lie in [0, vocab_size): the graph
  does not check them as the engine does);
- one graph output per model output, named as it (``"output"`` for a
  Network), ``(batch, units)``: softmax probabilities for ``nll``, sigmoid
  probabilities for ``bce``, the output layer's activation of the affine
  map otherwise;
- with ``encoding`` (a fit's ``DataOptions(scale=, normalize=)``, as
  :func:`sparkavg.data.transforms.input_encoding` gives it), the float
  inputs go through ``x * scale`` and ``(x - mean) / std`` first, as the
  MLflow pyfunc applies them: the graph then takes what the pyfunc takes
  (features converted to float32, e.g. uint8 pixel values).

Inside, the graph works in NCHW, ONNX's layout; the engine's channels-last
internals show only in its flat vectors, which are permuted as they are
written: a Conv2D kernel (KH, KW, C, F) becomes ONNX's (F, C, KH, KW), and
a Dense layer fed a (C, H, W) input (which the engine flattens in (H, W,
C) order) gets its weight rows reordered to ONNX's (C, H, W) flattening.

Recurrent layers become ONNX's ``LSTM`` and ``GRU`` operators (gate order
i, o, f, c and z, r, h against the engine's i, f, c, o and r, z, n;
``linear_before_reset=1`` for the GRU, whose new gate the engine computes
as PyTorch does), on time-major data.  A layer with ``mask_value`` skips
steps anywhere in a sequence, which those operators cannot (their
``sequence_lens`` only cuts a sequence's tail): it is unrolled over its T
steps instead, one ``Where`` per state carrying it through masked steps.

Each layer and combining vertex type has an exporter in :data:`EXPORTERS`,
by its registered type name; a model with a layer that has none, or with a
configuration ONNX cannot express, is refused with an :class:`ExportError`
naming the vertex, the layer and why.
"""
from __future__ import annotations

import json
import logging
import os
from typing import Callable, Dict, Optional

import numpy as np

from ..backend import to_cpu
from ..data.transforms import check_encoding_dict
from ..nn.activations import LEAKY_RELU_ALPHA

__all__ = ["ExportError", "OPSET", "EXPORTERS", "to_onnx", "export_layer_model", "save", "import_onnx"]

logger = logging.getLogger(__name__)

#: The ONNX opset of the graphs written (17: the first with LayerNormalization).
OPSET = 17


class ExportError(ValueError):
    """A model that cannot be exported as asked: the message names the
    vertex and layer (or module) and what ONNX cannot express."""


def import_onnx():
    """The ``onnx`` package, or an ImportError saying how to install it."""
    try:
        import onnx
    except ImportError as exc:
        raise ImportError(f"Exporting a model to ONNX needs the onnx package: pip install 'sparkavg[onnx]' "
                          f"({exc})") from exc
    return onnx


def _host(array) -> np.ndarray:
    """A float32 numpy copy of a parameter or buffer view (numpy or CuPy)."""
    return np.array(to_cpu(array), dtype=np.float32)


class _Builder:
    """The nodes and initializers of the graph being built, under unique names."""

    def __init__(self, onnx, reserved):
        self.helper, self.tensors = onnx.helper, onnx.numpy_helper
        self.TensorProto = onnx.TensorProto
        self.nodes, self.initializers = [], []
        self.ids = set()  # the names of int64 tensors (id inputs)
        self._used = set(reserved)

    def unique(self, base: str) -> str:
        name, k = base, 1
        while name in self._used:
            k += 1
            name = f"{base}_{k}"
        self._used.add(name)
        return name

    def const(self, base: str, value, dtype=np.float32) -> str:
        name = self.unique(base)
        # np.array, not ascontiguousarray: that makes a 0-d value (a step index) 1-d
        self.initializers.append(self.tensors.from_array(np.array(value, dtype=dtype, order="C"), name))
        return name

    def ints(self, base: str, values) -> str:
        return self.const(base, values, np.int64)

    def op(self, op_type: str, inputs, base: str, outputs: int = 1, **attributes):
        """Add one node; its output name (a list of ``outputs`` names when more than one)."""
        names = [self.unique(f"{base}/{op_type}" + (f":{i}" if outputs > 1 else "")) for i in range(outputs)]
        self.nodes.append(self.helper.make_node(op_type, list(inputs), names, name=names[0], **attributes))
        return names[0] if outputs == 1 else names


# ----------------------------------------------------------------- helpers
def _activation(b: _Builder, name: str, x: str, base: str) -> str:
    if name == "identity":
        return x
    if name == "relu":
        return b.op("Relu", [x], base)
    if name == "leaky_relu":
        return b.op("LeakyRelu", [x], base, alpha=LEAKY_RELU_ALPHA)
    if name == "tanh":
        return b.op("Tanh", [x], base)
    if name == "sigmoid":
        return b.op("Sigmoid", [x], base)
    if name == "softmax":
        return b.op("Softmax", [x], base, axis=-1)
    raise ExportError(f"Expect an activation ONNX export knows (identity, relu, leaky_relu, tanh, sigmoid, "
                      f"softmax), got {name!r}")


def _flat_rows(weights: np.ndarray, input_shape) -> np.ndarray:
    """Dense weights (n_in, units) with rows in ONNX's flattening order of the
    input: (C, H, W) rows for an image, whose engine order is (H, W, C)."""
    if len(input_shape) != 3:
        return weights
    c, h, w = input_shape
    return weights.reshape(h, w, c, -1).transpose(2, 0, 1, 3).reshape(c * h * w, -1)


def _flatten(b: _Builder, x: str, input_shape, base: str) -> str:
    return b.op("Flatten", [x], base, axis=1) if len(input_shape) > 1 else x


def _time_major(b: _Builder, x: str, base: str) -> str:
    return b.op("Transpose", [x], base, perm=[1, 0, 2])


#: Exporters by registered type name (the kinds "layer" and "combine"):
#: ``fn(builder, op, inputs, base) -> output name``, ``inputs`` one tensor
#: name for a layer, a list for a combining vertex.
EXPORTERS: Dict[str, Callable] = {}


def _exports(*names):
    def deco(fn):
        for name in names:
            EXPORTERS[name] = fn
        return fn
    return deco


# ------------------------------------------------------------------ layers
@_exports("Dense", "Output")
def _dense(b, layer, x, base):
    w = _flat_rows(_host(layer.W), layer.input_shape)
    y = b.op("Gemm", [_flatten(b, x, layer.input_shape, base), b.const(f"{base}.W", w),
                      b.const(f"{base}.b", _host(layer.b))], base)
    return _activation(b, layer.activation, y, base)


@_exports("Conv2D")
def _conv2d(b, layer, x, base):
    (kh, kw), (sh, sw), (ph, pw) = layer.kernel_size, layer.stride, layer.padding
    w = _host(layer.W).transpose(3, 2, 0, 1)  # (KH, KW, C, F) -> (F, C, KH, KW)
    y = b.op("Conv", [x, b.const(f"{base}.W", w), b.const(f"{base}.b", _host(layer.b))], base,
             kernel_shape=[kh, kw], strides=[sh, sw], pads=[ph, pw, ph, pw])
    return _activation(b, layer.activation, y, base)


@_exports("Conv1D")
def _conv1d(b, layer, x, base):
    k, s, p = layer.kernel_size, layer.stride, layer.padding
    w = _host(layer._conv.W).reshape(k, -1, layer.filters).transpose(2, 1, 0)  # (k, F, filters) -> (filters, F, k)
    channels_first = b.op("Transpose", [x], base, perm=[0, 2, 1])  # (N, T, F) -> (N, F, T)
    y = b.op("Conv", [channels_first, b.const(f"{base}.W", w), b.const(f"{base}.b", _host(layer._conv.b))], base,
             kernel_shape=[k], strides=[s], pads=[p, p])
    y = _activation(b, layer.activation, y, base)
    return b.op("Transpose", [y], base, perm=[0, 2, 1])


@_exports("MaxPool2D", "AvgPool2D")
def _pool(b, layer, x, base):
    op = "MaxPool" if type(layer).__name__ == "MaxPool2D" else "AveragePool"
    return b.op(op, [x], base, kernel_shape=list(layer.pool_size), strides=list(layer.stride))


@_exports("Activation")
def _standalone_activation(b, layer, x, base):
    return _activation(b, layer.name, x, base)


@_exports("Dropout")
def _dropout(b, layer, x, base):
    return x  # the identity at inference


@_exports("BatchNorm")
def _batch_norm(b, layer, x, base):
    return b.op("BatchNormalization",
                [x, b.const(f"{base}.gamma", _host(layer.gamma)), b.const(f"{base}.beta", _host(layer.beta)),
                 b.const(f"{base}.mean", _host(layer.running_mean)), b.const(f"{base}.var", _host(layer.running_var))],
                base, epsilon=layer.eps)


@_exports("LayerNorm")
def _layer_norm(b, layer, x, base):
    # Each example over all its values; gamma and beta per channel (per feature for a vector).
    shape = (-1, 1, 1) if len(layer.input_shape) == 3 else (-1,)
    return b.op("LayerNormalization",
                [x, b.const(f"{base}.gamma", _host(layer.gamma).reshape(shape)),
                 b.const(f"{base}.beta", _host(layer.beta).reshape(shape))],
                base, axis=1, epsilon=layer.eps)


@_exports("Flatten")
def _flatten_layer(b, layer, x, base):
    return _flatten(b, x, layer.input_shape, base)


@_exports("Reshape")
def _reshape(b, layer, x, base):
    if tuple(layer.output_shape) == tuple(layer.input_shape):
        return x
    return b.op("Reshape", [x, b.ints(f"{base}.shape", [-1, *layer.output_shape])], base)


@_exports("GlobalAvgPool", "GlobalMaxPool")
def _global_pool(b, layer, x, base):
    average = type(layer).__name__ == "GlobalAvgPool"
    if len(layer.input_shape) == 3:
        pooled = b.op("GlobalAveragePool" if average else "GlobalMaxPool", [x], base)
        return b.op("Flatten", [pooled], base, axis=1)
    return b.op("ReduceMean" if average else "ReduceMax", [x], base, axes=[1], keepdims=0)  # over time


@_exports("Embedding")
def _embedding(b, layer, x, base):
    table = _host(layer.W)
    if layer.padding_id is not None:
        table[layer.padding_id] = 0.0  # the engine's output for padding ids, whatever the row holds
    ids = x if x in b.ids else b.op("Cast", [x], base, to=b.TensorProto.INT64)
    y = b.op("Gather", [b.const(f"{base}.W", table), ids], base, axis=0)  # (N, T, dim)
    if layer.output_shape == (layer.dim,):  # one id per example
        y = b.op("Reshape", [y, b.ints(f"{base}.shape", [-1, layer.dim])], base)
    return y


# ---------------------------------------------------------------- recurrent
def _gate_blocks(matrix: np.ndarray, units: int, order) -> np.ndarray:
    """The (rows, G*units) engine matrix's gate blocks in ``order``, transposed: (G*units, rows)."""
    blocks = [matrix[..., g * units:(g + 1) * units] for g in order]
    return np.concatenate(blocks, axis=-1).T


#: ONNX's gate order as indices of the engine's (LSTM i, f, c, o -> i, o, f, c; GRU r, z, n -> z, r, h).
_ONNX_GATES = {"LSTM": (0, 3, 1, 2), "GRU": (1, 0, 2)}


@_exports("LSTM", "GRU")
def _recurrent(b, layer, x, base):
    if layer.mask_value is not None:
        return _unrolled(b, layer, x, base)
    kind, u = type(layer).__name__, layer.units
    order = _ONNX_GATES[kind]
    w = _gate_blocks(_host(layer.W), u, order)[None]
    r = _gate_blocks(_host(layer.RW), u, order)[None]
    wb = _gate_blocks(_host(layer.b)[None], u, order)[:, 0]
    rb = np.zeros_like(wb)
    attributes = {"hidden_size": u}
    if kind == "GRU":
        rb[2 * u:] = _host(layer.rb)  # inside the reset product, as linear_before_reset says
        attributes["linear_before_reset"] = 1
    y, y_last = b.op(kind, [_time_major(b, x, base), b.const(f"{base}.W", w), b.const(f"{base}.R", r),
                            b.const(f"{base}.B", np.concatenate([wb, rb])[None])], base, outputs=2 + (kind == "LSTM"),
                     **attributes)[:2]
    if layer.return_sequences:  # Y (T, 1, N, U) -> (N, T, U)
        squeezed = b.op("Squeeze", [y, b.ints(f"{base}.axes", [1])], base)
        return _time_major(b, squeezed, base)
    return b.op("Squeeze", [y_last, b.ints(f"{base}.axes", [0])], base)  # Y_h (1, N, U) -> (N, U)


def _unrolled(b, layer, x, base):
    """A recurrent layer with ``mask_value`` over its T steps: a step whose
    features all equal it carries the state through and outputs zeros."""
    t = layer.input_shape[0]
    u, lstm = layer.units, type(layer).__name__ == "LSTM"
    proj = b.op("Add", [b.op("MatMul", [x, b.const(f"{base}.W", _host(layer.W))], base),
                        b.const(f"{base}.b", _host(layer.b))], base)  # every step's input part, (N, T, G*U)
    same = b.op("Cast", [b.op("Equal", [x, b.const(f"{base}.mask_value", np.float32(layer.mask_value))], base)],
                base, to=b.TensorProto.FLOAT)
    masked = b.op("Cast", [b.op("ReduceMin", [same], base, axes=[2], keepdims=1)], base,
                  to=b.TensorProto.BOOL)  # (N, T, 1)
    rw = b.const(f"{base}.RW", _host(layer.RW))
    rb = None if lstm else b.const(f"{base}.rb", _host(layer.rb))
    zeros = b.const(f"{base}.zeros", np.zeros((1, u)))
    h = c = zeros
    steps = []
    for s in range(t):
        where = f"{base}/step{s}"
        step = b.ints(f"{where}.index", np.int64(s))
        p = b.op("Gather", [proj, step], where, axis=1)  # (N, G*U)
        skip = b.op("Gather", [masked, step], where, axis=1)  # (N, 1)
        rec = b.op("MatMul", [h, rw], where)
        if lstm:
            zi, zf, zg, zo = b.op("Split", [b.op("Add", [p, rec], where)], where, outputs=4, axis=1)
            c_new = b.op("Add", [b.op("Mul", [b.op("Sigmoid", [zf], where), c], where),
                                 b.op("Mul", [b.op("Sigmoid", [zi], where), b.op("Tanh", [zg], where)], where)], where)
            h_new = b.op("Mul", [b.op("Sigmoid", [zo], where), b.op("Tanh", [c_new], where)], where)
            c = b.op("Where", [skip, c, c_new], where)
        else:
            pr, pz, pn = b.op("Split", [p], where, outputs=3, axis=1)
            rr, rz, rn = b.op("Split", [rec], where, outputs=3, axis=1)
            reset = b.op("Sigmoid", [b.op("Add", [pr, rr], where)], where)
            update = b.op("Sigmoid", [b.op("Add", [pz, rz], where)], where)
            new = b.op("Tanh", [b.op("Add", [pn, b.op("Mul", [reset, b.op("Add", [rn, rb], where)], where)], where)],
                       where)
            keep_new = b.op("Sub", [b.const(f"{where}.one", np.float32(1.0)), update], where)
            h_new = b.op("Add", [b.op("Mul", [keep_new, new], where), b.op("Mul", [update, h], where)], where)
        h = b.op("Where", [skip, h, h_new], where)
        if layer.return_sequences:
            out = b.op("Where", [skip, zeros, h], where)
            steps.append(b.op("Unsqueeze", [out, b.ints(f"{where}.axes", [1])], where))
    if not layer.return_sequences:
        return h
    return b.op("Concat", steps, base, axis=1) if len(steps) > 1 else steps[0]


# --------------------------------------------------------------- vertices
@_exports("Merge")
def _merge(b, vertex, xs, base):
    # features of (N, T, F) sequences; channels of (N, C, H, W), features of (N, F)
    return b.op("Concat", xs, base, axis=2 if len(vertex.output_shape) == 2 else 1)


@_exports("Add")
def _add(b, vertex, xs, base):
    return b.op("Sum", xs, base)


@_exports("Multiply")
def _multiply(b, vertex, xs, base):
    y = xs[0]
    for x in xs[1:]:
        y = b.op("Mul", [y, x], base)
    return y


# ------------------------------------------------------------------ graph
def _encode(b: _Builder, x: str, encoding: Optional[dict]) -> str:
    """``x * scale``, then ``(x - mean) / std``: the pyfunc's input encoding, in float32."""
    if not encoding:
        return x
    base = f"{x}/encoding"
    if encoding.get("scale") is not None:
        x = b.op("Mul", [x, b.const(f"{base}.scale", np.float32(encoding["scale"]))], base)
    if encoding.get("normalize") is not None:
        mean, std = encoding["normalize"]
        x = b.op("Sub", [x, b.const(f"{base}.mean", np.float32(mean))], base)
        x = b.op("Div", [x, b.const(f"{base}.std", np.float32(std))], base)
    return x


def to_onnx(model, encoding: Optional[dict] = None):
    """The ONNX graph of a Network or Graph (see the module doc).

    Parameters
    ----------
    model : Network or Graph
        Any model built of sparkavg layers (``model._wiring()`` says how).
    encoding : dict, optional
        ``{"scale": s or None, "normalize": [mean, std] or None}``
        (:func:`sparkavg.data.transforms.input_encoding`): applied to the
        float inputs first.

    Returns
    -------
    onnx.ModelProto
        Checked with ``onnx.checker``.

    Raises
    ------
    ExportError
        A layer without an exporter, or a configuration ONNX cannot
        express; the message names the vertex and the layer.
    """
    onnx = import_onnx()
    encoding = check_encoding_dict(encoding, "export_onnx(encoding=)")
    inputs, vertices, outputs = model._wiring()
    spec = model.spec
    dtypes = {i.name: i.dtype for i in spec.inputs}
    b = _Builder(onnx, reserved=list(inputs) + list(outputs))
    values = {}
    for name in inputs:
        if dtypes[name] == "int64":
            b.ids.add(name)
            values[name] = name
        else:
            values[name] = _encode(b, name, encoding)
    for name, op, sources in vertices:
        kind = type(op).__name__
        fn = EXPORTERS.get(kind)
        if fn is None:
            raise ExportError(f"Vertex {name!r}: expect a layer ONNX export knows ({', '.join(sorted(EXPORTERS))}), "
                              f"got {kind}: add its exporter to sparkavg.export.onnx.EXPORTERS")
        args = [values[s] for s in sources]
        try:
            values[name] = fn(b, op, args if kind in ("Merge", "Add", "Multiply") else args[0], name)
        except ExportError as exc:
            raise ExportError(f"Vertex {name!r} ({kind}): {exc}") from None
    for name in outputs:
        if values[name] != name:
            b.nodes.append(b.helper.make_node("Identity", [values[name]], [name], name=f"{name}/Identity"))
    shapes = dict(inputs)
    units = {o.name: o.units for o in spec.outputs}
    h, tp = b.helper, b.TensorProto
    graph = h.make_graph(
        b.nodes, type(model).__name__,
        [h.make_tensor_value_info(n, tp.INT64 if dtypes[n] == "int64" else tp.FLOAT, ["batch", *shapes[n]])
         for n in inputs],
        [h.make_tensor_value_info(n, tp.FLOAT, ["batch", units[n]]) for n in outputs],
        b.initializers)
    from .. import __version__

    proto = h.make_model(graph, opset_imports=[h.make_opsetid("", OPSET)], producer_name="sparkavg",
                         producer_version=__version__,
                         doc_string=f"sparkavg {type(model).__name__}: outputs {[o.name for o in spec.outputs]} "
                                    f"as model.output() gives them")
    h.set_model_props(proto, {"sparkavg.outputs": json.dumps([[o.name, o.loss] for o in spec.outputs]),
                              "sparkavg.input_encoding": json.dumps(encoding)})
    proto.ir_version = min(proto.ir_version, 8)  # opset 17's: onnxruntime reads it from release 1.12 on
    onnx.checker.check_model(proto)
    return proto


def save(proto, path) -> None:
    """Write an ONNX ``ModelProto`` to ``path`` (a file name)."""
    onnx = import_onnx()
    folder = os.path.dirname(os.fspath(path))
    if folder:
        os.makedirs(folder, exist_ok=True)
    onnx.save_model(proto, os.fspath(path))


def export_layer_model(model, path, encoding: Optional[dict] = None) -> None:
    """:func:`to_onnx`, written to ``path``."""
    save(to_onnx(model, encoding), path)
    logger.info("exported %s (%d parameters) as ONNX to %s", type(model).__name__, model.num_params, path)
