"""Executor-side minibatch transforms (issue 24), on real local Spark: they
run on the executors, seeded per worker, epoch and minibatch, so runs with
the same seed -- and resumed runs -- train alike, on both masters."""
import json
import os
import shutil

import numpy as np
import pytest

from sparkavg.configurable import from_config
from sparkavg.spark import DataOptions, GradientSharing, ParameterAveraging, SparkTrainer
from sparkavg.data.transforms import TransformError

from . import data_transforms
from .nets import blobs, small_net, straight_and_resumed

pytestmark = pytest.mark.spark

FLIP = "tests.data_transforms:random_flip"


def _calls() -> list:
    """Every call :func:`tests.data_transforms.random_flip` noted since the last :func:`_clear`."""
    out = []
    for name in sorted(os.listdir(data_transforms.LOG)):
        with open(os.path.join(data_transforms.LOG, name)) as fh:
            out += [json.loads(line) for line in fh]
    return out


def _clear() -> None:
    shutil.rmtree(data_transforms.LOG, ignore_errors=True)
    os.makedirs(data_transforms.LOG)


def _master(master_type, **data):
    extra = {"averaging_frequency": 2} if master_type is ParameterAveraging else {}
    return master_type(workers=2, batch_size_per_worker=10, seed=7, data=DataOptions(placement="spark", **data),
                       **extra)


@pytest.mark.parametrize("master_type", [ParameterAveraging, pytest.param(GradientSharing, marks=pytest.mark.slow)])
def test_transform_runs_on_executors_seeded_per_worker_epoch_and_minibatch(sc, master_type):
    x, y = blobs(80, seed=30)
    rdd = sc.parallelize(list(zip(x, y.tolist())), 2)
    runs = []
    try:
        for _ in range(2):
            _clear()
            net = small_net(seed=31)
            with SparkTrainer(sc, net, _master(master_type, transform=FLIP)) as trainer:
                trainer.fit(rdd, epochs=2)
            runs.append((net.params.copy(), _calls()))
        plain = small_net(seed=31)
        with SparkTrainer(sc, plain, _master(master_type)) as trainer:
            trainer.fit(rdd, epochs=2)
    finally:
        shutil.rmtree(data_transforms.LOG, ignore_errors=True)
    (params, calls), (params_again, calls_again) = runs
    assert calls and all(c["pid"] != os.getpid() for c in calls)  # on the executors, not the driver
    assert len(calls) == 2 * 8 and sum(c["n"] for c in calls) == 2 * 80  # every minibatch, every epoch
    assert len({c["draw"] for c in calls}) == len(calls)  # a generator of its own per (worker, epoch, minibatch)
    assert sorted(c["draw"] for c in calls) == sorted(c["draw"] for c in calls_again)
    # sharing too: at staleness=0 a replica applies its peers' messages of iteration k before step k + 1, in
    # (iteration, rank) order, whenever they arrived
    np.testing.assert_array_equal(params, params_again)
    assert np.abs(params - plain.params).max() > 1e-4  # the flips changed what was trained


def test_a_resumed_run_transforms_as_a_straight_one(sc, tmp_path):
    x, y = blobs(80, seed=32)
    rdd = sc.parallelize(list(zip(x, y.tolist())), 2)
    straight, resumed, trainer = straight_and_resumed(sc, small_net, _master(ParameterAveraging, transform=FLIP),
                                                      rdd, str(tmp_path / "ckpt"))
    trainer.close()
    np.testing.assert_array_equal(resumed.params, straight.params)


def test_a_transform_that_breaks_the_minibatch_is_named_and_not_retried(sc):
    x, y = blobs(40, seed=33)
    master = _master(ParameterAveraging, transform="tests.data_transforms:drop_labels")
    with SparkTrainer(sc, small_net(seed=33), master) as trainer:
        with pytest.raises(TransformError, match=r"'tests.data_transforms:drop_labels' to return as many labels as "
                                                 r"examples .* got 10 examples and 9 labels"):
            trainer.fit(sc.parallelize(list(zip(x, y.tolist())), 2))
    with pytest.raises(TransformError, match="module-level function of an importable module"):
        DataOptions(transform=lambda x, y, rng: (x, y))
    assert DataOptions(transform=data_transforms.random_flip).transform == FLIP
    assert "transform" not in DataOptions().to_config()  # configs from before transforms stay equal
    assert from_config(master.to_config(), "master").data.transform == master.data.transform
