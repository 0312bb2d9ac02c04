"""Writes the files of tests/data/legacy/ with the release before the house
issue retired master fields (commit 0b9fe09): saved estimators whose masters
set the retired fields, a checkpoint folder and a fitted Pipeline.  Kept to
show how the files were made; the tests only read them.

    .venv/bin/python tests/data/legacy/make_legacy.py
"""
import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(HERE))))

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ["PYTHONPATH"] = os.pathsep.join([os.path.dirname(os.path.dirname(os.path.dirname(HERE))), os.environ.get("PYTHONPATH", "")])

from pyspark.sql import SparkSession  # noqa: E402

from sparkavg.ml import NetworkEstimator  # noqa: E402
from sparkavg.spark import (BlockMomentum, DataOptions, EndpointConfig, GradientSharing,  # noqa: E402
                            ParameterAveraging, ResidualClipping, SparkTrainer)
from tests.nets import blobs, small_net  # noqa: E402


def averaging():
    return ParameterAveraging(
        batch_size_per_worker=4, workers=2, averaging_frequency="auto", target_overhead=0.05,
        max_averaging_frequency=200, aggregation_depth=3, worker_shares="equal", max_plain_momentum_frequency=16,
        moment_correction=False, weighting="uniform", collect_stats=True, seed=7,
        block_momentum=BlockMomentum(momentum=0.5, min_frequency=8, with_momentum_updaters=True),
        data=DataOptions(prefetch=2, storage_level="MEMORY_ONLY", feature_dtype="uint8", repartition="never"))


def sharing():
    return GradientSharing(
        batch_size_per_worker=4, workers=2, update_scale="sum", momentum_masking=False, local_view=False,
        transport=EndpointConfig(stall_timeout=30.0, max_datagram_bytes=1400), simulate_loss=0.0,
        max_stage_attempts=2, residual_post_processor=ResidualClipping(frequency=4, k=3.0), staleness=None,
        port=0, seed=8)


def main():
    spark = SparkSession.builder.master("local[2]").appName("legacy").getOrCreate()
    try:
        for name, master in (("estimator_averaging", averaging()), ("estimator_sharing", sharing())):
            path = os.path.join(HERE, name)
            shutil.rmtree(path, ignore_errors=True)
            NetworkEstimator(network=small_net(seed=1), master=master, epochs=2).write().save(path)
        x, y = blobs(32, seed=2)
        rows = [(i, r.reshape(-1).tolist(), float(t)) for i, (r, t) in enumerate(zip(x, y))]
        df = spark.createDataFrame(rows, "id long, features array<float>, label double").repartition(2)
        ckpt = os.path.join(HERE, "checkpoint_averaging")
        shutil.rmtree(ckpt, ignore_errors=True)
        master = ParameterAveraging(batch_size_per_worker=4, workers=2, averaging_frequency=2)
        SparkTrainer(spark, small_net(seed=3), master, checkpoint_dir=ckpt).fit(df, epochs=1)
        ckpt = os.path.join(HERE, "checkpoint_sharing")
        shutil.rmtree(ckpt, ignore_errors=True)
        SparkTrainer(spark, small_net(seed=4), GradientSharing(batch_size_per_worker=4, workers=2),
                     checkpoint_dir=ckpt).fit(df, epochs=1)
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
