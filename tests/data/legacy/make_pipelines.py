"""Writes the Pipelines of tests/data/legacy/ with the release before
``NetworkModel.transform`` wrote ml Vectors and the estimator took its
hyperparameters as Params (commit fbb5640): a fitted ``PipelineModel``
whose ``NetworkModel`` wrote ``probability`` as ``array<float>``, and an
unfitted ``Pipeline`` of a ``NetworkEstimator``.  Kept to show how the
files were made; the tests only read them.

    .venv/bin/python tests/data/legacy/make_pipelines.py
"""
import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, ROOT)

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ["PYTHONPATH"] = os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])

from pyspark.ml import Pipeline  # noqa: E402
from pyspark.sql import SparkSession  # noqa: E402

from sparkavg.ml import NetworkEstimator  # noqa: E402
from sparkavg.spark import ParameterAveraging  # noqa: E402
from tests.nets import blobs, small_net  # noqa: E402


def main():
    spark = SparkSession.builder.master("local[2]").appName("legacy").getOrCreate()
    try:
        x, y = blobs(32, seed=2)
        rows = [(i, r.reshape(-1).tolist(), float(t)) for i, (r, t) in enumerate(zip(x, y))]
        df = spark.createDataFrame(rows, "id long, features array<float>, label double").repartition(2)
        est = NetworkEstimator(network=small_net(seed=5), epochs=2,
                               master=ParameterAveraging(batch_size_per_worker=4, workers=2, averaging_frequency=2))
        pipeline = Pipeline(stages=[est])
        path = os.path.join(HERE, "pipeline_estimator")
        shutil.rmtree(path, ignore_errors=True)
        pipeline.write().save(path)
        path = os.path.join(HERE, "pipeline_model")
        shutil.rmtree(path, ignore_errors=True)
        pipeline.fit(df).write().save(path)
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
