"""Data larger than memory (issue 24): a fit that streams every epoch from
the source DataFrame instead of keeping its minibatches, on real local
Spark."""
import json
import os
import shutil
from collections import Counter

import numpy as np
import pytest

from sparkavg.spark import DataOptions, ParameterAveraging, SparkTrainer
from sparkavg.spark.streaming import STORAGE_DECISION

from . import data_transforms
from .nets import blobs, small_net

pytestmark = pytest.mark.spark

N, PARTS, BATCH = 64, 4, 16


def _frame(spark):
    """64 examples in 4 partitions of 16 (one minibatch each); feature
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
    assert f"{N} examples in {PARTS} source partitions of 1-1 minibatches" in stream[1][0]["reason"]
    assert not np.allclose(memory[0], small_net(seed=3).params)  # both trained
    # One minibatch per partition, one per worker per round: the streamed epochs deal the source's partitions
    # as the kept fit deals its minibatches (the same seeded shuffle each epoch), so both train the same model.
    np.testing.assert_allclose(stream[0], memory[0], rtol=0, atol=1e-6)


def test_what_cannot_stream_keeps_its_minibatches_and_says_why(spark):
    from sparkavg.data.validation import DataSpec
    from sparkavg.spark.seam import seam_for
    from sparkavg.spark.streaming import storage_choice

    seam, spec, forced = seam_for(spark), DataSpec((1, 4, 4), 2), DataOptions(storage="stream")
    df = _frame(spark)
    sharing = storage_choice(seam, df, forced, spec, streams_master=False)
    assert not sharing.stream and sharing.reason.startswith("storage='stream' falls back to memory: gradient sharing")
    rdd = storage_choice(seam, df.rdd, forced, spec, streams_master=True)
    assert not rdd.stream and "the data is an RDD, not a DataFrame" in rdd.reason
    assert storage_choice(seam, df, forced, spec, streams_master=True).stream


def test_auto_storage_counts_the_bytes_the_prepared_dtype_keeps(spark):
    """feature_dtype='auto' keeps byte, short (Parquet UINT_8) and encoded-image columns compact: the storage
    decision must not count them at float32's 4 bytes a value, or it would stream data that fits."""
    from sparkavg.data.validation import DataSpec
    from sparkavg.spark.streaming import feature_value_bytes, prepared_bytes_per_example

    cols = {"b": "array<tinyint>", "s": "array<smallint>", "i": "array<int>", "f": "array<float>", "png": "binary"}
    df = spark.createDataFrame([], ", ".join(f"{k} {v}" for k, v in cols.items()))
    assert {k: feature_value_bytes(df, k, "auto") for k in cols} == {"b": 1, "s": 2, "i": 4, "f": 4, "png": 1}
    assert feature_value_bytes(df, "f", "float16") == 2 and feature_value_bytes(df, "b", None) == 4
    spec = DataSpec((1, 28, 28), 10)
    assert prepared_bytes_per_example(spec) - prepared_bytes_per_example(spec, 1) == 3 * 784


def test_a_streamed_epoch_deals_every_partition_once_the_same_for_the_same_epoch():
    from sparkavg.spark.streaming import StreamedData

    rows = {0: 40, 1: 0, 2: 33, 3: 16, 4: 16, 5: 7}
    batches, sizes = {}, []
    for p, n in rows.items():
        batches[p] = list(range(len(sizes), len(sizes) + -(-n // 16)))
        sizes += [min(16, n - s) for s in range(0, n, 16)]
    data = StreamedData(sizes, rows=rows, batches=batches, parts=[p for p, n in rows.items() if n])
    epochs = [data.plan(2, seed) for seed in (10, 11)]
    for plan in epochs:
        dealt = [p for r in plan.parts for p in r if p is not None]
        assert sorted(dealt) == [0, 2, 3, 4, 5] and all(len(r) == 2 for r in plan.parts)
        assert sorted(i for r in plan.rounds for shard in r for i in shard) == list(range(len(sizes)))
    assert data.plan(2, 10).parts == epochs[0].parts  # a resumed run deals the same
    assert epochs[0].parts != epochs[1].parts  # and each epoch afresh
    assert data.plan(2, None).parts == [[0, 2], [3, 4], [5, None]]  # repartition='never': in order


def test_storage_must_be_a_known_mode():
    with pytest.raises(ValueError, match=r"Expect storage in \('auto', 'memory', 'stream'\), got 'disk'"):
        DataOptions(storage="disk")
