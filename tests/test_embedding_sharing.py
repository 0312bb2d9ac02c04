"""Gradient sharing keeps an embedding's update sparse: the threshold path
(residual, encoding, wire bytes) sends only entries of rows whose ids were
in the minibatch (or still drain from the residual), never the table."""
import numpy as np

from sparkavg.nn import SGD, Dense, Embedding, Flatten, Network, Output
from sparkavg.ops import decode
from sparkavg.sharing import FixedThreshold, SharingState, apply_message, encode_update
from sparkavg.sharing import message_bytes

VOCAB, DIM = 5000, 8


def test_messages_move_only_rows_of_ids_seen_and_cost_far_below_dense():
    net = Network((3,), [Embedding(VOCAB, DIM), Flatten(), Dense(4, activation="relu"), Output(2)],
                  updater=SGD(lr=0.1), seed=0)
    table = net.layers[0].W
    start = (table.__array_interface__["data"][0] - net.params.__array_interface__["data"][0]) // 4
    stop = start + table.size
    state = SharingState(FixedThreshold(1e-3), net.num_params)
    update = np.zeros(net.num_params, np.float32)
    rng = np.random.default_rng(1)
    seen, sparse_bytes = set(), []
    for step in range(20):
        x = rng.integers(0, VOCAB, (16, 3))
        y = rng.integers(0, 2, 16)
        seen.update(x.ravel().tolist())
        net.compute_update(x, y, update)
        message = encode_update(state, update)
        moved = np.zeros(net.num_params, np.float32)
        decode(message, moved)
        rows = set((np.flatnonzero(moved[start:stop]) // DIM).tolist())
        assert rows and rows <= seen, f"step {step}: rows {sorted(rows - seen)[:5]} never were in a minibatch"
        wire = message_bytes(message)
        apply_message(wire, net.params)
        if step:  # the encoder's first message is a bitmap (2 bits a parameter); then sparse
            sparse_bytes.append(len(wire))
    # 16 x 3 ids x 8 dims touch at most 384 table entries (plus the small dense layers): far from the table.
    assert max(sparse_bytes) < net.num_params * 4 / 20


def _table_model(lazy, updater, seed=0):
    from sparkavg.nn import Adam  # noqa: F401

    return Network((3,), [Embedding(VOCAB, DIM, lazy=lazy), Flatten(), Dense(4, activation="relu"), Output(2)],
                   updater=updater, l2=1e-4, seed=seed)


def test_a_lazy_table_leaves_rows_not_in_the_batch_exactly_as_they_were():
    from sparkavg.nn import Adam

    net = _table_model(True, Adam(lr=1e-2))
    rng = np.random.default_rng(3)
    first = rng.integers(0, 100, (16, 3))
    net.fit_batch(first, rng.integers(0, 2, 16))  # rows < 100 get Adam moments
    state_before, table_before = net.updater_state.copy(), net.layers[0].W.copy()
    second = rng.integers(100, 200, (16, 3))
    update = np.zeros(net.num_params, np.float32)
    net.compute_update(second, rng.integers(0, 2, 16), update)
    rows = np.unique(second)
    untouched = np.setdiff1d(np.arange(VOCAB), rows)
    table_update = update[:VOCAB * DIM].reshape(VOCAB, DIM)  # the table is the first parameters
    assert not table_update[untouched].any() and table_update[rows].all()
    n = net.num_params
    for j in range(2):  # Adam's m and v of the untouched rows: as they were
        block = net.updater_state[j * n:j * n + VOCAB * DIM].reshape(VOCAB, DIM)
        before = state_before[j * n:j * n + VOCAB * DIM].reshape(VOCAB, DIM)
        np.testing.assert_array_equal(block[untouched], before[untouched])
        assert not np.array_equal(block[rows], before[rows])
    # fit_batch is compute_update + apply_update: untouched rows of the table do not move
    net.fit_batch(second, rng.integers(0, 2, 16))
    np.testing.assert_array_equal(net.layers[0].W[untouched], table_before[untouched])
    # an eager table with Adam moves the rows of the first batch again (their momentum)
    eager = _table_model(False, Adam(lr=1e-2))
    eager.fit_batch(first, rng.integers(0, 2, 16))
    moved = eager.layers[0].W[np.unique(first)].copy()
    eager.fit_batch(second, rng.integers(0, 2, 16))
    assert not np.array_equal(eager.layers[0].W[np.unique(first)], moved)


def test_lazy_is_kept_in_the_configuration_and_absent_when_off():
    from sparkavg.nn import SGD as _SGD
    from sparkavg.nn import model_from_json

    lazy, eager = _table_model(True, _SGD(0.1)), _table_model(False, _SGD(0.1))
    assert model_from_json(lazy.to_json()).layers[0].lazy
    assert "lazy" not in eager.to_json() and lazy.fingerprint() != eager.fingerprint()
