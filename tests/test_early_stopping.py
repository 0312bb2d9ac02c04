"""Early stopping and the best model: the configuration and its checks, the
rule's decisions and state, the tracker a fit runs, and real fits on local
Spark -- both masters, checkpoints and resume, restore_best from memory and
from the best checkpoint, a NaN loss, a listener that asks to stop, Spark
Connect."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from sparkavg.configurable import ConfigError, from_config
from sparkavg.data.validation import DataSpec
from sparkavg.fitting import STOP_REASONS, EarlyStopping, History, Monitor, monitor_names
from sparkavg.fitting.tracker import FitTracker
from sparkavg.listeners import EventDispatcher, TrainingListener
from sparkavg.nn import Adam, Network
from sparkavg.spark import GradientSharing, ParameterAveraging, SparkTrainer
from sparkavg.stats import TrainingStats

from .nets import blobs, small_net

CLASSIFIER = DataSpec((1, 4, 4), 2)


# ------------------------------------------------------------------ the configuration
def test_early_stopping_defaults_round_trip_and_infer_the_mode():
    es = EarlyStopping()
    assert (es.monitor, es.mode, es.patience, es.min_delta, es.restore_best) == ("val_loss", "min", 3, 0.0, True)
    assert es.max_epochs is None and es.max_seconds is None and es.needs_validation and es.metric is None
    assert EarlyStopping(monitor="val_accuracy").mode == "max" and EarlyStopping(monitor="val_auc").metric == "auc"
    assert EarlyStopping(monitor="val_mse").mode == "min" and EarlyStopping(monitor="val_r2").mode == "max"
    assert EarlyStopping(monitor="loss").needs_validation is False
    assert EarlyStopping(monitor="val_accuracy", mode="min").mode == "min"  # as the user says
    es = EarlyStopping(monitor="val_f1", patience=0, min_delta=0.01, restore_best=False, max_epochs=9,
                       max_seconds=60.0)
    config = json.loads(json.dumps(es.to_config()))
    assert config["type"] == "EarlyStopping" and from_config(config, kind="early_stopping") == es


@pytest.mark.parametrize("field, value", [
    ("monitor", "val_accuracy_typo"), ("monitor", 3), ("mode", "auto"), ("mode", "maximum"), ("patience", -1),
    ("patience", 1.5), ("patience", True), ("min_delta", -0.1), ("min_delta", float("nan")), ("restore_best", 1),
    ("max_epochs", 0), ("max_seconds", 0.0), ("max_seconds", float("inf"))])
def test_bad_early_stopping_fields_are_named(field, value):
    with pytest.raises(ValueError, match=f"Expect EarlyStopping.{field} to be") as info:
        EarlyStopping(**{field: value})
    if field == "monitor":  # the names it could have been
        assert "'val_loss'" in str(info.value) and "'val_auc'" in str(info.value)
    with pytest.raises(ConfigError, match=field):
        from_config({"type": "EarlyStopping", field: value}, kind="early_stopping")


# ------------------------------------------------------------------ the rule
def test_patience_counts_epochs_in_a_row_without_improvement_beyond_min_delta():
    m = Monitor(EarlyStopping(patience=2, min_delta=0.1))
    steps = [(1, 1.0), (2, 0.95), (3, 0.85), (4, 0.8), (5, 0.79)]  # 0.95: not 0.1 better; 0.85: better than 1.0
    got = [m.decide(epoch, value, epoch, 0.0)[0] for epoch, value in steps]
    assert got == [None, None, None, None, "no_improvement"]
    assert (m.best_epoch, m.best_value, m.wait) == (3, 0.85, 2)
    zero = Monitor(EarlyStopping(monitor="val_accuracy", patience=0))
    assert [zero.decide(e, v, e, 0.0)[0] for e, v in [(1, 0.5), (2, 0.7), (3, 0.7)]] == [None, None, "no_improvement"]
    assert zero.best_epoch == 2


def test_max_epochs_max_seconds_and_an_invalid_score_stop():
    m = Monitor(EarlyStopping(max_epochs=3, patience=10))
    assert [m.decide(e, 1.0 / e, e, 0.0)[0] for e in (1, 2, 3)] == [None, None, "max_epochs"]
    m = Monitor(EarlyStopping(max_seconds=5.0, patience=10))
    assert m.decide(1, 1.0, 1, 4.9)[0] is None and m.decide(2, 0.9, 2, 5.0)[0] == "max_seconds"
    m = Monitor(EarlyStopping(patience=10))
    m.decide(1, 0.5, 1, 0.0)
    reason, why = m.decide(2, float("nan"), 2, 0.0)
    assert reason == "invalid_score" and "nan" in why and m.best_epoch == 1
    assert set(STOP_REASONS) == {"no_improvement", "max_epochs", "max_seconds", "invalid_score", "listener"}


def test_without_a_configuration_the_best_epoch_is_tracked_and_nothing_stops():
    m = Monitor(None, "val_accuracy")
    assert m.mode == "max"
    assert [m.decide(e, v, e, 1e9)[0] for e, v in [(1, 0.5), (2, 0.4), (3, float("nan")), (4, 0.3)]] == [None] * 4
    assert m.best_epoch == 1


def test_the_state_round_trips_and_is_rebuilt_from_a_history_without_one():
    m = Monitor(EarlyStopping(patience=3))
    for e, v in [(1, 0.9), (2, 0.5), (3, 0.6)]:
        m.decide(e, v, e, 10.0 * e)
    state = json.loads(json.dumps(m.state_dict()))
    other = Monitor(EarlyStopping(patience=3))
    other.load_state_dict(state)
    assert other.state_dict() == m.state_dict() == {"monitor": "val_loss", "mode": "min", "best_epoch": 2,
                                                    "best_value": 0.5, "wait": 1, "seconds": 30.0}
    history = [{"epoch": e, "val_loss": v, "seconds": 10.0} for e, v in [(1, 0.9), (2, 0.5), (3, 0.6)]]
    rebuilt = Monitor(EarlyStopping(patience=3))
    rebuilt.load_state_dict(None, history)
    assert rebuilt.state_dict() == m.state_dict()
    # the state of another monitor is not this one's: rebuilt from the history too
    acc = Monitor(EarlyStopping(monitor="val_accuracy"))
    acc.load_state_dict(state, [{"epoch": 1, "val_accuracy": 0.7}, {"epoch": 2, "val_accuracy": 0.6}])
    assert (acc.best_epoch, acc.best_value, acc.wait) == (1, 0.7, 1)


def test_monitor_names_depend_on_the_model_and_on_validation():
    assert monitor_names(True, validation=False) == ["loss"]
    cls, reg = monitor_names(True), monitor_names(False)
    assert {"loss", "val_loss", "val_accuracy", "val_auc", "val_log_loss"} <= set(cls) and "val_mse" not in cls
    assert {"val_mse", "val_mae", "val_r2"} <= set(reg) and "val_accuracy" not in reg


def test_history_reads_metrics_and_its_best_entry():
    h = History([{"epoch": 1, "val_loss": 0.5}, {"epoch": 2, "val_loss": 0.4}, {"epoch": 3}], best_epoch=2,
                monitor="val_loss", best_value=0.4)
    assert h.epochs == [1, 2, 3] and h.metric("val_loss") == [0.5, 0.4, None] and h.best == {"epoch": 2,
                                                                                           "val_loss": 0.4}
    assert len(h) == 3 and [e["epoch"] for e in h] == [1, 2, 3]


# ------------------------------------------------------------------ the tracker
def _tracker(es=None, metrics=None, validation=True, spec=CLASSIFIER, stats=None, network=None, history=None,
             events=None, checkpoint_dir=None):
    return FitTracker(es, metrics, validation=validation, network=small_net() if network is None else network,
                      history=[] if history is None else history, spec=spec,
                      stats=TrainingStats(workers=1) if stats is None else stats,
                      events=EventDispatcher([]) if events is None else events, run_id="run",
                      checkpoint_dir=checkpoint_dir)


def test_the_tracker_refuses_what_the_fit_cannot_produce():
    with pytest.raises(ValueError, match=r"Expect EarlyStopping.monitor among .*\['loss'\], got 'val_loss' "
                                         r"\(validation values need validation_data\)"):
        _tracker(EarlyStopping(), validation=False)
    with pytest.raises(ValueError, match=r"produces, \[.*'val_mse'.*\], got 'val_auc'"):
        _tracker(EarlyStopping(monitor="val_auc"), spec=DataSpec((3,), 2, loss="mse"))
    with pytest.raises(ValueError, match="Expect validation_data with metrics"):
        _tracker(metrics=["auc"], validation=False)
    with pytest.raises(ValueError, match=r"Expect metric names among .*, got 'auroc'"):
        _tracker(metrics=["auroc"])
    with pytest.raises(ValueError, match="Expect metrics of a classification model, .*, got 'r2'"):
        _tracker(metrics=["r2"])
    with pytest.raises(ValueError, match="Expect top5_accuracy for a model of more than 5 classes, got 2"):
        _tracker(metrics=["top5_accuracy"])
    with pytest.raises(TypeError, match="Expect early_stopping as an EarlyStopping"):
        _tracker({"monitor": "val_loss"})
    with pytest.raises(TypeError, match="Expect metrics as a list"):
        _tracker(metrics="auc")


def test_the_tracker_fills_the_entry_records_series_and_keeps_the_best_in_memory():
    stats, net, history = TrainingStats(workers=1), small_net(seed=1), []
    tracker = _tracker(EarlyStopping(monitor="val_auc", patience=1, min_delta=10.0), metrics=["f1"], stats=stats,
                       network=net, history=history)
    assert tracker.plan.names == ["val_loss", "val_accuracy", "val_f1", "val_auc"]
    x, y = blobs(40, seed=2)
    kept = []

    def snapshot():
        kept.append(net.epoch)
        return {k: np.array(net.state[k]) for k in ("params", "updater", "buffers")}

    stops, best_params = [], None
    assert tracker.done_before_start(0) is False
    for epoch in range(1, 5):
        net.fit_batch(x, y)
        net.epoch = epoch
        evaluations = tracker.evaluations()
        loss = evaluations[0].eval_model(net, x, y)
        out = net.output(x)
        for ev in evaluations[1:]:
            ev.eval(y, out)
        entry = {"epoch": epoch, "loss": 1.0, "examples": 40, "seconds": 1.0, "examples_per_second": 40.0}
        history.append(entry)
        stops.append(tracker.end_epoch(entry, evaluations, 4, None, snapshot))
        assert entry["val_loss"] == pytest.approx(loss.loss()) == pytest.approx(net.score(x, y))
        assert entry["accuracy"] == entry["val_accuracy"] == pytest.approx(np.mean(out.argmax(1) == y))
        if tracker.monitor.best_epoch == epoch:
            best_params = net.params.copy()
    # no AUC beats the first by 10: patience 1 ends the fit at epoch 2
    assert stops[:2] == [False, True] and tracker.stop_reason == "no_improvement"
    assert kept == [1] and entry["learning_rate"] == 0.01
    series = stats.series_data
    assert sorted(series["validation"]) == ["val_accuracy", "val_auc", "val_f1", "val_loss"]
    assert [p[:2] for p in series["learning_rate"]["driver"]] == [[e, 0.01] for e in range(1, 5)]
    result = tracker.finish(net, history)
    assert (result.best_epoch, result.restored_best, result.stop_reason, result.monitor) == (1, True,
                                                                                             "no_improvement",
                                                                                             "val_auc")
    np.testing.assert_array_equal(net.params, best_params)
    assert [d["value"] for d in stats.decisions if d["name"] == "early_stopping"] == ["no_improvement"]


def test_a_listener_request_ends_the_fit_after_the_epoch():
    events, net = EventDispatcher([]), small_net()
    tracker = _tracker(validation=False, network=net, events=events)
    entry = {"epoch": 1, "loss": 0.5, "examples": 4, "seconds": 1.0, "examples_per_second": 4.0}
    assert tracker.end_epoch(entry, None, 3, None, lambda: None) is False
    events.stop_request = "enough"
    assert tracker.end_request(1) and tracker.stop_reason == "listener" and "enough" in tracker.stop_message
    assert tracker.finish(net, [entry]).best_epoch == 1  # the training loss, tracked without validation


def test_a_fresh_run_forgets_another_runs_best_checkpoint(tmp_path):
    (tmp_path / "best.json").write_text(json.dumps({"folder": "epoch-00003", "run_id": "other", "epoch": 3}))
    _tracker(EarlyStopping(), checkpoint_dir=str(tmp_path)).done_before_start(0)
    assert not (tmp_path / "best.json").exists()
    (tmp_path / "best.json").write_text(json.dumps({"folder": "epoch-00001", "run_id": "run", "epoch": 1}))
    _tracker(EarlyStopping(), checkpoint_dir=str(tmp_path)).done_before_start(0)  # its own run's stays
    assert (tmp_path / "best.json").exists()


# ------------------------------------------------------------------ on Spark
def _data(sc, n=64, seed=11):
    x, y = blobs(n, seed=seed)
    return sc.parallelize(list(zip(x, y.tolist())), 2)


class ParamsPerEpoch(TrainingListener):
    """The network's parameters at every epoch end."""

    def __init__(self):
        self.params = {}

    def on_epoch_end(self, trainer, event):
        self.params[event["epoch"]] = np.array(trainer.network.params, copy=True)


class StopInEpoch(TrainingListener):
    def __init__(self, epoch):
        self.epoch = epoch

    def on_round_end(self, trainer, event):
        if event["epoch"] == self.epoch:
            trainer.request_stop(f"seen enough in epoch {self.epoch}")


@pytest.mark.spark
@pytest.mark.slow
def test_validation_loss_and_metrics_equal_a_separate_evaluation(sc):
    from sparkavg.evaluation import ROC, Evaluation, Loss
    from sparkavg.nn.schedules import StepSchedule

    train, val = _data(sc), _data(sc, n=40, seed=12)
    net = small_net(seed=3)
    net.updater = Adam(lr=StepSchedule(0.01, 0.5, 1, by="epoch"))
    trainer = SparkTrainer(sc, net, ParameterAveraging(workers=2, batch_size_per_worker=8), progress=False)
    history = trainer.fit(train, epochs=2, validation_data=val, metrics=["auc", "val_f1"])
    assert isinstance(history, History) and history.history == trainer.history and history.monitor == "val_loss"
    last = history.history[-1]
    loss, ev, roc = trainer.evaluate(val, [Loss(), Evaluation(2), ROC(2)])
    assert last["val_loss"] == pytest.approx(loss.loss(), rel=1e-6) == pytest.approx(trainer.score(val), rel=1e-6)
    assert last["val_accuracy"] == ev.accuracy() and last["val_f1"] == ev.f1() and last["val_auc"] == roc.auc()
    # the learning rate of each epoch's last step, as the schedule gives it
    assert history.metric("learning_rate") == [pytest.approx(net.updater.rate(net.iteration - 1, e)) for e in (0, 1)]
    assert history.metric("learning_rate")[1] == pytest.approx(history.metric("learning_rate")[0] / 2)
    best = int(np.argmin(history.metric("val_loss"))) + 1
    assert history.best_epoch == best and history.stop_reason is None and not history.restored_best
    assert sorted(trainer.stats.series_data["validation"]) == ["val_accuracy", "val_auc", "val_f1", "val_loss"]


@pytest.mark.spark
@pytest.mark.slow
def test_early_stopping_restores_the_best_epoch_from_memory(sc):
    probe = ParamsPerEpoch()
    trainer = SparkTrainer(sc, small_net(seed=4), ParameterAveraging(workers=2, batch_size_per_worker=8),
                           listeners=[probe], progress=False)
    # no later epoch beats the first by 100: the fit ends after 1 + patience epochs, on epoch 1's state
    history = trainer.fit(_data(sc), epochs=6, validation_data=_data(sc, n=32, seed=13),
                          early_stopping=EarlyStopping(patience=2, min_delta=100.0))
    assert len(history) == 3 and trainer.epochs_done == 3 and history.stop_reason == "no_improvement"
    assert history.best_epoch == 1 and history.restored_best
    np.testing.assert_array_equal(trainer.network.params, probe.params[1])
    assert not np.array_equal(probe.params[3], probe.params[1])


@pytest.mark.spark
@pytest.mark.slow
def test_sharing_marks_the_best_checkpoint_restores_it_and_resumes_the_rule(sc, tmp_path):
    ckpt = str(tmp_path / "ckpt")
    master = GradientSharing(workers=2, batch_size_per_worker=8)
    stopping = EarlyStopping(patience=2, min_delta=100.0)
    train, val = _data(sc), _data(sc, n=32, seed=14)
    first = SparkTrainer(sc, small_net(seed=5), master, checkpoint_dir=ckpt, progress=False)
    history = first.fit(train, epochs=2, validation_data=val, early_stopping=stopping)
    assert history.stop_reason is None and history.best_epoch == 1 and history.restored_best  # ran out of epochs
    best = json.loads(open(os.path.join(ckpt, "best.json")).read())
    assert best["folder"] == "epoch-00001" and best["epoch"] == 1 and best["run_id"] == first.run_id
    record = json.loads(open(os.path.join(ckpt, "epoch-00002", "trainer.json")).read())
    assert record["extra"]["early_stopping"]["wait"] == 1 and "val_loss" in record["extra"]["history"][-1]
    saved = Network.load(os.path.join(ckpt, "epoch-00001", "network.npz"))
    np.testing.assert_array_equal(first.network.params, saved.params)

    # a new process's trainer resumes the run: one more epoch without improvement ends it
    resumed = SparkTrainer(sc, small_net(seed=55), master, checkpoint_dir=ckpt, progress=False)
    history = resumed.fit(train, epochs=6, resume_from=ckpt, validation_data=val, early_stopping=stopping)
    assert [e["epoch"] for e in history] == [1, 2, 3] and history.stop_reason == "no_improvement"
    assert history.best_epoch == 1 and history.restored_best
    np.testing.assert_array_equal(resumed.network.params, saved.params)
    # resuming the stopped run again trains nothing
    again = SparkTrainer(sc, small_net(seed=56), master, checkpoint_dir=ckpt, progress=False)
    history = again.fit(train, epochs=6, resume_from=ckpt, validation_data=val, early_stopping=stopping)
    assert again.epochs_done == 3 and history.stop_reason == "no_improvement" and len(history) == 3


@pytest.mark.spark
@pytest.mark.slow
def test_a_nan_loss_ends_the_fit_on_the_best_epoch_instead_of_raising(sc, tmp_path):
    ckpt = str(tmp_path / "ckpt")
    trainer = SparkTrainer(sc, small_net(seed=6), ParameterAveraging(workers=2, batch_size_per_worker=8),
                           checkpoint_dir=ckpt, progress=False)
    trainer.fit(_data(sc), epochs=1)
    good = trainer.network.params.copy()
    trainer.network.updater = Adam(lr=1e30)  # NaN within the next epoch
    history = trainer.fit(_data(sc), epochs=3, early_stopping=EarlyStopping(monitor="loss"))
    assert history.stop_reason == "invalid_score" and trainer.epochs_done == 1 and len(history) == 1
    np.testing.assert_array_equal(trainer.network.params, good)
    assert sorted(os.listdir(ckpt)) == ["epoch-00001"]


@pytest.mark.spark
@pytest.mark.slow
def test_a_listener_stops_the_fit_after_the_epoch_in_flight_and_max_epochs_bounds_it(sc, tmp_path):
    ckpt = str(tmp_path / "ckpt")
    trainer = SparkTrainer(sc, small_net(seed=7), ParameterAveraging(workers=2, batch_size_per_worker=8),
                           checkpoint_dir=ckpt, listeners=[StopInEpoch(2)], progress=False)
    history = trainer.fit(_data(sc), epochs=5)
    assert history.stop_reason == "listener" and "seen enough in epoch 2" in history.stop_message
    assert trainer.epochs_done == 2 and trainer.history[-1]["examples"] == 64  # the epoch ran whole
    assert sorted(os.listdir(ckpt)) == ["epoch-00001", "epoch-00002"]
    assert trainer.request_stop("no fit runs") is False
    short = SparkTrainer(sc, small_net(seed=8), ParameterAveraging(workers=2, batch_size_per_worker=8),
                         progress=False)
    history = short.fit(_data(sc), epochs=5, early_stopping=EarlyStopping(monitor="loss", max_epochs=2))
    assert short.epochs_done == 2 and history.stop_reason == "max_epochs" and history.monitor == "loss"


@pytest.mark.spark
@pytest.mark.slow
def test_early_stopping_on_spark_connect(connect):
    x, y = blobs(64, seed=15)
    rows = [(r.reshape(-1).tolist(), int(t)) for r, t in zip(x, y)]
    df = connect.createDataFrame(rows, "features array<float>, label long").coalesce(2)
    train, val = df.randomSplit([0.75, 0.25], seed=3)
    probe = ParamsPerEpoch()
    trainer = SparkTrainer(connect, small_net(seed=9), ParameterAveraging(workers=2, batch_size_per_worker=8),
                           listeners=[probe], progress=False)
    history = trainer.fit(train, epochs=5, validation_data=val, metrics=["log_loss"],
                          early_stopping=EarlyStopping(monitor="val_log_loss", patience=1, min_delta=100.0))
    assert len(history) == 2 and history.best_epoch == 1 and history.stop_reason == "no_improvement"
    assert history.history[0]["val_log_loss"] == pytest.approx(history.history[0]["val_loss"], rel=1e-4)
    np.testing.assert_array_equal(trainer.network.params, probe.params[1])
