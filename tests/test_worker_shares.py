"""Straggler tolerance of parameter averaging: shares of the epoch's
minibatches cut by the workers' measured speeds (the policy
:class:`~sparkavg.spark.policies.shares.WorkerShares` of the default preset;
equal shares under ``"dl4j"``).

The deal is pure (no Spark): every minibatch id must appear exactly once
per epoch whatever the weights, the shares must follow the weights, and
a round must give each worker minibatches in proportion to its share.
One real local[2] fit with one worker slowed (the ``slow_worker`` test
hook) shows the runner measures, decides, records and still trains every
example once.
"""

import numpy as np
import pytest

from sparkavg.spark import DataOptions, ParameterAveraging, SparkTrainer
from sparkavg.data.deal import (MIN_SPEED_RATIO, apportion, deal_epoch, local_shards, share_choice, split_rounds,
                                 weighted_shards)
from sparkavg.spark.executor.hooks import SLOW_WORKER

from .nets import blobs, small_net

WEIGHTS = [[1, 1], [1, 0.5], [1, 1, 1, 1, 1, 1, 1, 0.5], [3, 1, 2], [1, 0.1, 1, 1], [0.5, 1, 1, 1, 1, 1, 1, 1]]


def ids_of(rounds):
    return [i for shards in rounds for shard in shards for i in shard]


@pytest.mark.parametrize("weights", WEIGHTS)
@pytest.mark.parametrize("count", [1, 7, 40, 203, 1000])
@pytest.mark.parametrize("per_round", [1, 3, 25])
@pytest.mark.parametrize("local", [True, False])
def test_every_minibatch_trains_exactly_once_per_epoch_whatever_the_shares(weights, count, per_round, local):
    workers = len(weights)
    layout = [(f"host{i * workers // count}", i) for i in range(count)]
    for seed in (None, 3, 4):
        rounds = deal_epoch(count, workers, per_round, seed, local, layout, weights)
        got = ids_of(rounds)
        assert sorted(got) == list(range(count))  # each id once: none lost, none twice
        assert all(len(shards) == workers for shards in rounds)
        # As many rounds as equal shares have: re-cut shares never add a round (its fixed cost) to the
        # epoch; per_round is then each worker's mean, the faster ones' parts a little larger.
        assert len(rounds) == len(deal_epoch(count, workers, per_round, seed, local, layout))
        assert sum(len(s) for shards in rounds for s in shards) <= per_round * workers * len(rounds)
        assert all(any(shards) for shards in rounds)  # no empty round


@pytest.mark.parametrize("weights", WEIGHTS)
def test_shares_follow_the_weights_and_each_round_is_proportional(weights):
    count, workers = 1600, len(weights)
    rounds = deal_epoch(count, workers, 10, seed=1, local=True, weights=weights)
    per_worker = [sum(len(shards[w]) for shards in rounds) for w in range(workers)]
    expected = np.asarray(weights) / np.sum(weights) * count
    assert np.all(np.abs(np.asarray(per_worker) - expected) <= 1)
    for shards in rounds:  # within a round too: each worker's part differs from its share by < 1 minibatch
        sizes = np.asarray([len(s) for s in shards])
        assert np.all(np.abs(sizes - expected / len(rounds)) < 1 + 1e-9)


def test_apportion_sums_to_the_total_and_rejects_bad_weights():
    for total in (0, 1, 5, 99, 1000):
        for weights in WEIGHTS:
            parts = apportion(total, weights)
            assert sum(parts) == total and all(p >= 0 for p in parts)
            assert np.all(np.abs(np.asarray(parts) - total * np.asarray(weights) / sum(weights)) < 1)
    for bad in ([], [1, 0], [1, -1], [1, float("nan")]):
        with pytest.raises(ValueError, match="Expect one finite weight > 0 per worker"):
            apportion(10, bad)
    with pytest.raises(ValueError, match="Expect a weight per worker"):
        deal_epoch(10, 3, 2, None, True, weights=[1, 1])


def test_weighted_shards_move_only_the_slow_shards_tail_spread_over_the_others():
    shards = local_shards(80, 8)  # 10 per worker, each on its own host
    moved = weighted_shards(shards, [1] * 7 + [0.5])
    assert sorted(i for s in moved for i in s) == list(range(80))
    for w in range(7):  # every fast worker keeps all its own minibatches and takes one foreign one at most
        assert moved[w][:10] == shards[w]
        assert len(moved[w]) - 10 <= 1
    assert moved[7] == shards[7][:len(moved[7])]  # the slow one keeps the head of its own
    foreign = max((len(moved[w]) - 10) / len(moved[w]) for w in range(7))
    assert foreign < 0.2  # under Spark's 20% reduce-locality cut: each partition still prefers its own host


def test_equal_shares_unchanged_when_no_weights():
    # weights=None is the deal as it always was (resume and old runs deal the same epochs).
    from sparkavg.data.deal import deal, deal_shards

    assert deal_epoch(50, 3, 4, 7, True) == deal_shards(local_shards(50, 3), 4, 7)
    assert deal_epoch(50, 3, 4, 7, False) == deal(50, 3, 4, 7)


def test_split_rounds_keeps_each_shards_order_without_a_seed():
    assert split_rounds([[0, 1, 2, 3], [4, 5]], 2, None) == [[[0, 1], [4]], [[2, 3], [5]]]
    assert split_rounds([[], []], 2, None) == []


@pytest.mark.parametrize("speeds, local, enabled, measured, weights", [
    ([100.0], True, True, None, None),  # one worker
    ([100.0, 95.0], True, True, None, None),  # speeds within MIN_SPEED_RATIO
    ([100.0, 100 / MIN_SPEED_RATIO * 1.01], True, True, None, None),
    ([100.0, None], True, True, None, None),  # no speed measured yet for worker 1
    ([100.0, 50.0], True, True, [0.1, 1.0], None),  # worker 0 measured over too short a time
    ([100.0, 50.0], False, True, None, None),  # dealt balanced: a worker's index is bound to no host
    ([100.0, 50.0], True, False, None, None),  # preset "dl4j": equal shares
    ([100.0, 50.0], True, True, None, [100.0, 50.0]),  # by speed
])
def test_share_choice_is_off_where_it_cannot_help(speeds, local, enabled, measured, weights):
    got, why = share_choice(speeds, local, enabled, measured)
    assert got == weights and why


def test_worker_shares_follow_the_preset():
    from sparkavg.spark.runners.averaging import AveragingRunner

    assert AveragingRunner(None, ParameterAveraging()).shares.enabled
    assert not AveragingRunner(None, ParameterAveraging.dl4j()).shares.enabled


@pytest.mark.spark
@pytest.mark.slow
def test_a_slow_worker_gets_a_smaller_share_and_every_example_still_trains_once(sc):
    n = 960
    x, y = blobs(n, seed=31)
    rdd = sc.parallelize(list(zip(x, y.tolist())), 2)
    # local[2] prepares shared files, which "auto" deals balanced; shares follow speeds only in a local deal.
    master = ParameterAveraging(batch_size_per_worker=8, averaging_frequency=5, workers=2,
                                data=DataOptions(repartition="local"))
    trainer = SparkTrainer(sc, small_net(seed=32), master)
    sc.setLocalProperty(SLOW_WORKER, "0.005,0.02")  # after each minibatch worker 0 sleeps 5 ms, worker 1 20 ms
    try:
        trainer.fit(rdd, epochs=3)
    finally:
        sc.setLocalProperty(SLOW_WORKER, None)
    trainer.close()
    assert [h["examples"] for h in trainer.history] == [n] * 3  # every example, once per epoch
    assert trainer.stats.counters["examples"] == 3 * n and trainer.stats.counters["minibatches"] == 3 * n // 8
    decisions = [d for d in trainer.stats.decisions if d["name"] == "worker_shares"]
    assert decisions[0]["value"] == "equal" and decisions[0]["epoch"] == 0  # no speed measured yet
    assert decisions[-1]["value"] == "by speed", decisions
    assert trainer.history[0]["worker_shares"] is None
    shares = trainer.history[-1]["worker_shares"]
    assert shares[1] < 0.35 < 0.65 < shares[0], shares  # the slow worker fits ~1/5 (4x slower)
    assert trainer.evaluate(rdd).accuracy() > 0.9


def test_equal_finish_shares_make_every_worker_end_the_round_together():
    from sparkavg.data.deal import equal_finish_shares

    speeds, fixed = [100.0, 100.0, 50.0], [0.2, 0.2, 0.4]  # the slow host is slow at everything
    n = equal_finish_shares(speeds, fixed, 300)
    assert sum(n) == pytest.approx(300)
    ends = [a + k / s for a, k, s in zip(fixed, n, speeds)]
    assert max(ends) - min(ends) < 1e-9
    assert n[2] < 0.5 * n[0]  # less than its speed alone would give: its fixed part is longer too
    # Without a fixed part, shares are proportional to speed.
    assert equal_finish_shares(speeds, [0, 0, 0], 250) == pytest.approx([100, 100, 50])
    # A worker whose fixed part alone outlasts the round still gets a floor share.
    assert equal_finish_shares([100.0, 100.0], [0.0, 10.0], 100)[1] == pytest.approx(0.05 * 50)


def test_checkpointed_runner_state_keeps_the_speeds_the_next_epoch_is_cut_from():
    import numpy as np

    from sparkavg.spark.runners.averaging import AveragingRunner

    runner = AveragingRunner(None, ParameterAveraging())
    runner.shares._log = {0: [640, 1.0, 0.4, 2], 2: [320, 1.0, 0.8, 2]}  # worker 1 never measured
    state = runner.state_dict()
    assert state["worker_speeds"].shape == (3, 3)
    resumed = AveragingRunner(None, ParameterAveraging())
    resumed.load_state_dict({k: np.asarray(v) for k, v in state.items()})
    assert resumed.shares.speeds == [(640.0, 1.0, 0.2), None, (320.0, 1.0, 0.4)] == runner.shares.speeds
    with pytest.raises(ValueError, match="unknown keys"):
        resumed.load_state_dict({"worker_speed": np.zeros(3)})


def test_a_shards_foreign_minibatches_are_spread_evenly_over_its_rounds():
    # Bunched in one round, a fast worker's part would be mostly the slow host's blocks, and Spark's reduce
    # locality would then also run it on the slow host (on top of the slow worker's own part).
    count, workers, per_round = 512, 8, 16
    weights = [1.0] * 7 + [0.2]
    home = local_shards(count, workers)
    for seed in (1, 2, 3):
        rounds = deal_epoch(count, workers, per_round, seed, True, None, weights)
        assert len(rounds) == 4 and sorted(ids_of(rounds)) == list(range(count))
        for w in range(workers):
            foreign = [sum(i not in set(home[w]) for i in shards[w]) for shards in rounds]
            assert max(foreign) - min(foreign) <= 1, (w, foreign)
            assert max(f / max(len(shards[w]), 1) for f, shards in zip(foreign, rounds)) < 0.2
