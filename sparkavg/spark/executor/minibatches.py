"""A task's minibatches: read from shared files or Spark blocks, loaded
ahead in one background thread, through the fit's transform if it has one
(:mod:`sparkavg.data.transforms`), each wait recorded as ``data_load``."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Iterable, Iterator, List, Optional

from ...stats import Phase
from ...data.storage import load_minibatch
from ...data.transforms import transformed

__all__ = ["minibatch_sources", "prefetched", "recorded_minibatches"]


def minibatch_sources(items: Iterable) -> Iterator:
    """Flatten a partition's items into minibatch sources: a path string
    (a shared file) or an ``(x, y)`` tuple (a Spark block)."""
    for item in items:
        if isinstance(item, list):
            yield from item
        else:
            yield item


def _materialize(source):
    return load_minibatch(source) if isinstance(source, str) else source


def prefetched(sources: Iterator, depth: int) -> Iterator:
    """Load minibatches ``depth`` ahead in one background thread."""
    if depth <= 0:
        for s in sources:
            yield _materialize(s)
        return
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sparkavg-prefetch")
    try:
        pending: List = []
        for s in sources:
            pending.append(pool.submit(_materialize, s))
            if len(pending) > depth:
                yield pending.pop(0).result()
        for fut in pending:
            yield fut.result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def recorded_minibatches(items: Iterable, prefetch: int, rec, transform: Optional[dict] = None,
                         worker: Optional[int] = None) -> Iterator:
    """A task's ``(x, y)`` minibatches, loaded ``prefetch`` ahead, through
    ``transform`` (a :func:`~sparkavg.data.transforms.transform_plan`; seeded
    per ``worker`` and minibatch), each wait for the next one -- its
    transform included -- recorded as the ``data_load`` phase."""
    source = transformed(prefetched(minibatch_sources(items), prefetch), transform, worker)
    while True:
        with rec.phase(Phase.DATA_LOAD):
            mb = next(source, None)
        if mb is None:
            return
        yield mb
