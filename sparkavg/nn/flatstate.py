"""The flat state of a model and the training step over it.

:class:`FlatState` is the core every sparkavg model holds (composes): ONE
flat parameter vector, one flat gradient vector, one flat updater state
and one flat buffer vector (FSDP's ``FlatParameter``), where each of them
sits (:class:`Segment`), the array module they live on, and the step that
updates them -- the updater apart from what computes gradients (Chainer's
``Optimizer`` apart from the ``Link``; DL4J's one flattened updater) at the
rate a schedule gives at :attr:`~FlatState.iteration` and
:attr:`~FlatState.epoch`, the loss gradient normalised, L2 and weight
decay.

It knows no layer and no module.  The model that holds it is its
*provider* (:class:`FlatProvider`): it points its own arrays at views of
the vectors and computes one minibatch's loss and gradient; the state does
the rest.  What acts on ranges of the update (weight decay, the rows a lazy
table did not touch) is applied in one place, :meth:`FlatState._step_into`,
and what an updater keeps is one vector laid out over the parameters, so a
rule per range of parameters or an optimizer whose state tensors are views
of :attr:`FlatState.updater_state` lands here, once for every model.
"""
from __future__ import annotations

import contextlib
import logging
import math
import numbers
from collections import namedtuple
from typing import Protocol, Sequence

import numpy as np

from .. import backend
from ..threads import single_threaded_blas
from . import device_checks
from .clipping import GradientNormalization
from .model import STATE_VECTORS
from .regularization import Regularization
from .schedules import Schedule
from .updaters import Adam, Updater

__all__ = ["FlatState", "FlatProvider", "Segment", "DTYPES", "segments_of", "blocks"]

logger = logging.getLogger(__name__)

#: Where one parameter (or buffer) of one layer sits in its flat vector.
Segment = namedtuple("Segment", "layer name start stop shape regularized")

#: Parameter dtypes a model may have (model files are checked against it).
DTYPES = ("float32", "float64")


def segments_of(groups) -> tuple:
    """``(segments, size)`` of a flat vector laid out over ``groups``: the
    i-th group lists the pieces of owner ``i`` (a layer, a module's
    parameter) as ``(name, shape, regularized)``, contiguous and in order."""
    segments, offset = [], 0
    for i, pieces in enumerate(groups):
        for name, shape, regularized in pieces:
            size = math.prod(shape)
            segments.append(Segment(i, name, offset, offset + size, shape, regularized))
            offset += size
    return segments, offset


def blocks(segments, count):
    """Each owner's contiguous (start, stop) block of a flat vector."""
    found = {}
    for seg in segments:  # an owner's pieces are contiguous
        start, _ = found.get(seg.layer, (seg.start, seg.stop))
        found[seg.layer] = (start, seg.stop)
    return [found.get(i, (0, 0)) for i in range(count)]


def _nonneg(name, value):
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not (value >= 0) \
            or not math.isfinite(value):
        raise ValueError(f"Expect {name} >= 0, got {value!r}")
    return float(value)


def check_dtype(dtype) -> np.dtype:
    if str(dtype) not in DTYPES:
        raise ValueError(f"Expect dtype in {DTYPES}, got {dtype!r}")
    return np.dtype(str(dtype))


def check_seed(seed) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"Expect seed as an int >= 0, got {seed!r}")
    return int(seed)


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


class FlatProvider(Protocol):
    """What a model tells the :class:`FlatState` it holds (the model's side
    of the composition).  :class:`~sparkavg.nn.flat.FlatModel` gives the
    optional hooks their defaults."""

    def _bind_flat(self, flat: "FlatState") -> None:
        """Point the model's own arrays (its layers' weights and gradients,
        a module's tensors) at views of ``flat``'s vectors; called once the
        initial values are in and after every device move."""

    def _loss_terms(self, x, y, weights=None) -> list:
        """Forward and backward of one minibatch in training mode, writing
        the loss gradient (without L2) into every element of
        :attr:`FlatState.grads`; ``weights``, one per example, scale the
        examples' losses (:mod:`sparkavg.nn.losses`): a provider that takes
        none is called without them.  Returns the loss as ``(weight, total,
        count)`` terms, totals possibly device values read at the step's end."""

    def _step_work(self) -> tuple:
        """Optional: ``(OpenMP multiply-adds, BLAS multiply-adds)`` of one
        step, which choose its thread pools (:meth:`FlatState.step_threads`)."""

    def _has_lazy_rows(self) -> bool:
        """Optional: whether a step may leave rows of a table untouched (an
        ``Embedding(lazy=True)``)."""

    def _touched_rows(self) -> list:
        """Optional: after :meth:`_loss_terms`, ``(segment, touched rows
        mask)`` of each table whose step touched only some rows."""

    def _range_scales(self) -> list:
        """Optional: ``(start, stop, scale)`` ranges of the parameters whose
        step is scaled (a layer's learning-rate multiplier), 0 for ranges
        never updated (frozen layers; :mod:`sparkavg.nn.finetune`)."""


class FlatState:
    """The flat vectors of one model and the step that updates them (see
    the module doc).

    Parameters
    ----------
    param_segments, buffer_segments : list of Segment
        The layout of the parameter and buffer vectors (:func:`segments_of`).
    updater : Updater, default Adam(lr=1e-3)
    l2, l2_bias, weight_decay : float, default 0
    seed : int, default 123
    dtype : {"float32", "float64"}
    gradient_normalization : GradientNormalization, optional

    Attributes
    ----------
    params, grads, updater_state, buffers : array
        The live flat vectors (numpy or CuPy, of :attr:`dtype`); ``params``
        is allocated uninitialised and ``buffers`` zero: the model writes
        their initial values before it binds.
    update : array
        The step's own (``num_params``,) buffer, where :meth:`fit_batch`
        builds an update that something acts on by range.
    iteration, epoch : int
        Completed updater steps and epochs (a schedule follows them).
    xp : module
        numpy or cupy: where the vectors live.
    """

    #: A step runs BLAS at one thread when OpenMP kernels carry at least this
    #: share of its multiply-adds (:meth:`step_threads`).
    OPENMP_SHARE_FOR_SINGLE_BLAS = 0.9

    def __init__(self, param_segments: Sequence[Segment], buffer_segments: Sequence[Segment], *,
                 updater: Updater | None = None, l2: float = 0.0, l2_bias: float = 0.0, weight_decay: float = 0.0,
                 seed: int = 123, dtype: str = "float32", gradient_normalization: GradientNormalization | None = None):
        self.dtype = check_dtype(dtype)
        self.seed = check_seed(seed)
        self.updater = check_updater(updater)
        self.l2 = _nonneg("l2", l2)
        self.l2_bias = _nonneg("l2_bias", l2_bias)
        self.weight_decay = _nonneg("weight_decay", weight_decay)
        self.gradient_normalization = check_gradient_normalization(gradient_normalization)
        self.iteration = 0
        self.epoch = 0
        self.xp = np
        self.param_segments = list(param_segments)
        self.buffer_segments = list(buffer_segments)
        n = self.num_params = self.param_segments[-1].stop if self.param_segments else 0
        num_buffers = self.buffer_segments[-1].stop if self.buffer_segments else 0
        self._reg = None  # the Regularization of the current coefficients
        self._resolved = None  # (updater, rate, updater at that rate) of a scheduled rate
        self._groups = {}  # gradient normalisation's (start, stop) groups by its `per`
        self._single_blas = None
        self._bound = None  # a binding updater's step over these vectors (_apply_updater)
        self.params = np.empty(n, dtype=self.dtype)
        self.grads = np.zeros(n, dtype=self.dtype)
        self.update = np.zeros(n, dtype=self.dtype)
        self.updater_state = np.zeros(self.updater.state_size(n), dtype=self.dtype)
        self.buffers = np.zeros(num_buffers, dtype=self.dtype)

    # ------------------------------------------------------------ vectors
    @property
    def vectors(self) -> dict:
        """The live flat vectors by name: ``{"params", "updater", "buffers"}``."""
        return {"params": self.params, "updater": self.updater_state, "buffers": self.buffers}

    def assign(self, name: str, value) -> None:
        """Copy ``value`` into the live vector ``name`` (``"params"``,
        ``"updater_state"`` or ``"buffers"``): same shape, dtype and device."""
        target = getattr(self, name)
        self.check_flat(value, name, target.shape[0])
        target[...] = value

    def load(self, state) -> None:
        """Copy the given named vectors in (any of ``params``, ``updater``,
        ``buffers``; host or device arrays are moved to this device; shapes
        must match).  ``None`` values are skipped."""
        unknown = sorted(set(state) - set(STATE_VECTORS))
        if unknown:
            raise ValueError(f"Expect state vectors among {list(STATE_VECTORS)}, got {unknown}")
        live = self.vectors
        for name, value in state.items():
            if value is None:
                continue
            target = live[name]
            if getattr(value, "shape", None) != target.shape:
                raise ValueError(f"Expect {name} of shape {target.shape}, got {getattr(value, 'shape', None)}")
            target[...] = self.on_device(value)

    def on_device(self, a):
        """``a`` as an array of this dtype on this device (copying only if needed)."""
        xp = self.xp
        if xp is np and backend.is_gpu_array(a):
            a = backend.to_cpu(a)  # device -> host sync
        elif xp is not np and not backend.is_gpu_array(a):
            a = backend.to_gpu(np.asarray(a))  # host -> device sync
        return xp.asarray(a, dtype=self.dtype)

    def check_flat(self, a, name, size):
        """Raise ValueError unless ``a`` is a (size,) array of this dtype on this device."""
        if getattr(a, "shape", None) != (size,):
            raise ValueError(f"Expect {name} of shape ({size},), got {getattr(a, 'shape', type(a).__name__)}")
        if a.dtype != self.dtype:
            raise ValueError(f"Expect {name} of dtype {self.dtype}, got {a.dtype}")
        if backend.is_gpu_array(a) != (self.xp is not np):
            where = "CuPy (GPU)" if self.xp is not np else "numpy (CPU)"
            raise ValueError(f"Expect {name} as a {where} array like the model's, got {type(a).__module__}")

    # ------------------------------------------------------------ devices
    def _move(self, convert, xp):
        self.params = convert(self.params)
        self.grads = convert(self.grads)
        self.update = convert(self.update)
        self.updater_state = convert(self.updater_state)
        self.buffers = convert(self.buffers)
        self.xp = xp
        self._bound = None  # bound to the old vectors
        logger.debug("model of %d params moved to %s", self.num_params, xp.__name__)

    def to_gpu(self) -> bool:
        """Move every vector to the current CUDA device (host -> device
        copies); True when they moved (the provider binds again)."""
        if self.xp is not np:
            return False
        backend.check_available()
        self._move(backend.to_gpu, backend.cupy())
        return True

    def to_cpu(self) -> bool:
        """Move every vector back to host memory; True when they moved."""
        if self.xp is np:
            return False
        self._move(backend.to_cpu, np)
        return True

    # ----------------------------------------------------- regularisation
    def regularization(self) -> Regularization:
        """The L2 / weight-decay ranges (rebuilt when a coefficient was reassigned)."""
        key = (self.l2, self.l2_bias, self.weight_decay)
        if self._reg is None or self._reg.coefficients != key:
            self._reg = Regularization(self.param_segments, *key)
        return self._reg

    def penalty(self):
        """0.5 * l2 * |W|^2 + 0.5 * l2_bias * |b|^2 (a device -> host sync on CuPy)."""
        reg = self.regularization()
        return reg.penalty(reg.penalty_terms(self.params))

    def normalization_groups(self, per: str) -> tuple:
        """The (start, stop) ranges gradient normalisation treats as one
        group for ``per`` ("parameter", "layer": an owner's block of
        segments, or the whole vector)."""
        groups = self._groups.get(per)
        if groups is None:
            if per == "parameter":
                groups = [(seg.start, seg.stop) for seg in self.param_segments if seg.stop > seg.start]
            elif per == "layer":  # a layer's segments are contiguous; a TorchModel's "layer" is a parameter
                count = 1 + max((seg.layer for seg in self.param_segments), default=-1)
                groups = [(a, b) for a, b in blocks(self.param_segments, count) if b > a]
            else:
                groups = [(0, self.num_params)]
            self._groups[per] = groups = tuple(groups)
        return groups

    def normalize_gradient(self) -> None:
        """Apply :attr:`gradient_normalization` to the loss gradient, in place."""
        norm = self.gradient_normalization
        if norm is None:
            return
        norm.apply(self.grads, self.normalization_groups(norm.per))

    def _pending(self, terms, normalize: bool):
        """The pending loss of a step: the provider's loss terms and the L2
        terms of the parameters before any update; normalises the loss
        gradient (a training step) and adds the L2 gradient."""
        reg = self.regularization()
        penalty = reg.penalty_terms(self.params)  # before any update touches the parameters
        if normalize:  # the loss gradient is normalised before L2 joins it
            self.normalize_gradient()
        reg.add_gradient(self.grads, self.params)
        return terms, penalty

    @staticmethod
    def loss_value(pending, sync: bool = True):
        """Mean loss + L2 penalty: a float (device -> host syncs on CuPy: call
        it at the end of a step), or with ``sync=False`` on a GPU a 0-d array
        on the device, computed there (no sync); numpy models always give a float.

        ``pending[0]`` is a list of ``(weight, total, count)`` loss terms."""
        terms, penalty = pending
        if sync or all(isinstance(total, (float, np.generic, np.ndarray)) for _, total, _ in terms):
            device_checks.resolve()  # the step's deferred label checks, before its loss is read
            return sum(w * float(total) / count for w, total, count in terms) + Regularization.penalty(penalty)
        device_checks.resolve_if_full()
        value = None
        for w, total, count in terms:
            term = total * (w / count)
            value = term if value is None else value + term
        for half, dot in penalty:
            value = value + half * dot
        return value

    # --------------------------------------------------------------- step
    def step_updater(self) -> Updater:
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
        resolved = self._resolved
        if resolved is None or resolved[0] is not updater or resolved[1] != rate:
            resolved = self._resolved = (updater, rate, updater.at_rate(rate))
        return resolved[2]

    def step_threads(self, provider: FlatProvider):
        """The thread pools of a step: on the CPU in float32, when OpenMP
        kernels (the direct convolutions) carry at least
        :attr:`OPENMP_SHARE_FOR_SINGLE_BLAS` of the multiply-adds, BLAS runs
        at one thread inside (:func:`sparkavg.threads.single_threaded_blas`:
        its spinning idle threads would take the cores OpenMP's threads
        need), else the pools as set."""
        if self._single_blas is None:
            openmp, blas = provider._step_work()
            self._single_blas = openmp > 0 and openmp >= self.OPENMP_SHARE_FOR_SINGLE_BLAS * (openmp + blas)
        if self._single_blas and self.xp is np and self.dtype == np.float32:
            return single_threaded_blas()
        return contextlib.nullcontext()

    def _training_loss(self, provider: FlatProvider, x, y, weights=None):
        """The provider's loss and gradient of a training step: frozen
        ranges' gradient zeroed, the loss gradient normalised by
        :attr:`gradient_normalization`, then L2 added."""
        normalize = self.gradient_normalization is not None
        with self.step_threads(provider), device_checks.deferring():  # a step reads nothing back from a GPU
            terms = _loss_terms(provider, x, y, weights)
            for start, stop, scale in _range_scales(provider):
                if scale == 0:
                    self.grads[start:stop] = 0
            return self._pending(terms, normalize)

    def gradient(self, provider: FlatProvider, x, y, weights=None):
        """Loss and a copy of the gradient of one batch, L2 included, nothing
        updated nor normalised (see :meth:`~sparkavg.nn.flat.FlatModel.gradient`)."""
        loss = self.loss_value(self._pending(_loss_terms(provider, x, y, weights), False))
        return loss, self.grads.copy()

    def compute_update(self, provider: FlatProvider, x, y, out, *, weights=None, sync: bool = True):
        """Fill ``out`` with what :meth:`fit_batch` would add to the
        parameters, advancing the updater state, the buffers and
        :attr:`iteration` (see :meth:`~sparkavg.nn.flat.FlatModel.compute_update`)."""
        self.check_flat(out, "out", self.num_params)
        updater = self.step_updater()
        pending = self._training_loss(provider, x, y, weights)
        out.fill(0)
        self._step_into(updater, out, provider)
        self.iteration += 1
        return self.loss_value(pending, sync)

    def _step_into(self, updater: Updater, out, provider: FlatProvider) -> None:
        """The updater's step into the zeroed ``out``, then what acts on
        ranges of it: weight decay (at the step's rate) and a lazy table's
        untouched rows, which get no update and keep their updater state."""
        kept = self._keep_untouched_rows(provider._touched_rows())
        scales = _range_scales(provider)
        frozen = self._state_ranges([(a, b) for a, b, s in scales if s == 0])
        saved = [self.updater_state[a:b].copy() for a, b in frozen]
        self._apply_updater(updater, out)
        self.regularization().decay(out, self.params, updater.lr)
        if kept:
            self._restore_untouched_rows(kept, out)
        for (a, b), values in zip(frozen, saved):
            self.updater_state[a:b] = values
        for start, stop, scale in scales:
            if scale == 0:
                out[start:stop] = 0
            else:
                out[start:stop] *= out.dtype.type(scale)

    def _state_ranges(self, ranges) -> list:
        """The updater state's ranges over parameter ``ranges``: each slot
        (a whole vector of the parameters' length) at that range."""
        n, size = self.num_params, self.updater_state.shape[0]
        if not ranges or not size:
            return []
        if size % n:
            raise ValueError(f"Expect an updater whose state is whole vectors of the parameters' length to freeze "
                             f"layers, got {self.updater!r} with {size} values for {n} parameters")
        return [(j * n + a, j * n + b) for j in range(size // n) for a, b in ranges]

    def _apply_updater(self, updater: Updater, update) -> None:
        """Add the updater's step to ``update``: ``updater.apply`` on the flat
        vectors, or, for an updater that binds to them (``updater.bind(flat)``:
        an optimizer whose per-parameter state tensors are views of
        :attr:`updater_state`, ``sparkavg.torch.TorchOptimizer``), the step of
        its binding, made once and kept while the updater's layout and the
        vectors stay (a scheduled rate's updater of each step reuses it)."""
        bind = getattr(updater, "bind", None)
        if bind is None:
            updater.apply(update, self.grads, self.updater_state, self.iteration)
            return
        bound = self._bound
        if bound is None or not bound.serves(updater, self):
            bound = self._bound = bind(self)
        bound.step(updater, update, self.iteration, self.epoch)

    def _adds_directly(self, provider: FlatProvider) -> bool:
        """Whether the updater may add its step to the parameters directly:
        nothing acts on ranges of the update (:meth:`_step_into`; weight
        decay reads the parameters before the step)."""
        return not (self.regularization().decay_ranges or provider._has_lazy_rows() or _range_scales(provider))

    def fit_batch(self, provider: FlatProvider, x, y, *, weights=None, sync: bool = True):
        """One training step; the batch loss (see
        :meth:`~sparkavg.nn.flat.FlatModel.fit_batch`).  Exactly
        :meth:`compute_update` into :attr:`update` then ``params += update``;
        where the updater may add to the parameters directly it does (same
        sums, bit-identical on the CPU; no buffer to zero, one pass fewer)."""
        if not self._adds_directly(provider):
            loss = self.compute_update(provider, x, y, self.update, weights=weights, sync=sync)
            self.params += self.update
            return loss
        updater = self.step_updater()
        pending = self._training_loss(provider, x, y, weights)
        self._apply_updater(updater, self.params)
        self.iteration += 1
        return self.loss_value(pending, sync)

    def apply_update(self, update) -> None:
        """``params += update`` in place (``update`` flat, same dtype and device)."""
        self.check_flat(update, "update", self.num_params)
        self.params += update

    def _keep_untouched_rows(self, tables) -> list:
        """Before the updater's step: the updater state of the rows a lazy
        table's step did not touch (``tables`` of ``(segment, touched mask)``),
        to put back after it."""
        if not tables:
            return []
        n, size = self.num_params, self.updater_state.shape[0]
        if size % n:
            raise ValueError(f"Expect an updater whose state is whole vectors of the parameters' length for "
                             f"Embedding(lazy=True), got {self.updater!r} with {size} values for {n} parameters")
        kept = []
        for seg, mask in tables:
            untouched = ~mask
            saved = [self.updater_state[j * n + seg.start:j * n + seg.stop].reshape(seg.shape)[untouched]
                     for j in range(size // n)]
            kept.append((seg, untouched, saved))
        return kept

    def _restore_untouched_rows(self, kept: list, out) -> None:
        """After the updater's step: untouched rows get no update and keep their state."""
        n = self.num_params
        for seg, untouched, saved in kept:
            out[seg.start:seg.stop].reshape(seg.shape)[untouched] = 0
            for j, rows in enumerate(saved):
                self.updater_state[j * n + seg.start:j * n + seg.stop].reshape(seg.shape)[untouched] = rows

    # ------------------------------------------------------------- config
    def arguments(self) -> dict:
        """The model constructor arguments this state was built from
        (updater, penalties, seed, dtype, gradient normalisation)."""
        args = {"updater": self.updater, "l2": self.l2, "l2_bias": self.l2_bias,
                "weight_decay": self.weight_decay, "seed": self.seed, "dtype": str(self.dtype)}
        if self.gradient_normalization is not None:  # configs without it stay as they were
            args["gradient_normalization"] = self.gradient_normalization
        return args

    def describe(self) -> str:
        """The penalties, gradient normalisation and seed, for summaries."""
        norm = self.gradient_normalization
        return (f"l2={self.l2}, l2_bias={self.l2_bias}, weight_decay={self.weight_decay}; "
                + (f"gradient_normalization={norm!r}; " if norm is not None else "") + f"seed={self.seed}")


def _loss_terms(provider: FlatProvider, x, y, weights) -> list:
    """The provider's loss terms; ``weights`` passed only when given."""
    if weights is None:
        return provider._loss_terms(x, y)
    return provider._loss_terms(x, y, weights)


def _range_scales(provider: FlatProvider) -> list:
    """The provider's scaled and frozen ranges (an optional hook)."""
    hook = getattr(provider, "_range_scales", None)
    return hook() if hook is not None else []
