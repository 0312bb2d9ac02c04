"""Parameter averaging inside one barrier stage keeps its Python workers
from one epoch to the next (issue 37): a task that left its partition's
input unread is not reused by Spark, and every epoch's stage then started
fresh workers that imported everything and built the network again."""
import pytest

from sparkavg.spark import ParameterAveraging, SparkTrainer
from sparkavg.spark.executor.hooks import AVERAGING_PATH

from .nets import blobs, job_properties, small_net

pytestmark = pytest.mark.spark


def _worker_pids(trainer, epoch):
    """The Python worker processes of an epoch's tasks (a task lane is ``host/pid/partition``)."""
    return {e.lane.split("/")[1] for e in trainer.stats.events if e.epoch == epoch and e.lane.count("/") == 2}


def test_in_stage_epochs_run_in_the_same_python_workers(sc):
    x, y = blobs(96, seed=21)
    rdd = sc.parallelize(list(zip(x, y.tolist())), 2).cache()
    rdd.count()
    trainer = SparkTrainer(sc, small_net(seed=22), ParameterAveraging(batch_size_per_worker=4, workers=2,
                                                                     averaging_frequency=3))
    with job_properties(sc, {AVERAGING_PATH: "in_stage"}):
        trainer.fit(rdd, epochs=3)
    rdd.unpersist()
    assert [h["averaging_path"] for h in trainer.history] == ["in_stage"] * 3
    first = _worker_pids(trainer, 0)
    assert len(first) == 2
    assert _worker_pids(trainer, 1) == first and _worker_pids(trainer, 2) == first
