"""Parameter averaging on a real local[2] Spark: exact averaging semantics,
data formats, evaluation/inference, checkpoints, a killed worker."""
import glob
import os

import numpy as np
import pytest

from sparkavg.data.validation import DataValidationError
from sparkavg.spark import DataOptions, ParameterAveraging, SparkTrainer

from .nets import (assert_evaluation_matches_local, averaged_updater_state, blobs, fit_replicas, small_net,
                   trained_small_net)

pytestmark = pytest.mark.spark


def _pairs(x, y):
    return list(zip(x, y.tolist()))


def test_one_round_is_the_weighted_mean_of_worker_replicas(sc):
    x, y = blobs(16, seed=1)
    rdd = sc.parallelize(_pairs(x, y), 2)  # partition 0: examples 0-7, partition 1: 8-15
    net = small_net(seed=3)
    start = net.clone()
    master = ParameterAveraging(batch_size_per_worker=4, averaging_frequency=2, workers=2,
                                data=DataOptions(repartition="never"))
    trainer = SparkTrainer(sc, net, master)
    trainer.fit(rdd, epochs=1)
    decided = [d for d in trainer.stats.decisions if d["name"] == "moment_correction"]
    assert [d["value"] for d in decided] == [True]
    # Minibatches 0..3 = examples [0:4], [4:8], [8:12], [12:16]; dealt [[0, 2], [1, 3]].
    replicas = fit_replicas(start, x, y, ([0, 2], [1, 3]))
    expected = (replicas[0].params + replicas[1].params) / 2
    np.testing.assert_allclose(net.params, expected, rtol=1e-5, atol=1e-6)
    plain = averaged_updater_state(start, replicas, corrected=False)
    # the default preset's moment correction: Adam's averaged v corrected for the workers' noise, from their m's spread
    expected_state = averaged_updater_state(start, replicas)
    n = net.num_params
    assert (expected_state[n:] < plain[n:] * (1 - 1e-3)).mean() > 0.5  # the correction is not a no-op here
    np.testing.assert_allclose(net.updater_state, expected_state, rtol=1e-5, atol=1e-7)
    assert net.iteration == start.iteration + 2
    plainly = start.clone()  # preset "dl4j": the plain mean
    trainer = SparkTrainer(sc, plainly, ParameterAveraging.dl4j(batch_size_per_worker=4, averaging_frequency=2,
                                                                workers=2, data=DataOptions(repartition="never")))
    trainer.fit(rdd, epochs=1)
    np.testing.assert_allclose(plainly.params, expected, rtol=1e-5, atol=1e-6)  # equal shards: weights alike
    np.testing.assert_allclose(plainly.updater_state, plain, rtol=1e-5, atol=1e-7)
    assert [d["value"] for d in trainer.stats.decisions if d["name"] == "moment_correction"] == [False]


def test_uneven_and_empty_partitions_train_every_example(sc):
    x, y = blobs(203, seed=2)
    pairs = _pairs(x, y)
    # 5 partitions, two of them empty, the rest uneven.
    parts = [pairs[:150], [], pairs[150:151], [], pairs[151:]]
    rdd = sc.parallelize(parts, 5).flatMap(lambda p: p)
    net = small_net(seed=4)
    master = ParameterAveraging(batch_size_per_worker=8, averaging_frequency=3, workers=2)
    trainer = SparkTrainer(sc, net, master)
    trainer.fit(rdd, epochs=2)
    assert trainer.stats.counters["examples"] == 2 * 203
    assert [h["examples"] for h in trainer.history] == [203, 203]
    ev = trainer.evaluate(rdd)
    assert ev.count == 203
    assert ev.accuracy() > 0.9  # separable blobs: it learned


def test_example_and_uniform_weighting_on_uneven_shards(sc):
    """The default preset weights each worker by the examples it trained; DL4J's counts every worker once."""
    x, y = blobs(12, seed=5)
    rdd = sc.parallelize(_pairs(x, y), 1)
    start = small_net(seed=6)
    # 3 minibatches of 4 over 2 workers, frequency 2, data order kept: worker 0 fits [0, 2], worker 1 fits [1].
    replicas = fit_replicas(start, x, y, ([0, 2], [1]))
    expected = {"sparkavg": (8 * replicas[0].params + 4 * replicas[1].params) / 12,
                "dl4j": (replicas[0].params + replicas[1].params) / 2}
    for preset, want in expected.items():
        net = start.clone()
        master = ParameterAveraging(batch_size_per_worker=4, averaging_frequency=2, workers=2, preset=preset,
                                    data=DataOptions(repartition="never"))
        SparkTrainer(sc, net, master).fit(rdd)
        np.testing.assert_allclose(net.params, want, rtol=1e-5, atol=1e-6, err_msg=preset)


@pytest.mark.parametrize("deal", ["balanced", pytest.param("local", marks=pytest.mark.slow)])
def test_spark_blocks_and_shared_files_give_the_same_model(sc, tmp_path, deal):
    x, y = blobs(64, seed=7)
    rdd = sc.parallelize(_pairs(x, y), 3)
    params = {}
    placements = {"spark": DataOptions(placement="spark", repartition=deal),
                  "files": DataOptions(shared_dir=str(tmp_path / "shared"), repartition=deal),
                  "url": DataOptions(shared_dir=(tmp_path / "url").as_uri(), repartition=deal)}
    for name, options in placements.items():
        net = small_net(seed=8)
        with SparkTrainer(sc, net, ParameterAveraging(batch_size_per_worker=5, averaging_frequency=2, workers=2,
                                                      data=options)) as trainer:
            trainer.fit(rdd, epochs=2)
            if name != "spark":
                prepared = trainer._prepared
                assert prepared.description == "shared files" and prepared.examples == 64
                assert all(os.path.exists(p.replace("file://", "")) for p in prepared.paths)
        params[name] = net.params.copy()
    np.testing.assert_allclose(params["files"], params["spark"], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(params["url"], params["spark"], rtol=1e-6, atol=1e-7)
    # close() removed what the fit wrote under the shared locations, and nothing else
    assert (tmp_path / "shared").is_dir() and not any((tmp_path / "shared").iterdir())


def test_dataframe_input_and_bad_labels(spark):
    x, y = blobs(40, seed=9)
    df = spark.createDataFrame([(row.reshape(-1).tolist(), int(label)) for row, label in zip(x, y)],
                               ["pixels", "target"])
    net = small_net(seed=10)
    trainer = SparkTrainer(spark, net, ParameterAveraging(batch_size_per_worker=8, workers=2),
                           features_col="pixels", label_col="target")
    trainer.fit(df)
    assert trainer.history[0]["examples"] == 40
    bad = spark.createDataFrame([([0.0] * x[0].size, 1), ([0.0] * x[0].size, 7)], ["pixels", "target"]).coalesce(1)
    with pytest.raises(DataValidationError, match=r"Bad label at partition 0, row 1: expected a class index in \[0, 2\)"):
        SparkTrainer(spark, small_net(), ParameterAveraging(workers=1), features_col="pixels",
                     label_col="target").fit(bad)
    with pytest.raises(DataValidationError, match="Expect DataFrame columns 'features'"):
        SparkTrainer(spark, small_net(), ParameterAveraging(workers=1)).fit(df)


def test_evaluate_predict_score_match_local(sc):
    net, x, y = trained_small_net()
    trainer = SparkTrainer(sc, net, ParameterAveraging(workers=2))
    rdd = sc.parallelize(_pairs(x, y), 3)
    assert_evaluation_matches_local(trainer, rdd, net, x, y)
    keyed = trainer.predict(sc.parallelize([(f"k{i}", x[i]) for i in range(len(x))], 4)).collectAsMap()
    expected = net.output(x)
    for i in range(len(x)):
        np.testing.assert_allclose(keyed[f"k{i}"], expected[i], rtol=1e-5, atol=1e-6)
    plain = np.stack(trainer.predict(sc.parallelize(list(x), 2)).collect())
    np.testing.assert_allclose(plain, expected, rtol=1e-5, atol=1e-6)


def test_predict_runs_on_the_masters_device(sc):
    net, x, _ = trained_small_net()
    with SparkTrainer(sc, net, ParameterAveraging(workers=2, device="cpu")) as trainer:
        out = np.stack(trainer.predict(sc.parallelize(list(x), 2)).collect())
    np.testing.assert_allclose(out, net.output(x), rtol=1e-5, atol=1e-6)
    # No GPU assigned by Spark here: device='gpu' inference fails in the task, as training would.
    with SparkTrainer(sc, net, ParameterAveraging(workers=2, device="gpu")) as trainer:
        with pytest.raises(Exception, match="DeviceError: Expect a GPU assigned to this task by Spark for "
                                            "device='gpu', got none"):
            trainer.predict(sc.parallelize(list(x), 2)).collect()


@pytest.mark.parametrize("column", ["features", pytest.param("vec", marks=pytest.mark.slow)])
def test_predict_on_a_dataframe_reads_arrow_batches_in_row_order(sc, column):
    from pyspark.ml.linalg import Vectors
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.getOrCreate()
    x, _ = blobs(50, seed=11)
    net = small_net(seed=12)
    flat = x.reshape(len(x), -1).astype(np.float64)
    rows = [(flat[i].tolist(), Vectors.dense(flat[i].tolist())) for i in range(len(x))]
    df = spark.createDataFrame(rows, ["features", "vec"]).coalesce(3)
    with SparkTrainer(sc, net, ParameterAveraging(workers=2), features_col=column) as trainer:
        out = np.stack(trainer.predict(df).collect())
        np.testing.assert_allclose(out, net.output(x), rtol=1e-5, atol=1e-6)
        bad = spark.createDataFrame([([1.0] * 16,), ([float("nan")] + [0.0] * 15,)], ["features"]).coalesce(1)
        if column == "features":
            # predict is lazy: the error comes with the user's own action, through Spark, naming the row.
            with pytest.raises(Exception, match=r"DataValidationError: Bad features at partition 0, row 1: "
                                                r"1 NaN/inf value\(s\); expected finite numbers"):
                trainer.predict(bad).collect()
        else:
            with pytest.raises(DataValidationError, match="Expect DataFrame columns 'vec'"):
                trainer.predict(bad)


def test_checkpoint_resume_continues_exactly(sc, tmp_path):
    x, y = blobs(60, seed=13)
    rdd = sc.parallelize(_pairs(x, y), 2)
    master = ParameterAveraging(batch_size_per_worker=6, averaging_frequency=2, workers=2)
    straight = small_net(seed=14)
    SparkTrainer(sc, straight, master).fit(rdd, epochs=3)
    ckpt = str(tmp_path / "ckpt")
    first = small_net(seed=14)
    SparkTrainer(sc, first, master, checkpoint_dir=ckpt).fit(rdd, epochs=2)
    assert sorted(os.listdir(ckpt)) == ["epoch-00001", "epoch-00002"]
    resumed = small_net(seed=99)  # different start: everything must come from the checkpoint
    trainer = SparkTrainer(sc, resumed, master, checkpoint_dir=ckpt)
    trainer.fit(rdd, epochs=3, resume_from=ckpt)
    assert trainer.epochs_done == 3 and len(trainer.history) == 3
    np.testing.assert_allclose(trainer.network.params, straight.params, rtol=1e-5, atol=1e-6)
    assert trainer.network.iteration == straight.iteration


@pytest.mark.parametrize("placement", ["auto", "spark"])
def test_killed_worker_is_retried_and_fit_is_correct(sc, tmp_path, placement):
    x, y = blobs(40, seed=15)
    rdd = sc.parallelize(_pairs(x, y), 2)
    master = ParameterAveraging(batch_size_per_worker=5, averaging_frequency=2, workers=2,
                                data=DataOptions(placement=placement))
    clean = small_net(seed=16)
    SparkTrainer(sc, clean, master).fit(rdd)
    marker = tmp_path / "kill-me"
    marker.write_text("x")
    sc.setLocalProperty("sparkavg.test.kill_marker", str(marker))
    try:
        crashed = small_net(seed=16)
        SparkTrainer(sc, crashed, master).fit(rdd)
    finally:
        sc.setLocalProperty("sparkavg.test.kill_marker", None)
    assert not marker.exists() and (tmp_path / "kill-me.claimed").exists()  # a worker really died
    np.testing.assert_allclose(crashed.params, clean.params, rtol=1e-6, atol=1e-7)


def test_broadcasts_are_destroyed_so_memory_stays_flat(sc):
    x, y = blobs(200, seed=17)
    rdd = sc.parallelize(_pairs(x, y), 2)
    temp = sc._temp_dir
    before = len(glob.glob(os.path.join(temp, "**"), recursive=True))
    master = ParameterAveraging(batch_size_per_worker=4, averaging_frequency=1, workers=2)
    trainer = SparkTrainer(sc, small_net(seed=18), master)
    trainer.fit(rdd, epochs=1)  # 25 rounds
    assert trainer.history[0]["rounds"] == 25
    after = len(glob.glob(os.path.join(temp, "**"), recursive=True))
    assert after - before <= 1, f"broadcast files leaked: {after - before}"


def test_worker_process_freezes_its_long_lived_heap(sc):
    """After its first network build a Python worker freezes what is alive
    (PySpark gc.collect()s after every reused task) and still collects the
    cyclic garbage of later tasks."""
    config = small_net(seed=3).to_json()

    def probe(_):
        import gc

        from sparkavg.spark.executor.context import cached_network

        cached_network(config)
        frozen = gc.get_freeze_count()
        cycle = []
        cycle.append(cycle)  # garbage made after the freeze ...
        del cycle
        collected = gc.collect()  # ... is still found
        yield frozen, collected

    for frozen, collected in sc.parallelize(range(2), 2).mapPartitions(probe).collect():
        assert frozen > 1000
        assert collected >= 1


def test_session_helpers(sc, caplog):
    from sparkavg.spark import check_session, recommended_conf
    from sparkavg.spark.session import size_bytes

    assert [size_bytes(s) for s in ("1m", "512k", "1048576", "2gb", "3G")] == [1 << 20, 512 << 10, 1 << 20,
                                                                               2 << 30, 3 << 30]
    for bad in ("", "m", "1.5m", "12q"):
        with pytest.raises(ValueError, match="Spark size"):
            size_bytes(bad)
    local, cluster = recommended_conf("local[2]"), recommended_conf("spark://h:7077")
    assert local["spark.task.maxDirectResultSize"] == cluster["spark.task.maxDirectResultSize"] == "128m"
    assert local["spark.python.unix.domain.socket.enabled"] == "true"
    assert local["spark.broadcast.compress"] == cluster["spark.broadcast.compress"] == "false"
    assert "TieredStopAtLevel" in local["spark.driver.extraJavaOptions"]
    assert "spark.driver.extraJavaOptions" not in cluster
    # the test session is started with recommended_conf: LeNet's 5.2 MB results pass, 200 MB would not
    assert check_session(sc, 5_172_960)
    with caplog.at_level("WARNING", logger="sparkavg.spark.session"):
        assert not check_session(sc, 200_000_000)
    assert "spark.task.maxDirectResultSize=128m" in caplog.text
