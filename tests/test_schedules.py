"""Learning-rate schedules (sparkavg.nn.schedules) without Spark: each one
against its formula (DL4J's definitions; PyTorch's schedulers where they
match), configurations, bad parameters and rates, and every model's step
following the schedule at its iteration and epoch."""
import math
import warnings

import numpy as np
import pytest
import torch

from sparkavg.configurable import ConfigError, from_config
from sparkavg.nn import SGD, Adagrad, Adam, Nadam, Nesterov, RMSProp, Network, model_from_json
from sparkavg.nn.schedules import (CosineSchedule, ExponentialSchedule, InverseSchedule, MapSchedule,
                                   OneCycleSchedule, PolySchedule, ScheduleError, SigmoidSchedule, StepSchedule)
from sparkavg.torch import TorchModel

from . import torch_models
from .nets import blobs, small_graph, small_net

STEPS = range(0, 40)

#: (schedule, its formula at i) with DL4J's definitions (org.nd4j.linalg.schedule), written out again here.
FORMULAS = [
    (StepSchedule(0.1, 0.5, 7), lambda i: 0.1 * 0.5 ** math.floor(i / 7)),
    (StepSchedule(0.2, 0.9, 2.5, by="epoch"), lambda i: 0.2 * 0.9 ** math.floor(i / 2.5)),
    (ExponentialSchedule(0.1, 0.97), lambda i: 0.1 * 0.97 ** i),
    (InverseSchedule(0.1, 0.05, 0.75), lambda i: 0.1 / (1 + 0.05 * i) ** 0.75),
    (PolySchedule(0.1, 2.0, 50), lambda i: 0.1 * (1 - i / 50) ** 2),
    (SigmoidSchedule(0.1, 0.3, 20), lambda i: 0.1 / (1 + math.exp(-0.3 * (i - 20)))),
    (SigmoidSchedule(0.1, -0.3, 20), lambda i: 0.1 / (1 + math.exp(0.3 * (i - 20)))),
    (MapSchedule({0: 0.1, 10: 0.05, 25: 0.01}), lambda i: 0.1 if i < 10 else 0.05 if i < 25 else 0.01),
    (CosineSchedule(0.1, 40, warmup=5, floor=1e-3),
     lambda i: 0.1 * (i + 1) / 6 if i < 5 else 1e-3 + (0.1 - 1e-3) * (1 + math.cos(math.pi * (i - 5) / 35)) / 2),
]


@pytest.mark.parametrize("schedule, formula", FORMULAS, ids=lambda v: type(v).__name__ if not callable(v) else "")
def test_each_schedule_follows_its_formula_by_iteration_or_epoch(schedule, formula):
    for i in STEPS:
        expected = formula(i)
        if schedule.by == "iteration":
            assert schedule.value(i, 3) == pytest.approx(expected, rel=1e-12)
        else:
            assert schedule.value(1000 + i, i) == pytest.approx(expected, rel=1e-12)
    scaled = schedule.with_base_rate(schedule.base_rate * 0.25)
    assert scaled.scale == pytest.approx(0.25) and scaled.base_rate == pytest.approx(0.25 * schedule.base_rate)
    assert scaled.rates(len(STEPS)) == pytest.approx([0.25 * r for r in schedule.rates(len(STEPS))], rel=1e-12)


def _torch_rates(make, steps: int, lr: float) -> list:
    """The learning rate of each of ``steps`` optimizer steps under a torch scheduler."""
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([param], lr=lr, momentum=0.9)
    scheduler = make(opt)
    rates = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # SequentialLR's deprecation notes
        for _ in range(steps):
            rates.append(opt.param_groups[0]["lr"])
            opt.step()
            scheduler.step()
    return rates


def test_cosine_equals_pytorch_cosine_annealing_with_and_without_a_linear_warmup():
    lr = torch.optim.lr_scheduler
    plain = _torch_rates(lambda o: lr.CosineAnnealingLR(o, T_max=30, eta_min=0.002), 31, 0.1)
    assert CosineSchedule(0.1, 30, floor=0.002).rates(31) == pytest.approx(plain, rel=1e-9)
    warm = _torch_rates(lambda o: lr.SequentialLR(o, [lr.LinearLR(o, start_factor=1 / 5, total_iters=4),
                                                      lr.CosineAnnealingLR(o, T_max=26, eta_min=0.002)],
                                                  milestones=[4]), 31, 0.1)
    assert CosineSchedule(0.1, 30, warmup=4, floor=0.002).rates(31) == pytest.approx(warm, rel=1e-9)
    assert CosineSchedule(0.1, 30, floor=0.002).value(99, 0) == 0.002  # after its steps: the floor


@pytest.mark.parametrize("anneal", ["cos", "linear"])
@pytest.mark.parametrize("three_phase", [False, True])
def test_one_cycle_equals_pytorch_one_cycle(anneal, three_phase):
    ours = OneCycleSchedule(0.4, 60, pct_start=0.25, anneal=anneal, div_factor=10, final_div_factor=100,
                            three_phase=three_phase)
    theirs = _torch_rates(lambda o: torch.optim.lr_scheduler.OneCycleLR(
        o, max_lr=0.4, total_steps=60, pct_start=0.25, anneal_strategy=anneal, div_factor=10,
        final_div_factor=100, three_phase=three_phase), 60, 0.4)
    assert ours.rates(60) == pytest.approx(theirs, rel=1e-12)
    assert ours.value(500, 0) == pytest.approx(theirs[-1])  # after the cycle: its last rate
    assert ours.base_rate == 0.4


ALL = [s for s, _ in FORMULAS] + [OneCycleSchedule(0.1, 100, three_phase=True, anneal="linear", by="epoch",
                                                   scale=0.5)]


@pytest.mark.parametrize("schedule", ALL, ids=lambda s: type(s).__name__)
def test_configs_round_trip_nested_in_every_updater(schedule):
    config = schedule.to_config()
    assert config["type"] == type(schedule).__name__ and {"by", "scale"} <= set(config)
    assert from_config(config, kind="schedule") == schedule
    for cls in (SGD, Nesterov, Adagrad, RMSProp, Adam, Nadam):
        updater = cls(lr=schedule)
        saved = updater.to_config()
        assert saved["lr"] == config
        rebuilt = from_config(saved, kind="updater")
        assert rebuilt == updater and rebuilt.schedule == schedule
        assert rebuilt.learning_rate == schedule.base_rate


def test_float_rate_configs_are_unchanged_and_map_keys_may_come_from_json_objects():
    assert Adam(lr=0.01).to_config() == {"type": "Adam", "lr": 0.01, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8}
    assert from_config({"type": "SGD", "lr": 0.5}, kind="updater") == SGD(lr=0.5)
    assert SGD(lr=0.5).schedule is None and SGD(lr=0.5).learning_rate == 0.5
    from_json = from_config({"type": "MapSchedule", "values": {"0": 0.1, "5": 0.02}, "by": "epoch"},
                            kind="schedule")
    assert from_json == MapSchedule({5: 0.02, 0: 0.1}, by="epoch") == MapSchedule([[0, 0.1], [5, 0.02]], by="epoch")
    assert from_json.values == ((0, 0.1), (5, 0.02))


def test_a_model_config_and_file_keep_the_schedule(tmp_path):
    net = small_net(seed=1)
    net.updater = Adam(lr=CosineSchedule(0.01, 100, warmup=10))
    x, y = blobs(8, seed=1)
    net.fit_batch(x, y)
    again = model_from_json(net.to_json())
    assert again.updater == net.updater and again.to_config() == net.to_config()
    net.save(tmp_path / "net.npz")
    loaded = Network.load(tmp_path / "net.npz")
    assert loaded.updater == net.updater and loaded.iteration == 1
    np.testing.assert_array_equal(loaded.params, net.params)


@pytest.mark.parametrize("make, message", [
    (lambda: StepSchedule(0.0, 0.5, 3), r"Expect initial > 0 and finite, got 0.0"),
    (lambda: StepSchedule(0.1, 0.5, 0), r"Expect step > 0 and finite, got 0"),
    (lambda: ExponentialSchedule(0.1, -0.5), r"Expect gamma > 0 and finite, got -0.5"),
    (lambda: ExponentialSchedule(float("nan"), 0.5), r"Expect initial > 0 and finite, got nan"),
    (lambda: InverseSchedule(0.1, -1.0, 1.0), r"Expect gamma >= 0 and finite, got -1.0"),
    (lambda: PolySchedule(0.1, 1.0, 0), r"Expect max_iter as an int >= 1, got 0"),
    (lambda: PolySchedule(0.1, -1.0, 10), r"Expect power >= 0 and finite, got -1.0"),
    (lambda: SigmoidSchedule(0.1, float("inf"), 3), r"Expect gamma finite, got inf"),
    (lambda: MapSchedule({1: 0.1}), r"Expect values with the key 0 \(the initial rate\), got keys \[1\]"),
    (lambda: MapSchedule({0: 0.1, 3: -1.0}), r"Expect values\[3\] > 0 and finite, got -1.0"),
    (lambda: MapSchedule({0: 0.1, -2: 0.1}), r"Expect every values key as an int >= 0, got -2"),
    (lambda: MapSchedule([[0, 0.1], [0, 0.2]]), r"Expect each values key once, got 0 twice"),
    (lambda: MapSchedule(0.1), r"Expect values as a dict of iteration or epoch -> rate"),
    (lambda: CosineSchedule(0.1, 10, warmup=10), r"Expect warmup < steps .* got warmup=10, steps=10"),
    (lambda: CosineSchedule(0.1, 10, floor=0.1), r"Expect floor < peak, got floor=0.1, peak=0.1"),
    (lambda: CosineSchedule(0.1, 2.5), r"Expect steps as an int >= 1, got 2.5"),
    (lambda: OneCycleSchedule(0.1, 100, pct_start=1.0), r"Expect pct_start in \(0, 1\), got 1.0"),
    (lambda: OneCycleSchedule(0.1, 4, pct_start=0.2), r"Expect every phase of OneCycleSchedule to last at least "
                                                       r"one step, got phases ending at steps \[-0.2, 3\]"),
    (lambda: OneCycleSchedule(0.1, 100, anneal="exp"), r"Expect anneal in \['cos', 'linear'\], got 'exp'"),
    (lambda: StepSchedule(0.1, 0.5, 3, by="batch"), r"Expect by in \['iteration', 'epoch'\], got 'batch'"),
    (lambda: StepSchedule(0.1, 0.5, 3, scale=0), r"Expect scale > 0 and finite, got 0"),
    (lambda: Adam(lr="0.1"), r"Expect lr as a float > 0 or a Schedule \(sparkavg.nn.schedules\), got '0.1'"),
    (lambda: CosineSchedule(0.1, 10).with_base_rate(-1), r"Expect the base rate > 0 and finite, got -1"),
])
def test_bad_parameters_are_refused_when_built(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_bad_configs_name_the_field():
    with pytest.raises(ConfigError, match=r"Adam.lr: Expect CosineSchedule config with \['steps'\]"):
        from_config({"type": "Adam", "lr": {"type": "CosineSchedule", "peak": 0.1}}, kind="updater")
    with pytest.raises(ConfigError, match=r"Expect Adam.lr to be float or a Schedule config, got str"):
        from_config({"type": "Adam", "lr": "fast"}, kind="updater")
    with pytest.raises(ConfigError, match=r"Bad StepSchedule config: Expect decay_rate > 0 and finite, got -2"):
        from_config({"type": "StepSchedule", "initial": 0.1, "decay_rate": -2, "step": 3}, kind="schedule")


@pytest.mark.parametrize("schedule, iteration, epoch, value", [
    (PolySchedule(0.1, 1.0, 20), 20, 1, "0.0"),
    (CosineSchedule(0.1, 10, by="epoch"), 55, 10, "0.0"),
    (ExponentialSchedule(0.1, 1e10), 400, 0, "inf"),
    (InverseSchedule(0.1, 1.0, 1e6), 10 ** 6, 0, "0.0"),
])
def test_a_rate_that_is_not_finite_and_positive_names_the_schedule_the_step_and_the_value(schedule, iteration, epoch,
                                                                                           value):
    with pytest.raises(ScheduleError, match=rf"from {type(schedule).__name__}\(.*\) at iteration {iteration}, epoch "
                                            rf"{epoch} \({schedule.by} \d+\), got {value}"):
        schedule.value(iteration, epoch)


def test_a_model_step_refuses_a_bad_rate_before_changing_anything():
    net = small_net(seed=2)
    net.updater = SGD(lr=PolySchedule(0.1, 1.0, 2))
    x, y = blobs(8, seed=2)
    net.fit_batch(x, y)
    net.fit_batch(x, y)
    before = net.params.copy()
    with pytest.raises(ScheduleError, match=r"at iteration 2, epoch 0 \(iteration 2\), got 0.0"):
        net.fit_batch(x, y)
    with pytest.raises(ScheduleError, match="at iteration 2"):
        net.compute_update(x, y, np.zeros(net.num_params, np.float32))
    np.testing.assert_array_equal(net.params, before)
    assert net.iteration == 2
    with pytest.raises(TypeError, match=r"Expect an updater at a constant rate in apply\(\), got the schedule "
                                        r"PolySchedule"):
        net.updater.apply(np.zeros(3, np.float32), np.ones(3, np.float32), np.zeros(0, np.float32), 0)


def _torch_mlp(updater, weight_decay=0.0):
    return TorchModel("tests.torch_models:mlp", updater=updater, input_shape=(1, 4, 4), seed=3,
                      weight_decay=weight_decay)


def _network(updater, weight_decay=0.0):
    net = small_net(seed=3)
    return Network(net.input_shape, net.layers, updater=updater, weight_decay=weight_decay, seed=3)


def _graph(updater, weight_decay=0.0):
    g = small_graph(seed=3)
    args = g.config_arguments()
    args.update(updater=updater, weight_decay=weight_decay)
    return type(g)(**args)


@pytest.mark.parametrize("make", [_network, _graph, _torch_mlp], ids=["Network", "Graph", "TorchModel"])
@pytest.mark.parametrize("by", ["iteration", "epoch"])
def test_every_model_steps_at_the_schedules_rate_weight_decay_included(make, by):
    """A scheduled model equals a twin whose constant rate is set to the
    schedule's before each step, bit for bit, through fit_batch and
    compute_update, iterations and epochs alike."""
    schedule = StepSchedule(0.05, 0.5, 2, by=by)
    scheduled, twin = make(Adam(lr=schedule), 1e-2), make(Adam(lr=1.0), 1e-2)
    x, y = blobs(24, seed=4)
    out = np.zeros(scheduled.num_params, np.float32)
    rates = []
    for step in range(6):
        xb, yb = x[4 * step:4 * step + 4], y[4 * step:4 * step + 4]
        for model in (scheduled, twin):
            model.epoch = step // 2
        rate = schedule.value(scheduled.iteration, scheduled.epoch)
        rates.append(rate)
        twin.updater = Adam(lr=rate)
        if step % 2:
            assert scheduled.fit_batch(xb, yb) == twin.fit_batch(xb, yb)
        else:
            twin_out = np.zeros_like(out)
            assert scheduled.compute_update(xb, yb, out) == twin.compute_update(xb, yb, twin_out)
            np.testing.assert_array_equal(out, twin_out)
            scheduled.apply_update(out)
            twin.apply_update(twin_out)
        np.testing.assert_array_equal(scheduled.params, twin.params)
        np.testing.assert_array_equal(scheduled.updater_state, twin.updater_state)
    expected = [0.05, 0.05, 0.025, 0.025, 0.0125, 0.0125] if by == "iteration" else [0.05, 0.05, 0.05, 0.05, 0.025,
                                                                                     0.025]
    assert rates == pytest.approx(expected)
    assert scheduled.updater.learning_rate == 0.05  # the base rate, whatever the step


def test_a_torch_model_follows_cosine_annealing_as_torch_itself_does():
    x, y = blobs(64, seed=5)
    net = TorchModel("tests.torch_models:mlp", updater=SGD(lr=CosineSchedule(0.2, 8, floor=0.01)),
                     input_shape=(1, 4, 4), seed=6)
    torch.manual_seed(6)
    bare = torch_models.mlp()
    opt = torch.optim.SGD(bare.parameters(), lr=0.2)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=8, eta_min=0.01)
    for start in range(0, 64, 8):
        net.fit_batch(x[start:start + 8], y[start:start + 8])
        opt.zero_grad()
        torch.nn.functional.cross_entropy(bare(torch.from_numpy(x[start:start + 8])),
                                          torch.from_numpy(y[start:start + 8])).backward()
        opt.step()
        scheduler.step()
    np.testing.assert_allclose(net.params, torch.cat([p.detach().reshape(-1) for p in bare.parameters()]),
                               rtol=1e-5, atol=1e-6)


def test_a_constant_rate_pays_nothing_and_an_epoch_schedule_resolves_once_per_epoch():
    net = small_net(seed=7)
    assert net.flat.step_updater() is net.updater  # a constant rate: the updater itself
    net.updater = Adam(lr=ExponentialSchedule(0.01, 0.5, by="epoch"))
    x, y = blobs(8, seed=7)
    first = net.flat.step_updater()
    net.fit_batch(x, y)
    assert net.flat.step_updater() is first and first.lr == 0.01  # same epoch, same rate: the same updater
    net.epoch = 1
    assert net.flat.step_updater().lr == 0.005
    net.updater = net.updater.with_learning_rate(0.001)  # what a divergence recovery does: the shape is kept
    assert net.updater.schedule.scale == pytest.approx(0.1) and net.flat.step_updater().lr == pytest.approx(0.0005)
    assert net.updater.learning_rate == pytest.approx(0.001)
    assert net.updater.with_learning_rate(StepSchedule(0.1, 0.5, 1)).schedule == StepSchedule(0.1, 0.5, 1)
    assert net.clone().updater == net.updater
