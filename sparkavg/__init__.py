"""sparkavg: data-parallel neural-network training on Apache Spark."""
import logging

__version__ = "0.1.0"

from .references import loss, transform, trusting  # noqa: E402  (marks for code a saved configuration names)

logging.getLogger(__name__).addHandler(logging.NullHandler())

__all__ = ["__version__", "loss", "transform", "trusting"]
