"""The gradient-sharing algorithm (:mod:`sparkavg.sharing`) with no Spark and
no sockets: W workers in one process exchange messages through Python lists.

On exactness.  Encoders subtract and decoders add exactly float32(τ).  With
every value on a dyadic grid (k/64) and τ a power of two, every float32
addition is exact, so replicas that applied the same messages in different
orders are bit-identical and ``decode(encode(r)) + r_after == r_before``
holds exactly.  With general floats and an adaptive τ, replicas agree up to
the order of float additions, which we bound against a float64 sum.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from sparkavg import backend, ops
from sparkavg.configurable import ConfigError, from_config, registered
from sparkavg.ops._checks import check_threshold
from sparkavg.sharing.thresholds import CLIP_EVERY, CLIP_K, DECAY
from sparkavg.sharing import (
    TAU_MAX,
    TAU_MIN,
    AdaptiveThreshold,
    FixedThreshold,
    SharingState,
    TargetSparsityThreshold,
    ThresholdRule,
    apply_message,
    apply_received,
    check_tau,
    clip_when_due,
    encode_update,
    local_view,
    message_bytes,
    sent_entries,
    sharing_step,
)

F32_EPS = float(np.finfo(np.float32).eps)
#: DL4J's residual clipping, as the library always runs it.
DL4J_CLIP = (CLIP_EVERY, CLIP_K)


def make_state(rule, clip, n, xp=np):
    """A SharingState whose residual clipping is ``clip`` ((every, k); None: off) in place of DL4J's."""
    state = SharingState(rule, n, xp=xp)
    state.clip = clip
    return state


def _from_plain(rule, clip, plain, xp=np):
    """``SharingState.from_plain`` with the clipping of :func:`make_state`."""
    state = SharingState.from_plain(rule, plain, xp=xp)
    state.clip = clip
    return state


# ------------------------------------------------------------------ helpers
class ListNetwork:
    """All-to-all delivery through per-rank Python lists, in publish order."""

    def __init__(self, world: int):
        self.world = world
        self.boxes = [[] for _ in range(world)]
        self.log = []  # (origin, payload) of every publication

    def publisher(self, rank: int):
        def publish(payload: bytes) -> None:
            assert isinstance(payload, bytes)
            self.log.append((rank, payload))
            for r in range(self.world):
                if r != rank:
                    self.boxes[r].append(payload)

        return publish

    def drain(self, rank: int) -> list:
        out, self.boxes[rank] = self.boxes[rank], []
        return out


def same_bits(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def run_workers(states, params, updates, network=None, flush=True):
    """Every worker takes ``len(updates[0])`` steps in lock step, then (with
    ``flush``) the leftovers are applied.  ``updates[w][t]`` is worker w's
    update at step t."""
    world = len(states)
    network = network or ListNetwork(world)
    for t in range(len(updates[0])):
        for w in range(world):
            sharing_step(states[w], updates[w][t], params[w], network.publisher(w),
                         lambda w=w: network.drain(w))
    if flush:
        for w in range(world):
            apply_received(states[w], network.drain(w), params[w])
    return network


def run_fresh_workers(rule, clipping, init, updates, flush=True):
    """:func:`run_workers` for ``len(updates)`` workers, each from its own copy
    of ``init`` and a fresh state of ``rule`` and ``clipping``.  Returns
    ``(states, params, network)``."""
    states = [make_state(rule, clipping, init.size) for _ in updates]
    params = [init.copy() for _ in updates]
    network = run_workers(states, params, updates, flush=flush)
    return states, params, network


def decoded(message, n: int) -> np.ndarray:
    out = np.zeros(n, np.float32)
    if message is not None:
        apply_message(message, out)
    return out


def grid_values(rng, shape, bound=256):
    return (rng.integers(-bound, bound + 1, size=shape) / 64.0).astype(np.float32)


# ------------------------------------------- (a) replicas stay identical
@given(world=st.integers(1, 4), n=st.integers(1, 120), steps=st.integers(1, 25), seed=st.integers(0, 2**32 - 1),
       log2_tau=st.integers(-4, 1), clip=st.one_of(st.none(), st.tuples(st.integers(1, 4), st.integers(1, 5))))
def test_replicas_bit_identical_on_dyadic_grid(world, n, steps, seed, log2_tau, clip):
    rng = np.random.default_rng(seed)
    tau = 2.0**log2_tau
    clipping = None if clip is None else (clip[0], float(clip[1]))
    init = grid_values(rng, n)
    updates = grid_values(rng, (world, steps, n), bound=192)
    states, params, network = run_fresh_workers(FixedThreshold(tau), clipping, init, updates)
    for w in range(1, world):
        assert same_bits(params[w], params[0]), f"replica {w} differs from replica 0"
    # ... and every replica is the start plus every published message (exact on the grid).
    total = init.copy()
    for _origin, payload in network.log:
        apply_message(payload, total)
    assert same_bits(params[0], total)
    sent = sum(s.messages_sent for s in states)
    assert sent == len(network.log)
    for w, s in enumerate(states):
        assert s.messages_received == sent - s.messages_sent, f"worker {w} missed messages"


@given(world=st.integers(2, 4), n=st.integers(16, 300), seed=st.integers(0, 2**32 - 1))
@settings(max_examples=20)
def test_replicas_agree_to_float_order_with_adaptive_tau(world, n, seed):
    rng = np.random.default_rng(seed)
    steps = 40
    init = rng.normal(0, 0.1, n).astype(np.float32)
    rule = AdaptiveThreshold(initial=1e-3, min_sparsity=1e-2, max_sparsity=0.2)
    updates = rng.normal(0, 1e-3, (world, steps, n)).astype(np.float32)
    states, params, network = run_fresh_workers(rule, DL4J_CLIP, init, updates)
    exact = init.astype(np.float64)
    for _origin, payload in network.log:
        apply_message(payload, exact)  # float64 target: the same ±τ, no rounding to speak of
    # Each entry took at most len(log) float32 additions, each off by <= half an ulp.
    bound = len(network.log) * F32_EPS * float(np.abs(exact).max() + 1e-3)
    for w in range(world):
        err = float(np.abs(params[w].astype(np.float64) - exact).max())
        assert err <= bound, f"replica {w} is {err} from the float64 sum (bound {bound})"
    assert any(s.tau != rule.initial for s in states), "the adaptive rule never moved τ"


# ------------------------------------ (b) exact round trip through encode_update
@given(n=st.integers(1, 150), seed=st.integers(0, 2**32 - 1), log2_tau=st.integers(-4, 1))
def test_encode_update_round_trip_exact(n, seed, log2_tau):
    rng = np.random.default_rng(seed)
    state = make_state(FixedThreshold(2.0**log2_tau), None, n)
    state.residual[:] = grid_values(rng, n)
    for _ in range(6):
        update = grid_values(rng, n, bound=128)
        r_before = state.residual + update
        message = encode_update(state, update)
        assert same_bits(decoded(message, n) + state.residual, r_before)
        if message is None:
            assert same_bits(state.residual, r_before)


@given(residual=arrays(np.float32, st.integers(1, 150),
                       elements=st.floats(-8.0, 8.0, width=32, allow_nan=False, allow_infinity=False)),
       tau=st.floats(2.0**-6, 4.0, width=32))
def test_encode_update_sends_exactly_what_leaves_the_residual(residual, tau):
    n = residual.size
    state = make_state(FixedThreshold(float(tau)), None, n)
    update = residual.copy()
    residual = np.zeros(n, np.float32) + update  # r_before (0 + -0 is +0)
    message = encode_update(state, update)
    sent = decoded(message, n)
    touched = sent != 0
    assert same_bits(state.residual[~touched], residual[~touched])
    exact = touched & (np.abs(residual) <= 2 * np.float32(tau))  # Sterbenz: exact subtraction
    assert np.array_equal((sent + state.residual)[exact], residual[exact])
    err = np.abs(sent.astype(np.float64) + state.residual - residual.astype(np.float64))
    assert np.all(err <= 0.5 * np.spacing(np.abs(state.residual)))
    assert state.entries_sent == int(touched.sum())
    assert state.last_sparsity == touched.sum() / n


@given(n=st.integers(1, 300), seed=st.integers(0, 2**31 - 1), log2_tau=st.integers(-8, 2))
@settings(max_examples=40)
def test_sent_entries_are_the_entries_the_step_sends(n, seed, log2_tau):
    """What momentum masking clears: sent_entries before the step is exactly where the message is non-zero
    (bitmap and sparse encodings alike: the densities drawn cover both)."""
    rng = np.random.default_rng(seed)
    state = make_state(FixedThreshold(2.0**log2_tau), None, n)
    state.residual[:] = rng.standard_normal(n).astype(np.float32)
    update = rng.standard_normal(n).astype(np.float32)
    mask = sent_entries(state, update)
    message = encode_update(state, update)
    assert np.array_equal(mask, decoded(message, n) != 0)


@given(n=st.integers(1, 300), seed=st.integers(0, 2**31 - 1))
@settings(max_examples=30)
def test_local_view_is_shared_plus_residual_and_leaves_both_alone(n, seed):
    """The view is the float32 sum shared + residual, written over ``out`` only; the shared parameters and the
    residual keep their bits, so replicas (which apply messages to ``shared``) still agree."""
    rng = np.random.default_rng(seed)
    state = make_state(FixedThreshold(0.5), None, n)
    state.residual[:] = rng.standard_normal(n).astype(np.float32)
    shared = rng.standard_normal(n).astype(np.float32)
    before, residual = shared.copy(), state.residual.copy()
    out = np.full(n, np.nan, np.float32)
    assert local_view(state, shared, out) is out
    assert same_bits(out, before + residual)
    assert same_bits(shared, before) and same_bits(state.residual, residual)
    with pytest.raises(ValueError, match="another array than shared"):
        local_view(state, shared, shared)


def test_local_view_moves_the_gradient_to_the_workers_own_point():
    """A worker whose updates stay below τ: without the view its gradient never sees them (the same gradient
    every step, the residual grows linearly); with it the gradient follows the worker's own progress."""
    from sparkavg.nn import SGD, Network, Output

    rng = np.random.default_rng(5)
    x = rng.standard_normal((16, 3)).astype(np.float32)
    y = rng.integers(0, 2, 16)
    grads = {}
    for view in (False, True):
        net = Network((3,), [Output(2)], updater=SGD(lr=0.01), seed=1)
        state = make_state(FixedThreshold(1e3), None, net.num_params)  # nothing ever crosses τ
        update, shared = np.zeros(net.num_params, np.float32), net.params.copy()
        seen = []
        for _ in range(3):
            if view:
                local_view(state, shared, net.params)
            net.compute_update(x, y, update)
            seen.append(update.copy())
            assert encode_update(state, update) is None
        grads[view] = seen
    assert same_bits(grads[False][0], grads[False][2]), "no view: the shared parameters never moved"
    assert same_bits(grads[True][0], grads[False][0]) and not np.allclose(grads[True][2], grads[False][2])


def test_apply_message_takes_bytes_and_arrays_alike():
    rng = np.random.default_rng(3)
    state = make_state(FixedThreshold(0.25), None, 100)
    message = encode_update(state, grid_values(rng, 100))
    assert message is not None
    a, b = np.zeros(100, np.float32), np.zeros(100, np.float32)
    assert apply_message(message, a) == apply_message(message_bytes(message), b) == ops.encoded_count(message)
    assert same_bits(a, b)
    with pytest.raises(ValueError, match="multiple of 4 bytes"):
        apply_message(message_bytes(message)[:-1], b)
    with pytest.raises(ValueError, match="N = 100"):
        apply_message(message, np.zeros(99, np.float32))


# ------------------------------------------------------ (c) threshold rules
taus = st.floats(TAU_MIN, TAU_MAX, allow_nan=False, allow_infinity=False)
fractions = st.floats(0.0, 1.0)


@given(tau=taus, sparsity=fractions, t=taus)
def test_fixed_rule_never_moves(tau, sparsity, t):
    assert FixedThreshold(t).next_tau(tau, sparsity) == tau
    assert FixedThreshold(t).initial_tau() == t


@given(tau=st.floats(1e-30, 1e30), sparsity=fractions)
def test_adaptive_rule_moves_tau_against_the_sparsity(tau, sparsity):
    rule = AdaptiveThreshold()  # DL4J: keep τ for sparsity in [1e-4, 1e-2]
    new = rule.next_tau(tau, sparsity)
    if sparsity < rule.min_sparsity:
        assert new == tau * rule.decay < tau, "too sparse: τ must go down"
    elif sparsity > rule.max_sparsity:
        assert new == tau / rule.decay > tau, "too dense: τ must go up"
    else:
        assert new == tau


@given(tau=st.floats(1e-30, 1e30), sparsity=fractions, target=st.floats(1e-4, 0.5))
def test_target_rule_steers_towards_target(tau, sparsity, target):
    rule = TargetSparsityThreshold(target=target)
    new = rule.next_tau(tau, sparsity)
    if sparsity < target:
        assert new == tau * rule.decay < tau
    else:
        assert new == tau / rule.decay > tau


@given(sparsity=fractions)
def test_rules_keep_tau_a_valid_encoder_threshold(sparsity):
    for rule in (AdaptiveThreshold(), TargetSparsityThreshold()):
        for tau in (TAU_MIN, TAU_MAX):
            new = rule.next_tau(tau, sparsity)
            assert TAU_MIN <= new <= TAU_MAX
            assert check_threshold(new) > 0


def test_adaptive_tau_settles_from_both_sides():
    rng = np.random.default_rng(7)
    n = 4096
    updates = rng.normal(0, 1e-3, (300, n)).astype(np.float32)
    for initial, direction in ((10.0, -1), (1e-9, +1)):  # far too sparse / far too dense
        rule = AdaptiveThreshold(initial=initial, min_sparsity=1e-3, max_sparsity=5e-2)
        state = make_state(rule, None, n)
        moved = 0
        for update in updates:
            before = state.tau
            encode_update(state, update)
            if not rule.min_sparsity <= state.last_sparsity <= rule.max_sparsity:
                assert np.sign(state.tau - before) == direction, (initial, state.last_sparsity)
                moved += 1
        assert moved > 0
        assert 1e-6 < state.tau < 1e-1, f"τ from {initial} did not settle: {state.tau}"


def test_target_sparsity_is_reached():
    rng = np.random.default_rng(11)
    n, target = 8192, 1e-2
    state = make_state(TargetSparsityThreshold(initial=1.0, target=target), DL4J_CLIP, n)
    seen = []
    for _ in range(600):
        encode_update(state, rng.normal(0, 1e-3, n).astype(np.float32))
        seen.append(state.last_sparsity)
    late = float(np.mean(seen[-200:]))
    assert target / 3 <= late <= target * 3, f"mean sparsity {late} far from target {target}"


def test_zero_updates_drive_tau_to_the_floor_not_to_an_error():
    state = make_state(AdaptiveThreshold(initial=TAU_MIN * 1.5), (1, CLIP_K), 64)
    for _ in range(20):
        assert encode_update(state, np.zeros(64, np.float32)) is None
    assert state.tau == TAU_MIN


# --------------------------------------------------------------- (d) clipping
def test_clipping_bounds_the_residual_at_due_iterations_only():
    n, tau, k = 64, 0.5, 2.0
    clipping = (3, k)
    state = make_state(FixedThreshold(tau), clipping, n)
    update = np.where(np.arange(n) % 2 == 0, 3.0, -3.0).astype(np.float32)  # grows by 2.5 per step
    for it in range(1, 13):
        encode_update(state, update)
        assert state.iteration == it
        peak = float(np.abs(state.residual).max())
        if it % 3 == 0:
            assert peak == k * tau, f"iteration {it}: residual not clipped to k*tau ({peak})"
        else:
            assert peak > k * tau, f"iteration {it}: clipped although not due ({peak})"


def test_clipping_uses_the_adapted_tau():
    rng = np.random.default_rng(5)
    n = 512
    rule = TargetSparsityThreshold(initial=1e-2, target=0.05)
    clipping = (1, 1.5)
    state = make_state(rule, clipping, n)
    for _ in range(50):
        encode_update(state, rng.normal(0, 1e-2, n).astype(np.float32))
        bound = np.float32(clipping[1] * float(np.float32(state.tau)))
        assert float(np.abs(state.residual).max()) <= bound


@given(residual=arrays(np.float32, st.integers(1, 64),
                       elements=st.floats(-1e3, 1e3, width=32, allow_nan=False, allow_infinity=False)),
       frequency=st.integers(1, 7), iteration=st.integers(1, 50), k=st.floats(1.0, 10.0))
def test_clipping_apply(residual, frequency, iteration, k):
    tau = 0.75
    r = residual.copy()
    clipped = clip_when_due(r, tau, iteration, frequency, k)
    assert clipped == (iteration % frequency == 0)
    if clipped:
        bound = np.float32(k * tau)
        assert same_bits(r, np.clip(residual, -bound, bound))
    else:
        assert same_bits(r, residual)


# ------------------------------------------------------------ (e) plain state
@pytest.mark.parametrize("split", [1, 7, 13])
def test_plain_round_trip_continues_like_an_uninterrupted_run(split):
    rng = np.random.default_rng(17)
    world, n, steps = 3, 200, 20
    rule = AdaptiveThreshold(initial=1e-3, min_sparsity=1e-2, max_sparsity=0.1)
    clipping = (3, 2.0)
    init = rng.normal(0, 0.1, n).astype(np.float32)
    updates = rng.normal(0, 1e-3, (world, steps, n)).astype(np.float32)

    straight, p_straight, _ = run_fresh_workers(rule, clipping, init, updates)

    # No flush at the split: messages in flight stay in flight, as they would without it.
    first, p_resumed, network = run_fresh_workers(rule, clipping, init, updates[:, :split], flush=False)
    plains = [json.loads(json.dumps({k: v for k, v in s.to_plain().items() if k != "residual"}))
              for s in first]  # everything but the residual is JSON
    for plain, s in zip(plains, first):
        plain["residual"] = s.to_plain()["residual"]
        assert isinstance(plain["residual"], np.ndarray) and plain["residual"].dtype == np.float32
    resumed = [_from_plain(rule, clipping, plain) for plain in plains]
    run_workers(resumed, p_resumed, updates[:, split:], network)

    for w in range(world):
        assert same_bits(p_resumed[w], p_straight[w]), f"worker {w}: params differ"
        assert same_bits(resumed[w].residual, straight[w].residual), f"worker {w}: residuals differ"
        assert resumed[w].tau == straight[w].tau
        assert resumed[w].iteration == straight[w].iteration == steps
        assert resumed[w].encoding.format == straight[w].encoding.format
        assert resumed[w].statistics() == straight[w].statistics()


def test_plain_round_trip_carries_the_encoder_format():
    # A sparse-mode encoder sends nothing for a single qualifying entry; a fresh
    # (bitmap-first) one would send it: the format must travel with the state.
    n = 64
    state = make_state(FixedThreshold(1.0), None, n)
    first = np.zeros(n, np.float32)
    first[[3, 9]] = 1.5
    assert encode_update(state, first) is not None
    assert state.encoding.format == ops.SPARSE
    resumed = _from_plain(state.rule, None, state.to_plain())
    second = np.zeros(n, np.float32)
    second[20] = 1.5
    assert encode_update(state, second) is None
    assert encode_update(resumed, second) is None
    assert same_bits(resumed.residual, state.residual)


def test_plain_residual_is_a_copy_and_bad_plains_are_named():
    state = make_state(FixedThreshold(), None, 8)
    plain = state.to_plain()
    state.residual[:] = 1.0
    assert not plain["residual"].any()
    again = _from_plain(FixedThreshold(), None, plain)
    plain["residual"][:] = 2.0
    assert not again.residual.any()
    with pytest.raises(ValueError, match="missing \\['iteration'\\]"):
        _from_plain(FixedThreshold(), None, {k: v for k, v in plain.items() if k != "iteration"})
    with pytest.raises(ValueError, match="encoding_format"):
        _from_plain(FixedThreshold(), None, {**plain, "encoding_format": "dense"})
    with pytest.raises(ValueError, match="tau"):
        _from_plain(FixedThreshold(), None, {**plain, "tau": 0.0})
    with pytest.raises(ValueError, match="1-D residual"):
        _from_plain(FixedThreshold(), None, {**plain, "residual": np.zeros((2, 4), np.float32)})


def test_reset_statistics_keeps_the_algorithm_state():
    rng = np.random.default_rng(2)
    state = make_state(AdaptiveThreshold(), DL4J_CLIP, 300)
    for _ in range(5):
        encode_update(state, rng.normal(0, 1e-3, 300).astype(np.float32))
    tau, iteration = state.tau, state.iteration
    assert state.messages_sent > 0
    state.reset_statistics()
    assert (state.messages_sent, state.entries_sent, state.messages_received) == (0, 0, 0)
    assert (state.tau, state.iteration) == (tau, iteration)


# ------------------------------------------------------ (f) constructor checks
@pytest.mark.parametrize("make, field", [
    (lambda: FixedThreshold(1e-50), "threshold"),
    (lambda: FixedThreshold(1e39), "threshold"),
    (lambda: FixedThreshold(float("inf")), "threshold"),
    (lambda: FixedThreshold(float("nan")), "threshold"),
    (lambda: FixedThreshold(1e-40), "threshold"),  # subnormal float32
    (lambda: FixedThreshold(0.0), "threshold"),
    (lambda: FixedThreshold(-1e-3), "threshold"),
    (lambda: AdaptiveThreshold(initial=1e-50), "initial"),
    (lambda: AdaptiveThreshold(initial=float("nan")), "initial"),
    (lambda: AdaptiveThreshold(min_sparsity=0.1, max_sparsity=0.01), "0 < min_sparsity < max_sparsity"),
    (lambda: AdaptiveThreshold(max_sparsity=1.5), "max_sparsity"),
    (lambda: TargetSparsityThreshold(initial=1e39), "initial"),
    (lambda: TargetSparsityThreshold(target=0.0), "target"),
    (lambda: TargetSparsityThreshold(target=float("inf")), "target"),
])
def test_constructor_rejects_with_the_field_named(make, field):
    with pytest.raises(ValueError, match=f"Expect {field}"):
        make()


def test_threshold_message_says_range_and_value():
    with pytest.raises(ValueError) as info:
        FixedThreshold(1e-50)
    assert str(info.value) == "Expect threshold to be a finite float32 > 0 (between 1.2e-38 and 3.4e38), got 1e-50"
    with pytest.raises(TypeError, match="Expect threshold to be a real number, got str"):
        FixedThreshold("0.1")


@given(value=st.one_of(st.floats(), st.floats(1e-46, 1e-36), st.floats(3e38, 4e38)))
def test_check_tau_accepts_only_what_the_encoder_accepts(value):
    try:
        tau = check_tau(value)
    except ValueError:
        return
    assert tau == value
    assert np.float32(check_threshold(tau)) >= np.finfo(np.float32).tiny
    r = np.array([1e38, -1e38, 0.0], np.float32)
    ops.encode(r, tau)  # no complaint about τ


def test_state_constructor_rejects_wrong_kinds():
    with pytest.raises(TypeError, match="Expect rule to be a ThresholdRule"):
        SharingState(1e-3, 10)
    with pytest.raises(ValueError, match="Expect num_params >= 1"):
        SharingState(FixedThreshold(), 0)
    assert SharingState(FixedThreshold(), 10).clip == (5, 5.0)  # DL4J's clipping, always on


# ------------------------------------------------------------ (g) to_config
rules = st.one_of(
    st.builds(FixedThreshold, threshold=st.floats(1e-30, 1e30)),
    st.builds(AdaptiveThreshold, initial=st.floats(1e-30, 1e30), min_sparsity=st.floats(1e-6, 1e-3),
              max_sparsity=st.floats(2e-3, 1.0)),
    st.builds(TargetSparsityThreshold, initial=st.floats(1e-30, 1e30), target=st.floats(1e-6, 0.99)),
)


@given(rule=rules)
def test_threshold_rules_round_trip_through_config(rule):
    config = json.loads(json.dumps(rule.to_config()))
    assert config["type"] == type(rule).__name__
    assert from_config(config, kind="threshold") == rule


def test_registry_kinds_and_config_errors():
    assert {"FixedThreshold", "AdaptiveThreshold", "TargetSparsityThreshold"} <= set(registered("threshold"))
    assert not registered("residual")  # clipping is the behaviour, not a configuration
    assert ThresholdRule._config_kind == "threshold"
    for rule in (FixedThreshold(), AdaptiveThreshold(), TargetSparsityThreshold()):
        assert from_config(rule.to_config(), kind="threshold") == rule  # the documented defaults
    assert AdaptiveThreshold().to_config() == {"type": "AdaptiveThreshold", "initial": 1e-4, "min_sparsity": 1e-4,
                                               "max_sparsity": 1e-2}
    assert AdaptiveThreshold.decay == TargetSparsityThreshold.decay == DECAY == 0.5 ** (1 / 20)  # not a field
    with pytest.raises(ConfigError, match="ResidualClipping"):
        from_config({"type": "ResidualClipping", "frequency": 5, "k": 5.0}, kind="threshold")
    with pytest.raises(ConfigError, match="Expect threshold to be a finite float32"):
        from_config({"type": "FixedThreshold", "threshold": 1e-50}, kind="threshold")
    with pytest.raises(ConfigError, match="Expect FixedThreshold.threshold to be float, got str"):
        from_config({"type": "FixedThreshold", "threshold": "1e-3"}, kind="threshold")


# ------------------------------------------- parity with a written-out loop
def _written_out_after_step(th, entries, n, residual, rule, clipping):
    """The rules' τ updates and the clipping written out, apart from their classes."""
    th["iteration"] += 1
    sparsity = entries / n if n else 0.0
    if isinstance(rule, AdaptiveThreshold):
        if sparsity < rule.min_sparsity:
            th["tau"] *= rule.decay
        elif sparsity > rule.max_sparsity:
            th["tau"] /= rule.decay
    elif isinstance(rule, TargetSparsityThreshold):
        th["tau"] = th["tau"] * rule.decay if sparsity < rule.target else th["tau"] / rule.decay
    if clipping is not None and th["iteration"] % clipping[0] == 0:
        ops.clip_residual(residual, th["tau"], clipping[1])


@pytest.mark.parametrize("rule", [FixedThreshold(2e-3), AdaptiveThreshold(initial=1e-3, max_sparsity=0.05),
                                  TargetSparsityThreshold(initial=1e-3, target=0.02)])
def test_sharing_step_matches_a_written_out_loop_bit_for_bit(rule):
    # The executors run sharing_step itself (test_spark_sharing.py holds a Spark fit to it);
    # this holds sharing_step to the iteration written out with the bare kernels.
    rng = np.random.default_rng(23)
    world, n, steps = 3, 257, 30
    clipping = (4, 3.0)
    init = rng.normal(0, 0.1, n).astype(np.float32)
    updates = rng.normal(0, 2e-3, (world, steps, n)).astype(np.float32)

    states, params, _ = run_fresh_workers(rule, clipping, init, updates)

    # The iteration with the bare kernels, over the same list network.
    network = ListNetwork(world)
    old_params = [init.copy() for _ in range(world)]
    residuals = [np.zeros(n, np.float32) for _ in range(world)]
    encodings = [ops.EncodingState() for _ in range(world)]
    ths = [{"tau": rule.initial_tau(), "iteration": 0} for _ in range(world)]
    for t in range(steps):
        for w in range(world):
            ops.accumulate(residuals[w], updates[w, t])
            message = ops.encode(residuals[w], ths[w]["tau"], encodings[w])
            entries = 0
            if message is not None:
                entries = ops.encoded_count(message)
                network.publisher(w)(np.ascontiguousarray(message, dtype="<i4").tobytes())
                ops.decode(message, old_params[w])
            for payload in network.drain(w):
                ops.decode(np.frombuffer(payload, dtype="<i4"), old_params[w])
            _written_out_after_step(ths[w], entries, n, residuals[w], rule, clipping)
    for w in range(world):
        for payload in network.drain(w):
            ops.decode(np.frombuffer(payload, dtype="<i4"), old_params[w])

    for w in range(world):
        assert same_bits(params[w], old_params[w]), f"worker {w}: params differ from the written-out loop"
        assert same_bits(states[w].residual, residuals[w]), f"worker {w}: residual differs"
        assert states[w].tau == ths[w]["tau"]
        assert states[w].messages_sent == encodings[w].messages
        assert states[w].entries_sent == encodings[w].values_sent


def test_inbox_is_read_after_publish():
    events = []
    state = make_state(FixedThreshold(0.25), None, 32)
    update = np.full(32, 1.0, np.float32)

    def inbox():
        events.append("inbox")
        return []

    sharing_step(state, update, np.zeros(32, np.float32), lambda b: events.append("publish"), inbox)
    assert events == ["publish", "inbox"]


def test_phase_hook_times_each_phase_around_its_work():
    from contextlib import contextmanager

    events = []

    @contextmanager
    def phase(name):
        events.append(("enter", name))
        yield
        events.append(("exit", name))

    state = make_state(FixedThreshold(0.25), None, 32)
    params = np.zeros(32, np.float32)
    sharing_step(state, np.full(32, 1.0, np.float32), params, lambda b: events.append("publish"),
                 lambda: events.append("inbox") or [], phase=phase)
    assert events == [("enter", "encode"), ("exit", "encode"), ("enter", "send"), "publish", ("exit", "send"),
                      ("enter", "apply"), "inbox", ("exit", "apply")]
    assert np.all(params == 0.25)
    events.clear()  # nothing to send: no "send" phase, the inbox is still applied
    sharing_step(make_state(FixedThreshold(0.25), None, 32), np.zeros(32, np.float32), params,
                 lambda b: events.append("publish"), [], phase=phase)
    assert events == [("enter", "encode"), ("exit", "encode"), ("enter", "apply"), ("exit", "apply")]


# -------------------------------------------------------------------- CuPy
@pytest.mark.gpu
def test_gpu_state_steps_like_the_cpu_one():
    cp = backend.cupy()
    rng = np.random.default_rng(29)
    n, steps = 1000, 25
    rule, clipping = AdaptiveThreshold(initial=1e-3, max_sparsity=0.05), (3, CLIP_K)
    cpu, gpu = make_state(rule, clipping, n), make_state(rule, clipping, n, xp=cp)
    p_cpu, p_gpu = np.zeros(n, np.float32), cp.zeros(n, cp.float32)
    sent_cpu, sent_gpu = [], []
    for _ in range(steps):
        update = rng.normal(0, 1e-3, n).astype(np.float32)
        sharing_step(cpu, update, p_cpu, sent_cpu.append, [])
        sharing_step(gpu, cp.asarray(update), p_gpu, sent_gpu.append, [])
    assert sent_cpu == sent_gpu
    assert same_bits(backend.to_cpu(p_gpu), p_cpu)
    assert same_bits(backend.to_cpu(gpu.residual), cpu.residual)
    assert gpu.tau == cpu.tau
    apply_received(gpu, sent_cpu[:3], p_gpu)  # bytes into a device target
    apply_received(cpu, sent_cpu[:3], p_cpu)
    assert same_bits(backend.to_cpu(p_gpu), p_cpu)
    plain = gpu.to_plain()
    assert isinstance(plain["residual"], np.ndarray)
    back = _from_plain(rule, clipping, plain, xp=cp)
    assert backend.is_gpu_array(back.residual)


def test_always_publish_sends_an_empty_payload_that_peers_count_and_do_not_apply():
    # GradientSharing.staleness counts one payload per iteration: an iteration whose residual
    # has nothing to send publishes b"", which the receivers count and never decode.
    n = 64
    state = make_state(FixedThreshold(1.0), None, n)
    params = np.full(n, 0.5, np.float32)
    sent = []
    entries = sharing_step(state, np.full(n, 1e-3, np.float32), params, sent.append, [], always_publish=True)
    assert entries == 0 and sent == [b""] and state.messages_sent == 0
    sharing_step(state, np.full(n, 1e-3, np.float32), params, sent.append, [])  # default: nothing published
    assert sent == [b""]

    peer = make_state(FixedThreshold(1.0), None, n)
    peer_params = np.full(n, 0.5, np.float32)
    assert apply_received(peer, [b"", b""], peer_params) == 2
    assert peer.messages_received == 2 and np.array_equal(peer_params, np.full(n, 0.5, np.float32))
