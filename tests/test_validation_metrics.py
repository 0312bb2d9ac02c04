"""Validation metrics: the mergeable Loss, computed on the executors, and
the metrics a fit records every epoch -- in the history, the stats, the
progress bar, TensorBoard and MLflow -- for a classifier and a regression
model."""
from __future__ import annotations

import io

import numpy as np
import pytest

from sparkavg.evaluation import Loss, RegressionEvaluation
from sparkavg.fitting import METRICS, ValidationPlan
from sparkavg.nn import Adam, Dense, Network, Output
from sparkavg.spark import ParameterAveraging, SparkTrainer
from sparkavg.spark.executor.codec import decode_value, encode_value

from .nets import blobs, small_net
from .test_listeners import mlflow_store  # noqa: F401  (a fixture)


def _regression_net(seed=21):
    return Network((3,), [Dense(6, activation="tanh"), Output(2, loss="mse")], updater=Adam(lr=0.01), seed=seed)


def _regression_data(n=48, seed=22):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 3)).astype(np.float32)
    y = np.stack([x[:, 0] - x[:, 1], 0.5 * x[:, 2]], axis=1).astype(np.float32)
    return x, y


# ------------------------------------------------------------------ the Loss
def test_the_loss_is_the_example_weighted_mean_of_score_and_merges_and_travels():
    net = small_net(seed=1)
    x, y = blobs(50, seed=2)
    parts = [Loss().eval_model(net, x[a:b], y[a:b]) for a, b in [(0, 7), (7, 30), (30, 50)]]
    merged = parts[0].merge(parts[1]).merge(parts[2])
    assert merged.count == 50 and merged.loss() == pytest.approx(net.score(x, y), rel=1e-6)
    text, blobs_ = encode_value([merged])
    back = decode_value(text, blobs_)[0]
    assert isinstance(back, Loss) and back.count == 50 and back.loss() == merged.loss()
    with pytest.raises(TypeError, match="Expect Loss to be given the model"):
        Loss().eval(y, net.output(x))
    with pytest.raises(ValueError, match="Expect at least one evaluated example"):
        Loss().loss()
    with pytest.raises(ValueError, match=r"Expect the fields \['count', 'total'\] in a Loss dict, got missing"):
        Loss.from_dict({"type": "Loss", "count": 3})
    with pytest.raises(ValueError, match="Expect Loss field 'total' to be a number"):
        Loss.from_dict({"type": "Loss", "count": 3, "total": "1.0"})
    diverged = Loss.from_dict({"type": "Loss", "count": 2, "total": float("nan")})
    assert np.isnan(diverged.loss())


def test_a_regression_plan_reads_mse_mae_r2_and_names_what_fits():
    plan = ValidationPlan(False, 2, ["rmse"])
    assert plan.names == ["val_loss", "val_mse", "val_mae", "val_r2", "val_rmse"]
    net = _regression_net()
    x, y = _regression_data()
    evaluations = plan.evaluations()
    evaluations[0].eval_model(net, x, y)
    for ev in evaluations[1:]:
        ev.eval(y, net.output(x))
    values = plan.values(evaluations)
    ref = RegressionEvaluation(2).eval(y, net.output(x))
    assert values == {"val_loss": pytest.approx(net.score(x, y), rel=1e-6), "val_mse": ref.mse(),
                      "val_mae": ref.mae(), "val_r2": ref.r2(), "val_rmse": ref.rmse()}
    assert len(evaluations) == 2  # one RegressionEvaluation serves the four
    assert {m.task for m in METRICS.values()} == {"classification", "regression"}


def test_an_undefined_metric_is_none_and_logged(caplog):
    plan = ValidationPlan(True, 3, ["auc"])
    net = Network((4,), [Output(3)], seed=3)
    x = np.random.default_rng(4).standard_normal((6, 4)).astype(np.float32)
    y = np.zeros(6, np.int64)  # one class only: no negatives for class 0, no positives for the others
    evaluations = plan.evaluations()
    evaluations[0].eval_model(net, x, y)
    for ev in evaluations[1:]:
        ev.eval(y, net.output(x))
    with caplog.at_level("WARNING", logger="sparkavg.fitting.metrics"):
        values = plan.values(evaluations)
    assert values["val_auc"] is None and "auc" in caplog.text and values["val_accuracy"] is not None


def test_the_progress_bar_shows_the_validation_values():
    from sparkavg.listeners import ProgressBar

    out = io.StringIO()
    bar = ProgressBar(file=out, mininterval=0)
    bar.on_fit_start(None, {"epochs": 1, "epochs_done": 0})
    bar.on_epoch_end(None, {"epoch": 1, "loss": 0.4, "examples_per_second": 10.0, "accuracy": 0.875,
                            "val_accuracy": 0.875, "val_loss": 0.3125, "val_auc": 0.9375, "val_f1": None})
    bar.on_fit_end(None, {})
    text = out.getvalue()
    assert "val_loss=0.3125" in text and "val_auc=0.9375" in text and "acc=0.8750" in text
    assert "val_accuracy" not in text and "val_f1" not in text


# ------------------------------------------------------------------ on Spark
@pytest.mark.spark
@pytest.mark.slow
def test_a_regression_fit_records_loss_mse_mae_r2(spark):
    x, y = _regression_data(64)
    xv, yv = _regression_data(32, seed=23)
    frame = lambda a, b: spark.createDataFrame([(r.tolist(), t.tolist()) for r, t in zip(a, b)],  # noqa: E731
                                               "features array<float>, label array<float>").coalesce(2)
    train, val = frame(x, y), frame(xv, yv)
    trainer = SparkTrainer(spark, _regression_net(), ParameterAveraging(workers=2, batch_size_per_worker=8),
                           progress=False)
    history = trainer.fit(train, epochs=2, validation_data=val, metrics=["rmse"])
    last = history.history[-1]
    ev = trainer.evaluate(val)
    assert isinstance(ev, RegressionEvaluation) and last["accuracy"] is None  # a classifier's, by its earlier name
    assert last["val_mse"] == pytest.approx(ev.mse()) and last["val_mae"] == pytest.approx(ev.mae())
    assert last["val_r2"] == pytest.approx(ev.r2()) and last["val_rmse"] == pytest.approx(ev.rmse())
    assert last["val_loss"] == pytest.approx(trainer.score(val), rel=1e-6)
    assert history.best_epoch == int(np.argmin(history.metric("val_loss"))) + 1


@pytest.mark.spark
@pytest.mark.slow
def test_tensorboard_and_mlflow_log_the_validation_values(sc, tmp_path, mlflow_store):  # noqa: F811
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from sparkavg.listeners import MLflowListener, TensorBoardListener

    x, y = blobs(48, seed=5)
    rdd = sc.parallelize(list(zip(x, y.tolist())), 2)
    listener = MLflowListener()
    trainer = SparkTrainer(sc, small_net(seed=6), ParameterAveraging(workers=2, batch_size_per_worker=8),
                           listeners=[TensorBoardListener(tmp_path / "tb"), listener], progress=False)
    history = trainer.fit(rdd, epochs=2, validation_data=rdd, metrics=["auc", "log_loss"])
    acc = EventAccumulator(str(tmp_path / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    client = mlflow_store.tracking.MlflowClient()
    for name in ("val_loss", "val_auc", "val_log_loss", "val_accuracy", "learning_rate"):
        want = history.metric(name)
        assert [e.value for e in acc.Scalars(f"epoch/{name}")] == pytest.approx(want), name
        got = client.get_metric_history(listener.run_id, name)
        assert [(m.step, m.value) for m in got] == [(i + 1, pytest.approx(v)) for i, v in enumerate(want)], name
