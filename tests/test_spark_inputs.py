"""Models with several inputs trained from a DataFrame on a real local[2]
Spark: feature columns as named inputs of a Graph (integer id columns kept
integer), both masters, both minibatch placements, predict, evaluation,
the pyspark.ml front with save/load, and errors naming the column."""
import numpy as np
import pytest

from sparkavg.data.validation import DataSpec, DataValidationError
from sparkavg.spark import DataOptions, GradientSharing, ParameterAveraging, SparkTrainer
from sparkavg.spark.data import minibatch_frame, resolve_features

from .nets import tabular, tabular_graph
from .test_connect import _mode

pytestmark = pytest.mark.spark

COLUMNS = {"cats": "c", "nums": "n"}


def _table(session, n, seed, partitions=2):
    cats, nums, y = tabular(n, seed)
    rows = [(c.tolist(), v.tolist(), int(label)) for c, v, label in zip(cats, nums, y)]
    return session.createDataFrame(rows, "c array<long>, n array<float>, label long").coalesce(partitions)


@pytest.fixture(scope="module")
def table(spark):
    return _table(spark, 256, seed=1)


def test_features_col_names_the_inputs_by_dict_or_in_order():
    spec = DataSpec.of(tabular_graph().spec)
    assert [(i.name, i.dtype) for i in spec.inputs] == [("cats", "int64"), ("nums", "float32")]
    by_dict, by_list = resolve_features(COLUMNS, spec), resolve_features(["c", "n"], spec)
    assert by_dict == by_list and [(i.name, i.column) for i in by_dict] == [("cats", "c"), ("nums", "n")]
    with pytest.raises(ValueError, match=r"a list of 2 columns for the model's inputs \['cats', 'nums'\], got one"):
        resolve_features("features", spec)
    with pytest.raises(ValueError, match=r"keyed by the model's inputs \['cats', 'nums'\], got keys \['cats'\]"):
        resolve_features({"cats": "c"}, spec)
    with pytest.raises(ValueError, match="Expect 2 feature columns"):
        resolve_features(["c"], spec)


def test_a_two_input_graph_trains_by_averaging_from_a_dataframe(spark, table):
    """Spark blocks (the pipeline test below and gradient sharing use files)."""
    master = ParameterAveraging(batch_size_per_worker=16, workers=2, data=DataOptions(placement="spark"))
    net = tabular_graph(seed=3)
    with SparkTrainer(spark, net, master, features_col=COLUMNS) as trainer:
        trainer.eval_batch_size = 48  # uneven chunks (EVAL_BATCH_SIZE, 64, divides the table's two partitions)
        trainer.fit(table, epochs=6)
        assert trainer.history[-1]["examples"] == 256  # examples, not inputs, counted (the round weights)
        assert trainer.evaluate(table).accuracy() > 0.9
        cats, nums, y = tabular(256, 1)
        assert trainer.score(table) == pytest.approx(net.score({"cats": cats, "nums": nums}, y), rel=1e-4)
        out = np.array(trainer.predict(table).collect())
    np.testing.assert_allclose(out, net.output({"cats": cats, "nums": nums}), rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_a_two_input_graph_trains_by_gradient_sharing_from_a_dataframe(spark, table):
    net = tabular_graph(seed=3)
    with SparkTrainer(spark, net, GradientSharing(batch_size_per_worker=16, workers=2, threshold=0.01),
                      features_col=["c", "n"]) as trainer:
        trainer.fit(table, epochs=6)
        assert trainer.history[-1]["examples"] == 256
        assert trainer.history[-1]["replica_max_abs_diff"] < 1e-4
        assert trainer.evaluate(table).accuracy() > 0.8


def test_integer_ids_stay_integer_in_the_minibatches(spark):
    """An id of 2**24 + 1 (which float32 rounds to 2**24) reaches the minibatch exactly."""
    from sparkavg.spark.executor.arrow import from_npy, inputs_from_bytes

    big = 2 ** 24 + 1
    df = spark.createDataFrame([([big, 1], [0.5, 0.25, 0.0], 1), ([3, big + 2], [1.0, 2.0, 3.0], 0)],
                               "c array<long>, n array<double>, label long").coalesce(1)
    spec = DataSpec.of(tabular_graph().spec)
    rows = minibatch_frame(df, spec, 4, resolve_features(COLUMNS, spec), "label").collect()
    x, y = inputs_from_bytes(rows[0]["x"]), from_npy(rows[0]["y"])
    assert x["cats"].dtype == np.int64 and x["cats"].tolist() == [[big, 1], [3, big + 2]]
    assert x["nums"].dtype == np.float32 and x["nums"].shape == (2, 3) and y.tolist() == [1, 0]


@pytest.mark.parametrize("rows, schema, message", [
    ([([1, 2], [0.0, float("nan"), 1.0], 0)], "c array<long>, n array<double>, label long",
     r"features column 'n' \(input 'nums'\) at partition 0, row 1: 1 NaN/inf"),
    ([([1.0, 2.5], [0.0, 0.0, 1.0], 0)], "c array<double>, n array<double>, label long",
     r"features column 'c' \(input 'cats'\) at partition 0, row 1: expected integer ids, got 2.5"),
    ([([1, -2], [0.0, 0.0, 1.0], 0)], "c array<long>, n array<double>, label long",
     r"features column 'c' \(input 'cats'\) at partition 0, row 1: expected ids >= 0, got -2"),
    ([([1], [0.0, 0.0, 1.0], 0)], "c array<long>, n array<double>, label long",
     r"features column 'c' \(input 'cats'\) at partition 0, row 1: expected 2 values \(input shape \(2,\)\), "
     r"got shape \(1,\)"),
])
def test_bad_values_are_named_by_partition_row_and_column(spark, rows, schema, message):
    good = ([0.0, 1.0] if "c array<double>" in schema else [0, 1], [0.0, 0.0, 0.0], 1)
    df = spark.createDataFrame([good] + rows, schema).coalesce(1)
    with SparkTrainer(spark, tabular_graph(), ParameterAveraging(batch_size_per_worker=4, workers=2),
                      features_col=COLUMNS) as trainer:
        with pytest.raises(DataValidationError, match=message):
            trainer.fit(df)


def test_a_missing_input_column_is_named(spark, table):
    with SparkTrainer(spark, tabular_graph(), ParameterAveraging(workers=2),
                      features_col={"cats": "c", "nums": "numbers"}) as trainer:
        with pytest.raises(DataValidationError, match=r"'numbers' \(input 'nums'\).*missing \['numbers'\]"):
            trainer.fit(table)


@pytest.mark.slow
def test_a_two_input_graph_in_a_pipeline_with_save_and_load(spark, table, tmp_path):
    from pyspark.ml import Pipeline, PipelineModel

    from sparkavg.ml import NetworkEstimator, NetworkModel

    est = NetworkEstimator(network=tabular_graph(seed=4), featuresCols=["c", "n"], epochs=6,
                           master=ParameterAveraging(batch_size_per_worker=16, workers=2))
    fitted = Pipeline(stages=[est]).fit(table)
    path = str(tmp_path / "pipeline")
    fitted.write().overwrite().save(path)
    loaded = PipelineModel.load(path)
    model = loaded.stages[-1]
    assert isinstance(model, NetworkModel) and model.getFeaturesCols() == ["c", "n"]
    rows = loaded.transform(table).select("c", "n", "label", "probability", "prediction").collect()
    cats = np.array([r.c for r in rows], np.int64)
    nums = np.array([r.n for r in rows], np.float32)
    probs = np.array([r.probability for r in rows], np.float32)
    np.testing.assert_allclose(probs, model.network.output({"cats": cats, "nums": nums}), rtol=1e-5, atol=1e-6)
    assert np.mean([r.prediction == r.label for r in rows]) > 0.9


@pytest.mark.slow
def test_a_two_input_graph_on_connect_equals_classic(spark, connect):
    """Classic with files, Connect with Spark blocks (its Arrow minibatch rows)."""
    models = {}
    for name, session in (("classic", spark), ("connect", connect)):
        master = ParameterAveraging(batch_size_per_worker=16, averaging_frequency=2, workers=2,
                                    data=DataOptions(repartition="never", placement="spark" if name == "connect"
                                                     else "auto"))
        net = tabular_graph(seed=5)
        with _mode(name), SparkTrainer(session, net, master, features_col=COLUMNS) as trainer:
            df = _table(session, 96, seed=7, partitions=1)
            trainer.fit(df, epochs=2)
            assert trainer.evaluate(df).count == 96
            if name == "connect":
                out = trainer.predict(df).select("output").toArrow().column(0).to_pylist()
                assert len(out) == 96
        models[name] = net
    np.testing.assert_allclose(models["connect"].params, models["classic"].params, rtol=1e-5, atol=1e-6)


def test_a_one_input_id_model_evaluates_and_predicts_from_a_long_column(spark):
    """One input of ids (a Network starting with an Embedding): the spec says int64, the column stays integer."""
    from sparkavg.nn import SGD, Dense, Embedding, Flatten, Network, Output

    net = Network((2,), [Embedding(8, 3), Flatten(), Dense(4, activation="tanh"), Output(2)], updater=SGD(0.1),
                  seed=1)
    assert DataSpec.of(net.spec).dtype == "int64"
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 8, (40, 2))
    y = (ids[:, 0] >= 4).astype(int)
    df = spark.createDataFrame([(r.tolist(), int(label)) for r, label in zip(ids, y)],
                               "features array<long>, label long").coalesce(1)
    with SparkTrainer(spark, net, ParameterAveraging(batch_size_per_worker=8, workers=2)) as trainer:
        trainer.fit(df, epochs=2)
        assert trainer.evaluate(df).count == 40
        np.testing.assert_allclose(np.array(trainer.predict(df).collect()), net.output(ids), rtol=1e-5, atol=1e-6)
