"""Minibatch transforms the tests name (``"tests.data_transforms:..."``):
executors import them by name, as they would a user's package."""
import json
import os
import tempfile

import numpy as np

import sparkavg

#: Where :func:`random_flip` notes each call (one JSON line per call, a file per process).
LOG = os.path.join(tempfile.gettempdir(), f"sparkavg-test-transform-{os.getuid()}")


@sparkavg.transform
def random_flip(x, y, rng):
    """Flip each example left-right with probability 1/2, as an augmentation
    would; note the process, the minibatch size and the generator's first draw."""
    draw = int(rng.integers(2 ** 62))
    flips = rng.random(len(x)) < 0.5
    out = np.array(x, copy=True)
    out[flips] = out[flips][..., ::-1]
    if os.path.isdir(LOG):
        with open(os.path.join(LOG, f"{os.getpid()}.jsonl"), "a") as fh:
            fh.write(json.dumps({"pid": os.getpid(), "n": len(x), "draw": draw}) + "\n")
    return out, y


@sparkavg.transform
def drop_labels(x, y, rng):
    """A broken transform: returns fewer labels than examples."""
    return x, y[:-1]


#: Where :func:`note_ids` notes the examples it sees (one JSON line per call, a file per process).
IDS_LOG = os.path.join(tempfile.gettempdir(), f"sparkavg-test-ids-{os.getuid()}")


@sparkavg.transform
def note_ids(x, y, rng):
    """Change nothing; note the ids of the minibatch's examples (the
    tests' data carry ``id / 1000`` in feature ``[0, 0, 0]``)."""
    if os.path.isdir(IDS_LOG):
        ids = np.rint(np.asarray(x)[:, 0, 0, 0] * 1000).astype(int).tolist()
        with open(os.path.join(IDS_LOG, f"{os.getpid()}.jsonl"), "a") as fh:
            fh.write(json.dumps({"pid": os.getpid(), "ids": ids}) + "\n")
    return x, y


@sparkavg.transform
def identity(x, y, rng):
    """Returns the minibatch as it is (a marked transform any model can take)."""
    return x, y


def unmarked_flip(x, y, rng):
    """:func:`random_flip` without the mark: a loader refuses a saved master naming it."""
    return random_flip(x, y, rng)


#: While this file exists, :func:`fail_when_marked` raises (a test creates it in the middle of a fit).
FAIL_MARKER = os.path.join(tempfile.gettempdir(), f"sparkavg-test-fail-{os.getuid()}")


@sparkavg.transform
def fail_when_marked(x, y, rng):
    """Change nothing, or raise while :data:`FAIL_MARKER` exists: a round that fails after others merged."""
    if os.path.exists(FAIL_MARKER):
        raise ValueError(f"a transform failed on purpose ({FAIL_MARKER} exists)")
    return x, y


#: :func:`lose_rank_one` acts only while this file names a signal: ``"SIGKILL"`` or ``"SIGSTOP"``.
LOSE_MARKER = os.path.join(tempfile.gettempdir(), f"sparkavg-test-lose-rank-{os.getuid()}")


@sparkavg.transform
def lose_rank_one(x, y, rng):
    """Gradient sharing's rank 1 loses its process at its third minibatch of
    every attempt, while :data:`LOSE_MARKER` names a signal: ``SIGKILL`` (a
    killed host), ``SIGSTOP`` (a cut link: the process stays, silent)."""
    import signal

    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is not None and ctx.partitionId() == 1 and os.path.exists(LOSE_MARKER):
        count = getattr(lose_rank_one, "calls", 0) + 1
        lose_rank_one.calls = count
        if count >= 3:
            with open(LOSE_MARKER) as fh:
                os.kill(os.getpid(), getattr(signal, fh.read().strip()))
    return x, y


#: While ``<LOSE_HOST>/armed`` exists, :func:`reach_and_wait` marks where rank 1 trains (every host sees it).
LOSE_HOST = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".pytest_cache", "d",
                         "sparkavg-shared", "lose-host")


@sparkavg.transform
def reach_and_wait(x, y, rng):
    """While ``LOSE_HOST/armed`` exists: gradient sharing's rank 1 writes its host's name to
    ``LOSE_HOST/reached`` at its third minibatch, and every rank then takes 0.2 s a minibatch -- an epoch
    long enough for a test to take that host away while it trains."""
    import socket
    import time

    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None or not os.path.exists(os.path.join(LOSE_HOST, "armed")):
        return x, y
    count = getattr(reach_and_wait, "calls", 0) + 1
    reach_and_wait.calls = count
    if count >= 3:
        if ctx.partitionId() == 1 and count == 3:
            with open(os.path.join(LOSE_HOST, f"reached.{os.getpid()}"), "w") as fh:
                fh.write(socket.gethostname())
            os.replace(os.path.join(LOSE_HOST, f"reached.{os.getpid()}"), os.path.join(LOSE_HOST, "reached"))
        time.sleep(0.2)
    return x, y
