"""``Graph``: DL4J's ComputationGraph -- named inputs and vertices that
name their inputs (the Keras functional API), over the same flat vectors
and updaters as :class:`~sparkavg.nn.network.Network`.

    g = Graph(
        inputs={"image": (1, 28, 28)},
        vertices=[
            ("conv", Conv2D(16, 3, padding=1), "image"),
            ("bn", BatchNorm(), "conv"),
            ("relu", Activation("relu"), "bn"),
            ("skip", Add(), ["relu", "conv"]),          # a residual connection
            ("pool", GlobalAvgPool(), "skip"),
            ("out", Output(10), "pool"),
        ],
        outputs=["out"])

A vertex is a layer (one input) or a combining vertex
(:mod:`sparkavg.nn.vertices`: ``Merge``, ``Add``, ``Multiply``; several
inputs).  Outputs are vertices whose layer is an
:class:`~sparkavg.nn.output.Output`; with several, the losses are summed
with ``loss_weights`` (default 1 each).  Vertices may be listed in any
order; cycles, unknown or unused names are refused, naming them.

Back-propagation visits the vertices in reverse topological order.  Where
a value fans out to several consumers, their gradients are summed into
the array the first consumer handed over (each array has one owner at a
time: see the ownership rules of :mod:`sparkavg.nn.layers`), so a layer
may overwrite the gradient it receives without corrupting another branch.

Data: one input takes an array; several take a dict by input name (or a
list in input order).  Labels likewise by output name.  :meth:`output`
returns an array for one output, a dict by output name for several.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Mapping, Sequence, Tuple, Union

import numpy as np

from ..configurable import Configurable, from_config, register
from .clipping import GradientNormalization
from .finetune import FineTuning
from .flat import LayerModel
from .flatstate import check_updater
from .layers import Layer
from .losses import predicted
from .model import InputSpec, ModelSpec, OutputSpec, config_fingerprint
from .network import format_summary, prepare_input
from .output import Output
from .updaters import Updater
from .vertices import Combine

__all__ = ["Graph", "Vertex"]


@register("vertex")
@dataclass(frozen=True)
class Vertex(Configurable):
    """One named vertex: ``op`` (a layer or a combining vertex) applied to
    the values named by ``inputs`` (graph inputs or other vertices)."""

    _config_kind = "vertex"

    name: str
    op: Union[Layer, Combine]
    inputs: Tuple[str, ...]

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"Expect a vertex name as a non-empty str, got {self.name!r}")
        inputs = (self.inputs,) if isinstance(self.inputs, str) else tuple(self.inputs)
        if not inputs or not all(isinstance(i, str) for i in inputs):
            raise ValueError(f"Expect vertex {self.name!r} inputs as a name or a list of names, got {self.inputs!r}")
        object.__setattr__(self, "inputs", inputs)
        if not isinstance(self.op, (Layer, Combine)):
            raise ValueError(f"Expect vertex {self.name!r} op to be a Layer or a combining vertex (Merge, Add, "
                             f"Multiply), got {type(self.op).__name__}")
        if isinstance(self.op, Layer) and len(inputs) != 1:
            raise ValueError(f"Expect one input to layer vertex {self.name!r}, got {list(inputs)}; combine several "
                             f"first with Merge, Add or Multiply")


def _as_vertex(v) -> Vertex:
    if isinstance(v, Vertex):
        return v
    if isinstance(v, (tuple, list)) and len(v) == 3:
        return Vertex(v[0], v[1], v[2])
    raise ValueError(f"Expect a vertex as Vertex(name, op, inputs) or a (name, op, inputs) tuple, got {v!r:.200}")


def _shape(name, value):
    shape = tuple(value.tolist() if isinstance(value, np.ndarray) else value) \
        if isinstance(value, (tuple, list, np.ndarray)) else None
    if shape is None or len(shape) not in (1, 2, 3) or not all(
            isinstance(d, numbers.Integral) and not isinstance(d, bool) and d >= 1 for d in shape):
        raise ValueError(f"Expect input {name!r} shape as (C, H, W), (T, F) or (features,) of positive ints, "
                         f"got {value!r}")
    return tuple(int(d) for d in shape)


def _topology(input_shapes: dict, vertices: list, outputs: list):
    """Vertices in topological order (fresh, built ops), each with its
    input shapes; raises ValueError naming a cycle, an unknown or an unused name."""
    names = [v.name for v in vertices]
    dup = sorted({n for n in names if names.count(n) > 1} | (set(names) & set(input_shapes)))
    if dup:
        raise ValueError(f"Expect unique vertex and input names, got {dup} more than once")
    by_name = {v.name: v for v in vertices}
    for v in vertices:
        unknown = [i for i in v.inputs if i not in by_name and i not in input_shapes]
        if unknown:
            raise ValueError(f"Expect vertex {v.name!r} inputs among the graph's inputs and vertices, got unknown "
                             f"{unknown}")
    order, state = [], {}

    def visit(name, path):
        if name in input_shapes:
            return
        if state.get(name) == "done":
            return
        if state.get(name) == "active":
            cycle = path[path.index(name):] + [name]
            raise ValueError(f"Expect an acyclic graph, got the cycle {' -> '.join(cycle)}")
        state[name] = "active"
        for i in by_name[name].inputs:
            visit(i, path + [name])
        state[name] = "done"
        order.append(by_name[name])

    for name in outputs:
        if name not in by_name:
            raise ValueError(f"Expect outputs among the vertices, got unknown {name!r}")
        visit(name, [])
    unused = [n for n in names if n not in state] + [n for n in input_shapes
                                                     if not any(n in v.inputs for v in order)]
    if unused:
        raise ValueError(f"Expect every input and vertex to lead to an output, got unused {unused}")
    return order


@register("network")
class Graph(LayerModel):
    """A computation graph trained one minibatch at a time (see the module doc).

    Parameters
    ----------
    inputs : dict of str -> tuple of int
        Named inputs and one example's shape each ((C, H, W), (T, F) or
        (features,)), in order.
    vertices : sequence of Vertex or (name, op, inputs) tuples
        ``op`` a :class:`~sparkavg.nn.layers.Layer` (one input) or a
        combining vertex (``Merge``, ``Add``, ``Multiply``).  The graph
        builds its own copies of the ops.
    outputs : sequence of str
        Output vertices (their op an :class:`~sparkavg.nn.output.Output`).
    loss_weights : dict of str -> float, optional
        Each output's weight in the summed loss (default 1).
    updater, l2, l2_bias, weight_decay, seed, dtype, gradient_normalization, fine_tuning
        As :class:`~sparkavg.nn.network.Network` (a layer of
        ``gradient_normalization`` is a vertex's layer; ``fine_tuning``
        names vertices).
    """

    def __init__(self, inputs: Mapping[str, Sequence[int]], vertices: Sequence[Vertex], outputs: Sequence[str],
                 loss_weights: Mapping[str, float] | None = None, updater: Updater | None = None,
                 l2: float = 0.0, l2_bias: float = 0.0, weight_decay: float = 0.0, seed: int = 123,
                 dtype: str = "float32", gradient_normalization: GradientNormalization | None = None,
                 fine_tuning: FineTuning | None = None):
        structure = self._graph(inputs, vertices, outputs, loss_weights)
        self.inputs, self._order, self.outputs, self.loss_weights, layers = structure
        self._init_layers(layers, updater, l2, l2_bias, weight_decay, seed, dtype, gradient_normalization,
                          fine_tuning)
        self._plan()

    # ------------------------------------------------------------ structure
    @staticmethod
    def _graph(inputs, vertices, outputs, loss_weights):
        if isinstance(inputs, Mapping):
            pairs = list(inputs.items())
        else:
            try:
                pairs = [(n, s) for n, s in inputs]
            except (TypeError, ValueError):
                raise ValueError(f"Expect inputs as a dict of name -> shape, got {inputs!r:.200}") from None
        if not pairs:
            raise ValueError("Expect at least one graph input, got none")
        input_shapes = {}
        for name, shape in pairs:
            if not isinstance(name, str) or not name:
                raise ValueError(f"Expect input names as non-empty str, got {name!r}")
            input_shapes[name] = _shape(name, shape)
        if isinstance(outputs, str):
            outputs = [outputs]
        outputs = list(outputs)
        if not outputs or len(set(outputs)) != len(outputs):
            raise ValueError(f"Expect one or more distinct output names, got {outputs!r}")
        vertices = [_as_vertex(v) for v in vertices]
        order = _topology(input_shapes, vertices, outputs)
        # Fresh, unbuilt copies of the ops: the objects passed in stay untouched.
        built, shapes = [], dict(input_shapes)
        for v in order:
            kind = "layer" if isinstance(v.op, Layer) else "combine"
            op = from_config(v.op.to_config(), kind=kind)
            try:
                shapes[v.name] = (op.build(shapes[v.inputs[0]]) if isinstance(op, Layer)
                                  else op.build([shapes[i] for i in v.inputs]))
            except ValueError as exc:
                raise ValueError(f"Vertex {v.name!r} ({type(op).__name__}): {exc}") from None
            built.append(Vertex(v.name, op, v.inputs))
        by_name = {v.name: v for v in built}
        for name in outputs:
            if not isinstance(by_name[name].op, Output):
                raise ValueError(f"Expect output vertex {name!r} to be an Output layer, got "
                                 f"{type(by_name[name].op).__name__}")
        for v in built:
            if isinstance(v.op, Output) and v.name not in outputs:
                raise ValueError(f"Expect Output layer vertex {v.name!r} among the outputs {outputs}")
        weights = {name: 1.0 for name in outputs}
        for name, w in dict(loss_weights or {}).items():
            if name not in weights:
                raise ValueError(f"Expect loss_weights for outputs among {outputs}, got {name!r}")
            if isinstance(w, bool) or not isinstance(w, numbers.Real) or not np.isfinite(w) or w < 0:
                raise ValueError(f"Expect loss weight of {name!r} as a finite float >= 0, got {w!r}")
            weights[name] = float(w)
        layers = [v.op for v in built if isinstance(v.op, Layer)]
        return input_shapes, built, outputs, weights, layers

    @classmethod
    def _structure(cls, args):
        *_, layers = cls._graph(args["inputs"], args["vertices"], args["outputs"], args.get("loss_weights"))
        return layers, check_updater(args.get("updater"))

    def layer_names(self) -> list:
        """The vertex name of each layer, in :attr:`layers` order."""
        return [v.name for v in self._order if isinstance(v.op, Layer)]

    def _plan(self):
        """Per vertex: its consumers count (fan-out) and whether it needs input gradients."""
        self._consumers = {name: 0 for name in self.inputs}
        for v in self._order:
            self._consumers[v.name] = 0
        for v in self._order:
            for i in v.inputs:
                self._consumers[i] += 1
        self._need = {v.name: [i not in self.inputs for i in v.inputs] for v in self._order}

    # --------------------------------------------------------------- spec
    @property
    def spec(self) -> ModelSpec:
        by_name = {v.name: v for v in self._order}
        return ModelSpec(tuple(InputSpec(n, s, self._input_dtype(n)) for n, s in self.inputs.items()),
                         tuple(OutputSpec(n, int(by_name[n].op.units), by_name[n].op.loss_name,
                                          self.loss_weights[n]) for n in self.outputs))

    def _wiring(self):
        return dict(self.inputs), [(v.name, v.op, list(v.inputs)) for v in self._order], list(self.outputs)

    def _input_dtype(self, name: str) -> str:
        """``"int64"`` for an input that only Embedding layers read (ids), else ``"float32"``."""
        from .embedding import Embedding

        readers = [v.op for v in self._order if name in v.inputs]
        return "int64" if readers and all(isinstance(op, Embedding) for op in readers) else "float32"

    def fingerprint(self) -> str:
        return config_fingerprint(self.to_config(), drop=("updater", "l2", "l2_bias", "weight_decay", "seed",
                                                          "dtype", "loss_weights", "gradient_normalization",
                                                          "fine_tuning"))

    # --------------------------------------------------------------- data
    def _named(self, value, names, what):
        """``value`` as a dict by ``names`` (one name: the bare value too)."""
        if isinstance(value, Mapping):
            missing, extra = [n for n in names if n not in value], [k for k in value if k not in names]
            if missing or extra:
                raise ValueError(f"Expect {what} keyed by {names}, got keys {list(value)}")
            return {n: value[n] for n in names}
        if len(names) == 1:
            return {names[0]: value}
        if isinstance(value, (list, tuple)) and len(value) == len(names):
            return dict(zip(names, value))
        raise ValueError(f"Expect {what} as a dict keyed by {names} (or a list in that order), "
                         f"got {type(value).__name__}")

    def _prepare(self, x):
        xs = self._named(x, list(self.inputs), "inputs")
        prepared = {n: prepare_input(self, a, self.inputs[n]) for n, a in xs.items()}
        counts = {n: a.shape[0] for n, a in prepared.items()}
        if len(set(counts.values())) != 1:
            raise ValueError(f"Expect every input with the same number of examples, got {counts}")
        return prepared, next(iter(counts.values()))

    def _forward(self, values, training):
        for v in self._order:
            args = [values[i] for i in v.inputs]
            values[v.name] = v.op.forward(args[0], training) if isinstance(v.op, Layer) else \
                v.op.forward(args, training)
        return values

    def _loss_terms(self, x, y, weights=None):
        values, n = self._prepare(x)
        if n == 0:
            raise ValueError("Expect a non-empty batch, got 0 examples")
        ys = self._named(y, self.outputs, "labels")
        by_name = {v.name: v for v in self._order}
        labels = {}
        for name in self.outputs:
            count = len(ys[name]) if hasattr(ys[name], "__len__") else None
            if count != n:
                raise ValueError(f"Expect x and y with the same number of examples, got {n} inputs and {count} "
                                 f"labels for output {name!r}")
            labels[name] = by_name[name].op.prepare_labels(ys[name], n, self.xp, self.dtype, weights)
        self._forward(values, training=True)
        terms, grads = [], {}
        for v in reversed(self._order):
            if isinstance(v.op, Output):
                w = self.loss_weights[v.name]
                total, count = v.op.loss_sum(labels[v.name])
                terms.append((w, total, count))
                need = self._need[v.name][0]
                dx = v.op.backward_loss(labels[v.name], need_dx=need)
                if w != 1.0:
                    v.op.dW *= self.dtype.type(w)
                    v.op.db *= self.dtype.type(w)
                    if dx is not None:
                        dx *= self.dtype.type(w)
                self._hand(grads, v.inputs[0], dx)
                continue
            dy = grads.pop(v.name, None)
            if dy is None:  # no output depends on this value with a gradient (e.g. a zero loss weight path)
                dy = self.xp.zeros((n,) + values[v.name].shape[1:], dtype=self.dtype)
            if isinstance(v.op, Layer):
                self._hand(grads, v.inputs[0], v.op.backward(dy, need_dx=self._need[v.name][0]))
            else:
                for i, dx in zip(v.inputs, v.op.backward(dy, self._need[v.name])):
                    self._hand(grads, i, dx)
        return terms

    def _hand(self, grads, name, dx):
        """Add a consumer's gradient for value ``name`` (the array is handed
        over: the first one received becomes the sum)."""
        if dx is None or name in self.inputs:
            return
        if name in grads:
            grads[name] += dx
        else:
            grads[name] = dx

    def fit(self, x, y, batch_size=64, epochs=1, shuffle=True, weights=None) -> list:
        """Minibatch training on in-memory arrays (dicts by name for several
        inputs or outputs); advances :attr:`epoch`.  Returns each epoch's mean
        loss.  ``weights``: one per example (every output's loss), or None."""
        xs = self._named(x, list(self.inputs), "inputs")
        ys = self._named(y, self.outputs, "labels")
        n = len(next(iter(xs.values())))
        if any(len(a) != n for a in (*xs.values(), *ys.values())):
            raise ValueError(f"Expect x and y with the same number of examples, got "
                             f"{ {k: len(a) for k, a in {**xs, **ys}.items()} }")
        xs = xs if len(xs) > 1 else next(iter(xs.values()))
        ys = ys if len(ys) > 1 else next(iter(ys.values()))
        return super().fit(xs, ys, batch_size, epochs, shuffle, weights)

    # ----------------------------------------------------------- inference
    def output(self, x):
        """Outputs in inference mode, computed in chunks of
        :attr:`inference_batch_size`: an (N, units) array for one output, a
        dict by output name for several (class probabilities for softmax outputs)."""
        prepared, n = self._prepare(x)
        by_name = {v.name: v for v in self._order}
        result = {name: self.xp.empty((n,) + tuple(by_name[name].op.output_shape), dtype=self.dtype)
                  for name in self.outputs}
        step = max(1, int(self.inference_batch_size))
        for start in range(0, n, step):
            values = self._forward({k: a[start:start + step] for k, a in prepared.items()}, training=False)
            for name in self.outputs:
                result[name][start:start + step] = values[name]
        return result[self.outputs[0]] if len(self.outputs) == 1 else result

    def predict(self, x):
        """The prediction per example (a dict by output name for several
        outputs), as :meth:`FlatModel.predict <sparkavg.nn.flat.FlatModel.predict>` says."""
        out = self.output(x)
        targets = {o.name: o.target for o in self.spec.outputs}
        if isinstance(out, dict):
            return {k: predicted(targets[k], v) for k, v in out.items()}
        return predicted(targets[self.outputs[0]], out)

    def score(self, x, y) -> float:
        """Weighted sum of the outputs' mean losses (inference mode, chunked) + L2 penalty."""
        prepared, n = self._prepare(x)
        if n == 0:
            raise ValueError("Expect a non-empty batch, got 0 examples")
        ys = self._named(y, self.outputs, "labels")
        by_name = {v.name: v for v in self._order}
        labels = {name: by_name[name].op.prepare_labels(ys[name], n, self.xp, self.dtype) for name in self.outputs}
        step = max(1, int(self.inference_batch_size))
        total = 0.0
        for start in range(0, n, step):
            self._forward({k: a[start:start + step] for k, a in prepared.items()}, training=False)
            rows = min(step, n - start)
            for name in self.outputs:
                total += self.loss_weights[name] * by_name[name].op.loss(labels[name].rows(start, start + step)) * rows
        return total / n + self.flat.penalty()

    # ------------------------------------------------------------- config
    def config_arguments(self) -> dict:
        return {
            "inputs": {n: list(s) for n, s in self.inputs.items()},
            "vertices": [Vertex(v.name, v.op, v.inputs) for v in self._order],
            "outputs": list(self.outputs),
            "loss_weights": dict(self.loss_weights),
            **self._training_options(),
        }

    def summary(self) -> str:
        """A table of vertices (with their inputs), output shapes and parameter counts."""
        counts = self._layer_param_counts()
        index = {id(layer): i for i, layer in enumerate(self.layers)}
        rows = [("name", "vertex <- inputs", "output shape", "params")]
        for name, shape in self.inputs.items():
            rows.append((name, "input", str(shape), ""))
        for v in self._order:
            params = counts[index[id(v.op)]] if id(v.op) in index else 0
            rows.append((v.name, f"{v.op!r} <- {', '.join(v.inputs)}", str(v.op.output_shape), f"{params:,}"))
        return format_summary(self, rows)

    def __repr__(self):
        return (f"Graph(inputs={list(self.inputs)}, vertices={len(self._order)}, outputs={self.outputs}, "
                f"num_params={self.num_params}, updater={self.updater!r})")
