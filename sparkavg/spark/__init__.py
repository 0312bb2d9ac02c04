"""Distributed training on Spark: one trainer, two masters.

    trainer = SparkTrainer(spark, network, ParameterAveraging(...))   # or GradientSharing(...)
    trainer.fit(rdd_or_dataframe, epochs=3)
"""
from .config import (AdaptiveThreshold, DataApproach, FixedThreshold, GradientSharing, ParameterAveraging,
                     Repartition, ResidualClipping, TargetSparsityThreshold, Topology, Weighting)
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
]
