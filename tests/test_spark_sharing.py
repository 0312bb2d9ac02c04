"""Gradient sharing on a real local[2] Spark: replicas agree, it learns,
compression is real, and lost datagrams change nothing."""
import os

import numpy as np
import pytest

from sparkavg.spark import GradientSharing, ParameterAveraging, SparkTrainer
from sparkavg.spark.executor.hooks import (ALL_GATHER, KILL_MARKER, MEETING, RETRANSMIT_TIMEOUT, STAGE_ATTEMPTS,
                                           STALL_RANK, STALL_TIMEOUT, UDP_LOSS)
from sparkavg.spark.masters import AdaptiveThreshold, Topology
from sparkavg.transport import local_ipv4_addresses

from .nets import blobs, job_properties, small_net

pytestmark = pytest.mark.spark


def _named_host(error, rank: int, executor: str) -> str:
    """The host an error names for ``rank`` (``worker rank R on host H (executor E)``)."""
    import re

    found = re.search(rf"worker rank {rank} on host (\S+) \(executor {executor}\)", str(error))
    assert found, f"expected worker rank {rank} and its host named, got: {error}"
    return found.group(1)


def _rdd(sc, n, seed, parts=2):
    x, y = blobs(n, seed=seed)
    return sc.parallelize(list(zip(x, y.tolist())), parts), x, y


def _first_waits(trainer) -> list:
    """Each rank's first wait of every epoch: for the first total, which needs the peers' addresses."""
    firsts = {}
    for e in sorted((e for e in trainer.stats.events if e.phase == "wait" and e.lane != "driver"),
                    key=lambda e: e.start):
        firsts.setdefault((e.lane, e.epoch), e.duration)
    return list(firsts.values())


def test_the_ranks_meet_at_the_drivers_rendezvous_and_train_as_through_allgather(sc):
    """Classic sessions: the ranks learn their peers from the driver's rendezvous (the seam's meeting), not
    allGather's one-second poll, so the first total of an epoch does not wait for it; at staleness 0 the
    replicas end bit for bit as with allGather (the tests' hook forces it)."""
    rdd, x, y = _rdd(sc, 200, seed=51)
    fits = {}
    for name, properties in (("rendezvous", {}), ("allGather", {MEETING: ALL_GATHER})):
        trainer = SparkTrainer(sc, small_net(seed=52), GradientSharing(threshold=1e-3, batch_size_per_worker=10,
                                                                      workers=2, topology=Topology.TREE))
        with job_properties(sc, properties):
            trainer.fit(rdd, epochs=2)
        fits[name] = trainer
    met, gathered = fits["rendezvous"], fits["allGather"]
    assert np.array_equal(met.network.state["params"], gathered.network.state["params"])
    assert max(_first_waits(gathered)) > 0.5  # allGather answers on its one-second poll
    assert max(_first_waits(met)) < 0.5, _first_waits(met)


def test_sharing_learns_and_replicas_agree(sc):
    rdd, x, y = _rdd(sc, 400, seed=21)
    net = small_net(seed=22)
    trainer = SparkTrainer(sc, net, GradientSharing(threshold=1e-3, batch_size_per_worker=10, workers=2))
    trainer.fit(rdd, epochs=2)
    h = trainer.history
    assert [e["examples"] for e in h] == [400, 400]
    assert max(e["replica_max_abs_diff"] for e in h) < 1e-5
    assert trainer.evaluate(rdd).accuracy() > 0.9
    c = trainer.stats.counters
    assert c["messages_sent"] > 0 and c["bytes_sent"] > 0
    # On a 154-parameter net datagram headers dominate the wire; the payload still beats dense.
    assert c["dense_bytes_equivalent"] / c["payload_bytes_sent"] > 5
    assert c["datagrams_forged"] == 0
    series = trainer.stats.series_data
    assert "threshold" in series and "sparsity" in series
    # staleness=0 (the default): every iteration publishes one payload (an empty one when nothing
    # crossed τ), so with 2 ranks each iteration of one rank is received once by the other.
    assert c["messages_received"] == c["iterations"] == 80  # 2 epochs x 400 examples / 10
    scale = [d for d in trainer.stats.decisions if d["name"] == "update_scale"]
    # Adam: summed in the first epoch, divided by the workers from the second (issue 22).
    assert [d["value"] for d in scale] == [1.0, 0.5]
    rule = [d for d in trainer.stats.decisions if d["name"] == "threshold"]
    assert [(d["epoch"], d["value"]["type"], d["value"]["threshold"]) for d in rule] == [(0, "FixedThreshold", 1e-3)]
    # Epoch 2 started from the states the ranks kept on their executor: the driver shipped no state.
    kept = [d["value"] for d in trainer.stats.decisions if d["name"] == "sharing_state"]
    assert kept == ["shipped", "executors"], kept
    assert c.get("resident_state_misses", 0) == 0
    # Lost with their executor: the epoch fails at its start, runs again with the driver's whole state.
    import glob
    import os
    import time

    from pyspark import SparkFiles

    from sparkavg.spark.executor.sharing import RESIDENT_DIR, RESIDENT_MAX_AGE

    # This fit's files (other fits of the session keep theirs: named by job id, token and rank).
    job = f"{trainer._runner.job_id & 0xFFFFFFFF:08x}-"
    files = glob.glob(os.path.join(SparkFiles.getRootDirectory(), RESIDENT_DIR, job + "*.npz"))
    assert len(files) == 2, files  # one per rank, the last epoch's only
    for path in files:
        os.remove(path)
    # A finished fit's state, long untouched, goes with the next state kept on the executor; a recent one stays.
    folder = os.path.join(SparkFiles.getRootDirectory(), RESIDENT_DIR)
    old, recent = (os.path.join(folder, f"0000000{i}-{0:016x}-0.npz") for i in (1, 2))
    for path in (old, recent):
        open(path, "wb").close()
    os.utime(old, (time.time() - RESIDENT_MAX_AGE - 60,) * 2)
    trainer.fit(rdd, epochs=3)
    assert not os.path.exists(old) and os.path.exists(recent)
    os.remove(recent)
    assert trainer.stats.counters["resident_state_misses"] == 1
    assert trainer.history[-1]["examples"] == 400 and trainer.history[-1]["replica_max_abs_diff"] < 1e-5
    assert trainer.evaluate(rdd).accuracy() > 0.9


@pytest.mark.parametrize("nesterov, preset, extra", [
    pytest.param(False, "sparkavg", None, id="adam"),
    pytest.param(True, "sparkavg", None, id="nesterov-masked"),
    pytest.param(True, "dl4j", None, id="nesterov-dl4j"),
    pytest.param(False, "sparkavg", "scheduled", id="adam-scheduled-by-epoch", marks=pytest.mark.slow),
    pytest.param(True, "sparkavg", "clipped", id="nesterov-clipped", marks=pytest.mark.slow)])
def test_executor_runs_sharing_step_bit_for_bit(sc, nesterov, preset, extra):
    """Production against the algorithm: a one-worker Spark fit ends with
    exactly the parameters, updater state, residual and τ of a plain loop of
    :func:`local_view` + ``compute_update`` + :func:`sharing_step` (with
    Nesterov, the velocity of the sent entries cleared after each step:
    momentum masking), with DL4J's residual clipping.  Preset ``"dl4j"``:
    the gradient at the shared parameters alone, no masking.  Every
    minibatch is the same block of examples, so neither the epoch's shuffle
    nor the deal can change the order the loop sees.  ``"scheduled"``: a
    learning rate by epoch, which the second epoch (continued from the
    state the rank kept on its executor) takes from the shipped epoch;
    ``"clipped"``: per-layer gradient clipping, before the residual."""
    import numpy as np

    from sparkavg.nn import ClipL2PerLayer, Dense, MapSchedule, Nesterov, Network, Output
    from sparkavg.sharing import SharingState, local_view, sharing_step

    def make(seed):
        if extra == "scheduled":
            net = small_net(seed=seed)
            net.updater = net.updater.with_learning_rate(MapSchedule({0: 0.01, 1: 0.002}, by="epoch"))
            return net
        if not nesterov:
            return small_net(seed=seed)
        return Network((1, 4, 4), [Dense(8, activation="relu"), Output(2)], updater=Nesterov(lr=0.05), seed=seed,
                       gradient_normalization=ClipL2PerLayer(0.05) if extra == "clipped" else None)

    block_x, block_y = blobs(10, seed=41)
    reps, epochs = 6, 2
    rdd = sc.parallelize([(block_x[i], int(block_y[i])) for _ in range(reps) for i in range(10)], 1)
    rule = AdaptiveThreshold(initial=1e-3, max_sparsity=0.05)
    master = GradientSharing(threshold=rule, batch_size_per_worker=10, workers=1, device="cpu", staleness=0,
                             preset=preset)
    trainer = SparkTrainer(sc, make(42), master)
    trainer.fit(rdd, epochs=epochs)
    view, masked = preset == "sparkavg", nesterov and preset == "sparkavg"
    masking = [d["value"] for d in trainer.stats.decisions if d["name"] == "momentum_masking"]
    assert masking == [masked]
    assert [d["value"] for d in trainer.stats.decisions if d["name"] == "local_view"] == [view]

    net = make(42)
    state = SharingState(rule, net.num_params)  # DL4J's residual clipping, always
    update = np.zeros(net.num_params, np.float32)
    sent = []
    shared = net.params.copy() if view else net.params
    for step in range(epochs * reps):
        net.epoch = step // reps
        if view:
            local_view(state, shared, net.params)  # the default preset's local view
        net.compute_update(block_x, block_y, update)  # one worker: the update scale is 1 under either preset
        sharing_step(state, update, shared, sent.append, [], velocity=net.updater_state if masked else None)
    net.params[...] = shared
    assert len(sent) > 0 and trainer.stats.counters["messages_sent"] == len(sent)
    assert not masked or (net.updater_state == 0).any()
    if extra == "scheduled":
        assert [d["value"] for d in trainer.stats.decisions if d["name"] == "sharing_state"] == ["shipped",
                                                                                                 "executors"]
    assert np.array_equal(trainer.network.params.view(np.uint32), net.params.view(np.uint32))
    assert np.array_equal(trainer.network.updater_state.view(np.uint32), net.updater_state.view(np.uint32))
    saved = trainer._runner.rank_states[0]
    assert np.array_equal(np.asarray(saved["residual"]).view(np.uint32), state.residual.view(np.uint32))
    assert saved["tau"] == state.tau


def test_sharing_under_simulated_loss_still_agrees(sc):
    rdd, x, y = _rdd(sc, 200, seed=23)
    net = small_net(seed=24)
    master = GradientSharing(threshold=AdaptiveThreshold(initial=1e-3), batch_size_per_worker=5, workers=2)
    trainer = SparkTrainer(sc, net, master)
    with job_properties(sc, {UDP_LOSS: 0.2, RETRANSMIT_TIMEOUT: 0.05}):  # fault injection: 20% of datagrams lost
        trainer.fit(rdd, epochs=2)
    assert max(h["replica_max_abs_diff"] for h in trainer.history) < 1e-5
    assert trainer.stats.counters["datagrams_retransmitted"] > 0
    assert trainer.evaluate(rdd).accuracy() > 0.8


def test_same_trainer_interface_for_both_masters(sc):
    rdd, x, y = _rdd(sc, 100, seed=25)
    for master in (ParameterAveraging(workers=2, batch_size_per_worker=10),
                   GradientSharing(workers=2, batch_size_per_worker=10)):
        net = small_net(seed=26)
        trainer = SparkTrainer(sc, net, master)
        trainer.fit(rdd)
        ev = trainer.evaluate(rdd)
        assert ev.count == 100
        # distributed evaluation and score are the trained network's own, whichever master trained it
        assert ev.accuracy() == pytest.approx(float(np.mean(np.argmax(net.output(x), axis=1) == y)))
        assert trainer.score(rdd) == pytest.approx(float(net.score(x, y)), rel=1e-5)
        assert trainer.history[0]["examples"] == 100 and net.iteration > 0


@pytest.mark.slow
def test_killed_sharing_worker_restarts_the_barrier_stage(sc, tmp_path):
    rdd, x, y = _rdd(sc, 120, seed=27)
    marker = tmp_path / "kill-me"
    marker.write_text("x")
    with job_properties(sc, {KILL_MARKER: marker, STALL_TIMEOUT: 20.0}):
        trainer = SparkTrainer(sc, small_net(seed=28), GradientSharing(workers=2, batch_size_per_worker=10))
        trainer.fit(rdd, epochs=1)
    assert (tmp_path / "kill-me.claimed").exists()  # a worker really died mid-stage
    assert trainer.stats.counters["stage_restarts"] == 1
    assert trainer.history[0]["examples"] == 120  # the retried stage trained everything once
    assert trainer.history[0]["replica_max_abs_diff"] < 1e-5


@pytest.mark.slow
def test_stuck_worker_ends_the_stage_with_an_error_naming_it(sc):
    import time

    from sparkavg.transport import PeerStalledError

    rdd, x, y = _rdd(sc, 60, seed=29)
    started = time.monotonic()
    with job_properties(sc, {STALL_RANK: 1, STALL_TIMEOUT: 3.0, STAGE_ATTEMPTS: 1}):
        trainer = SparkTrainer(sc, small_net(seed=30), GradientSharing(workers=2, batch_size_per_worker=10))
        with pytest.raises(PeerStalledError) as info:
            trainer.fit(rdd, epochs=1)
    assert time.monotonic() - started < 60  # bounded by the stall timeout, never a hang
    # the surviving rank's finding reaches the driver as it is: the silent rank, and where it ran
    assert info.value.ranks == (1,)
    assert _named_host(info.value, rank=1, executor="driver") in local_ipv4_addresses()


@pytest.mark.slow
def test_a_rank_killed_mid_epoch_fails_the_fit_promptly_naming_it_and_keeps_the_checkpoints(sc, tmp_path):
    """Rank 1's process is killed (SIGKILL) at its third minibatch of every attempt, as a lost host's
    would be: the fit fails within the stall timeout and a margin -- not after Spark's barrier retries --,
    naming the rank and its host; the network and the checkpoints stay as the last epoch left them."""
    import time

    from sparkavg.spark import DataOptions, WorkerCrashed
    from sparkavg.spark.checkpoint import list_checkpoints

    from .data_transforms import LOSE_MARKER

    rdd, x, y = _rdd(sc, 120, seed=33)
    folder = str(tmp_path / "ckpt")
    master = GradientSharing(workers=2, batch_size_per_worker=10,
                             data=DataOptions(transform="tests.data_transforms:lose_rank_one"))
    trainer = SparkTrainer(sc, small_net(seed=34), master, checkpoint_dir=folder)
    trainer.fit(rdd, epochs=1)
    kept = trainer.network.params.copy()
    stall = 5.0
    try:
        with open(LOSE_MARKER, "w") as fh:
            fh.write("SIGKILL")
        started = time.monotonic()
        with job_properties(sc, {STALL_TIMEOUT: stall}), pytest.raises(WorkerCrashed) as info:
            trainer.fit(rdd, epochs=1)  # its second epoch
        elapsed = time.monotonic() - started
    finally:
        os.remove(LOSE_MARKER)
    assert _named_host(info.value, rank=1, executor="driver") in local_ipv4_addresses()
    assert elapsed < stall + 60, elapsed  # Spark saw the crash: each attempt ended at once
    assert trainer.stats.counters["stage_restarts"] == 2  # one host: Spark could run the stage again
    np.testing.assert_array_equal(trainer.network.params, kept)
    assert [c.epochs_done for c in list_checkpoints(folder)] == [1]


@pytest.mark.slow
def test_sharing_resumes_from_the_last_epoch_checkpoint(sc, tmp_path):
    # One worker: a sharing fit is then deterministic, so a resumed fit must end exactly where a
    # straight one does -- parameters, updater state and the residual and threshold it carries.
    rdd, x, y = _rdd(sc, 100, seed=31, parts=1)
    master = GradientSharing(workers=1, batch_size_per_worker=10, device="cpu",
                             threshold=AdaptiveThreshold(initial=1e-3, max_sparsity=0.05))
    straight = SparkTrainer(sc, small_net(seed=32), master)
    straight.fit(rdd, epochs=2)
    ckpt = str(tmp_path / "ckpt")
    SparkTrainer(sc, small_net(seed=32), master, checkpoint_dir=ckpt).fit(rdd, epochs=1)
    resumed = SparkTrainer(sc, small_net(seed=77), master, checkpoint_dir=ckpt)
    resumed.fit(rdd, epochs=2, resume_from=ckpt)
    assert resumed.epochs_done == 2 and [h["epoch"] for h in resumed.history] == [1, 2]
    np.testing.assert_array_equal(resumed.network.params, straight.network.params)
    np.testing.assert_array_equal(resumed.network.updater_state, straight.network.updater_state)
    assert resumed.network.iteration == straight.network.iteration
    saved, want = resumed._runner.rank_states[0], straight._runner.rank_states[0]
    np.testing.assert_array_equal(saved["residual"], want["residual"])
    assert saved["tau"] == want["tau"] and saved["iteration"] == want["iteration"]


def test_tree_topology_trains_and_every_rank_applies_one_sum_per_iteration(sc):
    """Topology.TREE on local[2]: each iteration's two messages are exchanged and summed on both ranks, every
    rank applies that one total, so replicas agree bit for bit; the ranks share τ; lost datagrams change
    nothing but the retransmissions."""
    rdd, x, y = _rdd(sc, 400, seed=41)
    net = small_net(seed=42)
    master = GradientSharing(threshold=AdaptiveThreshold(initial=1e-3), batch_size_per_worker=10, workers=2,
                             topology=Topology.TREE)
    trainer = SparkTrainer(sc, net, master)
    with job_properties(sc, {UDP_LOSS: 0.1, RETRANSMIT_TIMEOUT: 0.05}):
        trainer.fit(rdd, epochs=2)
    assert [e["replica_max_abs_diff"] for e in trainer.history] == [0.0, 0.0]
    assert trainer.evaluate(rdd).accuracy() > 0.9
    c = trainer.stats.counters
    assert c["messages_received"] == c["iterations"] == 80  # one total per rank and iteration
    assert c["messages_applied"] == c["iterations"]  # the rank's own message is inside the total
    assert c["merge_seconds"] > 0 and c["datagrams_retransmitted"] > 0
    assert len({state["tau"] for state in trainer._runner.rank_states}) == 1  # one τ for the group
    chosen = [d for d in trainer.stats.decisions if d["name"] == "topology"]
    assert [(d["value"], d["reason"]) for d in chosen] == [("tree", "set by user")]


def test_topology_is_decided_by_the_worker_count(sc):
    rdd, x, y = _rdd(sc, 40, seed=43)
    trainer = SparkTrainer(sc, small_net(seed=44), GradientSharing(batch_size_per_worker=10, workers=2))
    trainer.fit(rdd, epochs=1)
    assert [d["value"] for d in trainer.stats.decisions if d["name"] == "topology"] == ["plain"]
    from sparkavg.spark.policies.topology import TREE_ABOVE, TopologyChoice
    assert TopologyChoice().decide(None, TREE_ABOVE + 1, 0)[0] is Topology.TREE
    assert TopologyChoice().decide(None, TREE_ABOVE + 1, None)[0] is Topology.PLAIN
    with pytest.raises(ValueError, match="staleness"):
        GradientSharing(topology=Topology.TREE, staleness=None)
