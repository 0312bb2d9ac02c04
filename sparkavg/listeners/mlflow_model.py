"""A sparkavg network as an MLflow ``pyfunc`` model, loaded from its npz + JSON file.

:func:`log_network` logs the network with MLflow's "models from code": the
model's code is :mod:`sparkavg.listeners._mlflow_model_code` (three lines
that name :class:`NetworkPyfunc`), its one artifact the file written by
:meth:`sparkavg.nn.Network.save`.  Nothing is pickled, neither the network
nor the model class; loading needs sparkavg installed.

``mlflow.pyfunc.load_model(uri).predict(frame)`` takes a pandas DataFrame
whose ``features`` column (or only column) holds one flat or shaped array
per row, or whose columns are the flat features; it returns a DataFrame
with ``prediction`` (float64: the class index, or the first output of a
regression network) and ``probability`` (the network's outputs, a float32
array per row), as :class:`sparkavg.ml.NetworkModel` does.
"""
from __future__ import annotations

import math
import os
import tempfile

import numpy as np
import pandas as pd

__all__ = ["NetworkPyfunc", "log_network", "save_network_model", "features_matrix"]

#: The artifact key of the network file.
ARTIFACT = "network"
#: Where the model code lives (copied into the logged model).
CODE_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_mlflow_model_code.py")


def features_matrix(frame, input_shape, features_col: str = "features") -> np.ndarray:
    """The (N, *input_shape) float32 batch of a pandas DataFrame or an array.

    A ``features_col`` column (or a lone column) of per-row arrays is
    stacked; otherwise every column is one flat feature, in order.
    """
    width = math.prod(input_shape)
    if hasattr(frame, "columns"):
        column = features_col if features_col in frame.columns else (
            frame.columns[0] if len(frame.columns) == 1 else None)
        if column is not None and len(frame) and np.ndim(frame[column].iloc[0]) >= 1:
            rows = [np.asarray(v, dtype=np.float32).reshape(-1) for v in frame[column]]
            x = np.stack(rows) if rows else np.zeros((0, width), np.float32)
        else:
            x = frame.to_numpy(dtype=np.float32)
    else:
        x = np.asarray(frame, dtype=np.float32)
    x = x.reshape(len(x), -1)
    if x.shape[1] != width:
        raise ValueError(f"Expect {width} features per row (input shape {tuple(input_shape)}), got {x.shape[1]}")
    return x.reshape((len(x),) + tuple(input_shape))


def _python_model_base():
    from mlflow.pyfunc import PythonModel

    return PythonModel


class NetworkPyfunc(_python_model_base()):
    """``mlflow.pyfunc.PythonModel`` over a saved sparkavg network (see the module docstring)."""

    def load_context(self, context) -> None:
        from ..nn import Network

        self.network = Network.load(context.artifacts[ARTIFACT])
        config = getattr(context, "model_config", None) or {}
        self.features_col = config.get("features_col", "features")

    def predict(self, context, model_input: pd.DataFrame, params=None) -> pd.DataFrame:
        net = self.network
        out = np.asarray(net.output(features_matrix(model_input, net.input_shape, self.features_col)))
        out = out.reshape(len(out), -1).astype(np.float32, copy=False)
        classifier = net.layers[-1].loss_name != "mse"
        prediction = out.argmax(axis=1).astype(np.float64) if classifier else out[:, 0].astype(np.float64)
        return pd.DataFrame({"prediction": prediction, "probability": list(out)})


def _model_arguments(network, folder: str, features_col: str) -> dict:
    from .. import __version__

    path = os.path.join(folder, "network.npz")
    network.save(path)
    # Explicit requirements: MLflow would otherwise load the model in a subprocess to infer them.
    return {"python_model": CODE_PATH, "artifacts": {ARTIFACT: path}, "model_config": {"features_col": features_col},
            "pip_requirements": [f"sparkavg=={__version__}", "pandas"]}


def log_network(network, name: str = "model", features_col: str = "features"):
    """Log ``network`` as a pyfunc model in the active MLflow run; returns MLflow's ``ModelInfo``."""
    import mlflow

    with tempfile.TemporaryDirectory(prefix="sparkavg-mlflow-") as folder:
        return mlflow.pyfunc.log_model(name=name, **_model_arguments(network, folder, features_col))


def save_network_model(network, path: str, features_col: str = "features") -> None:
    """Write ``network`` as a pyfunc model folder at ``path`` (``mlflow.pyfunc.load_model(path)``)."""
    import mlflow

    with tempfile.TemporaryDirectory(prefix="sparkavg-mlflow-") as folder:
        mlflow.pyfunc.save_model(path, **_model_arguments(network, folder, features_col))
