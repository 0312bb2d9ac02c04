"""``Embedding``: integer ids -> learned vectors (DL4J's
``EmbeddingSequenceLayer`` / ``EmbeddingLayer``, PyTorch's ``nn.Embedding``).

Ids arrive as the model's float dtype (a model casts every input batch to
it, :func:`~sparkavg.nn.network.prepare_input`); the layer converts them
back to int64 after checking that every one is integral and in
[0, vocab_size) -- float32 holds every integer up to 2**24 exactly, so
vocabularies up to 16,777,216 ids are safe in float32 models -- and an error
names the first bad id with its example and position.

The forward pass is a gather (``take`` of W's rows); the weight gradient a
scatter-add of the output gradient's rows into the rows of ``dW`` named by
the ids (:func:`sparkavg.ops.scatter_add_rows`: one pass in Cython for
numpy float32, ``add.at`` otherwise).  The ids carry no gradient: an
embedding is meant to sit on a graph input, and a layer before it gets zeros.
"""
from __future__ import annotations

import numpy as np

from ..backend import get_array_module
from ..configurable import register
from ..ops.elementwise import unchecked
from .initializers import check_weight_init, init_weights
from .layers import Layer, ParamSpec, _contiguous, _positive_int

__all__ = ["Embedding"]


@register("layer")
class Embedding(Layer):
    """Look up a ``dim``-vector for each integer id.

    Input shape (T,): T ids per example (a sequence of tokens), output
    (T, dim), ready for :class:`~sparkavg.nn.recurrent.LSTM`,
    :class:`~sparkavg.nn.conv1d.Conv1D` or a global pooling over time.
    Input shape (1,): one id per example (a categorical column of a
    table), output (dim,), ready for Dense or Merge.

    Parameters
    ----------
    vocab_size : int
        Ids are in [0, vocab_size).
    dim : int
        Length of each vector.
    padding_id : int or None, default None
        An id whose vector is all zeros, always, with a zero gradient (its
        row of W starts at zero and never receives a gradient; its outputs
        are zeroed besides, whatever that row holds).  With it, padded
        positions come out as zero vectors, which a recurrent layer with
        ``mask_value=0.0`` skips.
    weight_init : str, default 'xavier'
        As DL4J's embedding layers (whose default is XAVIER): W as a dense
        layer's weights, fan_in = vocab_size, fan_out = dim.
    lazy : bool, default False
        Update only the rows of the ids in the minibatch (TensorFlow's
        LazyAdam, PyTorch's ``SparseAdam``): the other rows get no updater
        step -- their Adam moments or momentum keep their values -- and no
        L2 or weight decay, so their update is exactly zero and gradient
        sharing sends nothing for them.  Off, an updater with momentum
        keeps moving every row an id ever touched, and the table's update
        (and its share of sharing's traffic) becomes dense.

    Notes
    -----
    Parameters in the flat vector: W (vocab_size, dim) (regularized).
    """

    def __init__(self, vocab_size: int, dim: int, padding_id: int | None = None, weight_init: str = "xavier",
                 lazy: bool = False):
        super().__init__()
        self.vocab_size = _positive_int("vocab_size", vocab_size)
        self.dim = _positive_int("dim", dim)
        if padding_id is not None and (isinstance(padding_id, bool) or not isinstance(padding_id, (int, np.integer))
                                       or not 0 <= padding_id < self.vocab_size):
            raise ValueError(f"Expect padding_id as None or an int in [0, {self.vocab_size}), got {padding_id!r}")
        self.padding_id = None if padding_id is None else int(padding_id)
        self.weight_init = check_weight_init(weight_init)
        if not isinstance(lazy, (bool, np.bool_)):
            raise ValueError(f"Expect lazy as a bool, got {lazy!r}")
        self.lazy = bool(lazy)
        self.W = self.dW = None
        self._touched = None

    def config_arguments(self):
        args = {"vocab_size": self.vocab_size, "dim": self.dim, "padding_id": self.padding_id,
                "weight_init": self.weight_init}
        if self.lazy:  # absent when off: configurations (and fingerprints) of eager tables are as before
            args["lazy"] = True
        return args

    def touched_rows(self, name: str):
        """With ``lazy``: the (vocab_size,) bool mask of the rows of W the
        last backward pass touched (the model's updater step leaves the
        others alone); None otherwise."""
        return self._touched if self.lazy and name == "W" else None

    def build(self, input_shape):
        if len(input_shape) != 1:
            raise ValueError(f"Expect a (T,) input of ids to Embedding, got shape {tuple(input_shape)}")
        self.input_shape = tuple(input_shape)
        t = input_shape[0]
        self.output_shape = (self.dim,) if t == 1 else (t, self.dim)
        return self.output_shape

    def param_specs(self):
        return [ParamSpec("W", (self.vocab_size, self.dim), True)]

    def initial_value(self, spec, rng):
        w = init_weights(self.weight_init, spec.shape, self.vocab_size, self.dim, rng)
        if self.padding_id is not None:
            w[self.padding_id] = 0.0
        return w

    def bind(self, params, grads):
        super().bind(params, grads)
        self.W = params.reshape(self.vocab_size, self.dim)
        self.dW = grads.reshape(self.vocab_size, self.dim)

    def _ids(self, x):
        """The (N*T,) int64 ids of a float batch (N, T), checked."""
        xp = get_array_module(x)
        flat = x.reshape(-1)
        ids = self._buffer("ids", flat.shape, x, dtype=np.int64)
        with np.errstate(invalid="ignore"):  # NaN / inf: caught below
            ids[...] = flat  # truncates; non-integral values are caught below
        # One host sync (on CuPy) for the check, as Output.prepare_labels does.
        bad = (ids != flat) | (ids < 0) | (ids >= self.vocab_size)
        if bool(bad.any()):
            k = int(xp.argmax(bad))
            n, t = divmod(k, self.input_shape[0])
            raise ValueError(f"Expect integer ids in [0, {self.vocab_size}) in Embedding's input, got "
                             f"{float(flat[k])!r} (example {n} of the batch, position {t})")
        return ids

    def forward(self, x, training):
        xp = get_array_module(x)
        n = x.shape[0]
        ids = self._ids(x)
        y = self._buffer("y", (ids.shape[0], self.dim), x)
        xp.take(self.W, ids, axis=0, out=y)
        if self.padding_id is not None:
            pad = ids == self.padding_id
            y *= ~pad[:, None]
        else:
            pad = None
        self._ids_seen, self._pad, self._x_shape = ids, pad, x.shape
        return y.reshape((n,) + self.output_shape)

    def backward(self, dy, need_dx):
        ids, pad = self._ids_seen, self._pad
        self.dW.fill(0)
        unchecked("scatter_add_rows", dy, ids, _contiguous(dy).reshape(ids.shape[0], self.dim), self.dW)
        if pad is not None:
            self.dW[self.padding_id] = 0
        if self.lazy:
            touched = self._buffer("touched", (self.vocab_size,), dy, dtype=bool)
            touched.fill(False)
            touched[ids] = True
            self._touched = touched
        if not need_dx:
            return None
        dx = self._buffer("dx", self._x_shape, dy)
        dx.fill(0)  # ids are not differentiable
        return dx
