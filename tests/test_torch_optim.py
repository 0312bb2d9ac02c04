"""torch.optim optimizers and lr_scheduler schedulers behind a TorchModel
(sparkavg.torch.optim): every step is torch's own, bit for bit, with the
state as views of the flat updater vector; groups, schedulers and
sparkavg's schedules; compute_update; resumes; the roles strategies read;
and errors that name the optimizer and what it keeps."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from sparkavg.configurable import ConfigError, from_config  # noqa: E402
from sparkavg.nn import Adam, StepSchedule, load_model  # noqa: E402
from sparkavg.nn.serialization import ModelFileError  # noqa: E402
from sparkavg.spark.policies.moments import MomentCorrection  # noqa: E402
from sparkavg.spark.policies.sharing import MomentumMasking, UpdateScale  # noqa: E402
from sparkavg.torch import TorchModel, TorchOptimizer  # noqa: E402

from . import torch_models  # noqa: E402

BATCH = 8


def _data(n=48, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 16)).astype(np.float32)
    y = (x[:, :4].sum(axis=1) > 0).astype(np.int64)
    return x, y


def _model(optimizer="torch.optim:Adam", dtype="float32", seed=3, **kwargs):
    return TorchModel("tests.torch_models:mlp", input_shape=(16,), dtype=dtype, seed=seed, optimizer=optimizer,
                      **kwargs)


def _reference(seed=3, dtype=torch.float32):
    """The factory's module as TorchModel builds it, for a bare torch loop."""
    torch.manual_seed(seed)
    return torch_models.mlp().to(dtype)


def _torch_loop(module, optimizer, x, y, steps, scheduler=None, per_epoch=None):
    for i in range(steps):
        xb, yb = torch.from_numpy(x[i * BATCH:(i + 1) * BATCH]), torch.from_numpy(y[i * BATCH:(i + 1) * BATCH])
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(module(xb), yb).backward()
        optimizer.step()
        if scheduler is not None and (per_epoch is None or (i + 1) % per_epoch == 0):
            scheduler.step()


def _flat(module):
    return np.concatenate([p.detach().numpy().ravel() for p in module.parameters()])


def _state_of(model, optimizer, module):
    """``(flat slot values, torch's own)`` for every slot of the model's updater."""
    n, params = model.num_params, list(module.parameters())
    for k, slot in enumerate(model.updater.slot_names):
        if slot in model.updater.layout.scalars:
            ours = np.array([model.updater_state[k * n + seg.start] for seg in model.param_segments])
            theirs = np.array([float(optimizer.state[p][slot]) for p in params], dtype=ours.dtype)
        else:
            ours = model.updater_state[k * n:(k + 1) * n]
            theirs = np.concatenate([optimizer.state[p][slot].numpy().ravel() for p in params])
        yield slot, ours, theirs


OPTIMIZERS = [
    ("SGD", {"lr": 0.1, "momentum": 0.9, "dampening": 0.1}),
    ("SGD", {"lr": 0.1, "momentum": 0.9, "nesterov": True, "weight_decay": 1e-2}),
    ("Adam", {"lr": 1e-2}),
    ("Adam", {"lr": 1e-2, "amsgrad": True}),
    ("AdamW", {"lr": 1e-2, "weight_decay": 0.1}),
    ("Adadelta", {"lr": 1.0}),
    ("Adagrad", {"lr": 0.1, "initial_accumulator_value": 0.1, "lr_decay": 0.01}),
    ("RMSprop", {"lr": 1e-2, "momentum": 0.5, "centered": True}),
    ("NAdam", {"lr": 1e-2}),
    ("RAdam", {"lr": 1e-2}),
    ("Adamax", {"lr": 1e-2}),
]


@pytest.mark.parametrize("name,kwargs", OPTIMIZERS, ids=[f"{n}-{i}" for i, (n, _) in enumerate(OPTIMIZERS)])
def test_each_optimizer_steps_as_torch_itself_with_its_state_in_the_flat_vector(name, kwargs):
    x, y = _data()
    model = _model(f"torch.optim:{name}", optimizer_kwargs=kwargs)
    module = _reference()
    optimizer = getattr(torch.optim, name)(module.parameters(), **kwargs)
    for i in range(5):
        model.fit_batch(x[i * BATCH:(i + 1) * BATCH], y[i * BATCH:(i + 1) * BATCH])
    _torch_loop(module, optimizer, x, y, 5)
    np.testing.assert_array_equal(model.params, _flat(module))
    assert model.updater_state.size == len(model.updater.slot_names) * model.num_params
    for slot, ours, theirs in _state_of(model, optimizer, module):
        np.testing.assert_array_equal(ours, theirs, err_msg=slot)
    assert model.iteration == 5


@pytest.mark.parametrize("name", ["Adam", "SGD"])
def test_compute_update_is_exactly_what_fit_batch_adds(name):
    x, y = _data()
    kwargs = {"lr": 0.05, "momentum": 0.9} if name == "SGD" else {"lr": 1e-2}
    fitted, computed = (_model(f"torch.optim:{name}", optimizer_kwargs=kwargs) for _ in range(2))
    out = np.zeros(computed.num_params, np.float32)
    for i in range(4):
        xb, yb = x[i * BATCH:(i + 1) * BATCH], y[i * BATCH:(i + 1) * BATCH]
        before = computed.params.copy()
        fitted.fit_batch(xb, yb)
        computed.compute_update(xb, yb, out)
        np.testing.assert_array_equal(computed.params, before)  # nothing applied yet
        computed.apply_update(out)
    # p + (p_new - p) may round off p_new by an ulp: the same steps, not the same bits
    np.testing.assert_allclose(computed.params, fitted.params, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(computed.updater_state, fitted.updater_state, rtol=1e-5, atol=1e-9)


GROUPS = [{"params": "bias", "weight_decay": 0.0}, {"params": r"^1\.", "lr": 1e-3}]


def _torch_groups(module):
    named = list(module.named_parameters())
    return [{"params": [p for n, p in named if "bias" not in n and not n.startswith("1.")]},
            {"params": [p for n, p in named if "bias" in n], "weight_decay": 0.0},
            {"params": [p for n, p in named if n.startswith("1.") and "bias" not in n], "lr": 1e-3}]


@pytest.mark.parametrize("interval", ["iteration", "epoch"])
def test_groups_and_a_scheduler_step_as_torch_does(interval):
    """Per-epoch: torch's scheduler.step() after each epoch (2 epochs of 3 minibatches)."""
    x, y = _data()
    sched = {"step_size": 2, "gamma": 0.5}
    model = _model("torch.optim:AdamW", optimizer_kwargs={"lr": 1e-2, "weight_decay": 0.1}, param_groups=GROUPS,
                   scheduler="torch.optim.lr_scheduler:StepLR", scheduler_kwargs=sched,
                   scheduler_interval=interval)
    module = _reference()
    optimizer = torch.optim.AdamW(_torch_groups(module), lr=1e-2, weight_decay=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, **sched)
    if interval == "iteration":
        for i in range(6):
            model.fit_batch(x[i * BATCH:(i + 1) * BATCH], y[i * BATCH:(i + 1) * BATCH])
        _torch_loop(module, optimizer, x, y, 6, scheduler)
    else:
        model.fit(x[:3 * BATCH], y[:3 * BATCH], batch_size=BATCH, epochs=3, shuffle=False)
        for _ in range(3):
            _torch_loop(module, optimizer, x, y, 3, scheduler, per_epoch=3)
    np.testing.assert_array_equal(model.params, _flat(module))
    count = model.iteration if interval == "iteration" else model.epoch
    assert model.updater.rate(model.iteration, model.epoch) == pytest.approx(1e-2 * 0.5 ** (count // 2))
    assert model.updater.rate(model.iteration, model.epoch) == pytest.approx(optimizer.param_groups[0]["lr"])


def test_a_resumed_model_continues_exactly_at_its_step_and_scheduled_rate(tmp_path):
    x, y = _data()

    def make(seed=3):
        return _model("torch.optim:NAdam", seed=seed, optimizer_kwargs={"lr": 1e-2}, param_groups=GROUPS,
                      scheduler="torch.optim.lr_scheduler:ExponentialLR", scheduler_kwargs={"gamma": 0.9},
                      scheduler_interval="iteration")

    straight, first = make(), make()
    for i in range(6):
        straight.fit_batch(x[i * BATCH:(i + 1) * BATCH], y[i * BATCH:(i + 1) * BATCH])
    for i in range(3):
        first.fit_batch(x[i * BATCH:(i + 1) * BATCH], y[i * BATCH:(i + 1) * BATCH])
    first.save(tmp_path / "m.npz")
    resumed = load_model(tmp_path / "m.npz")  # torch.optim's own classes load without any trust
    assert isinstance(resumed.updater, TorchOptimizer) and resumed.updater == straight.updater
    for i in range(3, 6):
        resumed.fit_batch(x[i * BATCH:(i + 1) * BATCH], y[i * BATCH:(i + 1) * BATCH])
    np.testing.assert_array_equal(resumed.params, straight.params)
    np.testing.assert_array_equal(resumed.updater_state, straight.updater_state)
    other = make(seed=9)  # another model's state loaded into a fresh binding: the same again
    other.load_state(first.state)
    other.iteration = 3
    for i in range(3, 6):
        other.fit_batch(x[i * BATCH:(i + 1) * BATCH], y[i * BATCH:(i + 1) * BATCH])
    np.testing.assert_array_equal(other.params, straight.params)


def test_a_sparkavg_schedule_and_a_recovery_scale_every_group():
    x, y = _data()
    schedule = StepSchedule(0.1, decay_rate=0.5, step=2)
    model = _model("torch.optim:SGD", optimizer_kwargs={"lr": schedule, "momentum": 0.9},
                   param_groups=[{"params": "bias", "lr": 0.01}])
    rates = []
    for i in range(5):
        model.fit_batch(x[i * BATCH:(i + 1) * BATCH], y[i * BATCH:(i + 1) * BATCH])
        rates.append([g["lr"] for g in model.flat._bound.optimizer.param_groups])
    expected = [[0.1 * 0.5 ** (i // 2), 0.01 * 0.5 ** (i // 2)] for i in range(5)]
    np.testing.assert_allclose(rates, expected, rtol=1e-12)
    halved = model.updater.with_learning_rate(0.05)  # what Recover(lr_factor=0.5) does
    assert halved.learning_rate == pytest.approx(0.05) and halved.param_groups[0]["lr"] == pytest.approx(0.005)
    plain = TorchOptimizer(optimizer="torch.optim:Adam", lr=1e-3, param_groups=[{"params": "bias", "lr": 1e-4}])
    assert plain.with_learning_rate(5e-4).param_groups[0]["lr"] == pytest.approx(5e-5)
    scheduled = _model("torch.optim:SGD", optimizer_kwargs={"lr": 0.1}, param_groups=[{"params": "bias", "lr": 0.01}],
                       scheduler="torch.optim.lr_scheduler:StepLR", scheduler_kwargs={"step_size": 1, "gamma": 0.5},
                       scheduler_interval="iteration")
    for i in range(2):
        scheduled.fit_batch(x[i * BATCH:(i + 1) * BATCH], y[i * BATCH:(i + 1) * BATCH])
    scheduled.updater = scheduled.updater.with_learning_rate(0.05)  # the schedule, halved from here on
    scheduled.fit_batch(x[:BATCH], y[:BATCH])
    got = [g["lr"] for g in scheduled.flat._bound.optimizer.param_groups]
    np.testing.assert_allclose(got, [0.05 * 0.5 ** 2, 0.005 * 0.5 ** 2], rtol=1e-12)


def test_the_roles_strategies_read():
    adam = TorchOptimizer(optimizer="torch.optim:AdamW", kwargs={"betas": [0.8, 0.99]})
    assert adam.slot_names == ("exp_avg", "exp_avg_sq") and adam.roles == {"first_moment": "exp_avg",
                                                                            "second_moment": "exp_avg_sq"}
    assert adam.decays() == {"exp_avg": 0.8, "exp_avg_sq": 0.99} and adam.slot("second_moment", 10) == slice(10, 20)
    assert MomentCorrection().choice(adam, 2, True)[0] is True
    sgd = TorchOptimizer(optimizer="torch.optim:SGD", lr=0.1, kwargs={"momentum": 0.9})
    assert sgd.roles == {"velocity": "momentum_buffer"} and sgd.momentum == 0.9 and sgd.linear
    assert MomentumMasking().decide(sgd)[0] is True and UpdateScale().decide(sgd, 2, 0)[0] == 0.5
    assert not TorchOptimizer(optimizer="torch.optim:SGD", kwargs={"weight_decay": 1e-4}).linear
    adamax = TorchOptimizer(optimizer="torch.optim:Adamax")
    assert adamax.roles == {"first_moment": "exp_avg"} and MomentCorrection().choice(adamax, 2, True)[0] is False
    mixed = TorchOptimizer(optimizer="torch.optim:Adam", param_groups=[{"params": "bias", "betas": [0.5, 0.9]}])
    assert mixed.roles == {}  # no one decay for every parameter: no moment correction
    nadam = TorchOptimizer(optimizer="torch.optim:NAdam")
    assert nadam.slot_names == ("exp_avg", "exp_avg_sq", "mu_product") and nadam.layout.scalars == {"mu_product"}
    assert from_config(adam.to_config(), kind="updater") == adam


def test_class_objects_are_stored_by_name():
    u = TorchOptimizer(optimizer=torch.optim.AdamW, scheduler=torch.optim.lr_scheduler.StepLR,
                       scheduler_kwargs={"step_size": 1})
    assert u.optimizer == "torch.optim:AdamW" and u.scheduler == "torch.optim.lr_scheduler:StepLR"

    class Local(torch.optim.SGD):
        pass

    local = _model(Local, optimizer_kwargs={"lr": 0.1})
    x, y = _data()
    local.fit_batch(x[:BATCH], y[:BATCH])  # trains in this process
    with pytest.raises(ConfigError, match="Expect a torch optimizer importable by name"):
        local.to_config()


def test_bad_optimizers_and_arguments_are_named():
    host_hint = r"on host \S+ \(python .*\).*install the package"
    with pytest.raises(ConfigError, match=r"Cannot import the torch optimizer 'nosuchpkg.optim:Fast' " + host_hint):
        _model("nosuchpkg.optim:Fast")
    with pytest.raises(ValueError, match=r"optimizer_kwargs that torch.optim:AdamW takes .* got unknown \['betaz'\]"):
        _model("torch.optim:AdamW", optimizer_kwargs={"betaz": [0.9, 0.99]})
    with pytest.raises(ValueError, match=r"torch.optim:LBFGS, which keeps .*not per parameter.*'d' \(a tensor of "
                                         r"shape \(11,\) for a parameter of shape \(3, 2\)\), 'old_dirs' \(a list\)"):
        _model("torch.optim:LBFGS")
    with pytest.raises(ValueError, match=r"torch.optim:Adafactor, which keeps 'row_var' \(a tensor of shape \(3, 1\)"):
        _model("torch.optim:Adafactor")
    with pytest.raises(ValueError, match="Invalid beta parameter"):
        _model("torch.optim:Adam", optimizer_kwargs={"betas": [1.5, 0.9]})
    with pytest.raises(ValueError, match=r"Expect the torch optimizer 'torch.nn:Linear' to name a torch.optim"):
        _model("torch.nn:Linear")
    with pytest.raises(ConfigError, match=r"Cannot find the learning-rate scheduler 'torch.optim.lr_scheduler:Nope'"):
        _model(scheduler="torch.optim.lr_scheduler:Nope")
    with pytest.raises(ValueError, match=r"scheduler_kwargs that torch.optim.lr_scheduler:StepLR takes .*'stepsize'"):
        _model(scheduler="torch.optim.lr_scheduler:StepLR", scheduler_kwargs={"stepsize": 2})
    with pytest.raises(ValueError, match=r"scheduler_kwargs that torch.optim.lr_scheduler:StepLR accepts"):
        _model(scheduler="torch.optim.lr_scheduler:StepLR")  # step_size is required
    with pytest.raises(ValueError, match="ReduceLROnPlateau, which steps on a metric"):
        _model(scheduler="torch.optim.lr_scheduler:ReduceLROnPlateau")
    with pytest.raises(ValueError, match=r"param_groups entry .* to match a parameter, got \['nothing'\] matching "
                                         r"none of '1.weight'"):
        _model(param_groups=[{"params": "nothing"}]).fit_batch(*_data(8))
    with pytest.raises(ValueError, match=r"param_groups\[0\] options that torch.optim:Adam takes .*\['momentum'\]"):
        _model(param_groups=[{"params": "bias", "momentum": 0.9}])
    with pytest.raises(ValueError, match="an updater or a torch optimizer, got both"):
        TorchModel("tests.torch_models:mlp", input_shape=(16,), updater=Adam(), optimizer="torch.optim:Adam")
    with pytest.raises(ValueError, match=r"\['scheduler'\] only with a torch optimizer"):
        TorchModel("tests.torch_models:mlp", input_shape=(16,), scheduler="torch.optim.lr_scheduler:StepLR")
    with pytest.raises(ValueError, match="one schedule"):
        _model(optimizer_kwargs={"lr": StepSchedule(0.1, 0.5, 2)}, scheduler="torch.optim.lr_scheduler:StepLR",
               scheduler_kwargs={"step_size": 1})
    with pytest.raises(TypeError, match="step through the model that holds it"):
        TorchOptimizer().apply(np.zeros(3, np.float32), np.zeros(3, np.float32), np.zeros(6, np.float32), 0)


def _crafted(tmp_path, edit):
    from .test_model_trust import craft

    model = _model("torch.optim:SGD", optimizer_kwargs={"lr": 0.1, "momentum": 0.9})
    model.fit_batch(*_data(8))
    path, crafted = tmp_path / "m.npz", tmp_path / "crafted.npz"
    model.save(path)
    craft(path, crafted, edit, redigest=True)
    return crafted


def test_a_loader_builds_torch_classes_and_marked_ones_only(tmp_path):
    def naming(optimizer=None, scheduler=None):
        def edit(config):
            if optimizer:
                config["updater"]["optimizer"] = optimizer
            if scheduler:
                config["updater"].update(scheduler=scheduler, scheduler_kwargs={"step_size": 1})
        return edit

    marked = load_model(_crafted(tmp_path, naming("tests.torch_models:MarkedSGD", "tests.torch_models:MarkedStepLR")))
    assert marked.updater.optimizer_class is torch_models.MarkedSGD
    with pytest.raises(ModelFileError, match=r"'tests.torch_models:UnmarkedSGD' .* not marked as a optimizer"):
        load_model(_crafted(tmp_path, naming("tests.torch_models:UnmarkedSGD")))
    trusted = load_model(_crafted(tmp_path, naming("tests.torch_models:UnmarkedSGD")),
                         trusted={"tests.torch_models:UnmarkedSGD"})
    assert trusted.updater.optimizer_class is torch_models.UnmarkedSGD
    with pytest.raises(ModelFileError, match=r"Refusing to call the learning-rate scheduler 'subprocess:Popen'"):
        load_model(_crafted(tmp_path, naming(scheduler="subprocess:Popen")))


def test_a_standard_library_optimizer_name_is_refused_without_running_it(tmp_path):
    marker = tmp_path / "RAN"
    crafted = _crafted(tmp_path, lambda c: c["updater"].update(optimizer="os:system",
                                                               kwargs={"command": f"touch {marker}"}))
    with pytest.raises(ModelFileError, match=r"Refusing to call the torch optimizer 'os:system' .* standard library"):
        load_model(crafted)
    assert not marker.exists()


def test_a_configuration_naming_an_optimizer_directly_is_checked_too(tmp_path):
    """TorchModel(optimizer=...) given in a loaded configuration (not as its updater) is checked as the updater's."""
    def edit(config):
        config.pop("updater")
        config.update(optimizer="tests.torch_models:UnmarkedSGD", optimizer_kwargs={"lr": 0.1, "momentum": 0.9})

    with pytest.raises(ModelFileError, match=r"'tests.torch_models:UnmarkedSGD' .* not marked as a optimizer"):
        load_model(_crafted(tmp_path, edit))
    marked = load_model(_crafted(tmp_path, lambda c: (c.pop("updater"), c.update(
        optimizer="torch.optim:SGD", optimizer_kwargs={"lr": 0.1, "momentum": 0.9}))))
    assert marked.updater.optimizer == "torch.optim:SGD"
