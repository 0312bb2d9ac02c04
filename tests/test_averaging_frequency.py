"""averaging_frequency="auto" and block momentum (BMUF): the choice as pure
logic, the block-momentum update against a numpy reference (alone and over
real local[2] rounds), checkpoint/resume of the block velocity, the decision
in the stats and the example's report field."""
import json
import os
import re

import numpy as np
import pytest

from sparkavg.nn import SGD, Adam, Nesterov
from sparkavg.spark import DataOptions, ParameterAveraging, SparkTrainer
from sparkavg.spark.masters import master_from_config
from sparkavg.spark.policies.block_momentum import MIN_FREQUENCY, BlockMomentum, block_momentum_step
from sparkavg.spark.policies.frequency import (MAX_FREQUENCY, MAX_PLAIN_MOMENTUM_FREQUENCY, MIN_ROUNDS_PER_EPOCH,
                                               TARGET_OVERHEAD, AveragingFrequency, RoundCosts, busy_from_payloads,
                                               choose_frequency, convergence_bound, even_rounds, round_costs,
                                               rounds_from_events, rounds_needed)
from sparkavg.spark.runners.averaging import AveragingRunner
from sparkavg.stats import Event

from .nets import averaged_updater_state, blobs, small_net, straight_and_resumed


# ------------------------------------------------------------------ the choice (pure)
def test_frequency_keeps_overhead_at_target_share_of_a_round():
    costs = RoundCosts(overhead=0.1, iteration=0.01, rounds=5, source="epoch 1")
    f, reason = choose_frequency(costs, target=0.1, max_frequency=1000)
    # 0.1 / (0.1 + F * 0.01) <= 0.1  <=>  F >= 90
    assert f == 90 and reason
    assert 0.1 / (0.1 + f * 0.01) <= 0.1 < 0.1 / (0.1 + (f - 1) * 0.01)
    f, _ = choose_frequency(costs, target=0.5, max_frequency=1000)
    assert f == 10  # 0.1 / (0.1 + 10 * 0.01) = 0.5


def test_frequency_is_clamped_to_bounds():
    assert choose_frequency(RoundCosts(2.0, 0.001, 3, "probe"), 0.1, max_frequency=150)[0] == 150
    assert choose_frequency(RoundCosts(0.0, 0.02, 3, "probe"), 0.1, max_frequency=150)[0] == 1
    f, _ = choose_frequency(RoundCosts(0.1, 0.001, 3, "probe"), 0.1, max_frequency=500, minibatches_per_worker=40)
    assert f == 500  # at least the whole epoch: one round per epoch
    assert choose_frequency(RoundCosts(0.1, 0.0, 3, "probe"), 0.1, max_frequency=77)[0] == 77  # no iteration time


def test_frequency_evens_out_the_rounds_of_an_epoch():
    # the README's LeNet: 937 minibatches per worker, 62 ms overhead, 9.7 ms per minibatch, 5%
    costs = RoundCosts(0.0627, 0.00964, 7, "epoch 1")
    plain, _ = choose_frequency(costs, 0.05, 400)
    assert plain == 124, "no epoch length given: the rule alone"
    f, _ = choose_frequency(costs, 0.05, 400, minibatches_per_worker=937)
    assert f == 134 and -(-937 // 134) == 7 < -(-937 // 124) == 8  # 7 even rounds instead of 8, the last short
    assert 0.0627 / (0.0627 + 134 * 0.00964) <= 0.05
    for n in range(1, 1200, 7):
        for wanted in (1, 3, 50, 124, 399, 400):
            even, why = even_rounds(n, min(wanted, n), 400)
            rounds, before = -(-n // even), -(-n // min(wanted, n))
            assert rounds <= before, "never more rounds"
            assert even <= 400 or even == n
            assert even >= min(wanted, n) or rounds == before, "shorter rounds only where their number stays"
            assert n - (rounds - 1) * even >= even - rounds, "the last round is not left short"
            assert (why is None) == (even == min(wanted, n))
    even, why = even_rounds(937, 400, 400)
    assert even == 313 and why is not None  # 3 even rounds instead of 3 of 400
    assert even_rounds(800, 400, 400) == (400, None)


@pytest.mark.parametrize("kwargs, message", [
    ({"target": 0.0}, "Expect 0 < target < 1, got 0.0"),
    ({"target": 1.0}, "Expect 0 < target < 1, got 1.0"),
    ({"max_frequency": 0}, "Expect max_frequency >= 1"),
])
def test_frequency_choice_rejects_bad_arguments(kwargs, message):
    args = {"target": 0.1, "max_frequency": 10, **kwargs}
    with pytest.raises(ValueError, match=message):
        choose_frequency(RoundCosts(0.1, 0.01, 1, "x"), **args)


def test_round_costs_take_the_slowest_worker_and_the_median_round():
    rounds = [
        (1.0, [(0.5, 10), (0.8, 10)]),   # slowest worker 0.8 s: overhead 0.2, 80 ms per minibatch
        (1.3, [(0.9, 10), (0.2, 5)]),    # overhead 0.4, 90 ms
        (0.9, [(1.0, 10)]),              # clock noise: overhead clamps to 0, 100 ms
        (5.0, [(0.0, 0), (0.0, 0)]),     # nothing fitted: ignored
    ]
    costs = round_costs(rounds, "epoch 2")
    assert (costs.overhead, costs.iteration) == (pytest.approx(0.2), pytest.approx(0.09))
    assert (costs.rounds, costs.source) == (3, "epoch 2")
    assert round_costs([(1.0, [])], "x") is None


def test_rounds_from_events_and_payloads():
    ev = [Event("driver", "round", 0.0, 1.0, 0, 0), Event("driver", "round", 1.0, 2.0, 0, 1),
          Event("driver", "broadcast", 0.0, 0.1, 0, 0),
          Event("h/1/p0", "fit", 0.1, 0.3, 0, 0), Event("h/1/p0", "data_load", 0.1, 0.1, 0, 0),
          Event("h/1/p0", "fit", 0.5, 0.3, 0, 0), Event("h/1/p0", "fetch", 0.0, 0.5, 0, 0),
          Event("h/2/p1", "fit", 0.1, 0.2, 0, 0), Event("h/1/p0", "fit", 1.1, 0.4, 0, 1),
          Event("h/1/p0", "fit", 0.1, 9.0, 1, 0), Event("driver", "round", 9.0, 9.0, 1, 0)]
    rounds = rounds_from_events(ev, epoch=0)
    assert [r[0] for r in rounds] == [1.0, 2.0]
    assert sorted(rounds[0][1]) == [(0.2, 1), pytest.approx((0.7, 2))]
    assert rounds[1][1] == [(0.4, 1)]
    payload = {"events": [["fetch", 0.0, 0.2, None], ["data_load", 0.2, 0.01, None], ["fit", 0.21, 0.05, None],
                          ["fit", 0.26, 0.05, {"minibatch": 1}], ["model_init", 0, 1.0, None]]}
    assert busy_from_payloads([payload, {"events": []}]) == [(pytest.approx(0.11), 2), (0.0, 0)]


# ------------------------------------------------------------------ the convergence bound (pure)
def test_convergence_bound_stops_one_round_per_epoch_on_small_data():
    # Issue 22: LeNet on 12,000 images, 1 epoch, 2 workers x 32 = 375 minibatches each; overhead alone chose
    # 279 (one round per epoch).  The bound asks ceil(0.75 x (2 x 375)^(1/3)) = 7 rounds: F <= 54.
    bound = convergence_bound(375, 2, 0)
    assert bound[0] == 54 and rounds_needed(375, 2) == 7
    costs = RoundCosts(overhead=0.0869, iteration=0.0099, rounds=1, source="probe round 2")
    alone, _ = choose_frequency(costs, TARGET_OVERHEAD, MAX_FREQUENCY, 375)
    assert alone == 375, "overhead alone: the whole epoch in one round"
    f, _ = choose_frequency(costs, TARGET_OVERHEAD, MAX_FREQUENCY, 375, bound)
    assert f == 54 and -(-375 // f) == 7


def test_convergence_bound_front_loads_rounds_like_post_local_sgd():
    # All 60,000 images: 937 minibatches per worker.  10 rounds in the first epoch, then what the bound still
    # owes (2) -- at least MIN_ROUNDS_PER_EPOCH, where the overhead rule's 235 (4 even rounds) is within it.
    bounds = [convergence_bound(937, 2, e)[0] for e in range(4)]
    assert bounds == [94, 235, 235, 235]
    assert rounds_needed(2 * 937, 2) - rounds_needed(937, 2) == 2 < MIN_ROUNDS_PER_EPOCH == -(-937 // 235)
    costs = RoundCosts(0.069, 0.0099, 3, "epoch 1")
    assert choose_frequency(costs, TARGET_OVERHEAD, MAX_FREQUENCY, 937, convergence_bound(937, 2, 0))[0] == 94
    f, _ = choose_frequency(costs, TARGET_OVERHEAD, MAX_FREQUENCY, 937, convergence_bound(937, 2, 1))
    assert f == 235  # the overhead rule's 235 (4 even rounds) is within the bound
    assert choose_frequency(costs, TARGET_OVERHEAD, MAX_FREQUENCY, 937)[0] == 235


@pytest.mark.parametrize("workers", [1, 2, 8])
def test_convergence_bound_meets_the_theory_at_every_epoch_end(workers):
    rng = np.random.default_rng(7)
    for n in [1, 2, 3, 5, 40, 375, 937, 5000, *rng.integers(1, 3000, 20).tolist()]:
        done = 0
        for epoch in range(12):
            f, _ = convergence_bound(int(n), workers, epoch)
            rounds = -(-n // f)
            assert rounds >= min(n, MIN_ROUNDS_PER_EPOCH), (n, epoch, f)  # never one round an epoch (n > 1)
            done += rounds
            assert done >= min(rounds_needed((epoch + 1) * n, workers), (epoch + 1) * n), (n, epoch, f)
    # More workers want more rounds: (p T)^(1/3).
    assert convergence_bound(5000, 8, 0)[0] < convergence_bound(5000, 2, 0)[0]
    assert rounds_needed(0, 2) == 0 and rounds_needed(1000, 2) == 10  # 0.75 x 2000^(1/3) = 9.45


def test_plain_averaging_of_a_momentum_updater_is_bounded_by_the_momentum_cap():
    # Issue 22: DL4J's MnistMLP (Nesterov 0.9, 16 per worker) on 60k: the bound alone allows 157 in epoch 1
    # and overhead chose it, 1.9 points behind one process; plain averaging of its momentum stops at 32.
    policy = AveragingRunner(seam=None, master=ParameterAveraging()).frequency_policy
    assert policy.name == "averaging_frequency" and policy.auto and policy.momentum_cap
    assert policy.bound(1875, 2, 0, Adam()) == convergence_bound(1875, 2, 0)  # block momentum's case
    assert convergence_bound(1875, 2, 0)[0] == 157
    f, why = policy.bound(1875, 2, 0, Nesterov(lr=0.05, momentum=0.9))
    assert f == MAX_PLAIN_MOMENTUM_FREQUENCY == 32 and why
    costs = RoundCosts(0.07, 0.002, 3, "probe round 2")
    assert choose_frequency(costs, TARGET_OVERHEAD, MAX_FREQUENCY, 1875, (f, why))[0] == 32
    assert policy.decide(costs, 1875, 2, 0, Nesterov(lr=0.05, momentum=0.9))[0] == 32
    assert policy.bound(40, 2, 0, Nesterov())[0] == convergence_bound(40, 2, 0)[0] == 10  # below it
    assert policy.bound(1875, 2, 0, Nesterov(momentum=0.0))[0] == 157  # no momentum of its own
    # DL4J's preset has no momentum cap on "auto"
    dl4j = AveragingRunner(seam=None, master=ParameterAveraging.dl4j(averaging_frequency="auto")).frequency_policy
    assert dl4j.auto and not dl4j.momentum_cap
    assert dl4j.bound(1875, 2, 0, Nesterov())[0] == 157


def test_averaging_frequency_policy_pinned_and_without_measurements():
    pinned = AveragingFrequency(5)
    assert not pinned.auto
    assert pinned.decide(RoundCosts(2.0, 0.001, 3, "probe"), 1875, 2, 0, Adam())[0] == 5
    assert pinned.decide(None, 3, 2, 0)[0] == 5  # pinned: even past the epoch's length
    auto = AveragingFrequency("auto")
    assert auto.decide(None, 1875, 2, 0, Adam())[0] == 157  # no probe fitted anything: the bound
    assert auto.decide(RoundCosts(20.0, 0.001, 3, "probe"), 100_000, 1, 0, Adam())[0] == MAX_FREQUENCY == 400


def test_convergence_bound_validation():
    for args, message in [((0, 2, 0), "Expect minibatches_per_worker >= 1 (an int), got 0"),
                          ((10, 0, 0), "Expect workers >= 1 (an int), got 0"),
                          ((10, 2, -1), "Expect epoch >= 0 (an int), got -1"),
                          ((10, 2, 0, 0.0), "Expect constant > 0 (a finite float), got 0.0"),
                          ((10, 2, 0, 0.75, 0), "Expect min_rounds >= 1 (an int), got 0")]:
        with pytest.raises(ValueError, match=re.escape(message)):
            convergence_bound(*args)
    with pytest.raises(ValueError, match=re.escape("Expect a convergence bound >= 1 (an int), got 0")):
        choose_frequency(RoundCosts(0.1, 0.01, 1, "x"), 0.03, 400, 100, (0, "bad"))


# ------------------------------------------------------------------ block momentum's decision (pure)
def test_block_momentum_off_with_a_momentum_updater_and_at_small_frequency():
    bm = BlockMomentum()
    assert bm.name == "block_momentum"
    assert (bm.enabled, bm.min_frequency, bm.block_lr, bm.nesterov) == (True, MIN_FREQUENCY, 1.0, True)
    assert bm.decide(400, Nesterov(lr=0.05, momentum=0.9), 2)[0] == 0.0 and not bm.on  # its own momentum
    assert bm.decide(5, Adam(), 2)[0] == 0.0 and not bm.on  # every 5 minibatches (< 32)
    assert bm.decide(31, SGD(), 2)[0] == 0.0
    assert bm.decide(32, Adam(), 2)[0] == 0.5 and bm.on  # 1 - 1/workers
    assert bm.decide(235, SGD(), 2)[0] == 0.5 and bm.decide(100, None, 2)[0] == 0.5
    assert bm.decide(400, Nesterov(momentum=0.0), 2)[0] == 0.5, "a Nesterov without momentum has none of its own"
    assert BlockMomentum().decide(32, SGD(), 4)[0] == 0.75
    assert BlockMomentum(min_frequency=1).decide(1, Adam(), 2)[0] == 0.5  # tests lower the frequency it needs
    assert BlockMomentum(min_frequency=1).decide(1, Nesterov(), 2)[0] == 0.0  # never on top of a momentum
    dl4j = BlockMomentum(enabled=False)  # preset "dl4j": plain averaging always
    assert dl4j.decide(400, SGD(), 2)[0] == 0.0 and not dl4j.on
    runner = AveragingRunner(seam=None, master=ParameterAveraging())
    assert runner.block_momentum.enabled and not runner.uniform
    assert not AveragingRunner(seam=None, master=ParameterAveraging.dl4j()).block_momentum.enabled


def test_block_momentum_look_ahead_and_an_epoch_without_it_drops_the_velocity():
    bm = BlockMomentum(min_frequency=1)
    params = np.ones(4, np.float32)
    assert bm.look_ahead(params) is params  # off: the round starts from W
    assert bm.decide(2, SGD(), 2)[0] == 0.5
    assert bm.look_ahead(params) is params  # no velocity yet
    averaged = params + 0.5
    bm.step(params, averaged)
    np.testing.assert_allclose(bm.delta, 0.5)
    np.testing.assert_allclose(bm.look_ahead(averaged), 1.5 + 0.5 * 0.5)  # Nesterov: W + mu * Delta
    assert set(bm.state_dict()) == {"block_momentum_delta"}
    assert bm.decide(2, Nesterov(), 2)[0] == 0.0
    assert bm.delta is None and bm.state_dict() == {}  # off drops the velocity


# ------------------------------------------------------------------ configuration
def test_defaults_and_validation():
    m = ParameterAveraging()
    assert m.averaging_frequency == "auto" and m.auto_frequency
    assert ParameterAveraging(averaging_frequency=7).auto_frequency is False
    assert (TARGET_OVERHEAD, MAX_FREQUENCY) == (0.03, 400)
    for kwargs, message in [
        ({"averaging_frequency": 0}, "Expect averaging_frequency >= 1 (an int) or 'auto', got 0"),
        ({"averaging_frequency": "often"}, "Expect averaging_frequency >= 1 (an int) or 'auto', got 'often'"),
        ({"save_updater": 1}, "Expect save_updater to be a bool, got 1"),
    ]:
        with pytest.raises(ValueError, match=re.escape(message)):
            ParameterAveraging(**kwargs)


@pytest.mark.parametrize("master", [
    ParameterAveraging(),
    ParameterAveraging(averaging_frequency=12, save_updater=False),
    ParameterAveraging.dl4j(),
])
def test_config_round_trip(master):
    assert master_from_config(json.loads(json.dumps(master.to_config()))) == master


# ------------------------------------------------------------------ BMUF math
def _bmuf_reference(model, averaged, delta, mu, zeta, nesterov):
    """Chen & Huo 2016, eqs. 2-4, in float64."""
    sent = model + mu * delta if nesterov else model
    g = averaged - sent
    delta = mu * delta + zeta * g
    return model + delta, delta


@pytest.mark.parametrize("nesterov", [True, False])
def test_block_momentum_step_matches_reference(nesterov):
    rng = np.random.default_rng(0)
    n = 1000
    model = rng.standard_normal(n).astype(np.float32)
    delta = np.zeros(n, np.float32)
    ref_model, ref_delta = model.astype(np.float64), delta.astype(np.float64)
    for _ in range(3):
        averaged = (model + 0.1 * rng.standard_normal(n)).astype(np.float32)
        ref_model, ref_delta = _bmuf_reference(ref_model, averaged.astype(np.float64), ref_delta, 0.6, 0.8, nesterov)
        new = averaged.copy()
        block_momentum_step(model, new, delta, 0.6, 0.8, nesterov)
        model = new
        np.testing.assert_allclose(model, ref_model, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(delta, ref_delta, rtol=1e-5, atol=1e-5)


def test_runner_state_round_trips_through_npz_without_pickle(tmp_path):
    runner = AveragingRunner(seam=None, master=ParameterAveraging())
    assert runner.state_dict() == {}
    runner.block_momentum.delta = np.arange(5, dtype=np.float32)
    runner._costs = RoundCosts(0.07, 0.011, 12, "epoch 3")
    path = tmp_path / "runner.npz"
    np.savez(path, **{k: np.asarray(v) for k, v in runner.state_dict().items()})
    with np.load(path, allow_pickle=False) as data:
        loaded = {k: data[k] for k in data.files}
    other = AveragingRunner(seam=None, master=ParameterAveraging())
    other.load_state_dict(loaded)
    np.testing.assert_array_equal(other.block_momentum.delta, runner.block_momentum.delta)
    assert other._costs == runner._costs
    with pytest.raises(ValueError, match=r"unknown keys \['velocity'\]"):
        other.load_state_dict({"velocity": np.zeros(3)})


def _pairs(x, y):
    return list(zip(x, y.tolist()))


def _simulate(start, x, rounds, mu, zeta, nesterov, y):
    """The driver's BMUF over replicas fitted in this process (float64 driver arithmetic), their
    updater state averaged as the default preset does (Adam's ``v`` with the moment correction)."""
    model = start.params.astype(np.float64)
    state, iteration = start.updater_state.copy(), start.iteration
    delta = np.zeros_like(model)
    for shards in rounds:
        sent = model + mu * delta if nesterov else model
        reps = []
        for shard in shards:
            rep = start.clone()
            rep.params, rep.updater_state, rep.iteration = sent.astype(np.float32), state, iteration
            for b in shard:
                rep.fit_batch(x[4 * b:4 * b + 4], y[4 * b:4 * b + 4])
            reps.append(rep)
        averaged = np.mean([r.params.astype(np.float64) for r in reps], axis=0)
        begun = start.clone()  # the state the round started from
        begun.updater_state, begun.iteration = state, iteration
        state = averaged_updater_state(begun, reps).astype(np.float32)
        iteration += len(shards[0])
        model, delta = _bmuf_reference(model, averaged, delta, mu, zeta, nesterov)
    return model


@pytest.mark.spark
@pytest.mark.parametrize("nesterov, zeta", [(True, 1.0), (False, 0.8)])
def test_block_momentum_over_spark_rounds_matches_numpy(sc, nesterov, zeta):
    x, y = blobs(48, seed=21)
    rdd = sc.parallelize(_pairs(x, y), 2)
    start = small_net(seed=22)
    net = start.clone()
    master = ParameterAveraging(batch_size_per_worker=4, averaging_frequency=2, workers=2,
                                data=DataOptions(repartition="never"))
    trainer = SparkTrainer(sc, net, master)
    # the runner lives on the driver: block momentum at this small frequency, with the test's own block_lr
    trainer._runner.block_momentum = BlockMomentum(min_frequency=1, block_lr=zeta, nesterov=nesterov)
    trainer.fit(rdd, epochs=1)
    # 12 minibatches of 4 in data order, 2 per worker per round: 3 rounds dealt round-robin.
    rounds = [[[0, 2], [1, 3]], [[4, 6], [5, 7]], [[8, 10], [9, 11]]]
    expected = _simulate(start, x, rounds, 0.5, zeta, nesterov, y)  # momentum 1 - 1/workers
    np.testing.assert_allclose(net.params, expected, rtol=1e-5, atol=1e-5)
    plain = _simulate(start, x, rounds, 0.0, 1.0, False, y)  # what plain averaging gives
    assert np.abs(expected - plain).max() > 1e-3  # block momentum made a difference the test sees
    assert trainer.history[0]["averaging_frequency"] == 2 and trainer.history[0]["rounds"] == 3
    assert [d["value"] for d in trainer.stats.decisions if d["name"] == "block_momentum"] == [0.5]


@pytest.mark.spark
def test_checkpoint_resume_with_block_momentum_continues_exactly(sc, tmp_path):
    x, y = blobs(60, seed=23)
    rdd = sc.parallelize(_pairs(x, y), 2)
    master = ParameterAveraging(batch_size_per_worker=6, averaging_frequency=2, workers=2)
    ckpt = str(tmp_path / "ckpt")

    def block_momentum_at_frequency_2(trainer):
        trainer._runner.block_momentum.min_frequency = 1

    straight, resumed, _ = straight_and_resumed(sc, small_net, master, rdd, ckpt, seed=24,
                                                setup=block_momentum_at_frequency_2)
    with np.load(os.path.join(ckpt, "epoch-00002", "runner.npz"), allow_pickle=False) as saved:
        assert np.abs(saved["block_momentum_delta"]).max() > 0
    np.testing.assert_allclose(resumed.params, straight.params, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(resumed.updater_state, straight.updater_state, rtol=1e-5, atol=1e-7)


# ------------------------------------------------------------------ "auto" on Spark
@pytest.mark.spark
def test_auto_frequency_decision_in_stats_history_and_page(sc, tmp_path):
    x, y = blobs(96, seed=25)
    rdd = sc.parallelize(_pairs(x, y), 2)
    # 12 minibatches per worker: the convergence bound's 4 rounds an epoch (3 each) decide, deterministically
    # (no round on Spark keeps its overhead at 3% of 3 minibatches of this network).
    auto = ParameterAveraging(batch_size_per_worker=4, workers=2)
    net = small_net(seed=26)
    trainer = SparkTrainer(sc, net, auto)
    trainer.fit(rdd, epochs=2)
    chosen = [d for d in trainer.stats.decisions if d["name"] == "averaging_frequency"]
    assert [(d["epoch"], d["value"]) for d in chosen] == [(0, 3), (1, 3)]
    assert [convergence_bound(12, 2, e)[0] for e in (0, 1)] == [3, 3]
    assert [h["averaging_frequency"] for h in trainer.history] == [3, 3]
    assert [h["rounds"] for h in trainer.history] == [4, 4]  # 24 minibatches / (2 workers x 3)
    assert trainer.stats.counters["examples"] == 2 * 96  # the probe rounds trained nothing
    saved = json.loads(trainer.stats.to_json())
    assert [d["value"] for d in saved["decisions"] if d["name"] == "averaging_frequency"] == [3, 3]
    page = trainer.stats.to_html()
    assert "averaging_frequency" in page
    # Block momentum at the defaults: off at F=3 (< 32), said once in the stats, JSON and page.
    bm = [d for d in trainer.stats.decisions if d["name"] == "block_momentum"]
    assert [(d["epoch"], d["value"]) for d in bm] == [(0, 0.0)]
    assert [d["value"] for d in saved["decisions"] if d["name"] == "block_momentum"] == [0.0]
    assert "block_momentum" in page
    # The probe left no trace on the model: the same fit with the frequency pinned to 3 is identical.
    pinned = small_net(seed=26)
    SparkTrainer(sc, pinned, ParameterAveraging(batch_size_per_worker=4, workers=2,
                                                averaging_frequency=3)).fit(rdd, epochs=2)
    np.testing.assert_array_equal(net.params, pinned.params)
