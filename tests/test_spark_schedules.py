"""Learning-rate schedules on a real local[2] Spark: averaging workers step
at the round's shipped iteration and epoch, a resumed fit continues the
schedule exactly, a schedule that reaches 0 stops the fit naming it, and a
divergence recovery scales the schedule."""
import numpy as np
import pytest

from sparkavg.nn import Adam
from sparkavg.nn.schedules import CosineSchedule, ExponentialSchedule, MapSchedule, PolySchedule, ScheduleError, \
    StepSchedule
from sparkavg.spark import DataOptions, GradientSharing, ParameterAveraging, SparkTrainer
from sparkavg.spark import Recover

from .nets import blobs, fit_replicas, small_net, straight_and_resumed

pytestmark = pytest.mark.spark


def _scheduled(schedule, seed):
    net = small_net(seed=seed)
    net.updater = Adam(lr=schedule)
    return net


def _rdd(sc, n, seed):
    x, y = blobs(n, seed=seed)
    return sc.parallelize(list(zip(x, y.tolist())), 2), x, y


@pytest.mark.parametrize("schedule", [StepSchedule(0.05, 0.5, 1), MapSchedule({0: 1e-4, 2: 0.05}, by="epoch")],
                         ids=["by-iteration", "by-epoch"])
def test_averaging_workers_step_at_the_rounds_iteration_and_epoch(sc, schedule):
    """One round of two workers against a numpy oracle: each replica, a
    clone of the model at iteration 5 of epoch 2, fits its shard at the
    schedule's rates from there; the round's result is their mean."""
    rdd, x, y = _rdd(sc, 16, seed=1)  # partition 0: examples 0-7, partition 1: 8-15
    net = _scheduled(schedule, seed=3)
    net.iteration, net.epoch = 5, 2
    start = net.clone()
    master = ParameterAveraging(batch_size_per_worker=4, averaging_frequency=2, workers=2,
                                data=DataOptions(repartition="never"))
    SparkTrainer(sc, net, master).fit(rdd, epochs=1)
    # Minibatches 0..3 = examples [0:4], [4:8], [8:12], [12:16]; dealt [[0, 2], [1, 3]].
    replicas = fit_replicas(start, x, y, ([0, 2], [1, 3]))
    expected = (replicas[0].params + replicas[1].params) / 2
    np.testing.assert_allclose(net.params, expected, rtol=1e-5, atol=1e-6)
    assert net.iteration == 7 and net.epoch == 3
    fresh = start.clone()  # workers that started the schedule from 0 would land elsewhere
    fresh.iteration = fresh.epoch = 0
    wrong = fit_replicas(fresh, x, y, ([0, 2], [1, 3]))
    assert np.abs((wrong[0].params + wrong[1].params) / 2 - expected).max() > 1e-3


@pytest.mark.parametrize("master, schedule", [
    pytest.param(ParameterAveraging(batch_size_per_worker=6, averaging_frequency=2, workers=2),
                 CosineSchedule(0.02, 16, warmup=4, floor=1e-3), id="averaging"),
    pytest.param(GradientSharing(threshold=1e-3, batch_size_per_worker=6, workers=2, staleness=0),
                 CosineSchedule(0.02, 16, warmup=4, floor=1e-3), id="sharing", marks=pytest.mark.slow),
    pytest.param(GradientSharing(threshold=1e-3, batch_size_per_worker=6, workers=2, staleness=0),
                 StepSchedule(0.02, 0.3, 1, by="epoch"), id="sharing-by-epoch", marks=pytest.mark.slow),
])
def test_a_fit_resumed_mid_schedule_equals_a_straight_one(sc, tmp_path, master, schedule):
    rdd, _, _ = _rdd(sc, 60, seed=13)
    straight, resumed, trainer = straight_and_resumed(sc, lambda seed: _scheduled(schedule, seed), master, rdd,
                                                      str(tmp_path / "ckpt"), stop_after=1, epochs=3)
    trainer.close()
    assert resumed.updater == straight.updater and resumed.iteration == straight.iteration == 15
    assert resumed.updater.rate(resumed.iteration - 1, 2) < 0.5 * schedule.base_rate  # well into the schedule
    np.testing.assert_array_equal(resumed.params, straight.params)
    np.testing.assert_array_equal(resumed.updater_state, straight.updater_state)


@pytest.mark.parametrize("master", [ParameterAveraging(batch_size_per_worker=10, workers=2),
                                    GradientSharing(threshold=1e-3, batch_size_per_worker=10, workers=2)],
                         ids=["averaging", "sharing"])
def test_a_schedule_that_reaches_zero_stops_the_fit_naming_it(sc, master):
    rdd, _, _ = _rdd(sc, 40, seed=5)
    net = _scheduled(PolySchedule(0.01, 1.0, 1, by="epoch"), seed=5)  # 0 from epoch 1 on
    with SparkTrainer(sc, net, master) as trainer:
        trainer.fit(rdd, epochs=1)
        after_first = net.params.copy()
        with pytest.raises(ScheduleError, match=r"Expect a finite learning rate > 0 from PolySchedule\(initial=0.01, "
                                                r"power=1.0, max_iter=1, by='epoch', scale=1.0\) at iteration \d+, "
                                                r"epoch 1 \(epoch 1\), got 0.0"):
            trainer.fit(rdd, epochs=1)
        assert trainer.epochs_done == 1
    np.testing.assert_array_equal(net.params, after_first)


def test_a_divergence_recovery_scales_the_schedule_and_keeps_its_shape(sc):
    rdd, _, _ = _rdd(sc, 80, seed=8)
    net = _scheduled(ExponentialSchedule(1e20, 0.9), seed=8)  # NaN within two steps
    trainer = SparkTrainer(sc, net, ParameterAveraging(workers=2, batch_size_per_worker=10),
                           on_divergence=Recover(max_recoveries=5, lr_factor=0.01))
    trainer.fit(rdd, epochs=1)
    assert np.all(np.isfinite(net.params)) and trainer.history[0]["examples"] == 80
    schedule = net.updater.schedule
    assert isinstance(schedule, ExponentialSchedule) and (schedule.initial, schedule.gamma) == (1e20, 0.9)
    assert schedule.scale <= 1e-2 and net.updater.learning_rate == pytest.approx(1e20 * schedule.scale)
    decided = [d for d in trainer.stats.decisions if d["name"] == "learning_rate"]
    assert decided and "base learning rate of the schedule" in decided[0]["reason"]
