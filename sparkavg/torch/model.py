"""A user's ``torch.nn.Module`` as a sparkavg model (the model contract).

:class:`TorchModel` builds the module from an importable factory, then
moves every trainable parameter into ONE flat tensor and every gradient
into a second (FSDP's ``FlatParameter``): ``param.data`` and
``param.grad`` are views of them, so ``loss.backward()`` accumulates into
the flat gradient.  On the CPU the flat tensors are the memory of numpy
arrays (``torch.from_numpy``: zero-copy), on a GPU of CuPy arrays (DLPack),
so sparkavg's updaters, averaging, block momentum and threshold
encoding act on them unchanged: the model holds a
:class:`~sparkavg.nn.flatstate.FlatState` like every sparkavg model and is
its provider (binding the module's tensors to it, computing a minibatch's
loss and gradient).  A ``torch.optim`` optimizer and scheduler
(``optimizer=``, ``scheduler=``) step through
:class:`~sparkavg.torch.optim.TorchOptimizer`, whose per-parameter state
tensors are views of the flat updater vector.

Buffers (BatchNorm's running statistics) are views of the ``buffers``
vector where their dtype is the model's; others (``num_batches_tracked``,
an int64) are copied in before and out after each training step, so the
flat vector is what counts.  Only persistent buffers (those in the
module's ``state_dict``) are state.  Frozen parameters
(``requires_grad=False``) are views of the ``buffers`` vector too, after
the buffers: they ship with the model's state (pretrained weights reach
every executor), are never given a gradient, an updater step or threshold
encoding, and :meth:`TorchModel.load_state` keeps them bit-identical
through the masters' merges (the configuration pins them by digest).

The module may take several named inputs (``inputs={"image": (1, 28,
28), "meta": (4,)}``: positional arguments in that order; the data path
gives a dict by input name) and return a tensor, a tuple or a dict of
tensors (``prediction=`` names the one predictions come from); a custom
loss receives all of them, a ``training_step(module, batch)`` does what
it likes.  Pretrained weights (``init_weights=``) are read once, on the
driver (:mod:`sparkavg.torch.weights`).
"""
from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Annotated, Any, Sequence

import numpy as np

from .. import backend
from ..configurable import ConfigError, register
from ..nn.clipping import GradientNormalization
from ..nn.flat import FlatModel
from ..nn.flatstate import FlatState, check_updater
from ..nn.losses import Targets, check_class_weights, check_huber_delta, prepare_targets
from ..nn.model import InputSpec, ModelSpec, OutputSpec
from ..nn.updaters import Updater
from ..references import Names
from .losses import LOSSES, builtin_loss, check_prediction, loss_choice, predictions
from .optim import TorchCode, TorchOptimizer
from .plan import INPUT, Plan, callable_or_reference
from .weights import frozen_digest, load_into, read_state_dict

__all__ = ["TorchModel", "LOSSES"]

logger = logging.getLogger(__name__)



def _torch():
    import torch

    return torch


class _InCodeOnly:
    """Annotation metadata of a constructor argument only code may give: a
    loaded configuration naming it is refused (its values are state)."""

    def check_config_value(self, where, value):
        if value is not None:
            raise ConfigError(f"Expect {where} only in code, not in a loaded configuration: pretrained weights are "
                              f"read once, where the model is built, and saved as its state, got {value!r:.100}")
        return value


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
        says, on the predictions output -- or ``loss_fn(outputs, targets)
        -> mean loss`` as a ``"package.module:function"`` name or callable,
        with ``targets`` saying what it trains on; ``outputs`` is all the
        module returned (a tensor, a tuple or a dict).
    updater : Updater, default Adam(lr=1e-3)
        A sparkavg updater (its state is one flat vector over the
        parameters); or give ``optimizer`` instead.
    input_shape : sequence of int
        One example's shape without the batch axis, as the module takes it
        ((C, H, W), (features,), (T, F)); inputs may also arrive flat.
    factory_kwargs : dict, optional
        JSON keyword arguments of the factory.
    targets : {"classes", "binary", "values"}, default "classes"
        For a custom ``loss`` or a ``training_step``: class labels (softmax
        outputs, accuracy), binary labels (sigmoid outputs) or regression
        values.
    l2, l2_bias, weight_decay : float, default 0
        As for :class:`~sparkavg.nn.Network`: weights are the parameters of
        two or more dimensions, biases the others.
    seed : int, default 123
        Seeds the factory (same seed, same initial parameters).
    dtype : {"float32", "float64"}
    gradient_normalization : GradientNormalization, optional
        As for :class:`~sparkavg.nn.Network` (:mod:`sparkavg.nn.clipping`);
        each parameter tensor of the module counts as a layer.
    class_weights : sequence of float, optional
        As for :class:`~sparkavg.nn.Output`: one weight per class for
        ``"cross_entropy"``, ``(negative, positive)`` for ``"bce"``.
    huber_delta : float, default 1.0
        Where ``"huber"`` turns from squared to absolute error.
    optimizer : str or type, optional
        A torch optimizer instead of ``updater``: ``"torch.optim:AdamW"``
        or any ``torch.optim.Optimizer`` subclass
        (:class:`~sparkavg.torch.optim.TorchOptimizer`).
    optimizer_kwargs : dict, optional
        Its JSON keyword arguments, ``lr`` included.
    param_groups : list of dict, optional
        ``[{"params": regex or names, **options}]``: groups of parameters
        with their own options (no weight decay on biases, a lower rate for
        a backbone); a parameter joins the first group whose regular
        expression it contains (``re.search`` on its name).
    scheduler : str or type, optional
        ``"torch.optim.lr_scheduler:StepLR"`` or any ``LRScheduler``
        subclass, stepping ``optimizer``.
    scheduler_kwargs : dict, optional
        Its JSON keyword arguments.
    scheduler_interval : {"epoch", "iteration"}, default "epoch"
        Whether the scheduler steps after each epoch or each iteration (the
        model's counters: the same rate on every worker and after a resume).
    inputs : dict of str -> sequence of int, optional
        Several named inputs instead of ``input_shape``, in the order the
        module's ``forward`` takes them (its configuration lists
        ``[name, shape]`` pairs, which keep that order).
    input_dtypes : dict of str -> str, optional
        ``"int64"`` for an input of ids (``nn.Embedding``); ``"float32"`` otherwise.
    prediction : str or int, optional
        Which of the module's outputs gives predictions when it returns a
        dict (its key) or a tuple (its index).
    training_step : str or callable, optional
        ``fn(module, batch) -> loss``, ``batch`` being ``(inputs, targets)``
        (a tensor or a dict of tensors by input name; targets as ``targets``
        says), returning the batch's mean loss as a 0-d tensor: the step
        instead of ``loss`` (auxiliary losses, custom targets).  Mark it
        ``@sparkavg.torch.training_step`` for files naming it to load.
    init_weights : str, os.PathLike or mapping, optional
        Pretrained weights: a ``state_dict`` file (read with
        ``torch.load(..., weights_only=True)``), an ``.npz`` of arrays by
        the same names, or a mapping; read once, here, into the flat
        vectors (:mod:`sparkavg.torch.weights`).
    init_strict : bool, default True
        Whether every entry of the module's ``state_dict`` must be in
        ``init_weights``; False keeps the factory's values for those it lacks.
    frozen_sha256 : str, optional
        Written by :meth:`config_arguments`: the digest of the frozen
        parameters a model rebuilt from the configuration is to receive.

    Notes
    -----
    The predictions output must be ``(batch, units)``; ``units`` is found
    by one forward pass of a zero batch at construction.  Dropout inside
    the module draws from torch's global generator.
    """

    def __init__(self, factory: Annotated[Any, Names("factory")],
                 loss: Annotated[Any, Names("loss", plain=LOSSES)] = "cross_entropy", updater: Updater | None = None,
                 input_shape: Sequence[int] = (), factory_kwargs: dict | None = None,
                 targets: str = "classes", l2: float = 0.0, l2_bias: float = 0.0, weight_decay: float = 0.0,
                 seed: int = 123, dtype: str = "float32", gradient_normalization: GradientNormalization | None = None,
                 class_weights: Sequence[float] | None = None, huber_delta: float = 1.0, *,
                 optimizer: Annotated[Any, TorchCode("optimizer")] = None, optimizer_kwargs: dict | None = None,
                 param_groups: Sequence[dict] | None = None, scheduler: Annotated[Any, TorchCode("scheduler")] = None,
                 scheduler_kwargs: dict | None = None, scheduler_interval: str = "epoch",
                 inputs: dict[str, Sequence[int]] | Sequence[tuple[str, Sequence[int]]] | None = None, input_dtypes: dict[str, str] | None = None,
                 prediction: str | int | None = None,
                 training_step: Annotated[Any, Names("training_step")] = None,
                 init_weights: Annotated[Any, _InCodeOnly()] = None, init_strict: bool = True,
                 frozen_sha256: str | None = None):
        torch = _torch()
        updater = self._updater(updater, optimizer, optimizer_kwargs, param_groups, scheduler, scheduler_kwargs,
                                scheduler_interval)
        plan = Plan({"factory": factory, "factory_kwargs": factory_kwargs, "input_shape": input_shape,
                      "inputs": inputs, "input_dtypes": input_dtypes, "seed": seed, "dtype": dtype})
        self._factory_arg = factory
        self.factory_ref, self.factory_kwargs = plan.factory_ref, plan.kwargs
        self.inputs, self.input_dtypes = plan.inputs, plan.input_dtypes
        self._named_inputs = inputs is not None
        self.module = plan.module
        if init_weights is not None:
            where = repr(str(init_weights)) if not isinstance(init_weights, Mapping) else "(a mapping)"
            load_into(self.module, read_state_dict(init_weights), bool(init_strict), where)
        self._step_ref, self._step_fn = (None, None) if training_step is None else \
            callable_or_reference(training_step, "training_step", "training step")
        self._step_arg = training_step
        if training_step is not None and loss != "cross_entropy":
            raise ValueError(f"Expect a loss or a training_step, got both ({loss!r} and {training_step!r:.100}): the "
                             f"training step computes the loss")
        self._loss_ref, self._loss_fn, self.loss_kind = loss_choice(loss if training_step is None else None, targets)
        self._loss_arg, self.targets = loss, targets
        self.huber_delta = check_huber_delta(huber_delta)
        if class_weights is not None and (self._loss_fn is not None or training_step is not None):
            raise ValueError("Expect class_weights only with a built-in loss ('cross_entropy' or 'bce'): a custom "
                             "loss weighs its own classes")
        self.prediction = check_prediction(prediction)
        flat = FlatState(plan.segments, plan.buffer_segments, updater=updater, l2=l2, l2_bias=l2_bias,
                         weight_decay=weight_decay, seed=seed, dtype=plan.dtype,
                         gradient_normalization=gradient_normalization)
        self._torch_params = [p for _, p in plan.params]
        self._torch_buffers = [(self._owner(n), n.rpartition(".")[2], b.dtype) for n, b in plan.buffers]
        self._frozen_params = [p for _, p in plan.frozen]
        self._frozen = [(seg.start, seg.stop) for seg in flat.buffer_segments[len(plan.buffers):]]
        with torch.no_grad():
            for seg, p in zip(flat.param_segments, self._torch_params):
                flat.params[seg.start:seg.stop] = p.detach().reshape(-1).cpu().numpy()
            for seg, (_, b) in zip(flat.buffer_segments, plan.buffers + plan.frozen):
                flat.buffers[seg.start:seg.stop] = b.detach().reshape(-1).cpu().to(torch.float64).numpy()
        self._training = None
        self._compose(flat)
        # the frozen values this model is to receive (built from a configuration that pins others)
        self._awaited = frozen_sha256 if frozen_sha256 != self._frozen_digest() else None
        self.units = self._dry_run()
        self.class_weights = check_class_weights(self.loss_kind, class_weights, self.units)

    # ------------------------------------------------------------ building
    @staticmethod
    def _updater(updater, optimizer, optimizer_kwargs, param_groups, scheduler, scheduler_kwargs, interval):
        """The updater: ``updater``, or a :class:`TorchOptimizer` of ``optimizer`` and its scheduler."""
        if optimizer is None:
            given = {"optimizer_kwargs": optimizer_kwargs, "param_groups": param_groups, "scheduler": scheduler,
                     "scheduler_kwargs": scheduler_kwargs}
            stray = [k for k, v in given.items() if v is not None]
            if stray:
                raise ValueError(f"Expect {stray} only with a torch optimizer (optimizer='torch.optim:...'); a "
                                 f"sparkavg updater takes a schedule as its lr (sparkavg.nn.schedules)")
            return updater
        if updater is not None:
            raise ValueError(f"Expect an updater or a torch optimizer, got both ({updater!r} and {optimizer!r})")
        kwargs = dict(optimizer_kwargs or {})
        return TorchOptimizer(optimizer=optimizer, lr=kwargs.pop("lr", None), kwargs=kwargs,
                              param_groups=tuple(param_groups or ()), scheduler=scheduler,
                              scheduler_kwargs=dict(scheduler_kwargs or {}), scheduler_interval=interval)

    def _owner(self, name):
        module = self.module
        for part in name.split(".")[:-1]:
            module = getattr(module, part)
        return module

    @property
    def input_shape(self) -> tuple:
        """The one input's shape (the first input's with several)."""
        return next(iter(self.inputs.values()))

    @classmethod
    def planned_sizes(cls, args: dict) -> dict:
        """The state vectors' lengths for these constructor arguments (builds
        the module on torch's meta device: no parameter is allocated)."""
        plan = Plan(args, meta=True)
        updater = check_updater(cls._updater(args.get("updater"), args.get("optimizer"), args.get("optimizer_kwargs"),
                                             args.get("param_groups"), args.get("scheduler"),
                                             args.get("scheduler_kwargs"), args.get("scheduler_interval", "epoch")))
        return {"params": plan.num_params, "updater": int(updater.state_size(plan.num_params)),
                "buffers": plan.num_buffers}

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
        count = len(self._torch_buffers)
        for seg, (owner, name, dtype) in zip(flat.buffer_segments[:count], self._torch_buffers):
            view = buffers[seg.start:seg.stop].view(seg.shape)
            if dtype == view.dtype:
                owner._buffers[name] = view
            else:  # e.g. BatchNorm's int64 num_batches_tracked: copied at step boundaries
                self._copied.append((owner, name, view))
        for seg, p in zip(flat.buffer_segments[count:], self._frozen_params):
            p.data = buffers[seg.start:seg.stop].view(seg.shape)
        self._copy_in()

    def _dry_run(self) -> int:
        """Output units, from one inference forward of a zero batch."""
        torch = _torch()
        x = {name: torch.zeros((2,) + shape, device=self._device(),
                               dtype=torch.int64 if self.input_dtypes[name] == "int64" else getattr(torch, str(self.dtype)))
             for name, shape in self.inputs.items()}
        dims = "; ".join(("" if not self._named_inputs else f"{name!r}: ") + f"(batch, {', '.join(map(str, s))})"
                         for name, s in self.inputs.items())
        with torch.no_grad():
            self._mode(False)
            try:
                raw = self._forward(x)
            except (RuntimeError, ValueError, TypeError, IndexError) as exc:
                raise ValueError(f"Expect the module to take inputs of shape {dims}: a forward pass of a zero batch "
                                 f"of 2 failed with {type(exc).__name__}: {exc}") from None
        y = self._predictions(raw)
        if not isinstance(y, torch.Tensor) or y.dim() != 2 or y.shape[0] != 2:
            shape = tuple(y.shape) if isinstance(y, torch.Tensor) else type(y).__name__
            which = "" if raw is y else f" as its predictions output {self.prediction!r}"
            raise ValueError(f"Expect the module to return a (batch, units) tensor{which} for inputs of shape {dims}, "
                             f"got {shape} for a batch of 2")
        return int(y.shape[1])

    # ------------------------------------------------------------- steps
    def _mode(self, training: bool):
        if self._training is not training:
            self.module.train(training)
            self._training = training

    def _forward(self, xt):
        """The module's raw outputs for prepared inputs (a dict by input name)."""
        return self.module(*[xt[name] for name in self.inputs])

    def _predictions(self, raw):
        """The output predictions come from (:func:`~sparkavg.torch.losses.predictions`)."""
        return predictions(raw, self.prediction)

    def _inputs(self, x):
        """A batch as ``{name: tensor (n, *shape)}`` on the model's device,
        sharing memory where it can; and the example count."""
        names = list(self.inputs)
        if isinstance(x, Mapping):
            if sorted(x) != sorted(names):
                raise ValueError(f"Expect inputs keyed by {names}, got keys {list(x)}")
            xs = dict(x)
        elif len(names) == 1:
            xs = {names[0]: x}
        elif isinstance(x, (list, tuple)) and len(x) == len(names):
            xs = dict(zip(names, x))
        else:
            raise ValueError(f"Expect inputs as a dict keyed by {names} (or a list in that order), got "
                             f"{type(x).__name__}")
        out = {name: self._input(xs[name], name) for name in names}
        counts = {name: t.shape[0] for name, t in out.items()}
        if len(set(counts.values())) != 1:
            raise ValueError(f"Expect every input with the same number of examples, got {counts}")
        return out, next(iter(counts.values()))

    def _input(self, x, name):
        shape = tuple(getattr(x, "shape", np.shape(x)))
        want = self.inputs[name]
        flat = math.prod(want)
        what = "inputs" if name == INPUT and len(self.inputs) == 1 else f"input {name!r}"
        if len(shape) < 1 or not (shape[1:] == want or shape[1:] == (flat,)):
            dims = ", ".join(str(d) for d in want)
            raise ValueError(f"Expect {what} of shape (batch, {dims})"
                             + (f" or (batch, {flat})" if len(want) > 1 else "") + f", got {shape}")
        if self.input_dtypes[name] == "int64":
            on_gpu = backend.is_gpu_array(x)
            if self.xp is np:
                a = np.asarray(backend.to_cpu(x) if on_gpu else x)
            else:
                a = x if on_gpu else backend.to_gpu(np.asarray(x))  # host -> device sync
            if a.dtype.kind not in "iu":
                raise ValueError(f"Expect integer ids for {what} (input_dtypes says int64), got dtype {a.dtype}")
            a = a.astype(np.int64, copy=False)
        else:
            a = self.flat.on_device(x)
        if self.xp is np and not a.flags.writeable:
            a = a.copy()  # torch.from_numpy warns on read-only memory
        return self._tensor(self.xp.ascontiguousarray(a.reshape((shape[0],) + want)))

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

    def _loss_of(self, raw, target: Targets):
        """Mean loss of the module's outputs against prepared targets (a 0-d
        tensor): a custom loss of everything the module returned, or a
        built-in one of the predictions (:mod:`sparkavg.torch.losses`)."""
        if self._loss_fn is not None:
            if target.weight is not None:
                raise ValueError("Expect no per-row weights with a custom loss: it returns the batch's mean loss, "
                                 "which weights cannot reach")
            return self._loss_fn(raw, target.y)
        out = self._predictions(raw)
        return builtin_loss(out, target, self.loss_kind, self._class_weights(out), self.huber_delta)

    def _batch_loss(self, xt, target: Targets):
        """The loss of a prepared batch: the training step's, or the loss of the forward pass."""
        if self._step_fn is None:
            return self._loss_of(self._forward(xt), target)
        if target.weight is not None:
            raise ValueError("Expect no per-row weights with a training_step: it returns the batch's mean loss, "
                             "which weights cannot reach")
        inputs = xt if self._named_inputs else xt[INPUT]
        loss = self._step_fn(self.module, (inputs, target.y))
        torch = _torch()
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            got = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
            raise ValueError(f"Expect the training_step {self._step_ref or self._step_arg!r} to return the batch's "
                             f"mean loss as a 0-d tensor, got {got}")
        return loss.reshape(())

    def _loss_terms(self, x, y, weights=None):
        """Forward + backward in training mode; fills the flat gradient."""
        torch = _torch()
        xt, n = self._inputs(x)
        if n == 0:
            raise ValueError("Expect a non-empty batch, got 0 examples")
        yt = self._targets(y, n, weights)
        self.flat.grads.fill(0)
        self._mode(True)
        self._copy_in()
        loss = self._batch_loss(xt, yt)
        if not loss.requires_grad:
            raise ValueError("Expect a loss that depends on the module's trainable parameters (requires_grad), "
                             "got one that does not: nothing would train")
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

    # ------------------------------------------------------------- state
    def _frozen_digest(self):
        """SHA-256 of the frozen parameters' values (None without any)."""
        if not self._frozen:
            return None
        return frozen_digest(backend.to_cpu(self.flat.buffers), self._frozen)

    def _keeps_frozen(self, incoming) -> bool:
        """Whether a load keeps this model's frozen parameters: always, once
        it holds the values its configuration pins (a merge of the workers'
        copies rounds them); a model still waiting for them takes them from
        a state that holds exactly those."""
        if self._awaited is not None and self._frozen_digest() == self._awaited:
            self._awaited = None  # arrived by another way (a model file read into the vectors)
        if self._awaited is None:
            return True
        got = frozen_digest(backend.to_cpu(incoming), self._frozen)
        if got != self._awaited:
            raise ValueError(f"Expect the frozen parameters (requires_grad=False) this model's configuration pins "
                             f"(sha256 {self._awaited[:16]}...), got a state holding others (sha256 {got[:16]}...)")
        self._awaited = None
        return False

    def load_state(self, state) -> None:
        """As :meth:`FlatModel.load_state <sparkavg.nn.flat.FlatModel.load_state>`,
        except for the frozen parameters: a model keeps its own (their
        averaged copies differ from them by rounding), and one rebuilt from
        a configuration takes those the configuration pins."""
        buffers = state.get("buffers")
        if not self._frozen or buffers is None or not self._keeps_frozen(buffers):
            super().load_state(state)
        else:
            kept = [self.flat.buffers[start:stop].copy() for start, stop in self._frozen]
            super().load_state(state)
            for (start, stop), values in zip(self._frozen, kept):
                self.flat.buffers[start:stop] = values
        self._copy_in()

    # ----------------------------------------------------------- inference
    @property
    def spec(self) -> ModelSpec:
        """The inputs (one ``"input"`` of :attr:`input_shape`, or the named
        ``inputs``) and one output, the predictions (named by ``prediction``
        when it is a key, else ``"output"``)."""
        name = self.prediction if isinstance(self.prediction, str) else "output"
        return ModelSpec(tuple(InputSpec(n, tuple(s), self.input_dtypes[n]) for n, s in self.inputs.items()),
                         (OutputSpec(name, int(self.units), self.loss_kind),))

    def _input_chunks(self, prepared):
        """``(start, inputs)`` of prepared ``(inputs, count)`` in chunks of :attr:`inference_batch_size`."""
        xt, n = prepared
        step = max(1, int(self.inference_batch_size))
        for start in range(0, n, step):
            yield start, {k: v[start:start + step] for k, v in xt.items()}

    def _chunks(self, x, prepared=None):
        """``(start, the module's outputs)`` over ``x`` (or its ``prepared``
        ``(inputs, count)``) in inference mode and chunks."""
        torch = _torch()
        prepared = prepared or self._inputs(x)
        self._mode(False)
        with torch.no_grad():
            for start, chunk in self._input_chunks(prepared):
                yield start, self._forward(chunk)

    def _array(self, tensor):
        """A tensor as a new array of the model's module (numpy or CuPy)."""
        if self.xp is np:
            return tensor.numpy().copy()
        return backend.cupy().from_dlpack(tensor).copy()

    def output(self, x):
        """Inference-mode predictions, (N, units), a new array on the model's
        device: softmax probabilities when trained on classes, sigmoid ones
        on binary labels, raw outputs for regression."""
        prepared = self._inputs(x)
        result = self.xp.empty((prepared[1], self.units), dtype=self.dtype)
        for start, raw in self._chunks(x, prepared):
            out = self._predictions(raw)
            if self.loss_kind == "nll":
                out = _torch().softmax(out, dim=1)
            elif self.loss_kind == "bce":
                out = _torch().sigmoid(out)
            result[start:start + out.shape[0]] = self._array(out)
        return result

    def score(self, x, y) -> float:
        """Mean loss over all of ``x`` (inference mode, chunked; a training
        step's loss where there is one) + L2 penalty."""
        prepared = self._inputs(x)
        n = prepared[1]
        if n == 0:
            raise ValueError("Expect a non-empty batch, got 0 examples")
        target = self._targets(y, n)
        total = 0.0
        if self._step_fn is not None:
            self._mode(False)
            with _torch().no_grad():
                for start, chunk in self._input_chunks(prepared):
                    rows = next(iter(chunk.values())).shape[0]
                    total += float(self._batch_loss(chunk, target.rows(start, start + rows))) * rows
        else:
            for start, raw in self._chunks(x, prepared):
                rows = min(int(self.inference_batch_size), n - start)
                total += float(self._loss_of(raw, target.rows(start, start + rows))) * rows
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
        """The constructor arguments that rebuild this model, by name (the
        pretrained weights are state, not configuration: the digest of the
        frozen parameters is kept instead).

        Raises
        ------
        ConfigError
            The factory, loss or training step is a callable that cannot be
            imported by name: such a model cannot be saved, checkpointed or
            shipped.
        """
        named = [(self.factory_ref, self._factory_arg, "factory")]
        named.append((self._loss_ref, self._loss_arg, "loss") if self._step_arg is None else
                     (self._step_ref, self._step_arg, "training_step"))
        for ref, value, what in named:
            if ref is None:
                raise ConfigError(
                    f"Expect a TorchModel {what} importable by name to save, checkpoint or ship the model "
                    f"to Spark executors, got the callable {getattr(value, '__qualname__', value)!r} of "
                    f"module {getattr(value, '__module__', None)!r}: define it at module level in an "
                    f"importable module (not __main__ or a notebook) and pass 'package.module:function'")
        args = {"factory": self.factory_ref, "factory_kwargs": self.factory_kwargs, "loss": self._loss_ref,
                "updater": self.updater}
        if self._named_inputs:
            args["inputs"] = [[name, list(shape)] for name, shape in self.inputs.items()]  # in forward's order
        else:
            args["input_shape"] = list(self.input_shape)
        if any(d != "float32" for d in self.input_dtypes.values()):
            args["input_dtypes"] = dict(self.input_dtypes)
        if self._step_arg is not None:
            args["training_step"] = self._step_ref
            args["loss"] = "cross_entropy"
        if self._loss_fn is not None or self._step_arg is not None:
            args["targets"] = self.targets
        if self.prediction is not None:
            args["prediction"] = self.prediction
        if self.class_weights is not None:
            args["class_weights"] = list(self.class_weights)
        if self.loss_kind == "huber":
            args["huber_delta"] = self.huber_delta
        if self._frozen:
            args["frozen_sha256"] = self._frozen_digest()
        args.update({k: v for k, v in self.flat.arguments().items() if k != "updater"})
        return args

    def clone(self):
        """An independent copy (a fresh module from the same factory, the same
        state, frozen parameters included, and counters), also for a model
        of a plain callable."""
        shapes = {"inputs": dict(self.inputs)} if self._named_inputs else {"input_shape": self.input_shape}
        other = TorchModel(self._factory_arg, self._loss_arg, self.updater, factory_kwargs=self.factory_kwargs,
                           targets=self.targets, l2=self.l2, l2_bias=self.l2_bias, weight_decay=self.weight_decay,
                           seed=self.seed, dtype=str(self.dtype), gradient_normalization=self.gradient_normalization,
                           class_weights=self.class_weights, huber_delta=self.huber_delta,
                           input_dtypes=dict(self.input_dtypes), prediction=self.prediction,
                           training_step=self._step_arg, **shapes)
        if self.xp is not np:
            other.to_gpu()
        other.flat.load(self.state)  # frozen parameters too: the same model
        other._copy_in()
        self._copy_counters(other)
        return other

    def summary(self) -> str:
        """The module's own text, its parameter and buffer counts and the training setup."""
        frozen = sum(stop - start for start, stop in self._frozen)
        return (f"{self.module}\ntotal params: {self.num_params:,} ({self.dtype}); buffers: "
                f"{self.buffers.size - frozen:,}; frozen params: {frozen:,}; outputs: {self.units} "
                f"({self.loss_kind}); updater: {self.updater!r}; {self.flat.describe()}")

    def __repr__(self):
        name = self.factory_ref or getattr(self._factory_arg, "__qualname__", "?")
        shape = dict(self.inputs) if self._named_inputs else self.input_shape
        return (f"TorchModel(factory={name!r}, {'inputs' if self._named_inputs else 'input_shape'}={shape}, "
                f"units={self.units}, num_params={self.num_params}, updater={self.updater!r})")
