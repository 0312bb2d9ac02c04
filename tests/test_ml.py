"""sparkavg.ml: NetworkEstimator -> NetworkModel as pyspark.ml stages, on a
classic session and on Spark Connect: inside a Pipeline, batched Arrow
transform, save/load (npz + JSON) with identical predictions."""
import os

import numpy as np
import pytest

from sparkavg.ml import NetworkEstimator, NetworkModel
from sparkavg.nn import Adam, Dense, Network, Output
from sparkavg.spark import GradientSharing, ParameterAveraging

from .nets import blobs, small_net, vectors

pytestmark = [pytest.mark.spark, pytest.mark.slow]

FLAVOURS = ["classic", "connect"]


def _session(request, flavour):
    return request.getfixturevalue("spark" if flavour == "classic" else "connect")


def _frame(session, x, y, partitions=2):
    rows = [(i, row.reshape(-1).tolist(), int(label)) for i, (row, label) in enumerate(zip(x, y))]
    return session.createDataFrame(rows, "id long, features array<float>, label long").repartition(partitions)


def _outputs(df, prediction="prediction", probability="probability"):
    """(ids, predictions, probabilities) in id order."""
    table = df.select("id", prediction, probability).toArrow()
    order = np.argsort(table.column("id").to_numpy())
    return (table.column("id").to_numpy()[order], table.column(prediction).to_numpy()[order],
            vectors(table.column(probability))[order].astype(np.float32))


def _trained_net(seed=0):
    x, y = blobs(64, seed=seed)
    net = small_net(seed=seed)
    for _ in range(5):
        net.fit_batch(x, y)
    return net


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_estimator_in_a_pipeline_fits_transforms_and_round_trips(request, flavour, tmp_path):
    from pyspark.ml import Pipeline, PipelineModel

    session = _session(request, flavour)
    x, y = blobs(120, seed=31)
    df = _frame(session, x, y)
    start = small_net(seed=32)
    before = start.params.copy()
    master = ParameterAveraging(batch_size_per_worker=8, averaging_frequency=3, workers=2)
    est = NetworkEstimator(network=start, master=master, epochs=2, predictionCol="pred")
    fitted = Pipeline(stages=[est]).fit(df)
    model = fitted.stages[-1]
    assert isinstance(model, NetworkModel) and len(model.history) == 2
    assert model.device == "auto"  # the master's: transform runs where the fit trained
    np.testing.assert_array_equal(start.params, before)  # fit trained a copy

    out = fitted.transform(df)
    assert out.columns == ["id", "features", "label", "pred", "rawPrediction", "probability"]
    assert dict(out.dtypes)["pred"] == "double" and dict(out.dtypes)["probability"] == "vector"
    ids, pred, prob = _outputs(out, prediction="pred")
    expected = model.network.output(x)
    np.testing.assert_allclose(prob, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(pred, np.argmax(prob, axis=1).astype(np.float64))
    assert np.mean(pred == y) > 0.9

    # A fitted PipelineModel and an unfitted Pipeline, saved and loaded through pyspark's own readers.
    fitted.write().overwrite().save(str(tmp_path / "fitted"))
    loaded = PipelineModel.load(str(tmp_path / "fitted"))
    assert isinstance(loaded.stages[-1], NetworkModel) and loaded.stages[-1].uid == model.uid
    _, pred2, prob2 = _outputs(loaded.transform(df), prediction="pred")
    np.testing.assert_array_equal(prob2, prob)
    np.testing.assert_array_equal(pred2, pred)
    Pipeline(stages=[est]).write().save(str(tmp_path / "pipeline"))
    stage = Pipeline.load(str(tmp_path / "pipeline")).getStages()[0]
    assert isinstance(stage, NetworkEstimator) and stage.uid == est.uid
    assert stage.getMaster() == master and stage.getEpochs() == 2 and stage.getPredictionCol() == "pred"
    np.testing.assert_array_equal(stage.getNetwork().params, before)


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_model_and_estimator_save_load(request, flavour, tmp_path):
    session = _session(request, flavour)
    x, y = blobs(50, seed=33)
    df = _frame(session, x, y, partitions=3)
    model = NetworkModel(network=_trained_net(seed=34), inferenceBatchSize=7)
    path = str(tmp_path / "model")
    model.write().save(path)
    assert sorted(os.listdir(path)) == ["metadata", "network.npz", "sparkavg.json"]
    with pytest.raises(FileExistsError, match="write\\(\\).overwrite\\(\\)"):
        model.write().save(path)
    model.write().overwrite().save(path)
    loaded = NetworkModel.load(path)
    assert loaded.uid == model.uid and loaded.getInferenceBatchSize() == 7
    np.testing.assert_array_equal(loaded.network.params, model.network.params)
    _, pred, prob = _outputs(model.transform(df))
    _, pred2, prob2 = _outputs(loaded.transform(df))
    np.testing.assert_array_equal(prob2, prob)
    np.testing.assert_array_equal(pred2, pred)
    np.testing.assert_allclose(prob, model.network.output(x), rtol=1e-5, atol=1e-6)

    sharing = GradientSharing(threshold=2e-3, workers=2)
    est = NetworkEstimator(network=small_net(seed=35), master=sharing, epochs=3, labelCol="target")
    est.write().save(str(tmp_path / "estimator"))
    back = NetworkEstimator.load(str(tmp_path / "estimator"))
    assert back.getMaster() == sharing and back.getEpochs() == 3 and back.getLabelCol() == "target"
    np.testing.assert_array_equal(back.getNetwork().params, est.getNetwork().params)
    with pytest.raises(ValueError, match="Expect a saved sparkavg.ml.estimator.NetworkEstimator"):
        NetworkEstimator.load(path)


def test_transform_runs_on_the_models_device(spark):
    x, y = blobs(40, seed=36)
    df = _frame(spark, x, y)
    model = NetworkModel(network=_trained_net(seed=37))
    assert model.device == "auto"
    model.device = "cpu"
    _, _, prob = _outputs(model.transform(df))
    np.testing.assert_allclose(prob, model.network.output(x), rtol=1e-5, atol=1e-6)
    # No GPU assigned by Spark here: device='gpu' fails in the task, naming what it expected.
    model.device = "gpu"
    with pytest.raises(Exception, match="DeviceError: Expect a GPU assigned to this task by Spark for "
                                        "device='gpu', got none"):
        model.transform(df).collect()
    model.device = "tpu"
    with pytest.raises(ValueError, match=r"Expect device in \{'auto', 'gpu', 'cpu'\}, got 'tpu'"):
        model.transform(df)


def test_regression_on_ml_vectors_and_bad_rows(spark):
    from pyspark.ml.functions import array_to_vector

    rng = np.random.default_rng(36)
    x = rng.standard_normal((30, 3)).astype(np.float32)
    net = Network((3,), [Dense(4, activation="tanh"), Output(2, loss="mse")], updater=Adam(lr=0.01), seed=37)
    rows = [(i, row.tolist()) for i, row in enumerate(x)]
    df = spark.createDataFrame(rows, "id long, features array<double>").withColumn(
        "features", array_to_vector("features")).repartition(2)
    _, pred, prob = _outputs(NetworkModel(network=net).transform(df))
    expected = net.output(x)
    np.testing.assert_allclose(prob, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(pred, expected[:, 0], rtol=1e-5, atol=1e-6)  # regression: the first output

    bad = spark.createDataFrame([(0, [0.0, 1.0, 2.0]), (1, [0.0, 1.0])], "id long, features array<float>")
    with pytest.raises(Exception, match=r"Bad features at partition 0, row 1: expected 3 values"):
        NetworkModel(network=net).transform(bad.coalesce(1)).collect()
    with pytest.raises(ValueError, match=r"Expect output columns .* not in the input, got \['prediction'\]"):
        NetworkModel(network=net).transform(df.withColumn("prediction", df.id))
    with pytest.raises(ValueError, match="Expect network=... \\(a sparkavg.nn.Model\\)"):
        NetworkEstimator().fit(df)


def test_uint8_features_stay_compact_train_as_scaled_floats_and_predict_alike_after_save_load(spark, tmp_path):
    """At the defaults (feature_dtype='auto') a uint8 frame's prepared
    blocks keep uint8 (a quarter of float32's bytes; None opts out) and the
    fit equals one on the same values given as float32, unscaled; with a
    declared scale (feature_dtype='uint8', scale=1/255) the fit equals one
    on the float32 frame x * (1/255), and the fitted model's transform
    applies the scale after save/load; a value uint8 cannot hold is named."""
    from sparkavg.data.validation import DataSpec, DataValidationError
    from sparkavg.spark import DataOptions
    from sparkavg.spark.data import resolve_features
    from sparkavg.spark.seam import seam_for

    x, y = blobs(96, seed=41)
    u8 = np.clip(np.round(x * 40 + 128), 0, 255).astype(np.uint8)
    scaled = u8.astype(np.float32) * np.float32(1 / 255)

    def frame(values, kind):  # partitioned by id: the frames alike
        return spark.createDataFrame([(i, r.reshape(-1).tolist(), int(label)) for i, (r, label) in
                                      enumerate(zip(values, y))],
                                     f"id long, features array<{kind}>, label long").repartition(2, "id")

    # array<smallint>: how Spark reads a Parquet UINT_8 column
    df_u8, df_f32, df_raw = frame(u8, "smallint"), frame(scaled, "float"), frame(u8.astype(np.float32), "float")
    defaults = DataOptions(placement="spark")
    compact = DataOptions(feature_dtype="uint8", scale=1 / 255, placement="spark")

    seam, spec = seam_for(spark), DataSpec.of(small_net().spec)

    def kept(data):
        prepared = seam.prepare(df_u8, spec, 8, data, resolve_features("features", spec), "label")
        try:
            blocks = prepared.rdd.map(lambda kv: (kv[1][0]["input"].dtype.str, kv[1][0]["input"].nbytes)).collect()
        finally:
            prepared.release()
        return {d for d, _ in blocks}, sum(n for _, n in blocks)

    assert kept(defaults) == ({"|u1"}, scaled.nbytes // 4)  # float32's quarter
    assert kept(DataOptions(feature_dtype=None, placement="spark")) == ({"<f4"}, scaled.nbytes)

    def fit(df, data):
        master = ParameterAveraging(batch_size_per_worker=8, averaging_frequency=2, workers=2, data=data)
        return NetworkEstimator(network=small_net(seed=42), master=master, epochs=1).fit(df)

    # The defaults: uint8 blocks train as the float32 values 0.0 .. 255.0 (no scale unless declared), bit for bit.
    model_auto, model_raw = fit(df_u8, defaults), fit(df_raw, defaults)
    assert model_auto.input_encoding is None and model_raw.input_encoding is None
    np.testing.assert_array_equal(model_auto.network.params, model_raw.network.params)

    model_u8, model_f32 = fit(df_u8, compact), fit(df_f32, defaults)
    assert model_u8.input_encoding == {"scale": 1 / 255, "normalize": None} and model_f32.input_encoding is None
    np.testing.assert_allclose(model_u8.network.params, model_f32.network.params, rtol=1e-6, atol=1e-7)
    path = str(tmp_path / "compact")
    model_u8.write().save(path)
    loaded = NetworkModel.load(path)
    assert loaded.input_encoding == model_u8.input_encoding
    ids, _, prob = _outputs(loaded.transform(df_u8))
    np.testing.assert_allclose(prob, model_u8.network.output(scaled[ids]), rtol=1e-5, atol=1e-6)

    bad = spark.createDataFrame([(0, [300] + [0] * 15, 1)], "id long, features array<smallint>, label long").coalesce(1)
    with pytest.raises(DataValidationError, match=r"partition 0, row 0: expected integers in \[0, 255\] for "
                                                  r"feature_dtype='uint8', got 300"):
        seam.prepare(bad, spec, 8, compact, resolve_features("features", spec), "label")
    with pytest.raises(ValueError, match=r"Expect feature_dtype 'auto', one of \['uint8', 'int8', 'uint16', "
                                         r"'int16', 'float16', 'float32'\] or None, got 'float64'"):
        DataOptions(feature_dtype="float64")
