"""Graphs with BatchNorm on a real local[2] Spark: buffers averaged by
examples, checkpoints resumed exactly, both masters, Connect, and the
pyspark.ml front."""
import numpy as np
import pytest

from sparkavg.nn import Graph, load_model
from sparkavg.spark import DataOptions, GradientSharing, ParameterAveraging, SparkTrainer

from .nets import blobs, fit_replicas, small_graph, straight_and_resumed
from .test_connect import _mode

pytestmark = pytest.mark.spark


def _pairs(x, y):
    return list(zip(x, y.tolist()))


def test_batchnorm_statistics_after_a_round_are_the_example_weighted_mean(sc):
    x, y = blobs(12, seed=5)
    rdd = sc.parallelize(_pairs(x, y), 1)
    start = small_graph(seed=6)
    assert start.buffers.size == 4  # BatchNorm's running mean and variance of 2 channels
    # 3 minibatches of 4 over 2 workers, frequency 2, data order kept: worker 0 fits [0, 2], worker 1 fits [1].
    rep0, rep1 = fit_replicas(start, x, y, ([0, 2], [1]))
    assert not np.allclose(rep0.buffers, rep1.buffers)  # the workers saw different statistics
    net = start.clone()
    master = ParameterAveraging(batch_size_per_worker=4, averaging_frequency=2, workers=2,
                                data=DataOptions(repartition="never"))
    SparkTrainer(sc, net, master).fit(rdd)
    np.testing.assert_allclose(net.buffers, (8 * rep0.buffers + 4 * rep1.buffers) / 12, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(net.params, (8 * rep0.params + 4 * rep1.params) / 12, rtol=1e-5, atol=1e-6)


def test_graph_checkpoint_resume_continues_exactly(sc, tmp_path):
    x, y = blobs(60, seed=13)
    rdd = sc.parallelize(_pairs(x, y), 2)
    master = ParameterAveraging(batch_size_per_worker=6, averaging_frequency=2, workers=2)
    straight, resumed, _ = straight_and_resumed(sc, small_graph, master, rdd, str(tmp_path / "ckpt"))
    saved = load_model(tmp_path / "ckpt" / "epoch-00002" / "network.npz")
    assert isinstance(saved, Graph) and saved.epoch == 2
    np.testing.assert_allclose(resumed.params, straight.params, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(resumed.buffers, straight.buffers, rtol=1e-5, atol=1e-6)
    assert resumed.iteration == straight.iteration


def test_gradient_sharing_trains_a_graph_and_averages_its_buffers(sc):
    x, y = blobs(96, seed=21)
    rdd = sc.parallelize(_pairs(x, y), 2)
    net = small_graph(seed=22)
    initial = net.buffers.copy()
    trainer = SparkTrainer(sc, net, GradientSharing(batch_size_per_worker=8, workers=2))
    trainer.fit(rdd, epochs=2)
    assert trainer.history[-1]["replica_max_abs_diff"] < 1e-4
    assert np.isfinite(net.buffers).all() and not np.allclose(net.buffers, initial)
    assert trainer.evaluate(rdd).accuracy() > 0.9
    trainer.close()


def test_graph_in_a_pipeline_with_save_and_load(spark, tmp_path):
    from pyspark.ml import Pipeline, PipelineModel

    from sparkavg.ml import NetworkEstimator

    x, y = blobs(64, seed=31)
    df = spark.createDataFrame([(row.reshape(-1).tolist(), int(label)) for row, label in zip(x, y)],
                               "features array<float>, label long").repartition(2)
    est = NetworkEstimator(network=small_graph(seed=32), master=ParameterAveraging(batch_size_per_worker=8,
                                                                                    workers=2), epochs=3)
    fitted = Pipeline(stages=[est]).fit(df)
    path = str(tmp_path / "model")
    fitted.write().overwrite().save(path)
    loaded = PipelineModel.load(path)
    graph = loaded.stages[-1].network
    assert isinstance(graph, Graph)
    np.testing.assert_array_equal(graph.buffers, fitted.stages[-1].network.buffers)
    rows = loaded.transform(df).select("features", "label", "probability", "prediction").collect()
    probs = np.array([r.probability for r in rows], dtype=np.float32)
    features = np.array([r.features for r in rows], np.float32).reshape(-1, 1, 4, 4)
    np.testing.assert_allclose(probs, graph.output(features), rtol=1e-5, atol=1e-6)
    assert np.mean([r.prediction == r.label for r in rows]) > 0.9


@pytest.mark.slow
def test_graph_on_connect_equals_classic(spark, connect):
    x, y = blobs(48, seed=41)
    rows = [(row.reshape(-1).tolist(), int(label)) for row, label in zip(x, y)]
    master = ParameterAveraging(batch_size_per_worker=6, averaging_frequency=2, workers=2)
    models = {}
    for name, session in (("classic", spark), ("connect", connect)):
        net = small_graph(seed=42)
        with _mode(name), SparkTrainer(session, net, master) as trainer:
            df = session.createDataFrame(rows, "features array<float>, label long").coalesce(1)
            trainer.fit(df, epochs=2)
            assert trainer.evaluate(df).accuracy() > 0.9
        models[name] = net
    np.testing.assert_allclose(models["connect"].params, models["classic"].params, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(models["connect"].buffers, models["classic"].buffers, rtol=1e-5, atol=1e-6)
