"""Per-row weights from a DataFrame column (``SparkTrainer(weight_col=)``,
``NetworkEstimator(weightCol=)``): unit weights train bit-identically to
none under both masters, weights decide what is learnt, bad weights are
named with their row."""
from __future__ import annotations

import numpy as np
import pytest

from sparkavg.data.validation import DataValidationError
from sparkavg.spark import GradientSharing, ParameterAveraging, SparkTrainer

from .nets import blobs, small_net

pytestmark = pytest.mark.spark


def _frame(spark, x, y, w, partitions=2):
    rows = [(r.reshape(-1).tolist(), float(t), float(wi)) for r, t, wi in zip(x, y, w)]
    return spark.createDataFrame(rows, "features array<float>, label double, w double").repartition(partitions)


@pytest.mark.parametrize("master", [ParameterAveraging(batch_size_per_worker=16, averaging_frequency=2),
                                    pytest.param(GradientSharing(batch_size_per_worker=16), marks=pytest.mark.slow)],
                         ids=["averaging", "sharing"])
def test_unit_weights_train_bit_identically_to_no_weight_column(spark, master):
    x, y = blobs(128, seed=1)
    df = _frame(spark, x, y, np.ones(len(y))).cache()
    plain, weighted = small_net(seed=2), small_net(seed=2)
    SparkTrainer(spark, plain, master).fit(df, epochs=2)
    SparkTrainer(spark, weighted, master, weight_col="w").fit(df, epochs=2)
    np.testing.assert_array_equal(plain.params, weighted.params)
    np.testing.assert_array_equal(plain.updater_state, weighted.updater_state)


@pytest.mark.slow
def test_rows_of_weight_zero_are_not_learnt(spark):
    """Half the rows carry the wrong label and weigh 0: the model learns the right rule;
    without the weights it cannot."""
    x, y = blobs(256, seed=3)
    wrong = np.arange(len(y)) % 2 == 1
    labels = np.where(wrong, 1 - y, y)
    df = _frame(spark, x, labels, np.where(wrong, 0.0, 1.0)).cache()
    clean = _frame(spark, x, y, np.ones(len(y)))
    weighted, plain = small_net(seed=4), small_net(seed=4)
    master = ParameterAveraging(batch_size_per_worker=16)
    SparkTrainer(spark, weighted, master, weight_col="w").fit(df, epochs=3)
    SparkTrainer(spark, plain, master).fit(df, epochs=3)
    assert SparkTrainer(spark, weighted, master).evaluate(clean).accuracy() > 0.95
    assert SparkTrainer(spark, plain, master).evaluate(clean).accuracy() < 0.8


@pytest.mark.parametrize("bad, message", [(-1.0, r"Bad weight at partition \d+, row \d+: expected a finite number >= 0, "
                                                 r"got -1.0"),
                                          (float("nan"), r"Bad weight column .w. at partition \d+, row \d+: 1 NaN")])
def test_a_bad_weight_is_named_with_its_row(spark, bad, message):
    x, y = blobs(32, seed=5)
    w = np.ones(len(y))
    w[7] = bad
    trainer = SparkTrainer(spark, small_net(), ParameterAveraging(batch_size_per_worker=8), weight_col="w")
    with pytest.raises(DataValidationError, match=message):
        trainer.fit(_frame(spark, x, y, w, partitions=1), epochs=1)


def test_weights_all_zero_and_weights_of_an_rdd_are_refused(spark):
    x, y = blobs(32, seed=6)
    trainer = SparkTrainer(spark, small_net(), ParameterAveraging(batch_size_per_worker=8), weight_col="w")
    with pytest.raises(ValueError, match=r"non-zero total weight .* every row's weight \(weight_col\) is 0"):
        trainer.fit(_frame(spark, x, y, np.zeros(len(y))), epochs=1)
    rdd = spark.sparkContext.parallelize(list(zip(x, y)), 2)
    with pytest.raises(ValueError, match=r"Expect a DataFrame with weight_col='w'"):
        SparkTrainer(spark, small_net(), ParameterAveraging(), weight_col="w").fit(rdd, epochs=1)
    with pytest.raises(TypeError, match="weight_col as a column name"):
        SparkTrainer(spark, small_net(), weight_col=3)


@pytest.mark.slow
def test_the_estimators_weight_col_param_is_saved_and_used(spark, tmp_path):
    from sparkavg.ml import NetworkEstimator

    x, y = blobs(128, seed=7)
    wrong = np.arange(len(y)) % 2 == 1
    df = _frame(spark, x, np.where(wrong, 1 - y, y), np.where(wrong, 0.0, 1.0))
    est = NetworkEstimator(network=small_net(seed=8), master=ParameterAveraging(batch_size_per_worker=16), epochs=3,
                           weightCol="w")
    est.write().overwrite().save(str(tmp_path / "est"))
    again = NetworkEstimator.load(str(tmp_path / "est"))
    assert again.getWeightCol() == "w"
    model = again.fit(df)
    out = model.transform(_frame(spark, x, y, np.ones(len(y)))).select("label", "prediction").toArrow()
    assert np.mean(out.column("label").to_numpy() == out.column("prediction").to_numpy()) > 0.95


@pytest.mark.slow
def test_weights_on_spark_connect(connect):
    x, y = blobs(128, seed=9)
    wrong = np.arange(len(y)) % 2 == 1
    df = _frame(connect, x, np.where(wrong, 1 - y, y), np.where(wrong, 0.0, 1.0))
    net = small_net(seed=10)
    trainer = SparkTrainer(connect, net, ParameterAveraging(batch_size_per_worker=16), weight_col="w")
    trainer.fit(df, epochs=3)
    assert np.mean(net.predict(x.reshape(len(x), 1, 4, 4)) == y) > 0.95
