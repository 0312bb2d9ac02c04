"""What a TorchModel's module may take and give, and where its weights come
from: several named inputs (ids kept int64), a tuple or dict of outputs with
predictions from a named one, a loss over several outputs, a training step
of one's own, pretrained weights from a state_dict or an npz (read without
unpickling code), and frozen parameters that ship in the buffers vector and
stay bit-identical."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from sparkavg.configurable import ConfigError  # noqa: E402
from sparkavg.nn import load_model, model_from_json  # noqa: E402
from sparkavg.nn.model import InputSpec  # noqa: E402
from sparkavg.nn.serialization import ModelFileError  # noqa: E402
from sparkavg.torch import TorchModel  # noqa: E402

from . import torch_models  # noqa: E402
from .nets import blobs  # noqa: E402


def _two_input_data(n=64, seed=0):
    rng = np.random.default_rng(seed)
    image, extra = rng.standard_normal((n, 1, 4, 4)).astype(np.float32), rng.standard_normal((n, 3)).astype(np.float32)
    y = (image.reshape(n, -1)[:, :3].sum(axis=1) + extra.sum(axis=1) > 0).astype(np.int64)
    return {"image": image, "extra": extra}, y


def test_named_inputs_reach_forward_in_order_and_the_spec_names_them():
    x, y = _two_input_data()
    model = TorchModel("tests.torch_models:two_inputs", inputs={"image": (1, 4, 4), "extra": (3,)},
                       optimizer="torch.optim:Adam", optimizer_kwargs={"lr": 0.02}, seed=1)
    assert model.spec.inputs == (InputSpec("image", (1, 4, 4)), InputSpec("extra", (3,)))
    torch.manual_seed(1)
    module = torch_models.two_inputs()
    expected = torch.softmax(module(torch.from_numpy(x["image"]), torch.from_numpy(x["extra"])), 1).detach().numpy()
    np.testing.assert_allclose(model.output(x), expected, rtol=1e-6)
    np.testing.assert_array_equal(model.output([x["image"], x["extra"]]), model.output(x))  # a list in order
    flat_image = {"image": x["image"].reshape(64, 16), "extra": x["extra"]}
    np.testing.assert_array_equal(model.output(flat_image), model.output(x))
    losses = model.fit(x, y, batch_size=16, epochs=15)
    assert losses[-1] < 0.5 * losses[0] and np.mean(model.predict(x) == y) > 0.9
    again = model_from_json(model.to_json())
    assert list(again.inputs.items()) == [("image", (1, 4, 4)), ("extra", (3,))]  # forward's order, through JSON
    np.testing.assert_array_equal(again.output(x), model_from_json(model.to_json()).output(x))
    with pytest.raises(ValueError, match=r"Expect inputs keyed by \['image', 'extra'\], got keys \['image'\]"):
        model.output({"image": x["image"]})
    with pytest.raises(ValueError, match=r"Expect input 'extra' of shape \(batch, 3\), got \(64, 4\)"):
        model.output({"image": x["image"], "extra": np.zeros((64, 4), np.float32)})
    with pytest.raises(ValueError, match=r"Expect every input with the same number of examples"):
        model.output({"image": x["image"], "extra": x["extra"][:10]})
    with pytest.raises(ValueError, match="Expect input_shape or inputs, got both"):
        TorchModel("tests.torch_models:two_inputs", input_shape=(16,), inputs={"image": (1, 4, 4), "extra": (3,)})


def test_an_int64_input_keeps_its_ids_for_an_embedding():
    rng = np.random.default_rng(2)
    ids, values = rng.integers(0, 5, (40, 2)), rng.standard_normal((40, 3)).astype(np.float32)
    y = (ids[:, 0] >= 3).astype(np.int64)
    model = TorchModel("tests.torch_models:ids_and_values", inputs={"ids": (2,), "values": (3,)},
                       input_dtypes={"ids": "int64"}, optimizer="torch.optim:Adam", optimizer_kwargs={"lr": 0.05})
    assert [i.dtype for i in model.spec.inputs] == ["int64", "float32"]
    model.fit({"ids": ids, "values": values}, y, batch_size=8, epochs=20)
    assert np.mean(model.predict({"ids": ids, "values": values}) == y) > 0.9
    with pytest.raises(ValueError, match=r"Expect integer ids for input 'ids' \(input_dtypes says int64\)"):
        model.output({"ids": ids.astype(np.float32), "values": values})
    with pytest.raises(ValueError, match="Expect input_dtypes of the inputs"):
        TorchModel("tests.torch_models:ids_and_values", inputs={"ids": (2,), "values": (3,)},
                   input_dtypes={"ids": "int8"})


@pytest.mark.parametrize("as_tuple,prediction", [(False, "logits"), (True, 0)])
def test_predictions_come_from_the_named_output_and_a_loss_sees_all_of_them(as_tuple, prediction):
    x, y = blobs(32, seed=3)
    model = TorchModel("tests.torch_models:two_heads", factory_kwargs={"as_tuple": as_tuple}, input_shape=(1, 4, 4),
                       loss="tests.torch_models:main_and_aux", prediction=prediction, optimizer="torch.optim:SGD",
                       optimizer_kwargs={"lr": 0.1})
    torch.manual_seed(123)
    module = torch_models.two_heads(as_tuple=as_tuple)
    raw = module(torch.from_numpy(x))
    main = raw[prediction]
    np.testing.assert_allclose(model.output(x), torch.softmax(main, 1).detach().numpy(), rtol=1e-6)
    expected = float(torch_models.main_and_aux(raw, torch.from_numpy(y)).detach())
    assert model.score(x, y) == pytest.approx(expected, rel=1e-6)
    assert model.fit_batch(x, y) == pytest.approx(expected, rel=1e-6)  # the step's loss: both heads
    assert model.spec.outputs[0].name == ("logits" if prediction == "logits" else "output")
    wrong = "aux2" if not as_tuple else 5
    with pytest.raises(ValueError, match="Expect prediction= (naming one of the keys|as an index below 2)"):
        TorchModel("tests.torch_models:two_heads", factory_kwargs={"as_tuple": as_tuple}, input_shape=(1, 4, 4),
                   prediction=wrong)
    with pytest.raises(ValueError, match="Expect prediction as the key"):
        TorchModel("tests.torch_models:mlp", input_shape=(16,), prediction=-1)


def test_a_training_step_of_ones_own_trains_scores_and_reloads_by_name(tmp_path):
    x, y = blobs(64, seed=4)
    model = TorchModel("tests.torch_models:two_heads", input_shape=(1, 4, 4), prediction="logits",
                       training_step="tests.torch_models:smoothed_step", optimizer="torch.optim:Adam",
                       optimizer_kwargs={"lr": 0.02}, seed=5)
    module = torch_models.two_heads()
    module.load_state_dict({k: torch.from_numpy(np.asarray(v)) for k, v in _state_dict(model).items()})
    module.eval()
    with torch.no_grad():
        expected = float(torch_models.smoothed_step(module, (torch.from_numpy(x), torch.from_numpy(y))))
    assert model.score(x, y) == pytest.approx(expected, rel=1e-6)
    losses = model.fit(x, y, batch_size=16, epochs=10)
    assert losses[-1] < 0.7 * losses[0] and np.mean(model.predict(x) == y) > 0.9
    model.save(tmp_path / "step.npz")
    loaded = load_model(tmp_path / "step.npz")
    np.testing.assert_array_equal(loaded.output(x), model.output(x))
    assert loaded.to_config()["training_step"] == "tests.torch_models:smoothed_step"
    with pytest.raises(ValueError, match="Expect no per-row weights with a training_step"):
        model.fit_batch(x, y, weights=np.ones(64))
    with pytest.raises(ValueError, match="Expect a loss or a training_step, got both"):
        TorchModel("tests.torch_models:two_heads", input_shape=(1, 4, 4), prediction="logits", loss="mse",
                   training_step="tests.torch_models:smoothed_step")
    unmarked = TorchModel("tests.torch_models:two_heads", input_shape=(1, 4, 4), prediction="logits",
                          training_step="tests.torch_models:unmarked_step")
    unmarked.save(tmp_path / "unmarked.npz")
    with pytest.raises(ModelFileError, match=r"'tests.torch_models:unmarked_step' .* not marked as a training_step"):
        load_model(tmp_path / "unmarked.npz")
    local = TorchModel("tests.torch_models:two_heads", input_shape=(1, 4, 4), prediction="logits",
                       training_step=lambda module, batch: torch.ones(()))
    with pytest.raises(ValueError, match="Expect a loss that depends on the module's trainable parameters"):
        local.fit_batch(x, y)  # a constant: nothing would train
    with pytest.raises(ConfigError, match="Expect a TorchModel training_step importable by name"):
        local.to_config()


def _state_dict(model) -> dict:
    """The module's state_dict as arrays (the flat vectors' views)."""
    return {k: v.detach().cpu().numpy().copy() for k, v in model.module.state_dict().items()}


# --------------------------------------------------------------- pretrained weights
@pytest.fixture()
def pretrained(tmp_path):
    """A trained backbone_head's weights as a torch state_dict file and as an npz."""
    source = TorchModel("tests.torch_models:backbone_head", factory_kwargs={"freeze": False}, input_shape=(1, 4, 4),
                        optimizer="torch.optim:Adam", optimizer_kwargs={"lr": 0.05}, seed=11)
    x, y = blobs(64, seed=12)
    source.fit(x, y, batch_size=16, epochs=3)
    state = {k: torch.from_numpy(v) for k, v in _state_dict(source).items()}
    torch.save(state, tmp_path / "weights.pt")
    np.savez(tmp_path / "weights.npz", **{k: v.numpy() for k, v in state.items()})
    return state, tmp_path


@pytest.mark.parametrize("source", ["weights.pt", "weights.npz", "mapping"])
def test_init_weights_from_a_state_dict_an_npz_or_a_mapping(pretrained, source):
    state, folder = pretrained
    init = state if source == "mapping" else folder / source
    model = TorchModel("tests.torch_models:backbone_head", input_shape=(1, 4, 4), init_weights=init, seed=99)
    got = _state_dict(model)
    assert sorted(got) == sorted(state)
    for name, value in state.items():
        np.testing.assert_array_equal(got[name], value.numpy(), err_msg=name)
    # the frozen backbone travels in the buffers vector, after BatchNorm's statistics; the head is the params
    assert model.num_params == 8 * 2 + 2
    frozen = sum(v.numel() for k, v in state.items() if k.startswith("backbone.") and "running" not in k
                 and "num_batches" not in k)
    assert model.buffers.size == frozen + 3 + 3 + 1
    assert "init_weights" not in model.to_config() and len(model.to_config()["frozen_sha256"]) == 64


def test_init_weights_that_do_not_match_name_the_keys_and_shapes(pretrained, tmp_path):
    state, folder = pretrained
    extra = dict(state, **{"head.extra": torch.zeros(2)})
    with pytest.raises(ValueError, match=r"keys the module does not have: 'head.extra'"):
        TorchModel("tests.torch_models:backbone_head", input_shape=(1, 4, 4), init_weights=extra)
    wrong = dict(state, **{"head.weight": torch.zeros(3, 8)})
    with pytest.raises(ValueError, match=r"'head.weight': \(3, 8\) in the file, \(2, 8\) in the module"):
        TorchModel("tests.torch_models:backbone_head", input_shape=(1, 4, 4), init_weights=wrong)
    backbone = {k: v for k, v in state.items() if k.startswith("backbone.")}
    with pytest.raises(ValueError, match=r"the module's keys the file lacks: 'head.weight', 'head.bias'"):
        TorchModel("tests.torch_models:backbone_head", input_shape=(1, 4, 4), init_weights=backbone)
    new_head = TorchModel("tests.torch_models:backbone_head", input_shape=(1, 4, 4), init_weights=backbone,
                          init_strict=False, seed=5)
    fresh = TorchModel("tests.torch_models:backbone_head", input_shape=(1, 4, 4), seed=5)
    np.testing.assert_array_equal(new_head.params, fresh.params)  # the factory's head
    np.savez(tmp_path / "bad.npz", **{"backbone.0.weight": np.zeros((3, 1, 3, 3), np.int64)})
    torch.save({"state_dict": state}, tmp_path / "nested.pt")
    with pytest.raises(ValueError, match=r"got dict for 'state_dict' \(a checkpoint holding a state_dict"):
        TorchModel("tests.torch_models:backbone_head", input_shape=(1, 4, 4), init_weights=tmp_path / "nested.pt")
    with pytest.raises(ValueError, match="Expect init_weights as a path"):
        TorchModel("tests.torch_models:backbone_head", input_shape=(1, 4, 4), init_weights=3)


class _Payload:
    """What a malicious weights file would unpickle: a call of os.system."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        import os

        return os.system, (f"touch {self.marker}",)


def test_a_weights_file_holding_code_is_refused_and_nothing_runs(tmp_path):
    marker = tmp_path / "RAN"
    torch.save({"head.weight": _Payload(marker)}, tmp_path / "evil.pt")
    with pytest.raises(ValueError, match=r"read with torch.load\(weights_only=True\), never unpickling code.*"
                                         r"GLOBAL posix.system") as info:
        TorchModel("tests.torch_models:backbone_head", input_shape=(1, 4, 4), init_weights=tmp_path / "evil.pt")
    assert "weights_only` set to `False`" not in str(info.value)  # no advice to unpickle it after all
    assert not marker.exists()


# --------------------------------------------------------------- frozen parameters
def test_frozen_parameters_never_train_and_survive_a_merge_bit_for_bit(pretrained):
    state, folder = pretrained
    x, y = blobs(32, seed=13)
    model = TorchModel("tests.torch_models:backbone_head", input_shape=(1, 4, 4), init_weights=folder / "weights.pt",
                       optimizer="torch.optim:AdamW", optimizer_kwargs={"lr": 0.05, "weight_decay": 0.1})
    frozen_names = [n for n, p in model.module.named_parameters() if not p.requires_grad]
    before = {n: _state_dict(model)[n] for n in frozen_names}
    model.fit(x, y, batch_size=8, epochs=2)
    after = _state_dict(model)
    for n in frozen_names:
        np.testing.assert_array_equal(after[n], before[n], err_msg=n)
    assert not np.array_equal(after["head.weight"], state["head.weight"].numpy())
    # a merge of the workers' copies: the frozen values come back rounded, the rest averaged
    merged = {k: v.copy() for k, v in model.state.items()}
    merged["buffers"] = merged["buffers"] * np.float32(1 + 1e-7)
    merged["params"] = merged["params"] + np.float32(0.5)
    model.load_state(merged)
    np.testing.assert_array_equal(model.params, merged["params"])
    for n in frozen_names:
        np.testing.assert_array_equal(_state_dict(model)[n], before[n], err_msg=n)


def test_a_model_rebuilt_from_its_configuration_takes_the_frozen_values_it_pins(pretrained, tmp_path):
    state, folder = pretrained
    model = TorchModel("tests.torch_models:backbone_head", input_shape=(1, 4, 4), init_weights=folder / "weights.pt")
    executor = model_from_json(model.to_json())  # what an executor builds: the factory's backbone
    assert not np.array_equal(executor.buffers, model.buffers)
    with pytest.raises(ValueError, match=r"Expect the frozen parameters .* this model's configuration pins"):
        executor.load_state({"buffers": model.buffers * 2})
    executor.load_state(model.state)  # the driver's shipped state
    np.testing.assert_array_equal(executor.buffers, model.buffers)
    x, _ = blobs(8, seed=14)
    np.testing.assert_array_equal(executor.output(x), model.output(x))
    model.save(tmp_path / "fine.npz")
    loaded = load_model(tmp_path / "fine.npz")
    np.testing.assert_array_equal(loaded.buffers, model.buffers)
    loaded.load_state({"buffers": model.buffers * np.float32(1 + 1e-7)})  # then keeps them through merges
    frozen = slice(3 + 3 + 1, None)  # after BatchNorm's running mean, variance and batch count
    np.testing.assert_array_equal(loaded.buffers[frozen], model.buffers[frozen])
    assert not np.array_equal(loaded.buffers[:3], model.buffers[:3])  # the statistics are merged
    twin = model.clone()
    np.testing.assert_array_equal(twin.buffers, model.buffers)
    assert twin.fingerprint() == model.fingerprint()
    other = TorchModel("tests.torch_models:backbone_head", input_shape=(1, 4, 4))
    assert other.fingerprint() != model.fingerprint()  # other frozen weights: another model to resume


def test_a_loaded_configuration_cannot_name_weights_to_read(pretrained, tmp_path):
    from .test_model_trust import craft

    state, folder = pretrained
    model = TorchModel("tests.torch_models:backbone_head", input_shape=(1, 4, 4), init_weights=folder / "weights.pt")
    model.save(tmp_path / "m.npz")
    craft(tmp_path / "m.npz", tmp_path / "crafted.npz", lambda c: c.update(init_weights=str(folder / "weights.pt")),
          redigest=True)
    with pytest.raises(ModelFileError, match=r"TorchModel.init_weights only in code, not in a loaded configuration"):
        load_model(tmp_path / "crafted.npz", trusted=True)
