"""Distributed training on Spark: one trainer, two masters::

    trainer = SparkTrainer(spark, network, ParameterAveraging(...))   # or GradientSharing(...)
    trainer.fit(rdd_or_dataframe, epochs=3)

Start the session with :func:`recommended_conf` (round results small
enough to travel with the task status; a quiet JIT in local mode).

Names are imported on first use, so importing one does not load the trainer.
"""
import importlib

_EXPORTS = {
    "SparkTrainer": ".trainer",
    "ParameterAveraging": ".masters",
    "GradientSharing": ".masters",
    "DataOptions": ".masters",
    "Device": ".masters",
    "Placement": ".masters",
    "Repartition": ".masters",
    "Topology": ".masters",
    "FixedThreshold": ".masters",
    "AdaptiveThreshold": ".masters",
    "TargetSparsityThreshold": ".masters",
    "TrainingStats": "..stats",
    "recommended_conf": ".session",
    "check_session": ".session",
    "WorkerFailure": ".errors",
    "WorkerCrashed": ".errors",
    "TrainingCancelled": ".errors",
    "DivergenceError": ".errors",
    "executor_errors": ".errors",
    "CheckpointError": ".checkpoint",
    "Recover": "..fitting.divergence",
    "EarlyStopping": "..fitting.early_stopping",
}

__all__ = list(_EXPORTS)


def __getattr__(name):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'sparkavg.spark' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
