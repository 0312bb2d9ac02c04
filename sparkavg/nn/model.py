"""The model contract: what the masters, checkpoints, the ml front, Spark
Connect and inference may know of a model.

Nothing outside :mod:`sparkavg.nn` (and :mod:`sparkavg.torch`) reads a
model's layers or names its class: they see a :class:`Model`.  Its state is
a named mapping of flat vectors (torch's ``state_dict`` with FSDP's flat
parameters; non-trainable state apart, as ``register_buffer``):

``params``
    the trainable parameters, one flat vector; averaged, threshold-encoded,
    L2-penalised where the model says so;
``updater``
    the updater's state (Adam's m and v, momentum), one flat vector laid
    out over ``params``; averaged by parameter averaging;
``buffers``
    non-trainable state (BatchNorm's running statistics); averaged like
    parameters (example-weighted), by gradient sharing at every epoch end;
    never given a gradient, L2, weight decay or threshold encoding.

Implementations: :class:`~sparkavg.nn.network.Network` (a sequential
stack), :class:`~sparkavg.nn.graph.Graph` (named inputs and vertices) and
``sparkavg.torch.TorchModel`` (a user's torch module).

Model configurations are registered under the kind ``"network"`` of
:mod:`sparkavg.configurable`: the loaders of :mod:`sparkavg.nn.loading`
(``model_from_json``, ``load_model``) rebuild whichever model a
configuration or file names.  This module imports nothing of sparkavg:
everything that knows a model only by this contract can import it.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Mapping, Protocol, Sequence, Tuple, runtime_checkable

__all__ = [
    "STATE_VECTORS",
    "InputSpec",
    "OutputSpec",
    "ModelSpec",
    "Model",
    "config_fingerprint",
    "one_input",
]

#: The names of a model's flat state vectors, in the order they travel.
STATE_VECTORS = ("params", "updater", "buffers")

#: Losses an output may carry (:mod:`sparkavg.nn.losses`): negative
#: log-likelihood of a softmax, binary cross-entropy of a sigmoid, and the
#: regression losses.
LOSS_KINDS = ("nll", "bce", "mse", "mae", "huber")

#: What each loss trains on: class indices or one-hot rows (``classes``),
#: independent 0/1 labels (``binary``), or real values (``values``).
TARGETS = {"nll": "classes", "bce": "binary", "mse": "values", "mae": "values", "huber": "values"}


@dataclass(frozen=True)
class InputSpec:
    """One named input of a model.

    Parameters
    ----------
    name : str
    shape : tuple of int
        One example's shape without the batch axis, in the user's convention
        ((C, H, W) for images, (features,), (T, F) for sequences).
    dtype : str
        ``"float32"`` for features (any float array is cast); integer ids
        say ``"int64"``.
    """

    name: str
    shape: Tuple[int, ...]
    dtype: str = "float32"

    @property
    def size(self) -> int:
        n = 1
        for d in self.shape:
            n *= int(d)
        return n


class Targeted:
    """What a ``loss`` field says of the labels (an output's, a data spec's)."""

    loss: str

    @property
    def target(self) -> str:
        """``"classes"``, ``"binary"`` or ``"values"`` (:data:`TARGETS`)."""
        return TARGETS[self.loss]

    @property
    def classification(self) -> bool:
        """Whether labels are class indices (or one-hot rows): softmax outputs."""
        return self.target == "classes"


@dataclass(frozen=True)
class OutputSpec(Targeted):
    """One named output of a model and its loss.

    Parameters
    ----------
    name : str
    units : int
        Classes (``loss="nll"``), independent binary labels (``"bce"``) or
        regression targets (``"mse"``, ``"mae"``, ``"huber"``).
    loss : {"nll", "bce", "mse", "mae", "huber"}
    weight : float
        This output's weight in the summed loss of a several-output model.
    """

    name: str
    units: int
    loss: str = "nll"
    weight: float = 1.0


@dataclass(frozen=True)
class ModelSpec:
    """What a model expects of its data: named inputs and outputs (plain
    values: it ships to executors)."""

    inputs: Tuple[InputSpec, ...]
    outputs: Tuple[OutputSpec, ...]

    def single_input(self) -> InputSpec:
        """The one input, or a ValueError naming how many there are."""
        if len(self.inputs) != 1:
            raise ValueError(f"Expect a model with one input here, got {len(self.inputs)} "
                             f"({', '.join(i.name for i in self.inputs)}); several inputs are trained from "
                             f"arrays keyed by input name")
        return self.inputs[0]

    def single_output(self) -> OutputSpec:
        """The one output, or a ValueError naming how many there are."""
        if len(self.outputs) != 1:
            raise ValueError(f"Expect a model with one output here, got {len(self.outputs)} "
                             f"({', '.join(o.name for o in self.outputs)})")
        return self.outputs[0]


@runtime_checkable
class Model(Protocol):
    """The one contract every model implements (structural: no base class).

    A batch's features ``x`` are a mapping of arrays by input name (how
    sparkavg holds them, one input's too); a one-input model also takes its
    bare array (:func:`one_input`).

    Attributes
    ----------
    iteration : int
        Completed updater steps.
    epoch : int
        Completed epochs (the trainer advances it).
    updater : sparkavg.nn.updaters.Updater
        The updater (a frozen dataclass; the trainer may replace it with a
        lower learning rate when it recovers from divergence).
    """

    iteration: int
    epoch: int
    updater: Any

    @property
    def spec(self) -> ModelSpec:
        """Named inputs and outputs (shapes, losses)."""

    @property
    def state(self) -> Mapping[str, Any]:
        """The LIVE flat vectors by name (:data:`STATE_VECTORS`), on the
        model's device; each is 1-D of the model's dtype (``buffers`` may be
        empty)."""

    def load_state(self, state: Mapping[str, Any]) -> None:
        """Copy the given named vectors in (any subset of
        :data:`STATE_VECTORS`; host or device arrays; shapes must match)."""

    @property
    def num_params(self) -> int:
        """Length of ``state["params"]``."""

    @property
    def param_segments(self) -> Sequence[Any]:
        """The parameter tensors as ranges of ``state["params"]`` (objects with
        ``name``, ``start``, ``stop``); strategies that pool per tensor (the
        moment correction) use them."""

    @property
    def xp(self):
        """numpy or cupy: where the state lives."""

    def fit_batch(self, x, y, *, weights=None, sync: bool = True):
        """One training step; the batch loss (a float, or with ``sync=False``
        on a GPU a 0-d device array).  ``weights``: one per example, scaling
        its loss (the mean keeps the example count as its divisor), or None."""

    def compute_update(self, x, y, out, *, weights=None, sync: bool = True):
        """Fill flat ``out`` with what :meth:`fit_batch` would add to the
        parameters, advancing the updater and buffers; return the loss."""

    def apply_update(self, update) -> None:
        """``params += update``."""

    def output(self, x):
        """Inference-mode outputs for a batch (the first output's array for
        a several-output model; see its own docs)."""

    def score(self, x, y) -> float:
        """Mean loss over a batch in inference mode."""

    def fingerprint(self) -> str:
        """A digest of what fixes the layout of the state vectors (a
        checkpoint of another architecture is refused by it)."""

    def to_config(self) -> dict:
        """The configuration that rebuilds a freshly initialised model."""

    def to_json(self) -> str:
        """:meth:`to_config` as JSON text."""

    def clone(self) -> "Model":
        """An independent copy: configuration, state and counters."""

    def save(self, path) -> None:
        """A model file (npz + JSON; never pickle)."""

    def to_gpu(self) -> "Model":
        """Move the state to the current CUDA device; returns self."""

    def to_cpu(self) -> "Model":
        """Move the state to host memory; returns self."""


def one_input(x, name: str):
    """A one-input model's batch as its array: ``x`` itself, or ``x[name]``
    of a mapping by input name (how sparkavg holds features)."""
    if not isinstance(x, Mapping):
        return x
    if list(x) != [name]:
        raise ValueError(f"Expect the features keyed by the model's input [{name!r}], got keys {list(x)}")
    return x[name]


def config_fingerprint(config: Mapping, drop=("updater", "l2", "l2_bias", "weight_decay", "seed", "dtype",
                                             "gradient_normalization")) -> str:
    """The first 16 hex digits of the SHA-256 of a model configuration
    without the keys that do not change the state layout (updater
    hyper-parameters, penalties, gradient normalisation, seed)."""
    keep = {k: v for k, v in config.items() if k not in drop}
    return hashlib.sha256(json.dumps(keep, sort_keys=True, default=list).encode()).hexdigest()[:16]
