#!/usr/bin/env python
"""Issue 21's exploratory diagnosis of the torch LSTM (kept so its figures in
benchmarks/history/torch.md can be re-run; ``sim_local_sgd.py`` is the maintained
simulation).  As ``sim_local_sgd.py``: 2 replicas fit the halves of every
2 B minibatch of one process's order and are averaged every F steps, but
rounds run on across epochs (``step % F``), the state correction (``v``)
is the per-coordinate first version (capped per coordinate, not pooled per
tensor), and it also takes SGD and a torch LSTM with forget-gate bias 1.

    python benchmarks/diag_torch_lstm.py MODEL EXAMPLES EPOCHS B SEEDS MODES [adam|sgd] [LR]

MODEL: torch-lstm, torch-lstm-fb1 (forget-gate bias 1), lstm, lenet, ...
(``bench_parity`` names).  MODES (comma-separated): ``one`` (one process at
2 B), ``F<n>`` (plain averaging every n), ``S<a>/<b>`` (a in the first
epoch, b after), suffixes ``v`` (state corrected) and ``b`` (block momentum
1 - 1/2, Nesterov).
"""
import os, sys, time
_here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(_here, "..", "examples"))
sys.path.insert(0, _here)
import numpy as np

def lstm_fb1(num_classes=10, units=128, features=28):
    from sparkavg.torch.zoo import lstm
    import torch
    m = lstm(num_classes, units, features)
    with torch.no_grad():
        for name, p in m.lstm.named_parameters():
            if name.startswith("bias"):
                p[units:2 * units] = 0.5  # ih + hh = 1 on the forget gate
    return m

def make(model, seed, upd, lr):
    from sparkavg.nn import Adam, SGD
    from bench_parity import build
    from sparkavg.torch import TorchModel
    u = Adam(lr=lr) if upd == "adam" else SGD(lr=lr)
    if model == "torch-lstm":
        return TorchModel("sparkavg.torch.zoo:lstm", updater=u, input_shape=(1, 28, 28), seed=seed)
    if model == "torch-lstm-fb1":
        return TorchModel(lstm_fb1, updater=u, input_shape=(1, 28, 28), seed=seed)
    net = build(model, seed)
    if upd != "adam" or lr != 1e-3:
        raise SystemExit(f"Expect Adam(1e-3) for the native model {model!r}, got {upd} {lr}")
    return net

def main():
    from mnist_lenet import evaluate_local
    from sparkavg.data.batching import minibatches
    from sparkavg.data.mnist import default_data_dir, load_mnist
    from sparkavg.threads import limit_threads
    model, n, epochs, b = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    seeds = [int(s) for s in sys.argv[5].split(",")]
    modes = sys.argv[6].split(",")
    upd = sys.argv[7] if len(sys.argv) > 7 else "adam"
    lr = float(sys.argv[8]) if len(sys.argv) > 8 else 1e-3
    x, y = load_mnist(default_data_dir(), "train", limit=n)
    xt, yt = load_mnist(default_data_dir(), "test")
    with limit_threads(1):
        for mode in modes:
            accs = []
            for seed in seeds:
                t = time.perf_counter()
                sched = None
                if mode.startswith("S"):
                    sched = [int(v) for v in mode[1:].rstrip("vb").split("/")]
                    f = sched[0]
                else:
                    f = 0 if mode == "one" else int(mode[1:].rstrip("vb"))
                bm = mode.endswith("b")
                W = delta = None
                vfix = "v" in mode[1:]
                reps = [make(model, seed, upd, lr)] if f == 0 else [make(model, seed, upd, lr) for _ in range(2)]
                step = 0
                vprev = None
                start = reps[0].state["params"].copy()
                for epoch in range(epochs):
                    if sched:
                        f = sched[min(epoch, len(sched) - 1)]; step = 0
                    for xb, yb in minibatches(x, y, 2 * b, shuffle=True, seed=seed + epoch):
                        if f == 0:
                            reps[0].fit_batch(xb, yb); continue
                        h = len(yb) // 2
                        reps[0].fit_batch(xb[:h], yb[:h]); reps[1].fit_batch(xb[h:], yb[h:])
                        step += 1
                        if step % f == 0:
                            sa, sb = reps[0].state, reps[1].state
                            if vfix and sa["updater"].size:
                                k = sa["params"].size
                                ma, mb = sa["updater"][:k], sb["updater"][:k]
                                c = (1 - 0.9) / (1 + 0.9) * (1 - 0.9 ** (2 * f))
                                var = (ma - mb) ** 2 / 2 / c  # sigma^2/B estimate
                                vavg = 0.5 * (sa["updater"][k:] + sb["updater"][k:])
                                if vprev is None:
                                    vprev = np.zeros_like(vavg)
                                w = 1 - 0.999 ** f
                                fresh = vavg - 0.999 ** f * vprev
                                vnew = vavg - np.minimum(0.5 * w * var, 0.5 * fresh)
                                vprev = vnew
                            for name in ("params", "updater", "buffers"):
                                if sa[name].size:
                                    sa[name][...] = 0.5 * (sa[name] + sb[name]); sb[name][...] = sa[name]
                            if bm:
                                if W is None:
                                    W = start.copy(); delta = np.zeros_like(W)
                                G = sa["params"] - (W + 0.5 * delta)
                                delta = 0.5 * delta + G
                                W = W + delta
                                sa["params"][...] = W + 0.5 * delta; sb["params"][...] = sa["params"]
                            if vfix and sa["updater"].size:
                                sa["updater"][k:] = vnew; sb["updater"][k:] = vnew
                if bm and W is not None:
                    reps[0].state["params"][...] = W
                acc = evaluate_local(reps[0], xt, yt).accuracy()
                accs.append(acc)
                print(f"{model} {upd} lr {lr:g} {mode} seed {seed} {acc:.4f} {time.perf_counter()-t:.1f}s", flush=True)
            print(f"== {model} {upd} lr {lr:g} {mode} mean {np.mean(accs):.4f}", flush=True)

main()
