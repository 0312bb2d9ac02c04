"""A sparkavg model as an MLflow ``pyfunc`` model, loaded from its npz + JSON file.

Any model of the contract (:class:`sparkavg.nn.model.Model`): a
:class:`~sparkavg.nn.Network`, a :class:`~sparkavg.nn.Graph` (several named
inputs, several outputs) or a ``sparkavg.torch.TorchModel``.  The pyfunc
model knows it only through the contract: :func:`sparkavg.nn.load_model`
reads the file, ``model.spec`` says the inputs (names, shapes, dtypes) and
the outputs (units, loss), ``model.output`` predicts.

:func:`log_network` logs the model with MLflow's "models from code": the
model's code is :mod:`sparkavg.listeners._mlflow_model_code` (three lines
that name :class:`NetworkPyfunc`), its one artifact the file written by
``model.save``.  Nothing is pickled, neither the model nor the model
class; loading needs sparkavg installed (and torch for a TorchModel).

Input: ``mlflow.pyfunc.load_model(uri).predict(frame)`` takes a pandas
DataFrame, one row per example:

- a model with one input (a Network, a TorchModel, a one-input Graph): a
  column of per-row arrays, flat or shaped -- the fit's features column
  (``features`` unless the fit named another), or the input's name
  (``model.spec.inputs[0].name``), or the frame's only column -- or else
  one column per flat feature, in order;
- a model with several named inputs (a Graph's ``spec.inputs``): one column
  per input, named as the input (or as the fit's column for it, e.g.
  ``features_col={"cats": "c"}``), each holding per-row arrays of the
  input's size (flat or shaped) or, for an input of one value, scalars;
  other columns are ignored.

An input of dtype ``int64`` (an Embedding's ids) is read as int64, any
other as float32.  A numpy array (one input) or a dict of arrays by input
name is taken as it is.

Output: a DataFrame with ``prediction`` (float64: the arg-max class index
of a classification output, the first value of a regression output) and
``probability`` (the model's outputs, a float32 array per row), as
:class:`sparkavg.ml.NetworkModel` does; for a model with several outputs,
``prediction_<name>`` and ``probability_<name>`` for each output, in the
order of ``model.spec.outputs``.

Code the model file names (a TorchModel's factory or loss) is called only
if it is marked (``@sparkavg.torch.factory``, ``@sparkavg.loss``) or
trusted, as by every loader (:mod:`sparkavg.references`).  A model of an
unmarked factory loads inside a trusting block::

    with sparkavg.trusting({"mypkg.nets:small_cnn"}):
        model = mlflow.pyfunc.load_model(uri)
"""
from __future__ import annotations

import math
import os
import tempfile
from typing import Mapping

import numpy as np
import pandas as pd

from ..data.transforms import check_encoding_dict, encode_inputs
from ..nn.losses import predicted

__all__ = ["NetworkPyfunc", "log_network", "save_network_model", "features_matrix", "input_columns"]

#: The artifact key of the model file.
ARTIFACT = "network"
#: Where the model code lives (copied into the logged model).
CODE_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_mlflow_model_code.py")


def _dtype(spec) -> type:
    return np.int64 if spec.dtype == "int64" else np.float32


def _stacked(values, width: int, dtype, what: str) -> np.ndarray:
    """The (N, width) batch of per-row arrays or scalars ``values``; ``what`` names them in errors."""
    rows = [np.asarray(v, dtype=dtype).reshape(-1) for v in values]
    bad = sorted({r.size for r in rows} - {width})
    if bad:
        raise ValueError(f"Expect {width} value{'s' * (width != 1)} per row for {what}, got rows of "
                         f"{', '.join(map(str, bad))}")
    return np.stack(rows) if rows else np.zeros((0, width), dtype)


def features_matrix(frame, input_shape, features_col: str = "features", dtype=np.float32,
                    name: str | None = None) -> np.ndarray:
    """The (N, *input_shape) batch of one input from a pandas DataFrame or an array.

    A ``features_col`` column (else one named ``name``, else a lone column)
    of per-row arrays is stacked; otherwise every column is one flat
    feature, in order.
    """
    width = math.prod(input_shape)
    if hasattr(frame, "columns"):
        named = [c for c in (features_col, name) if c is not None and c in frame.columns]
        column = named[0] if named else (frame.columns[0] if len(frame.columns) == 1 else None)
        if column is not None and len(frame) and np.ndim(frame[column].iloc[0]) >= 1:
            x = _stacked(frame[column], width, dtype, f"column {column!r} (input shape {tuple(input_shape)})")
        else:
            x = frame.to_numpy(dtype=dtype)
    else:
        x = np.asarray(frame, dtype=dtype)
    x = x.reshape(len(x), -1)
    if x.shape[1] != width:
        raise ValueError(f"Expect {width} features per row (input shape {tuple(input_shape)}), got {x.shape[1]}")
    return x.reshape((len(x),) + tuple(input_shape))


def input_columns(spec, features_col) -> dict:
    """``{input name: column}``: the DataFrame columns a fit read each input
    from (``features_col`` as ``SparkTrainer`` takes it: one column, a dict
    by input name or a list in input order); inputs it does not name map to
    their own name."""
    names = [i.name for i in spec.inputs]
    if isinstance(features_col, str):
        pairs = {names[0]: features_col} if len(names) == 1 else {}
    elif isinstance(features_col, Mapping):
        pairs = dict(features_col)
    else:
        pairs = dict(zip(names, features_col or ()))
    return {n: str(pairs.get(n, n)) for n in names}


def _named_inputs(frame, spec, columns: dict) -> dict:
    """The inputs of a several-input model by name, each from its column (see the module docstring)."""
    names = [i.name for i in spec.inputs]
    if isinstance(frame, Mapping):
        missing = [n for n in names if n not in frame]
        if missing:
            raise ValueError(f"Expect arrays keyed by the model's inputs {names}, missing {missing}; got keys "
                             f"{list(frame)}")
        return {i.name: np.asarray(frame[i.name], dtype=_dtype(i)) for i in spec.inputs}
    if not hasattr(frame, "columns"):
        raise ValueError(f"Expect a pandas DataFrame with a column per input {names} (or a dict of arrays by "
                         f"input name), got {type(frame).__name__}")
    found, missing = {}, []
    for spec_input in spec.inputs:
        candidates = list(dict.fromkeys((spec_input.name, columns.get(spec_input.name, spec_input.name))))
        column = next((c for c in candidates if c in frame.columns), None)
        if column is None:
            missing.append(f"input {spec_input.name!r} (column {' or '.join(map(repr, candidates))})")
        else:
            found[spec_input.name] = column
    if missing:
        raise ValueError(f"Expect a column for each of the model's inputs {names}, missing "
                         f"{'; '.join(missing)}; got columns {list(frame.columns)}")
    return {i.name: _stacked(frame[found[i.name]], i.size, _dtype(i),
                             f"input {i.name!r} of shape {tuple(i.shape)} (column {found[i.name]!r})"
                             ).reshape((len(frame),) + tuple(i.shape))
            for i in spec.inputs}


def prediction_frame(spec, out) -> pd.DataFrame:
    """The pyfunc's result frame of ``model.output``'s ``out`` (an array, or a dict by output name)."""
    by_name = out if isinstance(out, Mapping) else {spec.outputs[0].name: out}
    single = len(spec.outputs) == 1 or not isinstance(out, Mapping)
    columns = {}
    for output in spec.outputs[:1] if single else spec.outputs:
        values = by_name[output.name]
        values = np.asarray(values.get() if hasattr(values, "__cuda_array_interface__") else values)
        values = values.reshape(len(values), -1).astype(np.float32, copy=False)
        prediction = predicted(output.target, values)
        suffix = "" if single else f"_{output.name}"
        columns["prediction" + suffix] = prediction.astype(np.float64)
        columns["probability" + suffix] = list(values)
    return pd.DataFrame(columns)


def _python_model_base():
    from mlflow.pyfunc import PythonModel

    return PythonModel


class NetworkPyfunc(_python_model_base()):
    """``mlflow.pyfunc.PythonModel`` over a saved sparkavg model of any kind (see the module docstring)."""

    def load_context(self, context) -> None:
        from ..nn import load_model

        self.model = load_model(context.artifacts[ARTIFACT])  # code it names: marked or trusted only
        self.spec = self.model.spec
        config = getattr(context, "model_config", None) or {}
        # "features_col": models logged before "columns" (one input, one column).
        self.columns = input_columns(self.spec, config.get("columns", config.get("features_col", "features")))
        # the fit's input encoding (DataOptions(scale=, normalize=)), applied as NetworkModel.transform does
        self.encoding = check_encoding_dict(config.get("input_encoding"), "the logged model's config")

    def predict(self, context, model_input: pd.DataFrame, params=None) -> pd.DataFrame:
        spec = self.spec
        if len(spec.inputs) == 1:  # the one input's frame forms (see the module docstring), as a mapping of one
            one = spec.inputs[0]
            x = {one.name: features_matrix(model_input, one.shape, self.columns[one.name], _dtype(one), one.name)}
        else:
            x = _named_inputs(model_input, spec, self.columns)
        return prediction_frame(spec, self.model.output(encode_inputs(x, self.encoding)))


def _model_arguments(model, folder: str, features_col, encoding=None) -> dict:
    from .. import __version__

    path = os.path.join(folder, "network.npz")
    model.save(path)
    # Explicit requirements: MLflow would otherwise load the model in a subprocess to infer them.
    requirements = [f"sparkavg=={__version__}", "pandas"]
    if model.to_config().get("type") == "TorchModel":
        requirements.append("torch")
    return {"python_model": CODE_PATH, "artifacts": {ARTIFACT: path},
            "model_config": {"columns": input_columns(model.spec, features_col), "input_encoding": encoding},
            "pip_requirements": requirements}


def log_network(model, name: str = "model", features_col="features", encoding=None):
    """Log ``model`` (any kind) as a pyfunc model in the active MLflow run;
    returns MLflow's ``ModelInfo``.  ``features_col`` is the fit's (a
    column, a dict by input name or a list in input order): the pyfunc
    reads those columns too; ``encoding`` is the fit's input encoding
    (:func:`sparkavg.data.transforms.input_encoding`), applied before the model."""
    import mlflow

    with tempfile.TemporaryDirectory(prefix="sparkavg-mlflow-") as folder:
        return mlflow.pyfunc.log_model(name=name, **_model_arguments(model, folder, features_col, encoding))


def save_network_model(model, path: str, features_col="features", encoding=None) -> None:
    """Write ``model`` (any kind) as a pyfunc model folder at ``path`` (``mlflow.pyfunc.load_model(path)``)."""
    import mlflow

    with tempfile.TemporaryDirectory(prefix="sparkavg-mlflow-") as folder:
        mlflow.pyfunc.save_model(path, **_model_arguments(model, folder, features_col, encoding))
