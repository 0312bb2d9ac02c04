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
    from sparkavg.spark.streaming import StreamedSource

    rows = {0: 40, 1: 0, 2: 33, 3: 16, 4: 16, 5: 7}
    batches, sizes = {}, []
    for p, n in rows.items():
        batches[p] = list(range(len(sizes), len(sizes) + -(-n // 16)))
        sizes += [min(16, n - s) for s in range(0, n, 16)]
    data = StreamedSource(sizes, rows=rows, batches=batches, parts=[p for p, n in rows.items() if n])
    epochs = [data.plan(2, 1, seed) for seed in (10, 11)]
    for plan in epochs:
        dealt = [p for r in plan.parts for p in r if p is not None]
        assert sorted(dealt) == [0, 2, 3, 4, 5] and all(len(r) == 2 for r in plan.parts)
        assert sorted(i for r in plan.rounds for shard in r for i in shard) == list(range(len(sizes)))
    assert data.plan(2, 1, 10).parts == epochs[0].parts  # a resumed run deals the same
    assert epochs[0].parts != epochs[1].parts  # and each epoch afresh
    assert data.plan(2, 1, None).parts == [[0, 2], [3, 4], [5, None]]  # repartition='never': in order


def test_storage_must_be_a_known_mode():
    with pytest.raises(ValueError, match=r"Expect storage in \('auto', 'memory', 'stream'\), got 'disk'"):
        DataOptions(storage="disk")



class _Rounds:
    """Listener: the network's state after each merged round and each epoch; creates
    ``data_transforms.FAIL_MARKER`` after round ``fail_after`` (epoch, round), once."""

    def __init__(self, fail_after=None):
        self.merged, self.epochs, self.fail_after = [], {}, fail_after

    def on_round_end(self, trainer, event):
        self.merged.append(((event["epoch"], event["round"]), trainer.network.params.copy()))
        if (event["epoch"], event["round"]) == self.fail_after:
            open(data_transforms.FAIL_MARKER, "w").close()
            self.fail_after = None  # once

    def on_epoch_end(self, trainer, event):
        self.epochs[event["epoch"]] = _state(trainer.network)


def _state(net):
    return net.params.copy(), net.updater_state.copy(), net.iteration, net.epoch


def _same(a, b) -> bool:
    return all(np.array_equal(u, v) if isinstance(u, np.ndarray) else u == v for u, v in zip(a, b))


def test_a_streamed_fit_that_fails_mid_epoch_restores_the_model_and_says_to_what(spark, tmp_path, caplog):
    """8 source partitions, 4 rounds an epoch: a failure after earlier rounds of the epoch were merged
    into the network -- a NaN in partition 6, or a transform that fails from round 2 of epoch 2 on --
    puts the network (parameters, updater state, iteration, epoch) back to what the epoch found: its
    state before the fit, or at the end of the last epoch (as its checkpoint holds); the log and the
    exception's note say which."""
    import logging

    from sparkavg.data.validation import DataValidationError
    from sparkavg.spark.checkpoint import list_checkpoints

    x, y = blobs(64, seed=33)
    good = [(x[i].reshape(-1).tolist(), int(y[i])) for i in range(64)]
    bad = list(good)
    bad[6 * 8 + 3] = ([float("nan")] + good[6 * 8 + 3][0][1:], good[6 * 8 + 3][1])  # partition 6, row 3
    frame = {name: spark.sparkContext.parallelize(rows, 8).toDF("features array<float>, label long")
             for name, rows in (("good", good), ("bad", bad))}

    def master(transform=None):
        return ParameterAveraging(workers=2, batch_size_per_worker=8, averaging_frequency=1, seed=5,
                                  data=DataOptions(storage="stream", transform=transform))

    # A bad row in the fit's first epoch: back to the state before the fit.
    net, rounds = small_net(seed=34), _Rounds()
    before = _state(net)
    with SparkTrainer(spark, net, master(), listeners=[rounds]) as trainer, \
            caplog.at_level(logging.WARNING, logger="sparkavg.spark.trainer"):
        with pytest.raises(DataValidationError, match=r"Bad features at partition 6, row 3: 1 NaN/inf") as info:
            trainer.fit(frame["bad"], epochs=1)
    assert rounds.merged and not np.array_equal(rounds.merged[-1][1], before[0]), "rounds were merged, then it failed"
    assert _same(_state(net), before) and trainer.epochs_done == 0 and trainer.history == []
    note = "sparkavg: the fit failed in epoch 1; the model was restored to its state before the fit"
    assert info.value.__notes__ == [note]
    assert any(r.getMessage().startswith(note + ": Bad features at partition 6") for r in caplog.records)

    # A failure in round 2 of the fit's second epoch: back to the end of epoch 1, which its checkpoint holds.
    folder = str(tmp_path / "ckpt")
    net, rounds = small_net(seed=35), _Rounds(fail_after=(2, 1))
    try:
        with SparkTrainer(spark, net, master("tests.data_transforms:fail_when_marked"), checkpoint_dir=folder,
                          listeners=[rounds]) as trainer:
            with pytest.raises(Exception, match="a transform failed on purpose") as info:
                trainer.fit(frame["good"], epochs=2)
            assert [r for r, _ in rounds.merged if r[0] == 2] == [(2, 1)], "round 1 of epoch 2 merged, then it failed"
            assert _same(_state(net), rounds.epochs[1]) and trainer.epochs_done == 1 and len(trainer.history) == 1
            (saved,) = list_checkpoints(folder)
            assert saved.epochs_done == 1
            assert info.value.__notes__ == [f"sparkavg: the fit failed in epoch 2; the model was restored to its state "
                                            f"at the end of epoch 1 (as its checkpoint {saved.directory!r} holds)"]
            # A later fit that fails in its first epoch: before that fit, the same end of epoch 1.
            os.remove(data_transforms.FAIL_MARKER)
            with pytest.raises(DataValidationError, match=r"partition 6, row 3") as info:
                trainer.fit(frame["bad"], epochs=1)
            assert _same(_state(net), rounds.epochs[1])
            assert info.value.__notes__ == [f"sparkavg: the fit failed in epoch 2; the model was restored to its state "
                                            f"before the fit, at the end of epoch 1 (as its checkpoint "
                                            f"{saved.directory!r} holds)"]
            trainer.fit(frame["good"], epochs=1)  # and it trains on from there
            assert trainer.epochs_done == 2
    finally:
        if os.path.exists(data_transforms.FAIL_MARKER):
            os.remove(data_transforms.FAIL_MARKER)
