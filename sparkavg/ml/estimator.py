"""``NetworkEstimator`` -> ``NetworkModel``: sparkavg as pyspark.ml stages.

    est = NetworkEstimator(network=lenet(), master=ParameterAveraging(), epochs=3)
    model = Pipeline(stages=[est]).fit(df).stages[-1]     # or est.fit(df)
    out = model.transform(df)      # + prediction (double), probability (array<float>)
    model.write().overwrite().save(path); NetworkModel.load(path)

Fitting runs :class:`~sparkavg.spark.SparkTrainer` on the DataFrame's own
session (classic or Spark Connect) over a copy of ``network``.
``transform`` is a lazy ``mapInArrow``: each Arrow batch's features are
reshaped to the network's input shape and run through it on the
executors in batches of ``inferenceBatchSize``; nothing is collected to
the driver.  Persistence is :mod:`sparkavg.ml.persistence` (npz + JSON).
"""
from __future__ import annotations

import logging
from typing import Optional

from pyspark import keyword_only
from pyspark.ml.base import Estimator, Model
from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.param.shared import HasFeaturesCol, HasLabelCol, HasPredictionCol, HasProbabilityCol
from pyspark.ml.util import MLReadable, MLWritable

from .persistence import NetworkReader, NetworkWriter

__all__ = ["NetworkEstimator", "NetworkModel"]

logger = logging.getLogger(__name__)


def _to_network(value):
    from ..nn import Model

    if not isinstance(value, Model):
        raise TypeError(f"Expect a model (sparkavg.nn.Network, sparkavg.nn.Graph, sparkavg.torch.TorchModel: "
                        f"the sparkavg.nn.Model contract), got {type(value).__name__}")
    return value


def _to_master(value):
    from ..spark.masters import Master

    if not isinstance(value, Master):
        raise TypeError(f"Expect ParameterAveraging(...) or GradientSharing(...), got {type(value).__name__}")
    return value


def _positive_int(name: str):
    def convert(value):
        value = TypeConverters.toInt(value)
        if value < 1:
            raise ValueError(f"Expect {name} >= 1, got {value}")
        return value

    return convert


class _NetworkParams(HasFeaturesCol, HasPredictionCol, HasProbabilityCol):
    """Params shared by the estimator and its model."""

    inferenceBatchSize: "Param[int]" = Param(
        Params._dummy(), "inferenceBatchSize", "examples per forward pass in transform (>= 1)",
        typeConverter=_positive_int("inferenceBatchSize"))
    featuresCols: "Param[list]" = Param(
        Params._dummy(), "featuresCols", "feature columns of a model with several inputs, one per input in the "
        "order of the model's inputs (used instead of featuresCol when set)", typeConverter=TypeConverters.toListString)

    def getFeaturesCols(self) -> Optional[list]:
        return self.getOrDefault(self.featuresCols) if self.isDefined(self.featuresCols) else None

    def setFeaturesCols(self, value):
        return self._set(featuresCols=value)

    def _features(self):
        """What :class:`~sparkavg.spark.SparkTrainer` takes as ``features_col``."""
        cols = self.getFeaturesCols()
        return list(cols) if cols else self.getFeaturesCol()

    def __init__(self) -> None:
        super().__init__()
        self._setDefault(inferenceBatchSize=256)

    def getInferenceBatchSize(self) -> int:
        return self.getOrDefault(self.inferenceBatchSize)

    def setFeaturesCol(self, value: str):
        return self._set(featuresCol=value)

    def setPredictionCol(self, value: str):
        return self._set(predictionCol=value)

    def setProbabilityCol(self, value: str):
        return self._set(probabilityCol=value)

    def setInferenceBatchSize(self, value: int):
        return self._set(inferenceBatchSize=value)


class NetworkEstimator(Estimator, _NetworkParams, HasLabelCol, MLReadable, MLWritable):
    """Trains a model (:class:`sparkavg.nn.Model`) on a DataFrame (a pyspark.ml Estimator).

    Parameters
    ----------
    network : sparkavg.nn.Model
        The network to train; ``fit`` trains a copy and leaves it as it is.
    master : ParameterAveraging or GradientSharing, default ParameterAveraging()
    epochs : int, default 1
    featuresCol : str, default "features"
        ``array<float>``, ``array<double>`` or ml ``Vector``; flat features
        are reshaped to the network's input shape.
    featuresCols : list of str, optional
        A model with several inputs (a :class:`~sparkavg.nn.Graph`): one
        column per input, in the order of the model's inputs
        (``network.spec.inputs``); numeric array columns feed float inputs,
        integer columns (``long``, ``array<long>``) feed id inputs.
    labelCol : str, default "label"
        Class indices (integers or integer-valued doubles), one-hot rows,
        or regression targets.
    predictionCol, probabilityCol : str, default "prediction", "probability"
        Columns the fitted model's ``transform`` appends.
    inferenceBatchSize : int, default 256
        Examples per forward pass in ``transform``.
    checkpointDir : str, optional
        Passed to :class:`~sparkavg.spark.SparkTrainer` (a checkpoint after every epoch).
    listeners : list, optional
        Passed to :class:`~sparkavg.spark.SparkTrainer` (:mod:`sparkavg.listeners`);
        an attribute, not a Param: copies share them and they are not saved.
    """

    network: "Param" = Param(Params._dummy(), "network", "the model to train (a sparkavg.nn.Model: Network, Graph, TorchModel; fit trains a copy)",
                             typeConverter=_to_network)
    master: "Param" = Param(Params._dummy(), "master",
                            "ParameterAveraging(...) or GradientSharing(...); default ParameterAveraging()",
                            typeConverter=_to_master)
    epochs: "Param[int]" = Param(Params._dummy(), "epochs", "epochs to train (>= 1)",
                                 typeConverter=_positive_int("epochs"))
    checkpointDir: "Param[str]" = Param(Params._dummy(), "checkpointDir",
                                        "folder for a checkpoint after every epoch (optional)",
                                        typeConverter=TypeConverters.toString)

    @keyword_only
    def __init__(self, *, network=None, master=None, epochs: int = 1, featuresCol: str = "features", featuresCols=None,
                 labelCol: str = "label", predictionCol: str = "prediction", probabilityCol: str = "probability",
                 inferenceBatchSize: int = 256, checkpointDir: Optional[str] = None, listeners=None):
        super().__init__()
        self._setDefault(epochs=1)
        self.listeners: list = []
        self.setParams(**self._input_kwargs)

    @keyword_only
    def setParams(self, *, network=None, master=None, epochs: int = 1, featuresCol: str = "features", featuresCols=None,
                  labelCol: str = "label", predictionCol: str = "prediction", probabilityCol: str = "probability",
                  inferenceBatchSize: int = 256, checkpointDir: Optional[str] = None,
                  listeners=None) -> "NetworkEstimator":
        """Set any of the constructor's params (None leaves a param unset)."""
        kwargs = dict(self._input_kwargs)
        if kwargs.get("listeners") is not None:
            self.setListeners(kwargs["listeners"])
        kwargs.pop("listeners", None)
        return self._set(**{k: v for k, v in kwargs.items() if v is not None})

    def getNetwork(self):
        if not self.isDefined(self.network):
            raise ValueError("Expect network=... (a sparkavg.nn.Model) on the NetworkEstimator, got none")
        return self.getOrDefault(self.network)

    def getMaster(self):
        """The master, ``ParameterAveraging()`` when none was set."""
        if self.isDefined(self.master):
            return self.getOrDefault(self.master)
        from ..spark.masters import ParameterAveraging

        return ParameterAveraging()

    def getEpochs(self) -> int:
        return self.getOrDefault(self.epochs)

    def getCheckpointDir(self) -> Optional[str]:
        return self.getOrDefault(self.checkpointDir) if self.isDefined(self.checkpointDir) else None

    def setNetwork(self, value) -> "NetworkEstimator":
        return self._set(network=value)

    def setMaster(self, value) -> "NetworkEstimator":
        return self._set(master=value)

    def setEpochs(self, value: int) -> "NetworkEstimator":
        return self._set(epochs=value)

    def setLabelCol(self, value: str) -> "NetworkEstimator":
        return self._set(labelCol=value)

    def setListeners(self, value) -> "NetworkEstimator":
        from ..listeners.base import EventDispatcher

        self.listeners = list(EventDispatcher(value).listeners)  # checked as the trainer will
        return self

    def _fit(self, dataset) -> "NetworkModel":
        from ..spark.trainer import SparkTrainer
        from ..data.transforms import input_encoding

        trainer = SparkTrainer(dataset.sparkSession, self.getNetwork().clone(), self.getMaster(),
                               features_col=self._features(), label_col=self.getLabelCol(),
                               checkpoint_dir=self.getCheckpointDir(), listeners=self.listeners)
        try:
            trainer.fit(dataset, epochs=self.getEpochs())
        finally:
            trainer.close()
        model = NetworkModel(network=trainer.network)
        model.input_encoding = input_encoding(self.getMaster().data)
        model.history = list(trainer.history)
        model.stats = trainer.stats
        return self._copyValues(model)

    def write(self) -> NetworkWriter:
        """An MLWriter: ``metadata/`` (pyspark's, for Pipelines), ``network.npz``, ``sparkavg.json``."""
        return NetworkWriter(self)

    @classmethod
    def read(cls) -> NetworkReader:
        return NetworkReader(cls)


class NetworkModel(Model, _NetworkParams, MLReadable, MLWritable):
    """A trained network as a pyspark.ml Model (Transformer).

    ``transform(df)`` appends ``predictionCol`` (double: the class index,
    or the first output for regression) and ``probabilityCol``
    (``array<float>``: the network's outputs -- class probabilities for
    classifiers) by batched Arrow inference on the executors.

    Attributes
    ----------
    network : sparkavg.nn.Model
    history : list of dict
        The fit's per-epoch summaries (saved with the model).
    input_encoding : dict or None
        The features' encoding the network was fitted on (``{"scale",
        "normalize"}`` of the fit's ``DataOptions``), applied by
        ``transform``; saved with the model (JSON).
    stats : TrainingStats or None
        The fit's statistics (not saved).
    """

    @keyword_only
    def __init__(self, *, network=None, featuresCol: str = "features", featuresCols=None,
                 predictionCol: str = "prediction", probabilityCol: str = "probability", inferenceBatchSize: int = 256):
        super().__init__()
        kwargs = dict(self._input_kwargs)
        network = kwargs.pop("network", None)
        self.network = _to_network(network) if network is not None else None
        self.history: list = []
        self.input_encoding = None
        self.stats = None
        self._set(**{k: v for k, v in kwargs.items() if v is not None})

    def _transform(self, dataset):
        from pyspark.sql.types import ArrayType, DoubleType, FloatType, StructField, StructType

        from ..data.validation import DataSpec
        from ..spark.connect import ShippedValue
        from ..spark.data import check_columns, resolve_features
        from ..spark.runners.base import network_state
        from .transform import make_transformer

        net = self.network
        if net is None:
            raise ValueError("Expect a NetworkModel with a network (fit one, or NetworkModel(network=...)), got none")
        prediction, probability = self.getPredictionCol(), self.getProbabilityCol()
        spec = DataSpec.of(net.spec)
        features = resolve_features(self._features(), spec)
        check_columns(dataset, features, None)
        taken = [c for c in (prediction, probability) if c in dataset.columns]
        if taken:
            raise ValueError(f"Expect output columns {prediction!r} and {probability!r} not in the input, "
                             f"got {taken} among {dataset.columns}")
        out = net.spec.single_output()
        schema = StructType(list(dataset.schema.fields) + [StructField(prediction, DoubleType(), True),
                                                           StructField(probability, ArrayType(FloatType()), True)])
        # The parameters travel with the job (JSON + raw float32 bytes in the closure), on both flavours.
        fn = make_transformer(net.to_json(), ShippedValue(network_state(net, with_updater=False)), features,
                              self.getInferenceBatchSize(), out.classification, prediction, probability,
                              self.input_encoding)
        return dataset.mapInArrow(fn, schema)

    def write(self) -> NetworkWriter:
        """An MLWriter: ``metadata/`` (pyspark's, for Pipelines), ``network.npz``, ``sparkavg.json``."""
        return NetworkWriter(self)

    @classmethod
    def read(cls) -> NetworkReader:
        return NetworkReader(cls)
