"""Control of BLAS / OpenMP thread pools.

Spark runs one Python task per core; each must not start a BLAS pool as
wide as the machine, or two tasks on two cores fight over four threads.
"""
from __future__ import annotations

import contextlib
import logging
import os
import sys

from threadpoolctl import threadpool_limits

__all__ = ["limit_threads", "set_threads"]

logger = logging.getLogger(__name__)

_ENV_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
_global_limiter = None


def set_threads(n: int) -> None:
    """Limit BLAS and OpenMP pools of this process to ``n`` threads (sticky);
    torch's intra-op pool too when torch is imported (a later import of
    torch reads ``OMP_NUM_THREADS``)."""
    global _global_limiter
    if int(n) < 1:
        raise ValueError(f"Expect a thread count >= 1, got {n}")
    for var in _ENV_VARS:
        os.environ[var] = str(int(n))
    _global_limiter = threadpool_limits(limits=int(n))
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "set_num_threads"):
        torch.set_num_threads(int(n))
    logger.debug("BLAS/OpenMP threads limited to %d", n)


@contextlib.contextmanager
def limit_threads(n: int):
    """Context manager: limit BLAS and OpenMP pools to ``n`` threads inside."""
    if int(n) < 1:
        raise ValueError(f"Expect a thread count >= 1, got {n}")
    with threadpool_limits(limits=int(n)):
        yield

