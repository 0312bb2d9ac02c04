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

Arguments: model, training examples, epochs, ``B``, seed, frequencies
(comma-separated), and optionally an Adam learning rate for the torch
models (default 1e-3), e.g. ``0.000707`` for one process at ``1/sqrt(2)``
of it.  Prints one line per frequency: test accuracy, seconds.
"""
from __future__ import annotations

import os
import sys
import time

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
        raise SystemExit("Expect: model examples epochs batch seed frequencies [lr], got " + " ".join(args))
    model, n, epochs, b, seed = args[0], int(args[1]), int(args[2]), int(args[3]), int(args[4])
    frequencies = [int(f) for f in args[5].split(",")]
    lr = float(args[6]) if len(args) == 7 else None
    if lr is not None and not model.startswith("torch-"):
        raise SystemExit(f"Expect a torch-* model with a learning rate, got {model!r}")

    def make():
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
        for f in frequencies:
            t = time.perf_counter()
            replicas = [make()] if f == 0 else [make(), make()]
            step = 0
            for epoch in range(epochs):
                for xb, yb in minibatches(x, y, 2 * b, shuffle=True, seed=seed + epoch):
                    if f == 0:
                        replicas[0].fit_batch(xb, yb)
                        continue
                    h = len(yb) // 2
                    replicas[0].fit_batch(xb[:h], yb[:h])
                    replicas[1].fit_batch(xb[h:], yb[h:])
                    step += 1
                    if step % f == 0:
                        sa, sb = replicas[0].state, replicas[1].state
                        for name in ("params", "updater", "buffers"):
                            if sa[name].size:
                                sa[name][...] = 0.5 * (sa[name] + sb[name])
                                sb[name][...] = sa[name]
            accuracy = evaluate_local(replicas[0], xt, yt).accuracy()
            print(f"{model} {'one process' if f == 0 else f'F {f}'}{'' if lr is None else f' lr {lr:g}'} "
                  f"{accuracy:.4f} {time.perf_counter() - t:.1f}", flush=True)


if __name__ == "__main__":
    main()
