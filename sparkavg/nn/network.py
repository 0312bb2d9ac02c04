"""The network: a stack of layers over ONE flat parameter vector.

Every layer's weights and biases are views into :attr:`Network.params`;
gradients likewise live in one flat vector, and the updater's state in a
third (:attr:`Network.updater_state`).  Averaging, broadcasting, encoding
and saving therefore act on a few flat arrays, never per layer.

Configuration: a network is a :class:`~sparkavg.configurable.Configurable`
registered under the kind ``"network"``; :meth:`Network.to_config` gives
``{"type": "Network", "input_shape": ..., "layers": [layer configs],
"updater": {...}, ...}`` and ``from_config(config, kind="network")``
rebuilds a freshly initialised network (same seed, same initial
parameters).  :meth:`Network.to_json` / :meth:`Network.from_json` are the
same as JSON text; the latter also reads the version-1 layout written
before configs carried a ``"type"`` (:func:`~sparkavg.nn.upgrades.upgrade_config`).
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
import numbers
from collections.abc import Sequence

import numpy as np

from ..configurable import from_config, register
from .finetune import FineTuning
from .flat import LayerModel
from .flatstate import Segment, check_updater
from .layers import Layer
from .model import InputSpec, ModelSpec, OutputSpec, one_input
from .output import Output
from .clipping import GradientNormalization
from .updaters import Updater
from .upgrades import upgrade_config

__all__ = ["Network", "upgrade_config", "Segment"]

logger = logging.getLogger(__name__)


@register("network")
class Network(LayerModel):
    """A feed-forward network trained one minibatch at a time (a sequential
    stack of layers ending in an :class:`~sparkavg.nn.output.Output`).

    Parameters
    ----------
    input_shape : tuple of int
        One example's shape without the batch axis: (C, H, W) for images
        (NCHW convention) or (features,).  Inputs may also arrive flat,
        (batch, prod(input_shape)), in C order.
    layers : sequence of Layer
        The stack; the last one must be an :class:`~sparkavg.nn.layers.Output`.
        The network builds its own copies (from each layer's config), so the
        objects passed in are not modified.
    updater : Updater, default Adam(lr=1e-3)
        See :mod:`sparkavg.nn.updaters`.
    l2 : float, default 0
        L2 penalty ``0.5 * l2 * sum(W**2)`` on weights (not biases, as DL4J):
        ``l2 * W`` is added to the gradient before the updater, and the
        penalty is part of every loss this class reports.
    l2_bias : float, default 0
        The same penalty for biases (DL4J's ``l2Bias``).
    weight_decay : float, default 0
        Decoupled weight decay on weights (DL4J ``WeightDecay`` with
        ``applyLR``): after the updater, ``update -= lr * weight_decay * W``.
    seed : int, default 123
        Seeds weight init (bit-identical networks for one seed) and dropout.
    dtype : {'float32', 'float64'}
        Of parameters, gradients, state and activations; float64 is for
        gradient checks.
    gradient_normalization : GradientNormalization, optional
        What each training step does to the loss gradient before L2 and the
        updater: ``ClipGlobalNorm(1.0)``, ``ClipL2PerLayer(...)``, ... (see
        :mod:`sparkavg.nn.clipping`); None (the default) leaves it as it is.
    fine_tuning : FineTuning, optional
        Frozen layers and per-layer learning-rate multipliers, layers named
        by index (:mod:`sparkavg.nn.finetune`).

    Notes
    -----
    A network implements :class:`~sparkavg.nn.model.Model` (see
    :class:`~sparkavg.nn.flat.FlatModel` for the state vectors, training
    step, devices and files, held in :attr:`flat`); its one input is named
    ``"input"`` and its one output ``"output"``.
    """

    #: A saved config of an older version, as this version's (model files use it).
    upgrade_config = staticmethod(upgrade_config)

    def __init__(self, input_shape: Sequence[int], layers: Sequence[Layer], updater: Updater | None = None,
                 l2: float = 0.0, l2_bias: float = 0.0, weight_decay: float = 0.0, seed: int = 123,
                 dtype: str = "float32", gradient_normalization: GradientNormalization | None = None,
                 fine_tuning: FineTuning | None = None):
        self.input_shape, built = self._stack(input_shape, layers)
        self._init_layers(built, updater, l2, l2_bias, weight_decay, seed, dtype, gradient_normalization,
                          fine_tuning)

    # ------------------------------------------------------------ plumbing
    @staticmethod
    def _stack(input_shape, layers):
        """Validate the stack and build fresh copies of ``layers``."""
        shape = tuple(input_shape.tolist() if isinstance(input_shape, np.ndarray) else input_shape) \
            if isinstance(input_shape, (tuple, list, np.ndarray)) else None
        if shape is None or len(shape) not in (1, 3) or not all(
                isinstance(d, numbers.Integral) and not isinstance(d, bool) and d >= 1 for d in shape):
            raise ValueError(f"Expect input_shape (C, H, W) or (features,) of positive ints, got {input_shape!r}")
        input_shape = tuple(int(d) for d in shape)
        layers = list(layers)
        if not layers or not isinstance(layers[-1], Output):
            raise ValueError(f"Expect the last layer to be an Output layer, got "
                             f"{type(layers[-1]).__name__ if layers else 'no layers'}")
        for layer in layers[:-1]:
            if not isinstance(layer, Layer) or isinstance(layer, Output):
                raise ValueError(f"Expect hidden layers that are Layer instances other than Output, got {layer!r}")
        # Fresh, unbuilt copies: the objects passed in stay untouched.
        layers = [from_config(layer.to_config(), kind="layer", expect=Layer) for layer in layers]
        for i, layer in enumerate(layers):
            try:
                shape = layer.build(shape)
            except ValueError as exc:
                raise ValueError(f"Layer {i} ({type(layer).__name__}): {exc}") from None
        return input_shape, layers

    @classmethod
    def _structure(cls, args):
        _, layers = cls._stack(args["input_shape"], args["layers"])
        return layers, check_updater(args.get("updater"))

    @classmethod
    def sizes(cls, input_shape, layers, updater: Updater | None = None) -> tuple:
        """``(num_params, updater_state_size)`` of the network these arguments
        would build, computed without allocating any array.

        Raises
        ------
        ValueError
            As the constructor, for the same arguments.
        """
        sizes = cls.planned_sizes({"input_shape": input_shape, "layers": layers, "updater": updater})
        return sizes["params"], sizes["updater"]

    def fingerprint(self) -> str:
        """SHA-256 (16 hex digits) of the input shape and the layers: what
        fixes the state layout (the same value checkpoints of earlier
        versions recorded)."""
        config = self.to_config()
        keep = {"input_shape": list(config["input_shape"]), "layers": config["layers"]}
        return hashlib.sha256(json.dumps(keep, sort_keys=True).encode()).hexdigest()[:16]

    @property
    def spec(self) -> ModelSpec:
        """One input ``"input"`` of :attr:`input_shape`; one output
        ``"output"`` with the Output layer's units and loss."""
        from .embedding import Embedding

        out = self.layers[-1]
        dtype = "int64" if isinstance(self.layers[0], Embedding) else "float32"
        return ModelSpec((InputSpec("input", tuple(self.input_shape), dtype),),
                         (OutputSpec("output", int(out.units), out.loss_name),))

    def _wiring(self):
        """A chain: input ``"input"``, layer ``i`` named ``"<i>_<type>"``, the last one ``"output"``."""
        names = [f"{i}_{type(layer).__name__.lower()}" for i, layer in enumerate(self.layers[:-1])] + ["output"]
        sources = ["input"] + names[:-1]
        return ({"input": tuple(self.input_shape)},
                [(n, layer, [s]) for n, layer, s in zip(names, self.layers, sources)], ["output"])

    def _prepare_input(self, x):
        """Validate, cast and lay out a batch: (N, *input_shape) or flat
        (N, prod) -> internal (N, H, W, C) or (N, features), contiguous."""
        return prepare_input(self, x, self.input_shape)

    @staticmethod
    def _check_pair(x, y):
        """x and y must hold the same number of examples (axis 0)."""
        xs = tuple(getattr(x, "shape", None) or np.shape(x))
        ys = tuple(getattr(y, "shape", None) or np.shape(y))
        if not xs or not ys or xs[0] != ys[0]:
            raise ValueError(f"Expect x and y with the same number of examples, got x {xs} and y {ys}")

    def _forward(self, x, training):
        for layer in self.layers:
            x = layer.forward(x, training)
        return x

    def _batch(self, x, y):
        """``(input array, n)`` of a labelled batch: shapes checked, not empty."""
        x = one_input(x, "input")
        self._check_pair(x, y)
        xi = self._prepare_input(x)
        if xi.shape[0] == 0:
            raise ValueError("Expect a non-empty batch, got 0 examples")
        return xi, xi.shape[0]

    def _loss_terms(self, x, y, weights=None):
        """Forward + backward in training mode; fills the flat gradient.
        Returns the loss term as device values, to be read at the step's end."""
        xi, n = self._batch(x, y)
        out = self.layers[-1]
        labels = out.prepare_labels(y, n, self.xp, self.dtype, weights)
        self._forward(xi, training=True)
        total, count = out.loss_sum(labels)
        # Layers below the first one with parameters (a Reshape in front) need no gradient.
        segments = self.flat.param_segments
        first = segments[0].layer if segments else len(self.layers) - 1
        d = out.backward_loss(labels, need_dx=len(self.layers) - 1 > first)
        for i in range(len(self.layers) - 2, first - 1, -1):
            d = self.layers[i].backward(d, need_dx=i > first)
        return [(1.0, total, count)]

    def fit(self, x, y, batch_size=64, epochs=1, shuffle=True, weights=None) -> list:
        """Minibatch training on in-memory arrays (a convenience for local
        runs); advances :attr:`epoch`.  Returns the mean loss of each epoch.
        ``weights``: one per example, or None (see :meth:`fit_batch`)."""
        x = one_input(x, "input")
        self._check_pair(x, y)
        return super().fit(x, y, batch_size, epochs, shuffle, weights)

    # ----------------------------------------------------------- inference
    def output(self, x):
        """Network output for ``x`` (inference mode: no dropout), computed in
        chunks of :attr:`inference_batch_size`.

        Returns a new (N, units) array of the network's dtype on its device
        (class probabilities for a softmax output).
        """
        xi = self._prepare_input(one_input(x, "input"))
        n = xi.shape[0]
        result = self.xp.empty((n,) + tuple(self.layers[-1].output_shape), dtype=self.dtype)
        step = max(1, int(self.inference_batch_size))
        for start in range(0, n, step):
            result[start:start + step] = self._forward(xi[start:start + step], training=False)
        return result

    def score(self, x, y) -> float:
        """Mean loss over all of ``x`` (inference mode, chunked) + L2 penalty."""
        xi, n = self._batch(x, y)
        out = self.layers[-1]
        labels_all = out.prepare_labels(y, n, self.xp, self.dtype)
        step = max(1, int(self.inference_batch_size))
        total = 0.0
        for start in range(0, n, step):
            chunk = xi[start:start + step]
            self._forward(chunk, training=False)
            total += out.loss(labels_all.rows(start, start + step)) * chunk.shape[0]
        return total / n + self.flat.penalty()

    # ---------------------------------------------------------- config
    def config_arguments(self) -> dict:
        """The constructor arguments that rebuild this network (freshly
        initialised: parameters, state and counters are not part of it)."""
        return {
            "input_shape": self.input_shape,
            "layers": self.layers,
            **self._training_options(),
        }

    def summary(self) -> str:
        """A table of layers, output shapes (NCHW convention) and parameter counts."""
        counts = self._layer_param_counts()
        rows = [("#", "layer", "output shape", "params")]
        rows.append(("", "input", str(self.input_shape), ""))
        for i, layer in enumerate(self.layers):
            rows.append((str(i), repr(layer), str(layer.output_shape), f"{counts[i]:,}"))
        return format_summary(self, rows)

    def __repr__(self):
        return (f"Network(input_shape={self.input_shape}, layers={len(self.layers)}, "
                f"num_params={self.num_params}, updater={self.updater!r})")


def prepare_input(model, x, input_shape):
    """Validate, cast and lay out one input's batch for ``model``: (N,
    *input_shape) or flat (N, prod) -> internal (N, H, W, C) or (N, ...),
    contiguous, on the model's device and dtype."""
    shape = tuple(getattr(x, "shape", np.shape(x)))
    flat = math.prod(input_shape)
    dims = ", ".join(str(d) for d in input_shape)
    if not (len(shape) >= 1 and (shape[1:] == tuple(input_shape) or shape[1:] == (flat,))):
        raise ValueError(f"Expect inputs of shape (batch, {dims})"
                         + (f" or (batch, {flat})" if len(input_shape) > 1 else "")
                         + f", got {shape}")
    x = model.flat.on_device(x)
    n = shape[0]
    if len(input_shape) == 3:
        c, h, w = input_shape
        x = x.reshape(n, c, h, w)
        x = x.reshape(n, h, w, 1) if c == 1 else x.transpose(0, 2, 3, 1)
    else:
        x = x.reshape((n,) + tuple(input_shape))
    return model.flat.xp.ascontiguousarray(x)


def format_summary(model, rows) -> str:
    """A model summary table from ``rows`` of (#, layer, output shape, params)."""
    widths = [max(len(r[k]) for r in rows) for k in range(4)]
    lines = ["  ".join(r[k].ljust(widths[k]) if k < 3 else r[k].rjust(widths[k]) for k in range(4))
             for r in rows]
    lines.insert(1, "-" * len(lines[0]))
    lines.append("-" * len(lines[0]))
    lines.append(f"total params: {model.num_params:,} ({model.dtype}); buffers: {model.buffers.size:,}; "
                 f"updater: {model.updater!r}; {model.flat.describe()}")
    return "\n".join(lines)
