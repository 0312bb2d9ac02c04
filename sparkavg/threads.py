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

__all__ = ["limit_threads", "set_threads", "single_threaded_blas"]

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


_controller = None


def _blas_pools():
    """The loaded BLAS pools (threadpoolctl's controller, built once: reading
    them anew every step would cost more than the step saves)."""
    global _controller
    if _controller is None:
        from threadpoolctl import ThreadpoolController

        _controller = ThreadpoolController().select(user_api="blas")
    return _controller


@contextlib.contextmanager
def single_threaded_blas():
    """BLAS pools at one thread inside, OpenMP pools as they are.

    For steps whose work runs in OpenMP kernels (the direct convolutions):
    OpenBLAS's idle threads keep spinning for a while after each GEMM and
    take the cores those kernels' threads need (a ResNet step on 2 threads:
    37 ms with both pools at 2, 26 ms with BLAS at 1)."""
    pools = _blas_pools()
    widths = [lib.num_threads for lib in pools.lib_controllers]
    if max(widths, default=1) <= 1:
        yield
        return
    for lib in pools.lib_controllers:
        lib.set_num_threads(1)
    try:
        yield
    finally:
        for lib, width in zip(pools.lib_controllers, widths):
            lib.set_num_threads(width)


@contextlib.contextmanager
def limit_threads(n: int):
    """Context manager: limit BLAS and OpenMP pools to ``n`` threads inside."""
    if int(n) < 1:
        raise ValueError(f"Expect a thread count >= 1, got {n}")
    with threadpool_limits(limits=int(n)):
        yield

