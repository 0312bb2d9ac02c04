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
before configs carried a ``"type"`` (:func:`upgrade_config`).
"""
from __future__ import annotations

import json
import logging
import math
import numbers
from collections import namedtuple
from collections.abc import Sequence

import numpy as np

from .. import backend
from ..configurable import ConfigError, Configurable, from_config, register
from .layers import Dropout, Layer
from .output import Output
from .regularization import Regularization
from .serialization import load_network, save_network
from .updaters import Adam, Updater

__all__ = ["Network", "upgrade_config"]

logger = logging.getLogger(__name__)

#: The layout before configs carried a "type": {"format": ..., "version": 1, ...}.
_V1_FORMAT = "sparkavg.nn.Network"
_V1_KEYS = frozenset({"format", "version", "input_shape", "layers", "updater", "l2", "l2_bias",
                      "weight_decay", "seed", "dtype"})

#: Where one parameter of one layer sits in the flat vector.
Segment = namedtuple("Segment", "layer name start stop shape regularized")

_DTYPES = ("float32", "float64")


def _nonneg(name, value):
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not (value >= 0) \
            or not math.isfinite(value):
        raise ValueError(f"Expect {name} >= 0, got {value!r}")
    return float(value)


def upgrade_config(config):
    """A network config in the current layout (``{"type": "Network", ...}``).

    Version-1 configs (``{"format": "sparkavg.nn.Network", "version": 1,
    ...}``, written before configs carried a ``"type"``) are translated; any
    other value is returned unchanged for :func:`~sparkavg.configurable.from_config`
    to judge.

    Raises
    ------
    ConfigError
        A version-1 config with another format, version or unknown keys.
    """
    if not isinstance(config, dict) or "type" in config or "format" not in config:
        return config
    if config.get("format") != _V1_FORMAT or config.get("version") != 1:
        raise ConfigError(f"Expect a network config of format {_V1_FORMAT!r} version 1 (or with a 'type'), "
                          f"got format {config.get('format')!r:.100} version {config.get('version')!r:.100}")
    unknown = sorted(set(config) - _V1_KEYS)
    if unknown:
        raise ConfigError(f"Expect version-1 network config keys among {sorted(_V1_KEYS)}, got unknown {unknown}")
    upgraded = {k: v for k, v in config.items() if k not in ("format", "version")}
    return {"type": "Network", **upgraded}


def _layout(layers) -> tuple:
    """Segments and total size of the flat parameter vector of built ``layers``."""
    segments, offset = [], 0
    for i, layer in enumerate(layers):
        for spec in layer.param_specs():
            size = math.prod(spec.shape)
            segments.append(Segment(i, spec.name, offset, offset + size, spec.shape, spec.regularized))
            offset += size
    return segments, offset


@register("network")
class Network(Configurable):
    """A feed-forward network trained one minibatch at a time.

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

    Attributes
    ----------
    iteration : int
        Completed updater steps (Adam's bias correction uses iteration + 1).
    epoch : int
        Completed epochs; the trainer (or :meth:`fit`) advances it.
    inference_batch_size : int
        Chunk size of :meth:`output` and :meth:`score` (bounds memory).
    """

    #: Parameter dtypes a network may have (model files are checked against it).
    DTYPES = _DTYPES
    #: A saved config of an older version, as this version's (model files use it).
    upgrade_config = staticmethod(upgrade_config)

    def __init__(self, input_shape: Sequence[int], layers: Sequence[Layer], updater: Updater | None = None,
                 l2: float = 0.0, l2_bias: float = 0.0, weight_decay: float = 0.0, seed: int = 123,
                 dtype: str = "float32"):
        input_shape, self.layers, updater, self._segments, self._num_params = \
            self._structure(input_shape, layers, updater)
        if str(dtype) not in _DTYPES:
            raise ValueError(f"Expect dtype in {_DTYPES}, got {dtype!r}")
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ValueError(f"Expect seed as an int >= 0, got {seed!r}")
        self.input_shape = input_shape
        self.updater = updater
        self.l2 = _nonneg("l2", l2)
        self.l2_bias = _nonneg("l2_bias", l2_bias)
        self.weight_decay = _nonneg("weight_decay", weight_decay)
        self.seed = int(seed)
        self.dtype = np.dtype(str(dtype))
        self.iteration = 0
        self.epoch = 0
        self.inference_batch_size = 256
        self._xp = np
        self._reg = None
        offset = self._num_params
        self._params = np.empty(offset, dtype=self.dtype)
        self._grads = np.zeros(offset, dtype=self.dtype)
        self._update = np.zeros(offset, dtype=self.dtype)
        self._state = np.zeros(updater.state_size(offset), dtype=self.dtype)
        rng = np.random.default_rng(self.seed)
        for seg in self._segments:
            spec = next(s for s in self.layers[seg.layer].param_specs() if s.name == seg.name)
            self._params[seg.start:seg.stop] = self.layers[seg.layer].initial_value(spec, rng).ravel()
        self._bind()

    # ------------------------------------------------------------ plumbing
    @staticmethod
    def _structure(input_shape, layers, updater):
        """Validate the structure, build fresh copies of ``layers`` and lay
        out the flat vector -- everything but allocation."""
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
        updater = Adam() if updater is None else updater
        if not isinstance(updater, Updater):
            raise ValueError(f"Expect an Updater instance, got {updater!r}")
        # Fresh, unbuilt copies: the objects passed in stay untouched.
        layers = [from_config(layer.to_config(), kind="layer", expect=Layer) for layer in layers]
        for i, layer in enumerate(layers):
            try:
                shape = layer.build(shape)
            except ValueError as exc:
                raise ValueError(f"Layer {i} ({type(layer).__name__}): {exc}") from None
        segments, num_params = _layout(layers)
        return input_shape, layers, updater, segments, num_params

    @classmethod
    def sizes(cls, input_shape, layers, updater: Updater | None = None) -> tuple:
        """``(num_params, updater_state_size)`` of the network these arguments
        would build, computed without allocating any array (model files are
        checked against it before anything is read).

        Raises
        ------
        ValueError
            As the constructor, for the same arguments.
        """
        _, _, updater, _, num_params = cls._structure(input_shape, layers, updater)
        return num_params, int(updater.state_size(num_params))

    def _bind(self):
        """Hand every layer its views into the flat vectors (after any move)."""
        blocks = {}
        for seg in self._segments:  # a layer's parameters are contiguous
            start, _ = blocks.get(seg.layer, (seg.start, seg.stop))
            blocks[seg.layer] = (start, seg.stop)
        for i, layer in enumerate(self.layers):
            start, stop = blocks.get(i, (0, 0))
            layer.bind(self._params[start:stop], self._grads[start:stop])
            if isinstance(layer, Dropout):
                layer.reseed(int(np.random.SeedSequence([self.seed, i]).generate_state(1)[0]), self._xp)

    def _on_device(self, a, what):
        """``a`` as an array of this network's dtype on its device (copying only if needed)."""
        xp = self._xp
        if xp is np and backend.is_gpu_array(a):
            a = backend.to_cpu(a)  # device -> host sync
        elif xp is not np and not backend.is_gpu_array(a):
            a = backend.to_gpu(np.asarray(a))  # host -> device sync
        return xp.asarray(a, dtype=self.dtype)

    def _check_flat(self, a, name, size):
        if getattr(a, "shape", None) != (size,):
            raise ValueError(f"Expect {name} of shape ({size},), got {getattr(a, 'shape', type(a).__name__)}")
        if a.dtype != self.dtype:
            raise ValueError(f"Expect {name} of dtype {self.dtype}, got {a.dtype}")
        if backend.is_gpu_array(a) != (self._xp is not np):
            where = "CuPy (GPU)" if self._xp is not np else "numpy (CPU)"
            raise ValueError(f"Expect {name} as a {where} array like the network's, got {type(a).__module__}")

    def _prepare_input(self, x):
        """Validate, cast and lay out a batch: (N, *input_shape) or flat
        (N, prod) -> internal (N, H, W, C) or (N, features), contiguous."""
        shape = tuple(getattr(x, "shape", np.shape(x)))
        flat = math.prod(self.input_shape)
        dims = ", ".join(str(d) for d in self.input_shape)
        if not (len(shape) >= 1 and (shape[1:] == self.input_shape or shape[1:] == (flat,))):
            raise ValueError(f"Expect inputs of shape (batch, {dims})"
                             + (f" or (batch, {flat})" if len(self.input_shape) > 1 else "")
                             + f", got {shape}")
        x = self._on_device(x, "inputs")
        n = shape[0]
        if len(self.input_shape) == 3:
            c, h, w = self.input_shape
            x = x.reshape(n, c, h, w)
            x = x.reshape(n, h, w, 1) if c == 1 else x.transpose(0, 2, 3, 1)
        else:
            x = x.reshape(n, flat)
        return self._xp.ascontiguousarray(x)

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

    def _regularization(self) -> Regularization:
        """The L2 / weight-decay ranges (rebuilt when a coefficient was reassigned)."""
        key = (self.l2, self.l2_bias, self.weight_decay)
        if self._reg is None or self._reg.coefficients != key:
            self._reg = Regularization(self._segments, *key)
        return self._reg

    def _penalty(self):
        """0.5 * l2 * |W|^2 + 0.5 * l2_bias * |b|^2 (a device -> host sync on CuPy)."""
        reg = self._regularization()
        return reg.penalty(reg.penalty_terms(self._params))

    def _loss_and_grad(self, x, y):
        """Forward + backward in training mode; fills the flat gradient (L2
        included).  Returns the loss for :meth:`_loss_value` as device values
        (of the parameters before any update), to be read at the step's end."""
        self._check_pair(x, y)
        xi = self._prepare_input(x)
        n = xi.shape[0]
        if n == 0:
            raise ValueError("Expect a non-empty batch, got 0 examples")
        out = self.layers[-1]
        labels = out.prepare_labels(y, n, self._xp, self.dtype)
        self._forward(xi, training=True)
        loss = out.loss_sum(labels)
        d = out.backward_loss(labels, need_dx=len(self.layers) > 1)
        for i in range(len(self.layers) - 2, -1, -1):
            d = self.layers[i].backward(d, need_dx=i > 0)
        reg = self._regularization()
        penalty = reg.penalty_terms(self._params)  # before any update touches the parameters
        reg.add_gradient(self._grads, self._params)
        return loss, penalty

    @staticmethod
    def _loss_value(pending, sync: bool = True):
        """Mean loss + L2 penalty: a float (device -> host syncs on CuPy: call
        it at the end of a step), or with ``sync=False`` on a GPU a 0-d array
        on the device, computed there (no sync); numpy networks always give a float."""
        (total, count), penalty = pending
        if sync or isinstance(total, (float, np.generic, np.ndarray)):  # on the host: reading costs nothing
            return float(total) / count + Regularization.penalty(penalty)
        value = total / count
        for half, dot in penalty:
            value = value + half * dot
        return value

    # ------------------------------------------------------------ training
    def gradient(self, x, y):
        """Loss and gradient of one batch, without updating anything.

        Returns
        -------
        (float, array)
            Mean loss (+ L2 penalty) and a COPY of the flat gradient
            (``num_params``,), L2 included, on the network's device.
        """
        loss = self._loss_value(self._loss_and_grad(x, y))
        return loss, self._grads.copy()

    def compute_update(self, x, y, out, *, sync: bool = True):
        """Fill ``out`` with exactly what :meth:`fit_batch` would add to the
        parameters (the updater's step after L2 and weight decay), advancing
        the updater state and :attr:`iteration`, without applying it.

        ``out`` is a flat (``num_params``,) array of the network's dtype and
        device; it is zeroed first.  Returns the batch loss (``sync=False``:
        as a 0-d array on the device, see :meth:`fit_batch`).
        """
        self._check_flat(out, "out", self._num_params)
        pending = self._loss_and_grad(x, y)
        out.fill(0)
        self.updater.apply(out, self._grads, self._state, self.iteration)
        self._regularization().decay(out, self._params, self.updater.lr)
        self.iteration += 1
        return self._loss_value(pending, sync)

    def apply_update(self, update) -> None:
        """``params += update`` in place (``update`` flat, same dtype and device)."""
        self._check_flat(update, "update", self._num_params)
        self._params += update

    def fit_batch(self, x, y, *, sync: bool = True):
        """One training step (forward, backward, updater); returns the batch loss.

        Exactly ``compute_update`` into a buffer followed by ``apply_update``;
        without weight decay the updater adds to the parameters directly (same
        sums, bit-identical on the CPU; no buffer to zero, one pass fewer).

        ``sync=False`` returns the loss as a 0-d array on the network's
        device instead of a float: on a GPU the step then ends without
        waiting for the device (the caller reads the loss when it needs it).
        """
        if self._regularization().decay_ranges:  # decay reads the parameters before the step
            loss = self.compute_update(x, y, self._update, sync=sync)
            self._params += self._update
            return loss
        pending = self._loss_and_grad(x, y)
        self.updater.apply(self._params, self._grads, self._state, self.iteration)
        self.iteration += 1
        return self._loss_value(pending, sync)

    def fit(self, x, y, batch_size=64, epochs=1, shuffle=True) -> list:
        """Minibatch training on in-memory arrays (a convenience for local
        runs); advances :attr:`epoch`.  Returns the mean loss of each epoch."""
        self._check_pair(x, y)
        n = len(x)
        if n == 0:
            raise ValueError("Expect a non-empty dataset, got 0 examples")
        rng = np.random.default_rng([self.seed, self.epoch])
        losses = []
        for _ in range(int(epochs)):
            order = rng.permutation(n) if shuffle else np.arange(n)
            total = 0.0
            for start in range(0, n, batch_size):
                idx = order[start:start + batch_size]
                total += self.fit_batch(x[idx], y[idx]) * len(idx)
            self.epoch += 1
            losses.append(total / n)
        return losses

    # ----------------------------------------------------------- inference
    def output(self, x):
        """Network output for ``x`` (inference mode: no dropout), computed in
        chunks of :attr:`inference_batch_size`.

        Returns a new (N, units) array of the network's dtype on its device
        (class probabilities for a softmax output).
        """
        xi = self._prepare_input(x)
        n = xi.shape[0]
        result = self._xp.empty((n,) + tuple(self.layers[-1].output_shape), dtype=self.dtype)
        step = max(1, int(self.inference_batch_size))
        for start in range(0, n, step):
            result[start:start + step] = self._forward(xi[start:start + step], training=False)
        return result

    def predict(self, x):
        """Arg-max class index per example, (N,) int64 (numpy on CPU)."""
        return self.output(x).argmax(axis=1)

    def score(self, x, y) -> float:
        """Mean loss over all of ``x`` (inference mode, chunked) + L2 penalty."""
        self._check_pair(x, y)
        xi = self._prepare_input(x)
        n = xi.shape[0]
        if n == 0:
            raise ValueError("Expect a non-empty batch, got 0 examples")
        out = self.layers[-1]
        labels_all = out.prepare_labels(y, n, self._xp, self.dtype)
        step = max(1, int(self.inference_batch_size))
        total = 0.0
        for start in range(0, n, step):
            chunk = xi[start:start + step]
            self._forward(chunk, training=False)
            kind, lab = labels_all
            total += out.loss((kind, lab[start:start + step])) * chunk.shape[0]
        return total / n + self._penalty()

    # ----------------------------------------------------------- state
    @property
    def num_params(self) -> int:
        """Length of the flat parameter vector."""
        return self._num_params

    @property
    def params(self):
        """The LIVE flat parameter vector (``num_params``,); every layer's
        weights are views into it.  Assigning copies in (shape and dtype must
        match)."""
        return self._params

    @params.setter
    def params(self, value):
        self._check_flat(value, "params", self._num_params)
        self._params[...] = value

    @property
    def updater_state(self):
        """The LIVE flat updater state (``updater.state_size(num_params)``,);
        assigning copies in (shape and dtype must match)."""
        return self._state

    @updater_state.setter
    def updater_state(self, value):
        self._check_flat(value, "updater_state", self._state.shape[0])
        self._state[...] = value

    @property
    def param_segments(self) -> list:
        """(layer index, name, start, stop, shape, regularized) per parameter."""
        return list(self._segments)

    @property
    def xp(self):
        """The array module of this network's arrays (numpy or cupy)."""
        return self._xp

    # ---------------------------------------------------------- devices
    def _move(self, convert, xp):
        self._params = convert(self._params)
        self._grads = convert(self._grads)
        self._update = convert(self._update)
        self._state = convert(self._state)
        self._xp = xp
        self._bind()
        logger.debug("network of %d params moved to %s", self._num_params, xp.__name__)
        return self

    def to_gpu(self):
        """Move parameters, gradients and state to the current CUDA device
        (host -> device copies); returns self."""
        if self._xp is not np:
            return self
        backend.check_available()
        return self._move(backend.to_gpu, backend.cupy())

    def to_cpu(self):
        """Move everything back to host memory; returns self."""
        if self._xp is np:
            return self
        return self._move(backend.to_cpu, np)

    # ---------------------------------------------------------- config
    def config_arguments(self) -> dict:
        """The constructor arguments that rebuild this network (freshly
        initialised: parameters, state and counters are not part of it)."""
        return {
            "input_shape": self.input_shape,
            "layers": self.layers,
            "updater": self.updater,
            "l2": self.l2,
            "l2_bias": self.l2_bias,
            "weight_decay": self.weight_decay,
            "seed": self.seed,
            "dtype": str(self.dtype),
        }

    def to_json(self) -> str:
        """:meth:`to_config` as JSON text (sorted keys; no parameters)."""
        return json.dumps(self.to_config(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "Network":
        """Inverse of :meth:`to_json`: a freshly initialised network (same
        seed, so the same initial parameters).

        Raises
        ------
        ConfigError
            Text that is not JSON, or a configuration that does not describe
            a valid network (the message names the type and field).
        """
        try:
            config = json.loads(text)
        except (TypeError, ValueError, RecursionError) as exc:
            raise ConfigError(f"Expect a JSON network configuration, got text that does not parse: {exc}") from None
        return from_config(upgrade_config(config), kind="network", expect=cls)

    def clone(self) -> "Network":
        """An independent copy: config, parameters, updater state, counters,
        on the same device."""
        other = from_config(self.to_config(), kind="network", expect=Network)
        if self._xp is not np:
            other.to_gpu()
        other._params[...] = self._params
        other._state[...] = self._state
        other.iteration, other.epoch = self.iteration, self.epoch
        other.inference_batch_size = self.inference_batch_size
        return other

    def save(self, path) -> None:
        """Write an .npz (params, updater state, counters, JSON config,
        SHA-256); never pickle.  See :mod:`sparkavg.nn.serialization`."""
        save_network(self, path)

    @classmethod
    def load(cls, path, *, max_params: int | None = None) -> "Network":
        """Read a file written by :meth:`save`, verifying it in bounded memory.

        Parameters
        ----------
        path : str or os.PathLike
        max_params : int, optional
            Refuse a configuration with more parameters than this (before
            anything is allocated); default
            :data:`sparkavg.nn.serialization.MAX_PARAMS`.

        Raises
        ------
        ModelFileError
            Anything wrong with the file, naming the file and what was
            expected (see :mod:`sparkavg.nn.serialization`).
        """
        return load_network(path, cls, max_params=max_params)

    def summary(self) -> str:
        """A table of layers, output shapes (NCHW convention) and parameter counts."""
        counts = [0] * len(self.layers)
        for seg in self._segments:
            counts[seg.layer] += seg.stop - seg.start
        rows = [("#", "layer", "output shape", "params")]
        rows.append(("", "input", str(self.input_shape), ""))
        for i, layer in enumerate(self.layers):
            rows.append((str(i), repr(layer), str(layer.output_shape), f"{counts[i]:,}"))
        widths = [max(len(r[k]) for r in rows) for k in range(4)]
        lines = ["  ".join(r[k].ljust(widths[k]) if k < 3 else r[k].rjust(widths[k]) for k in range(4))
                 for r in rows]
        lines.insert(1, "-" * len(lines[0]))
        lines.append("-" * len(lines[0]))
        lines.append(f"total params: {self._num_params:,} ({self.dtype}); updater: {self.updater!r}; "
                     f"l2={self.l2}, l2_bias={self.l2_bias}, weight_decay={self.weight_decay}; seed={self.seed}")
        return "\n".join(lines)

    def __repr__(self):
        return (f"Network(input_shape={self.input_shape}, layers={len(self.layers)}, "
                f"num_params={self._num_params}, updater={self.updater!r})")

    def __deepcopy__(self, memo):
        return self.clone()

    def __copy__(self):
        return self.clone()
