"""MLflow tracking of a fit (``pip install sparkavg[mlflow]``: the ``mlflow-skinny`` client, sqlalchemy, alembic).

Per fit, :class:`MLflowListener` logs into one MLflow run:

- at the start: the master's and the network's configuration as params
  (``master.<field>``, ``network.<field>``, nested fields and list items
  joined with dots) and as JSON artifacts (``sparkavg/master.json``,
  ``sparkavg/network.json``), tags ``sparkavg.run_id`` and ``sparkavg.version``;
- per epoch: every number of the epoch's ``trainer.history`` entry as a
  metric at step ``epoch`` (``loss``, ``learning_rate``, ``examples_per_second``,
  ``seconds``, ``averaging_frequency``, with validation data ``val_loss``,
  ``val_<metric>`` and ``accuracy`` ...);
  per round too with ``log_rounds=True`` (``round_loss``, ``round_examples_per_second``);
  the mean sampled ``sharing_threshold`` / ``sharing_sparsity`` per iteration;
- the last checkpoint's path (tag ``sparkavg.last_checkpoint``);
- at the end: the stats as ``stats/stats.json``, ``stats/stats.html`` and
  ``stats/trace.json`` (Chrome trace), and the trained model -- a Network,
  a Graph or a TorchModel -- as a pyfunc model (:mod:`.mlflow_model`, which
  says its input and output frames) that ``mlflow.pyfunc.load_model`` loads,
  and beside it the run's artifact ``model.onnx`` when onnx is installed
  (``sparkavg[onnx]``; :mod:`sparkavg.export`): the same outputs from the
  same input features, the fit's input encoding included; a model ONNX
  cannot express is logged as the pyfunc alone, with a warning naming
  what was refused;
  the run ends ``FINISHED`` -- or ``FAILED`` (``KILLED`` on
  ``KeyboardInterrupt``) with tag ``sparkavg.error`` when the fit raises.

Which run: the active one (``with mlflow.start_run(): trainer.fit(...)``),
else one the listener starts and ends.  With ``nested=True`` every fit is a
child run of the active run: the stages of a ``Pipeline`` (or the fits of a
hyper-parameter search) as children of one parent.

Which store: MLflow's own choice, never one of the listener's -- the
``tracking_uri`` given, else ``$MLFLOW_TRACKING_URI`` or
``mlflow.set_tracking_uri``, else MLflow 3's default: a SQLite file
``./mlflow.db`` in the working directory, artifacts under ``./mlruns``
(MLflow keeps to ``./mlruns`` as its store where an old file store is there).
``sparkavg[mlflow]`` installs what that default needs besides the skinny
client (sqlalchemy, alembic), so ``MLflowListener()`` logs on a fresh
install with no tracking server.  Why not pick a store when the user named
none: runs then land where the user's own ``mlflow.start_run()``,
``mlflow.pyfunc.load_model(listener.model_uri)`` and ``mlflow server`` /
``mlflow ui`` look by default, in this process and the next; the
alternative, MLflow's ``./mlruns`` file store, is in maintenance mode and
opens only with ``MLFLOW_ALLOW_FILE_STORE`` set for the whole process (a
library should not flip that for its caller).  The listener logs the
store of each run it starts; one it cannot start a run in fails the
listener's ``fit_start`` (the fit goes on, logged nothing, with one
warning naming the store, the error and what to install or set).
"""
from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from typing import Optional

from .base import TrainingListener

__all__ = ["MLflowListener", "flatten"]

logger = logging.getLogger(__name__)

#: MLflow refuses longer param values.
MAX_PARAM_VALUE = 6000
#: Entries per ``log_batch`` request (MLflow's limit for params and tags).
BATCH = 100


def _import_mlflow():
    try:
        import mlflow
    except ImportError as exc:
        raise ImportError(f"MLflowListener needs mlflow: pip install sparkavg[mlflow] ({exc})") from exc
    return mlflow


def _store_error(mlflow, exc: Exception) -> RuntimeError:
    """What to tell when no run could be started in MLflow's tracking store."""
    import importlib.util

    uri = mlflow.get_tracking_uri()
    missing = [name for name in ("sqlalchemy", "alembic") if importlib.util.find_spec(name) is None]
    hint = ""
    if str(uri).startswith("sqlite:") and missing:  # mlflow-skinny alone: MLflow's default store does not open
        hint = (f"; MLflow's SQLite store (its default, ./mlflow.db) needs {' and '.join(missing)}, not installed "
                f"here: pip install 'sparkavg[mlflow]'")
    return RuntimeError(f"MLflowListener could not start a run in the MLflow tracking store {uri!r} "
                        f"({type(exc).__name__}: {exc}){hint}; or name a store that opens here: "
                        f"MLflowListener(tracking_uri=...) or $MLFLOW_TRACKING_URI (e.g. an MLflow server's "
                        f"http:// address or sqlite:///path/to/mlflow.db)")


def flatten(value, prefix: str) -> dict:
    """``{"prefix.a.0.b": "..."}``: nested dicts and lists as dotted keys, leaves as strings."""
    out = {}
    if isinstance(value, dict):
        for key, item in value.items():
            out.update(flatten(item, f"{prefix}.{key}"))
    elif isinstance(value, (list, tuple)) and any(isinstance(v, (dict, list, tuple)) for v in value):
        for i, item in enumerate(value):
            out.update(flatten(item, f"{prefix}.{i}"))
    else:
        text = json.dumps(value) if isinstance(value, (list, tuple)) else str(value)
        out[prefix] = text[:MAX_PARAM_VALUE]
    return out


def _numbers(event: dict, skip=()) -> dict:
    return {k: float(v) for k, v in event.items() if k not in skip and isinstance(v, (int, float))
            and not isinstance(v, bool)}


class MLflowListener(TrainingListener):
    """Logs a fit to MLflow (see the module docstring for what and where).

    Parameters
    ----------
    tracking_uri : str, optional
        Set as MLflow's tracking URI at the first fit (default: MLflow's own:
        ``$MLFLOW_TRACKING_URI``, else ``./mlflow.db``; see "Which store" above).
    experiment : str, optional
        The experiment of a run the listener starts (default: MLflow's active one).
    run_name : str, optional
        The name of a run the listener starts.
    nested : bool, default False
        Start a child run of the active run for every fit.
    log_model : bool, default True
        Log the trained model as a pyfunc model (named ``model``) and, with
        onnx installed, as the run's artifact ``model.onnx``.
    log_rounds : bool, default False
        Metrics per round, not only per epoch (one request per round).
    log_stats : bool, default True
        Log the stats JSON, HTML page and Chrome trace at the end.

    Attributes
    ----------
    run_id : str or None
        The run of the last fit.
    model_uri : str or None
        Where the last fit's model was logged (for ``mlflow.pyfunc.load_model``).
    """

    def __init__(self, tracking_uri: Optional[str] = None, *, experiment: Optional[str] = None,
                 run_name: Optional[str] = None, nested: bool = False, log_model: bool = True,
                 log_rounds: bool = False, log_stats: bool = True):
        self._mlflow = _import_mlflow()
        self.tracking_uri, self.experiment, self.run_name = tracking_uri, experiment, run_name
        self.nested, self.log_model, self.log_rounds, self.log_stats = bool(nested), log_model, log_rounds, log_stats
        self.run_id: Optional[str] = None
        self.model_uri: Optional[str] = None
        self._owned = False
        self._live = False  # between this listener's fit_start and the end of that fit
        self._client = None
        self._round_step = 0

    # ------------------------------------------------------------ helpers
    def _log(self, metrics: dict, step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        entries = [Metric(key, value, now, int(step)) for key, value in metrics.items()]
        for i in range(0, len(entries), BATCH):
            self._client.log_batch(self.run_id, metrics=entries[i:i + BATCH])

    def _log_params(self, params: dict) -> None:
        from mlflow.entities import Param

        logged = self._client.get_run(self.run_id).data.params
        changed = sorted(k for k, v in params.items() if k in logged and logged[k] != v)
        if changed:  # MLflow refuses to change a param: keep the first value, say so
            logger.warning("MLflow run %s already has other values for %s; kept", self.run_id, ", ".join(changed))
        entries = [Param(k, v) for k, v in params.items() if k not in logged]
        for i in range(0, len(entries), BATCH):
            self._client.log_batch(self.run_id, params=entries[i:i + BATCH])

    def _end(self, status: str) -> None:
        live, self._live = self._live, False
        if not live or not self._owned:
            return
        mlflow = self._mlflow
        active = mlflow.active_run()
        if active is not None and active.info.run_id == self.run_id:
            mlflow.end_run(status)
        else:
            self._client.set_terminated(self.run_id, status)
        self._owned = False

    # ------------------------------------------------------------- events
    def on_fit_start(self, trainer, event: dict) -> None:
        mlflow = self._mlflow
        from .. import __version__

        self.run_id, self.model_uri, self._round_step, self._owned, self._live = None, None, 0, False, False
        if self.tracking_uri is not None:
            mlflow.set_tracking_uri(self.tracking_uri)
        active = mlflow.active_run()
        if active is None or self.nested:
            try:
                if self.experiment is not None and active is None:
                    mlflow.set_experiment(self.experiment)
                run = mlflow.start_run(run_name=self.run_name, nested=active is not None)
            except Exception as exc:  # the store does not open: say which, and what would open it
                raise _store_error(mlflow, exc) from exc
            self._owned = True
            logger.info("MLflow run %s started in the tracking store %s", run.info.run_id, mlflow.get_tracking_uri())
        else:
            run, self._owned = active, False
        self.run_id, self._live = run.info.run_id, True
        self._client = mlflow.tracking.MlflowClient()
        self._client.set_tag(self.run_id, "sparkavg.run_id", event["run_id"])
        self._client.set_tag(self.run_id, "sparkavg.version", __version__)
        self._log_params({**flatten(event["master"], "master"), **flatten(event["network"], "network"),
                          "num_params": str(event["num_params"]), "workers": str(event["workers"]),
                          "examples": str(event["examples"])})
        self._client.log_dict(self.run_id, event["master"], "sparkavg/master.json")
        self._client.log_dict(self.run_id, event["network"], "sparkavg/network.json")

    def on_round_end(self, trainer, event: dict) -> None:
        self._round_step += 1
        if self.log_rounds and self._live:
            self._log({"round_loss": event["round_loss"], "round_examples_per_second": event["examples_per_second"]},
                      self._round_step)

    def on_sharing_progress(self, trainer, event: dict) -> None:
        if not self._live:
            return
        for name in ("threshold", "sparsity"):
            by_step = {}
            for points in event["series"].get(name, {}).values():
                for step, value in points:
                    by_step.setdefault(int(step), []).append(float(value))
            for step, values in sorted(by_step.items()):
                self._log({f"sharing_{name}": sum(values) / len(values)}, step)

    def on_epoch_end(self, trainer, event: dict) -> None:
        if self._live:
            self._log(_numbers(event, skip=("epoch", "target_epochs")), event["epoch"])

    def on_checkpoint(self, trainer, event: dict) -> None:
        if self._live:
            self._client.set_tag(self.run_id, "sparkavg.last_checkpoint", event["path"])

    def on_failure(self, trainer, event: dict) -> None:
        if not self._live:
            return
        if event["recovered"]:
            self._log({"diverged": 1.0}, event["epoch"] or 0)
            return
        try:
            self._client.set_tag(self.run_id, "sparkavg.error", f"{event['type']}: {event['message']}"[:5000])
        finally:
            self._end("KILLED" if event["type"] == "KeyboardInterrupt" else "FAILED")

    def on_fit_end(self, trainer, event: dict) -> None:
        if not self._live:
            return
        try:
            if self.log_stats:
                with tempfile.TemporaryDirectory(prefix="sparkavg-mlflow-") as folder:
                    trainer.stats.to_json(os.path.join(folder, "stats.json"))
                    trainer.stats.to_html(os.path.join(folder, "stats.html"))
                    trainer.stats.to_trace(os.path.join(folder, "trace.json"))
                    self._client.log_artifacts(self.run_id, folder, "stats")
            if self.log_model:
                self.model_uri = self._log_network(trainer)
                self._log_onnx(trainer)
        finally:
            self._end("FINISHED")

    def _log_network(self, trainer) -> str:
        from ..data.transforms import input_encoding
        from .mlflow_model import log_network, save_network_model

        active = self._mlflow.active_run()
        encoding = input_encoding(trainer.master.data)  # scale/normalize: the pyfunc applies them too
        if active is not None and active.info.run_id == self.run_id:
            return log_network(trainer.network, features_col=trainer.features_col, encoding=encoding).model_uri
        # The user made another run active meanwhile: the model goes into this fit's run as plain artifacts.
        with tempfile.TemporaryDirectory(prefix="sparkavg-mlflow-") as folder:
            save_network_model(trainer.network, os.path.join(folder, "model"), features_col=trainer.features_col,
                               encoding=encoding)
            self._client.log_artifacts(self.run_id, os.path.join(folder, "model"), "model")
        return f"runs:/{self.run_id}/model"

    def _log_onnx(self, trainer) -> None:
        """``model.onnx`` beside the pyfunc (logged first), when onnx is installed and the model exports."""
        import importlib.util

        from ..data.transforms import input_encoding

        if importlib.util.find_spec("onnx") is None:
            logger.info("MLflow run %s: the model is logged as a pyfunc only; pip install 'sparkavg[onnx]' to log "
                        "model.onnx beside it", self.run_id)
            return
        from ..export.onnx import ExportError

        with tempfile.TemporaryDirectory(prefix="sparkavg-mlflow-") as folder:
            path = os.path.join(folder, "model.onnx")
            try:
                trainer.network.export_onnx(path, encoding=input_encoding(trainer.master.data))
            except (ExportError, ImportError, NotImplementedError) as exc:
                logger.warning("MLflow run %s: the model is logged as a pyfunc but not as ONNX: %s", self.run_id, exc)
                return
            self._client.log_artifact(self.run_id, path)
