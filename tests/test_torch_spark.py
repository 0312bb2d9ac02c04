"""A TorchModel wherever a Network goes, on a real local[2] Spark and on
Spark Connect: both masters (a round is the weighted mean of torch
replicas, BatchNorm statistics included), evaluate/score/predict,
checkpoints and resume, a NetworkEstimator in a Pipeline saved and
loaded, and a factory missing on the executors named as such.

Executors import the factories "tests.torch_models:..." by name (the
conftest puts the repository root on their PYTHONPATH)."""
import os

import numpy as np
import pytest

from sparkavg.configurable import ConfigError
from sparkavg.evaluation import Evaluation
from sparkavg.nn import Adam, load_model
from sparkavg.spark import DataOptions, GradientSharing, ParameterAveraging, SparkTrainer
from sparkavg.torch import TorchModel

from .nets import averaged_updater_state, blobs, fit_replicas, straight_and_resumed, vectors

pytestmark = [pytest.mark.spark, pytest.mark.slow]

FLAVOURS = ["classic", "connect"]


def _session(request, flavour):
    return request.getfixturevalue("spark" if flavour == "classic" else "connect")


def _frame(session, x, y, partitions=1):
    rows = [(i, row.reshape(-1).tolist(), int(label)) for i, (row, label) in enumerate(zip(x, y))]
    return session.createDataFrame(rows, "id long, features array<float>, label long").coalesce(partitions)


def _conv_bn(seed):
    return TorchModel("tests.torch_models:conv_bn", updater=Adam(lr=0.01), input_shape=(1, 4, 4), seed=seed)


def _mlp(seed):
    return TorchModel("tests.torch_models:mlp", updater=Adam(lr=0.01), input_shape=(1, 4, 4), seed=seed)


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_averaging_round_is_the_mean_of_torch_replicas_and_inference_matches(request, flavour):
    session = _session(request, flavour)
    x, y = blobs(16, seed=1)
    net = _conv_bn(seed=2)
    start = net.clone()
    master = ParameterAveraging(batch_size_per_worker=4, averaging_frequency=2, workers=2,
                                data=DataOptions(repartition="never"))
    trainer = SparkTrainer(session, net, master)
    df = _frame(session, x, y)
    trainer.fit(df, epochs=1)
    # Minibatches 0..3 = examples [0:4], [4:8], [8:12], [12:16]; dealt [[0, 2], [1, 3]].
    replicas = fit_replicas(start, x, y, ([0, 2], [1, 3]))
    for key in ("params", "updater", "buffers"):
        expected = (replicas[0].state[key] + replicas[1].state[key]) / 2
        if key == "updater":  # the default preset's moment correction: Adam's v from the spread of m, per tensor
            expected = averaged_updater_state(start, replicas)
        np.testing.assert_allclose(net.state[key], expected, rtol=1e-5, atol=1e-6, err_msg=key)
    assert net.buffers[-1] == 2 and np.abs(net.buffers[:8] - start.buffers[:8]).max() > 0  # BatchNorm's
    assert net.iteration == 2 and net.epoch == 1

    assert trainer.evaluate(df) == Evaluation(2).eval(y, net.output(x))
    assert trainer.score(df) == pytest.approx(net.score(x, y), rel=1e-5)
    if flavour == "connect":
        table = trainer.predict(df).select("id", "output").toArrow()
        got = np.stack(table.column("output").to_pylist())[np.argsort(table.column("id").to_numpy())]
        np.testing.assert_allclose(got, net.output(x), rtol=1e-5, atol=1e-6)
    trainer.close()


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_sharing_trains_a_torch_module_and_replicas_agree(request, flavour):
    session = _session(request, flavour)
    x, y = blobs(300, seed=3)
    net = _conv_bn(seed=4)
    master = GradientSharing(threshold=1e-3, batch_size_per_worker=10, workers=2)
    with SparkTrainer(session, net, master) as trainer:
        df = _frame(session, x, y, partitions=2)
        trainer.fit(df, epochs=2)
        assert [h["examples"] for h in trainer.history] == [300, 300]
        assert max(h["replica_max_abs_diff"] for h in trainer.history) <= 1e-4
        assert trainer.evaluate(df).accuracy() > 0.9
        assert trainer.stats.counters["messages_sent"] > 0
    assert net.buffers[-1] > 0  # BatchNorm statistics averaged in at the epoch's end


def test_checkpoint_resume_and_model_files_on_connect(connect, tmp_path):
    x, y = blobs(60, seed=5)
    df = _frame(connect, x, y)
    master = ParameterAveraging(batch_size_per_worker=6, averaging_frequency=2, workers=2)
    ckpt = str(tmp_path / "ckpt")
    straight, resumed, _ = straight_and_resumed(connect, _mlp, master, df, ckpt, seed=6)
    np.testing.assert_allclose(resumed.params, straight.params, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(resumed.updater_state, straight.updater_state, rtol=1e-5, atol=1e-7)
    saved = load_model(os.path.join(ckpt, sorted(d for d in os.listdir(ckpt) if d.startswith("epoch-"))[-1],
                                    "network.npz"))
    assert isinstance(saved, TorchModel) and saved.epoch == 3
    np.testing.assert_array_equal(saved.params, resumed.params)
    other = TorchModel("tests.torch_models:mlp", factory_kwargs={"hidden": 9}, input_shape=(1, 4, 4))
    with pytest.raises(ValueError, match="fingerprint|another|architecture|belong"):
        SparkTrainer(connect, other, master, checkpoint_dir=ckpt).fit(df, epochs=4, resume_from=ckpt)


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_estimator_of_a_torch_model_in_a_pipeline_saves_and_loads(request, flavour, tmp_path):
    from pyspark.ml import Pipeline, PipelineModel

    from sparkavg.ml import NetworkEstimator, NetworkModel

    session = _session(request, flavour)
    x, y = blobs(120, seed=7)
    df = _frame(session, x, y, partitions=2)
    start = _mlp(seed=8)
    est = NetworkEstimator(network=start, master=ParameterAveraging(batch_size_per_worker=8, workers=2), epochs=2)
    fitted = Pipeline(stages=[est]).fit(df)
    model = fitted.stages[-1]
    assert isinstance(model, NetworkModel) and isinstance(model.network, TorchModel)
    table = fitted.transform(df).select("id", "prediction", "probability").toArrow()
    order = np.argsort(table.column("id").to_numpy())
    prob = vectors(table.column("probability"))[order]
    np.testing.assert_allclose(prob, model.network.output(x), rtol=1e-5, atol=1e-6)
    assert np.mean(table.column("prediction").to_numpy()[order] == y) > 0.9

    fitted.write().overwrite().save(str(tmp_path / "fitted"))
    loaded = PipelineModel.load(str(tmp_path / "fitted"))
    assert isinstance(loaded.stages[-1].network, TorchModel)
    table2 = loaded.transform(df).select("id", "probability").toArrow()
    prob2 = vectors(table2.column("probability"))[np.argsort(table2.column("id").to_numpy())]
    np.testing.assert_array_equal(prob2, prob)
    Pipeline(stages=[est]).write().save(str(tmp_path / "pipeline"))
    stage = Pipeline.load(str(tmp_path / "pipeline")).getStages()[0]
    assert isinstance(stage.getNetwork(), TorchModel)
    np.testing.assert_array_equal(stage.getNetwork().params, start.params)


def test_a_factory_missing_on_the_executors_is_named(spark):
    x, y = blobs(16, seed=9)
    net = TorchModel("tests.torch_driver_only:mlp", input_shape=(1, 4, 4))  # imports here, on the driver
    trainer = SparkTrainer(spark, net, ParameterAveraging(batch_size_per_worker=4, workers=2))
    with pytest.raises(ConfigError, match=r"Cannot import the torch module factory 'tests.torch_driver_only:mlp' "
                                          r"on host .*install the package that provides it on every executor"):
        trainer.fit(_frame(spark, x, y), epochs=1)
