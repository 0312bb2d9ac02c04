"""The model contract over a composed :class:`~sparkavg.nn.flatstate.FlatState`:
what every sparkavg model (:class:`~sparkavg.nn.network.Network`,
:class:`~sparkavg.nn.graph.Graph`, ``sparkavg.torch.TorchModel``) shares.

A model HOLDS its flat state (``model.flat``: the params/grads/updater/
buffers vectors, their segments, the device and the updater step) and is
its provider (:class:`~sparkavg.nn.flatstate.FlatProvider`): it binds its
own arrays to the vectors and computes a minibatch's loss and gradient.
:class:`FlatModel` implements :class:`~sparkavg.nn.model.Model` on top:
the state vectors, training steps, devices, configuration and model files,
each delegated to ``model.flat`` or written once here.  A model says only:

- :meth:`FlatModel._bind_flat` and :meth:`FlatModel._loss_terms` -- the
  provider hooks (``_step_work``, ``_has_lazy_rows``, ``_touched_rows`` as needed);
- :attr:`FlatModel.spec`, :meth:`output`, :meth:`score`,
  :meth:`config_arguments`, :meth:`planned_sizes`.

:class:`LayerModel` is the provider for models built of sparkavg layers
(their layout, initial values, views, lazy tables and step cost): a
``Network`` or a ``Graph`` adds how its layers are wired
(:meth:`LayerModel._structure`, :meth:`_loss_terms`).
"""
from __future__ import annotations

import json

import numpy as np

from ..configurable import ConfigError, Configurable, from_config
from ..references import trusting
from .finetune import FineTuning
from .flatstate import DTYPES, FlatState, Segment, blocks, segments_of
from .layers import Dropout
from .losses import predicted
from .model import config_fingerprint
from .serialization import load_network, save_network
from .upgrades import upgrade_config

__all__ = ["FlatModel", "LayerModel", "Segment", "DTYPES"]


class _OnFlat:
    """A model attribute kept by its :class:`~sparkavg.nn.flatstate.FlatState`
    (read and assigned through the model: ``net.updater = ...``)."""

    def __init__(self, doc: str):
        self.__doc__ = doc

    def __set_name__(self, owner, name):
        self.name = name

    def __get__(self, model, owner=None):
        return self if model is None else getattr(model.flat, self.name)

    def __set__(self, model, value):
        setattr(model.flat, self.name, value)


class FlatModel(Configurable):
    """The model contract over a composed flat state (see the module doc).

    Attributes
    ----------
    flat : FlatState
        The model's flat vectors and training step.
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

    iteration = _OnFlat("Completed updater steps.")
    epoch = _OnFlat("Completed epochs.")
    updater = _OnFlat("The updater (the trainer may replace it, e.g. at a lower rate).")
    l2 = _OnFlat("L2 coefficient of the weights.")
    l2_bias = _OnFlat("L2 coefficient of the biases.")
    weight_decay = _OnFlat("Decoupled weight decay of the weights.")
    gradient_normalization = _OnFlat("What a training step does to the loss gradient (or None).")
    seed = _OnFlat("The seed of initial values (and dropout).")
    dtype = _OnFlat("The numpy dtype of every vector and activation.")

    # ------------------------------------------------- the provider's hooks
    def _bind_flat(self, flat: FlatState) -> None:
        """Point this model's own arrays at views of ``flat``'s vectors
        (:class:`~sparkavg.nn.flatstate.FlatProvider`)."""
        raise NotImplementedError

    def _loss_terms(self, x, y, weights=None) -> list:
        """Forward + backward of one minibatch in training mode into
        ``flat.grads``; the ``(weight, total, count)`` loss terms
        (:class:`~sparkavg.nn.flatstate.FlatProvider`)."""
        raise NotImplementedError

    def _step_work(self) -> tuple:
        """(OpenMP, BLAS) multiply-adds of a step: none counted by default."""
        return 0, 0

    def _has_lazy_rows(self) -> bool:
        return False

    def _touched_rows(self) -> list:
        return []

    def _range_scales(self) -> list:
        return []

    @property
    def frozen_ranges(self) -> list:
        """``(start, stop)`` ranges of the parameters no step updates (frozen
        layers): averaging keeps them as they were."""
        return [(a, b) for a, b, s in self._range_scales() if s == 0]

    def _compose(self, flat: FlatState) -> None:
        """Hold ``flat`` (its initial values in) and bind to it."""
        self.flat = flat
        self.inference_batch_size = 256
        self._bind_flat(flat)

    @classmethod
    def planned_sizes(cls, args: dict) -> dict:
        """The length of each state vector (:data:`~sparkavg.nn.model.STATE_VECTORS`)
        of the model these constructor arguments would build, computed
        without allocating any array (model files are checked against it
        before anything is read).  Raises ValueError as the constructor."""
        raise NotImplementedError

    def step_threads(self):
        """The thread pools of a training step (:meth:`FlatState.step_threads
        <sparkavg.nn.flatstate.FlatState.step_threads>`)."""
        return self.flat.step_threads(self)

    # ------------------------------------------------------------ training
    def gradient(self, x, y, weights=None):
        """Loss and gradient of one batch, without updating anything (nor
        normalising the gradient: :attr:`gradient_normalization` acts in
        training steps only); ``weights``: one per example, or None.

        Returns
        -------
        (float, array)
            Mean loss (+ L2 penalty) and a COPY of the flat gradient
            (``num_params``,), L2 included, on the model's device.
        """
        return self.flat.gradient(self, x, y, weights)

    def compute_update(self, x, y, out, *, weights=None, sync: bool = True):
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
        return self.flat.compute_update(self, x, y, out, weights=weights, sync=sync)

    def apply_update(self, update) -> None:
        """``params += update`` in place (``update`` flat, same dtype and device)."""
        self.flat.apply_update(update)

    def fit_batch(self, x, y, *, weights=None, sync: bool = True):
        """One training step (forward, backward, updater); returns the batch loss.

        ``weights``, one finite weight >= 0 per example (or None), scale
        each example's loss; the mean keeps its divisor, the example count
        (:mod:`sparkavg.nn.losses`).

        Exactly ``compute_update`` into a buffer followed by ``apply_update``;
        without weight decay the updater adds to the parameters directly (same
        sums, bit-identical on the CPU; no buffer to zero, one pass fewer).

        ``sync=False`` returns the loss as a 0-d array on the model's
        device instead of a float: on a GPU the step then ends without
        waiting for the device (the caller reads the loss when it needs it).
        """
        return self.flat.fit_batch(self, x, y, weights=weights, sync=sync)

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

    def fit(self, x, y, batch_size=64, epochs=1, shuffle=True, weights=None) -> list:
        """Minibatch training on in-memory arrays (a convenience for local
        runs); advances :attr:`epoch`.  Returns the mean loss of each epoch.
        ``weights``: one per example, or None (see :meth:`fit_batch`)."""
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
                w = None if weights is None else np.asarray(weights)[idx]
                total += self.fit_batch(self._take(x, idx), self._take(y, idx), weights=w) * len(idx)
            self.epoch += 1
            losses.append(total / n)
        return losses

    def predict(self, x):
        """The prediction per example, (N,) (numpy on CPU): the arg-max
        class, a binary output's 0/1 at the 0.5 threshold, a regression
        output's first value (:func:`sparkavg.nn.losses.predicted`)."""
        return predicted(self.spec.outputs[0].target, self.output(x))

    # ----------------------------------------------------------- state
    @property
    def num_params(self) -> int:
        """Length of the flat parameter vector."""
        return self.flat.num_params

    @property
    def params(self):
        """The LIVE flat parameter vector (``num_params``,); every layer's
        weights are views into it.  Assigning copies in (shape and dtype must
        match)."""
        return self.flat.params

    @params.setter
    def params(self, value):
        self.flat.assign("params", value)

    @property
    def updater_state(self):
        """The LIVE flat updater state (``updater.state_size(num_params)``,);
        assigning copies in (shape and dtype must match)."""
        return self.flat.updater_state

    @updater_state.setter
    def updater_state(self, value):
        self.flat.assign("updater_state", value)

    @property
    def buffers(self):
        """The LIVE flat buffer vector (non-trainable state such as
        BatchNorm's running statistics; empty when no layer has any);
        assigning copies in."""
        return self.flat.buffers

    @buffers.setter
    def buffers(self, value):
        self.flat.assign("buffers", value)

    @property
    def state(self) -> dict:
        """The live flat vectors by name: ``{"params", "updater", "buffers"}``."""
        return self.flat.vectors

    def load_state(self, state) -> None:
        """Copy the given named vectors in (any of ``params``, ``updater``,
        ``buffers``; host or device arrays are moved to the model's device;
        shapes must match).  ``None`` values are skipped."""
        self.flat.load(state)

    @property
    def param_segments(self) -> list:
        """(layer index, name, start, stop, shape, regularized) per parameter."""
        return list(self.flat.param_segments)

    @property
    def buffer_segments(self) -> list:
        """(layer index, name, start, stop, shape, False) per buffer."""
        return list(self.flat.buffer_segments)

    @property
    def xp(self):
        """The array module of this model's arrays (numpy or cupy)."""
        return self.flat.xp

    # ---------------------------------------------------------- devices
    def to_gpu(self):
        """Move parameters, gradients, state and buffers to the current CUDA
        device (host -> device copies); returns self."""
        if self.flat.to_gpu():
            self._bind_flat(self.flat)
        return self

    def to_cpu(self):
        """Move everything back to host memory; returns self."""
        if self.flat.to_cpu():
            self._bind_flat(self.flat)
        return self

    # ---------------------------------------------------------- config
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
        if self.flat.xp is not np:
            other.to_gpu()
        other.flat.params[...] = self.flat.params
        other.flat.updater_state[...] = self.flat.updater_state
        other.flat.buffers[...] = self.flat.buffers
        self._copy_counters(other)
        return other

    def _copy_counters(self, other) -> None:
        """The counters and the inference chunk size, onto a clone."""
        other.iteration, other.epoch = self.iteration, self.epoch
        other.inference_batch_size = self.inference_batch_size

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

    def export_onnx(self, path, *, encoding: dict | None = None) -> None:
        """Write this model's inference graph to ``path`` as an ONNX file
        (``pip install 'sparkavg[onnx]'``): inputs named as :attr:`spec`'s,
        with a dynamic batch axis, and one output per model output, as
        :meth:`output` computes it (see :mod:`sparkavg.export`).

        Parameters
        ----------
        path : str or os.PathLike
        encoding : dict, optional
            A fit's input encoding, ``{"scale": s, "normalize": [mean, std]}``
            (:func:`sparkavg.data.transforms.input_encoding`), applied to the
            float inputs first: the graph then takes what the MLflow pyfunc takes.

        Raises
        ------
        sparkavg.export.ExportError
            A layer or configuration ONNX cannot express (the message names it).
        """
        raise NotImplementedError(f"Expect a model type that exports to ONNX, got {type(self).__name__}")

    def __deepcopy__(self, memo):
        return self.clone()

    def __copy__(self):
        return self.clone()


def _pieces(specs) -> list:
    """One layer's parameter or buffer specs as :func:`~sparkavg.nn.flatstate.segments_of` takes them."""
    return [(s.name, s.shape, s.regularized) for s in specs]


class LayerModel(FlatModel):
    """A model built of sparkavg layers (in a fixed order) over its flat
    state: the provider hooks for :attr:`layers`, whose weights, gradients
    and buffers are views into the flat vectors.  A subclass says how they
    are wired: :meth:`_structure` and :meth:`_loss_terms`."""

    @classmethod
    def _structure(cls, args: dict) -> tuple:
        """``(layers, updater)`` of the model the constructor arguments
        ``args`` describe: validated, layers built (fresh copies), in flat
        order; nothing allocated.  Raises ValueError naming what is wrong."""
        raise NotImplementedError

    def _init_layers(self, layers, updater, l2, l2_bias, weight_decay, seed, dtype, gradient_normalization=None,
                     fine_tuning=None):
        """Lay out, allocate and initialise the flat state over built ``layers``."""
        self.layers = list(layers)
        self._fine_tuning, self._scales = None, []
        param_segments, _ = segments_of(_pieces(layer.param_specs()) for layer in self.layers)
        buffer_segments, _ = segments_of(_pieces(layer.buffer_specs()) for layer in self.layers)
        flat = FlatState(param_segments, buffer_segments, updater=updater, l2=l2, l2_bias=l2_bias,
                         weight_decay=weight_decay, seed=seed, dtype=dtype,
                         gradient_normalization=gradient_normalization)
        rng = np.random.default_rng(flat.seed)
        for seg in flat.param_segments:
            layer = self.layers[seg.layer]
            spec = next(s for s in layer.param_specs() if s.name == seg.name)
            flat.params[seg.start:seg.stop] = layer.initial_value(spec, rng).ravel()
        for seg in flat.buffer_segments:
            layer = self.layers[seg.layer]
            spec = next(s for s in layer.buffer_specs() if s.name == seg.name)
            flat.buffers[seg.start:seg.stop] = layer.initial_buffer(spec).ravel()
        self._compose(flat)
        self.fine_tuning = fine_tuning

    def layer_names(self) -> list:
        """Each layer's name, in :attr:`layers` order (what
        :class:`~sparkavg.nn.finetune.FineTuning` and
        :func:`~sparkavg.nn.finetune.transfer` name)."""
        return [str(i) for i in range(len(self.layers))]

    @property
    def fine_tuning(self):
        """Frozen layers and learning-rate multipliers
        (:class:`~sparkavg.nn.finetune.FineTuning`), or None."""
        return self._fine_tuning

    @fine_tuning.setter
    def fine_tuning(self, value):
        if value is not None and not isinstance(value, FineTuning):
            raise ValueError(f"Expect fine_tuning as a FineTuning (sparkavg.nn.finetune) or None, got "
                             f"{type(value).__name__}")
        scales = [] if value is None else value.scales(
            self.layer_names(), blocks(self.flat.param_segments, len(self.layers)))
        if scales and any(s == 0 for _, _, s in scales):
            self.flat._state_ranges([(0, 0)])  # an updater whose state is not per parameter is refused here
        self._fine_tuning, self._scales = value, scales

    def _range_scales(self) -> list:
        return self._scales

    def _training_options(self) -> dict:
        """The flat state's constructor arguments and the fine-tuning, for configs."""
        args = self.flat.arguments()
        if self._fine_tuning is not None:
            args["fine_tuning"] = self._fine_tuning
        return args

    def _wiring(self) -> tuple:
        """The model as a graph: ``(inputs, vertices, outputs)`` -- ``{name:
        example shape}``, ``(name, layer or combining vertex, [input names])``
        in topological order, and the output vertices' names (the names of
        :attr:`spec`'s outputs)."""
        raise NotImplementedError

    def export_onnx(self, path, *, encoding: dict | None = None) -> None:
        from ..export.onnx import export_layer_model

        export_layer_model(self, path, encoding)

    @classmethod
    def planned_sizes(cls, args: dict) -> dict:
        layers, updater = cls._structure(args)
        _, num_params = segments_of(_pieces(layer.param_specs()) for layer in layers)
        _, num_buffers = segments_of(_pieces(layer.buffer_specs()) for layer in layers)
        return {"params": num_params, "updater": int(updater.state_size(num_params)), "buffers": num_buffers}

    def _bind_flat(self, flat: FlatState) -> None:
        """Hand every layer its views into the flat vectors (after any move)."""
        count = len(self.layers)
        for i, ((start, stop), (bstart, bstop)) in enumerate(zip(blocks(flat.param_segments, count),
                                                                 blocks(flat.buffer_segments, count))):
            layer = self.layers[i]
            layer.bind(flat.params[start:stop], flat.grads[start:stop])
            layer.bind_buffers(flat.buffers[bstart:bstop])
            if isinstance(layer, Dropout):
                layer.reseed(int(np.random.SeedSequence([flat.seed, i]).generate_state(1)[0]), flat.xp)

    def _step_work(self) -> tuple:
        """(OpenMP, BLAS) multiply-adds of a step, summed over the layers."""
        work = [layer.multiply_adds() for layer in self.layers]
        return sum(w[0] for w in work), sum(w[1] for w in work)

    def _has_lazy_rows(self) -> bool:
        return any(getattr(layer, "lazy", False) for layer in self.layers)

    def _touched_rows(self) -> list:
        """``(segment, touched rows mask)`` of each layer whose last step
        touched only some rows of a table (an ``Embedding(lazy=True)``)."""
        tables = []
        for seg in self.flat.param_segments:
            touched = getattr(self.layers[seg.layer], "touched_rows", None)
            mask = touched(seg.name) if touched is not None else None
            if mask is not None:
                tables.append((seg, mask))
        return tables

    def _layer_param_counts(self) -> list:
        """Parameters per layer of :attr:`layers` (for summaries)."""
        counts = [0] * len(self.layers)
        for seg in self.flat.param_segments:
            counts[seg.layer] += seg.stop - seg.start
        return counts
