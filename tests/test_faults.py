"""Failures explain themselves and lose nothing (issue 13), on real local Spark.

Each test injects one fault and checks what the user sees and what is kept.
"""
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from sparkavg.data.validation import DataValidationError
from sparkavg.evaluation import Evaluation
from sparkavg.nn import Adam
from sparkavg.spark import (CheckpointError, DivergenceError, GradientSharing, ParameterAveraging, Recover,
                            SparkTrainer, WorkerFailure)

from .nets import blobs, small_net

pytestmark = pytest.mark.spark


def _rdd(sc, n=60, seed=41, parts=2):
    x, y = blobs(n, seed=seed)
    return sc.parallelize(list(zip(x, y.tolist())), parts)


def _jobs_in_group(sc, group):
    tracker = sc.statusTracker()
    return [tracker.getJobInfo(j) for j in tracker.getJobIdsForGroup(group)]


def _failed_tasks(sc, group) -> int:
    tracker = sc.statusTracker()
    failed = 0
    for job in _jobs_in_group(sc, group):
        for stage in job.stageIds:
            info = tracker.getStageInfo(stage)
            failed += info.numFailedTasks if info is not None else 0
    return failed


def test_executor_error_shows_its_type_message_and_place_without_retries(sc):
    trainer = SparkTrainer(sc, small_net(seed=1), ParameterAveraging(workers=2))
    sc.setJobGroup("fault-eval", "an evaluation that cannot succeed")
    try:
        # a 3-class Evaluation for a 2-output network: the executor's Evaluation.eval rejects it
        with pytest.raises(WorkerFailure, match=r"ValueError: .*\[evaluation: partition \d\]") as info:
            trainer.evaluate(_rdd(sc), evaluations=[Evaluation(3)])
    finally:
        sc.setJobGroup("after", "after")
    assert "raise ValueError(" not in str(info.value)  # the message, not a source line
    assert _failed_tasks(sc, "fault-eval") == 0  # returned as a result: Spark retried nothing


def test_bad_data_in_a_round_names_worker_and_round_and_is_not_retried(sc, tmp_path):
    x, y = blobs(40, seed=2)
    good = [(x[i], int(y[i])) for i in range(40)]
    trainer = SparkTrainer(sc, small_net(seed=2), ParameterAveraging(workers=2, batch_size_per_worker=4))
    sc.setJobGroup("fault-data", "bad data")
    try:
        with pytest.raises(DataValidationError, match=r"Bad label at partition 1, row \d+: expected a class index"):
            trainer.fit(sc.parallelize(good + [(x[0], 5)], 2))
    finally:
        sc.setJobGroup("after", "after")
    assert _failed_tasks(sc, "fault-data") == 0


def test_fresh_run_refuses_a_folder_with_another_runs_checkpoints(sc, tmp_path):
    rdd, ckpt = _rdd(sc), str(tmp_path / "ckpt")
    master = ParameterAveraging(workers=2, batch_size_per_worker=10)
    SparkTrainer(sc, small_net(seed=3), master, checkpoint_dir=ckpt).fit(rdd, epochs=2)
    with pytest.raises(CheckpointError, match=r"already holds run \w+ after epoch 2 of 2"):
        SparkTrainer(sc, small_net(seed=3), master, checkpoint_dir=ckpt).fit(rdd, epochs=2)
    # asked for: the old run is replaced
    SparkTrainer(sc, small_net(seed=3), master, checkpoint_dir=ckpt).fit(rdd, overwrite_checkpoints=True)


def test_resume_of_a_finished_run_says_so_instead_of_training_nothing(sc, tmp_path):
    rdd, ckpt = _rdd(sc), str(tmp_path / "ckpt")
    master = ParameterAveraging(workers=2, batch_size_per_worker=10)
    SparkTrainer(sc, small_net(seed=4), master, checkpoint_dir=ckpt).fit(rdd, epochs=2)
    net = small_net(seed=4)
    start = net.params.copy()
    with pytest.raises(CheckpointError, match="already has 2 epoch.* and 2 were asked for: nothing to resume"):
        SparkTrainer(sc, net, master, checkpoint_dir=ckpt).fit(rdd, epochs=2, resume_from=ckpt)
    np.testing.assert_array_equal(net.params, start)


def test_resume_with_another_architecture_or_master_is_an_error(sc, tmp_path):
    from sparkavg.nn import Dense, Network, Output

    rdd, ckpt = _rdd(sc), str(tmp_path / "ckpt")
    master = ParameterAveraging(workers=2, batch_size_per_worker=10)
    SparkTrainer(sc, small_net(seed=5), master, checkpoint_dir=ckpt).fit(rdd, epochs=1)
    other = Network((1, 4, 4), [Dense(7), Output(2)], seed=5)
    with pytest.raises(CheckpointError, match="another network architecture"):
        SparkTrainer(sc, other, master, checkpoint_dir=ckpt).fit(rdd, epochs=2, resume_from=ckpt)
    with pytest.raises(CheckpointError, match="another master configuration .*averaging_frequency"):
        SparkTrainer(sc, small_net(seed=5), ParameterAveraging(workers=2, batch_size_per_worker=10,
                                                               averaging_frequency=7),
                     checkpoint_dir=ckpt).fit(rdd, epochs=2, resume_from=ckpt)


def test_resume_falls_back_past_an_incomplete_newest_checkpoint(sc, tmp_path, caplog):
    rdd, ckpt = _rdd(sc), str(tmp_path / "ckpt")
    master = ParameterAveraging(workers=2, batch_size_per_worker=10)
    first = small_net(seed=6)
    SparkTrainer(sc, first, master, checkpoint_dir=ckpt).fit(rdd, epochs=2)
    with open(os.path.join(ckpt, "epoch-00002", "network.npz"), "r+b") as fh:
        fh.truncate(100)  # a crash while writing it
    resumed = small_net(seed=99)
    trainer = SparkTrainer(sc, resumed, master, checkpoint_dir=ckpt)
    with caplog.at_level("WARNING", logger="sparkavg.spark.checkpoint"):
        trainer.fit(rdd, epochs=3, resume_from=ckpt)
    assert "epoch-00002" in caplog.text and "trying an older checkpoint" in caplog.text
    assert trainer.network is resumed and trainer.epochs_done == 3
    assert [h["epoch"] for h in trainer.history] == [1, 2, 3]


def test_divergence_stops_with_worker_and_iteration_and_keeps_the_last_good_checkpoint(sc, tmp_path):
    rdd, ckpt = _rdd(sc, n=80), str(tmp_path / "ckpt")
    net = small_net(seed=7)
    master = ParameterAveraging(workers=2, batch_size_per_worker=10, averaging_frequency=2)
    trainer = SparkTrainer(sc, net, master, checkpoint_dir=ckpt)
    trainer.fit(rdd, epochs=1)
    good = net.params.copy()
    net.updater = Adam(lr=1e30)
    with pytest.raises(DivergenceError, match=r"non-finite .* on worker \d+, round 1 at iteration \d+"):
        trainer.fit(rdd, epochs=1)
    assert sorted(os.listdir(ckpt)) == ["epoch-00001"]  # no NaN checkpoint was written
    from sparkavg.nn import Network

    np.testing.assert_array_equal(Network.load(os.path.join(ckpt, "epoch-00001", "network.npz")).params, good)


def test_divergence_recovery_restores_and_lowers_the_learning_rate(sc):
    rdd = _rdd(sc, n=80)
    net = small_net(seed=8)
    net.updater = Adam(lr=1e20)  # NaN within two steps; 1e16 and below stays finite on this net
    trainer = SparkTrainer(sc, net, ParameterAveraging(workers=2, batch_size_per_worker=10),
                           on_divergence=Recover(max_recoveries=5, lr_factor=0.01))
    trainer.fit(rdd, epochs=1)
    assert np.all(np.isfinite(net.params)) and net.updater.lr <= 1e18
    assert trainer.epochs_done == 1 and trainer.history[0]["examples"] == 80
    assert any(d["name"] == "learning_rate" for d in trainer.stats.decisions)


def test_on_divergence_is_raise_recover_or_a_recover_policy():
    from sparkavg.fitting.divergence import divergence_policy

    assert divergence_policy("raise") is None
    assert divergence_policy("recover") == Recover() == Recover(max_recoveries=3, lr_factor=0.5)
    assert divergence_policy(Recover(max_recoveries=0)) == Recover(max_recoveries=0, lr_factor=0.5)
    for bad, message in [("retry", "Expect on_divergence 'raise', 'recover' or Recover"),
                         (True, "Expect on_divergence")]:
        with pytest.raises(ValueError, match=message):
            divergence_policy(bad)
    for kwargs, message in [({"max_recoveries": -1}, "Expect max_recoveries >= 0"),
                            ({"max_recoveries": 1.5}, "Expect max_recoveries >= 0"),
                            ({"lr_factor": 1.0}, r"Expect lr_factor in \(0, 1\)"),
                            ({"lr_factor": 0.0}, r"Expect lr_factor in \(0, 1\)"),
                            ({"lr_factor": float("nan")}, r"Expect lr_factor in \(0, 1\)")]:
        with pytest.raises(ValueError, match=message):
            Recover(**kwargs)


def test_sharing_divergence_is_not_retried_as_a_lost_worker(sc):
    net = small_net(seed=9)
    net.updater = Adam(lr=3e38)  # updates overflow the residual
    trainer = SparkTrainer(sc, net, GradientSharing(workers=2, batch_size_per_worker=10, threshold=1e-3))
    with pytest.raises(DivergenceError, match=r"worker rank \d"):
        trainer.fit(_rdd(sc, n=80), epochs=1)
    assert trainer.stats.counters.get("stage_restarts", 0) == 0


def test_a_failing_validation_pass_loses_no_trained_epoch(sc, tmp_path):
    rdd, ckpt = _rdd(sc), str(tmp_path / "ckpt")
    x, _ = blobs(4, seed=10)
    bad_validation = sc.parallelize([(x[0], 9)], 1)
    trainer = SparkTrainer(sc, small_net(seed=10), ParameterAveraging(workers=2, batch_size_per_worker=10),
                           checkpoint_dir=ckpt)
    with pytest.raises(DataValidationError, match="Bad label"):
        trainer.fit(rdd, epochs=2, validation_data=bad_validation)
    assert os.listdir(ckpt) == ["epoch-00001"]


def test_evaluate_and_score_on_empty_data_say_so(sc):
    trainer = SparkTrainer(sc, small_net(seed=11), ParameterAveraging(workers=2))
    empty = sc.parallelize([], 2)
    with pytest.raises(ValueError, match="at least one example to evaluate"):
        trainer.evaluate(empty)
    with pytest.raises(ValueError, match="at least one example to score"):
        trainer.score(empty)


def test_close_and_with_release_exports_and_predict_broadcasts(sc):
    import glob

    rdd = _rdd(sc)
    with SparkTrainer(sc, small_net(seed=12), ParameterAveraging(workers=2, batch_size_per_worker=10)) as trainer:
        trainer.fit(rdd)
        folder = trainer._prepared.location.root
        assert os.path.isdir(folder)
        before = len(glob.glob(os.path.join(sc._temp_dir, "**"), recursive=True))
        x, _ = blobs(6, seed=12)
        out = trainer.predict(sc.parallelize(list(x), 2))  # still referenced when the trainer closes
        assert len(out.collect()) == 6
        assert len(glob.glob(os.path.join(sc._temp_dir, "**"), recursive=True)) > before
    assert not os.path.exists(folder)
    assert len(glob.glob(os.path.join(sc._temp_dir, "**"), recursive=True)) == before


@pytest.mark.slow
def test_an_unclosed_trainer_leaves_nothing_at_interpreter_exit(tmp_path):
    script = textwrap.dedent(f"""
        import json, os, sys, tempfile
        sys.path.insert(0, {os.getcwd()!r})
        from pyspark.sql import SparkSession
        from sparkavg.spark import ParameterAveraging, SparkTrainer
        from tests.nets import blobs, small_net
        tempfile.tempdir = {str(tmp_path)!r}
        spark = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false").getOrCreate()
        x, y = blobs(40, seed=13)
        trainer = SparkTrainer(spark, small_net(seed=13), ParameterAveraging(workers=2, batch_size_per_worker=10))
        trainer.fit(spark.sparkContext.parallelize(list(zip(x, y.tolist())), 2))
        print(json.dumps({{"folder": trainer._prepared.location.root}}))
    """)
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=240, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    folder = json.loads(out.stdout.strip().splitlines()[-1])["folder"]
    assert folder.startswith(str(tmp_path))
    assert not os.path.exists(folder), "the export folder outlived the interpreter"


def _lose_blocks(sc, rdd) -> None:
    """Drop an RDD's blocks from every block manager, as losing their executors would."""
    sc._jsc.sc().unpersistRDD(rdd.id(), True)  # the blocks only: the RDD still counts on them


def _lose_shuffle_outputs(sc, rdd) -> None:
    """Drop the outputs of every shuffle in ``rdd``'s lineage, as losing their executors would
    (their shuffle files go with them): the next job runs those map stages again."""
    seen, todo = set(), [rdd._jrdd.rdd()]
    while todo:
        deps = todo.pop().dependencies()
        for i in range(deps.size()):
            dep = deps.apply(i)
            if dep.getClass().getSimpleName() == "ShuffleDependency" and dep.shuffleId() not in seen:
                seen.add(dep.shuffleId())
                sc._jsc.sc().cleaner().get().doCleanupShuffle(dep.shuffleId(), True)
            todo.append(dep.rdd())
    assert seen, "no shuffle in the lineage"


@pytest.mark.parametrize("master_type", [ParameterAveraging, pytest.param(GradientSharing, marks=pytest.mark.slow)])
def test_prepared_blocks_leave_the_source_behind_and_are_prepared_again_when_lost(sc, master_type, caplog):
    from sparkavg.spark import DataOptions

    rdd = _rdd(sc, n=80, seed=20)
    extra = {"averaging_frequency": 2} if master_type is ParameterAveraging else {}
    master = master_type(workers=2, batch_size_per_worker=10, data=DataOptions(placement="spark"), **extra)
    clean = SparkTrainer(sc, small_net(seed=20), master)
    clean.fit(rdd)
    clean.fit(rdd)
    trainer = SparkTrainer(sc, small_net(seed=20), master)
    trainer.fit(rdd)
    prepared = trainer._prepared
    # No epoch's task carries the parallelized collection's partitions (they hold its data).
    assert prepared.rdd.isLocallyCheckpointed()
    assert "ParallelCollectionRDD" not in prepared.rdd.toDebugString().decode()
    assert [d["value"] for d in trainer.stats.decisions if d["name"] == "data_lineage"] == ["local_checkpoint"]
    _lose_blocks(sc, prepared.rdd)
    _lose_shuffle_outputs(sc, prepared._sharded[1])  # the deal's, made from them in the last fit
    with caplog.at_level("WARNING", logger="sparkavg.spark.seam"):
        trainer.fit(rdd)
    assert "lost with an executor; preparing them again from the source" in caplog.text
    assert trainer._prepared is prepared and "ParallelCollectionRDD" not in prepared.rdd.toDebugString().decode()
    assert [h["examples"] for h in trainer.history] == [80, 80]
    assert trainer.stats.counters.get("stage_restarts", 0) == 0
    if master_type is ParameterAveraging:  # the same minibatches, dealt the same: the clean run's result
        np.testing.assert_allclose(trainer.network.params, clean.network.params, atol=1e-6)
    trainer.close()
    clean.close()
