"""A fit's exported minibatch files are removed when the process is
terminated (SIGTERM), as they are at a normal exit.

Python's default SIGTERM action ends the process at once: no ``finally``,
no ``atexit``, no finalizer runs, and a fit's export folder (thousands of
files) stays behind.  While a fit runs in the main thread and SIGTERM has
its default action, :func:`release_on_sigterm` installs a handler that
removes the files and then lets the signal do what it would have done:
the default action is restored and the signal sent again, so the process
ends "killed by SIGTERM" as before.  A program's own SIGTERM handler (or an
ignored SIGTERM) is left alone: the program decides, and a normal exit
releases the files.  The old handler is back after the fit.
"""
from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from typing import Callable

__all__ = ["release_on_sigterm"]

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def release_on_sigterm(release: Callable[[], None]):
    """While inside, SIGTERM runs ``release()`` and then the default action.

    Parameters
    ----------
    release : callable
        Removes what must not outlive the process (it must not call into
        the JVM: Spark may be mid-call on the main thread).

    Nothing is installed outside the main thread (Python runs signal
    handlers there only) or when SIGTERM already has a handler other than
    the default.
    """
    sigterm = getattr(signal, "SIGTERM", None)
    if (sigterm is None or threading.current_thread() is not threading.main_thread()
            or signal.getsignal(sigterm) is not signal.SIG_DFL):
        yield
        return

    def terminated(signum, frame):
        signal.signal(signum, signal.SIG_DFL)  # a second SIGTERM ends the process at once
        try:
            logger.warning("SIGTERM during a fit: removing its exported minibatches, then terminating")
            release()
        finally:
            os.kill(os.getpid(), signum)  # re-delivered: the default action ends the process

    signal.signal(sigterm, terminated)
    try:
        yield
    finally:
        if signal.getsignal(sigterm) is terminated:
            signal.signal(sigterm, signal.SIG_DFL)
