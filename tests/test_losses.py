"""The losses of :mod:`sparkavg.nn.losses`: float64 gradient checks of each
with and without class weights, their values against direct formulas and
PyTorch's own losses, and the messages of bad labels and weights."""
from __future__ import annotations

import numpy as np
import pytest

from sparkavg.nn import SGD, Dense, Network, Output, model_from_config

from .gradients import parameter_central
from .test_nn_gradients import check_gradient


def _net(units, **output):
    return Network((5,), [Dense(4, activation="tanh"), Output(units, **output)], updater=SGD(0.1),
                   dtype="float64", seed=3)


def _x(n=6, seed=0):
    return np.random.default_rng(seed).standard_normal((n, 5))


@pytest.mark.parametrize("output, y", [
    (dict(loss="bce"), np.array([0, 1, 1, 0, 1, 0.0])),
    (dict(loss="bce", class_weights=(0.3, 2.5)), np.array([0, 1, 1, 0, 1, 0.0])),
    (dict(units=3, loss="bce"), np.random.default_rng(1).integers(0, 2, (6, 3)).astype(float)),
    (dict(units=3, loss="bce", class_weights=(1.0, 4.0)), np.random.default_rng(2).random((6, 3))),
    (dict(units=2, loss="mae"), np.random.default_rng(3).standard_normal((6, 2))),
    (dict(units=2, loss="huber", huber_delta=0.5), 3 * np.random.default_rng(4).standard_normal((6, 2))),
    (dict(units=3, loss="nll", class_weights=(1.0, 0.2, 3.0)), np.array([0, 1, 2, 2, 1, 0])),
    (dict(units=3, loss="nll", class_weights=(1.0, 0.2, 3.0)),
     np.random.default_rng(5).dirichlet(np.ones(3), 6)),
])
def test_gradient_of_each_loss(output, y):
    units = output.pop("units", 1)
    check_gradient(_net(units, **output), _x(), y)


def _sigmoid(z):
    return 1 / (1 + np.exp(-z))


def test_bce_value_equals_the_formula_and_is_finite_at_saturated_logits():
    net = _net(1, loss="bce", class_weights=(0.5, 3.0))
    x, t = _x(), np.array([0, 1, 1, 0, 1, 0.0])
    loss = net.score(x, t) - net.flat.penalty()
    p = net.output(x)[:, 0]
    direct = -np.mean(3.0 * t * np.log(p) + 0.5 * (1 - t) * np.log(1 - p))
    assert loss == pytest.approx(direct, rel=1e-12)
    # logits of +-800 give p of exactly 0 or 1 in float64: the log form gives inf, the logit form does not
    net.layers[-1].W[...] = 0
    net.layers[-1].b[...] = 800.0
    assert net.output(x[:1])[0, 0] == 1.0
    assert net.score(x, t) - net.flat.penalty() == pytest.approx(800.0 * 0.5 * 3 / 6, rel=1e-12)


def test_losses_equal_pytorchs():
    torch = pytest.importorskip("torch")
    functional = torch.nn.functional
    x = _x(8)
    rng = np.random.default_rng(9)
    cases = [
        (dict(loss="bce"), rng.integers(0, 2, (8, 3)).astype(float),
         lambda z, t: functional.binary_cross_entropy_with_logits(z, t)),
        (dict(loss="bce", class_weights=(1.0, 2.5)), rng.integers(0, 2, (8, 3)).astype(float),
         lambda z, t: functional.binary_cross_entropy_with_logits(z, t, pos_weight=torch.full((3,), 2.5))),
        (dict(loss="mae"), rng.standard_normal((8, 3)), lambda z, t: functional.l1_loss(z, t)),
        (dict(loss="huber", huber_delta=0.7), 2 * rng.standard_normal((8, 3)),
         lambda z, t: functional.huber_loss(z, t, delta=0.7)),
    ]
    for output, t, reference in cases:
        net = _net(3, **output)
        out = net.layers[-1]
        net._forward(net._prepare_input(x), training=False)
        z = torch.from_numpy(np.array(out._z if out.loss_name == "bce" else out._y))
        expected = float(reference(z, torch.from_numpy(t)))
        assert net.score(x, t) - net.flat.penalty() == pytest.approx(expected, rel=1e-10), output


def test_class_weights_in_nll_scale_each_rows_loss_by_its_class():
    plain, weighted = _net(3), _net(3, class_weights=(2.0, 1.0, 0.5))
    x, y = _x(), np.array([0, 0, 1, 1, 2, 2])
    per_row = []
    for i in range(6):
        per_row.append(plain.score(x[i:i + 1], y[i:i + 1]) - plain.flat.penalty())
    expected = np.mean(np.array(per_row) * np.array([2.0, 1.0, 0.5])[y])
    assert weighted.score(x, y) - weighted.flat.penalty() == pytest.approx(expected, rel=1e-12)


def test_outputs_with_the_new_losses_round_trip_through_their_configuration():
    for output in (dict(loss="bce", class_weights=(1.0, 3.0)), dict(loss="huber", huber_delta=2.0),
                   dict(loss="nll", class_weights=(1.0, 2.0, 3.0)), dict(loss="mae")):
        units = 3 if output["loss"] == "nll" else 1
        net = _net(units, **output)
        again = model_from_config(net.to_config())
        assert again.to_config() == net.to_config()
        np.testing.assert_array_equal(again.output(_x()), net.output(_x()))
    assert _net(1, loss="bce").spec.outputs[0].target == "binary"
    assert _net(1, loss="huber").spec.outputs[0].target == "values"


@pytest.mark.parametrize("kwargs, message", [
    (dict(units=1, loss="hinge"), "Expect loss in"),
    (dict(units=1, loss="bce", activation="softmax"), "Expect activation 'sigmoid' with loss 'bce'"),
    (dict(units=3, loss="nll", class_weights=(1.0, 2.0)), "one weight per class (3)"),
    (dict(units=1, loss="bce", class_weights=(1.0, 2.0, 3.0)), "two weights (negative, positive)"),
    (dict(units=3, loss="nll", class_weights=(1.0, -2.0, 1.0)), "finite, >= 0 and not all zero"),
    (dict(units=3, loss="nll", class_weights=(0.0, 0.0, 0.0)), "finite, >= 0 and not all zero"),
    (dict(units=3, loss="nll", class_weights=(1.0, float("nan"), 1.0)), "finite, >= 0 and not all zero"),
    (dict(units=1, loss="mse", class_weights=(1.0, 2.0)), "class_weights only with loss 'nll' or 'bce'"),
    (dict(units=1, loss="huber", huber_delta=0.0), "huber_delta to be a finite number > 0"),
])
def test_bad_output_arguments_are_named(kwargs, message):
    with pytest.raises(ValueError) as info:
        Output(**kwargs)
    assert message in str(info.value)


def test_bad_binary_labels_are_named():
    net = _net(1, loss="bce")
    with pytest.raises(ValueError, match=r"binary labels in \[0, 1\].*from 0.0 to 2.0"):
        net.fit_batch(_x(), np.array([0, 1, 2, 0, 1, 0.0]))
    with pytest.raises(ValueError, match=r"labels of shape \(6, 1\) or \(6,\), got \(6, 2\)"):
        net.fit_batch(_x(), np.zeros((6, 2)))


# ------------------------------------------------------------ on Spark
def _binary_net(seed=0, **output):
    from sparkavg.nn import Adam
    return Network((1, 4, 4), [Dense(8, activation="relu"), Output(1, loss="bce", **output)],
                   updater=Adam(lr=0.02), seed=seed)


@pytest.mark.slow
def test_a_binary_classifier_trains_on_spark_from_rdd_and_dataframe(spark):
    from sparkavg.evaluation import ROC, Evaluation
    from sparkavg.spark import ParameterAveraging, SparkTrainer

    from .nets import blobs
    x, y = blobs(256, seed=4)
    rdd = spark.sparkContext.parallelize(list(zip(x, y.astype(np.float64))), 2)
    net = _binary_net()
    trainer = SparkTrainer(spark, net, ParameterAveraging(batch_size_per_worker=16, averaging_frequency=2))
    trainer.fit(rdd, epochs=3)
    ev = trainer.evaluate(rdd)
    assert isinstance(ev, Evaluation) and ev.num_classes == 2 and ev.count == 256
    assert ev.accuracy() > 0.95
    roc = trainer.evaluate(rdd, [ROC(2)])[0]
    assert roc.auc() > 0.98
    df = spark.createDataFrame([(row.reshape(-1).tolist(), float(label)) for row, label in zip(x, y)],
                               ["features", "label"])
    again = SparkTrainer(spark, _binary_net(seed=1), ParameterAveraging(batch_size_per_worker=16))
    history = again.fit(df, epochs=2, validation_data=df, metrics=["auc", "log_loss"])
    assert again.evaluate(df).accuracy() > 0.9
    last = history.history[-1]
    assert last["val_auc"] > 0.98 and 0 < last["val_log_loss"] < 0.5 and last["val_accuracy"] > 0.9


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:The y_prob values do not sum to one")
def test_a_binary_estimators_output_is_read_by_sparks_binary_evaluator(spark):
    from pyspark.ml.evaluation import BinaryClassificationEvaluator
    from sklearn.metrics import roc_auc_score

    from sparkavg.ml import NetworkEstimator
    from sparkavg.spark import ParameterAveraging

    from .nets import blobs
    x, y = blobs(128, seed=9)
    x[::5] *= -1  # some mistakes
    df = spark.createDataFrame([(i, row.reshape(-1).tolist(), float(label)) for i, (row, label) in
                                enumerate(zip(x, y))], "id long, features array<float>, label double")
    est = NetworkEstimator(network=_binary_net(seed=2, class_weights=(1.0, 2.0)),
                           master=ParameterAveraging(batch_size_per_worker=16), epochs=2)
    out = est.fit(df).transform(df)
    rows = sorted(out.select("id", "label", "prediction", "probability").collect())
    p = np.array([r.probability[1] for r in rows])
    np.testing.assert_allclose([r.probability[0] for r in rows], 1 - p, rtol=1e-6)
    np.testing.assert_array_equal([r.prediction for r in rows], (p > 0.5).astype(float))
    auc = BinaryClassificationEvaluator().evaluate(out)
    assert auc == pytest.approx(roc_auc_score([r.label for r in rows], p), rel=1e-6)


def test_a_label_outside_zero_one_is_refused_with_its_row(spark):
    from sparkavg.data.validation import DataValidationError
    from sparkavg.spark import ParameterAveraging, SparkTrainer

    from .nets import blobs
    x, y = blobs(32, seed=4)
    labels = y.astype(np.float64)
    labels[7] = 2.0
    rdd = spark.sparkContext.parallelize(list(zip(x, labels)), 1)
    trainer = SparkTrainer(spark, _binary_net(), ParameterAveraging(batch_size_per_worker=8))
    with pytest.raises(DataValidationError, match=r"row 7.*expected a label in \[0, 1\], got 2.0"):
        trainer.fit(rdd, epochs=1)


# ------------------------------------------------------------ TorchModel
@pytest.mark.parametrize("loss, kwargs, labels", [
    ("bce", {}, lambda rng: rng.integers(0, 2, (6, 3)).astype(np.float32)),
    ("bce", {"class_weights": (0.5, 3.0)}, lambda rng: rng.integers(0, 2, (6, 3)).astype(np.float32)),
    ("cross_entropy", {"class_weights": (1.0, 0.25, 2.0)}, lambda rng: rng.integers(0, 3, 6)),
    ("mae", {}, lambda rng: rng.standard_normal((6, 3)).astype(np.float32)),
    ("huber", {"huber_delta": 0.5}, lambda rng: 3 * rng.standard_normal((6, 3)).astype(np.float32)),
])
def test_torch_losses_equal_the_native_engines_formulas(loss, kwargs, labels):
    pytest.importorskip("torch")
    from sparkavg.nn.losses import bce_terms, regression_terms, softplus
    from sparkavg.torch import TorchModel

    model = TorchModel("tests.torch_models:mlp", loss=loss, input_shape=(16,), dtype="float64",
                       factory_kwargs={"inputs": 16, "hidden": 8, "outputs": 3}, **kwargs)
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((6, 16)), labels(rng)
    weights = rng.random(6)
    z = np.concatenate([model._array(out) for _, out in model._chunks(x)])
    if loss == "bce":
        a, b = bce_terms(y.astype(np.float64), model.class_weights, np.dtype(np.float64))
        elements = a * softplus(-z, np) + b * softplus(z, np)
    elif loss == "cross_entropy":
        logp = z - z.max(axis=1, keepdims=True)
        logp -= np.log(np.exp(logp).sum(axis=1, keepdims=True))
        elements = -logp[np.arange(6), y] * np.asarray(model.class_weights)[y]
    else:
        elements, _ = regression_terms(loss, z - y, np, model.huber_delta)
    mean = elements.sum() / (6 if loss == "cross_entropy" else elements.size)
    assert model.score(x, y) - model.flat.penalty() == pytest.approx(mean, rel=1e-10)
    weighted = (elements * (weights if elements.ndim == 1 else weights[:, None])).sum() / (
        6 if loss == "cross_entropy" else elements.size)
    assert float(model._loss_of(model._chunks(x).__next__()[1], model._targets(y, 6, weights))) == \
        pytest.approx(weighted, rel=1e-10)
    if loss == "bce":
        np.testing.assert_allclose(model.output(x), 1 / (1 + np.exp(-z)), rtol=1e-12)
    again = model_from_config(model.to_config())
    assert again.to_config() == model.to_config()


def test_torch_class_weights_are_checked_against_its_outputs():
    pytest.importorskip("torch")
    from sparkavg.torch import TorchModel

    with pytest.raises(ValueError, match=r"one weight per class \(2\)"):
        TorchModel("tests.torch_models:mlp", input_shape=(16,), class_weights=(1.0, 2.0, 3.0))
    with pytest.raises(ValueError, match="class_weights only with a built-in loss"):
        TorchModel("tests.torch_models:mlp", loss="tests.torch_models:huber", targets="values", input_shape=(16,),
                   class_weights=(1.0, 2.0))


# ------------------------------------------------------------ row weights
def _numeric_gradient(net, x, y, weights):
    """Central differences of the weighted loss, every parameter."""
    return parameter_central(net, lambda: net.gradient(x, y, weights)[0])


@pytest.mark.parametrize("units, output, y", [
    (3, dict(loss="nll", class_weights=(1.0, 0.5, 2.0)), np.array([0, 1, 2, 2, 1, 0])),
    (3, dict(loss="nll"), np.random.default_rng(5).dirichlet(np.ones(3), 6)),
    (1, dict(loss="bce", class_weights=(0.5, 2.0)), np.array([0, 1, 1, 0, 1, 0.0])),
    (2, dict(loss="huber"), 2 * np.random.default_rng(6).standard_normal((6, 2))),
    (2, dict(loss="mse"), np.random.default_rng(7).standard_normal((6, 2))),
])
def test_row_weights_pass_a_gradient_check_and_scale_each_rows_loss(units, output, y):
    net = _net(units, **output)
    x, w = _x(), np.array([0.0, 1.0, 2.5, 0.5, 1.0, 3.0])
    loss, grad = net.gradient(x, y, w)
    np.testing.assert_allclose(grad, _numeric_gradient(net, x, y, w), rtol=1e-5, atol=1e-8)
    per_row = np.array([net.gradient(x[i:i + 1], y[i:i + 1])[0] - net.flat.penalty() for i in range(6)])
    assert loss - net.flat.penalty() == pytest.approx(np.mean(per_row * w), rel=1e-10)


def test_unit_weights_train_bit_identically_to_none():
    x, y = _x(32, seed=2), np.random.default_rng(2).integers(0, 3, 32)
    plain, weighted = _net(3), _net(3)
    plain.fit(x, y, batch_size=8, epochs=2)
    weighted.fit(x, y, batch_size=8, epochs=2, weights=np.ones(32))
    np.testing.assert_array_equal(plain.params, weighted.params)


def test_torch_row_weights_equal_the_engines():
    pytest.importorskip("torch")
    from sparkavg.torch import TorchModel

    x, y, w = np.random.default_rng(0).standard_normal((6, 16)), np.array([0, 1, 1, 0, 1, 0]), np.arange(6.0)
    model = TorchModel("tests.torch_models:mlp", input_shape=(16,), dtype="float64")
    loss, grad = model.gradient(x, y, w)
    per_row = np.array([model.gradient(x[i:i + 1], y[i:i + 1])[0] for i in range(6)])
    assert loss == pytest.approx(np.mean(per_row * w), rel=1e-10)
    rows = [model.gradient(x[i:i + 1], y[i:i + 1])[1] for i in range(6)]
    np.testing.assert_allclose(grad, sum(g * wi for g, wi in zip(rows, w)) / 6, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("weights, message", [
    (np.array([1.0, -1.0, 1, 1, 1, 1]), "finite and >= 0"),
    (np.array([1.0, np.nan, 1, 1, 1, 1]), "finite and >= 0"),
    (np.ones(5), r"one weight per example, shape \(6,\), got \(5,\)"),
])
def test_bad_row_weights_are_named(weights, message):
    with pytest.raises(ValueError, match=message):
        _net(3).fit_batch(_x(), np.zeros(6, np.int64), weights=weights)


def test_a_binary_output_predicts_at_the_half_threshold():
    net = _net(1, loss="bce")
    x = _x(20, seed=8)
    p = net.output(x)[:, 0]
    np.testing.assert_array_equal(net.predict(x), (p > 0.5).astype(p.dtype))
    regression = _net(2, loss="mae")
    np.testing.assert_array_equal(regression.predict(x), regression.output(x)[:, 0])
