"""The network engine: layers over one flat parameter vector, flat
updater state, array-module generic (numpy or CuPy).

Modules: :mod:`.model` (the model contract every strategy sees: ``Model``,
``ModelSpec``), :mod:`.loading` (``load_model``, ``model_from_json``: a
model of any type), :mod:`.upgrades` (configurations of an older layout),
:mod:`.flatstate` (``FlatState``: the flat vectors and the updater step
every model holds), :mod:`.flat` (the model contract over it, and the
provider for models built of layers),
:mod:`.network` (``Network``), :mod:`.layers`, :mod:`.output`
(the loss layer), :mod:`.updaters`, :mod:`.schedules` (learning-rate
schedules an updater's ``lr`` may be), :mod:`.clipping` (gradient
normalisation), :mod:`.regularization` (L2 and weight
decay as fused passes over contiguous ranges of the flat vector),
:mod:`.normalization` (``BatchNorm``, ``LayerNorm``), :mod:`.reshaping`
(``Flatten``, ``Reshape``, global pooling), :mod:`.recurrent` (``LSTM``,
``GRU``), :mod:`.embedding` (``Embedding``), :mod:`.conv1d` (``Conv1D``),
:mod:`.activations`, :mod:`.initializers`, :mod:`.serialization` (npz
model files); im2col and pooling kernels are in :mod:`sparkavg.ops.conv`,
:mod:`.zoo` (``lenet``).
"""
from . import zoo
from .layers import Activation, AvgPool2D, Conv2D, Dense, Dropout, Layer, MaxPool2D
from .loading import load_model, model_from_config, model_from_json
from .model import InputSpec, Model, ModelSpec, OutputSpec
from .normalization import BatchNorm, LayerNorm
from .output import Output
from .reshaping import Flatten, GlobalAvgPool, GlobalMaxPool, Reshape
from .recurrent import GRU, LSTM
from .embedding import Embedding
from .conv1d import Conv1D
from .network import Network
from .graph import Graph, Vertex
from .vertices import Add, Merge, Multiply
from .serialization import ModelFileError
from .updaters import SGD, Adagrad, Adam, Nadam, Nesterov, RMSProp, Updater
from .clipping import (ClipElementWise, ClipGlobalNorm, ClipL2PerLayer, ClipL2PerParamType, GradientNormalization,
                       RenormalizeL2PerLayer, RenormalizeL2PerParamType)
from .schedules import (CosineSchedule, ExponentialSchedule, InverseSchedule, MapSchedule, OneCycleSchedule,
                        PolySchedule, Schedule, ScheduleError, SigmoidSchedule, StepSchedule)
from .finetune import FineTuning
from .transfer import transfer
from .zoo import lenet

__all__ = [
    "Model",
    "ModelSpec",
    "InputSpec",
    "OutputSpec",
    "load_model",
    "model_from_config",
    "model_from_json",
    "Network",
    "Graph",
    "Vertex",
    "Merge",
    "Add",
    "Multiply",
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
    "LSTM",
    "GRU",
    "Embedding",
    "Conv1D",
    "FineTuning",
    "transfer",
    "Updater",
    "SGD",
    "Nesterov",
    "Adagrad",
    "RMSProp",
    "Adam",
    "Nadam",
    "Schedule",
    "ScheduleError",
    "StepSchedule",
    "ExponentialSchedule",
    "InverseSchedule",
    "PolySchedule",
    "SigmoidSchedule",
    "MapSchedule",
    "CosineSchedule",
    "OneCycleSchedule",
    "GradientNormalization",
    "ClipElementWise",
    "ClipL2PerLayer",
    "ClipL2PerParamType",
    "RenormalizeL2PerLayer",
    "RenormalizeL2PerParamType",
    "ClipGlobalNorm",
    "ModelFileError",
    "lenet",
    "zoo",
]
