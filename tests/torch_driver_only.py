"""A factory module installed on the driver only: importing it inside a
Spark task fails as a package missing from the executors would."""
from pyspark import TaskContext

if TaskContext.get() is not None:
    raise ModuleNotFoundError("No module named 'tests.torch_driver_only' (simulated: not installed here)")

from .torch_models import mlp  # noqa: E402,F401
