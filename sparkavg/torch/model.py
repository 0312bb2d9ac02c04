"""A user's ``torch.nn.Module`` as a sparkavg model (the model contract).

:class:`TorchModel` builds the module from an importable factory, then
moves every trainable parameter into ONE flat tensor and every gradient
into a second (FSDP's ``FlatParameter``): ``param.data`` and
``param.grad`` are views of them, so ``loss.backward()`` accumulates into
the flat gradient.  On the CPU the flat tensors are the memory of numpy
arrays (``torch.from_numpy``: zero-copy), on a GPU of CuPy arrays (DLPack),
so sparkavg's own updaters, averaging, block momentum and threshold
encoding act on them unchanged: the model holds a
:class:`~sparkavg.nn.flatstate.FlatState` like every sparkavg model and is
its provider (binding the module's tensors to it, computing a minibatch's
loss and gradient).
Torch's optimizers are not used: their per-parameter state could not be
averaged, shipped or checkpointed as one vector.

Buffers (BatchNorm's running statistics) are views of the ``buffers``
vector where their dtype is the model's; others (``num_batches_tracked``,
an int64) are copied in before and out after each training step, so the
flat vector is what counts.  Only persistent buffers (those in the
module's ``state_dict``) are state; frozen parameters
(``requires_grad=False``) stay as the factory built them.
"""
from __future__ import annotations

import logging
import math
import numbers
from typing import Annotated, Any, Sequence

import numpy as np

from .. import backend
from ..configurable import ConfigError, register
from ..nn.clipping import GradientNormalization
from ..nn.flat import FlatModel
from ..nn.flatstate import FlatState, check_dtype, check_seed, check_updater, segments_of
from ..nn.losses import Targets, check_class_weights, check_huber_delta, prepare_targets
from ..nn.model import InputSpec, ModelSpec, OutputSpec, one_input
from ..nn.updaters import Updater
from ..references import Names, reference_of, resolve

__all__ = ["TorchModel", "LOSSES"]

logger = logging.getLogger(__name__)

#: Built-in losses by name and the loss kind each is (:mod:`sparkavg.nn.losses`):
#: ``bce`` takes the module's outputs as logits, as
#: ``torch.nn.functional.binary_cross_entropy_with_logits`` does.
LOSSES = {"cross_entropy": "nll", "bce": "bce", "mse": "mse", "mae": "mae", "huber": "huber"}

#: A custom loss's ``targets`` and the loss kind its labels are checked as.
_CUSTOM_TARGETS = {"classes": "nll", "binary": "bce", "values": "mse"}


def _torch():
    import torch

    return torch


def _check_shape(input_shape):
    shape = input_shape.tolist() if isinstance(input_shape, np.ndarray) else input_shape
    if not isinstance(shape, (tuple, list)) or not shape or not all(
            isinstance(d, numbers.Integral) and not isinstance(d, bool) and d >= 1 for d in shape):
        raise ValueError(f"Expect input_shape as a non-empty sequence of positive ints, got {input_shape!r}")
    return tuple(int(d) for d in shape)


def _callable_or_reference(value, kind, what):
    """``(reference or None, callable)`` for a factory or loss given either way."""
    if isinstance(value, str):
        return value, resolve(value, kind)
    if callable(value):
        return reference_of(value), value
    raise ValueError(f"Expect the {what} as a 'package.module:function' string or a callable, got "
                     f"{type(value).__name__}")


class _Plan:
    """A built module and its layout (what the constructor and ``planned_sizes`` share).

    ``meta=True`` builds the module on torch's ``meta`` device: shapes
    without memory, so a loader counts a file's parameters before it
    allocates them (a factory that cannot build there is built on the CPU)."""

    def __init__(self, args: dict, meta: bool = False):
        torch = _torch()
        self.input_shape = _check_shape(args["input_shape"])
        self.factory_ref, factory = _callable_or_reference(args["factory"], "factory", "module factory")
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
        persistent = set(module.state_dict(keep_vars=True))
        self.buffers = [(n, b) for n, b in module.named_buffers() if n in persistent]
        # each parameter (buffer) tensor is its own owner; weights are those of two or more dimensions
        self.segments, self.num_params = segments_of([(n, tuple(p.shape), p.dim() > 1)] for n, p in self.params)
        self.buffer_segments, self.num_buffers = segments_of([(n, tuple(b.shape), False)] for n, b in self.buffers)


@register("network", "TorchModel")
class TorchModel(FlatModel):
    """A ``torch.nn.Module`` trained by sparkavg (see the module doc).

    Parameters
    ----------
    factory : str or callable
        ``"package.module:function"`` returning the ``nn.Module`` (called
        with ``factory_kwargs`` under ``torch.manual_seed(seed)``), or the
        callable itself.  A callable is stored by that name when it is a
        module-level function of an importable module; any other callable
        (a lambda, a closure, a function of ``__main__`` or a notebook)
        works in this process only: it cannot be saved, checkpointed or
        shipped to Spark executors (:meth:`to_config` says so).
    loss : str or callable, default "cross_entropy"
        ``"cross_entropy"`` (targets are class indices or one-hot rows;
        :meth:`output` gives softmax probabilities, as a
        :class:`~sparkavg.nn.Network` does), ``"bce"`` (binary labels in
        [0, 1], the module's outputs taken as logits; :meth:`output` gives
        sigmoid probabilities), ``"mse"``, ``"mae"``, ``"huber"`` (float
        targets; raw outputs) -- computed as :mod:`sparkavg.nn.losses`
        says -- or ``loss_fn(outputs, targets) -> mean loss`` as a
        ``"package.module:function"`` name or callable, with ``targets``
        saying what it trains on.
    updater : Updater, default Adam(lr=1e-3)
        A sparkavg updater (its state is one flat vector over the parameters).
    input_shape : sequence of int
        One example's shape without the batch axis, as the module takes it
        ((C, H, W), (features,), (T, F)); inputs may also arrive flat.
    factory_kwargs : dict, optional
        JSON keyword arguments of the factory.
    targets : {"classes", "binary", "values"}, default "classes"
        For a custom ``loss`` only: class labels (softmax outputs, accuracy),
        binary labels (sigmoid outputs) or regression values.
    class_weights : sequence of float, optional
        As for :class:`~sparkavg.nn.Output`: one weight per class for
        ``"cross_entropy"``, ``(negative, positive)`` for ``"bce"``.
    huber_delta : float, default 1.0
        Where ``"huber"`` turns from squared to absolute error.
    l2, l2_bias, weight_decay : float, default 0
        As for :class:`~sparkavg.nn.Network`: weights are the parameters of
        two or more dimensions, biases the others.
    seed : int, default 123
        Seeds the factory (same seed, same initial parameters).
    dtype : {"float32", "float64"}
    gradient_normalization : GradientNormalization, optional
        As for :class:`~sparkavg.nn.Network` (:mod:`sparkavg.nn.clipping`);
        each parameter tensor of the module counts as a layer.

    Notes
    -----
    The module's outputs must be ``(batch, units)``; ``units`` is found by
    one forward pass of a zero batch at construction.  Dropout inside the
    module draws from torch's global generator.
    """

    def __init__(self, factory: Annotated[Any, Names("factory")],
                 loss: Annotated[Any, Names("loss", plain=LOSSES)] = "cross_entropy", updater: Updater | None = None,
                 input_shape: Sequence[int] = (), factory_kwargs: dict | None = None,
                 targets: str = "classes", l2: float = 0.0, l2_bias: float = 0.0, weight_decay: float = 0.0,
                 seed: int = 123, dtype: str = "float32", gradient_normalization: GradientNormalization | None = None,
                 class_weights: Sequence[float] | None = None, huber_delta: float = 1.0):
        torch = _torch()
        plan = _Plan({"factory": factory, "factory_kwargs": factory_kwargs, "input_shape": input_shape,
                      "seed": seed, "dtype": dtype})
        self._factory_arg = factory
        self.factory_ref, self.factory_kwargs = plan.factory_ref, plan.kwargs
        self.input_shape = plan.input_shape
        self.module = plan.module
        self._loss_ref, self._loss_fn, self.loss_kind = self._loss(loss, targets)
        self._loss_arg, self.targets = loss, targets
        self.huber_delta = check_huber_delta(huber_delta)
        if class_weights is not None and self._loss_fn is not None:
            raise ValueError("Expect class_weights only with a built-in loss ('cross_entropy' or 'bce'): a custom "
                             "loss weighs its own classes")
        flat = FlatState(plan.segments, plan.buffer_segments, updater=updater, l2=l2, l2_bias=l2_bias,
                         weight_decay=weight_decay, seed=seed, dtype=plan.dtype,
                         gradient_normalization=gradient_normalization)
        self._torch_params = [p for _, p in plan.params]
        self._torch_buffers = [(self._owner(n), n.rpartition(".")[2], b.dtype) for n, b in plan.buffers]
        with torch.no_grad():
            for seg, p in zip(flat.param_segments, self._torch_params):
                flat.params[seg.start:seg.stop] = p.detach().reshape(-1).cpu().numpy()
            for seg, (_, b) in zip(flat.buffer_segments, plan.buffers):
                flat.buffers[seg.start:seg.stop] = b.detach().reshape(-1).cpu().to(torch.float64).numpy()
        self._training = None
        self._compose(flat)
        self.units = self._dry_run()
        self.class_weights = check_class_weights(self.loss_kind, class_weights, self.units)

    # ------------------------------------------------------------ building
    @staticmethod
    def _loss(loss, targets):
        """``(reference or None, callable or None, loss kind)``; None: a built-in."""
        if isinstance(loss, str) and loss in LOSSES:
            return loss, None, LOSSES[loss]
        if targets not in _CUSTOM_TARGETS:
            raise ValueError(f"Expect targets in {list(_CUSTOM_TARGETS)}, got {targets!r}")
        if isinstance(loss, str) and ":" not in loss:
            raise ValueError(f"Expect loss in {sorted(LOSSES)}, a 'package.module:function' or a callable, "
                             f"got {loss!r}")
        ref, fn = _callable_or_reference(loss, "loss", "loss function")
        return ref, fn, _CUSTOM_TARGETS[targets]

    def _owner(self, name):
        module = self.module
        for part in name.split(".")[:-1]:
            module = getattr(module, part)
        return module

    @classmethod
    def planned_sizes(cls, args: dict) -> dict:
        """The state vectors' lengths for these constructor arguments (builds
        the module on torch's meta device: no parameter is allocated)."""
        plan = _Plan(args, meta=True)
        return {"params": plan.num_params, "updater": int(check_updater(args.get("updater")).state_size(
            plan.num_params)), "buffers": plan.num_buffers}

    def _tensor(self, array):
        """A torch tensor sharing ``array``'s memory (numpy or CuPy)."""
        torch = _torch()
        if self.flat.xp is np:
            return torch.from_numpy(array)
        return torch.from_dlpack(array)

    def _device(self):
        torch = _torch()
        if self.flat.xp is np:
            return torch.device("cpu")
        return torch.device("cuda", backend.cupy().cuda.Device().id)

    def _bind_flat(self, flat):
        """Point every parameter, gradient and same-dtype buffer of the module
        at its slice of the flat vectors (after construction and any move)."""
        self.module.to(self._device())
        params, grads, buffers = self._tensor(flat.params), self._tensor(flat.grads), self._tensor(flat.buffers)
        for seg, p in zip(flat.param_segments, self._torch_params):
            p.data = params[seg.start:seg.stop].view(seg.shape)
            p.grad = grads[seg.start:seg.stop].view(seg.shape)
        self._copied = []
        for seg, (owner, name, dtype) in zip(flat.buffer_segments, self._torch_buffers):
            view = buffers[seg.start:seg.stop].view(seg.shape)
            if dtype == view.dtype:
                owner._buffers[name] = view
            else:  # e.g. BatchNorm's int64 num_batches_tracked: copied at step boundaries
                self._copied.append((owner, name, view))
        self._copy_in()

    def _dry_run(self) -> int:
        """Output units, from one inference forward of a zero batch."""
        torch = _torch()
        x = torch.zeros((2,) + self.input_shape, dtype=getattr(torch, str(self.dtype)), device=self._device())
        dims = ", ".join(map(str, self.input_shape))
        with torch.no_grad():
            self._mode(False)
            try:
                y = self.module(x)
            except (RuntimeError, ValueError, TypeError, IndexError) as exc:
                raise ValueError(f"Expect the module to take inputs of shape (batch, {dims}): a forward pass of "
                                 f"a zero batch of 2 failed with {type(exc).__name__}: {exc}") from None
        if not isinstance(y, torch.Tensor) or y.dim() != 2 or y.shape[0] != 2:
            shape = tuple(y.shape) if isinstance(y, torch.Tensor) else type(y).__name__
            raise ValueError(f"Expect the module to return a (batch, units) tensor for inputs of shape "
                             f"(batch, {dims}), got {shape} for a batch of 2")
        return int(y.shape[1])

    # ------------------------------------------------------------- steps
    def _mode(self, training: bool):
        if self._training is not training:
            self.module.train(training)
            self._training = training

    def _inputs(self, x):
        """A batch as a tensor (n, *input_shape) on the model's device, sharing memory where it can."""
        shape = tuple(getattr(x, "shape", np.shape(x)))
        flat = math.prod(self.input_shape)
        if len(shape) < 1 or not (shape[1:] == self.input_shape or shape[1:] == (flat,)):
            dims = ", ".join(str(d) for d in self.input_shape)
            raise ValueError(f"Expect inputs of shape (batch, {dims})"
                             + (f" or (batch, {flat})" if len(self.input_shape) > 1 else "") + f", got {shape}")
        a = self.flat.on_device(x)
        if self.xp is np and not a.flags.writeable:
            a = a.copy()  # torch.from_numpy warns on read-only memory
        return self._tensor(self.xp.ascontiguousarray(a.reshape((shape[0],) + self.input_shape)))

    def _targets(self, y, n, weights=None) -> Targets:
        """Labels checked as :mod:`sparkavg.nn.losses` does, as tensors: int64
        class indices, or float rows (one-hot, binary labels or values)."""
        xp = self.xp
        if xp is np and not isinstance(y, np.ndarray) and hasattr(y, "__cuda_array_interface__"):
            y = backend.to_cpu(y)
        t = prepare_targets(self.loss_kind, y, n, self.units, xp, self.dtype, weights)
        w = None if t.weight is None else self._tensor(xp.ascontiguousarray(t.weight[:, 0]))
        return Targets(t.kind, self._tensor(xp.ascontiguousarray(t.y)), w)

    def _class_weights(self, like):
        if self.class_weights is None:
            return None
        return _torch().tensor(self.class_weights, dtype=like.dtype, device=like.device)

    def _loss_of(self, out, target: Targets):
        """Mean loss of outputs against prepared targets (a 0-d tensor): the
        formulas of :mod:`sparkavg.nn.losses` (weights scale a row's loss; the
        mean keeps its divisor)."""
        functional = _torch().nn.functional
        kind, y, w = target
        if self._loss_fn is not None:
            if w is not None:
                raise ValueError("Expect no per-row weights with a custom loss: it returns the batch's mean loss, "
                                 "which weights cannot reach")
            return self._loss_fn(out, y)
        loss, cw = self.loss_kind, self._class_weights(out)
        if w is None and cw is None:  # the plain losses, as torch computes them
            if loss == "nll":
                return functional.cross_entropy(out, y)
            if loss == "bce":
                return functional.binary_cross_entropy_with_logits(out, y)
            if loss == "huber":
                return functional.huber_loss(out, y, delta=self.huber_delta)
            return (functional.mse_loss if loss == "mse" else functional.l1_loss)(out, y)
        n = out.shape[0]
        if loss == "nll":
            rows = functional.cross_entropy(out, y, weight=cw, reduction="none")
            return (rows if w is None else rows * w).sum() / n
        if loss == "bce":
            a, b = (y, 1 - y) if cw is None else (y * cw[1], (1 - y) * cw[0])
            elements = (a + b) * functional.softplus(out) - a * out  # a*softplus(-z) + b*softplus(z)
        elif loss == "huber":
            elements = functional.huber_loss(out, y, delta=self.huber_delta, reduction="none")
        else:
            elements = (functional.mse_loss if loss == "mse" else functional.l1_loss)(out, y, reduction="none")
        if w is not None:
            elements = elements * w[:, None]
        return elements.sum() / elements.numel()

    def _loss_terms(self, x, y, weights=None):
        """Forward + backward in training mode; fills the flat gradient."""
        torch = _torch()
        xt = self._inputs(one_input(x, "input"))
        n = xt.shape[0]
        if n == 0:
            raise ValueError("Expect a non-empty batch, got 0 examples")
        yt = self._targets(y, n, weights)
        self.flat.grads.fill(0)
        self._mode(True)
        self._copy_in()
        loss = self._loss_of(self.module(xt), yt)
        loss.backward()
        with torch.no_grad():
            for owner, name, view in self._copied:
                view.copy_(owner._buffers[name])
        loss = loss.detach()
        total = loss.item() if self.xp is np else backend.cupy().from_dlpack(loss)
        return [(1.0, total, 1)]

    def _copy_in(self):
        """The buffers of another dtype than the model's, from the flat vector."""
        if self._copied:
            with _torch().no_grad():
                for owner, name, view in self._copied:
                    owner._buffers[name].copy_(view)

    def load_state(self, state) -> None:
        super().load_state(state)
        self._copy_in()

    # ----------------------------------------------------------- inference
    @property
    def spec(self) -> ModelSpec:
        """One input ``"input"`` of :attr:`input_shape`; one output ``"output"``."""
        return ModelSpec((InputSpec("input", tuple(self.input_shape)),),
                         (OutputSpec("output", int(self.units), self.loss_kind),))

    def _chunks(self, x):
        torch = _torch()
        xt = self._inputs(x)
        step = max(1, int(self.inference_batch_size))
        self._mode(False)
        with torch.no_grad():
            for start in range(0, xt.shape[0], step):
                yield start, self.module(xt[start:start + step])

    def _array(self, tensor):
        """A tensor as a new array of the model's module (numpy or CuPy)."""
        if self.xp is np:
            return tensor.numpy().copy()
        return backend.cupy().from_dlpack(tensor).copy()

    def output(self, x):
        """Inference-mode outputs, (N, units), a new array on the model's
        device: softmax probabilities when trained on classes, raw outputs
        for regression."""
        x = one_input(x, "input")
        n = int(getattr(x, "shape", np.shape(x))[0])
        result = self.xp.empty((n, self.units), dtype=self.dtype)
        for start, out in self._chunks(x):
            if self.loss_kind == "nll":
                out = _torch().softmax(out, dim=1)
            elif self.loss_kind == "bce":
                out = _torch().sigmoid(out)
            result[start:start + out.shape[0]] = self._array(out)
        return result

    def score(self, x, y) -> float:
        """Mean loss over all of ``x`` (inference mode, chunked) + L2 penalty."""
        x = one_input(x, "input")
        n = int(getattr(x, "shape", np.shape(x))[0])
        if n == 0:
            raise ValueError("Expect a non-empty batch, got 0 examples")
        target = self._targets(y, n)
        total = 0.0
        for start, out in self._chunks(x):
            total += float(self._loss_of(out, target.rows(start, start + out.shape[0]))) * out.shape[0]
        return total / n + self.flat.penalty()

    # ---------------------------------------------------------- export
    def export_onnx(self, path, *, encoding: dict | None = None) -> None:
        """Write :meth:`output` as an ONNX file (``torch.onnx.export``; input
        ``"input"``, output ``"output"``, a dynamic batch axis; ``encoding``:
        a fit's input encoding, applied first).  See :mod:`sparkavg.export.torch_model`."""
        from ..export.torch_model import export_onnx

        self._mode(False)
        export_onnx(self, path, encoding)

    def export_torchscript(self, path, *, encoding: dict | None = None) -> None:
        """Write :meth:`output` as a TorchScript file (``torch.jit.trace``;
        ``torch.jit.load(path)(x)`` gives ``output(x)``).  As :meth:`export_onnx`."""
        from ..export.torch_model import export_torchscript

        self._mode(False)
        export_torchscript(self, path, encoding)

    # ---------------------------------------------------------- config
    def config_arguments(self) -> dict:
        """The constructor arguments that rebuild this model, by name.

        Raises
        ------
        ConfigError
            The factory or loss is a callable that cannot be imported by
            name: such a model cannot be saved, checkpointed or shipped.
        """
        for ref, value, what in ((self.factory_ref, self._factory_arg, "factory"),
                                 (self._loss_ref, self._loss_arg, "loss")):
            if ref is None:
                raise ConfigError(
                    f"Expect a TorchModel {what} importable by name to save, checkpoint or ship the model "
                    f"to Spark executors, got the callable {getattr(value, '__qualname__', value)!r} of "
                    f"module {getattr(value, '__module__', None)!r}: define it at module level in an "
                    f"importable module (not __main__ or a notebook) and pass 'package.module:function'")
        args = {"factory": self.factory_ref, "factory_kwargs": self.factory_kwargs, "loss": self._loss_ref,
                "updater": self.updater, "input_shape": list(self.input_shape)}
        if self._loss_fn is not None:
            args["targets"] = self.targets
        if self.class_weights is not None:
            args["class_weights"] = list(self.class_weights)
        if self.loss_kind == "huber":
            args["huber_delta"] = self.huber_delta
        args.update({k: v for k, v in self.flat.arguments().items() if k != "updater"})
        return args

    def clone(self):
        """An independent copy (a fresh module from the same factory, the same
        state and counters), also for a model of a plain callable."""
        other = TorchModel(self._factory_arg, self._loss_arg, self.updater, self.input_shape,
                           self.factory_kwargs, self.targets, self.l2, self.l2_bias, self.weight_decay,
                           self.seed, str(self.dtype), self.gradient_normalization, self.class_weights,
                           self.huber_delta)
        if self.xp is not np:
            other.to_gpu()
        other.load_state(self.state)
        self._copy_counters(other)
        return other

    def summary(self) -> str:
        """The module's own text, its parameter and buffer counts and the training setup."""
        return (f"{self.module}\ntotal params: {self.num_params:,} ({self.dtype}); buffers: "
                f"{self.buffers.size:,}; outputs: {self.units} ({self.loss_kind}); updater: {self.updater!r}; "
                f"{self.flat.describe()}")

    def __repr__(self):
        name = self.factory_ref or getattr(self._factory_arg, "__qualname__", "?")
        return (f"TorchModel(factory={name!r}, input_shape={self.input_shape}, units={self.units}, "
                f"num_params={self.num_params}, updater={self.updater!r})")
