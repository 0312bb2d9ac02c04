"""pyspark.ml's conventions, on a classic session and on Spark Connect:
``NetworkModel.transform`` writes ``rawPrediction`` and ``probability`` as
ml Vectors that Spark's own evaluators read; the common hyperparameters are
Params that a real ``CrossValidator`` and ``TrainValidationSplit`` tune;
validation rows come from ``validationIndicatorCol`` and early stopping is
a Param; Pipelines saved by the release before load and transform."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from sparkavg.fitting import EarlyStopping
from sparkavg.ml import NetworkEstimator, NetworkModel
from sparkavg.spark import ParameterAveraging

from .nets import blobs, small_net, vectors

pytestmark = [pytest.mark.spark, pytest.mark.slow]

FLAVOURS = ["classic", "connect"]
LEGACY = Path(__file__).parent / "data" / "legacy"


def _session(request, flavour):
    return request.getfixturevalue("spark" if flavour == "classic" else "connect")


def _frame(session, x, y, partitions=2, validation_every=None):
    """(id, features, label[, is_val]) rows; every ``validation_every``-th row a validation row."""
    flat = x.reshape(len(x), -1)
    if validation_every is None:
        rows = [(i, r.tolist(), float(t)) for i, (r, t) in enumerate(zip(flat, y))]
        return session.createDataFrame(rows, "id long, features array<float>, label double").repartition(partitions)
    rows = [(i, r.tolist(), float(t), i % validation_every == 0) for i, (r, t) in enumerate(zip(flat, y))]
    return session.createDataFrame(rows, "id long, features array<float>, label double, is_val boolean") \
        .repartition(partitions)


def _trained_model(seed=0):
    x, y = blobs(64, seed=seed)
    net = small_net(seed=seed)
    for _ in range(3):
        net.fit_batch(x, y)
    return NetworkModel(network=net)


def _sorted(table, *columns):
    order = np.argsort(table.column("id").to_numpy())
    return [table.column(c).to_numpy()[order] if c in ("id", "label", "prediction") else
            vectors(table.column(c))[order] for c in columns]


@pytest.mark.filterwarnings("ignore:The y_prob values do not sum to one")  # float32 softmax rows, as Spark sees them
@pytest.mark.parametrize("flavour", FLAVOURS)
def test_transform_writes_ml_vectors_that_spark_evaluators_read(request, flavour):
    from pyspark.ml.evaluation import BinaryClassificationEvaluator, MulticlassClassificationEvaluator

    session = _session(request, flavour)
    x, y = blobs(60, seed=40)
    x[::7] *= -1  # some mistakes, so that the metrics are not all 1
    df = _frame(session, x, y)
    model = _trained_model(seed=41)
    out = model.transform(df)
    assert dict(out.dtypes)["rawPrediction"] == dict(out.dtypes)["probability"] == "vector"
    assert out.columns[-3:] == ["prediction", "rawPrediction", "probability"]
    label, raw, prob = _sorted(out.select("id", "label", "rawPrediction", "probability").toArrow(),
                               "label", "rawPrediction", "probability")
    want = model.network.output(x)
    np.testing.assert_allclose(prob, want, rtol=1e-6)
    np.testing.assert_array_equal(raw, prob)

    from sklearn.metrics import log_loss, roc_auc_score

    auc = BinaryClassificationEvaluator().evaluate(out)  # rawPrediction, areaUnderROC: the defaults
    assert auc == pytest.approx(roc_auc_score(label, prob[:, 1]))
    multi = MulticlassClassificationEvaluator()
    assert multi.evaluate(out, {multi.metricName: "accuracy"}) == pytest.approx(np.mean(prob.argmax(1) == label))
    assert multi.evaluate(out, {multi.metricName: "logLoss"}) == pytest.approx(log_loss(label, prob), rel=1e-6)


def test_output_columns_named_empty_are_left_out_and_collisions_are_refused(spark):
    df = _frame(spark, *blobs(8, seed=42))
    model = _trained_model(seed=43)
    assert model.setRawPredictionCol("").transform(df).columns[-2:] == ["prediction", "probability"]
    with pytest.raises(ValueError, match=r"Expect output columns .* distinct and not in the input, got \['id'\]"):
        _trained_model().setProbabilityCol("id").transform(df)
    with pytest.raises(ValueError, match=r"distinct"):
        _trained_model().setProbabilityCol("out").setRawPredictionCol("out").transform(df)


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_hyperparameters_are_params_that_cross_validation_tunes(request, flavour):
    from pyspark.ml.evaluation import BinaryClassificationEvaluator
    from pyspark.ml.tuning import CrossValidator, ParamGridBuilder, TrainValidationSplit

    session = _session(request, flavour)
    x, y = blobs(64, seed=44)
    df = _frame(session, x, y)
    master = ParameterAveraging(workers=2, batch_size_per_worker=8, averaging_frequency=1)
    est = NetworkEstimator(network=small_net(seed=45), master=master, epochs=1)
    grid = ParamGridBuilder().addGrid(est.learningRate, [1e-4, 0.05]).addGrid(est.batchSize, [8, 16]).build()
    assert len(grid) == 4
    cv = CrossValidator(estimator=est, estimatorParamMaps=grid, evaluator=BinaryClassificationEvaluator(),
                        numFolds=2, seed=7).fit(df)
    assert len(cv.avgMetrics) == 4 and all(0.0 <= m <= 1.0 for m in cv.avgMetrics)
    best = cv.bestModel
    assert isinstance(best, NetworkModel)
    chosen = grid[int(np.argmax(cv.avgMetrics))]
    assert best.history[-1]["learning_rate"] == pytest.approx(chosen[est.learningRate])
    assert best.history[-1]["rounds"] == 64 // (2 * chosen[est.batchSize])  # one minibatch per worker a round
    tvs = TrainValidationSplit(estimator=est, estimatorParamMaps=grid[:2], evaluator=BinaryClassificationEvaluator(),
                               trainRatio=0.75, seed=8).fit(df)
    assert len(tvs.validationMetrics) == 2 and isinstance(tvs.bestModel, NetworkModel)


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_validation_rows_and_early_stopping_as_params(request, flavour):
    session = _session(request, flavour)
    x, y = blobs(80, seed=46)
    df = _frame(session, x, y, validation_every=4)
    est = NetworkEstimator(network=small_net(seed=47), epochs=5, learningRate=0.02, batchSize=8,
                           master=ParameterAveraging(workers=2, averaging_frequency=1),
                           validationIndicatorCol="is_val", metrics=["auc"],
                           earlyStopping=EarlyStopping(monitor="val_loss", patience=1, min_delta=100.0))
    model = est.fit(df)
    assert [h["epoch"] for h in model.history] == [1, 2] and model.best_epoch == 1
    assert all(h["examples"] == 60 for h in model.history)  # the 20 validation rows are not trained on
    assert {"val_loss", "val_accuracy", "val_auc"} <= set(model.history[0]) and model.history[0]["learning_rate"] == 0.02
    assert est.getLearningRate() == 0.02 and est.getBatchSize() == 8 and est.getEarlyStopping().patience == 1


def test_bad_validation_settings_are_named(spark):
    x, y = blobs(16, seed=48)
    df = _frame(spark, x, y, validation_every=4)
    with pytest.raises(ValueError, match="Expect validationIndicatorCol with earlyStopping monitoring 'val_loss'"):
        NetworkEstimator(network=small_net(), earlyStopping=EarlyStopping()).fit(df)
    with pytest.raises(ValueError, match=r"Expect validationIndicatorCol 'label' to be a boolean column of the "
                                         r"input, got double"):
        NetworkEstimator(network=small_net(), validationIndicatorCol="label").fit(df)
    with pytest.raises(ValueError, match="got no such column"):
        NetworkEstimator(network=small_net(), validationIndicatorCol="nope").fit(df)
    with pytest.raises(TypeError, match="Expect earlyStopping as an EarlyStopping"):
        NetworkEstimator(network=small_net(), earlyStopping="val_loss")
    for param, value in (("learningRate", 0.0), ("batchSize", 0)):
        with pytest.raises((ValueError, TypeError), match=f"Expect {param}"):
            NetworkEstimator(network=small_net(), **{param: value})


def test_the_new_params_and_the_best_epoch_are_saved(spark, tmp_path):
    stopping = EarlyStopping(monitor="val_auc", patience=2, max_seconds=60.0)
    est = NetworkEstimator(network=small_net(seed=49), learningRate=0.003, batchSize=4, earlyStopping=stopping,
                           validationIndicatorCol="is_val", metrics=["f1", "auc"], rawPredictionCol="raw")
    est.write().save(str(tmp_path / "est"))
    back = NetworkEstimator.load(str(tmp_path / "est"))
    assert (back.getLearningRate(), back.getBatchSize(), back.getEarlyStopping(), back.getMetrics(),
            back.getValidationIndicatorCol(), back.getRawPredictionCol()) == (0.003, 4, stopping, ["f1", "auc"],
                                                                              "is_val", "raw")
    model = _trained_model(seed=50)
    model.best_epoch, model.history = 2, [{"epoch": 1}, {"epoch": 2}]
    model.write().save(str(tmp_path / "model"))
    loaded = NetworkModel.load(str(tmp_path / "model"))
    assert loaded.best_epoch == 2 and loaded.history == model.history


def test_pipelines_saved_by_the_release_before_load_and_write_vectors(spark, tmp_path):
    from pyspark.ml import Pipeline, PipelineModel

    for name in ("pipeline_model", "pipeline_estimator"):
        shutil.copytree(LEGACY / name, tmp_path / name)
    x, y = blobs(24, seed=51)
    df = _frame(spark, x, y)
    fitted = PipelineModel.load(str(tmp_path / "pipeline_model"))
    stage = fitted.stages[-1]
    assert isinstance(stage, NetworkModel) and stage.best_epoch is None and len(stage.history) == 2
    out = fitted.transform(df)
    assert dict(out.dtypes)["probability"] == "vector" and "rawPrediction" in out.columns
    (prob,) = _sorted(out.select("id", "probability").toArrow(), "probability")
    np.testing.assert_allclose(prob, stage.network.output(x), rtol=1e-6)
    pipeline = Pipeline.load(str(tmp_path / "pipeline_estimator"))
    est = pipeline.getStages()[0]
    assert est.getEarlyStopping() is None and est.getBatchSize() == 4 and est.getEpochs() == 2
    assert est.getLearningRate() == 0.01  # the network's own
    assert isinstance(pipeline.fit(df).stages[-1], NetworkModel)
