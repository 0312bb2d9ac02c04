"""The one trainer interface: ``SparkTrainer(spark_or_sc, network, master)``.

The master (:class:`ParameterAveraging` or :class:`GradientSharing`) says
how an epoch is distributed; everything else -- minibatching once per fit,
epochs, checkpoints, evaluation, inference, statistics -- lives here once.
"""
from __future__ import annotations

import logging
import os
import sys
import time
from typing import List, Optional, Sequence

import numpy as np

from ..data.spark_data import DataSpec, as_example_rdd, rebatch_partition
from ..evaluation import Evaluation, RegressionEvaluation
from .checkpoint import load_checkpoint, save_checkpoint
from .config import DataApproach, GradientSharing, ParameterAveraging
from .dataprep import PreparedData, prepare
from .driver import broadcast_state, worker_errors
from .stats import TrainingStats
from .worker import make_evaluator, make_predictor, make_scorer

__all__ = ["SparkTrainer"]

logger = logging.getLogger(__name__)


def _spark_context(spark_or_sc):
    sc = getattr(spark_or_sc, "sparkContext", spark_or_sc)
    if not hasattr(sc, "parallelize"):
        raise TypeError(f"Expect a SparkSession or SparkContext, got {type(spark_or_sc).__name__}")
    return sc


def _runner_for(sc, master):
    if isinstance(master, ParameterAveraging):
        from .averaging import AveragingRunner

        return AveragingRunner(sc, master)
    if isinstance(master, GradientSharing):
        from .sharing import SharingRunner

        return SharingRunner(sc, master)
    raise TypeError(f"Expect master to be ParameterAveraging(...) or GradientSharing(...), got {type(master).__name__}")


class SparkTrainer:
    """Train, evaluate and run a :class:`sparkavg.nn.Network` on Spark.

    Parameters
    ----------
    spark_or_sc : SparkSession or SparkContext
    network : sparkavg.nn.Network
        Trained in place; ``trainer.network`` is the same object.
    master : ParameterAveraging or GradientSharing, default ParameterAveraging()
    features_col, label_col : str
        Column names when data is a DataFrame.
    checkpoint_dir : str, optional
        When set, a checkpoint is written after every epoch.
    eval_batch_size : int, default 64
        Minibatch size of evaluate/score/predict (DL4J's default).
    """

    def __init__(self, spark_or_sc, network, master=None, *, features_col: str = "features",
                 label_col: str = "label", checkpoint_dir: Optional[str] = None, eval_batch_size: int = 64):
        self.sc = _spark_context(spark_or_sc)
        self.master = master if master is not None else ParameterAveraging()
        self._runner = _runner_for(self.sc, self.master)
        self.network = network
        self.features_col, self.label_col = features_col, label_col
        self.checkpoint_dir = checkpoint_dir
        if eval_batch_size < 1:
            raise ValueError(f"Expect eval_batch_size >= 1, got {eval_batch_size}")
        self.eval_batch_size = eval_batch_size
        self.stats = TrainingStats(workers=self.workers)
        self.history: List[dict] = []
        self.epochs_done = 0
        self._prepared: Optional[PreparedData] = None
        self._prepared_for = None
        # Python workers must run this interpreter (and its venv) unless told otherwise.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

    # ------------------------------------------------------------------ data
    @property
    def spec(self) -> DataSpec:
        out = self.network.layers[-1]
        return DataSpec(tuple(self.network.input_shape), int(out.units), out.loss_name)

    @property
    def workers(self) -> int:
        return self.master.workers or self.sc.defaultParallelism

    def _prepare(self, data) -> PreparedData:
        """Minibatch ``data`` once; reused when the same data is fitted again."""
        if self._prepared is not None and self._prepared_for is data:
            return self._prepared
        self.release_data()
        m = self.master
        approach = getattr(m, "data_approach", DataApproach.EXPORT)
        with self.stats.timed("export"):
            self._prepared = prepare(self.sc, data, self.spec, m.batch_size_per_worker, approach,
                                     getattr(m, "export_dir", None), getattr(m, "storage_level", "MEMORY_ONLY"),
                                     self.features_col, self.label_col)
        self._prepared_for = data
        if not self._prepared.sizes:
            raise ValueError("Expect training data with at least one example, got an empty dataset")
        logger.info("prepared %d examples in %d minibatches (%s)", self._prepared.examples,
                    len(self._prepared.sizes), approach.value)
        return self._prepared

    def release_data(self) -> None:
        """Drop exported minibatches / cached RDDs of the last fitted data."""
        if self._prepared is not None:
            self._prepared.release()
        self._prepared, self._prepared_for = None, None

    close = release_data

    # ------------------------------------------------------------------- fit
    def fit(self, data, epochs: int = 1, *, resume_from: Optional[str] = None, validation_data=None):
        """Train for ``epochs`` epochs.

        Parameters
        ----------
        data : RDD of (features, label) pairs or of (x, y) minibatches, or DataFrame
        epochs : int
            Epochs to train; with ``resume_from``, the TOTAL epoch target (a
            fit of 5 epochs stopped after 2 resumes with the remaining 3).
        resume_from : str, optional
            A checkpoint folder (or a checkpoint_dir: the newest inside).
        validation_data : optional
            Evaluated after every epoch (not counted in training time);
            results land in ``trainer.history``.

        Returns
        -------
        self
        """
        if not isinstance(epochs, int) or epochs < 1:
            raise ValueError(f"Expect epochs >= 1, got {epochs!r}")
        target = None
        if resume_from is not None:
            ckpt = load_checkpoint(resume_from)
            self._restore(ckpt)
            target = epochs
            epochs = max(0, epochs - self.epochs_done)
            logger.info("resuming from %s after epoch %d; %d epoch(s) to go", ckpt.directory, self.epochs_done, epochs)
        prepared = self._prepare(data) if epochs else None
        for _ in range(epochs):
            epoch = self.epochs_done
            t0 = time.perf_counter()
            summary = self._runner.run_epoch(self.network, prepared, epoch, self.workers, self.stats)
            seconds = time.perf_counter() - t0
            self.stats.record("epoch", t0, t0 + seconds, epoch=epoch)
            self.epochs_done += 1
            if hasattr(self.network, "epoch"):
                self.network.epoch = self.epochs_done
            entry = {"epoch": self.epochs_done, "seconds": seconds,
                     "examples_per_second": summary["examples"] / max(seconds, 1e-9), **summary}
            if validation_data is not None:
                with self.stats.timed("evaluate", epoch=epoch):
                    ev = self.evaluate(validation_data)
                entry["accuracy"] = ev.accuracy() if hasattr(ev, "accuracy") else None
            self.history.append(entry)
            logger.info("epoch %d%s: loss %.4f, %d examples in %.1fs (%.0f ex/s)%s", self.epochs_done,
                        f"/{target}" if target else "", summary["loss"], summary["examples"], seconds,
                        entry["examples_per_second"],
                        f", validation accuracy {entry['accuracy']:.4f}" if entry.get("accuracy") is not None else "")
            if self.checkpoint_dir:
                with self.stats.timed("checkpoint", epoch=epoch):
                    save_checkpoint(self.checkpoint_dir, self.network, self.epochs_done, self.master.to_dict(),
                                    {"history": self.history})
        if epochs:
            logger.info("%s", self.stats.summary())
        return self

    def _restore(self, ckpt) -> None:
        net = ckpt.network
        if net.to_json() != self.network.to_json():
            logger.warning("checkpoint network config differs from the trainer's network; using the checkpoint's")
            self.network = net
        else:
            self.network.params = net.params
            self.network.updater_state = net.updater_state
            self.network.iteration = net.iteration
            if hasattr(net, "epoch"):
                self.network.epoch = net.epoch
        saved, current = ckpt.master, self.master.to_dict()
        if saved != current:
            logger.warning("checkpoint master config %s differs from the trainer's %s", saved, current)
        self.epochs_done = ckpt.epochs_done
        self.history = list(ckpt.extra.get("history", []))

    # ------------------------------------------------------- evaluate/predict
    def _default_evaluation(self):
        if self.spec.classification:
            return Evaluation(self.spec.num_outputs)
        return RegressionEvaluation(self.spec.num_outputs)

    def evaluate(self, data, evaluations: Optional[Sequence] = None):
        """Distributed evaluation in one pass over ``data``.

        Each partition fills fresh copies of ``evaluations`` (default: one
        :class:`Evaluation`, or :class:`RegressionEvaluation` for MSE nets);
        ``treeAggregate`` merges them.  Returns one evaluation, or a list
        when ``evaluations`` is given.
        """
        single = evaluations is None
        evals = [self._default_evaluation()] if single else list(evaluations)
        rdd = as_example_rdd(data, self.features_col, self.label_col)
        bc = broadcast_state(self.sc, self.network, with_updater=False)
        try:
            fn = make_evaluator(self.network.to_json(), bc, evals,
                                rebatch_partition(self.spec, self.eval_batch_size))

            def merge(a, b):
                if a is None:
                    return b
                if b is None:
                    return a
                for x, y in zip(a, b):
                    x.merge(y)
                return a

            with worker_errors("evaluation"):
                merged = rdd.mapPartitionsWithIndex(fn).treeAggregate(None, merge, merge, depth=2)
        finally:
            bc.destroy()
        merged = merged if merged is not None else evals
        return merged[0] if single else merged

    def score(self, data) -> float:
        """Mean loss over every example of ``data``."""
        rdd = as_example_rdd(data, self.features_col, self.label_col)
        bc = broadcast_state(self.sc, self.network, with_updater=False)
        try:
            fn = make_scorer(self.network.to_json(), bc, rebatch_partition(self.spec, self.eval_batch_size))
            with worker_errors("scoring"):
                total, n = rdd.mapPartitionsWithIndex(fn).fold((0.0, 0), lambda a, b: (a[0] + b[0], a[1] + b[1]))
        finally:
            bc.destroy()
        if n == 0:
            raise ValueError("Expect data with at least one example to score, got none")
        return total / n

    def predict(self, data):
        """Distributed inference: an RDD of output rows.

        Rows ``(key, features)`` give ``(key, output)`` (RDDs are unordered,
        keys say which is which); bare feature arrays give outputs in the
        partition order.  A DataFrame uses ``features_col``.  The broadcast
        of parameters lives as long as the returned RDD may be recomputed;
        it is released by :meth:`close` / garbage collection.
        """
        if hasattr(data, "rdd") and hasattr(data, "columns"):
            data = data.select(self.features_col).rdd.map(
                lambda row: np.asarray(row[0].toArray() if hasattr(row[0], "toArray") else row[0], np.float32))
        bc = broadcast_state(self.sc, self.network, with_updater=False)
        return data.mapPartitions(make_predictor(self.network.to_json(), bc, self.eval_batch_size))
