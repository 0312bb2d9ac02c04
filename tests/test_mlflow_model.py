"""Every model kind as an MLflow pyfunc model, loaded back with
``mlflow.pyfunc.load_model`` (real MLflow, real local[2] Spark fits):

- a two-input Graph and a TorchModel logged by ``MLflowListener`` during a
  fit predict what ``model.output`` gives, from a pandas frame with one
  column per input name (or the fit's columns);
- a regression output, several outputs and a scalar input column, from a
  model saved as a pyfunc folder (no Spark);
- an unmarked torch factory is refused by the pyfunc loader, naming it,
  and loads inside ``sparkavg.trusting``;
- "MLflow on a fresh install": ``MLflowListener()`` with no tracking URI
  and no MLflow environment variable, in a new process and an empty
  folder, logs the fit into MLflow's default store and the model loads
  back there, in that process and in another one; a store that does not
  open is named with the error and what would open it (what to install
  where mlflow-skinny alone cannot open MLflow's default store).

(The sequential Network through the listener: tests/test_listeners.py.)"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

mlflow = pytest.importorskip("mlflow")
pd = pytest.importorskip("pandas")

import sparkavg  # noqa: E402
from sparkavg.nn import Adam, Dense, Graph, Network, Output  # noqa: E402
from sparkavg.spark import ParameterAveraging, SparkTrainer  # noqa: E402

from .nets import blobs, tabular, tabular_graph  # noqa: E402
from .test_listeners import mlflow_store  # noqa: E402,F401  (the fixture)

REPO = Path(__file__).resolve().parents[1]
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


@pytest.mark.slow
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
    with pytest.raises(ValueError, match=r"keyed by the model's inputs \['bias', 'x'\], missing \['bias'\]; got keys "
                                         r"\['x'\]"):
        mlflow.pyfunc.load_model(str(tmp_path / "graph")).predict({"x": x})


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


# --------------------------------------------------------- a fresh install
FRESH_FIT = """
import json, logging, sys
import numpy as np, pandas as pd, mlflow
from pyspark.sql import SparkSession
import sparkavg
from sparkavg.listeners import MLflowListener
from sparkavg.spark import ParameterAveraging, SparkTrainer, recommended_conf
from tests.nets import blobs, small_net

logging.basicConfig(level=logging.INFO, stream=sys.stderr)
spark = (SparkSession.builder.master("local[2]").config(map=recommended_conf("local[2]"))
         .config("spark.ui.enabled", "false").config("spark.driver.bindAddress", "127.0.0.1")
         .config("spark.driver.host", "127.0.0.1").getOrCreate())
x, y = blobs(32, seed=1)
trainer = SparkTrainer(spark, small_net(seed=2), ParameterAveraging(workers=2, batch_size_per_worker=8),
                       listeners=[MLflowListener()])
trainer.fit(spark.sparkContext.parallelize(list(zip(x, y.tolist())), 2), epochs=1)
spark.stop()
listener = trainer.listeners[0]
model = mlflow.pyfunc.load_model(listener.model_uri)
got = model.predict(pd.DataFrame({"features": list(x.reshape(len(x), -1))}))
run = mlflow.tracking.MlflowClient().get_run(listener.run_id)
print(json.dumps({"sparkavg": sparkavg.__file__, "errors": trainer.listener_errors, "uri": listener.model_uri,
                  "tracking_uri": mlflow.get_tracking_uri(), "status": run.info.status,
                  "loss": run.data.metrics.get("loss"), "history_loss": trainer.history[0]["loss"],
                  "got": np.stack(got["probability"]).tolist(), "want": trainer.network.output(x).tolist()}))
"""

FRESH_LOAD = """
import json, sys
import numpy as np, pandas as pd, mlflow
from tests.nets import blobs

x, _ = blobs(32, seed=1)
got = mlflow.pyfunc.load_model(sys.argv[1]).predict(pd.DataFrame({"features": list(x.reshape(len(x), -1))}))
print(json.dumps({"tracking_uri": mlflow.get_tracking_uri(), "got": np.stack(got["probability"]).tolist()}))
"""


def _folders(tmp_path) -> Path:
    """An empty working folder ``work`` and a new ``home`` beside it; returns ``work``."""
    (tmp_path / "home").mkdir()
    (tmp_path / "work").mkdir()
    return tmp_path / "work"


def _fresh(code: str, cwd: Path, *args: str) -> dict:
    """``code`` in a new interpreter of this environment as a user's shell runs it: an empty folder, a
    new HOME, the environment's bin first on PATH (an activated venv) -- and nothing else but the
    repository on PYTHONPATH (for the code under test and tests.nets) and JAVA_HOME if set: no MLflow
    variable, no tracking URI."""
    env = {"PATH": os.pathsep.join([str(Path(sys.executable).parent), "/usr/local/bin", "/usr/bin", "/bin"]),
           "HOME": str(cwd.parent / "home"), "PYTHONPATH": str(REPO)}
    if "JAVA_HOME" in os.environ:
        env["JAVA_HOME"] = os.environ["JAVA_HOME"]
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=420)
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stderr[-6000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.spark
@pytest.mark.slow
def test_the_listener_logs_on_a_fresh_install_with_no_tracking_settings(tmp_path):
    work = _folders(tmp_path)
    fit = _fresh(FRESH_FIT, work)
    assert fit["sparkavg"].startswith(str(REPO))  # the code under test
    assert fit["errors"] == [], fit["errors"]  # the listener raised nothing: it logged
    assert fit["status"] == "FINISHED" and fit["loss"] == pytest.approx(fit["history_loss"])
    assert fit["tracking_uri"] == f"sqlite:///{work}/mlflow.db" and (work / "mlflow.db").is_file()  # MLflow's default
    np.testing.assert_allclose(fit["got"], fit["want"], rtol=1e-6)
    later = _fresh(FRESH_LOAD, work, fit["uri"])  # another process, the same folder: the model is there
    assert later["tracking_uri"] == fit["tracking_uri"]
    np.testing.assert_allclose(later["got"], fit["want"], rtol=1e-6)


def test_a_store_that_does_not_open_is_named_with_what_would_open_it(tmp_path, mlflow_store):
    """A SQLite file under a plain file cannot be created: the listener's fit_start says which store failed,
    why, and what to install or set (the dispatcher logs it as the listener's one warning)."""
    from types import SimpleNamespace

    from sparkavg.listeners import MLflowListener

    (tmp_path / "plain").write_text("a file, not a folder")
    uri = f"sqlite:///{tmp_path}/plain/mlflow.db"
    listener = MLflowListener(uri)
    expected = (rf"could not start a run in the MLflow tracking store '{re.escape(uri)}' \((FileExistsError|"
                r"OperationalError): .*\); or name a store that opens here: MLflowListener\(tracking_uri=...\) or "
                r"\$MLFLOW_TRACKING_URI")
    with pytest.raises(RuntimeError, match=expected) as info:
        listener.on_fit_start(SimpleNamespace(), {"run_id": "r"})
    assert "pip install" not in str(info.value)  # sqlalchemy and alembic are here: the path is what is wrong
    assert listener.run_id is None and mlflow_store.active_run() is None


SKINNY_ONLY = """
import json, sys
sys.modules["sqlalchemy"] = sys.modules["alembic"] = None  # as if never installed: import fails, find_spec is None
from types import SimpleNamespace
from sparkavg.listeners import MLflowListener
try:
    MLflowListener().on_fit_start(SimpleNamespace(), {"run_id": "r"})
except RuntimeError as exc:
    print(json.dumps({"error": str(exc)}))
"""


def test_the_store_error_of_mlflow_skinny_alone_says_what_to_install(tmp_path):
    """The issue's fresh install before the [mlflow] extra named sqlalchemy and alembic: MLflow's default
    SQLite store does not open, and the error says so (a new process with no MLflow variable)."""
    error = _fresh(SKINNY_ONLY, _folders(tmp_path))["error"]
    assert f"the MLflow tracking store 'sqlite:///{tmp_path}/work/mlflow.db'" in error, error
    assert ("MLflow's SQLite store (its default, ./mlflow.db) needs sqlalchemy and alembic, not installed here: "
            "pip install 'sparkavg[mlflow]'") in error, error


@pytest.mark.spark
def test_the_pyfunc_applies_the_fits_input_encoding(spark, mlflow_store):
    from sparkavg.listeners import MLflowListener
    from sparkavg.spark import DataOptions

    from .nets import small_net

    x, y = blobs(32, seed=11)
    pixels = np.round((x - x.min()) / (x.max() - x.min()) * 255).astype(np.float32)  # 0..255, as raw images
    rows = [(row.reshape(-1).tolist(), int(label)) for row, label in zip(pixels, y)]
    df = spark.createDataFrame(rows, "features array<float>, label long").repartition(2)
    net = small_net(seed=12)
    master = ParameterAveraging(batch_size_per_worker=4, workers=2, averaging_frequency=2,
                                data=DataOptions(scale=1 / 255, normalize=(0.5, 0.25)))
    listener = MLflowListener()
    with mlflow.start_run():
        SparkTrainer(spark, net, master, listeners=[listener], progress=False).fit(df, epochs=1)
    got = mlflow.pyfunc.load_model(listener.model_uri).predict(pd.DataFrame({"features": list(pixels.reshape(32, -1))}))
    _assert_predicts(got, net.output((pixels / np.float32(255) - np.float32(0.5)) / np.float32(0.25)))
    raw = net.output(pixels)  # what the pyfunc gave before: the model fed raw pixels
    assert not np.allclose(np.stack(got["probability"]), raw, atol=1e-3)
