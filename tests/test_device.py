"""Where executors train: the device choice (auto / gpu / cpu) from Spark's
GPU assignment, tested without a GPU.

The pure tests call :func:`select_device` with task resources as Spark
gives them.  The Spark tests run on a ``local-cluster`` whose executor has
two GPU addresses from a discovery script (Spark's own resource scheduling,
no GPU needed): every task gets its own address, ``auto`` falls back to the
CPU with the reason recorded, ``gpu`` fails with a clear permanent error and
``cpu`` never looks.  Executors there see ``CUDA_VISIBLE_DEVICES=""``, so
CuPy is unusable on them even on a machine with a GPU.
"""
import json
import re
import logging
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from sparkavg import backend
from sparkavg.configurable import ConfigError
from sparkavg.spark.errors import is_permanent, raise_failures
from sparkavg.spark.executor import device as device_mod
from sparkavg.spark.executor.device import (DeviceChoice, DeviceError, cuda_ordinal, gpu_addresses, log_choice,
                                            select_device, summarize_devices, task_device)
from sparkavg.spark.masters import Device

REPO = Path(__file__).resolve().parents[1]


class _Unreadable(dict):
    """Task resources that fail the test when read."""

    def get(self, *args):
        raise AssertionError("device='cpu' read the task's resources")

    __getitem__ = get


# ------------------------------------------------------------ pure choice
def test_auto_without_a_gpu_resource_is_the_cpu():
    for resources in (None, {}, {"gpu": []}, {"fpga": ["0"]}):
        choice = select_device("auto", resources)
        assert (choice.kind, choice.index, choice.address) == ("cpu", None, None)
        assert "no GPU assigned to this task by Spark" in choice.reason


def test_auto_with_an_address_cupy_cannot_use_falls_back_with_the_reason():
    # Address 99: CuPy is missing here, and on a GPU machine no device 99 is visible.
    choice = select_device(Device.AUTO, {"gpu": ["99"]})
    assert (choice.kind, choice.index, choice.address) == ("cpu", None, "99")
    assert "Spark assigned this task a GPU" in choice.reason and "CuPy cannot use it" in choice.reason
    if backend.available():
        assert "CUDA device 99 is not visible" in choice.reason
    else:
        assert backend.unavailable_reason() in choice.reason  # the backend's helpful text


def test_gpu_without_an_assignment_says_how_to_request_one():
    with pytest.raises(DeviceError) as info:
        select_device("gpu", {"fpga": ["0"]})
    text = str(info.value)
    assert "Expect a GPU assigned to this task by Spark for device='gpu', got none" in text
    assert "'fpga'" in text  # what Spark did assign
    for setting in ("spark.task.resource.gpu.amount", "spark.executor.resource.gpu.amount", "discoveryScript"):
        assert setting in text
    assert "\n" not in text  # one line: the driver rebuilds it from a traceback line


def test_gpu_with_an_unusable_address_is_a_permanent_device_error():
    with pytest.raises(DeviceError, match="Spark assigned this task GPU address '99'") as info:
        select_device("gpu", {"gpu": ["99"]})
    assert isinstance(info.value, ConfigError) and is_permanent(info.value)


def test_cpu_never_reads_the_resources():
    choice = select_device("cpu", _Unreadable(gpu=["0"]))
    assert choice.name == "cpu" and "device='cpu' requested" in choice.reason


def test_unknown_device_names_the_choices():
    with pytest.raises(ValueError, match=r"Expect device in \{'auto', 'gpu', 'cpu'\}, got 'tpu'"):
        select_device("tpu", {})


def test_tasks_get_the_device_as_a_plain_str_with_the_masters_values():
    # The executor side never imports the driver's enum: a task gets one plain str.
    assert tuple(d.value for d in Device) == device_mod.DEVICES
    assert "masters" not in device_mod.__dict__ and not hasattr(device_mod, "Device")
    for d in Device:
        assert type(device_mod.as_device(d)) is str and device_mod.as_device(d) == d.value


def test_resource_information_and_plain_lists_both_read():
    from pyspark.resource import ResourceInformation

    assert gpu_addresses({"gpu": ResourceInformation("gpu", ["1", "3"])}) == ["1", "3"]
    assert gpu_addresses({"gpu": [0, 2]}) == ["0", "2"]
    several = select_device("auto", {"gpu": ResourceInformation("gpu", ["99", "98"])})
    assert several.address == "99" and "the first of 2 assigned" in several.reason


def test_cuda_ordinal_follows_cuda_visible_devices():
    assert cuda_ordinal("1", None) == 1
    assert cuda_ordinal("2", "2,3") == 0  # CUDA renumbers the visible devices from 0
    assert cuda_ordinal("3", "2, 3") == 1
    assert cuda_ordinal("GPU-5f0e", "GPU-aa01,GPU-5f0e") == 1
    assert cuda_ordinal("0", "2,3") == 0  # not listed: the address is the ordinal
    for bad in ("GPU-5f0e", "-1", "x"):
        with pytest.raises(ValueError, match=f"got '{bad}'"):
            cuda_ordinal(bad, None)


def test_device_choice_checks_its_fields():
    with pytest.raises(ValueError, match="Expect kind 'cpu' or 'gpu'"):
        DeviceChoice("tpu", None, "why")
    with pytest.raises(ValueError, match="index exactly for kind 'gpu'"):
        DeviceChoice("gpu", None, "why")
    assert DeviceChoice("gpu", 1, "why", "1").name == "gpu:1"


def test_outside_spark_auto_is_the_cpu_and_cpu_is_the_cpu():
    assert task_device("auto").name == "cpu"
    assert task_device("cpu").name == "cpu"
    if backend.available():
        assert task_device("gpu").index == backend.current_device()
    else:
        with pytest.raises(DeviceError, match="Expect CuPy with a CUDA device for device='gpu'"):
            task_device("gpu")


def test_choice_is_logged_at_info_once_per_process(caplog):
    choice = DeviceChoice("cpu", None, f"a reason only this test gives ({time.monotonic_ns()})")
    with caplog.at_level(logging.DEBUG, logger=device_mod.__name__):
        assert log_choice(choice) is True
        assert log_choice(DeviceChoice("cpu", None, choice.reason, "1")) is False
    levels = [r.levelno for r in caplog.records if choice.reason in r.getMessage()]
    assert levels == [logging.INFO, logging.DEBUG]


def test_summary_groups_workers_by_reason_and_lists_addresses():
    fallback = select_device("auto", {"gpu": ["98"]})
    entries = [fallback.to_plain(0), select_device("auto", {"gpu": ["99"]}).to_plain(1)]
    value, reason = summarize_devices(entries)
    assert value == "cpu"
    assert reason == f"cpu on worker(s) 0, 1 (Spark GPU addresses 98, 99): {fallback.reason}"
    gpu = DeviceChoice("gpu", 0, "the task's Spark-assigned GPU", "0").to_plain(2)
    assert summarize_devices(entries + [gpu])[0] == "mixed"
    with pytest.raises(ValueError, match="at least one device entry"):
        summarize_devices([])


class _Shipped:
    """What a task reads from a Spark broadcast: ``.value``."""

    def __init__(self, value):
        self.value = value


def _chunked_outputs(net, x, batch_size):
    """What ``predict`` computed before it had a device: the host network over ``x`` chunk by chunk."""
    return np.concatenate([net.output(x[s:s + batch_size]) for s in range(0, len(x), batch_size)])


def test_predict_on_the_cpu_and_auto_without_a_gpu_is_the_host_networks_output():
    from sparkavg.spark.executor.inference import make_predict_fn
    from sparkavg.spark.runners.base import network_state

    from .nets import blobs, small_net

    net = small_net(seed=21)
    x, y = blobs(45, seed=22)
    net.fit_batch(x, y)
    shipped = _Shipped(network_state(net, with_updater=False))
    want = _chunked_outputs(net, x, 16)
    for device in ("cpu", "auto"):  # auto outside a Spark task: no GPU assigned, the CPU
        predict = make_predict_fn(net.to_json(), shipped, 16, None, device)()
        got = predict({"input": x})
        assert isinstance(got, np.ndarray) and got.shape == (45, 2)
        np.testing.assert_array_equal(got, want)
    if not backend.available():
        with pytest.raises(DeviceError, match="Expect CuPy with a CUDA device for device='gpu'"):
            make_predict_fn(net.to_json(), shipped, 16, None, "gpu")()


# ------------------------------------------------- Spark resource scheduling
DISCOVERY = '#!/bin/sh\necho \'{"name": "gpu", "addresses": ["0", "1"]}\'\n'


def _cluster_scenarios(workdir: str) -> None:
    """Run in a separate driver process (a SparkContext per process): a
    local-cluster with 2 GPU addresses per executor; results to result.json."""
    from pyspark import TaskContext
    from pyspark.sql import SparkSession

    from sparkavg.spark import GradientSharing, ParameterAveraging, SparkTrainer, recommended_conf
    from sparkavg.spark.executor.averaging import make_round_task
    from sparkavg.spark.runners.base import network_state

    from tests.nets import blobs, small_net

    work = Path(workdir)
    logging.basicConfig(filename=str(work / "driver.log"), level=logging.WARNING,
                        format="%(levelname)s %(name)s %(message)s")
    logging.getLogger("sparkavg").setLevel(logging.INFO)
    script = str(work / "gpus.sh")
    builder = SparkSession.builder.master("local-cluster[1,2,1024]").appName("sparkavg-device-tests")
    for key, value in {**recommended_conf("local-cluster"),
                       "spark.ui.enabled": "false",
                       "spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1",
                       "spark.local.dir": str(work / "local"),
                       "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1",
                       "spark.executor.extraJavaOptions": "-XX:TieredStopAtLevel=1",
                       "spark.python.worker.reuse": "true",
                       "spark.worker.resource.gpu.amount": "2",
                       "spark.worker.resource.gpu.discoveryScript": script,
                       "spark.executor.resource.gpu.amount": "2",
                       "spark.executor.resource.gpu.discoveryScript": script,
                       "spark.task.resource.gpu.amount": "1",
                       "spark.executorEnv.CUDA_VISIBLE_DEVICES": ""}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    sc = spark.sparkContext
    sc.setLogLevel("ERROR")
    out: dict = {}

    def failed_tasks(group: str) -> int:
        tracker = sc.statusTracker()
        stages = [s for j in tracker.getJobIdsForGroup(group) for s in tracker.getJobInfo(j).stageIds]
        return sum(tracker.getStageInfo(s).numFailedTasks for s in stages)

    def error(exc) -> dict:
        return {"type": type(exc).__name__, "message": str(exc), "permanent": is_permanent(exc)}

    def assigned(barrier: bool):
        def run(it):
            ctx = TaskContext.get()
            choice = task_device("auto", ctx)
            yield {"partition": ctx.partitionId(), "assigned": list(ctx.resources()["gpu"].addresses),
                   "choice": choice.to_plain(ctx.partitionId())}
        rdd = sc.parallelize(range(2 if barrier else 4), 2 if barrier else 4)
        return (rdd.barrier() if barrier else rdd).mapPartitions(run).collect()

    x, y = blobs(64, seed=5)
    pairs = list(zip(x, y.tolist()))
    try:
        out["barrier"] = assigned(True)
        out["tasks"] = assigned(False)

        trainer = SparkTrainer(sc, small_net(seed=6), ParameterAveraging(
            batch_size_per_worker=8, averaging_frequency=2, workers=2))
        trainer.fit(sc.parallelize(pairs, 2), epochs=1)
        out["auto_decisions"] = trainer.stats.decisions
        # Inference runs where training does: auto on the assigned (unusable) GPUs falls back to the CPU ...
        predicted = np.stack(trainer.predict(sc.parallelize(list(x), 2)).collect())
        out["auto_predict_error"] = float(np.abs(predicted - trainer.network.output(x)).max())
        # ... and device='gpu' evaluation fails as training does: a permanent DeviceError on the driver.
        sc.setJobGroup("gpu-evaluate", "device='gpu' in an evaluation")
        trainer = SparkTrainer(sc, trainer.network, ParameterAveraging(workers=2, device="gpu"))
        try:
            trainer.evaluate(sc.parallelize(pairs, 2))
            out["gpu_evaluate"] = {"type": None}
        except Exception as exc:
            out["gpu_evaluate"] = error(exc)
        out["gpu_evaluate"]["failed_tasks"] = failed_tasks("gpu-evaluate")
        sc.setJobGroup("other", "")

        trainer = SparkTrainer(sc, small_net(seed=7), GradientSharing(
            batch_size_per_worker=8, workers=2, device="cpu"))
        trainer.fit(sc.parallelize(pairs, 2), epochs=1)
        out["cpu_decisions"] = trainer.stats.decisions

        sc.setJobGroup("gpu-sharing", "device='gpu' on a gradient-sharing fit")
        trainer = SparkTrainer(sc, small_net(seed=8), GradientSharing(batch_size_per_worker=8, workers=2,
                                                                      device="gpu"))
        try:
            trainer.fit(sc.parallelize(pairs, 2), epochs=1)
            out["gpu_sharing"] = {"type": None}
        except Exception as exc:
            out["gpu_sharing"] = error(exc)
        out["gpu_sharing"]["failed_tasks"] = failed_tasks("gpu-sharing")
        out["gpu_sharing"]["stage_restarts"] = trainer.stats.counters.get("stage_restarts", 0)

        sc.setJobGroup("gpu-round", "device='gpu' in an averaging round task")
        net = small_net(seed=9)
        shipped = sc.broadcast(network_state(net, with_updater=True))
        task = make_round_task(net.to_json(), shipped, round_no=1, save_updater=True, uniform=False,
                               collect_stats=False, prefetch=0, device="gpu")
        minibatches = [({"input": x[:8]}, y[:8]), ({"input": x[8:16]}, y[8:16])]  # inputs by name
        results = sc.parallelize(minibatches, 2).mapPartitions(task).collect()
        out["gpu_round"] = {"results": [type(r).__name__ for r in results]}
        try:
            raise_failures(results, "averaging round 1")
        except Exception as exc:
            out["gpu_round"].update(error(exc))
        out["gpu_round"]["failed_tasks"] = failed_tasks("gpu-round")
        sc.setJobGroup("other", "")
    finally:
        (work / "result.json").write_text(json.dumps(out, default=str))
        spark.stop()


@pytest.fixture(scope="session")
def gpu_cluster(tmp_path_factory):
    """The scenarios' results and driver log, from one local-cluster driver process."""
    import pyspark

    work = tmp_path_factory.mktemp("gpu_cluster")
    script = work / "gpus.sh"
    script.write_text(DISCOVERY)
    script.chmod(0o755)
    # SPARK_HOME: pyspark's own folders, linked, so that local-cluster's work dir lands under tmp.
    home = work / "spark_home"
    home.mkdir()
    for name in ("bin", "jars", "python", "sbin"):
        target = Path(pyspark.__file__).parent / name
        if target.exists():
            (home / name).symlink_to(target)
    env = dict(os.environ, SPARK_HOME=str(home), PYSPARK_PYTHON=sys.executable,
               PYSPARK_DRIVER_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1",
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    code = textwrap.dedent(f"""
        from tests.test_device import _cluster_scenarios
        _cluster_scenarios({str(work)!r})
    """)
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    result = work / "result.json"
    if proc.returncode != 0 or not result.exists():
        pytest.fail(f"the local-cluster driver failed (rc {proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(result.read_text()), (work / "driver.log").read_text()


@pytest.mark.spark
@pytest.mark.slow
def test_each_task_sees_its_own_spark_assigned_gpu(gpu_cluster):
    out, _ = gpu_cluster
    for run in out["barrier"] + out["tasks"]:
        assert len(run["assigned"]) == 1  # spark.task.resource.gpu.amount=1
        assert run["choice"]["address"] == run["assigned"][0]
    # The two tasks of a barrier stage run at once on the executor's two GPUs: one each.
    assert sorted(r["choice"]["address"] for r in out["barrier"]) == ["0", "1"]


@pytest.mark.spark
@pytest.mark.slow
def test_auto_falls_back_to_the_cpu_with_the_reason_recorded_and_logged(gpu_cluster):
    out, log = gpu_cluster
    for run in out["barrier"] + out["tasks"]:
        assert run["choice"]["kind"] == "cpu"
        assert "CuPy cannot use it" in run["choice"]["reason"]
    decisions = [d for d in out["auto_decisions"] if d["name"] == "device"]
    assert len(decisions) == 1, decisions  # once per fit
    d = decisions[0]
    assert d["value"] == "cpu" and d["epoch"] == 0
    assert d["reason"].startswith("cpu on worker(s) 0, 1 (Spark GPU addresses ")
    assert "device='auto': Spark assigned this task a GPU, but CuPy cannot use it" in d["reason"]
    # The executors' own reason (CuPy missing, or CUDA_VISIBLE_DEVICES="" hiding the GPUs) travels with it.
    assert "CuPy with a CUDA device is required for the GPU path, but it is not available (" in d["reason"]
    assert f"workers train on cpu: {d['reason']}" in log


@pytest.mark.spark
@pytest.mark.slow
def test_cpu_never_looks_at_the_assigned_gpus(gpu_cluster):
    out, _ = gpu_cluster
    [d] = [d for d in out["cpu_decisions"] if d["name"] == "device"]
    assert d["value"] == "cpu"
    assert d["reason"] == "cpu on worker(s) 0, 1: device='cpu' requested (Spark's GPU assignment is not read)"


@pytest.mark.spark
@pytest.mark.slow
def test_gpu_in_an_averaging_task_is_a_permanent_error_not_retried(gpu_cluster):
    out, _ = gpu_cluster
    r = out["gpu_round"]
    assert r["results"] == ["TaskFailure", "TaskFailure"]  # returned, so Spark did not retry the tasks
    assert r["failed_tasks"] == 0
    assert r["type"] == "DeviceError" and r["permanent"]
    assert "Expect a usable GPU for device='gpu' (Spark assigned this task GPU address" in r["message"]
    assert "[averaging round 1: worker " in r["message"]


@pytest.mark.spark
@pytest.mark.slow
def test_predict_and_evaluate_choose_their_device_as_training_does(gpu_cluster):
    out, _ = gpu_cluster
    assert out["auto_predict_error"] < 1e-6  # auto: the CPU, as the fit's tasks
    r = out["gpu_evaluate"]
    assert r["type"] == "DeviceError" and r["permanent"], r
    assert "Expect a usable GPU for device='gpu' (Spark assigned this task GPU address" in r["message"]
    assert r["failed_tasks"] == 0  # returned as a failure: Spark did not retry the tasks


@pytest.mark.spark
@pytest.mark.slow
def test_gpu_in_a_sharing_fit_raises_the_device_error_on_the_driver(gpu_cluster):
    out, _ = gpu_cluster
    r = out["gpu_sharing"]
    assert r["type"] == "DeviceError" and r["permanent"], r
    assert "Expect a usable GPU for device='gpu' (Spark assigned this task GPU address" in r["message"]
    assert re.search(r"\[gradient-sharing epoch 1: worker rank \d, epoch 1\]", r["message"]), r["message"]
    assert r["stage_restarts"] == 0  # permanent: the driver did not restart the epoch
    # The failing rank fails its barrier task so that Spark aborts the stage; the driver
    # restarts no epoch for a permanent error.
    assert r["failed_tasks"] >= 1, r


@pytest.mark.slow
def test_example_local_mode_trains_on_the_gpu_or_says_why_not(tmp_path, fashion_dir):
    report = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, str(REPO / "examples" / "mnist_lenet.py"), "--mode", "local",
                           "--device", "gpu", "--data-dir", str(fashion_dir), "--limit-train", "128",
                           "--limit-test", "64", "--report", str(report)],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    if backend.available():
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert json.loads(report.read_text())["device"].startswith("gpu:")
    else:
        assert proc.returncode != 0 and not report.exists()
        assert "--device gpu: CuPy with a CUDA device is required for the GPU path" in proc.stderr
