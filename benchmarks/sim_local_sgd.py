#!/usr/bin/env python
"""Parameter averaging simulated in one process, no Spark (issue 22 / 21 diagnostics).

Two replicas of a ``bench_parity.py`` model each fit one half of every
minibatch of one process's own order (``minibatches(x, y, 2 B, shuffle=True,
seed=seed + epoch)``, as ``bench_parity.local_run``), and every ``F`` steps
their parameters, updater state and buffers are averaged (plain averaging,
no block momentum).  ``F = 0`` is the one process at ``2 B``.  With the same
data order as the one process, what is left between them is the algorithm:
at ``F = 1`` a linear updater (SGD, Nesterov) is exactly one process, and
Adam differs only in its second moment (the mean of the workers' ``g^2``
over ``B``-example gradients instead of one ``g^2`` over ``2 B``).

    python benchmarks/sim_local_sgd.py torch-lstm 12000 2 32 123 0,1,5,32
    python benchmarks/sim_local_sgd.py torch-lstm 12000 2 32 123,124,125 0,1c,32b,32bc,32/47bc

Arguments: model, training examples, epochs, ``B``, seeds (comma-separated;
a mean line follows several), frequencies (comma-separated), and
optionally an Adam learning rate for the torch models (default 1e-3), e.g.
``0.000707`` for one process at ``1/sqrt(2)`` of it.  A frequency may be
one per epoch (``32/47``: 32 in the first epoch, 47 after, as
``ParameterAveraging``'s auto chose on 12k x 2) and take the suffixes
``b`` (block momentum as ``ParameterAveraging``'s default preset runs it:
momentum ``1 - 1/2``, Nesterov look-ahead) and ``c`` (the averaged updater
state corrected for the workers' gradient noise,
``sparkavg.spark.policies.moments.correct_second_moment``, as the default
preset's moment correction does).  Prints
one line per frequency and seed: test accuracy, seconds.
"""
from __future__ import annotations

import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main(argv=None):
    from bench_parity import FLAT, build
    from mnist_lenet import evaluate_local

    from sparkavg.data.batching import minibatches
    from sparkavg.data.mnist import default_data_dir, load_mnist
    from sparkavg.threads import limit_threads

    args = sys.argv[1:] if argv is None else argv
    if len(args) not in (6, 7):
        raise SystemExit("Expect: model examples epochs batch seeds frequencies [lr], got " + " ".join(args))
    model, n, epochs, b = args[0], int(args[1]), int(args[2]), int(args[3])
    seeds = [int(s) for s in args[4].split(",")]
    frequencies = args[5].split(",")
    lr = float(args[6]) if len(args) == 7 else None
    if lr is not None and not model.startswith("torch-"):
        raise SystemExit(f"Expect a torch-* model with a learning rate, got {model!r}")

    def make(seed):
        if lr is None:
            return build(model, seed)
        from sparkavg.nn import Adam
        from sparkavg.torch import TorchModel
        return TorchModel(f"sparkavg.torch.zoo:{model[6:]}", updater=Adam(lr=lr), input_shape=(1, 28, 28), seed=seed)
    x, y = load_mnist(default_data_dir(), "train", limit=n)
    xt, yt = load_mnist(default_data_dir(), "test")
    if model in FLAT:
        x, xt = x.reshape(len(x), -1), xt.reshape(len(xt), -1)
    with limit_threads(1):
        for spec in frequencies:
            accuracies = []
            for seed in seeds:
                accuracies.append(run(spec, seed, make, x, y, xt, yt, epochs, b, evaluate_local, minibatches))
                print(f"{model} {'one process' if spec == '0' else f'F {spec}'}{'' if lr is None else f' lr {lr:g}'} "
                      f"seed {seed} {accuracies[-1][0]:.4f} {accuracies[-1][1]:.1f}", flush=True)
            if len(seeds) > 1:
                print(f"{model} {'one process' if spec == '0' else f'F {spec}'} mean of {len(seeds)} "
                      f"{np.mean([a for a, _ in accuracies]):.4f}", flush=True)


def run(spec, seed, make, x, y, xt, yt, epochs, b, evaluate_local, minibatches):
    """One simulated fit of ``spec``: (test accuracy, seconds).  As Spark's
    rounds, a round ends every ``F`` steps and at the end of every epoch."""
    from sparkavg.averaging.merge import block_squares, moment_blocks
    from sparkavg.spark.policies.moments import correct_second_moment

    t = time.perf_counter()
    head = spec.rstrip("bc")
    schedule = [int(f) for f in head.split("/")]
    bm, correct = "b" in spec[len(head):], "c" in spec[len(head):]
    replicas = [make(seed)] if schedule == [0] else [make(seed), make(seed)]
    block = {"w": replicas[0].state["params"].copy()}  # block momentum: W and Delta (1 - 1/2, Nesterov look-ahead)
    block["delta"] = np.zeros_like(block["w"])

    def average(sent, steps):
        sa, sb = replicas[0].state, replicas[1].state
        moment = replicas[0].updater.slot("first_moment", replicas[0].num_params) if correct else None
        for name in ("params", "updater", "buffers"):
            if sa[name].size:
                if name == "updater" and moment is not None:
                    blocks = moment_blocks(replicas[0])
                    m_sq = 0.5 * (block_squares(sa[name][moment], blocks) + block_squares(sb[name][moment], blocks))
                    state = 0.5 * (sa[name].astype(np.float64) + sb[name])
                    correct_second_moment(replicas[0].updater, state, m_sq, sent, 2, steps, blocks)
                    sa[name][...] = state
                else:
                    sa[name][...] = 0.5 * (sa[name] + sb[name])
                sb[name][...] = sa[name]
        if bm:
            w, delta = block["w"], block["delta"]
            delta *= 0.5
            delta += sa["params"] - (w + delta)  # G = W_avg - (W + mu Delta_old)
            w += delta
            sa["params"][...] = w + 0.5 * delta
            sb["params"][...] = sa["params"]

    for epoch in range(epochs):
        f = schedule[min(epoch, len(schedule) - 1)]
        steps = 0
        for xb, yb in minibatches(x, y, 2 * b, shuffle=True, seed=seed + epoch):
            if f == 0:
                replicas[0].fit_batch(xb, yb)
                continue
            if steps == 0:
                sent = replicas[0].state["updater"].astype(np.float64)  # the state the round starts from
            h = len(yb) // 2
            replicas[0].fit_batch(xb[:h], yb[:h])
            replicas[1].fit_batch(xb[h:], yb[h:])
            steps += 1
            if steps == f:
                average(sent, steps)
                steps = 0
        if steps:
            average(sent, steps)
    if bm:
        replicas[0].state["params"][...] = block["w"]
    return evaluate_local(replicas[0], xt, yt).accuracy(), time.perf_counter() - t


if __name__ == "__main__":
    main()
