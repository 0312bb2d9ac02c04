"""Listeners on the driver: the events of a real fit, a listener that raises,
MLflow (a real SQLite tracking store, read back with MLflow's client, the
model loaded as pyfunc) and TensorBoard (event files read back with TensorBoard's
EventAccumulator), the progress bar, and the NetworkEstimator in a Pipeline."""
from __future__ import annotations

import io
import logging
import shutil

import numpy as np
import pytest

from sparkavg.listeners import EVENTS, EventDispatcher, TrainingListener
from sparkavg.listeners.base import sample_points
from sparkavg.nn import Adam
from sparkavg.spark import GradientSharing, ParameterAveraging, SparkTrainer

from .nets import blobs, small_net


def _recording(name):
    def handler(self, trainer, event):
        self.seen.append((name, event, trainer))
    return handler


class Recorder(TrainingListener):
    """Keeps (event name, payload, trainer) of every event."""

    locals().update({"on_" + _name: _recording(_name) for _name in EVENTS})

    def __init__(self):
        self.seen = []

    def names(self):
        return [n for n, _, _ in self.seen]

    def payloads(self, name):
        return [e for n, e, _ in self.seen if n == name]


class Raising:
    """A plain object (no base class) whose every handler raises."""

    def __init__(self):
        self.calls = 0

    def __getattr__(self, name):
        if name.startswith("on_") and name[3:] in EVENTS:
            def handler(trainer, event):
                self.calls += 1
                event["loss"] = float("nan")  # tries to spoil what the next listener sees, too
                raise RuntimeError(f"boom in {name}")
            return handler
        raise AttributeError(name)


def _rdd(sc, n=48, seed=3):
    x, y = blobs(n, seed=seed)
    return sc.parallelize(list(zip(x, y.tolist())), 2)


@pytest.fixture()
def mlflow_store(tmp_path, monkeypatch, _mlflow_schema):
    """A real MLflow tracking store of the kind MLflow 3 opens by default (a SQLite file, no
    environment switch), in a temporary folder with the artifacts beside it."""
    mlflow = pytest.importorskip("mlflow")
    shutil.copyfile(_mlflow_schema, tmp_path / "mlflow.db")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    mlflow.set_tracking_uri(uri)
    # Artifacts in tmp_path too (the default experiment's would go to ./mlruns of the working directory).
    experiment = mlflow.tracking.MlflowClient().create_experiment("tests", (tmp_path / "artifacts").as_uri())
    monkeypatch.setenv("MLFLOW_EXPERIMENT_ID", experiment)
    yield mlflow
    while mlflow.active_run() is not None:
        mlflow.end_run()
    mlflow.set_tracking_uri(None)


# ------------------------------------------------------------------ no Spark
def test_dispatcher_reports_a_raising_listener_and_calls_the_others(caplog):
    rec, bad = Recorder(), Raising()

    class Owner:
        def __init__(self):
            from sparkavg.spark import TrainingStats

            self.stats = TrainingStats()

    owner = Owner()
    events = EventDispatcher([bad, rec], owner=owner)
    payload = {"epoch": 2, "loss": 0.5, "history": [{"loss": 0.5}]}
    with caplog.at_level(logging.WARNING, logger="sparkavg.listeners.base"):
        events.emit("epoch_end", payload)
        events.emit("epoch_end", payload)
    assert rec.names() == ["epoch_end", "epoch_end"] and rec.seen[0][2] is owner
    assert rec.payloads("epoch_end")[0]["loss"] == 0.5 and payload["loss"] == 0.5  # copies: nothing spoiled
    assert events.error_count == 2 and events.errors[0] == {"listener": "Raising", "event": "epoch_end", "epoch": 2,
                                                            "type": "RuntimeError", "message": "boom in on_epoch_end"}
    warnings = [r for r in caplog.records if "listener Raising raised in on_epoch_end" in r.getMessage()]
    assert len(warnings) == 2 and warnings[0].exc_info and not warnings[1].exc_info  # traceback once
    decisions = [d for d in owner.stats.decisions if d["name"] == "listener_error"]
    assert len(decisions) == 2 and decisions[0]["value"] == "Raising" and decisions[0]["epoch"] == 1
    with pytest.raises(ValueError, match="Expect an event in"):
        events.emit("epoch_done", {})
    with pytest.raises(TypeError, match="Expect a listener with one of the methods"):
        EventDispatcher([object()])
    with pytest.raises(TypeError, match="Expect listeners as a list"):
        EventDispatcher(Recorder())


def test_sample_points_keeps_ends_and_spacing():
    points = [[i, float(i), 0.1 * i] for i in range(1000)]
    sampled = sample_points(points, 64)
    assert len(sampled) == 64 and sampled[0] == [0, 0.0] and sampled[-1] == [999, 999.0]
    steps = np.diff([p[0] for p in sampled])
    assert steps.min() >= 15 and steps.max() <= 17
    assert sample_points(points[:5], 64) == [[i, float(i)] for i in range(5)]


def test_progress_bar_draws_epochs_and_rounds_and_auto_needs_a_terminal():
    from sparkavg.listeners import ProgressBar
    from sparkavg.listeners.progress import progress_listeners

    out = io.StringIO()
    bar = ProgressBar(file=out, mininterval=0)
    bar.on_fit_start(None, {"epochs": 2, "epochs_done": 0})
    for r in (1, 2, 3):
        bar.on_round_end(None, {"epoch": 1, "round": r, "rounds": 3, "loss": 0.7 - 0.1 * r,
                                "examples_per_second": 1234.0})
    bar.on_epoch_end(None, {"epoch": 1, "loss": 0.4, "examples_per_second": 1000.0, "accuracy": 0.875})
    bar.on_fit_end(None, {})
    text = out.getvalue()
    assert "epoch 1" in text and "3/3" in text and "loss=0.4000" in text and "acc=0.8750" in text
    assert "epochs" in text and "1/2" in text and "ex/s=1234" in text
    # pytest captures stderr: not a terminal, so "auto" falls back to the log lines
    assert progress_listeners("auto") == [] and progress_listeners(False) == []
    assert isinstance(progress_listeners(True)[0], ProgressBar)
    with pytest.raises(ValueError, match="Expect progress in"):
        progress_listeners("yes")


# --------------------------------------------------------------------- Spark
@pytest.mark.spark
def test_a_fit_reports_to_listeners_mlflow_and_tensorboard(sc, tmp_path, mlflow_store):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from sparkavg.listeners import MLflowListener, TensorBoardListener

    mlflow = mlflow_store
    rdd, x_test, _ = _rdd(sc), *blobs(16, seed=4)
    master = ParameterAveraging(workers=2, batch_size_per_worker=6, averaging_frequency=2)
    quiet = SparkTrainer(sc, small_net(seed=5), master)
    quiet.fit(rdd, epochs=1)

    rec, bad = Recorder(), Raising()
    tb_dir = tmp_path / "tb"
    listener = MLflowListener()
    trainer = SparkTrainer(sc, small_net(seed=5), master, checkpoint_dir=str(tmp_path / "ckpt"),
                           listeners=[bad, rec, TensorBoardListener(tb_dir), listener])
    trainer.fit(rdd, epochs=1, validation_data=rdd)

    # A listener that raises in every event changes nothing: the same model as without listeners.
    np.testing.assert_array_equal(trainer.network.params, quiet.network.params)
    assert bad.calls == len(rec.seen) and len(trainer.listener_errors) == bad.calls
    assert any(d["name"] == "listener_error" for d in trainer.stats.decisions)

    names = rec.names()
    rounds = trainer.history[0]["rounds"]
    assert names == ["fit_start"] + ["round_end"] * rounds + ["checkpoint", "epoch_end", "fit_end"]
    start = rec.payloads("fit_start")[0]
    assert start["epochs"] == 1 and start["examples"] == 48 and start["master"] == master.to_config()
    assert start["network"]["layers"] and start["num_params"] == trainer.network.num_params
    last_round = rec.payloads("round_end")[-1]
    assert last_round["round"] == last_round["rounds"] == rounds and last_round["examples"] == 48
    assert last_round["loss"] == pytest.approx(trainer.history[0]["loss"])
    epoch_end = rec.payloads("epoch_end")[0]
    assert epoch_end["loss"] == trainer.history[0]["loss"] and epoch_end["accuracy"] is not None
    assert epoch_end["target_epochs"] == 1 and any(d["name"] == "deal" for d in epoch_end["decisions"])
    assert rec.payloads("checkpoint")[0]["path"].endswith("epoch-00001")
    assert rec.payloads("fit_end")[0]["epochs_done"] == 1
    assert all(t is trainer for _, _, t in rec.seen)

    # TensorBoard: the event files, read back by TensorBoard's own reader.
    acc = EventAccumulator(str(tb_dir), size_guidance={"scalars": 0, "histograms": 0})
    acc.Reload()
    tags = acc.Tags()
    loss = acc.Scalars("epoch/loss")
    assert [(e.step, round(e.value, 5)) for e in loss] == [(1, round(trainer.history[0]["loss"], 5))]
    assert acc.Scalars("epoch/accuracy")[0].value == pytest.approx(trainer.history[0]["accuracy"])
    assert [e.step for e in acc.Scalars("round/loss")] == list(range(1, rounds + 1))
    assert "params/0.W" in tags["histograms"] and "params/1.b" in tags["histograms"]
    histo = acc.Histograms("params/0.W")[0].histogram_value
    assert histo.num == trainer.network.param_segments[0].stop - trainer.network.param_segments[0].start

    # MLflow: the run, read back with MLflow's client.
    client = mlflow.tracking.MlflowClient()
    run = client.get_run(listener.run_id)
    assert run.info.status == "FINISHED" and run.data.tags["sparkavg.run_id"] == trainer.run_id
    assert run.data.params["master.averaging_frequency"] == "2" and run.data.params["workers"] == "2"
    assert any(k.startswith("network.layers.0.") for k in run.data.params)
    history = client.get_metric_history(listener.run_id, "loss")
    assert [(m.step, m.value) for m in history] == [(1, pytest.approx(trainer.history[0]["loss"]))]
    assert client.get_metric_history(listener.run_id, "accuracy")[0].value == pytest.approx(
        trainer.history[0]["accuracy"])
    assert run.data.tags["sparkavg.last_checkpoint"].endswith("epoch-00001")
    stats = {a.path for a in client.list_artifacts(listener.run_id, "stats")}
    assert stats == {"stats/stats.json", "stats/stats.html", "stats/trace.json"}
    assert {a.path for a in client.list_artifacts(listener.run_id, "sparkavg")} == {
        "sparkavg/master.json", "sparkavg/network.json"}
    # The model: pyfunc from its npz file, predicting on a pandas frame as the network does.
    import pandas as pd

    model = mlflow.pyfunc.load_model(listener.model_uri)
    frame = pd.DataFrame({"features": [row.reshape(-1) for row in x_test]})
    got = model.predict(frame)
    want = trainer.network.output(x_test)
    np.testing.assert_allclose(np.stack(got["probability"]), want, rtol=1e-6)
    np.testing.assert_array_equal(got["prediction"].to_numpy(), want.argmax(axis=1).astype(np.float64))
    flat = pd.DataFrame(x_test.reshape(len(x_test), -1))  # or one column per feature
    np.testing.assert_array_equal(model.predict(flat)["prediction"], got["prediction"])


@pytest.mark.spark
def test_a_failing_fit_reports_the_failure_and_fails_the_mlflow_run(sc, tmp_path, mlflow_store):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from sparkavg.listeners import MLflowListener, TensorBoardListener
    from sparkavg.spark import DivergenceError, Recover

    net = small_net(seed=8)
    net.updater = Adam(lr=1e20)  # NaN within two steps (tests/test_faults.py)
    rec, listener = Recorder(), MLflowListener(run_name="diverges")
    trainer = SparkTrainer(sc, net, ParameterAveraging(workers=2, batch_size_per_worker=10),
                           on_divergence=Recover(max_recoveries=1, lr_factor=0.5),
                           listeners=[rec, listener, TensorBoardListener(tmp_path / "tb")])
    with pytest.raises(DivergenceError):
        trainer.fit(_rdd(sc, n=40), epochs=1)
    failures = rec.payloads("failure")
    assert [f["recovered"] for f in failures] == [True, False] and all(f["epoch"] == 1 for f in failures)
    assert isinstance(failures[-1]["error"], DivergenceError) and failures[-1]["type"] == "DivergenceError"
    assert "fit_end" not in rec.names() and "epoch_end" not in rec.names()
    run = mlflow_store.tracking.MlflowClient().get_run(listener.run_id)
    assert run.info.status == "FAILED" and run.info.run_name == "diverges"
    assert run.data.tags["sparkavg.error"].startswith("DivergenceError:")
    assert mlflow_store.active_run() is None  # the listener's run was ended
    assert len(list((tmp_path / "tb").glob("events.out.tfevents.*"))) == 1
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()  # the writer was closed on failure: what it wrote is readable, a scalar per round_end
    written = len(acc.Scalars("round/loss")) if "round/loss" in acc.Tags()["scalars"] else 0
    assert written == len(rec.payloads("round_end"))


@pytest.mark.spark
def test_gradient_sharing_reports_sampled_sharing_progress(sc, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from sparkavg.listeners import TensorBoardListener

    rec = Recorder()
    trainer = SparkTrainer(sc, small_net(seed=11), GradientSharing(workers=2, batch_size_per_worker=6,
                                                                   threshold=1e-3),
                           listeners=[rec, TensorBoardListener(tmp_path / "tb", histograms=True)])
    trainer.fit(_rdd(sc), epochs=1)
    assert rec.names() == ["fit_start", "round_end", "sharing_progress", "epoch_end", "fit_end"]
    series = rec.payloads("sharing_progress")[0]["series"]
    assert set(series) >= {"threshold", "sparsity"} and len(series["threshold"]) == 2  # both workers
    recorded = trainer.stats.series_data["threshold"]
    for lane, points in series["threshold"].items():
        everything = [list(q) for q in recorded[lane]]
        assert len(points) == min(64, len(everything)) and all(p in everything for p in points)
        assert points[0] == everything[0] and points[-1] == everything[-1]
    acc = EventAccumulator(str(tmp_path / "tb"), size_guidance={"scalars": 0, "histograms": 0})
    acc.Reload()
    assert {"sharing/threshold", "sharing/sparsity"} <= set(acc.Tags()["histograms"])
    lane = sorted(series["threshold"])[0]
    assert [e.step for e in acc.Scalars(f"sharing/threshold/{lane}")] == [p[0] for p in series["threshold"][lane]]


@pytest.mark.spark
def test_network_estimator_listeners_give_nested_runs_in_a_pipeline(spark, mlflow_store):
    from pyspark.ml import Pipeline

    from sparkavg.listeners import MLflowListener
    from sparkavg.ml import NetworkEstimator

    x, y = blobs(48, seed=21)
    rows = [(row.reshape(-1).tolist(), int(label)) for row, label in zip(x, y)]
    df = spark.createDataFrame(rows, "features array<float>, label long").repartition(2)
    rec, listener = Recorder(), MLflowListener(nested=True, log_model=False, log_stats=False)
    est = NetworkEstimator(network=small_net(seed=22), epochs=1, listeners=[rec, listener],
                           master=ParameterAveraging(workers=2, batch_size_per_worker=8, averaging_frequency=3))
    assert est.copy().listeners == [rec, listener]
    with mlflow_store.start_run() as parent:
        Pipeline(stages=[est]).fit(df)
        assert mlflow_store.active_run().info.run_id == parent.info.run_id  # the child ended, the parent goes on
    assert rec.names()[0] == "fit_start" and rec.names()[-1] == "fit_end"
    child = mlflow_store.tracking.MlflowClient().get_run(listener.run_id)
    assert child.info.run_id != parent.info.run_id and child.info.status == "FINISHED"
    assert child.data.tags["mlflow.parentRunId"] == parent.info.run_id
    assert child.data.metrics["loss"] == pytest.approx(rec.payloads("epoch_end")[0]["loss"])
    with pytest.raises(TypeError, match="Expect a listener"):
        NetworkEstimator(network=small_net(), listeners=["not a listener"])


def test_mlflow_listener_logs_into_an_active_run_and_leaves_it_open(mlflow_store):
    """Driven with the payloads a fit sends (no Spark): the user's run is used, not ended; a
    failure before the next fit_start touches no earlier run."""
    from types import SimpleNamespace

    from sparkavg.listeners import MLflowListener
    from sparkavg.spark import TrainingStats

    mlflow = mlflow_store
    net = small_net(seed=1)
    trainer = SimpleNamespace(stats=TrainingStats(), network=net, features_col="features")
    start = {"run_id": "abc", "epochs": 1, "epochs_done": 0, "resumed": False, "workers": 2,
             "master": ParameterAveraging(workers=2).to_config(), "network": net.to_config(),
             "num_params": net.num_params, "examples": 10, "minibatches": 2}
    listener = MLflowListener(log_model=False)
    with mlflow.start_run() as run:
        listener.on_fit_start(trainer, start)
        listener.on_epoch_end(trainer, {"epoch": 1, "loss": 0.25, "seconds": 2.0, "accuracy": None,
                                        "target_epochs": 1, "decisions": []})
        listener.on_fit_end(trainer, {})
        assert listener.run_id == run.info.run_id and mlflow.active_run().info.run_id == run.info.run_id
    listener.on_failure(trainer, {"epoch": None, "error": ValueError("x"), "message": "x", "type": "ValueError",
                                  "recovered": False})
    done = mlflow.tracking.MlflowClient().get_run(run.info.run_id)
    assert done.info.status == "FINISHED" and "sparkavg.error" not in done.data.tags
    assert done.data.metrics == {"loss": 0.25, "seconds": 2.0} and done.data.params["num_params"] == str(net.num_params)
