"""Torch optimizers, schedulers, several inputs and frozen pretrained
weights on a real local[2] Spark: an averaging round is the example-weighted
mean of torch replicas with Adam's second moment corrected, a resumed fit
continues a scheduled AdamW exactly, sharing masks SGD's momentum, frozen
parameters stay bit-identical under both masters, and a two-input module
trains from two DataFrame columns."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from sparkavg.spark import DataOptions, GradientSharing, ParameterAveraging, SparkTrainer  # noqa: E402
from sparkavg.torch import TorchModel  # noqa: E402

from .nets import averaged_updater_state, blobs, fit_replicas, straight_and_resumed  # noqa: E402

pytestmark = pytest.mark.spark


def _frame(session, x, y, partitions=1):
    rows = [(i, row.reshape(-1).tolist(), int(label)) for i, (row, label) in enumerate(zip(x, y))]
    return session.createDataFrame(rows, "id long, features array<float>, label long").coalesce(partitions)


def _decision(trainer, name):
    return [d["value"] for d in trainer.stats.decisions if d["name"] == name]


def test_an_averaging_round_is_the_corrected_mean_of_torch_adam_replicas(spark):
    x, y = blobs(16, seed=1)
    net = TorchModel("tests.torch_models:conv_bn", input_shape=(1, 4, 4), seed=2, optimizer="torch.optim:Adam",
                     optimizer_kwargs={"lr": 0.01, "betas": [0.8, 0.99]})
    start = net.clone()
    master = ParameterAveraging(batch_size_per_worker=4, averaging_frequency=2, workers=2,
                                data=DataOptions(repartition="never"))
    with SparkTrainer(spark, net, master) as trainer:
        trainer.fit(_frame(spark, x, y), epochs=1)
        assert _decision(trainer, "moment_correction") == [True]  # found through the optimizer's roles
    replicas = fit_replicas(start, x, y, ([0, 2], [1, 3]))  # what each worker's torch Adam did
    np.testing.assert_allclose(net.params, (replicas[0].params + replicas[1].params) / 2, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(net.buffers, (replicas[0].buffers + replicas[1].buffers) / 2, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(net.updater_state, averaged_updater_state(start, replicas), rtol=1e-5, atol=1e-7)
    assert net.iteration == 2


@pytest.mark.slow
def test_a_resumed_fit_continues_a_scheduled_adamw_with_groups_exactly(spark, tmp_path):
    x, y = blobs(60, seed=5)
    df = _frame(spark, x, y)
    master = ParameterAveraging(batch_size_per_worker=6, averaging_frequency=2, workers=2)

    def make(seed):
        return TorchModel("tests.torch_models:mlp", input_shape=(1, 4, 4), seed=seed, optimizer="torch.optim:AdamW",
                          optimizer_kwargs={"lr": 0.02, "weight_decay": 0.05},
                          param_groups=[{"params": "bias", "weight_decay": 0.0}],
                          scheduler="torch.optim.lr_scheduler:StepLR", scheduler_kwargs={"step_size": 1, "gamma": 0.5})

    straight, resumed, trainer = straight_and_resumed(spark, make, master, df, str(tmp_path / "ckpt"), seed=6)
    trainer.close()
    np.testing.assert_allclose(resumed.params, straight.params, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(resumed.updater_state, straight.updater_state, rtol=1e-5, atol=1e-7)
    assert resumed.updater.rate(resumed.iteration, resumed.epoch) == pytest.approx(0.02 * 0.5 ** 3)


@pytest.mark.slow
def test_sharing_trains_with_torch_sgd_and_masks_its_momentum(spark):
    x, y = blobs(200, seed=3)
    net = TorchModel("tests.torch_models:mlp", input_shape=(1, 4, 4), seed=4, optimizer="torch.optim:SGD",
                     optimizer_kwargs={"lr": 0.1, "momentum": 0.9})
    with SparkTrainer(spark, net, GradientSharing(threshold=1e-2, batch_size_per_worker=10, workers=2)) as trainer:
        df = _frame(spark, x, y, partitions=2)
        trainer.fit(df, epochs=2)
        assert max(h["replica_max_abs_diff"] for h in trainer.history) <= 1e-4
        assert _decision(trainer, "momentum_masking")[-1] is True
        assert trainer.evaluate(df).accuracy() > 0.9


@pytest.mark.slow
@pytest.mark.parametrize("master", ["averaging", "sharing"])
def test_frozen_pretrained_parameters_stay_bit_identical(spark, tmp_path, master):
    x, y = blobs(96, seed=7)
    source = TorchModel("tests.torch_models:backbone_head", factory_kwargs={"freeze": False}, input_shape=(1, 4, 4),
                        seed=8)
    source.fit(x, y, batch_size=16, epochs=1)
    weights = {k: v.detach().clone() for k, v in source.module.state_dict().items()}
    torch.save(weights, tmp_path / "pretrained.pt")
    net = TorchModel("tests.torch_models:backbone_head", input_shape=(1, 4, 4), init_weights=tmp_path / "pretrained.pt",
                     optimizer="torch.optim:Adam", optimizer_kwargs={"lr": 0.02}, seed=9)
    frozen = [n for n, p in net.module.named_parameters() if not p.requires_grad]
    assert frozen and all(n.startswith("backbone.") for n in frozen)
    head = net.params.copy()
    m = (ParameterAveraging(batch_size_per_worker=8, averaging_frequency=3, workers=2) if master == "averaging"
         else GradientSharing(threshold=1e-3, batch_size_per_worker=8, workers=2))
    with SparkTrainer(spark, net, m) as trainer:
        trainer.fit(_frame(spark, x, y, partitions=2), epochs=2)
    state = net.module.state_dict()
    for name in frozen:
        assert torch.equal(state[name], weights[name]), name
    assert not np.array_equal(net.params, head)  # the head trained
    assert not torch.equal(state["backbone.1.running_mean"], weights["backbone.1.running_mean"])  # statistics merged


@pytest.mark.slow
def test_a_two_input_module_trains_from_two_dataframe_columns(spark):
    rng = np.random.default_rng(10)
    n = 128
    image, extra = rng.standard_normal((n, 16)).astype(np.float32), rng.standard_normal((n, 3)).astype(np.float32)
    y = (image[:, :3].sum(axis=1) + extra.sum(axis=1) > 0).astype(np.int64)
    df = spark.createDataFrame([(a.tolist(), b.tolist(), int(c)) for a, b, c in zip(image, extra, y)],
                               "img array<float>, meta array<float>, label long").coalesce(2)
    net = TorchModel("tests.torch_models:two_inputs", inputs={"image": (1, 4, 4), "extra": (3,)}, seed=11,
                     optimizer="torch.optim:Adam", optimizer_kwargs={"lr": 0.02})
    with SparkTrainer(spark, net, ParameterAveraging(batch_size_per_worker=16, workers=2),
                      features_col={"image": "img", "extra": "meta"}) as trainer:
        trainer.fit(df, epochs=8)
        assert trainer.history[-1]["examples"] == n
        assert trainer.evaluate(df).accuracy() > 0.85
        out = np.array(trainer.predict(df).collect())
    np.testing.assert_allclose(out, net.output({"image": image.reshape(n, 1, 4, 4), "extra": extra}), rtol=1e-5,
                               atol=1e-6)
