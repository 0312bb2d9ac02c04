"""Parameter averaging with an epoch's rounds inside one barrier stage
(issue 37): the same parameters as a Spark job per round, bit for bit; the
ranks of a classic session meet at the driver's rendezvous, at once; the
decision that picks the path; a lost task reruns the epoch; a silent rank
is named within the stall timeout."""
import threading
import time

import numpy as np
import pytest

from sparkavg.nn import SGD, Dense, FineTuning, Network, Output
from sparkavg.spark import DataOptions, ParameterAveraging, SparkTrainer
from sparkavg.spark.executor.hooks import (ALL_GATHER, AVERAGING_PATH, KILL_MARKER, KILL_ROUND, MEETING, SLOW_WORKER,
                                           STAGE_ATTEMPTS, STALL_RANK, STALL_TIMEOUT)
from sparkavg.spark.policies.block_momentum import BlockMomentum
from sparkavg.spark.policies.path import IN_STAGE, JOBS, AveragingPath
from sparkavg.stats import Phase

from .nets import blobs, job_properties, small_graph, small_net

pytestmark = pytest.mark.spark


def _pairs(x, y):
    return list(zip(x, y.tolist()))


def _sgd_net(seed):
    return Network((1, 4, 4), [Dense(8, activation="relu"), Output(2)], updater=SGD(lr=0.05), seed=seed)


def _frozen_net(seed):
    return Network((1, 4, 4), [Dense(8, activation="relu"), Dense(6, activation="relu"), Output(2)],
                   updater=SGD(lr=0.05), seed=seed, fine_tuning=FineTuning(frozen=["0"]))


def _fit(sc, rdd, make, master, path, momentum=False, properties=None):
    trainer = SparkTrainer(sc, make(), master)
    if momentum:  # block momentum at this small frequency (the runner lives on the driver)
        trainer._runner.block_momentum = BlockMomentum(min_frequency=1)
    with job_properties(sc, {AVERAGING_PATH: path, **(properties or {})}):
        trainer.fit(rdd, epochs=2)
    return trainer


def _state_bytes(net):
    return {k: np.asarray(net.state[k]).tobytes() for k in ("params", "updater", "buffers")}


CASES = {
    # Adam: the moment correction runs on every rank after each all-reduce
    "adam": (lambda: small_net(seed=3), {}, False),
    # BatchNorm's buffers averaged with the parameters
    "graph-buffers": (lambda: small_graph(seed=5), {}, False),
    # block momentum: every rank keeps W and the velocity, starts each round from the look-ahead
    "block-momentum": (lambda: _sgd_net(seed=7), {}, True),
    # a frozen layer keeps its bits
    "frozen": (lambda: _frozen_net(seed=9), {}, False),
    # Spark blocks: a barrier over the deal's shuffled partitions; DL4J's unweighted mean
    "blocks-dl4j": (lambda: small_net(seed=11), {"placement": "spark", "preset": "dl4j"}, False),
    # a seeded transform on Spark blocks: a minibatch draws the same numbers on both paths (worker w, not partition)
    "blocks-transform": (lambda: small_net(seed=12),
                         {"placement": "spark", "transform": "tests.data_transforms:random_flip"}, False),
}


@pytest.mark.parametrize("case", [c if c == "adam" else pytest.param(c, marks=pytest.mark.slow) for c in CASES])
def test_rounds_inside_one_stage_give_the_job_paths_parameters_bit_for_bit(sc, case):
    make, options, momentum = CASES[case]
    x, y = blobs(70, seed=13)  # 70 examples in minibatches of 4: uneven shards, a short last round
    rdd = sc.parallelize(_pairs(x, y), 2)
    preset = options.get("preset", "sparkavg")
    master = ParameterAveraging(batch_size_per_worker=4, averaging_frequency=3, workers=2, preset=preset,
                                data=DataOptions(placement=options.get("placement", "auto"),
                                                 transform=options.get("transform")))
    jobs = _fit(sc, rdd, make, master, JOBS, momentum)
    stage = _fit(sc, rdd, make, master, IN_STAGE, momentum)
    # two workers: treeAggregate's driver reduce sums the two results in partition order, the all-reduce in rank order
    assert _state_bytes(stage.network) == _state_bytes(jobs.network), "the paths' states differ"
    assert stage.network.iteration == jobs.network.iteration
    assert [d["value"] for d in stage.stats.decisions if d["name"] == "averaging_path"] == [IN_STAGE]
    for a, b in zip(stage.history, jobs.history):
        assert (a["averaging_path"], b["averaging_path"]) == (IN_STAGE, JOBS)
        assert a["rounds"] == b["rounds"] and a["examples"] == b["examples"] == 70
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-6)
    # every round's statistics reach the driver: a round span per round, each worker's fit phases per round
    for trainer in (stage, jobs):
        rounds = {(e.epoch, e.round) for e in trainer.stats.events if e.phase == Phase.ROUND}
        fitted = {(e.epoch, e.round) for e in trainer.stats.events if e.phase == Phase.FIT}
        assert rounds == fitted and len(rounds) == sum(h["rounds"] for h in stage.history)
    if momentum:
        np.testing.assert_array_equal(stage._runner.block_momentum.delta, jobs._runner.block_momentum.delta)
        assert np.abs(stage._runner.block_momentum.delta).max() > 0
    if case == "frozen":  # the frozen layer's parameters are its initial ones, bit for bit
        start, net = make(), stage.network
        frozen = [(s.start, s.stop) for s in net.param_segments if s.layer == 0]
        assert frozen and all(net.params[a:b].tobytes() == start.params[a:b].tobytes() for a, b in frozen)


def test_ranks_meet_at_the_drivers_rendezvous_at_once_and_train_as_they_do_through_allgather(sc):
    x, y = blobs(70, seed=13)
    rdd = sc.parallelize(_pairs(x, y), 2)
    master = ParameterAveraging(batch_size_per_worker=4, averaging_frequency=3, workers=2)
    gathered = _fit(sc, rdd, lambda: small_net(seed=3), master, IN_STAGE, properties={MEETING: ALL_GATHER})
    met = _fit(sc, rdd, lambda: small_net(seed=3), master, IN_STAGE)
    assert _state_bytes(met.network) == _state_bytes(gathered.network), "the meetings' states differ"
    assert met.network.iteration == gathered.network.iteration
    # the last stage's meeting (the slowest rank's answer and connections): no one-second poll
    assert met._runner._meeting is not None and met._runner._meeting < 0.5


def test_the_path_is_a_recorded_decision_in_the_users_words():
    path = AveragingPath()
    value, why = path.decide(None, 2, 2, {}, rounds=100, frequency=4)
    assert value == IN_STAGE and "barrier" in why and "assumed" in why
    assert path.decide("streamed minibatches run no barrier stage", None, 2, {}, 100, 4)[0] == JOBS
    assert path.decide(None, 1, 2, {}, 100, 4)[0] == JOBS  # fewer slots than workers
    assert path.decide(None, 4, 2, {JOBS: 0.09, IN_STAGE: 0.004}, 100, 4)[0] == IN_STAGE
    assert path.decide(None, 4, 2, {JOBS: 0.004, IN_STAGE: 0.09}, 100, 4)[0] == JOBS  # measured dearer: jobs
    assert AveragingPath(enabled=False).decide(None, 4, 2, {}, 100, 4)[0] == JOBS  # preset "dl4j"
    with pytest.raises(ValueError, match="averaging_path"):
        path.decide(None, 2, 2, {}, 100, 4, forced="ring")
    # before a meeting is measured: allGather's one-second poll (Connect), or the driver's rendezvous (classic)
    measured = {JOBS: 0.05, IN_STAGE: 0.01}
    assert path.decide(None, 4, 2, measured, rounds=10, frequency=4, iteration=0.002)[0] == JOBS
    value, why = path.decide(None, 4, 2, measured, rounds=10, frequency=4, iteration=0.002, at_driver=True)
    assert value == IN_STAGE and "rendezvous" in why


def test_a_short_epoch_does_not_pay_the_stages_meeting_and_a_long_first_round_hides_it():
    path, measured = AveragingPath(), {JOBS: 0.05, IN_STAGE: 0.01}
    # 10 rounds save 0.4 s; the meeting costs 1 s: a job per round, and the reason says so
    value, why = path.decide(None, 4, 2, measured, rounds=10, frequency=4, iteration=0.002, meeting=1.0)
    assert value == JOBS and "10 round(s) this epoch would save 0.40 s" in why and "pay 0.99 s" in why
    # the same rounds, but round 1 trains for longer than the meeting takes: nothing left to pay
    value, why = path.decide(None, 4, 2, measured, rounds=10, frequency=100, iteration=0.02, meeting=1.0)
    assert value == IN_STAGE and "pay 0.00 s" in why
    # many rounds pay for the meeting
    assert path.decide(None, 4, 2, measured, rounds=40, frequency=4, iteration=0.002, meeting=1.0)[0] == IN_STAGE


@pytest.mark.slow
def test_a_long_local_fit_averages_inside_one_stage_a_short_one_too_and_dl4j_per_job(sc):
    x, y = blobs(240, seed=15)
    rdd = sc.parallelize(_pairs(x, y), 2)
    long = ParameterAveraging(batch_size_per_worker=2, averaging_frequency=1, workers=2)  # 60 rounds
    trainer = SparkTrainer(sc, small_net(seed=16), long)
    trainer.fit(rdd, epochs=2)
    assert [h["averaging_path"] for h in trainer.history] == [IN_STAGE, IN_STAGE]
    assert trainer._runner._meeting is not None and trainer._runner._meeting > 0  # measured by the ranks
    short = SparkTrainer(sc, small_net(seed=16), ParameterAveraging(batch_size_per_worker=4, averaging_frequency=1,
                                                                    workers=2))
    short.fit(sc.parallelize(_pairs(x[:40], y[:40]), 2), epochs=1)
    # the ranks meet at the driver's rendezvous (assumed 50 ms, not allGather's second): even 5 rounds pay for it
    # (a fixed frequency: no probe, so the figures are the rule's priors, whatever the machine's load)
    assert short.history[0]["averaging_path"] == IN_STAGE
    assert "rendezvous" in [d for d in short.stats.decisions if d["name"] == "averaging_path"][0]["reason"]
    dl4j = SparkTrainer(sc, small_net(seed=16), ParameterAveraging.dl4j(batch_size_per_worker=2,
                                                                      averaging_frequency=1, workers=2))
    dl4j.fit(rdd, epochs=1)
    assert dl4j.history[0]["averaging_path"] == JOBS
    assert [d["value"] for d in dl4j.stats.decisions if d["name"] == "averaging_path"] == [JOBS]


def test_auto_frequency_inside_a_stage_uses_the_stages_round_overhead_not_the_probes_jobs(sc):
    x, y = blobs(240, seed=21)
    rdd = sc.parallelize(_pairs(x, y), 2)
    trainer = SparkTrainer(sc, small_net(seed=22), ParameterAveraging(batch_size_per_worker=2, workers=2))
    with job_properties(sc, {AVERAGING_PATH: IN_STAGE}):
        trainer.fit(rdd, epochs=2)
    reasons = [d["reason"] for d in trainer.stats.decisions if d["name"] == "averaging_frequency"]
    assert "probe round" in reasons[0] and "with the overhead of a round inside one stage assumed" in reasons[0]
    assert "round overhead 10.0 ms" in reasons[0]  # STAGE_ROUND_S before a stage ran
    assert "epoch 1" in reasons[1] and "assumed" not in reasons[1]  # then the stage's own rounds


@pytest.mark.slow
def test_a_task_killed_mid_epoch_reruns_the_epoch_and_ends_as_a_clean_run(sc, tmp_path):
    x, y = blobs(80, seed=17)
    rdd = sc.parallelize(_pairs(x, y), 2)
    master = ParameterAveraging(batch_size_per_worker=4, averaging_frequency=2, workers=2)
    clean = _fit(sc, rdd, lambda: small_net(seed=18), master, IN_STAGE)
    marker = tmp_path / "kill-me"
    marker.write_text("x")
    trainer = SparkTrainer(sc, small_net(seed=18), master)
    with job_properties(sc, {AVERAGING_PATH: IN_STAGE, KILL_MARKER: marker, KILL_ROUND: 2, STALL_TIMEOUT: 20.0}):
        trainer.fit(rdd, epochs=2)
    assert (tmp_path / "kill-me.claimed").exists()  # a worker really died at its third round
    assert trainer.stats.counters["stage_restarts"] == 1
    assert _state_bytes(trainer.network) == _state_bytes(clean.network)
    assert [h["examples"] for h in trainer.history] == [80, 80]


@pytest.mark.slow
def test_a_rank_that_stops_answering_is_named_within_the_stall_timeout(sc):
    from sparkavg.transport import PeerLostError

    x, y = blobs(40, seed=19)
    rdd = sc.parallelize(_pairs(x, y), 2)
    trainer = SparkTrainer(sc, small_net(seed=20), ParameterAveraging(batch_size_per_worker=4, workers=2,
                                                                      averaging_frequency=2))
    started = time.monotonic()
    with job_properties(sc, {AVERAGING_PATH: IN_STAGE, STALL_RANK: 1, STALL_TIMEOUT: 3.0, STAGE_ATTEMPTS: 1}):
        with pytest.raises(PeerLostError) as info:
            trainer.fit(rdd, epochs=1)
    assert time.monotonic() - started < 60  # bounded by the stall timeout, never a hang
    assert info.value.rank == 1 and info.value.reason == "stalled"


def test_a_cancel_while_the_stage_runs_ends_the_fit_after_that_epoch(sc):
    from sparkavg.spark import TrainingCancelled

    x, y = blobs(80, seed=21)
    rdd = sc.parallelize(_pairs(x, y), 2)
    trainer = SparkTrainer(sc, small_net(seed=22), ParameterAveraging(batch_size_per_worker=4, workers=2,
                                                                      averaging_frequency=2))
    seen = {}

    def canceller():  # once the epoch's path is decided its stage starts; each minibatch takes 0.1 s
        deadline = time.monotonic() + 60
        while not any(d["name"] == "averaging_path" for d in trainer.stats.decisions):
            if time.monotonic() > deadline:
                return
            time.sleep(0.01)
        time.sleep(0.3)
        seen["running"], seen["cancelled"] = sc.statusTracker().getActiveJobsIds(), trainer.cancel()

    thread = threading.Thread(target=canceller, daemon=True)
    thread.start()
    try:
        with job_properties(sc, {AVERAGING_PATH: IN_STAGE, SLOW_WORKER: "0.1"}), \
                pytest.raises(TrainingCancelled, match=r"round 1 of epoch 2 did not start.*state after epoch 1"):
            trainer.fit(rdd, epochs=2)
    finally:
        thread.join(60)
    assert seen["cancelled"] is True and seen["running"], "cancel() landed while the stage ran"
    assert trainer.epochs_done == 1 and len(trainer.history) == 1  # the running epoch finished and was merged
