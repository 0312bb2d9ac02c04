"""LSTM, GRU, Embedding and Conv1D, standalone and in models (no Spark):
float64 central-difference gradient checks of the input and every
parameter (masks included), LSTM/GRU against a plain per-step numpy
implementation and (when importable) torch.nn.LSTM / GRU / Conv1d /
Embedding with copied weights, masking semantics, id checks, config round
trips, argument and build errors, a two-input Graph that trains, and
(marked ``gpu``) CuPy against numpy."""
from __future__ import annotations

import math

import numpy as np
import pytest

from sparkavg import backend
from sparkavg.configurable import from_config
from sparkavg.nn import (GRU, LSTM, Adam, Conv1D, Dense, Embedding, GlobalAvgPool, Graph, Merge, Network, Output,
                         Reshape, model_from_json)

from .gradients import central, parameter_central, relative_error

try:
    import torch
except ImportError:  # the comparisons with PyTorch need it; nothing else does
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")

MAX_REL_ERROR = 1e-6


def bound(layer, input_shape, dtype=np.float64, seed=0, noise=0.3):
    """Build ``layer`` and bind fresh flat params / grads (initial values plus noise)."""
    layer.build(input_shape)
    rng = np.random.default_rng(seed)
    pieces = [layer.initial_value(s, rng) + noise * rng.standard_normal(s.shape) for s in layer.param_specs()]
    params = np.concatenate([p.ravel() for p in pieces]).astype(dtype)
    grads = np.zeros_like(params)
    assert params.size == sum(math.prod(s.shape) for s in layer.param_specs())
    layer.bind(params, grads)
    return params, grads


def check_gradients(layer, input_shape, x, check_dx=True, dx_where=None, seed=1):
    """loss = sum(R * forward(x)): back-propagated dL/dx (entries ``dx_where``)
    and dL/dparams against central differences; need_dx=False gives the same
    parameter gradients.  Returns the analytic dx."""
    params, grads = bound(layer, input_shape, seed=seed)
    rng = np.random.default_rng(seed + 1)
    R = rng.standard_normal(layer.forward(x, True).shape)

    def loss():
        return float(np.sum(R * layer.forward(x, True)))

    loss()
    dx = layer.backward(R.copy(), need_dx=True)
    dx = None if dx is None else dx.copy()
    dparams = grads.copy()
    numeric = central(loss, params)
    assert np.abs(dparams).max() > 1e-6, "parameter gradient all zero: the check is vacuous"
    err = relative_error(dparams, numeric)
    assert err < MAX_REL_ERROR, f"parameter gradient: relative error {err:.2e}"
    if check_dx:
        assert dx.shape == x.shape
        numeric_dx = central(loss, x, dx_where)
        got = dx.reshape(-1) if dx_where is None else np.where(dx_where.reshape(-1), dx.reshape(-1), 0)
        assert np.abs(got).max() > 1e-6, "input gradient all zero: the check is vacuous"
        err = relative_error(got, numeric_dx)
        assert err < MAX_REL_ERROR, f"input gradient: relative error {err:.2e}"
    grads[...] = 0
    loss()
    assert layer.backward(R.copy(), need_dx=False) is None
    np.testing.assert_allclose(grads, dparams, rtol=1e-12, atol=1e-14)
    return dx


def padded(rng, n, t, f, lengths, mask_value, gaps=()):
    """(n, t, f) sequences, example k right-padded after lengths[k] steps
    with ``mask_value``; ``gaps`` = (example, step) masked in the middle."""
    x = rng.standard_normal((n, t, f))
    for k, length in enumerate(lengths):
        x[k, length:] = mask_value
    for k, s in gaps:
        x[k, s] = mask_value
    return x


# ------------------------------------------------------- gradient checks
RECURRENT = [
    lambda: LSTM(4),
    lambda: LSTM(3, return_sequences=True),
    lambda: LSTM(2, forget_bias=0.0, recurrent_init="xavier"),
    lambda: GRU(4),
    lambda: GRU(3, return_sequences=True),
]


@pytest.mark.parametrize("make", RECURRENT, ids=["lstm-last", "lstm-seq", "lstm-xavier", "gru-last", "gru-seq"])
def test_recurrent_gradients(make):
    x = np.random.default_rng(3).standard_normal((3, 5, 3))
    check_gradients(make(), (5, 3), x)


@pytest.mark.parametrize("cls", [LSTM, GRU])
@pytest.mark.parametrize("return_sequences", [False, True])
def test_recurrent_gradients_with_masks(cls, return_sequences):
    """Right padding, a gap inside, an all-masked example, one unmasked: masked
    steps get a zero input gradient; the rest match central differences
    (perturbing a masked step would unmask it, so only unmasked ones are)."""
    rng = np.random.default_rng(4)
    x = padded(rng, 4, 6, 3, lengths=[6, 4, 0, 2], mask_value=0.0, gaps=[(0, 2), (1, 1)])
    keep = ~np.all(x == 0.0, axis=2)
    dx = check_gradients(cls(3, return_sequences=return_sequences, mask_value=0.0), (6, 3), x,
                         dx_where=np.broadcast_to(keep[:, :, None], x.shape).copy())
    assert not dx[~keep].any()


@pytest.mark.parametrize("make,shape", [
    (lambda: Conv1D(4, 3), (7, 3)),
    (lambda: Conv1D(4, 3, stride=2, padding=1, activation="tanh"), (7, 3)),
    (lambda: Conv1D(2, 1, activation="sigmoid"), (5, 4)),
    (lambda: Conv1D(3, 5, padding=2, activation="leaky_relu"), (5, 2)),
], ids=["k3", "k3-s2-p1-tanh", "pointwise", "k5-p2"])
def test_conv1d_gradients(make, shape):
    x = np.random.default_rng(5).standard_normal((3, *shape))
    check_gradients(make(), shape, x)


@pytest.mark.parametrize("padding_id", [None, 0])
@pytest.mark.parametrize("t", [1, 6])
def test_embedding_gradients(padding_id, t):
    rng = np.random.default_rng(6)
    x = rng.integers(0, 5, (4, t)).astype(np.float64)
    x[0, 0], x[1, 0] = 0, 3  # a padding id and a repeated id at least
    layer = Embedding(5, 3, padding_id=padding_id)
    check_gradients(layer, (t,), x, check_dx=False)
    if padding_id is not None:
        assert not layer.dW[padding_id].any()


# ------------------------------------------------- per-step numpy reference
def _sig(a):
    return 1.0 / (1.0 + np.exp(-a))


def reference_lstm(x, W, RW, b, keep, return_sequences):
    """A plain per-example, per-step LSTM (masked steps carry the state, output 0)."""
    n, t, _ = x.shape
    u = RW.shape[0]
    out = np.zeros((n, t, u))
    last = np.zeros((n, u))
    for k in range(n):
        h, c = np.zeros(u), np.zeros(u)
        for s in range(t):
            if not keep[k, s]:
                continue
            z = x[k, s] @ W + h @ RW + b
            i, f, g, o = _sig(z[:u]), _sig(z[u:2 * u]), np.tanh(z[2 * u:3 * u]), _sig(z[3 * u:])
            c = f * c + i * g
            h = o * np.tanh(c)
            out[k, s] = h
        last[k] = h
    return out if return_sequences else last


def reference_gru(x, W, RW, b, rb, keep, return_sequences):
    n, t, _ = x.shape
    u = RW.shape[0]
    out = np.zeros((n, t, u))
    last = np.zeros((n, u))
    for k in range(n):
        h = np.zeros(u)
        for s in range(t):
            if not keep[k, s]:
                continue
            a, r_ = x[k, s] @ W + b, h @ RW
            r = _sig(a[:u] + r_[:u])
            z = _sig(a[u:2 * u] + r_[u:2 * u])
            nn = np.tanh(a[2 * u:] + r * (r_[2 * u:] + rb))
            h = (1 - z) * nn + z * h
            out[k, s] = h
        last[k] = h
    return out if return_sequences else last


@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-12), (np.float32, 2e-5)])
@pytest.mark.parametrize("cls", [LSTM, GRU])
@pytest.mark.parametrize("return_sequences", [False, True])
@pytest.mark.parametrize("masked", [False, True])
def test_recurrent_matches_per_step_reference(cls, return_sequences, masked, dtype, tol):
    rng = np.random.default_rng(7)
    n, t, f, u = 5, 7, 4, 6
    x = padded(rng, n, t, f, lengths=[7, 5, 1, 0, 3], mask_value=-1.0, gaps=[(0, 3)]) if masked else \
        rng.standard_normal((n, t, f))
    layer = cls(u, return_sequences=return_sequences, mask_value=-1.0 if masked else None)
    params, _ = bound(layer, (t, f), dtype=dtype)
    y = layer.forward(x.astype(dtype), False)
    keep = ~np.all(x == -1.0, axis=2) if masked else np.ones((n, t), bool)
    p = {k: v.astype(np.float64) for k, v in layer._split(params).items()}
    want = reference_lstm(x, p["W"], p["RW"], p["b"], keep, return_sequences) if cls is LSTM else \
        reference_gru(x, p["W"], p["RW"], p["b"], p["rb"], keep, return_sequences)
    assert y.dtype == dtype and y.shape == want.shape
    np.testing.assert_allclose(y, want, rtol=tol, atol=tol)


@pytest.mark.parametrize("cls", [LSTM, GRU])
def test_padded_sequence_ends_where_the_short_one_does(cls):
    """Right padding with mask_value changes nothing: the last output of a
    padded sequence is the short sequence's, and so are the parameter gradients."""
    rng = np.random.default_rng(8)
    short = rng.standard_normal((1, 3, 2))
    long_ = np.concatenate([short, np.zeros((1, 4, 2))], axis=1)
    a, b = cls(3, mask_value=0.0), cls(3, mask_value=0.0)
    _, ga = bound(a, (3, 2))
    _, gb = bound(b, (7, 2))
    np.testing.assert_allclose(a.forward(short, True), b.forward(long_, True), rtol=1e-14)
    dy = rng.standard_normal((1, 3))
    a.backward(dy.copy(), False)
    b.backward(dy.copy(), False)
    np.testing.assert_allclose(ga, gb, rtol=1e-13, atol=1e-15)


def test_stacked_layers_carry_the_mask():
    """Masked outputs are zero, so a second layer with mask_value=0 skips the same steps."""
    rng = np.random.default_rng(9)
    x = padded(rng, 2, 5, 3, lengths=[5, 2], mask_value=0.0)
    first = LSTM(4, return_sequences=True, mask_value=0.0)
    bound(first, (5, 3))
    seq = first.forward(x, False)
    assert not seq[1, 2:].any() and np.all(np.any(seq[1, :2] != 0, axis=1))


def test_initial_values():
    layer = LSTM(5, forget_bias=1.0)
    layer.build((3, 2))
    rng = np.random.default_rng(0)
    specs = {s.name: s for s in layer.param_specs()}
    b = layer.initial_value(specs["b"], rng)
    np.testing.assert_array_equal(b, np.r_[np.zeros(5), np.ones(5), np.zeros(10)])
    rw = layer.initial_value(specs["RW"], rng)
    for g in range(4):
        block = rw[:, 5 * g:5 * (g + 1)]
        np.testing.assert_allclose(block.T @ block, np.eye(5), atol=1e-12)
    gru = GRU(4)
    gru.build((3, 2))
    assert [s.name for s in gru.param_specs()] == ["W", "b", "RW", "rb"]
    assert not gru.initial_value(gru.param_specs()[1], rng).any()
    emb = Embedding(6, 3, padding_id=2)
    emb.build((4,))
    w = emb.initial_value(emb.param_specs()[0], rng)
    assert not w[2].any() and np.all(w[[0, 1, 3, 4, 5]] != 0)


# ------------------------------------------------------------- PyTorch
def _torch_rnn(cls, f, u, layer, dtype):
    p = layer._split(layer._params_for_test)
    module = (torch.nn.LSTM if cls is LSTM else torch.nn.GRU)(f, u, batch_first=True).to(dtype)
    with torch.no_grad():
        module.weight_ih_l0.copy_(torch.from_numpy(np.ascontiguousarray(p["W"].T)))
        module.weight_hh_l0.copy_(torch.from_numpy(np.ascontiguousarray(p["RW"].T)))
        module.bias_ih_l0.copy_(torch.from_numpy(p["b"].copy()))
        bias_hh = np.zeros_like(p["b"])
        if cls is GRU:
            bias_hh[2 * u:] = p["rb"]
        module.bias_hh_l0.copy_(torch.from_numpy(bias_hh))
    return module


@needs_torch
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("cls", [LSTM, GRU])
def test_recurrent_matches_torch(cls, dtype):
    """Outputs within 1e-5 (float32) of PyTorch's with copied weights, and the
    gradients of the input and every parameter too (float64: 1e-10)."""
    rng = np.random.default_rng(10)
    n, t, f, u = 8, 12, 5, 16
    layer = cls(u, return_sequences=True)
    params, grads = bound(layer, (t, f), dtype=dtype, noise=0.1)
    layer._params_for_test = params
    module = _torch_rnn(cls, f, u, layer, torch.float32 if dtype == np.float32 else torch.float64)
    x = rng.standard_normal((n, t, f)).astype(dtype)
    y = layer.forward(x, True)
    tx = torch.from_numpy(x.copy()).requires_grad_(True)
    ty, _ = module(tx)
    tol = 1e-5 if dtype == np.float32 else 1e-10
    np.testing.assert_allclose(y, ty.detach().numpy(), rtol=tol, atol=tol)
    dy = rng.standard_normal(y.shape).astype(dtype)
    dx = layer.backward(dy.copy(), True)
    ty.backward(torch.from_numpy(dy))
    np.testing.assert_allclose(dx, tx.grad.numpy(), rtol=tol, atol=tol)
    g = layer._split(grads)
    np.testing.assert_allclose(g["W"], module.weight_ih_l0.grad.numpy().T, rtol=tol, atol=tol * 10)
    np.testing.assert_allclose(g["RW"], module.weight_hh_l0.grad.numpy().T, rtol=tol, atol=tol * 10)
    bias = module.bias_ih_l0.grad.numpy()
    np.testing.assert_allclose(g["b"], bias, rtol=tol, atol=tol * 10)
    if cls is GRU:
        np.testing.assert_allclose(g["rb"], module.bias_hh_l0.grad.numpy()[2 * u:], rtol=tol, atol=tol * 10)


@needs_torch
def test_conv1d_and_embedding_match_torch():
    rng = np.random.default_rng(11)
    conv = Conv1D(5, 3, stride=2, padding=1)
    params, _ = bound(conv, (9, 4))
    p = conv._split(params)
    tconv = torch.nn.Conv1d(4, 5, 3, stride=2, padding=1).double()
    with torch.no_grad():
        tconv.weight.copy_(torch.from_numpy(np.ascontiguousarray(p["W"].transpose(2, 1, 0))))
        tconv.bias.copy_(torch.from_numpy(p["b"].copy()))
    x = rng.standard_normal((3, 9, 4))
    want = tconv(torch.from_numpy(x.transpose(0, 2, 1).copy())).detach().numpy().transpose(0, 2, 1)
    np.testing.assert_allclose(conv.forward(x, False), want, rtol=1e-12, atol=1e-12)

    emb = Embedding(7, 3, padding_id=1)
    params, _ = bound(emb, (4,), noise=0.0)
    temb = torch.nn.Embedding(7, 3, padding_idx=1).double()
    with torch.no_grad():
        temb.weight.copy_(torch.from_numpy(params.reshape(7, 3).copy()))
    ids = rng.integers(0, 7, (5, 4))
    np.testing.assert_array_equal(emb.forward(ids.astype(np.float64), False), temb(torch.from_numpy(ids)).detach().numpy())


# ----------------------------------------------------------- Embedding
def test_embedding_lookup_and_padding():
    layer = Embedding(4, 2, padding_id=3)
    params, grads = bound(layer, (3,), noise=0.5)
    W = params.reshape(4, 2)
    W[3] = 7.0  # a padding row that drifted: outputs stay zero
    x = np.array([[0.0, 3.0, 2.0], [2.0, 2.0, 1.0]])
    y = layer.forward(x, True)
    np.testing.assert_array_equal(y[0], [W[0], [0, 0], W[2]])
    np.testing.assert_array_equal(y[1], [W[2], W[2], W[1]])
    dy = np.arange(12.0).reshape(2, 3, 2)
    assert not layer.backward(dy.copy(), need_dx=True).any()
    dW = grads.reshape(4, 2)
    np.testing.assert_array_equal(dW, [dy[0, 0], dy[1, 2], dy[0, 2] + dy[1, 0] + dy[1, 1], [0, 0]])
    one = Embedding(4, 2)
    bound(one, (1,))
    assert one.output_shape == (2,) and one.forward(np.array([[1.0], [2.0]]), False).shape == (2, 2)


@pytest.mark.parametrize("bad,where", [(2.5, "2.5"), (-1.0, "-1.0"), (4.0, "4.0"), (np.nan, "nan")])
def test_embedding_names_the_bad_id(bad, where):
    layer = Embedding(4, 2)
    bound(layer, (3,), dtype=np.float32)
    x = np.zeros((2, 3), np.float32)
    x[1, 2] = bad
    with pytest.raises(ValueError, match=rf"Expect integer ids in \[0, 4\).*got {where} \(example 1 of the batch, "
                                         rf"position 2\)"):
        layer.forward(x, True)


# --------------------------------------------------- configs and errors
@pytest.mark.parametrize("layer", [
    LSTM(8, return_sequences=True, mask_value=0.0, forget_bias=0.5, weight_init="he", recurrent_init="xavier"),
    GRU(3, mask_value=-1),
    Embedding(10, 4, padding_id=0, weight_init="normal"),
    Conv1D(6, 3, stride=2, padding=1, activation="relu"),
])
def test_config_round_trip(layer):
    again = from_config(layer.to_config(), kind="layer")
    assert type(again) is type(layer) and again.config_arguments() == layer.config_arguments()
    assert repr(again) == repr(layer)


@pytest.mark.parametrize("make,message", [
    (lambda: LSTM(0), r"Expect units as an int >= 1, got 0"),
    (lambda: LSTM(2, return_sequences=1), r"Expect return_sequences as a bool, got 1"),
    (lambda: GRU(2, mask_value=float("nan")), r"Expect mask_value as a finite float or None, got nan"),
    (lambda: LSTM(2, forget_bias="1"), r"Expect forget_bias as a finite float, got '1'"),
    (lambda: GRU(2, recurrent_init="eye"), r"Expect recurrent_init in \('orthogonal', 'xavier'"),
    (lambda: LSTM(2, weight_init="orthogonal"), r"Expect weight_init in \('xavier'"),
    (lambda: Embedding(0, 2), r"Expect vocab_size as an int >= 1, got 0"),
    (lambda: Embedding(5, 2, padding_id=5), r"Expect padding_id as None or an int in \[0, 5\), got 5"),
    (lambda: Conv1D(2, 0), r"Expect kernel_size as an int >= 1, got 0"),
    (lambda: Conv1D(2, 3, padding=-1), r"Expect padding as an int >= 0, got -1"),
    (lambda: Conv1D(2, 3, activation="softmax"), r"Expect a per-element activation for Conv1D"),
])
def test_argument_errors(make, message):
    with pytest.raises(ValueError, match=message):
        make()


@pytest.mark.parametrize("layer,shape,message", [
    (LSTM(2), (6,), r"Expect a \(T, F\) sequence input to LSTM, got shape \(6,\)"),
    (GRU(2), (1, 4, 4), r"Expect a \(T, F\) sequence input to GRU, got shape \(1, 4, 4\)"),
    (Embedding(3, 2), (2, 3), r"Expect a \(T,\) input of ids to Embedding, got shape \(2, 3\)"),
    (Conv1D(2, 5), (4, 3), r"Expect a Conv1D kernel 5 \(padding 0\) that fits the sequence length 4"),
])
def test_build_errors(layer, shape, message):
    with pytest.raises(ValueError, match=message):
        layer.build(shape)


# ------------------------------------------------------------- in models
def text_graph(**kw):
    """Tokens -> Embedding -> LSTM (masked padding) and numeric features ->
    Dense, merged, to a softmax output."""
    return Graph(inputs={"tokens": (8,), "numbers": (3,)},
                 vertices=[("embed", Embedding(12, 6, padding_id=0), "tokens"),
                           ("lstm", LSTM(10, mask_value=0.0), "embed"),
                           ("dense", Dense(5, activation="tanh"), "numbers"),
                           ("both", Merge(), ["lstm", "dense"]),
                           ("out", Output(2), "both")],
                 outputs=["out"], **kw)


def text_data(n, seed=0):
    """Label 1 when token 7 occurs in the (right-padded) sequence, or the first number is large."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 9, n)
    tokens = rng.integers(1, 12, (n, 8))
    tokens[np.arange(8)[None, :] >= lengths[:, None]] = 0
    numbers = rng.standard_normal((n, 3))
    y = ((tokens == 7).any(axis=1) | (numbers[:, 0] > 1.5)).astype(np.int64)
    return {"tokens": tokens.astype(np.float32), "numbers": numbers.astype(np.float32)}, y


def test_two_input_graph_with_embedding_and_lstm_trains():
    model = text_graph(updater=Adam(lr=1e-2), seed=3)
    x, y = text_data(512)
    before = model.score(x, y)
    losses = model.fit(x, y, batch_size=32, epochs=6)
    after = model.score(x, y)
    assert losses[-1] < 0.6 * losses[0] and after < 0.6 * before, (before, after, losses)
    accuracy = float((np.argmax(model.output(x), axis=1) == y).mean())
    assert accuracy > 0.85, accuracy
    again = model_from_json(model.to_json())
    again.params = model.params
    np.testing.assert_array_equal(again.output(x), model.output(x))


def test_graph_gradient_check_through_embedding_lstm_and_conv1d():
    """The whole chain in float64: central differences of the model's loss."""
    model = Graph(inputs={"tokens": (6,)},
                  vertices=[("embed", Embedding(9, 4, padding_id=0), "tokens"),
                            ("conv", Conv1D(5, 3, padding=1, activation="tanh"), "embed"),
                            ("gru", GRU(4, return_sequences=True, mask_value=0.0), "conv"),
                            ("lstm", LSTM(3), "gru"),
                            ("out", Output(3), "lstm")],
                  outputs=["out"], dtype="float64", seed=5)
    rng = np.random.default_rng(12)
    x = rng.integers(0, 9, (4, 6)).astype(np.float64)
    y = rng.integers(0, 3, 4)
    _, grad = model.gradient(x, y)
    numeric = parameter_central(model, lambda: model.gradient(x, y)[0])
    assert relative_error(grad, numeric) < MAX_REL_ERROR


def test_network_reads_images_as_row_sequences():
    """The MNIST-LSTM shape: (1, 28, 28) images, Reshape to 28 steps of 28."""
    net = Network((1, 6, 5), [Reshape((6, 5)), LSTM(4), Output(3)], seed=1)
    x = np.random.default_rng(0).random((7, 1, 6, 5)).astype(np.float32)
    a = net.output(x)
    np.testing.assert_array_equal(a, net.output(x.reshape(7, 30)))
    assert a.shape == (7, 3)


def test_global_pool_over_time_after_lstm():
    g = Graph(inputs={"seq": (5, 3)},
              vertices=[("lstm", LSTM(4, return_sequences=True), "seq"), ("pool", GlobalAvgPool(), "lstm"),
                        ("out", Output(2), "pool")], outputs=["out"], dtype="float64")
    x = np.random.default_rng(1).standard_normal((3, 5, 3))
    assert g.output(x).shape == (3, 2)


# ---------------------------------------------------------------- GPU
@pytest.mark.gpu
@pytest.mark.parametrize("make,shape,ids", [
    (lambda: LSTM(8, return_sequences=True, mask_value=0.0), (6, 3), False),
    (lambda: GRU(8, mask_value=0.0), (6, 3), False),
    (lambda: Conv1D(4, 3, padding=1, activation="relu"), (6, 3), False),
    (lambda: Embedding(9, 4, padding_id=0), (6,), True),
])
def test_cupy_matches_numpy(make, shape, ids):
    cp = backend.cupy()
    rng = np.random.default_rng(13)
    x = rng.integers(0, 9, (5, *shape)).astype(np.float64) if ids else \
        padded(rng, 5, shape[0], shape[1], lengths=[6, 3, 0, 6, 1], mask_value=0.0)
    cpu, gpu = make(), make()
    params, grads = bound(cpu, shape)
    gpu.build(shape)
    gparams, ggrads = cp.asarray(params), cp.zeros_like(cp.asarray(grads))
    gpu.bind(gparams, ggrads)
    y = cpu.forward(x, True)
    gy = gpu.forward(cp.asarray(x), True)
    np.testing.assert_allclose(cp.asnumpy(gy), y, rtol=1e-10, atol=1e-12)
    dy = rng.standard_normal(y.shape)
    dx = cpu.backward(dy.copy(), True)
    gdx = gpu.backward(cp.asarray(dy), True)
    np.testing.assert_allclose(cp.asnumpy(gdx), dx, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(cp.asnumpy(ggrads), grads, rtol=1e-10, atol=1e-12)
