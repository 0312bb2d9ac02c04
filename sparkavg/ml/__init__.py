"""pyspark.ml front: ``NetworkEstimator`` -> ``NetworkModel`` (DataFrame in,
DataFrame out, a Pipeline stage, npz + JSON persistence), on classic and
Spark Connect sessions alike::

    from sparkavg.ml import NetworkEstimator, NetworkModel

    est = NetworkEstimator(network=lenet(), master=ParameterAveraging(), epochs=3)
    model = est.fit(df)
    out = model.transform(df)            # + prediction (double), rawPrediction and probability (ml Vectors)
    model.write().overwrite().save(path)
    same = NetworkModel.load(path)

Needs pyspark's DataFrame extras (pyarrow; on Connect also its client:
``pip install sparkavg[connect]``).
"""
from .estimator import NetworkEstimator, NetworkModel

__all__ = ["NetworkEstimator", "NetworkModel"]
