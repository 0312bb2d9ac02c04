"""Where a fit's minibatches live (``sparkavg.spark.sources``): a barrier
round's task reads its partition to the end, so that Spark keeps its Python
worker for the next job."""
import os

import pytest

from sparkavg.spark.seam import ClassicSpark
from sparkavg.spark.sources import FilesDeal, SharedFiles, read_to_end


def _counted(n: int, read: list):
    for i in range(n):
        read.append(i)
        yield i


def test_read_to_end_reads_what_the_task_left_after_its_output():
    read = []

    def first_two(items):
        yield [next(items), next(items)]

    assert list(read_to_end(first_two)(_counted(5, read))) == [[0, 1]]
    assert read == [0, 1, 2, 3, 4]


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (on this machine: ``local[N]``'s Python workers), zombies not counted."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _pid_after_its_minibatches(items):
    """A rank of the rounds inside one stage: it reads exactly its minibatches, not the partition's end."""
    import os

    next(items)
    yield os.getpid()


@pytest.mark.spark
def test_a_barrier_round_that_reads_only_its_minibatches_keeps_its_python_workers(sc):
    source = SharedFiles(sizes=[1, 1, 1, 1], seam=ClassicSpark(sc), paths=[f"minibatch-{i}" for i in range(4)])
    deal = FilesDeal([[[0, 1], [2, 3]]], source)
    pids = deal.barrier(0, _pid_after_its_minibatches, "a test round")
    assert len(pids) == 2
    sc.parallelize(range(2), 2).map(lambda _: os.getpid()).collect()  # the next job: after it, exited workers are gone
    assert [_alive(pid) for pid in pids] == [True, True], "a barrier task's Python worker exited: not reused"
