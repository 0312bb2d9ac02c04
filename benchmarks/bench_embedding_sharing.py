#!/usr/bin/env python
"""Gradient sharing's bytes for an embedding model against a dense model of
the same parameter count (issue 20), in one process: the threshold path of
one worker (``encode_update`` -> wire bytes -> ``apply_message``), exactly
as a sharing rank runs it, without UDP.

An embedding's gradient touches only the rows of the ids in the minibatch;
the residual/threshold path must keep it that way: this measures the bytes
per iteration each model puts on the wire (``message_bytes``: the int32
words sent, before datagram headers), against the dense update (4 bytes a
parameter), and for the embedding model which sent entries fall in rows of
ids the minibatch did not hold (``untouched_row_entries``).  SGD shows the
threshold path alone; Adam (the examples' updater) shows what an updater
with momentum does: its steps keep moving rows after their ids left the
batch, so those rows' residuals fill up and are sent too;
``adam_lazy_table`` is Adam with ``Embedding(lazy=True)`` (rows not in the
batch get no step: TensorFlow's LazyAdam), which keeps the update sparse.

    python benchmarks/bench_embedding_sharing.py --iterations 300 --out benchmarks/results/embedding_sharing.json
"""
from __future__ import annotations

import argparse
import logging
import time

import numpy as np
from report import emit

from sparkavg.nn import SGD, Adam, Dense, Embedding, Flatten, Network, Output
from sparkavg.ops import decode
from sparkavg.sharing import FixedThreshold, SharingState, apply_message, encode_update
from sparkavg.sharing import message_bytes


def embedding_model(vocab: int, dim: int, length: int, updater, seed: int, lazy: bool = False) -> Network:
    return Network((length,), [Embedding(vocab, dim, lazy=lazy), Flatten(), Dense(32, activation="relu"), Output(2)],
                   updater=updater, seed=seed)


def dense_model(params: int, updater, seed: int) -> Network:
    """Input width F, one hidden layer of 320: about ``params`` parameters."""
    hidden = 320
    width = max(1, round((params - hidden * 2 - 2 - hidden) / hidden))
    return Network((width,), [Dense(hidden, activation="relu"), Output(2)], updater=updater, seed=seed)


def embedding_range(net: Network) -> tuple:
    """``[start, stop)`` of the embedding table's weights in the flat parameter vector."""
    w = net.layers[0].W
    start = (w.__array_interface__["data"][0] - net.params.__array_interface__["data"][0]) // w.itemsize
    return int(start), int(start + w.size)


def run(net: Network, batches, tau: float, dim: int = 0) -> dict:
    state = SharingState(FixedThreshold(tau), net.num_params)
    update = np.zeros(net.num_params, np.float32)
    sent_bytes, entries, untouched, messages = 0, 0, 0, 0
    span = embedding_range(net) if dim else None
    t0 = time.perf_counter()
    for x, y in batches:
        net.compute_update(x, y, update)
        message = encode_update(state, update)
        if message is None:
            continue
        messages += 1
        wire = message_bytes(message)
        sent_bytes += len(wire)
        apply_message(wire, net.params)
        if span is not None:  # which embedding rows the message moved, against the ids in the batch
            moved = np.zeros(net.num_params, np.float32)
            decode(message, moved)
            rows = np.flatnonzero(moved[span[0]:span[1]]) // dim
            untouched += int(np.count_nonzero(~np.isin(rows, np.unique(x))))
        entries += state.encoding.last_count
    seconds = time.perf_counter() - t0
    iterations = len(batches)
    dense = net.num_params * 4
    return {"num_params": int(net.num_params), "iterations": iterations, "messages": messages,
            "bytes_per_iteration": sent_bytes / iterations, "dense_bytes_per_iteration": dense,
            "dense_over_sent": dense * iterations / max(sent_bytes, 1),
            "entries_per_iteration": entries / iterations, "bitmap_messages": state.encoding.bitmap_messages,
            "untouched_row_entries": untouched if span is not None else None, "seconds": seconds}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vocab", type=int, default=20000)
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--length", type=int, default=4, help="ids per example")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--iterations", type=int, default=300)
    p.add_argument("--tau", type=float, default=1e-3, help="GradientSharing's default FixedThreshold(1e-3)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    rng = np.random.default_rng(args.seed)
    effect = rng.standard_normal(args.vocab)
    n = args.batch_size * args.iterations
    ids = rng.integers(0, args.vocab, (n, args.length))
    y_ids = (effect[ids].sum(axis=1) > 0).astype(np.int64)
    updaters = {"sgd": (lambda: SGD(lr=0.1), False), "adam": (lambda: Adam(lr=1e-3), False),
                "adam_lazy_table": (lambda: Adam(lr=1e-3), True)}
    results = {"config": vars(args), "runs": {}}
    for name, (make, lazy) in updaters.items():
        emb = embedding_model(args.vocab, args.dim, args.length, make(), args.seed, lazy)
        dense = dense_model(emb.num_params, make(), args.seed)
        width = dense.input_shape[0]
        xd = rng.standard_normal((n, width)).astype(np.float32)
        yd = (xd @ rng.standard_normal(width) > 0).astype(np.int64)
        b = args.batch_size
        emb_batches = [(ids[s:s + b], y_ids[s:s + b]) for s in range(0, n, b)]
        dense_batches = [(xd[s:s + b], yd[s:s + b]) for s in range(0, n, b)]
        e = run(emb, emb_batches, args.tau, args.dim)
        d = run(dense, dense_batches, args.tau)
        e["embedding_params"] = args.vocab * args.dim
        e["rows_touched_per_iteration_max"] = b * args.length
        results["runs"][name] = {"embedding": e, "dense": d,
                                 "embedding_bytes_over_dense_model_bytes": e["bytes_per_iteration"] /
                                 max(d["bytes_per_iteration"], 1e-9)}
        logging.info("%s: embedding model %d params: %.0f B/iteration (%.0fx below dense updates), %d entries in "
                     "rows not in the batch; dense model %d params: %.0f B/iteration (%.0fx below dense)", name,
                     e["num_params"], e["bytes_per_iteration"], e["dense_over_sent"], e["untouched_row_entries"],
                     d["num_params"], d["bytes_per_iteration"], d["dense_over_sent"])
    emit(results, args.out)


if __name__ == "__main__":
    main()
