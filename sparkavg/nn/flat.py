"""What every layer-built model shares: flat state vectors, the updater step,
devices, configuration and model files.

:class:`FlatModel` holds a model's layers (in a fixed order) over ONE flat
parameter vector, one flat gradient vector, one flat updater state and one
flat buffer vector; every layer's weights, gradients and buffers are views
into them (FSDP's ``FlatParameter``; Chainer's optimizer apart from the
link).  A subclass says only how its layers are wired:

- :meth:`FlatModel._loss_and_grad` -- forward and backward of one batch in
  training mode, filling :attr:`_grads`;
- :meth:`FlatModel._structure` -- validate its configuration and build its
  layers (nothing allocated), for construction and for model files;
- :attr:`FlatModel.spec`, :meth:`output`, :meth:`score`,
  :meth:`config_arguments`.

:class:`~sparkavg.nn.network.Network` (a sequential stack) and
:class:`~sparkavg.nn.graph.Graph` (named inputs and vertices) are the two;
both implement :class:`~sparkavg.nn.model.Model`.
"""
from __future__ import annotations

import json
import logging
import math
import numbers
from collections import namedtuple

import numpy as np

import contextlib

from .. import backend
from ..configurable import ConfigError, Configurable, from_config
from ..references import trusting
from ..threads import single_threaded_blas
from .clipping import GradientNormalization
from .layers import Dropout
from .model import STATE_VECTORS, config_fingerprint
from .regularization import Regularization
from .schedules import Schedule
from .serialization import load_network, save_network
from .updaters import Adam, Updater
from .upgrades import upgrade_config

__all__ = ["FlatModel", "Segment", "DTYPES"]

logger = logging.getLogger(__name__)

#: Where one parameter (or buffer) of one layer sits in its flat vector.
Segment = namedtuple("Segment", "layer name start stop shape regularized")

#: Parameter dtypes a model may have (model files are checked against it).
DTYPES = ("float32", "float64")


def _nonneg(name, value):
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not (value >= 0) \
            or not math.isfinite(value):
        raise ValueError(f"Expect {name} >= 0, got {value!r}")
    return float(value)


def _layout(layers, specs) -> tuple:
    """Segments and total size of a flat vector over built ``layers``
    (``specs(layer)`` lists one layer's pieces)."""
    segments, offset = [], 0
    for i, layer in enumerate(layers):
        for spec in specs(layer):
            size = math.prod(spec.shape)
            segments.append(Segment(i, spec.name, offset, offset + size, spec.shape, spec.regularized))
            offset += size
    return segments, offset


def _blocks(segments, count):
    """Each layer's contiguous (start, stop) block of a flat vector."""
    blocks = {}
    for seg in segments:  # a layer's pieces are contiguous
        start, _ = blocks.get(seg.layer, (seg.start, seg.stop))
        blocks[seg.layer] = (start, seg.stop)
    return [blocks.get(i, (0, 0)) for i in range(count)]


def check_gradient_normalization(value):
    if value is not None and not isinstance(value, GradientNormalization):
        raise ValueError(f"Expect gradient_normalization as a GradientNormalization (sparkavg.nn.clipping: "
                         f"ClipGlobalNorm(1.0), ClipL2PerLayer(...), ...) or None, got {value!r:.200}")
    return value


def check_updater(updater):
    updater = Adam() if updater is None else updater
    if not isinstance(updater, Updater):
        raise ValueError(f"Expect an Updater instance, got {updater!r}")
    return updater


class FlatModel(Configurable):
    """Base of the layer-built models (see the module doc).

    Attributes
    ----------
    iteration : int
        Completed updater steps (Adam's bias correction uses iteration + 1;
        a learning-rate schedule by iteration follows it).
    epoch : int
        Completed epochs; the trainer (or :meth:`fit`) advances it (a
        schedule by epoch follows it).
    inference_batch_size : int
        Chunk size of :meth:`output` and :meth:`score` (bounds memory).
    """

    _config_kind = "network"
    #: Parameter dtypes a model may have (model files are checked against it).
    DTYPES = DTYPES
    #: A step runs BLAS at one thread when OpenMP kernels carry at least this
    #: share of its multiply-adds (:meth:`step_threads`).
    OPENMP_SHARE_FOR_SINGLE_BLAS = 0.9

    # ------------------------------------------------------ for subclasses
    @classmethod
    def _structure(cls, args: dict) -> tuple:
        """``(layers, updater)`` of the model the constructor arguments
        ``args`` describe: validated, layers built (fresh copies), in flat
        order; nothing allocated.  Raises ValueError naming what is wrong."""
        raise NotImplementedError

    def _loss_and_grad(self, x, y):
        """Forward + backward in training mode; fill :attr:`_grads` (L2
        included); return the pending loss for :meth:`_loss_value`."""
        raise NotImplementedError

    # ---------------------------------------------------------- building
    def _init_flat(self, layers, updater, l2, l2_bias, weight_decay, seed, dtype, gradient_normalization=None):
        """Lay out, allocate and initialise the flat vectors over built ``layers``."""
        self.layers = list(layers)
        segments, num_params = _layout(self.layers, lambda layer: layer.param_specs())
        buffer_segments, num_buffers = _layout(self.layers, lambda layer: layer.buffer_specs())
        self._init_state(segments, num_params, buffer_segments, num_buffers, updater, l2, l2_bias, weight_decay,
                         seed, dtype, gradient_normalization)
        rng = np.random.default_rng(self.seed)
        for seg in self._segments:
            layer = self.layers[seg.layer]
            spec = next(s for s in layer.param_specs() if s.name == seg.name)
            self._params[seg.start:seg.stop] = layer.initial_value(spec, rng).ravel()
        for seg in self._buffer_segments:
            layer = self.layers[seg.layer]
            spec = next(s for s in layer.buffer_specs() if s.name == seg.name)
            self._buffers[seg.start:seg.stop] = layer.initial_buffer(spec).ravel()
        self._bind()

    def _init_state(self, segments, num_params, buffer_segments, num_buffers, updater, l2, l2_bias, weight_decay,
                    seed, dtype, gradient_normalization=None):
        """The flat state every model of this family holds, allocated (zeros
        but the parameters and buffers, which the caller fills): the one
        setup a layer-built model and a torch module share."""
        if str(dtype) not in DTYPES:
            raise ValueError(f"Expect dtype in {DTYPES}, got {dtype!r}")
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ValueError(f"Expect seed as an int >= 0, got {seed!r}")
        self.updater = check_updater(updater)
        self.l2 = _nonneg("l2", l2)
        self.l2_bias = _nonneg("l2_bias", l2_bias)
        self.weight_decay = _nonneg("weight_decay", weight_decay)
        self.gradient_normalization = check_gradient_normalization(gradient_normalization)
        self.seed = int(seed)
        self.dtype = np.dtype(str(dtype))
        self.iteration = 0
        self.epoch = 0
        self.inference_batch_size = 256
        self._xp = np
        self._reg = None
        self._resolved = None
        self._normalizing = False
        self._groups = {}
        self._single_blas = None
        self._segments, self._num_params = segments, num_params
        self._buffer_segments = buffer_segments
        n = num_params
        self._params = np.empty(n, dtype=self.dtype)
        self._grads = np.zeros(n, dtype=self.dtype)
        self._update = np.zeros(n, dtype=self.dtype)
        self._state = np.zeros(self.updater.state_size(n), dtype=self.dtype)
        self._buffers = np.zeros(num_buffers, dtype=self.dtype)

    @classmethod
    def planned_sizes(cls, args: dict) -> dict:
        """The length of each state vector (:data:`~sparkavg.nn.model.STATE_VECTORS`)
        of the model these constructor arguments would build, computed
        without allocating any array (model files are checked against it
        before anything is read).  Raises ValueError as the constructor."""
        layers, updater = cls._structure(args)
        _, num_params = _layout(layers, lambda layer: layer.param_specs())
        _, num_buffers = _layout(layers, lambda layer: layer.buffer_specs())
        return {"params": num_params, "updater": int(updater.state_size(num_params)), "buffers": num_buffers}

    def _bind(self):
        """Hand every layer its views into the flat vectors (after any move)."""
        count = len(self.layers)
        for i, ((start, stop), (bstart, bstop)) in enumerate(zip(_blocks(self._segments, count),
                                                                 _blocks(self._buffer_segments, count))):
            layer = self.layers[i]
            layer.bind(self._params[start:stop], self._grads[start:stop])
            layer.bind_buffers(self._buffers[bstart:bstop])
            if isinstance(layer, Dropout):
                layer.reseed(int(np.random.SeedSequence([self.seed, i]).generate_state(1)[0]), self._xp)

    # ---------------------------------------------------------- helpers
    def _on_device(self, a, what=None):
        """``a`` as an array of this model's dtype on its device (copying only if needed)."""
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
            raise ValueError(f"Expect {name} as a {where} array like the model's, got {type(a).__module__}")

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

    def _pending(self, loss):
        """The pending loss of a step: the loss terms and the L2 terms of the
        parameters before any update; adds the L2 gradient."""
        reg = self._regularization()
        penalty = reg.penalty_terms(self._params)  # before any update touches the parameters
        if self._normalizing:  # a training step: the loss gradient is normalised before L2 joins it
            self._normalize_gradient()
        reg.add_gradient(self._grads, self._params)
        return loss, penalty

    def _normalize_gradient(self) -> None:
        """Apply :attr:`gradient_normalization` to the loss gradient, in place."""
        norm = self.gradient_normalization
        if norm is None:
            return
        groups = self._groups.get(norm.per)
        if groups is None:
            if norm.per == "parameter":
                groups = [(seg.start, seg.stop) for seg in self._segments if seg.stop > seg.start]
            elif norm.per == "layer":  # a layer's segments are contiguous; a TorchModel's "layer" is a parameter
                count = 1 + max((seg.layer for seg in self._segments), default=-1)
                groups = [(a, b) for a, b in _blocks(self._segments, count) if b > a]
            else:
                groups = [(0, self._num_params)]
            self._groups[norm.per] = groups = tuple(groups)
        norm.apply(self._grads, groups)

    def _step_loss_and_grad(self, x, y):
        """:meth:`_loss_and_grad` of a training step: the loss gradient
        normalised by :attr:`gradient_normalization`, then L2 added."""
        self._normalizing = self.gradient_normalization is not None
        try:
            with self.step_threads():
                return self._loss_and_grad(x, y)
        finally:
            self._normalizing = False

    @staticmethod
    def _loss_value(pending, sync: bool = True):
        """Mean loss + L2 penalty: a float (device -> host syncs on CuPy: call
        it at the end of a step), or with ``sync=False`` on a GPU a 0-d array
        on the device, computed there (no sync); numpy models always give a float.

        ``pending[0]`` is a list of ``(weight, total, count)`` loss terms."""
        terms, penalty = pending
        if sync or all(isinstance(total, (float, np.generic, np.ndarray)) for _, total, _ in terms):
            return sum(w * float(total) / count for w, total, count in terms) + Regularization.penalty(penalty)
        value = None
        for w, total, count in terms:
            term = total * (w / count)
            value = term if value is None else value + term
        for half, dot in penalty:
            value = value + half * dot
        return value

    def _step_updater(self) -> Updater:
        """The updater of the step at :attr:`iteration` and :attr:`epoch`:
        :attr:`updater` itself at a constant rate; at a scheduled one, the
        same updater at the schedule's rate there
        (:meth:`~sparkavg.nn.updaters.Updater.at_rate`), kept while the
        updater and the rate stay (an epoch's steps of a ``by="epoch"``
        schedule build one).  Raises
        :class:`~sparkavg.nn.schedules.ScheduleError` for a rate that is not
        finite and > 0, before the step changes anything."""
        updater = self.updater
        if not isinstance(updater.lr, Schedule):
            return updater
        rate = updater.lr.value(self.iteration, self.epoch)
        resolved = getattr(self, "_resolved", None)
        if resolved is None or resolved[0] is not updater or resolved[1] != rate:
            resolved = self._resolved = (updater, rate, updater.at_rate(rate))
        return resolved[2]

    def step_threads(self):
        """The thread pools of a step: on the CPU in float32, when OpenMP
        kernels (the direct convolutions) carry at least
        :attr:`OPENMP_SHARE_FOR_SINGLE_BLAS` of the multiply-adds, BLAS runs
        at one thread inside (:func:`sparkavg.threads.single_threaded_blas`:
        its spinning idle threads would take the cores OpenMP's threads
        need; a ResNet step on 2 threads 37 -> 26 ms), else the pools as set."""
        if getattr(self, "_single_blas", None) is None:  # a subclass may build its state without _init_flat
            work = [layer.multiply_adds() for layer in self.layers]
            openmp, blas = sum(w[0] for w in work), sum(w[1] for w in work)
            self._single_blas = openmp > 0 and openmp >= self.OPENMP_SHARE_FOR_SINGLE_BLAS * (openmp + blas)
        if self._single_blas and self._xp is np and self.dtype == np.float32:
            return single_threaded_blas()
        return contextlib.nullcontext()

    # ------------------------------------------------------------ training
    def gradient(self, x, y):
        """Loss and gradient of one batch, without updating anything (nor
        normalising the gradient: :attr:`gradient_normalization` acts in
        training steps only).

        Returns
        -------
        (float, array)
            Mean loss (+ L2 penalty) and a COPY of the flat gradient
            (``num_params``,), L2 included, on the model's device.
        """
        loss = self._loss_value(self._loss_and_grad(x, y))
        return loss, self._grads.copy()

    def compute_update(self, x, y, out, *, sync: bool = True):
        """Fill ``out`` with exactly what :meth:`fit_batch` would add to the
        parameters (the updater's step after L2 and weight decay), advancing
        the updater state, the buffers and :attr:`iteration`, without applying it.

        A scheduled learning rate is the schedule's at :attr:`iteration` and
        :attr:`epoch`; the weight decay uses the same rate.  The loss
        gradient is normalised by :attr:`gradient_normalization` (if any)
        before the L2 gradient joins it.

        ``out`` is a flat (``num_params``,) array of the model's dtype and
        device; it is zeroed first.  Returns the batch loss (``sync=False``:
        as a 0-d array on the device, see :meth:`fit_batch`).
        """
        self._check_flat(out, "out", self._num_params)
        updater = self._step_updater()
        pending = self._step_loss_and_grad(x, y)
        out.fill(0)
        kept = self._keep_untouched_rows()
        updater.apply(out, self._grads, self._state, self.iteration)
        self._regularization().decay(out, self._params, updater.lr)
        if kept:
            self._restore_untouched_rows(kept, out)
        self.iteration += 1
        return self._loss_value(pending, sync)

    def _lazy_tables(self) -> list:
        """``(segment, touched rows mask)`` of each layer whose last step
        touched only some rows of a table (an ``Embedding(lazy=True)``)."""
        tables = []
        for seg in self._segments:
            touched = getattr(self.layers[seg.layer], "touched_rows", None)
            mask = touched(seg.name) if touched is not None else None
            if mask is not None:
                tables.append((seg, mask))
        return tables

    def _keep_untouched_rows(self) -> list:
        """Before the updater's step: the updater state of the rows a lazy
        table's step did not touch, to put back after it."""
        tables = self._lazy_tables()
        if not tables:
            return []
        n, size = self._num_params, self._state.shape[0]
        if size % n:
            raise ValueError(f"Expect an updater whose state is whole vectors of the parameters' length for "
                             f"Embedding(lazy=True), got {self.updater!r} with {size} values for {n} parameters")
        kept = []
        for seg, mask in tables:
            untouched = ~mask
            saved = [self._state[j * n + seg.start:j * n + seg.stop].reshape(seg.shape)[untouched]
                     for j in range(size // n)]
            kept.append((seg, untouched, saved))
        return kept

    def _restore_untouched_rows(self, kept: list, out) -> None:
        """After the updater's step: untouched rows get no update and keep their state."""
        n = self._num_params
        for seg, untouched, saved in kept:
            out[seg.start:seg.stop].reshape(seg.shape)[untouched] = 0
            for j, rows in enumerate(saved):
                self._state[j * n + seg.start:j * n + seg.stop].reshape(seg.shape)[untouched] = rows

    def apply_update(self, update) -> None:
        """``params += update`` in place (``update`` flat, same dtype and device)."""
        self._check_flat(update, "update", self._num_params)
        self._params += update

    def fit_batch(self, x, y, *, sync: bool = True):
        """One training step (forward, backward, updater); returns the batch loss.

        Exactly ``compute_update`` into a buffer followed by ``apply_update``;
        without weight decay the updater adds to the parameters directly (same
        sums, bit-identical on the CPU; no buffer to zero, one pass fewer).

        ``sync=False`` returns the loss as a 0-d array on the model's
        device instead of a float: on a GPU the step then ends without
        waiting for the device (the caller reads the loss when it needs it).
        """
        if self._regularization().decay_ranges or any(getattr(layer, "lazy", False) for layer in self.layers):
            # decay reads the parameters before the step; lazy tables zero their untouched rows' update
            loss = self.compute_update(x, y, self._update, sync=sync)
            self._params += self._update
            return loss
        updater = self._step_updater()
        pending = self._step_loss_and_grad(x, y)
        updater.apply(self._params, self._grads, self._state, self.iteration)
        self.iteration += 1
        return self._loss_value(pending, sync)

    @staticmethod
    def _count(x) -> int:
        """Examples in ``x`` (an array, or a mapping of arrays by input name)."""
        if isinstance(x, dict):
            return len(next(iter(x.values()))) if x else 0
        return len(x)

    @staticmethod
    def _take(x, idx):
        """Rows ``idx`` of ``x`` (an array, or a mapping of arrays by name)."""
        if isinstance(x, dict):
            return {k: v[idx] for k, v in x.items()}
        return x[idx]

    def fit(self, x, y, batch_size=64, epochs=1, shuffle=True) -> list:
        """Minibatch training on in-memory arrays (a convenience for local
        runs); advances :attr:`epoch`.  Returns the mean loss of each epoch."""
        n = self._count(x)
        if n == 0:
            raise ValueError("Expect a non-empty dataset, got 0 examples")
        rng = np.random.default_rng([self.seed, self.epoch])
        losses = []
        for _ in range(int(epochs)):
            order = rng.permutation(n) if shuffle else np.arange(n)
            total = 0.0
            for start in range(0, n, batch_size):
                idx = order[start:start + batch_size]
                total += self.fit_batch(self._take(x, idx), self._take(y, idx)) * len(idx)
            self.epoch += 1
            losses.append(total / n)
        return losses

    def predict(self, x):
        """Arg-max class index per example, (N,) int64 (numpy on CPU)."""
        return self.output(x).argmax(axis=1)

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
    def buffers(self):
        """The LIVE flat buffer vector (non-trainable state such as
        BatchNorm's running statistics; empty when no layer has any);
        assigning copies in."""
        return self._buffers

    @buffers.setter
    def buffers(self, value):
        self._check_flat(value, "buffers", self._buffers.shape[0])
        self._buffers[...] = value

    @property
    def state(self) -> dict:
        """The live flat vectors by name: ``{"params", "updater", "buffers"}``."""
        return {"params": self._params, "updater": self._state, "buffers": self._buffers}

    def load_state(self, state) -> None:
        """Copy the given named vectors in (any of ``params``, ``updater``,
        ``buffers``; host or device arrays are moved to the model's device;
        shapes must match).  ``None`` values are skipped."""
        unknown = sorted(set(state) - set(STATE_VECTORS))
        if unknown:
            raise ValueError(f"Expect state vectors among {list(STATE_VECTORS)}, got {unknown}")
        live = self.state
        for name, value in state.items():
            if value is None:
                continue
            target = live[name]
            if getattr(value, "shape", None) != target.shape:
                raise ValueError(f"Expect {name} of shape {target.shape}, got {getattr(value, 'shape', None)}")
            target[...] = self._on_device(value)

    @property
    def param_segments(self) -> list:
        """(layer index, name, start, stop, shape, regularized) per parameter."""
        return list(self._segments)

    @property
    def buffer_segments(self) -> list:
        """(layer index, name, start, stop, shape, False) per buffer."""
        return list(self._buffer_segments)

    @property
    def xp(self):
        """The array module of this model's arrays (numpy or cupy)."""
        return self._xp

    # ---------------------------------------------------------- devices
    def _move(self, convert, xp):
        self._params = convert(self._params)
        self._grads = convert(self._grads)
        self._update = convert(self._update)
        self._state = convert(self._state)
        self._buffers = convert(self._buffers)
        self._xp = xp
        self._bind()
        logger.debug("model of %d params moved to %s", self._num_params, xp.__name__)
        return self

    def to_gpu(self):
        """Move parameters, gradients, state and buffers to the current CUDA
        device (host -> device copies); returns self."""
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
    def _training_arguments(self) -> dict:
        """The constructor arguments every layer-built model shares (updater,
        penalties, seed, dtype): the rest of its :meth:`config_arguments`."""
        args = {"updater": self.updater, "l2": self.l2, "l2_bias": self.l2_bias,
                "weight_decay": self.weight_decay, "seed": self.seed, "dtype": str(self.dtype)}
        if self.gradient_normalization is not None:  # configs without it stay as they were
            args["gradient_normalization"] = self.gradient_normalization
        return args

    def _training_summary(self) -> str:
        """The penalties, gradient normalisation and seed, for summaries."""
        norm = self.gradient_normalization
        return (f"l2={self.l2}, l2_bias={self.l2_bias}, weight_decay={self.weight_decay}; "
                + (f"gradient_normalization={norm!r}; " if norm is not None else "") + f"seed={self.seed}")

    def _layer_param_counts(self) -> list:
        """Parameters per layer of :attr:`layers` (for summaries)."""
        counts = [0] * len(self.layers)
        for seg in self._segments:
            counts[seg.layer] += seg.stop - seg.start
        return counts

    def fingerprint(self) -> str:
        """SHA-256 of what fixes the state layout (inputs and layers, not the
        updater's hyper-parameters, penalties or seed)."""
        return config_fingerprint(self.to_config())

    def to_json(self) -> str:
        """:meth:`to_config` as JSON text (sorted keys; no parameters)."""
        return json.dumps(self.to_config(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str, *, trusted=None):
        """Inverse of :meth:`to_json`: a freshly initialised model (same
        seed, so the same initial parameters).  Code the configuration names
        is called only if marked or ``trusted`` (:mod:`sparkavg.references`).

        Raises
        ------
        ConfigError
            Text that is not JSON, or a configuration that does not describe
            a valid model (the message names the type and field).
        """
        try:
            config = json.loads(text)
        except (TypeError, ValueError, RecursionError) as exc:
            raise ConfigError(f"Expect a JSON network configuration, got text that does not parse: {exc}") from None
        with trusting(trusted):
            return from_config(upgrade_config(config), kind="network", expect=cls)

    def clone(self):
        """An independent copy: config, parameters, updater state, buffers,
        counters, on the same device."""
        other = from_config(self.to_config(), kind="network", expect=type(self))
        if self._xp is not np:
            other.to_gpu()
        other._params[...] = self._params
        other._state[...] = self._state
        other._buffers[...] = self._buffers
        other.iteration, other.epoch = self.iteration, self.epoch
        other.inference_batch_size = self.inference_batch_size
        return other

    def save(self, path) -> None:
        """Write an .npz (params, updater state, buffers, counters, JSON
        config, SHA-256); never pickle.  See :mod:`sparkavg.nn.serialization`."""
        save_network(self, path)

    @classmethod
    def load(cls, path, *, max_params: int | None = None, trusted=None):
        """Read a file written by :meth:`save`, verifying it in bounded memory.

        Parameters
        ----------
        path : str or os.PathLike
        max_params : int, optional
            Refuse a configuration with more parameters than this (before
            anything is allocated); default
            :data:`sparkavg.nn.serialization.MAX_PARAMS`.
        trusted : collection of str, True or None
            Code the file names (a torch factory or loss) that may be called
            besides marked functions (:mod:`sparkavg.references`).

        Raises
        ------
        ModelFileError
            Anything wrong with the file, naming the file and what was
            expected (see :mod:`sparkavg.nn.serialization`).
        """
        return load_network(path, cls, max_params=max_params, trusted=trusted)

    def __deepcopy__(self, memo):
        return self.clone()

    def __copy__(self):
        return self.clone()
