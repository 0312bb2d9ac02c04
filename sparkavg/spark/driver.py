"""Driver-side helpers every master shares: broadcasting the network
state, turning executor exceptions back into their own types, and
progress logging."""
from __future__ import annotations

import contextlib
import logging
import re
import time

import numpy as np

from ..backend import to_cpu
from ..data.spark_data import DataValidationError

__all__ = ["broadcast_state", "worker_errors", "Progress", "WorkerFailure"]

logger = logging.getLogger(__name__)


class WorkerFailure(RuntimeError):
    """A Spark task failed for a reason sparkavg did not raise itself."""


def broadcast_state(sc, network, with_updater: bool):
    """Broadcast ``(iteration, params, updater_state)`` as plain numpy arrays.

    The caller destroys the returned broadcast once its round is over, so
    executor memory stays flat over a long fit.
    """
    params = np.ascontiguousarray(to_cpu(network.params), dtype=np.float32)
    state = np.ascontiguousarray(to_cpu(network.updater_state), dtype=np.float32) if with_updater else None
    return sc.broadcast((int(network.iteration), params, state))


# Exceptions raised on executors that we translate back by name.
_KNOWN = {"DataValidationError": DataValidationError}


def register_worker_error(cls) -> None:
    """Let :func:`worker_errors` re-raise ``cls`` from executor tracebacks."""
    _KNOWN[cls.__name__] = cls


@contextlib.contextmanager
def worker_errors(what: str):
    """Re-raise our own exceptions from executors as themselves (with the
    executor's message), instead of a wall of Py4J text."""
    try:
        yield
    except Exception as exc:  # Py4JJavaError, PythonException, ...
        if isinstance(exc, tuple(_KNOWN.values())):
            raise
        text = str(exc)
        for name, cls in _KNOWN.items():
            found = re.findall(rf"(?:\w+\.)*{name}: (.+)", text)
            if found:
                raise cls(found[-1].strip()) from exc
        if "Py4J" in type(exc).__name__ or "PythonException" in type(exc).__name__:
            first = next((ln for ln in text.splitlines() if "Error" in ln or "Exception" in ln), text[:300])
            raise WorkerFailure(f"{what} failed on an executor: {first.strip()}") from exc
        raise


class Progress:
    """Periodic progress lines on the driver (at most one per ``every`` s)."""

    def __init__(self, label: str, total: int, every: float = 5.0):
        self.label, self.total, self.every = label, max(1, total), every
        self.start = self._last = time.monotonic()

    def update(self, done: int, **fields) -> None:
        now = time.monotonic()
        if done < self.total and now - self._last < self.every:
            return
        self._last = now
        extra = " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in fields.items())
        logger.info("%s: %d/%d (%.0f%%) %.1fs %s", self.label, done, self.total, 100.0 * done / self.total,
                    now - self.start, extra)
