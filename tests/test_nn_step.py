"""The training step's fast paths: a step equals the textbook formulas,
work buffers are reused and never leak between batch sizes, fit_batch's
direct path equals compute_update + apply_update, the L2 ranges, and the
allocation-free activations equal the formulas they replaced."""
from __future__ import annotations

import numpy as np
import pytest

from sparkavg.nn import (
    SGD,
    Adam,
    Conv2D,
    Dense,
    MaxPool2D,
    Nadam,
    Nesterov,
    Network,
    Output,
    activations,
)
from sparkavg.nn.regularization import Regularization

ALPHA = activations.LEAKY_RELU_ALPHA


def mlp(dtype="float64", l2=1e-3, l2_bias=0.0, weight_decay=0.0, updater=None, seed=3):
    """A small MnistMLP: leaky ReLU, Nesterov, L2 (as DL4J's example)."""
    layers = [Dense(7, activation="leaky_relu"), Dense(5, activation="leaky_relu"), Output(4)]
    return Network((6,), layers, updater=updater or Nesterov(0.05, 0.9), l2=l2, l2_bias=l2_bias,
                   weight_decay=weight_decay, dtype=dtype, seed=seed)


def convnet(updater=None, dtype="float32", seed=5, **kw):
    layers = [Conv2D(3, 3, activation="relu"), MaxPool2D(2), Dense(6, activation="tanh"), Output(4)]
    return Network((1, 8, 8), layers, updater=updater or Adam(1e-2), dtype=dtype, seed=seed, **kw)


def data(n, shape=(6,), classes=4, seed=0, dtype=np.float64):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, *shape)).astype(dtype), rng.integers(0, classes, n)


# ------------------------------------------------------------- reference
def reference_step(net, x, y, velocity):
    """One MLP step from the formulas, in float64 numpy: forward, softmax
    NLL + 0.5*l2*|W|^2 + 0.5*l2_bias*|b|^2, back-propagation, L2 added to
    the gradient, DL4J Nesterov, decoupled weight decay.  Returns (loss,
    update, new velocity)."""
    Ws = [layer.W.astype(np.float64) for layer in net.layers]
    bs = [layer.b.astype(np.float64) for layer in net.layers]
    n = x.shape[0]
    hs, zs = [x], []
    for i, (W, b) in enumerate(zip(Ws, bs)):
        z = hs[-1] @ W + b
        zs.append(z)
        hs.append(np.where(z > 0, z, ALPHA * z) if i < len(Ws) - 1 else z)
    logits = zs[-1]
    logp = logits - logits.max(axis=1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(axis=1, keepdims=True))
    loss = -logp[np.arange(n), y].mean()
    loss += sum(0.5 * net.l2 * (W * W).sum() + 0.5 * net.l2_bias * (b * b).sum() for W, b in zip(Ws, bs))
    onehot = np.eye(Ws[-1].shape[1])[y]
    dz = (np.exp(logp) - onehot) / n
    grads = []
    for i in range(len(Ws) - 1, -1, -1):
        grads.append((hs[i].T @ dz + net.l2 * Ws[i], dz.sum(axis=0) + net.l2_bias * bs[i]))
        if i:
            dz = (dz @ Ws[i].T) * np.where(zs[i - 1] > 0, 1.0, ALPHA)
    flat_g = np.concatenate([a.ravel() for pair in reversed(grads) for a in pair])
    flat_p = np.concatenate([a.ravel() for pair in zip(Ws, bs) for a in pair])
    lr, mu = net.updater.lr, net.updater.momentum
    v_new = mu * velocity - lr * flat_g
    update = -mu * velocity + (1 + mu) * v_new
    weights = np.concatenate([np.r_[np.ones(W.size, bool), np.zeros(b.size, bool)] for W, b in zip(Ws, bs)])
    update -= lr * net.weight_decay * np.where(weights, flat_p, 0.0)
    return loss, update, v_new


@pytest.mark.parametrize("l2,l2_bias,weight_decay", [(1e-3, 0.0, 0.0), (1e-3, 1e-3, 0.0), (2e-3, 5e-4, 1e-2)])
def test_step_equals_reference_formulas(l2, l2_bias, weight_decay):
    net = mlp(l2=l2, l2_bias=l2_bias, weight_decay=weight_decay)
    velocity = np.zeros(net.num_params)
    out = np.empty(net.num_params)
    for step in range(3):
        x, y = data(5, seed=step)
        loss, update, velocity = reference_step(net, x, y, velocity)
        got = net.compute_update(x, y, out)
        assert got == pytest.approx(loss, rel=1e-12), f"loss of step {step}"
        np.testing.assert_allclose(out, update, rtol=1e-10, atol=1e-15, err_msg=f"update of step {step}")
        np.testing.assert_allclose(net.updater_state, velocity, rtol=1e-10, atol=1e-15)
        net.apply_update(out)


def test_float32_step_within_rounding_of_reference():
    net = mlp(dtype="float32", l2=1e-3, l2_bias=1e-4)
    x, y = data(16, seed=1, dtype=np.float32)
    loss, update, _ = reference_step(net, x.astype(np.float64), y, np.zeros(net.num_params))
    out = np.empty(net.num_params, np.float32)
    assert net.compute_update(x, y, out) == pytest.approx(loss, rel=1e-5)
    np.testing.assert_allclose(out, update, rtol=2e-4, atol=1e-7)


# ----------------------------------------------------------- fit_batch
@pytest.mark.parametrize("updater", [SGD(0.05), Nesterov(0.05), Adam(1e-2), Nadam(1e-2)])
def test_fit_batch_direct_path_equals_compute_update_plus_apply_update_exactly(updater):
    a = convnet(updater, l2=1e-3, l2_bias=1e-4)  # no weight decay: the updater adds to params directly
    b = a.clone()
    out = np.empty(a.num_params, np.float32)
    for s in range(3):
        x, y = data(5, shape=(64,), seed=s, dtype=np.float32)
        assert a.fit_batch(x, y) == b.compute_update(x, y, out)
        b.apply_update(out)
    assert np.array_equal(a.params, b.params)
    assert np.array_equal(a.updater_state, b.updater_state)


def test_fit_batch_loss_is_the_loss_before_the_step():
    net = mlp(l2=1e-2, l2_bias=1e-3)
    x, y = data(6)
    before = net.score(x, y)  # no dropout: training and inference losses agree
    p0 = net.params.copy()
    assert net.fit_batch(x, y) == pytest.approx(before, rel=1e-12)
    assert not np.array_equal(net.params, p0)


# ------------------------------------------------------------- buffers
def _work_buffers(net):
    return {(i, key): id(buf) for i, layer in enumerate(net.layers) for key, buf in layer._ws.items()}


def test_work_buffers_are_reused_across_steps_of_one_batch_size():
    net = convnet()
    x, y = data(8, shape=(64,), dtype=np.float32)
    net.fit_batch(x, y)
    first = _work_buffers(net)
    assert first, "layers keep no work buffers: the check is vacuous"
    for _ in range(3):
        net.fit_batch(x, y)
    assert _work_buffers(net) == first


def test_batch_size_changes_give_the_same_results_as_a_fresh_network():
    seen = convnet()
    fresh = seen.clone()
    small_x, small_y = data(3, shape=(64,), seed=1, dtype=np.float32)
    seen.gradient(small_x, small_y)  # fills buffers of another batch size
    x, y = data(8, shape=(64,), seed=2, dtype=np.float32)
    loss_seen, grad_seen = seen.gradient(x, y)
    loss_fresh, grad_fresh = fresh.gradient(x, y)
    assert loss_seen == loss_fresh
    assert np.array_equal(grad_seen, grad_fresh)
    # ... and back to the small batch: the same as its first time.
    again = seen.gradient(small_x, small_y)
    first = fresh.clone().gradient(small_x, small_y)
    assert again[0] == first[0] and np.array_equal(again[1], first[1])


def test_strided_input_to_a_conv_layer_gives_the_contiguous_result():
    net = convnet()
    conv = net.layers[0]
    x = np.random.default_rng(0).random((4, 8, 16, 1), dtype=np.float32)
    strided = x[:, :, ::2]
    assert not strided.flags.c_contiguous
    expect = conv.forward(np.ascontiguousarray(strided), True).copy()
    np.testing.assert_array_equal(conv.forward(strided, True), expect)


# ---------------------------------------------------------- regularization
def test_l2_ranges_merge_equal_coefficients_and_skip_zeros():
    net = mlp(l2=1e-3, l2_bias=0.0, weight_decay=1e-2)
    segs = net.param_segments
    reg = Regularization(segs, 1e-3, 0.0, 1e-2)
    assert reg.l2_ranges == tuple((s.start, s.stop, 1e-3) for s in segs if s.regularized)
    assert reg.decay_ranges == tuple((s.start, s.stop) for s in segs if s.regularized)
    same = Regularization(segs, 1e-3, 1e-3, 0.0)
    assert same.l2_ranges == ((0, net.num_params, 1e-3),) and same.decay_ranges == ()
    assert Regularization(segs, 0.0, 0.0, 0.0).l2_ranges == ()


def test_penalty_and_l2_gradient_equal_the_per_segment_sums():
    net = mlp(l2=1e-3, l2_bias=1e-4)
    reg = Regularization(net.param_segments, net.l2, net.l2_bias, 0.0)
    p = net.params
    expect = sum(0.5 * (net.l2 if s.regularized else net.l2_bias) * float(p[s.start:s.stop] @ p[s.start:s.stop])
                 for s in net.param_segments)
    assert reg.penalty(reg.penalty_terms(p)) == pytest.approx(expect, rel=1e-12)
    grads = np.zeros_like(p)
    reg.add_gradient(grads, p)
    coeff = np.concatenate([np.full(s.stop - s.start, net.l2 if s.regularized else net.l2_bias)
                            for s in net.param_segments])
    np.testing.assert_array_equal(grads, coeff * p)


def test_reassigned_l2_takes_effect():
    net = mlp(l2=0.0)
    x, y = data(4)
    net.gradient(x, y)
    net.l2 = 0.5
    loss, _ = net.gradient(x, y)
    assert loss == pytest.approx(net.score(x, y), rel=1e-12)
    assert net.score(x, y) > mlp(l2=0.0).score(x, y)


# ------------------------------------------------------------ activations
def _old_forward(name, z):
    """The formulas the allocation-free activations replaced."""
    if name == "leaky_relu":
        return z * np.where(z > 0, 1.0, ALPHA).astype(z.dtype)
    return activations.forward(name, z.copy())


def _old_backward(name, dy, y):
    one = dy.dtype.type(1.0)
    if name == "leaky_relu":
        return dy * np.where(y > 0, 1.0, ALPHA).astype(dy.dtype)
    if name == "tanh":
        return dy * (one - y * y)
    return dy * (y * (one - y))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", sorted(activations.NEEDS_WORK))
def test_activations_with_work_equal_the_old_formulas_bit_for_bit(name, dtype):
    rng = np.random.default_rng(4)
    z = (rng.standard_normal((16, 33)) * 3).astype(dtype)
    z[0, :4] = [0.0, -0.0, np.nan, -np.inf]
    dy = rng.standard_normal(z.shape).astype(dtype)
    y = activations.forward(name, z.copy(), np.empty_like(z))
    np.testing.assert_array_equal(y, _old_forward(name, z))
    np.testing.assert_array_equal(activations.forward(name, z.copy()), y)  # work=None allocates
    expect = _old_backward(name, dy, y)
    np.testing.assert_array_equal(activations.backward(name, dy.copy(), y, np.empty_like(dy)), expect)
    np.testing.assert_array_equal(activations.backward(name, dy.copy(), y), expect)


@pytest.mark.parametrize("weight_decay", [0.0, 1e-2])
def test_unsynced_loss_on_the_host_is_the_same_float(weight_decay):
    from sparkavg.spark.executor.context import LossSum

    a, b = mlp(weight_decay=weight_decay), mlp(weight_decay=weight_decay)
    out = np.empty(a.num_params)
    total, expected = LossSum(), 0.0
    for step in range(3):
        x, y = data(4 + step, seed=step)
        want, got = a.fit_batch(x, y), b.fit_batch(x, y, sync=False)
        assert isinstance(got, float) and got == want  # numpy networks always give a float
        assert b.compute_update(x, y, out, sync=False) == a.compute_update(x, y, out)
        total.add(got, len(x))
        expected += want * len(x)
    np.testing.assert_array_equal(a.params, b.params)
    assert total.value() == expected


# -------------------------------------------------------------------- GPU
@pytest.mark.gpu
@pytest.mark.parametrize("weight_decay", [0.0, 1e-2])
def test_gpu_step_matches_cpu_with_leaky_relu_l2_and_work_buffers(weight_decay):
    from sparkavg import backend

    cpu = mlp(l2=1e-3, l2_bias=1e-4, weight_decay=weight_decay)
    gpu = cpu.clone().to_gpu()
    out_cpu = np.empty(cpu.num_params)
    out_gpu = gpu.xp.empty(gpu.num_params, dtype=gpu.dtype)
    for step in range(3):
        x, y = data(5 + step, seed=step)  # batch sizes change: buffers of every size
        assert gpu.fit_batch(x, y) == pytest.approx(cpu.fit_batch(x, y), rel=1e-9)
        lc, lg = cpu.compute_update(x, y, out_cpu), gpu.compute_update(x, y, out_gpu)
        assert lg == pytest.approx(lc, rel=1e-9)
        np.testing.assert_allclose(backend.to_cpu(out_gpu), out_cpu, rtol=1e-9, atol=1e-13)
    np.testing.assert_allclose(backend.to_cpu(gpu.params), cpu.params, rtol=1e-9, atol=1e-13)
    np.testing.assert_allclose(backend.to_cpu(gpu.updater_state), cpu.updater_state, rtol=1e-9, atol=1e-13)


@pytest.mark.gpu
def test_gpu_convnet_float32_step_matches_cpu():
    from sparkavg import backend

    cpu = convnet(Adam(1e-2), l2=1e-3)
    gpu = cpu.clone().to_gpu()
    for step in range(3):
        x, y = data(6, shape=(64,), seed=step, dtype=np.float32)
        assert gpu.fit_batch(x, y) == pytest.approx(cpu.fit_batch(x, y), rel=1e-5)
    np.testing.assert_allclose(backend.to_cpu(gpu.params), cpu.params, rtol=1e-4, atol=1e-5)


@pytest.mark.gpu
def test_gpu_unsynced_loss_stays_on_the_device_and_sums_to_the_synced_losses():
    from sparkavg import backend
    from sparkavg.spark.executor.context import LossSum

    a = mlp(l2=1e-3, weight_decay=1e-2).to_gpu()
    b = a.clone()
    total, want = LossSum(), 0.0
    for step in range(3):
        x, y = data(5, seed=step)
        loss = b.fit_batch(x, y, sync=False)
        assert backend.is_gpu_array(loss) and loss.ndim == 0
        expected = a.fit_batch(x, y)
        assert float(loss) == pytest.approx(expected, rel=1e-12)
        total.add(loss, len(x))
        want += expected * len(x)
    assert total.value() == pytest.approx(want, rel=1e-12)


def test_averaged_adam_state_corrected_to_the_combined_batch_second_moment():
    """Two Adam workers fit F steps of their own B-example gradients from one
    state; the plain mean of their v over-counts the gradient noise against one
    process fitting the mean of each step's two gradients (2 B examples);
    ``correct_second_moment`` recovers that process's v from the spread of
    the workers' m, and takes off at most half of what the round added."""
    from sparkavg.nn import SGD, Adam
    from sparkavg.averaging.merge import block_squares
    from sparkavg.spark.policies.moments import correct_second_moment

    rng = np.random.default_rng(0)
    n, steps, mu, sigma = 100_000, 32, 5e-4, 2e-3
    adam = Adam(lr=1e-3)
    sent = np.concatenate([np.zeros(n), np.full(n, 3e-6)]).astype(np.float32)
    workers = [sent.copy(), sent.copy()]
    one = sent.copy()
    update = np.zeros(n, dtype=np.float32)
    for t in range(steps):
        grads = [(mu + sigma * rng.standard_normal(n)).astype(np.float32) for _ in workers]
        for state, g in zip(workers, grads):
            adam.apply(update, g, state, 100 + t)
        adam.apply(update, ((grads[0] + grads[1]) / 2).astype(np.float32), one, 100 + t)
    state = (workers[0].astype(np.float64) + workers[1]) / 2
    plain = state.copy()
    whole, halves = [(0, n)], [(0, n // 2), (n // 2, n)]
    m_sq = (block_squares(workers[0][:n], whole) + block_squares(workers[1][:n], whole)) / 2  # what workers send
    correct_second_moment(adam, state, m_sq, sent.astype(np.float64), 2, steps, whole)

    def added(v):  # what the round wrote into v, summed over the coordinates
        return float((v[n:] - adam.beta2 ** steps * sent[n:]).sum())

    assert added(plain) / added(one) > 1.5  # the plain mean: noise of B-example gradients
    assert added(state) / added(one) == pytest.approx(1.0, abs=0.03)
    np.testing.assert_array_equal(state[:n], plain[:n])  # m stays the mean
    assert (state[n:] >= plain[n:] - 0.5 * (plain[n:] - adam.beta2 ** steps * sent[n:]) - 1e-15).all()
    # per block: a block of pure noise keeps half its round's share, one without spread all of it
    blocks = plain.copy()
    m_sq_blocks = (block_squares(workers[0][:n], halves) + block_squares(workers[1][:n], halves)) / 2
    m_sq_blocks[1] = block_squares(plain[:n], halves)[1]  # no spread in the second block
    correct_second_moment(adam, blocks, m_sq_blocks, sent.astype(np.float64), 2, steps, halves)
    np.testing.assert_array_equal(blocks[n + n // 2:], plain[n + n // 2:])
    assert (blocks[n:n + n // 2] < plain[n:n + n // 2]).all()
    # a spread far beyond noise (replicas drifted apart): at most 1 - 1/K of the round's share comes off
    capped = plain.copy()
    correct_second_moment(adam, capped, m_sq + n, sent.astype(np.float64), 2, steps, whole)
    np.testing.assert_allclose(added(capped), added(plain) / 2, rtol=1e-6)
    # nothing to correct with one worker, or for an updater without a first moment
    alone = plain.copy()
    correct_second_moment(adam, alone, m_sq, sent.astype(np.float64), 1, steps, whole)
    np.testing.assert_array_equal(alone, plain)
    assert SGD(lr=0.1).slot("first_moment", n) is None and adam.slot("first_moment", n) == slice(0, n)
    assert adam.slot("second_moment", n) == slice(n, 2 * n)
    sgd_state = plain[:n].copy()
    correct_second_moment(SGD(lr=0.1), sgd_state, m_sq, sent[:n].astype(np.float64), 2, steps, whole)
    with pytest.raises(ValueError, match="one sum of squared first moments per block"):
        correct_second_moment(adam, plain.copy(), m_sq, sent.astype(np.float64), 2, steps, halves)
    np.testing.assert_array_equal(sgd_state, plain[:n])
