"""MLflow "models from code" entry of a sparkavg network (see :mod:`.mlflow_model`); run by MLflow, never imported."""
import mlflow

from sparkavg.listeners.mlflow_model import NetworkPyfunc

mlflow.models.set_model(NetworkPyfunc())
