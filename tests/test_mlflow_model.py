"""Every model kind as an MLflow pyfunc model, loaded back with
``mlflow.pyfunc.load_model`` (real MLflow, real local[2] Spark fits):

- a two-input Graph and a TorchModel logged by ``MLflowListener`` during a
  fit predict what ``model.output`` gives, from a pandas frame with one
  column per input name (or the fit's columns);
- a regression output, several outputs and a scalar input column, from a
  model saved as a pyfunc folder (no Spark);
- an unmarked torch factory is refused by the pyfunc loader, naming it,
  and loads inside ``sparkavg.trusting``.

(The sequential Network through the listener: tests/test_listeners.py.)"""
from __future__ import annotations

import numpy as np
import pytest

mlflow = pytest.importorskip("mlflow")
pd = pytest.importorskip("pandas")

import sparkavg  # noqa: E402
from sparkavg.nn import Adam, Dense, Graph, Network, Output  # noqa: E402
from sparkavg.spark import ParameterAveraging, SparkTrainer  # noqa: E402

from .nets import blobs, tabular, tabular_graph  # noqa: E402
from .test_listeners import mlflow_store  # noqa: E402,F401  (the fixture)

COLUMNS = {"cats": "c", "nums": "n"}


def _assert_predicts(got, want, classification=True):
    """``got`` (a pyfunc's frame) holds ``want`` (one output's array) as probability and prediction."""
    np.testing.assert_allclose(np.stack(got["probability"]), want, rtol=1e-6, atol=1e-7)
    expected = want.argmax(axis=1) if classification else want[:, 0]
    np.testing.assert_array_equal(got["prediction"].to_numpy(), expected.astype(np.float64))


# --------------------------------------------------------- fits with the listener
@pytest.mark.spark
def test_a_two_input_graph_logged_by_the_listener_loads_as_pyfunc(spark, mlflow_store):
    from sparkavg.listeners import MLflowListener

    cats, nums, y = tabular(64, seed=5)
    rows = [(c.tolist(), v.tolist(), int(label)) for c, v, label in zip(cats, nums, y)]
    table = spark.createDataFrame(rows, "c array<long>, n array<float>, label long").coalesce(2)
    net, listener = tabular_graph(seed=6), MLflowListener()
    with SparkTrainer(spark, net, ParameterAveraging(batch_size_per_worker=16, workers=2), features_col=COLUMNS,
                      listeners=[listener]) as trainer:
        trainer.fit(table, epochs=1)
    assert trainer.listener_errors == [] and listener.model_uri is not None

    model = mlflow_store.pyfunc.load_model(listener.model_uri)
    want = net.output({"cats": cats, "nums": nums})
    by_input = pd.DataFrame({"cats": list(cats), "nums": list(nums), "other": 0})  # other columns are ignored
    _assert_predicts(model.predict(by_input), want)
    by_fit_column = pd.DataFrame({"c": list(cats), "n": list(nums)})  # the columns the fit read
    _assert_predicts(model.predict(by_fit_column), want)
    with pytest.raises(ValueError, match=r"input 'nums' \(column 'nums' or 'n'\).*got columns \['cats', 'x'\]"):
        model.predict(pd.DataFrame({"cats": list(cats), "x": list(nums)}))
    with pytest.raises(ValueError, match=r"3 values per row for input 'nums' of shape \(3,\) \(column 'nums'\), got "
                                         r"rows of 2"):
        model.predict(pd.DataFrame({"cats": list(cats), "nums": list(nums[:, :2])}))


@pytest.mark.spark
def test_a_torch_model_logged_by_the_listener_loads_as_pyfunc(sc, mlflow_store):
    pytest.importorskip("torch")
    from sparkavg.listeners import MLflowListener
    from sparkavg.torch import TorchModel

    x, y = blobs(48, seed=7)
    net = TorchModel("tests.torch_models:mlp", updater=Adam(lr=0.01), input_shape=(1, 4, 4), seed=8)
    listener = MLflowListener()
    with SparkTrainer(sc, net, ParameterAveraging(batch_size_per_worker=8, workers=2),
                      listeners=[listener]) as trainer:
        trainer.fit(sc.parallelize(list(zip(x, y.tolist())), 2), epochs=1)
    assert trainer.listener_errors == [] and net.iteration > 0

    model = mlflow_store.pyfunc.load_model(listener.model_uri)
    _assert_predicts(model.predict(pd.DataFrame({"features": list(x.reshape(len(x), -1))})), net.output(x))
    _assert_predicts(model.predict(pd.DataFrame({"input": list(x)})), net.output(x))  # by input name, shaped


# --------------------------------------------------------- saved pyfunc folders
def test_regression_several_outputs_and_scalar_inputs_predict_as_the_model(tmp_path):
    from sparkavg.listeners.mlflow_model import save_network_model

    rng = np.random.default_rng(3)
    graph = Graph({"x": (3,), "bias": (1,)},
                  [("h", Dense(5, activation="tanh"), "x"), ("b", Dense(5, activation="tanh"), "bias"),
                   ("cls", Output(3), "h"), ("reg", Output(2, loss="mse"), "b")],
                  ["cls", "reg"], seed=4)
    x, bias = rng.standard_normal((6, 3)).astype(np.float32), rng.standard_normal((6, 1)).astype(np.float32)
    save_network_model(graph, str(tmp_path / "graph"))
    got = mlflow.pyfunc.load_model(str(tmp_path / "graph")).predict(
        pd.DataFrame({"bias": bias[:, 0], "x": list(x)}))  # one scalar per row for the (1,) input
    want = graph.output({"x": x, "bias": bias})
    assert list(got.columns) == ["prediction_cls", "probability_cls", "prediction_reg", "probability_reg"]
    np.testing.assert_allclose(np.stack(got["probability_cls"]), want["cls"], rtol=1e-6)
    np.testing.assert_array_equal(got["prediction_cls"], want["cls"].argmax(axis=1).astype(np.float64))
    np.testing.assert_allclose(np.stack(got["probability_reg"]), want["reg"], rtol=1e-6)
    np.testing.assert_array_equal(got["prediction_reg"], want["reg"][:, 0].astype(np.float64))

    net = Network((3,), [Dense(4, activation="tanh"), Output(1, loss="mse")], seed=5)
    save_network_model(net, str(tmp_path / "net"))
    model = mlflow.pyfunc.load_model(str(tmp_path / "net"))
    _assert_predicts(model.predict(pd.DataFrame(x)), net.output(x), classification=False)  # a column per feature
    with pytest.raises(ValueError, match=r"Expect 3 features per row \(input shape \(3,\)\), got 2"):
        model.predict(pd.DataFrame(x[:, :2]))
    _assert_predicts(model.predict(x), net.output(x), classification=False)  # an array as it is
    as_dict = mlflow.pyfunc.load_model(str(tmp_path / "graph")).predict({"x": x, "bias": bias})  # arrays by input
    np.testing.assert_array_equal(np.stack(as_dict["probability_reg"]), np.stack(got["probability_reg"]))


def test_an_unmarked_torch_factory_is_refused_by_the_pyfunc_loader_unless_trusted(tmp_path, mlflow_store):
    pytest.importorskip("torch")
    from sparkavg.listeners.mlflow_model import log_network
    from sparkavg.nn.serialization import ModelFileError
    from sparkavg.torch import TorchModel

    x, y = blobs(8, seed=9)
    net = TorchModel("tests.torch_models:unmarked_mlp", updater=Adam(lr=0.01), input_shape=(1, 4, 4), seed=10)
    net.fit_batch(x, y)
    with mlflow_store.start_run():
        uri = log_network(net).model_uri
    with pytest.raises(ModelFileError, match=r"'tests.torch_models:unmarked_mlp' .* not marked as a factory"):
        mlflow_store.pyfunc.load_model(uri)
    with sparkavg.trusting({"tests.torch_models:unmarked_mlp"}):
        model = mlflow_store.pyfunc.load_model(uri)
    _assert_predicts(model.predict(pd.DataFrame({"features": list(x.reshape(8, -1))})), net.output(x))
