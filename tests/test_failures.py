"""What an outside fault-injection run still broke (issue 23), on real local Spark.

Each test injects one fault and checks what the user sees and what is kept.
"""
import gc
import glob
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from sparkavg.spark import ParameterAveraging, SparkTrainer

from .nets import blobs, small_net

pytestmark = pytest.mark.spark


def _temp_files(sc) -> int:
    return len(glob.glob(os.path.join(sc._temp_dir, "**"), recursive=True))


def test_predict_outlives_its_trainer_and_is_released_with_its_rdd(sc):
    x, _ = blobs(6, seed=51)
    before = _temp_files(sc)
    # The trainer is garbage as soon as the expression is evaluated.
    out = SparkTrainer(sc, small_net(seed=51), ParameterAveraging(workers=2)).predict(sc.parallelize(list(x), 2))
    gc.collect()
    derived = out.map(lambda row: float(np.sum(row)))
    del out
    gc.collect()
    assert len(derived.collect()) == 6  # not "Attempted to use Broadcast after it was destroyed"
    assert _temp_files(sc) > before
    del derived
    gc.collect()
    assert _temp_files(sc) == before  # the shipped parameters went with the last RDD referring to them


def _rdd(sc, n=40, seed=52, parts=2):
    x, y = blobs(n, seed=seed)
    return sc.parallelize(list(zip(x, y.tolist())), parts)


class _Canceller(threading.Thread):
    """Calls ``cancel()`` each time new held tasks say they run (a retried
    attempt would hold again), until stopped."""

    def __init__(self, marker: str, cancel):
        super().__init__(daemon=True)
        self.marker, self.cancel, self.stopped, self.cancels = marker, cancel, threading.Event(), 0
        self.start()

    def run(self):
        seen: set = set()
        while not self.stopped.is_set():
            held = set(glob.glob(self.marker + ".*")) - seen
            if held:
                seen |= held
                self.cancels += 1
                self.cancel()
            self.stopped.wait(0.02)  # polls the held tasks' marker files

    def stop(self):
        self.stopped.set()
        self.join()


@pytest.mark.parametrize("master", ["averaging", pytest.param("sharing", marks=pytest.mark.slow)])
def test_a_cancelled_fit_stops_says_so_and_keeps_the_last_checkpoint(sc, tmp_path, master):
    from sparkavg.spark import GradientSharing, TrainingCancelled
    from sparkavg.spark.checkpoint import list_checkpoints
    from sparkavg.spark.executor.hooks import HOLD_MARKER

    m = (ParameterAveraging(workers=2, batch_size_per_worker=10, averaging_frequency=1) if master == "averaging"
         else GradientSharing(workers=2, batch_size_per_worker=10))
    folder = str(tmp_path / "ckpt")
    trainer = SparkTrainer(sc, small_net(seed=53), m, checkpoint_dir=folder)
    rdd = _rdd(sc)
    trainer.fit(rdd, epochs=1)
    marker = str(tmp_path / "held")
    group = f"cancel-{master}"
    sc.setJobGroup(group, "a fit cancelled by its job group", interruptOnCancel=True)
    sc.setLocalProperty(HOLD_MARKER, marker)
    try:
        canceller = _Canceller(marker, lambda: sc.cancelJobGroup(group) if master == "averaging"
                               else sc.cancelAllJobs())
        try:
            with pytest.raises(TrainingCancelled, match=r"cancelled.*epoch 2.*checkpoint of epoch 1") as info:
                trainer.fit(rdd, epochs=1)
        finally:
            canceller.stop()
    finally:
        sc.setLocalProperty(HOLD_MARKER, None)
        sc.setJobGroup("after", "after")
    assert "Job" in str(info.value) and "cancelled" in str(info.value)
    assert canceller.cancels >= 1
    assert trainer.stats.counters.get("stage_restarts", 0) == 0  # not restarted as a lost worker
    assert [c.epochs_done for c in list_checkpoints(folder)] == [1]
    assert trainer.history[-1]["epoch"] == 1


@pytest.mark.slow
def test_a_crashed_python_worker_with_no_retry_left_says_which_and_what_to_check(sc):
    from sparkavg.spark import WorkerCrashed

    trainer = SparkTrainer(sc, small_net(seed=54), ParameterAveraging(workers=2))

    def crash(row):
        os.kill(os.getpid(), signal.SIGKILL)  # every attempt: as the out-of-memory killer would
        return row

    with pytest.raises(WorkerCrashed) as info:
        trainer.evaluate(_rdd(sc).map(crash))
    text = str(info.value)
    assert "collectAndServe" not in text
    assert re.search(r"evaluation failed: the Python worker \(partition \d; task [\d.]+ of stage [\d.]+, TID \d+\) "
                     r"on executor \S+ at host \S+ crashed 4 time\(s\), no attempt left", text), text
    assert "out-of-memory" in text and "faulthandler" in text and "stderr log of executor" in text


@pytest.mark.parametrize("text, expected", [
    ("Job aborted due to stage failure: Task 2 in stage 7.0 failed 4 times, most recent failure: Lost task 2.3 in "
     "stage 7.0 (TID 31) (10.0.0.5 executor 3): ExecutorLostFailure (executor 3 exited caused by one of the "
     "running tasks) Reason: Command exited with code 137",
     r"the executor \(partition 2; task 2.3 of stage 7.0, TID 31\) on executor 3 at host 10.0.0.5 crashed 4 "
     r"time\(s\), no attempt left: exit code 137 \(killed by SIGKILL\); Spark: Command exited with code 137\. "
     r"The OS killed it, most often the out-of-memory killer: look at `dmesg` and the memory limit of 10.0.0.5; "
     r"look at the stderr log of executor 3\."),
    ("Task 0 in stage 0.0 failed 1 times, most recent failure: Lost task 0.0 in stage 0.0 (TID 0) (h1 executor "
     "driver): org.apache.spark.SparkException: Python worker exited unexpectedly (crashed): Fatal Python error: "
     "Segmentation fault\n\nCurrent thread 0x7f (most recent call first):\n  File \"/app/udf.py\", line 12 in crash",
     r"the Python worker \(partition 0; .*\) on executor driver at host h1 crashed 1 time\(s\), no attempt left: "
     r"fatal signal: Segmentation fault\. Native code crashed in the worker \(innermost Python frame: "
     r"/app/udf.py:12 in crash\); look at the stderr log of executor driver\."),
])
def test_crash_descriptions_name_the_exit_code_or_signal(text, expected):
    from sparkavg.spark.errors import describe_crash

    assert re.fullmatch(expected, describe_crash(text)), describe_crash(text)
    assert describe_crash("org.apache.spark.SparkException: Job aborted: something else") is None


def test_cancellation_reasons_are_read_from_sparks_text():
    from sparkavg.spark.errors import cancellation

    assert cancellation("org.apache.spark.SparkException: [SPARK_JOB_CANCELLED] Job 3 cancelled part of cancelled "
                        "job group g SQLSTATE: XXKDA\n\tat org") == "Job 3 cancelled part of cancelled job group g"
    assert cancellation("[OPERATION_CANCELED] Operation has been canceled.").startswith("OPERATION_CANCELED")
    assert cancellation("Job aborted due to stage failure: Task 0 in stage 1.0 failed 4 times") is None


@pytest.mark.parametrize("field, value, expected", [
    ("stall_timeout", float("inf"), "Expect stall_timeout as a finite number of seconds, got float inf"),
    ("retransmit_timeout", float("nan"), "Expect retransmit_timeout as a finite number of seconds, got float nan"),
    ("send_window_messages", 2.5, "Expect send_window_messages as an int, got float 2.5"),
    ("max_message_bytes", 1e6, "Expect max_message_bytes as an int, got float 1000000.0"),
])
def test_transport_limits_refuse_infinite_timeouts_and_fractional_sizes(field, value, expected):
    from sparkavg.transport.limits import endpoint_limits

    with pytest.raises(ValueError, match=re.escape(expected)):
        endpoint_limits({field: value})


@pytest.mark.slow
def test_a_second_concurrent_fit_on_one_trainer_is_refused(sc, tmp_path):
    from sparkavg.spark import TrainingCancelled
    from sparkavg.spark.executor.hooks import HOLD_MARKER

    trainer = SparkTrainer(sc, small_net(seed=55), ParameterAveraging(workers=2, batch_size_per_worker=10))
    rdd = _rdd(sc)
    marker = str(tmp_path / "held")
    outcome = {}

    def first():
        sc.setJobGroup("first-fit", "held until cancelled")
        sc.setLocalProperty(HOLD_MARKER, marker)
        try:
            trainer.fit(rdd, epochs=1)
        except Exception as exc:
            outcome["first"] = exc

    thread = threading.Thread(target=first)
    thread.start()
    deadline = time.monotonic() + 60
    while not glob.glob(marker + ".*") and time.monotonic() < deadline:
        time.sleep(0.02)  # polls until the first fit's round runs (held)
    watchdog = threading.Timer(30, sc.cancelAllJobs)  # a second fit let through would wait for the held slots
    watchdog.start()
    try:
        with pytest.raises(RuntimeError, match=r"Expect one fit at a time on a trainer, got a second concurrent fit"):
            trainer.fit(rdd, epochs=1)
    finally:
        watchdog.cancel()
        sc.cancelJobGroup("first-fit")
        thread.join(60)
    assert isinstance(outcome.get("first"), TrainingCancelled)
    assert trainer.history == []
    trainer.close()
    assert trainer._prepared is None


@pytest.mark.slow
def test_overwrite_checkpoints_removes_the_old_runs_later_epochs(sc, tmp_path):
    from sparkavg.spark.checkpoint import list_checkpoints

    folder = str(tmp_path / "ckpt")
    master = ParameterAveraging(workers=2, batch_size_per_worker=10, averaging_frequency=2)
    rdd = _rdd(sc)
    old = SparkTrainer(sc, small_net(seed=56), master, checkpoint_dir=folder)
    old.fit(rdd, epochs=2)
    new = SparkTrainer(sc, small_net(seed=57), master, checkpoint_dir=folder)
    new.fit(rdd, epochs=1, overwrite_checkpoints=True)
    found = list_checkpoints(folder)
    assert [(c.run_id, c.epochs_done) for c in found] == [(new.run_id, 1)], (old.run_id, found)


def test_a_trainer_refuses_a_non_network_and_a_non_path_checkpoint_dir_at_construction(sc):
    with pytest.raises(TypeError, match=r"Expect a model \(sparkavg.nn.Network, Graph, .*\), "
                                        r"got str 'notanet' \(it lacks \["):
        SparkTrainer(sc, "notanet")
    with pytest.raises(TypeError, match=r"Expect checkpoint_dir as a folder path \(str or os.PathLike\) or None, "
                                        r"got int 123"):
        SparkTrainer(sc, small_net(seed=58), checkpoint_dir=123)


def _checkpoints(folder, net, master, epochs, runner_state=None):
    """``epochs`` checkpoints of one run of ``net`` (as a fit writes them), without a fit."""
    from sparkavg.spark.checkpoint import save_checkpoint

    for done in range(1, epochs + 1):
        net.epoch = done
        save_checkpoint(folder, net, run_id="oldrun", epochs_done=done, target_epochs=epochs,
                        master=master.to_config(), extra={"history": [{"epoch": e} for e in range(1, done + 1)]},
                        runner_state=runner_state)


def _untouched(trainer, params, run_id):
    np.testing.assert_array_equal(trainer.network.params, params)
    assert trainer.epochs_done == 0 and trainer.network.iteration == 0
    assert trainer.run_id == run_id and trainer.history == []
    assert trainer._runner.state_dict() == {}


def test_a_resume_that_cannot_restore_everything_restores_nothing_and_names_the_file(sc, tmp_path):
    from sparkavg.nn import SGD, Dense, Network, Output
    from sparkavg.spark.checkpoint import CheckpointError

    master = ParameterAveraging(workers=2, batch_size_per_worker=10)
    folder = str(tmp_path / "bad-runner")
    _checkpoints(folder, small_net(seed=60), master, 1, runner_state={"bogus": np.zeros(3, np.float32)})
    trainer = SparkTrainer(sc, small_net(seed=61), master)
    params, run_id = trainer.network.params.copy(), trainer.run_id
    with pytest.raises(CheckpointError, match=r"no loadable checkpoint .*epoch-00001/runner\.npz: .*unknown keys "
                                              r"\['bogus'\]"):
        trainer.fit(_rdd(sc), epochs=2, resume_from=folder)
    _untouched(trainer, params, run_id)

    # The same architecture with another updater: Adam's state (2 x params) does not fit SGD's (none).
    folder = str(tmp_path / "other-updater")
    _checkpoints(folder, small_net(seed=62), master, 1)
    sgd = Network((1, 4, 4), [Dense(8, activation="relu"), Output(2)], updater=SGD(lr=0.1), seed=63)
    trainer = SparkTrainer(sc, sgd, master)
    params, run_id = sgd.params.copy(), trainer.run_id
    with pytest.raises(CheckpointError, match=r"epoch-00001/network\.npz: .*updater state of 2?\d+ values.*"
                                              r"the trainer's model has 0 \(another updater"):
        trainer.fit(_rdd(sc), epochs=2, resume_from=folder)
    _untouched(trainer, params, run_id)


def test_a_resume_falls_back_past_a_checkpoint_with_a_damaged_runner_state(sc, tmp_path, caplog):
    master = ParameterAveraging(workers=2, batch_size_per_worker=10)
    folder = str(tmp_path / "ckpt")
    saved = small_net(seed=64)
    _checkpoints(folder, saved, master, 2, runner_state={"block_momentum_delta": np.zeros(saved.num_params,
                                                                                          np.float32)})
    with open(os.path.join(folder, "epoch-00002", "runner.npz"), "r+b") as fh:
        fh.truncate(64)  # a crash while writing it
    trainer = SparkTrainer(sc, small_net(seed=65), master)
    with caplog.at_level("WARNING", logger="sparkavg.spark.checkpoint"):
        trainer.fit(_rdd(sc), epochs=3, resume_from=folder)
    assert re.search(r"cannot resume .*epoch-00002/runner\.npz.*trying an older checkpoint", caplog.text), caplog.text
    assert trainer.run_id == "oldrun" and [h["epoch"] for h in trainer.history] == [1, 2, 3]


_SIGTERMED_FIT = textwrap.dedent("""
    import signal, sys
    from pyspark import SparkConf, SparkContext
    from sparkavg.spark import DataOptions, ParameterAveraging, SparkTrainer
    from sparkavg.spark.executor.hooks import HOLD_MARKER
    from tests.nets import blobs, small_net

    shared, marker = sys.argv[1], sys.argv[2]
    sc = SparkContext(conf=SparkConf().setMaster("local[2]").setAppName("sigterm")
                      .set("spark.ui.enabled", "false").set("spark.driver.host", "127.0.0.1"))
    x, y = blobs(40, seed=66)
    rdd = sc.parallelize(list(zip(x, y.tolist())), 2)
    master = ParameterAveraging(workers=2, batch_size_per_worker=10, data=DataOptions(shared_dir=shared))
    with SparkTrainer(sc, small_net(seed=66), master) as trainer:
        trainer.fit(rdd, epochs=1)
    print("handler after a fit:", signal.getsignal(signal.SIGTERM) is signal.SIG_DFL, flush=True)
    sc.setLocalProperty(HOLD_MARKER, marker)  # the round's tasks hold until the process ends
    SparkTrainer(sc, small_net(seed=66), master).fit(rdd, epochs=1)
    print("the held fit returned", flush=True)
""")


@pytest.mark.slow
def test_sigterm_during_a_fit_removes_its_exported_files_and_still_terminates(tmp_path):
    shared, marker = tmp_path / "shared", tmp_path / "held"
    shared.mkdir()
    repo = Path(__file__).resolve().parent.parent
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
               PYTHONPATH=os.pathsep.join([str(repo), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen([sys.executable, "-c", _SIGTERMED_FIT, str(shared), str(marker)], cwd=repo, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not glob.glob(f"{marker}.*") and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)  # polls until the held round runs
        exported = glob.glob(str(shared / "sparkavg-*" / "*.minibatch"))
        assert exported, f"no minibatch file while the fit runs (rc {proc.poll()})"
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == -signal.SIGTERM, (proc.returncode, err[-3000:])
    assert "handler after a fit: True" in out and "the held fit returned" not in out
    assert os.listdir(shared) == []  # before the fix: the fit's folder and its minibatch files


@pytest.mark.slow
def test_ragged_rows_and_nan_features_are_named_on_every_classic_route(sc):
    from sparkavg.data.validation import DataValidationError

    x, y = blobs(8, seed=67)
    trainer = SparkTrainer(sc, small_net(seed=67), ParameterAveraging(workers=1, batch_size_per_worker=4))
    rows = [(x[i], int(y[i])) for i in range(8)]
    rows[3] = ([[0.0] * 8, [0.0] * 7], 1)  # 15 values as rows of 8 and 7
    for call in (trainer.evaluate, trainer.fit):
        with pytest.raises(DataValidationError, match=r"Bad features at partition 0, row 3: expected 16 values "
                                                      r"\(input shape \(1, 4, 4\)\), got a ragged nested sequence"):
            call(sc.parallelize(rows, 1))
    rows[3] = (x[3], [[1.0], [0.0, 1.0]])
    for call in (trainer.evaluate, trainer.fit):
        with pytest.raises(DataValidationError, match=r"Bad label at partition 0, row 3: expected a class index in "
                                                      r"\[0, 2\) or a one-hot row of length 2, got a ragged"):
            call(sc.parallelize(rows, 1))
    bad = x.copy()
    bad[5, 0, 1, 1] = np.nan
    with pytest.raises(Exception, match=r"DataValidationError: Bad features at partition 0, row 5: 1 NaN/inf "
                                        r"value\(s\); expected finite numbers"):
        trainer.predict(sc.parallelize([(i, bad[i]) for i in range(8)], 1)).collect()  # before: (5, [nan, nan])
    with pytest.raises(Exception, match=r"DataValidationError: Bad features at partition 0, row 2: expected 16 "
                                        r"values \(input shape \(1, 4, 4\)\), got shape \(15,\)"):
        trainer.predict(sc.parallelize([x[0], x[1], x[2].ravel()[:15]], 1)).collect()


def test_an_executor_error_keeps_its_fields_on_the_way_to_the_driver():
    """A lost peer's ranks and addresses (PeerStalledError's fields) survive the executor's marker, as Spark's
    text carries it back, and the driver rebuilds the error with them."""
    from sparkavg.spark import executor_errors
    from sparkavg.spark.errors import task_failure_guard
    from sparkavg.spark.executor import sharing  # noqa: F401 - registers the transport's errors, as a sharing fit does
    from sparkavg.transport import PeerStalledError

    with pytest.raises(PeerStalledError) as info:
        with executor_errors("gradient-sharing epoch 2"):
            try:
                with task_failure_guard(None, **{"worker rank": 0}):
                    raise PeerStalledError("rank 0: peer rank 1 at 10.0.0.2:4000 went silent", [1],
                                           [("10.0.0.2", 4000)])
            except PeerStalledError as marked:  # the executor's failure, as Spark's job error carries it
                raise RuntimeError(f"Job aborted due to stage failure: ... {marked}\n\tat org.apache.spark") from None
    assert info.value.ranks == (1,) and info.value.addresses == (("10.0.0.2", 4000),)
    assert str(info.value).startswith("rank 0: peer rank 1 at 10.0.0.2:4000 went silent [gradient-sharing epoch 2: "
                                      "worker rank 0]")


def test_a_row_the_model_refuses_is_named_by_evaluate_score_and_predict(sc):
    """An id beyond an Embedding's vocabulary passes the data checks (ids >= 0) and the model refuses it:
    evaluate, score and predict name its partition and row, in whichever chunk it came."""
    from sparkavg.data.validation import DataValidationError, row_namer
    from sparkavg.nn import SGD, Dense, Embedding, Flatten, Network, Output
    from sparkavg.spark import executor_errors
    from sparkavg.spark.executor.inference import _output

    net = Network((3,), [Embedding(10, 4), Flatten(), Dense(4, activation="relu"), Output(2)], updater=SGD(lr=0.1),
                  seed=0)
    rows = [(np.array([i % 10, 1, 2], np.float32), i % 2) for i in range(16)]
    rows[13] = (np.array([12, 1, 2], np.float32), 1)
    trainer = SparkTrainer(sc, net, ParameterAveraging(workers=1))
    trainer.eval_batch_size = 4  # the row is the second of its partition's second chunk
    expected = r"^Bad features at partition 1, row 5: Expect integer ids in \[0, 10\) in Embedding's input, got 12"
    for call in (trainer.evaluate, trainer.score):
        with pytest.raises(DataValidationError, match=expected):
            call(sc.parallelize(rows, 2))  # partition 1: rows 8 to 15
    keyed = sc.parallelize([(i, x) for i, (x, _) in enumerate(rows)], 2)
    with pytest.raises(DataValidationError, match=expected), executor_errors("prediction"):
        trainer.predict(keyed).collect()  # lazy: read inside executor_errors, sparkavg's own error
    # every row refused alike: the model's own error, with the rows it was given
    with pytest.raises(ValueError, match=r"Expect integer ids .* \[partition 1, row 4 and the 3 row\(s\) after it\]$"):
        _output(net, {"input": np.full((4, 3), 12, np.float32)}, row_namer(1, 4))


@pytest.mark.slow
def test_a_damaged_or_oversized_sparkavg_json_is_named(spark, tmp_path):
    from sparkavg.ml import NetworkEstimator, NetworkModel

    path = str(tmp_path / "model")
    NetworkModel(network=small_net(seed=68)).write().save(path)
    extra = os.path.join(path, "sparkavg.json")
    saved = open(extra).read()
    for text, expected in [
        ("{not json", r"sparkavg\.json: expected JSON text, got unreadable data \(JSONDecodeError: "),
        ("[1, 2]", r"sparkavg\.json: expected a JSON object, got list '\[1, 2\]'"),
        (saved.replace('"history": []', '"history": 5'), r"sparkavg\.json: expected 'history' as a list of "
                                                          r"per-epoch summaries, got int 5"),
        ("[" * 100_000 + "]" * 100_000, r"sparkavg\.json: expected JSON text, got unreadable data \(RecursionError"),
        ('{"format": "sparkavg.ml/1", "pad": "' + "x" * (9 << 20) + '"}',
         r"sparkavg\.json: more than 8,388,608 bytes; expected a JSON record of at most"),
    ]:
        with open(extra, "w") as fh:
            fh.write(text)
        with pytest.raises(ValueError, match=re.escape(path) + "/" + expected):
            NetworkModel.load(path)
    est = str(tmp_path / "estimator")
    NetworkEstimator(network=small_net(seed=68)).write().save(est)
    extra = os.path.join(est, "sparkavg.json")
    with open(extra) as fh:
        text = fh.read().replace('"master": {', '"master": 7, "was": {', 1)
    with open(extra, "w") as fh:
        fh.write(text)
    with pytest.raises(ValueError, match=re.escape(extra) + r": expected 'master' as a master configuration "
                                                            r"\(a JSON object\), got int 7"):
        NetworkEstimator.load(est)


def test_a_damaged_or_oversized_trainer_json_is_named_and_skipped(tmp_path, caplog):
    from sparkavg.spark.checkpoint import CheckpointError, find_resumable, list_checkpoints

    master = ParameterAveraging(workers=2, batch_size_per_worker=10)
    folder = str(tmp_path / "ckpt")
    _checkpoints(folder, small_net(seed=69), master, 3)
    meta = os.path.join(folder, "epoch-00003", "trainer.json")
    with open(meta, "w") as fh:
        fh.write('{"pad": "' + "x" * (9 << 20) + '"}')
    with open(os.path.join(folder, "epoch-00002", "trainer.json"), "w") as fh:
        fh.write('{"run_id": "oldrun", "epochs_done": [2], "master": {}, "architecture": "x"}')
    with caplog.at_level("WARNING", logger="sparkavg.spark.checkpoint"):
        assert [c.epochs_done for c in list_checkpoints(folder)] == [1]
    assert re.search(r"epoch-00003/trainer\.json: more than 8,388,608 bytes", caplog.text), caplog.text
    assert re.search(r"epoch-00002/trainer\.json: expected epochs_done as an int >= 0, got list \[2\]", caplog.text)
    with pytest.raises(CheckpointError, match=re.escape(meta) + ": more than 8,388,608 bytes"):
        find_resumable(os.path.dirname(meta), network=small_net(seed=69), master=master.to_config(), epochs=4)


def test_a_model_folder_whose_network_file_was_swapped_is_refused(spark, tmp_path):
    import shutil

    from sparkavg.ml import NetworkModel
    from sparkavg.nn import Adam, Dense, Network, Output

    relu, tanh = small_net(seed=70), Network((1, 4, 4), [Dense(8, activation="tanh"), Output(2)],
                                             updater=Adam(lr=0.01), seed=70)
    assert relu.num_params == tanh.num_params and relu.fingerprint() != tanh.fingerprint()
    path, other = str(tmp_path / "model"), str(tmp_path / "other")
    NetworkModel(network=relu).write().save(path)
    NetworkModel(network=tanh).write().save(other)
    shutil.copyfile(os.path.join(other, "network.npz"), os.path.join(path, "network.npz"))
    with pytest.raises(ValueError, match=re.escape(os.path.join(path, "network.npz")) +
                       rf" holds a model of fingerprint {tanh.fingerprint()}, but "
                       + re.escape(os.path.join(path, "sparkavg.json")) +
                       rf" records {relu.fingerprint()}: the file was replaced"):
        NetworkModel.load(path)  # before: loaded silently, with tanh units
    assert NetworkModel.load(other).network.fingerprint() == tanh.fingerprint()


@pytest.fixture
def small_disk(tmp_path):
    """A real 64 KiB filesystem (tmpfs; mounting needs root), unmounted afterwards."""
    if os.geteuid() != 0:
        pytest.skip("mounting a 64 KiB tmpfs needs root")
    folder = tmp_path / "disk"
    folder.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(folder)], check=True)
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=True)


def test_a_full_disk_during_a_checkpoint_names_the_checkpoint_and_keeps_the_older_ones(small_disk):
    import errno

    from sparkavg.spark.checkpoint import list_checkpoints, save_checkpoint

    master = ParameterAveraging(workers=2, batch_size_per_worker=10).to_config()
    net = small_net(seed=71)
    folder = str(small_disk / "ckpt")
    save_checkpoint(folder, net, run_id="r", epochs_done=1, target_epochs=2, master=master)
    with open(small_disk / "filler", "wb", buffering=0) as fh:  # what else filled the disk
        try:
            while True:
                fh.write(b"\0" * 1024)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    with pytest.raises(OSError, match=r"\[Errno 28\] cannot write the checkpoint of epoch 2 \(run r\) to "
                       + re.escape(os.path.join(folder, "epoch-00002")) + r": No space left on device "
                       r"\(writing .*epoch-00002\.tmp.*\); the checkpoints written before are intact") as info:
        save_checkpoint(folder, net, run_id="r", epochs_done=2, target_epochs=2, master=master)
    assert info.value.errno == errno.ENOSPC
    assert sorted(os.listdir(folder)) == ["epoch-00001"]  # the partial folder is removed
    assert [c.epochs_done for c in list_checkpoints(folder)] == [1]


def test_a_minibatch_with_fewer_labels_than_examples_is_a_length_mismatch():
    from sparkavg.data.validation import DataSpec, DataValidationError, rebatch_partition

    x, y = blobs(12, seed=72)
    rebatch = rebatch_partition(DataSpec.of(small_net().spec), 4)
    assert [len(b[0]["input"]) for b in rebatch(0, iter([(x[:8], y[:8])]))] == [4, 4]
    for bx, by, got in [(x[:8], y[:7], "8 examples and 7 labels"),
                        (x[:8], np.eye(2, dtype=np.float32)[y[:9]], "8 examples and 9 labels"),
                        (x[:8].reshape(8, 16), y[:1], "8 examples and 1 labels")]:
        with pytest.raises(DataValidationError, match=r"Bad minibatch at partition 3, row 4: expected one label per "
                                                      rf"example, got {got} \(x of shape \(8, "):
            list(rebatch(3, iter([(x[8], int(y[8])), (x[9], int(y[9])), (x[10], int(y[10])), (x[11], int(y[11])),
                                   (bx, by)])))


@pytest.mark.parametrize("flavour", ["classic", pytest.param("connect", marks=pytest.mark.slow)])
def test_a_pandas_frame_is_named_as_pandas(request, flavour):
    import pandas as pd

    session = request.getfixturevalue("spark" if flavour == "classic" else "connect")
    x, y = blobs(4, seed=73)
    pdf = pd.DataFrame({"features": [row.reshape(-1).tolist() for row in x], "label": y})
    trainer = SparkTrainer(session, small_net(seed=73), ParameterAveraging(workers=2))
    expected = (r"Expect a Spark Connect DataFrame \(pyspark\.sql\.connect\.dataframe\.DataFrame\) on a Spark Connect "
                r"session \(Connect has no RDDs\)" if flavour == "connect" else
                r"Expect an RDD of .*, or a Spark DataFrame")
    for call in (trainer.fit, trainer.evaluate, trainer.predict):
        with pytest.raises(TypeError, match=expected + r", got pandas\.core\.frame\.DataFrame: a pandas DataFrame "
                                                       r"lives in this process only; make it a Spark DataFrame with "
                                                       r"spark\.createDataFrame\(pdf\)"):
            call(pdf)


def test_a_float64_model_under_gradient_sharing_is_refused_on_the_driver_before_any_job(sc):
    from sparkavg.spark import GradientSharing

    net = small_net(seed=55, dtype="float64")
    before = net.params.copy()
    trainer = SparkTrainer(sc, net, GradientSharing(workers=2, batch_size_per_worker=10))
    group = "float64-sharing"
    sc.setJobGroup(group, "a float64 model under gradient sharing")
    try:
        with pytest.raises(ValueError, match=r"Expect a float32 model for GradientSharing .*got Network with float64 "
                                             r"parameters.*dtype='float32'.*ParameterAveraging"):
            trainer.fit(_rdd(sc), epochs=1)
        assert sc.statusTracker().getJobIdsForGroup(group) == [], "refused before any Spark job"
    finally:
        sc.setJobGroup("after", "after")
    assert np.array_equal(net.params, before) and net.params.dtype == np.float64
    # Parameter averaging trains the same model.
    SparkTrainer(sc, net, ParameterAveraging(workers=2, batch_size_per_worker=10)).fit(_rdd(sc), epochs=1)
    assert net.params.dtype == np.float64 and not np.array_equal(net.params, before)


class _RoundSnapshots:
    """Listener: the network's parameters and iteration after every merged round; at the end of round
    ``pause_at`` of epoch 1 it lets ``between`` go and waits for ``resume`` (a cancel lands between rounds)."""

    def __init__(self, pause_at=None):
        self.rounds, self.pause_at = [], pause_at
        self.between, self.resume = threading.Event(), threading.Event()

    def on_round_end(self, trainer, event):
        net = trainer.network
        self.rounds.append(((event["epoch"], event["round"]), net.params.copy(), net.iteration))
        if (event["epoch"], event["round"]) == (1, self.pause_at):
            self.between.set()
            self.resume.wait(60)


@pytest.mark.parametrize("how", ["cancelAllJobs", "cancelJobGroup", "another group"])
def test_a_cancel_between_averaging_rounds_stops_the_fit_before_the_next_round(sc, how):
    from sparkavg.spark import TrainingCancelled
    from sparkavg.spark.executor.hooks import AVERAGING_PATH

    net = small_net(seed=57)
    snapshots = _RoundSnapshots(pause_at=1)
    trainer = SparkTrainer(sc, net, ParameterAveraging(workers=2, batch_size_per_worker=10, averaging_frequency=1),
                           listeners=[snapshots])
    rdd = _rdd(sc, n=80)
    seen = {}

    def canceller():  # another thread, while the fit's thread is between round 1 and round 2
        snapshots.between.wait(60)
        seen["active jobs"] = sc.statusTracker().getActiveJobsIds()
        if how == "cancelAllJobs":
            sc.cancelAllJobs()
        else:
            sc.cancelJobGroup("fit-between-rounds" if how == "cancelJobGroup" else "someone-else")
        snapshots.resume.set()

    thread = threading.Thread(target=canceller, daemon=True)
    thread.start()
    sc.setJobGroup("fit-between-rounds", "a fit cancelled between its rounds")
    sc.setLocalProperty(AVERAGING_PATH, "jobs")  # rounds a job each: a cancel can land between two
    try:
        if how == "another group":
            trainer.fit(rdd, epochs=1)
        else:
            with pytest.raises(TrainingCancelled) as info:
                trainer.fit(rdd, epochs=1)
    finally:
        sc.setJobGroup("after", "after")
        sc.setLocalProperty(AVERAGING_PATH, None)
        snapshots.resume.set()
        thread.join(60)
    assert seen["active jobs"] == [], "the cancel landed when no job ran"
    rounds = len(snapshots.rounds)
    if how == "another group":  # not this fit's: it runs to its end
        assert trainer.epochs_done == 1 and rounds >= 2
        return
    message = str(info.value)
    assert f"SparkContext.{how}(" in message and "between rounds: round 2 of epoch 1 did not start" in message
    assert "holds the state after round 1 of epoch 1" in message and "stopped in epoch 1" in message
    assert rounds == 1 and trainer.epochs_done == 0 and trainer.history == []
    (_, params, iteration) = snapshots.rounds[-1]
    assert np.array_equal(net.params, params) and net.iteration == iteration > 0
    # The next fit is not cancelled by the old request.
    trainer.fit(rdd, epochs=1)
    assert trainer.epochs_done == 1


def test_trainer_cancel_from_another_thread_ends_the_fit_after_the_running_round(sc):
    from sparkavg.spark import TrainingCancelled
    from sparkavg.spark.executor.hooks import AVERAGING_PATH, SLOW_WORKER

    net = small_net(seed=58)
    snapshots = _RoundSnapshots()
    trainer = SparkTrainer(sc, net, ParameterAveraging(workers=2, batch_size_per_worker=10, averaging_frequency=1),
                           listeners=[snapshots])
    rdd = _rdd(sc, n=80)
    assert trainer.cancel() is False, "no fit runs: nothing to cancel"
    seen = {}

    def canceller():  # cancels while round 2's tasks run (each minibatch takes 0.3 s: the slow-worker hook)
        tracker = sc.statusTracker()
        deadline = time.monotonic() + 60
        while len(snapshots.rounds) < 1 or not tracker.getJobIdsForGroup("fit-cancel"):
            time.sleep(0.01)
            if time.monotonic() > deadline:
                return
        while time.monotonic() < deadline:
            active = tracker.getActiveJobsIds()
            if active:
                seen["rounds done"], seen["cancelled"] = len(snapshots.rounds), trainer.cancel()
                seen["still running"] = set(active) & set(tracker.getActiveJobsIds())
                return
            time.sleep(0.01)

    sc.setJobGroup("fit-cancel", "a fit cancelled by SparkTrainer.cancel()")
    sc.setLocalProperty(SLOW_WORKER, "0.3")
    sc.setLocalProperty(AVERAGING_PATH, "jobs")  # rounds a job each (inside one stage: test_instage.py)
    thread = threading.Thread(target=canceller, daemon=True)
    thread.start()
    try:
        with pytest.raises(TrainingCancelled, match=r"SparkTrainer.cancel\(\).*round 3 of epoch 1 did not start.*"
                                                    r"holds the state after round 2 of epoch 1"):
            trainer.fit(rdd, epochs=2)
    finally:
        sc.setLocalProperty(SLOW_WORKER, None)
        sc.setLocalProperty(AVERAGING_PATH, None)
        sc.setJobGroup("after", "after")
        thread.join(60)
    assert seen["cancelled"] is True and seen["rounds done"] == 1 and seen["still running"], \
        "cancel() landed while round 2's job ran"
    assert len(snapshots.rounds) == 2  # the running round finished and was merged
    (_, params, iteration) = snapshots.rounds[-1]
    assert np.array_equal(net.params, params) and net.iteration == iteration
    assert trainer.epochs_done == 0 and trainer.cancel() is False


def test_a_string_label_column_is_described_as_a_label_not_as_features(spark):
    from sparkavg.data.validation import DataValidationError

    x, y = blobs(8, seed=68)
    df = spark.createDataFrame([(x[i].reshape(-1).tolist(), str(y[i])) for i in range(8)],
                               "features array<float>, label string").coalesce(1)
    trainer = SparkTrainer(spark, small_net(seed=68), ParameterAveraging(workers=1, batch_size_per_worker=4))
    with pytest.raises(DataValidationError) as info:
        trainer.fit(df)
    message = str(info.value)
    assert message.startswith("Bad label column: expected a numeric column (int, long, double: one class index or "
                              "target per row), or array<float>, array<double> or an ml Vector (one-hot rows, or "
                              "several targets) (a class index in [0, 2) or a one-hot row of length 2), got string")
    assert "array<float>, array<double> or an ml Vector, got" not in message  # the features' wording


@pytest.mark.parametrize("route", ["rdd", "dataframe"])
def test_a_float64_feature_beyond_float32_is_refused_with_its_row_not_trained_into_a_divergence(spark, route):
    from sparkavg.data.validation import DataValidationError

    x, y = blobs(8, seed=69)
    wide = x.reshape(8, -1).astype(np.float64)
    wide[5, 3] = 1e39  # finite in float64, inf in float32
    trainer = SparkTrainer(spark, small_net(seed=69), ParameterAveraging(workers=1, batch_size_per_worker=4))
    if route == "rdd":
        data = spark.sparkContext.parallelize([(wide[i], int(y[i])) for i in range(8)], 1)
    else:
        data = spark.createDataFrame([(wide[i].tolist(), int(y[i])) for i in range(8)],
                                     "features array<double>, label long").coalesce(1)
    with pytest.raises(DataValidationError, match=r"^Bad features at partition 0, row 5: expected numbers a float32 "
                                                  r"holds \(\|value\| <= 3.4028235e\+38\), got 1e\+39"):
        trainer.fit(data)
    assert trainer.epochs_done == 0
    # A regression target beyond float32 is refused the same way.
    from sparkavg.nn import Dense, Network, Output

    regression = Network((1, 4, 4), [Dense(4), Output(1, activation="identity", loss="mse")], seed=70)
    targets = [1.0] * 8
    targets[2] = -1e300
    rows = spark.sparkContext.parallelize([(x[i], targets[i]) for i in range(8)], 1)
    with pytest.raises(DataValidationError, match=r"^Bad label at partition 0, row 2: expected numbers a float32 "
                                                  r"holds .* got -1e\+300"):
        SparkTrainer(spark, regression, ParameterAveraging(workers=1, batch_size_per_worker=4)).fit(rows)
