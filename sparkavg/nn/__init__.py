"""The network engine: layers over one flat parameter vector, flat
updater state, array-module generic (numpy or CuPy).

Modules: :mod:`.network` (``Network``), :mod:`.layers`, :mod:`.output`
(the loss layer), :mod:`.updaters`, :mod:`.regularization` (L2 and weight
decay as fused passes over contiguous ranges of the flat vector),
:mod:`.normalization` (``BatchNorm``, ``LayerNorm``), :mod:`.reshaping`
(``Flatten``, ``Reshape``, global pooling), :mod:`.activations`, :mod:`.initializers`, :mod:`.serialization` (npz
model files); im2col and pooling kernels are in :mod:`sparkavg.ops.conv`,
:mod:`.zoo` (``lenet``).
"""
from . import zoo
from .layers import Activation, AvgPool2D, Conv2D, Dense, Dropout, Layer, MaxPool2D
from .normalization import BatchNorm, LayerNorm
from .output import Output
from .reshaping import Flatten, GlobalAvgPool, GlobalMaxPool, Reshape
from .network import Network
from .serialization import ModelFileError
from .updaters import SGD, Adagrad, Adam, Nadam, Nesterov, RMSProp, Updater
from .zoo import lenet

__all__ = [
    "Network",
    "Layer",
    "Conv2D",
    "MaxPool2D",
    "AvgPool2D",
    "Dense",
    "Output",
    "Activation",
    "Dropout",
    "BatchNorm",
    "LayerNorm",
    "Flatten",
    "Reshape",
    "GlobalAvgPool",
    "GlobalMaxPool",
    "Updater",
    "SGD",
    "Nesterov",
    "Adagrad",
    "RMSProp",
    "Adam",
    "Nadam",
    "ModelFileError",
    "lenet",
    "zoo",
]
