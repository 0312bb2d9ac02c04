"""The safety net under :class:`~tests.harness.SimulatedCluster`: every
started cluster is registered until closed, and whatever is still
registered is torn down at interpreter exit and on SIGTERM (before the
previous SIGTERM handler, or the default action, runs)."""
from __future__ import annotations

import atexit
import logging
import os
import signal
import threading
from typing import List

__all__ = ["register", "unregister", "live", "close_all"]

logger = logging.getLogger(__name__)

_live: set = set()
_lock = threading.Lock()
_sigterm_installed = False
_previous_sigterm = None


def live() -> List:
    """The clusters started and not yet closed."""
    with _lock:
        return list(_live)


def close_all() -> None:
    """Close every live cluster, logging (not raising) what fails."""
    for cluster in live():
        try:
            cluster.close()
        except Exception:
            logger.exception("tearing down %s", getattr(cluster, "id", cluster))


def _on_sigterm(signum, frame) -> None:
    close_all()
    if callable(_previous_sigterm):
        _previous_sigterm(signum, frame)
    else:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)


def register(cluster) -> None:
    """Track ``cluster``; the first call from the main thread installs the
    SIGTERM handler (unless SIGTERM is ignored, which then stays so)."""
    global _sigterm_installed, _previous_sigterm
    with _lock:
        _live.add(cluster)
        if not _sigterm_installed and threading.current_thread() is threading.main_thread():
            previous = signal.getsignal(signal.SIGTERM)
            if previous is not signal.SIG_IGN:
                _previous_sigterm = previous
                signal.signal(signal.SIGTERM, _on_sigterm)
            _sigterm_installed = True


def unregister(cluster) -> None:
    with _lock:
        _live.discard(cluster)


atexit.register(close_all)
