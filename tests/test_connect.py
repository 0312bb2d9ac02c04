"""The one trainer on a Spark Connect session (a local server in its own JVM):
both masters, evaluate/score/predict, checkpoints, statistics, DataFrame
inputs through Arrow (array<float>, array<double>, ml Vector) on both
flavours, and bad rows named."""
import contextlib
import os

import numpy as np
import pytest

from sparkavg.data.validation import DataValidationError
from sparkavg.evaluation import Evaluation
from sparkavg.nn import Adam
from sparkavg.spark import (DataOptions, DivergenceError, GradientSharing, ParameterAveraging, SparkTrainer,
                            WorkerFailure)
from sparkavg.spark.connect import ConnectSpark, ShippedValue
from sparkavg.spark.seam import ClassicSpark, seam_for

from .nets import (assert_evaluation_matches_local, averaged_updater_state, blobs, fit_replicas, small_net,
                   straight_and_resumed, trained_small_net)

pytestmark = [pytest.mark.spark, pytest.mark.slow]

PLACEMENTS = {"files": DataOptions(repartition="never"),  # local master: a temp folder shared by construction
              "blocks": DataOptions(placement="spark", repartition="never")}


def _frame(session, x, y, kind="array<float>", partitions=1):
    """A DataFrame of (id, features, label) in ``partitions`` partitions, rows in order;
    ``kind="vector"``: ml Vectors, odd rows sparse (their positive entries)."""
    flat = x.reshape(len(x), -1)
    if kind == "vector":
        from pyspark.ml.linalg import Vectors, VectorUDT
        from pyspark.sql.types import LongType, StructField, StructType

        features = [Vectors.sparse(flat.shape[1], {j: float(v) for j, v in enumerate(row) if v > 0})
                    if i % 2 else Vectors.dense(row.tolist()) for i, row in enumerate(flat)]
        rows = [(i, f, int(label)) for i, (f, label) in enumerate(zip(features, y))]
        schema = StructType([StructField("id", LongType()), StructField("features", VectorUDT()),
                             StructField("label", LongType())])
    else:
        rows = [(i, row.tolist(), int(label)) for i, (row, label) in enumerate(zip(flat, y))]
        schema = f"id long, features {kind}, label long"
    return session.createDataFrame(rows, schema).coalesce(partitions)


@contextlib.contextmanager
def _mode(flavour):
    """pyspark's per-process switch (see the ``connect`` fixture), for tests that use both flavours."""
    saved = os.environ.pop("SPARK_CONNECT_MODE_ENABLED", None)
    if flavour == "connect":
        os.environ["SPARK_CONNECT_MODE_ENABLED"] = "1"
    try:
        yield
    finally:
        os.environ.pop("SPARK_CONNECT_MODE_ENABLED", None)
        if saved is not None:
            os.environ["SPARK_CONNECT_MODE_ENABLED"] = saved


def _replicas_mean(start, x, y, shards, size):
    replicas = fit_replicas(start, x, y, shards, size)
    return sum(r.params for r in replicas) / len(replicas), averaged_updater_state(start, replicas)


def test_seam_for_tells_the_flavours_apart(spark, connect):
    assert isinstance(seam_for(spark), ClassicSpark) and isinstance(seam_for(spark.sparkContext), ClassicSpark)
    seam = seam_for(connect)
    assert isinstance(seam, ConnectSpark)
    assert seam.default_parallelism == 2 and seam.local
    value = (3, np.arange(5, dtype=np.float32), None)
    shipped = seam.ship(value)
    assert isinstance(shipped, ShippedValue)
    got = shipped.value
    assert got[0] == 3 and got[2] is None and got[1].flags.writeable
    np.testing.assert_array_equal(got[1], value[1])
    with pytest.raises(TypeError, match="Connect has no RDDs"):
        SparkTrainer(connect, small_net(), ParameterAveraging(workers=2)).fit([(x, 0) for x in range(3)])


@pytest.mark.parametrize("placement", sorted(PLACEMENTS))
def test_averaging_round_is_the_weighted_mean_on_connect(connect, placement):
    x, y = blobs(16, seed=1)
    net = small_net(seed=3)
    start = net.clone()
    master = ParameterAveraging(batch_size_per_worker=4, averaging_frequency=2, workers=2,
                                data=PLACEMENTS[placement])
    trainer = SparkTrainer(connect, net, master)
    trainer.fit(_frame(connect, x, y), epochs=1)
    # Minibatches 0..3 = examples [0:4], [4:8], [8:12], [12:16]; dealt [[0, 2], [1, 3]].
    params, state = _replicas_mean(start, x, y, ([0, 2], [1, 3]), 4)
    np.testing.assert_allclose(net.params, params, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(net.updater_state, state, rtol=1e-5, atol=1e-7)
    assert net.iteration == start.iteration + 2
    assert trainer.stats.counters["examples"] == 16
    assert {e.lane for e in trainer.stats.events} > {"driver"}  # worker lanes came back through Arrow
    trainer.close()


@pytest.mark.parametrize("placement", sorted(PLACEMENTS))
def test_rounds_inside_one_barrier_mapinarrow_stage_give_the_job_paths_parameters_bit_for_bit(connect, placement):
    from sparkavg.spark.executor.hooks import AVERAGING_PATH

    x, y = blobs(54, seed=5)
    master = ParameterAveraging(batch_size_per_worker=4, averaging_frequency=3, workers=2, data=PLACEMENTS[placement])
    nets, paths = {}, {}
    for path in ("jobs", "in_stage"):
        connect.conf.set(AVERAGING_PATH, path)
        try:
            nets[path] = small_net(seed=6)
            with SparkTrainer(connect, nets[path], master) as trainer:
                trainer.fit(_frame(connect, x, y), epochs=2)
                paths[path] = [h["averaging_path"] for h in trainer.history]
        finally:
            connect.conf.unset(AVERAGING_PATH)
    assert paths == {"jobs": ["jobs", "jobs"], "in_stage": ["in_stage", "in_stage"]}
    for name in ("params", "updater", "buffers"):
        assert nets["in_stage"].state[name].tobytes() == nets["jobs"].state[name].tobytes(), name


def test_a_local_deals_epochs_on_connect_sort_one_kept_partitioning_and_train_as_the_job_path(connect, monkeypatch):
    """Rounds inside one stage on Connect blocks, a local deal shuffled every epoch: one partitioning by shard
    for the fit (not a dealt frame per epoch), each epoch's order sorted into it, the job path's bits."""
    from sparkavg.spark.executor.hooks import AVERAGING_PATH

    made = []
    dealt_frame = ConnectSpark.dealt_frame
    monkeypatch.setattr(ConnectSpark, "dealt_frame", lambda self, *a: made.append(len(a[2])) or dealt_frame(self, *a))
    x, y = blobs(54, seed=5)
    master = ParameterAveraging(batch_size_per_worker=4, averaging_frequency=3, workers=2,
                                data=DataOptions(placement="spark", repartition="local"))
    nets = {}
    for path in ("jobs", "in_stage"):
        made.clear()
        connect.conf.set(AVERAGING_PATH, path)
        try:
            nets[path] = small_net(seed=6)
            with SparkTrainer(connect, nets[path], master) as trainer:
                trainer.fit(_frame(connect, x, y, partitions=2), epochs=3)
        finally:
            connect.conf.unset(AVERAGING_PATH)
        # rounds of a job each: a dealt frame of several rounds per epoch; inside one stage: one kept partitioning
        assert made == ([3, 3, 3] if path == "jobs" else [1]), path
    for name in ("params", "updater", "buffers"):
        assert nets["in_stage"].state[name].tobytes() == nets["jobs"].state[name].tobytes(), name


def test_connect_and_classic_train_the_same_model(spark, connect):
    x, y = blobs(120, seed=2)
    master = ParameterAveraging(batch_size_per_worker=8, averaging_frequency=3, workers=2)
    nets = {}
    for name, session in (("classic", spark), ("connect", connect)):
        nets[name] = small_net(seed=4)
        with _mode(name), SparkTrainer(session, nets[name], master) as trainer:
            trainer.fit(_frame(session, x, y), epochs=2)
            assert [h["examples"] for h in trainer.history] == [120, 120]
    np.testing.assert_allclose(nets["connect"].params, nets["classic"].params, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("placement", sorted(PLACEMENTS))
def test_sharing_on_connect_learns_and_replicas_agree(connect, placement):
    x, y = blobs(400, seed=21)
    net = small_net(seed=22)
    master = GradientSharing(threshold=1e-3, batch_size_per_worker=10, workers=2, data=PLACEMENTS[placement])
    with SparkTrainer(connect, net, master) as trainer:
        df = _frame(connect, x, y)
        trainer.fit(df, epochs=2)
        assert [h["examples"] for h in trainer.history] == [400, 400]
        assert max(h["replica_max_abs_diff"] for h in trainer.history) < 1e-5
        assert trainer.evaluate(df).accuracy() > 0.9
        assert trainer.stats.counters["messages_sent"] > 0
        # Epoch 2 started from the states the ranks kept on their executors, on Connect too.
        kept = [d["value"] for d in trainer.stats.decisions if d["name"] == "sharing_state"]
        assert kept == ["shipped", "executors"] and not trainer.stats.counters.get("resident_state_misses")


def test_evaluate_score_predict_on_connect(connect):
    net, x, y = trained_small_net()
    trainer = SparkTrainer(connect, net, ParameterAveraging(workers=2))
    df = _frame(connect, x, y, partitions=3)
    assert_evaluation_matches_local(trainer, df, net, x, y)
    out = trainer.predict(df)  # a DataFrame on Connect: the input's columns plus `output`
    assert out.columns == ["id", "features", "label", "output"]
    table = out.select("id", "output").toArrow()
    got = np.stack(table.column("output").to_pylist())[np.argsort(table.column("id").to_numpy())]
    np.testing.assert_allclose(got, net.output(x), rtol=1e-5, atol=1e-6)
    trainer.close()


def test_checkpoint_resume_on_connect(connect, tmp_path):
    x, y = blobs(60, seed=13)
    df = _frame(connect, x, y)
    master = ParameterAveraging(batch_size_per_worker=6, averaging_frequency=2, workers=2)
    straight, resumed, _ = straight_and_resumed(connect, small_net, master, df, str(tmp_path / "ckpt"))
    np.testing.assert_allclose(resumed.params, straight.params, rtol=1e-5, atol=1e-6)


def test_killed_worker_on_connect_is_retried(connect, tmp_path):
    """Connect has no job-local properties: the test hook is a session conf."""
    x, y = blobs(40, seed=17)
    df = _frame(connect, x, y)
    master = ParameterAveraging(batch_size_per_worker=5, averaging_frequency=2, workers=2)
    clean = small_net(seed=18)
    SparkTrainer(connect, clean, master).fit(df)
    marker = tmp_path / "kill-me"
    marker.write_text("x")
    connect.conf.set("sparkavg.test.kill_marker", str(marker))
    try:
        crashed = small_net(seed=18)
        SparkTrainer(connect, crashed, master).fit(df)
    finally:
        connect.conf.unset("sparkavg.test.kill_marker")
    assert not marker.exists() and (tmp_path / "kill-me.claimed").exists()  # a worker really died
    np.testing.assert_allclose(crashed.params, clean.params, rtol=1e-6, atol=1e-7)


def test_test_hooks_are_read_once_per_fit_not_per_epoch(connect, monkeypatch):
    # The real session conf, only counted: every read of a hook key, and any read of all confs.
    from pyspark.sql.connect.conf import RuntimeConf

    reads = []
    real_get, real_all = RuntimeConf.get, RuntimeConf.getAll

    def get(self, key, *default):
        if key.startswith("sparkavg.test."):
            reads.append(key)
        return real_get(self, key, *default)

    monkeypatch.setattr(RuntimeConf, "get", get)
    monkeypatch.setattr(RuntimeConf, "getAll", property(lambda self: reads.append("getAll") or real_all.fget(self)))
    x, y = blobs(40, seed=19)
    trainer = SparkTrainer(connect, small_net(seed=20), ParameterAveraging(batch_size_per_worker=10, workers=2,
                                                                          averaging_frequency=2))
    trainer.fit(_frame(connect, x, y), epochs=3)
    assert trainer.epochs_done == 3
    from sparkavg.spark.executor import hooks

    assert sorted(reads) == sorted([hooks.KILL_MARKER, hooks.STALL_RANK, hooks.HOLD_MARKER, hooks.SLOW_WORKER,
                                    hooks.UDP_LOSS, hooks.STALL_TIMEOUT, hooks.RETRANSMIT_TIMEOUT,
                                    hooks.STAGE_ATTEMPTS, hooks.KILL_ROUND, hooks.AVERAGING_PATH,
                                    hooks.MEETING])  # each once


def test_executor_errors_on_connect_come_back_as_themselves(connect):
    x, y = blobs(80, seed=41)
    df = _frame(connect, x, y, partitions=2)
    net = small_net(seed=9)
    net.updater = Adam(lr=3e38)  # updates overflow the residual: a marked error fails the barrier stage
    trainer = SparkTrainer(connect, net, GradientSharing(workers=2, batch_size_per_worker=10, threshold=1e-3))
    with pytest.raises(DivergenceError, match=r"worker rank \d"):
        trainer.fit(df, epochs=1)
    assert trainer.stats.counters.get("stage_restarts", 0) == 0  # not retried as a lost worker
    trainer = SparkTrainer(connect, small_net(seed=1), ParameterAveraging(workers=2))
    # a 3-class Evaluation for a 2-output network: returned as a failure row, raised as itself
    with pytest.raises(WorkerFailure, match=r"ValueError: .*\[evaluation: partition \d\]"):
        trainer.evaluate(df, evaluations=[Evaluation(3)])


@pytest.mark.parametrize("kind", ["array<double>", "vector"])
@pytest.mark.parametrize("flavour", ["classic", "connect"])
def test_vector_and_double_features(request, flavour, kind):
    session = request.getfixturevalue("spark" if flavour == "classic" else "connect")
    x, y = blobs(48, seed=15)
    x = np.abs(x)  # sparse rows keep the positive entries only: make them all positive
    net = small_net(seed=16)
    start = net.clone()
    master = ParameterAveraging(batch_size_per_worker=8, averaging_frequency=3, workers=2,
                                data=DataOptions(repartition="never"))
    with SparkTrainer(session, net, master) as trainer:
        df = _frame(session, x, y, kind=kind)
        trainer.fit(df)
        # 6 minibatches dealt [[0, 2, 4], [1, 3, 5]]: the same model as from float32 arrays
        params, _ = _replicas_mean(start, x, y, ([0, 2, 4], [1, 3, 5]), 8)
        np.testing.assert_allclose(net.params, params, rtol=1e-5, atol=1e-6)
        assert trainer.evaluate(df) == Evaluation(2).eval(y, net.output(x))


@pytest.mark.parametrize("flavour", ["classic", "connect"])
def test_bad_rows_are_named(request, flavour):
    session = request.getfixturevalue("spark" if flavour == "classic" else "connect")
    good = [0.0] * 16
    trainer = SparkTrainer(session, small_net(), ParameterAveraging(workers=1))
    short = session.createDataFrame([(good, 1), (good, 0), (good[:15], 1)], "features array<float>, label long")
    with pytest.raises(DataValidationError, match=r"Bad features at partition 0, row 2: expected 16 values "
                                                  r"\(input shape \(1, 4, 4\)\), got shape \(15,\)"):
        trainer.fit(short.coalesce(1))
    if flavour == "connect":  # predict reads each Arrow batch as one matrix, checked against the input shape
        with pytest.raises(Exception, match=r"Bad features at partition 0, row 2: expected 16 values"):
            trainer.predict(short.coalesce(1)).toArrow()
    nan = session.createDataFrame([(good, 1), (good[:3] + [float("nan")] + good[4:], 0)],
                                  "features array<double>, label long")
    with pytest.raises(DataValidationError, match=r"Bad features at partition 0, row 1: 1 NaN/inf"):
        trainer.fit(nan.coalesce(1))
    label = session.createDataFrame([(good, 1), (good, 7)], "features array<float>, label long")
    with pytest.raises(DataValidationError, match=r"Bad label at partition 0, row 1: expected a class index"):
        trainer.fit(label.coalesce(1))
    with pytest.raises(DataValidationError, match=r"Bad label at partition 0, row 1"):
        trainer.evaluate(label.coalesce(1))


@pytest.mark.parametrize("flavour", ["classic", "connect"])
def test_a_bad_row_in_transform_predict_and_evaluate_names_its_partition_and_row(request, flavour):
    """A row the data checks refuse (a NaN) and one the model refuses (an id beyond an Embedding's
    vocabulary): evaluate raises sparkavg's error; the lazy outputs of predict and NetworkModel.transform
    raise where they are read -- inside ``executor_errors``, as sparkavg's error too --, naming partition,
    row, what was wrong and what was expected."""
    from sparkavg.ml import NetworkModel
    from sparkavg.nn import SGD, Dense, Embedding, Flatten, Network, Output
    from sparkavg.spark import executor_errors

    session = request.getfixturevalue("spark" if flavour == "classic" else "connect")
    net = Network((3,), [Embedding(10, 4), Flatten(), Dense(4, activation="relu"), Output(2)], updater=SGD(lr=0.1),
                  seed=0)
    trainer = SparkTrainer(session, net, ParameterAveraging(workers=1))
    model = NetworkModel(network=net)
    rows = [([float(i % 10), 1.0, 2.0], i % 2) for i in range(8)]
    for row, expected in ((([12.0, 1.0, 2.0], 1), r"Expect integer ids in \[0, 10\) in Embedding's input, got 12"),
                          (([1.0, float("nan"), 2.0], 1), r"1 NaN/inf value\(s\); expected finite numbers")):
        bad = session.createDataFrame(rows[:5] + [row] + rows[6:], "features array<double>, label long").coalesce(1)
        named = rf"^Bad features at partition 0, row 5: {expected}"
        with pytest.raises(DataValidationError, match=named):
            trainer.evaluate(bad)
        for output in (trainer.predict(bad), model.transform(bad)):
            with pytest.raises(DataValidationError, match=named), executor_errors("prediction"):
                output.collect()
    trainer.close()


@pytest.mark.parametrize("master_type", [ParameterAveraging, GradientSharing])
def test_a_transform_runs_alike_on_connect_and_classic(spark, connect, master_type):
    import shutil

    from .data_transforms import LOG
    from .test_transforms import FLIP, _calls, _clear

    x, y = blobs(80, seed=40)
    extra = {"averaging_frequency": 2} if master_type is ParameterAveraging else {}
    master = master_type(batch_size_per_worker=10, workers=2, seed=5, data=DataOptions(transform=FLIP), **extra)
    nets, calls = {}, {}
    try:
        for name, session in (("classic", spark), ("connect", connect)):
            _clear()
            nets[name] = small_net(seed=41)
            with _mode(name), SparkTrainer(session, nets[name], master) as trainer:
                trainer.fit(_frame(session, x, y), epochs=2)
            calls[name] = _calls()
    finally:
        shutil.rmtree(LOG, ignore_errors=True)
    for name, noted in calls.items():
        assert len(noted) == 16 and all(c["pid"] != os.getpid() for c in noted), name
        assert len({c["draw"] for c in noted}) == 16, name
    assert sorted(c["draw"] for c in calls["connect"]) == sorted(c["draw"] for c in calls["classic"])
    np.testing.assert_allclose(nets["connect"].params, nets["classic"].params, rtol=1e-5, atol=1e-6)


def test_interrupt_all_between_rounds_on_connect_stops_the_fit_before_the_next_round(connect):
    import threading

    from sparkavg.spark import TrainingCancelled
    from sparkavg.spark.executor.hooks import AVERAGING_PATH

    class Pause:  # between round 1 and round 2 the fit's thread waits for the interrupt
        def __init__(self):
            self.between, self.resume, self.rounds = threading.Event(), threading.Event(), []

        def on_round_end(self, trainer, event):
            self.rounds.append((trainer.network.params.copy(), trainer.network.iteration))
            if event["round"] == 1:
                self.between.set()
                self.resume.wait(60)

    pause = Pause()

    def interrupt():
        pause.between.wait(60)
        connect.interruptAll()
        pause.resume.set()

    x, y = blobs(80, seed=43)
    net = small_net(seed=44)
    trainer = SparkTrainer(connect, net, ParameterAveraging(batch_size_per_worker=10, workers=2, averaging_frequency=1),
                           listeners=[pause])
    thread = threading.Thread(target=interrupt, daemon=True)
    thread.start()
    connect.conf.set(AVERAGING_PATH, "jobs")  # rounds a job each: an interrupt can land between two
    try:
        with pytest.raises(TrainingCancelled, match=r"SparkSession.interruptAll\(\).*round 2 of epoch 1 did not start"):
            trainer.fit(_frame(connect, x, y, partitions=2), epochs=1)
    finally:
        connect.conf.unset(AVERAGING_PATH)
        pause.resume.set()
        thread.join(60)
    params, iteration = pause.rounds[-1]
    assert len(pause.rounds) == 1 and np.array_equal(net.params, params) and net.iteration == iteration
