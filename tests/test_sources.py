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


# ------------------------------------------------------------ a round's results, summed in the all-reduce's order
def _worker_vector(w: int):
    import numpy as np

    return np.random.default_rng(100 + w).standard_normal(37).astype(np.float32) * np.float32(10.0 ** (w % 5))


def _round_result_of_shard(items):
    """A round task: worker ``w``'s shard is ``[w]``, or empty (a worker without examples returns nothing)."""
    from sparkavg.spark.executor.averaging import RoundResult
    import numpy as np

    for w in (w for shard in items for w in shard):
        yield RoundResult(0.25 * (w + 1), _worker_vector(w), None, np.zeros(0, np.float32), 1.0, 1, 1, 1, [], [],
                          [[w, 1, 0.0, 0.0]], None)


@pytest.mark.spark
@pytest.mark.parametrize("world, depth", [(3, 2), (6, 2), (9, 2), (17, 3)])
def test_a_jobs_results_are_summed_in_the_all_reduces_order(sc, world, depth):
    """Shared files' results (summed on the executors first beyond ``scale + W / scale`` of them) give
    ``ordered_sum``'s bits, the all-reduce's: workers without a result are missing, not zeros."""
    from sparkavg import ops
    from sparkavg.spark.executor.averaging import combine_results
    from sparkavg.transport.summation import ordered_sum, total_weight

    missing = {1, world - 2}
    shards = [[] if w in missing else [w] for w in range(world)]
    source = SharedFiles(sizes=[1] * world, seam=ClassicSpark(sc), paths=list(range(world)))
    deal = FilesDeal([[[i] for i in range(world)]], source)
    deal.shards = lambda r: shards
    got = deal.aggregate(0, _round_result_of_shard, combine_results, depth, "a test round")
    weights = [0.0 if w in missing else 0.25 * (w + 1) for w in range(world)]
    expected = ordered_sum([None if w in missing else _worker_vector(w) for w in range(world)])
    assert got.params.tobytes() == expected.tobytes()
    assert got.weight == total_weight(weights) and got.examples == world - len(missing)
    if world - len(missing) > 2:  # the order matters for these values: a left-to-right sum differs
        chained = _worker_vector(0)
        for w in range(2, world):
            if w not in missing:
                ops.accumulate(chained, _worker_vector(w))
        assert chained.tobytes() != expected.tobytes()


# ------------------------------------------------------------ Spark blocks: a local deal's epochs
def _keys_in_order(items):
    """A task's blocks as the keys they hold, in the order it read them."""
    return [[x for x, _ in items]]


def _stage_tasks_run(sc, job_group: str) -> dict:
    """{stage id: tasks completed} over the jobs of ``job_group`` (a skipped stage ran none)."""
    tracker = sc.statusTracker()
    stages = {}
    for job in tracker.getJobIdsForGroup(job_group):
        for stage in tracker.getJobInfo(job).stageIds:
            info = tracker.getStageInfo(stage)
            stages[stage] = info.numCompletedTasks if info is not None else 0
    return stages


@pytest.mark.spark
def test_a_local_deals_epochs_read_the_first_epochs_shuffle_each_shard_in_its_dealt_order(sc):
    from sparkavg.data.deal import deal_epoch
    from sparkavg.spark.sources import SparkBlocks

    # 12 minibatches (x = its key, y unused) in 3 partitions, kept as Spark blocks
    rdd = sc.parallelize([(k, (k, 0)) for k in range(12)], 3)
    rdd.localCheckpoint()
    rdd.count()
    source = SparkBlocks(sizes=[1] * 12, seam=ClassicSpark(sc), rdd=rdd, keys=None)
    runs = []
    for epoch, seed in enumerate((1, 2)):
        deal = source.plan(2, 2, seed, local=True, in_stage=True)
        assert deal.rounds == [[[i for r in deal_epoch(12, 2, 2, seed, True) for i in r[w]] for w in range(2)]]
        sc.setJobGroup(f"epoch-{epoch}", "a test epoch")
        got = deal.barrier(0, _keys_in_order, "a test epoch")
        assert got == deal.rounds[0], "a shard's blocks came in another order than the deal's"
        runs.append(_stage_tasks_run(sc, f"epoch-{epoch}"))
    assert deal.rdd is source.sharded(deal.rounds[0])  # the same shards: the same shuffle
    first, second = runs
    assert sorted(first.values()) == [2, 3], "epoch 1: a map stage of 3 tasks, then the barrier stage of 2"
    assert sorted(second.values()) == [0, 2], "epoch 2: the map stage skipped, its outputs read again"
    other = source.plan(2, 2, 1, local=False, in_stage=True)  # a balanced deal moves minibatches between shards
    assert other.rdd is not deal.rdd and other.barrier(0, _keys_in_order, "a balanced epoch") == other.rounds[0]
