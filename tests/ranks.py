"""Ranks as threads, for the transport's tests."""
from __future__ import annotations

import threading

WAIT = 30.0  # bound on any single wait on another thread


def on_threads(fn, ranks, wait: float = WAIT) -> dict:
    """``fn(rank)`` on one thread per rank; ``{rank: (value, error)}``."""
    out = {}

    def run(rank):
        try:
            out[rank] = (fn(rank), None)
        except BaseException as exc:
            out[rank] = (None, exc)

    threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in ranks]
    for t in threads:
        t.start()
    for t in threads:
        t.join(wait)
    assert not any(t.is_alive() for t in threads), "a rank did not return"
    return out
