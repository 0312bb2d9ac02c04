"""sparkavg: data-parallel neural-network training on Apache Spark."""
import logging

__version__ = "0.1.0"

logging.getLogger(__name__).addHandler(logging.NullHandler())

__all__ = ["__version__"]
