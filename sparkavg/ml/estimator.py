"""``NetworkEstimator`` -> ``NetworkModel``: sparkavg as pyspark.ml stages.

    est = NetworkEstimator(network=lenet(), master=ParameterAveraging(), epochs=3)
    model = Pipeline(stages=[est]).fit(df).stages[-1]     # or est.fit(df)
    out = model.transform(df)      # + prediction (double), rawPrediction and probability (ml Vectors)
    model.write().overwrite().save(path); NetworkModel.load(path)

Fitting runs :class:`~sparkavg.spark.SparkTrainer` on the DataFrame's own
session (classic or Spark Connect) over a copy of ``network``.  The output
columns are those of Spark's own classifiers, so that
``BinaryClassificationEvaluator`` and ``MulticlassClassificationEvaluator``
read them as they are, and the common hyperparameters (``learningRate``,
``epochs``, ``batchSize``, ``earlyStopping``) are Params that
``CrossValidator`` and ``TrainValidationSplit`` tune over a
``ParamGridBuilder`` grid.
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
from pyspark.ml.param.shared import (HasFeaturesCol, HasLabelCol, HasPredictionCol, HasProbabilityCol,
                                     HasRawPredictionCol, HasValidationIndicatorCol, HasWeightCol)
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


def _to_early_stopping(value):
    from ..fitting.early_stopping import EarlyStopping

    if value is not None and not isinstance(value, EarlyStopping):
        raise TypeError(f"Expect earlyStopping as an EarlyStopping(...) (sparkavg.spark.EarlyStopping) or None, "
                        f"got {type(value).__name__}")
    return value


def _positive_float(name: str):
    def convert(value):
        value = TypeConverters.toFloat(value)
        if not (value > 0 and value != float("inf")):
            raise ValueError(f"Expect {name} > 0 and finite, got {value}")
        return value

    return convert


def _positive_int(name: str):
    def convert(value):
        value = TypeConverters.toInt(value)
        if value < 1:
            raise ValueError(f"Expect {name} >= 1, got {value}")
        return value

    return convert


class _NetworkParams(HasFeaturesCol, HasPredictionCol, HasRawPredictionCol, HasProbabilityCol):
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

    def setRawPredictionCol(self, value: str):
        return self._set(rawPredictionCol=value)

    def setInferenceBatchSize(self, value: int):
        return self._set(inferenceBatchSize=value)


class NetworkEstimator(Estimator, _NetworkParams, HasLabelCol, HasValidationIndicatorCol, HasWeightCol, MLReadable,
                       MLWritable):
    """Trains a model (:class:`sparkavg.nn.Model`) on a DataFrame (a pyspark.ml Estimator).

    Parameters
    ----------
    network : sparkavg.nn.Model
        The network to train; ``fit`` trains a copy and leaves it as it is.
    master : ParameterAveraging or GradientSharing, default ParameterAveraging()
    epochs : int, default 1
        Epochs to train (with ``earlyStopping``: at most).
    learningRate : float, optional
        The updater's (base) learning rate; by default the network's own.
        A schedule keeps its shape and is scaled to it.
    batchSize : int, optional
        Examples per minibatch on each worker; by default the master's
        ``batch_size_per_worker``.
    earlyStopping : sparkavg.fitting.early_stopping.EarlyStopping, optional
        Stop when the monitored value stops improving and keep the best
        epoch (:class:`~sparkavg.fitting.early_stopping.EarlyStopping`); a
        validation monitor (``val_loss``...) needs ``validationIndicatorCol``.
    validationIndicatorCol : str, optional
        A boolean column: rows where it is true are validation data
        (evaluated after every epoch, not trained on), as in Spark's GBT
        estimators.
    weightCol : str, optional
        A numeric column of per-row weights (finite, >= 0), as Spark's own
        estimators take it: each row's loss is scaled by its weight, and
        averaging weighs each worker by its rows' summed weights
        (``SparkTrainer(weight_col=)``).
    metrics : list of str, optional
        Validation metrics recorded every epoch besides the loss and the
        accuracy (:mod:`sparkavg.fitting.metrics`).
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
    predictionCol, rawPredictionCol, probabilityCol : str
        Columns the fitted model's ``transform`` appends (default
        "prediction", "rawPrediction", "probability"; "" leaves one out).
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
    learningRate: "Param[float]" = Param(Params._dummy(), "learningRate",
                                         "the updater's (base) learning rate (> 0; default: the network's own)",
                                         typeConverter=_positive_float("learningRate"))
    batchSize: "Param[int]" = Param(Params._dummy(), "batchSize", "examples per minibatch on each worker (>= 1; "
                                    "default: the master's batch_size_per_worker)",
                                    typeConverter=_positive_int("batchSize"))
    earlyStopping: "Param" = Param(Params._dummy(), "earlyStopping", "an EarlyStopping(...) or None (optional)",
                                   typeConverter=_to_early_stopping)
    metrics: "Param[list]" = Param(Params._dummy(), "metrics", "validation metrics recorded every epoch besides the "
                                   "loss and the accuracy ('f1', 'auc', 'log_loss', 'mse', 'mae', 'r2' ...)",
                                   typeConverter=TypeConverters.toListString)

    @keyword_only
    def __init__(self, *, network=None, master=None, epochs: int = 1, featuresCol: str = "features", featuresCols=None,
                 labelCol: str = "label", predictionCol: str = "prediction", probabilityCol: str = "probability",
                 rawPredictionCol: str = "rawPrediction", inferenceBatchSize: int = 256,
                 checkpointDir: Optional[str] = None, learningRate: Optional[float] = None,
                 batchSize: Optional[int] = None, earlyStopping=None, validationIndicatorCol: Optional[str] = None,
                 metrics=None, listeners=None, weightCol: Optional[str] = None):
        super().__init__()
        self._setDefault(epochs=1)
        self.listeners: list = []
        self.setParams(**self._input_kwargs)

    @keyword_only
    def setParams(self, *, network=None, master=None, epochs: int = 1, featuresCol: str = "features", featuresCols=None,
                  labelCol: str = "label", predictionCol: str = "prediction", probabilityCol: str = "probability",
                  rawPredictionCol: str = "rawPrediction", inferenceBatchSize: int = 256,
                  checkpointDir: Optional[str] = None, learningRate: Optional[float] = None,
                  batchSize: Optional[int] = None, earlyStopping=None, validationIndicatorCol: Optional[str] = None,
                  metrics=None, listeners=None, weightCol: Optional[str] = None) -> "NetworkEstimator":
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

    def _optional(self, param):
        return self.getOrDefault(param) if self.isDefined(param) else None

    def getLearningRate(self) -> float:
        """The learning rate set, else the network's updater's."""
        return self._optional(self.learningRate) or self.getNetwork().updater.learning_rate

    def getBatchSize(self) -> int:
        """The batch size set, else the master's ``batch_size_per_worker``."""
        return self._optional(self.batchSize) or self.getMaster().batch_size_per_worker

    def getEarlyStopping(self):
        """The EarlyStopping set, or None."""
        return self._optional(self.earlyStopping)

    def getMetrics(self) -> Optional[list]:
        return self._optional(self.metrics)

    def setLearningRate(self, value: float) -> "NetworkEstimator":
        return self._set(learningRate=value)

    def setBatchSize(self, value: int) -> "NetworkEstimator":
        return self._set(batchSize=value)

    def setEarlyStopping(self, value) -> "NetworkEstimator":
        return self._set(earlyStopping=value)

    def setWeightCol(self, value: str) -> "NetworkEstimator":
        return self._set(weightCol=value)

    def setValidationIndicatorCol(self, value: str) -> "NetworkEstimator":
        return self._set(validationIndicatorCol=value)

    def setMetrics(self, value) -> "NetworkEstimator":
        return self._set(metrics=value)

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

    def _split(self, dataset):
        """``(training rows, validation rows or None)`` by ``validationIndicatorCol``."""
        name = self._optional(self.validationIndicatorCol)
        stopping = self.getEarlyStopping()
        if not name:
            if stopping is not None and stopping.needs_validation:
                raise ValueError(f"Expect validationIndicatorCol with earlyStopping monitoring {stopping.monitor!r} "
                                 "(a validation value), got none; set it, or monitor 'loss'")
            if self.getMetrics():
                raise ValueError(f"Expect validationIndicatorCol with metrics={self.getMetrics()!r}, got none")
            return dataset, None
        kind = dict(dataset.dtypes).get(name)
        if kind != "boolean":
            raise ValueError(f"Expect validationIndicatorCol {name!r} to be a boolean column of the input, got "
                             f"{kind or 'no such column'} among {dataset.columns}")
        flag = dataset[name].eqNullSafe(True)  # null: a training row
        return dataset.filter(~flag), dataset.filter(flag)

    def _fit(self, dataset) -> "NetworkModel":
        import dataclasses

        from ..spark.trainer import SparkTrainer
        from ..data.transforms import input_encoding

        network, master = self.getNetwork().clone(), self.getMaster()
        if self.isDefined(self.learningRate):
            network.updater = network.updater.with_learning_rate(self.getOrDefault(self.learningRate))
        if self.isDefined(self.batchSize):
            master = dataclasses.replace(master, batch_size_per_worker=self.getOrDefault(self.batchSize))
        train, validation = self._split(dataset)
        trainer = SparkTrainer(dataset.sparkSession, network, master, features_col=self._features(),
                               label_col=self.getLabelCol(), weight_col=self._optional(self.weightCol),
                               checkpoint_dir=self.getCheckpointDir(), listeners=self.listeners)
        try:
            history = trainer.fit(train, epochs=self.getEpochs(), validation_data=validation,
                                  early_stopping=self.getEarlyStopping(), metrics=self.getMetrics())
        finally:
            trainer.close()
        model = NetworkModel(network=trainer.network)
        model.input_encoding = input_encoding(master.data)
        model.device = master.device.value
        model.history = list(trainer.history)
        model.best_epoch = history.best_epoch
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

    ``transform(df)`` appends, by batched Arrow inference on the
    executors, the columns of Spark's own classifiers: ``predictionCol``
    (double: the class index, or the first output for regression),
    ``rawPredictionCol`` and ``probabilityCol`` (``pyspark.ml.linalg``
    dense Vectors of the network's outputs: class probabilities for
    classifiers, which both serve as scores), so that
    ``BinaryClassificationEvaluator`` and
    ``MulticlassClassificationEvaluator`` read them as they are.  A column
    whose name is set to "" is left out.

    Attributes
    ----------
    network : sparkavg.nn.Model
    history : list of dict
        The fit's per-epoch summaries (saved with the model).
    best_epoch : int or None
        The fit's best epoch (``History.best_epoch``; saved with the model).
    input_encoding : dict or None
        The features' encoding the network was fitted on (``{"scale",
        "normalize"}`` of the fit's ``DataOptions``), applied by
        ``transform``; saved with the model (JSON).
    device : {"auto", "gpu", "cpu"}
        Where ``transform`` runs the network on the executors: the fit's
        master's ``device`` (``"auto"``: a task's Spark-assigned GPU when
        it has one, else the CPU); ``"auto"`` when not fitted here (not saved).
    stats : TrainingStats or None
        The fit's statistics (not saved).
    """

    @keyword_only
    def __init__(self, *, network=None, featuresCol: str = "features", featuresCols=None,
                 predictionCol: str = "prediction", probabilityCol: str = "probability",
                 rawPredictionCol: str = "rawPrediction", inferenceBatchSize: int = 256):
        super().__init__()
        kwargs = dict(self._input_kwargs)
        network = kwargs.pop("network", None)
        self.network = _to_network(network) if network is not None else None
        self.history: list = []
        self.best_epoch = None
        self.input_encoding = None
        self.device = "auto"
        self.stats = None
        self._set(**{k: v for k, v in kwargs.items() if v is not None})

    def _transform(self, dataset):
        from pyspark.ml.linalg import VectorUDT
        from pyspark.sql.types import DoubleType, StructField, StructType

        from ..data.validation import DataSpec
        from ..spark.connect import ShippedValue
        from ..spark.data import check_columns, resolve_features
        from ..spark.executor.device import as_device
        from ..spark.runners.base import network_state
        from .transform import make_transformer

        net = self.network
        if net is None:
            raise ValueError("Expect a NetworkModel with a network (fit one, or NetworkModel(network=...)), got none")
        names = {"prediction": self.getPredictionCol(), "rawPrediction": self.getRawPredictionCol(),
                 "probability": self.getProbabilityCol()}
        spec = DataSpec.of(net.spec)
        features = resolve_features(self._features(), spec)
        check_columns(dataset, features, None)
        wanted = {k: v for k, v in names.items() if v}
        taken = [c for c in wanted.values() if c in dataset.columns]
        if taken or len(set(wanted.values())) < len(wanted):
            raise ValueError(f"Expect output columns {list(wanted.values())} distinct and not in the input, got "
                             f"{taken or list(wanted.values())} among {dataset.columns}")
        out = net.spec.single_output()
        types = {"prediction": DoubleType(), "rawPrediction": VectorUDT(), "probability": VectorUDT()}
        schema = StructType(list(dataset.schema.fields) + [StructField(v, types[k], True) for k, v in wanted.items()])
        # The parameters travel with the job (JSON + raw float32 bytes in the closure), on both flavours.
        fn = make_transformer(net.to_json(), ShippedValue(network_state(net, with_updater=False)), features,
                              self.getInferenceBatchSize(), out.target, wanted,
                              self.input_encoding, as_device(self.device))
        return dataset.mapInArrow(fn, schema)

    def write(self) -> NetworkWriter:
        """An MLWriter: ``metadata/`` (pyspark's, for Pipelines), ``network.npz``, ``sparkavg.json``."""
        return NetworkWriter(self)

    @classmethod
    def read(cls) -> NetworkReader:
        return NetworkReader(cls)
