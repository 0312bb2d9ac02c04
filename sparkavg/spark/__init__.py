"""Distributed training on Spark: one trainer, two masters.

    trainer = SparkTrainer(spark, network, ParameterAveraging(...))   # or GradientSharing(...)
    trainer.fit(rdd_or_dataframe, epochs=3)

Start the session with :func:`recommended_conf` (round results small
enough to travel with the task status; a quiet JIT in local mode).
"""
from .config import (AdaptiveThreshold, DataApproach, FixedThreshold, GradientSharing, ParameterAveraging,
                     Repartition, ResidualClipping, TargetSparsityThreshold, Topology, Weighting)
from .session import check_session, recommended_conf
from .stats import TrainingStats
from .trainer import SparkTrainer

__all__ = [
    "SparkTrainer",
    "ParameterAveraging",
    "GradientSharing",
    "FixedThreshold",
    "AdaptiveThreshold",
    "TargetSparsityThreshold",
    "ResidualClipping",
    "Weighting",
    "DataApproach",
    "Repartition",
    "Topology",
    "TrainingStats",
    "recommended_conf",
    "check_session",
]
