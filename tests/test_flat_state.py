"""The flat state every model holds (``nn/flatstate.py``) and the provider
interface a model implements over it (``nn/flat.py``): the core trains
whatever binds to it -- a bare provider, a new kind of model of a few
methods -- with the values worked out by hand, and Network, Graph and
TorchModel each hold one without copying any of it."""
import numpy as np
import pytest

from sparkavg.nn import Dense, Graph, Model, Network, Output
from sparkavg.nn.clipping import ClipGlobalNorm
from sparkavg.nn.flat import FlatModel
from sparkavg.nn.flatstate import FlatState, segments_of
from sparkavg.nn.model import InputSpec, ModelSpec, OutputSpec
from sparkavg.nn.schedules import StepSchedule
from sparkavg.nn.updaters import SGD

D, K = 3, 2


class LeastSquares:
    """A provider that is not a model: ``0.5 * |x W + b - y|^2`` per example,
    its arrays views of the core's vectors."""

    def _bind_flat(self, flat):
        self.flat = flat
        self.W, self.b = flat.params[:D * K].reshape(D, K), flat.params[D * K:]
        self.dW, self.db = flat.grads[:D * K].reshape(D, K), flat.grads[D * K:]

    def _loss_terms(self, x, y):
        r = x @ self.W + self.b - y
        self.dW[...] = x.T @ r / len(x)
        self.db[...] = r.sum(axis=0) / len(x)
        return [(1.0, 0.5 * float((r * r).sum()), len(x))]

    def _step_work(self):
        return 0, 0

    def _has_lazy_rows(self):
        return False

    def _touched_rows(self):
        return []


def _layout():
    segments, size = segments_of([[("W", (D, K), True), ("b", (K,), False)]])
    assert size == D * K + K and [s.stop for s in segments] == [D * K, size]
    return segments


def _core(**training):
    flat = FlatState(_layout(), [], dtype="float64", **training)
    flat.params[...] = np.linspace(-1.0, 1.0, flat.num_params)
    provider = LeastSquares()
    provider._bind_flat(flat)
    return flat, provider


def _batch(seed=0, n=8):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, D)), rng.normal(size=(n, K))


def _loss_gradient(params, x, y):
    """(loss, flat gradient) of ``0.5 * |x W + b - y|^2`` per example, written out."""
    W, b = params[:D * K].reshape(D, K), params[D * K:]
    r = x @ W + b - y
    return 0.5 * (r * r).sum() / len(x), np.concatenate([(x.T @ r / len(x)).ravel(), r.sum(axis=0) / len(x)])


def _by_hand(params, x, y, lr, l2, l2_bias, weight_decay=0.0):
    """(loss, update) of one SGD step with L2 and weight decay, written out."""
    loss, grad = _loss_gradient(params, x, y)
    weights = np.arange(params.size) < D * K
    coefficient = np.where(weights, l2, l2_bias)
    loss += 0.5 * (coefficient * params * params).sum()
    return loss, -lr * (grad + coefficient * params) - lr * weight_decay * weights * params


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])  # the direct step, and the one through the update buffer
def test_the_core_steps_a_bare_provider_as_written_out(weight_decay):
    flat, provider = _core(updater=SGD(lr=0.1), l2=0.01, l2_bias=0.02, weight_decay=weight_decay)
    x, y = _batch()
    before = flat.params.copy()
    loss, update = _by_hand(before, x, y, 0.1, 0.01, 0.02, weight_decay)
    assert flat.fit_batch(provider, x, y) == pytest.approx(loss, rel=1e-12)
    np.testing.assert_allclose(flat.params, before + update, rtol=1e-12, atol=1e-15)
    assert flat.iteration == 1


def test_the_core_follows_a_schedule_and_normalises_the_loss_gradient_before_l2():
    flat, provider = _core(updater=SGD(lr=StepSchedule(0.2, 0.5, 1)), l2=0.5,
                           gradient_normalization=ClipGlobalNorm(1e-3))
    x, y = _batch(seed=1)
    params = flat.params.copy()
    _, grad = _loss_gradient(params, x, y)
    assert np.linalg.norm(grad) > 1e-2  # the clip acts
    l2_grad = 0.5 * (np.arange(params.size) < D * K) * params
    np.testing.assert_allclose(flat.gradient(provider, x, y)[1], grad + l2_grad, rtol=1e-12)  # raw outside a step
    out = np.zeros(flat.num_params)
    flat.compute_update(provider, x, y, out)  # iteration 0: rate 0.2
    np.testing.assert_allclose(out, -0.2 * (grad * 1e-3 / np.linalg.norm(grad) + l2_grad), rtol=1e-10)
    assert flat.step_updater().lr == pytest.approx(0.1)  # iteration 1: halved


def test_fit_batch_is_compute_update_then_apply_update_bit_for_bit():
    a, pa = _core(updater=SGD(lr=0.05), l2=0.01)
    b, pb = _core(updater=SGD(lr=0.05), l2=0.01)
    out = np.zeros(b.num_params)
    for seed in range(3):
        x, y = _batch(seed)
        assert a.fit_batch(pa, x, y) == b.compute_update(pb, x, y, out)
        b.apply_update(out)
    np.testing.assert_array_equal(a.params, b.params)
    with pytest.raises(ValueError, match=r"out of shape \(8,\)"):
        b.compute_update(pb, x, y, np.zeros(3))


class Linear(FlatModel):
    """A new kind of model: the provider hooks and the contract's few
    model-specific members, nothing of the flat state copied."""

    def __init__(self, updater=None, l2=0.0, seed=0):
        flat = FlatState(_layout(), [], updater=updater, l2=l2, seed=seed, dtype="float64")
        flat.params[...] = np.random.default_rng(seed).normal(size=flat.num_params)
        self._provider = LeastSquares()
        self._compose(flat)

    def _bind_flat(self, flat):
        self._provider._bind_flat(flat)

    def _loss_terms(self, x, y):
        return self._provider._loss_terms(x, y)

    @property
    def spec(self):
        return ModelSpec((InputSpec("input", (D,)),), (OutputSpec("output", K, "mse"),))

    def output(self, x):
        return x @ self._provider.W + self._provider.b

    def score(self, x, y):
        r = self.output(x) - y
        return 0.5 * float((r * r).sum()) / len(x) + self.flat.penalty()

    def config_arguments(self):
        return {"updater": self.updater, "l2": self.l2, "seed": self.seed}


def test_a_new_kind_of_model_is_its_provider_hooks_and_the_contract_follows():
    model = Linear(updater=SGD(lr=0.1), l2=0.01, seed=4)
    assert isinstance(model, Model)
    x, y = _batch(seed=2)
    before = model.params.copy()
    loss, update = _by_hand(before, x, y, 0.1, 0.01, 0.0)
    assert model.score(x, y) == pytest.approx(loss, rel=1e-12)
    assert model.fit(x, y, batch_size=len(x), shuffle=False) == [pytest.approx(loss, rel=1e-12)]
    np.testing.assert_allclose(model.params, before + update, rtol=1e-12, atol=1e-15)
    assert (model.iteration, model.epoch) == (1, 1)
    model.load_state({"params": before})  # the provider's views see what is loaded
    np.testing.assert_array_equal(model.output(x), x @ before[:D * K].reshape(D, K) + before[D * K:])
    model.updater = SGD(lr=0.5)  # what a divergence recovery does: it reaches the core
    assert model.flat.step_updater() is model.updater


def _torch_model():
    pytest.importorskip("torch")
    from sparkavg.torch import TorchModel

    return TorchModel("tests.torch_models:conv_bn", input_shape=(1, 4, 4), seed=3)


def test_every_model_holds_one_flat_state_and_keeps_none_of_it_itself():
    network = Network((4,), [Dense(5), Output(2)], seed=1)
    graph = Graph({"a": (4,)}, [("h", Dense(5), "a"), ("out", Output(2), "h")], ["out"], seed=1)
    torch_model = _torch_model()
    for model in (network, graph, torch_model):
        assert isinstance(model.flat, FlatState) and isinstance(model, Model)
        assert model.params is model.flat.params and model.updater_state is model.flat.updater_state
        assert model.state["buffers"] is model.flat.buffers
        kept = set(vars(model)) & set(vars(model.flat))
        assert not kept, f"{type(model).__name__} keeps {sorted(kept)} of its flat state itself"
    assert not hasattr(torch_model, "layers")  # the module is the model; no sparkavg layers stand in
    assert torch_model.buffers.size > 0 and len(torch_model.buffer_segments) == 3
