"""Gradient sharing keeps an embedding's update sparse: the threshold path
(residual, encoding, wire bytes) sends only entries of rows whose ids were
in the minibatch (or still drain from the residual), never the table."""
import numpy as np

from sparkavg.nn import SGD, Dense, Embedding, Flatten, Network, Output
from sparkavg.ops import decode
from sparkavg.sharing import FixedThreshold, ResidualClipping, SharingState, apply_message, encode_update
from sparkavg.sharing import message_bytes

VOCAB, DIM = 5000, 8


def test_messages_move_only_rows_of_ids_seen_and_cost_far_below_dense():
    net = Network((3,), [Embedding(VOCAB, DIM), Flatten(), Dense(4, activation="relu"), Output(2)],
                  updater=SGD(lr=0.1), seed=0)
    table = net.layers[0].W
    start = (table.__array_interface__["data"][0] - net.params.__array_interface__["data"][0]) // 4
    stop = start + table.size
    state = SharingState(FixedThreshold(1e-3), ResidualClipping(), net.num_params)
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
