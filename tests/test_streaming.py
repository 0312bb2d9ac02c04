"""Data larger than memory (issue 24): a fit that streams every epoch from
the source DataFrame instead of keeping its minibatches, on real local
Spark."""
import json
import os
import shutil
from collections import Counter

import numpy as np
import pytest

from sparkavg.spark import DataOptions, GradientSharing, ParameterAveraging, SparkTrainer
from sparkavg.spark.streaming import STORAGE_DECISION

from . import data_transforms
from .nets import blobs, small_net

pytestmark = pytest.mark.spark

N, PARTS, BATCH = 96, 6, 16


def _frame(spark):
    """96 examples in 6 partitions of 16 (one minibatch each); feature
    ``[0, 0, 0]`` carries the example's id / 1000."""
    x, y = blobs(N, seed=31)
    x[:, 0, 0, 0] = np.arange(N) / 1000.0
    rows = [(x[i].reshape(-1).tolist(), int(y[i])) for i in range(N)]
    return spark.sparkContext.parallelize(rows, PARTS).toDF("features array<float>, label long")


def _seen() -> Counter:
    seen = Counter()
    for name in os.listdir(data_transforms.IDS_LOG):
        with open(os.path.join(data_transforms.IDS_LOG, name)) as fh:
            for line in fh:
                seen.update(json.loads(line)["ids"])
    return seen


def _decision(trainer):
    return [d for d in trainer.stats.decisions if d["name"] == STORAGE_DECISION]


def test_a_streamed_fit_trains_every_example_once_per_epoch_as_a_kept_one_does(spark):
    df = _frame(spark)
    fitted = {}
    for storage in ("auto", "stream"):
        shutil.rmtree(data_transforms.IDS_LOG, ignore_errors=True)
        os.makedirs(data_transforms.IDS_LOG)
        master = ParameterAveraging(workers=2, batch_size_per_worker=BATCH, averaging_frequency=1, seed=7,
                                    data=DataOptions(storage=storage, transform="tests.data_transforms:note_ids"))
        net = small_net(seed=3)
        with SparkTrainer(spark, net, master) as trainer:
            trainer.fit(df, epochs=2)
            decided = _decision(trainer)
            assert [h["examples"] for h in trainer.history] == [N, N]
        # Every example trained exactly once per epoch (twice in two epochs), memory and streamed alike.
        assert _seen() == Counter({i: 2 for i in range(N)}), storage
        fitted[storage] = (net.params.copy(), decided)
    memory, stream = fitted["auto"], fitted["stream"]
    assert [d["value"] for d in memory[1]] == ["memory"] and memory[1][0]["reason"].startswith("auto: ")
    assert [d["value"] for d in stream[1]] == ["stream"] and "storage='stream'" in stream[1][0]["reason"]
    # One minibatch per partition, one per worker per round: the streamed epochs deal the source's partitions
    # as the kept fit deals its minibatches (the same seeded shuffle each epoch), so both train the same model.
    np.testing.assert_allclose(stream[0], memory[0], rtol=0, atol=1e-6)


def test_sharing_falls_back_to_kept_minibatches_and_says_so(spark):
    master = GradientSharing(workers=2, batch_size_per_worker=BATCH, seed=7, data=DataOptions(storage="stream"))
    with SparkTrainer(spark, small_net(seed=3), master) as trainer:
        trainer.fit(_frame(spark), epochs=1)
        decided = _decision(trainer)
        assert trainer.history[0]["examples"] == N
    assert [d["value"] for d in decided] == ["memory"]
    assert decided[0]["reason"].startswith("storage='stream' falls back to memory: gradient sharing")


def test_storage_must_be_a_known_mode():
    with pytest.raises(ValueError, match=r"Expect storage in \('auto', 'memory', 'stream'\), got 'disk'"):
        DataOptions(storage="disk")
