#!/usr/bin/env python
"""Per-step time of the engine against plain numpy, same run, same threads.

Cases (``--cases``, all by default), each at 1 and 2 BLAS/OpenMP threads
(``--threads``):

``mlp16``
    DL4J's MnistMLP (784-500-100-10, leaky ReLU, Xavier, Nesterov(lr 0.02,
    momentum 0.9), L2 1e-4, softmax + NLL; as benchmarks/bench_averaging.py
    builds it) at batch 16.  Baselines: ``numpy_step``, the same step
    hand-written in plain numpy (preallocated buffers, in-place ufuncs:
    forward, softmax + NLL, backward, L2, Nesterov, the loss with its L2
    penalty read back as a float), and ``gemm_only``, its 8 GEMMs alone.
``lenet32``, ``lenet64``
    sparkavg.nn.zoo's LeNet (Adam) at batch 32 and 64.  Baseline:
    ``gemm_only``, the GEMMs of one step with LeNet's shapes (the part no
    engine can skip; im2col, pooling and Adam come on top).
``resnet32``, ``resnet64``
    examples/mnist_resnet.py's Graph (3x3 convs with BatchNorm, two
    residual blocks; Adam) at batch 32 and 64; no baseline variant (use
    ``--against`` for before/after, bench_lenet.py for PyTorch).
``lenet32opts``
    What a learning-rate schedule and gradient clipping add to a step
    (issue 35): LeNet (10 classes, Adam) at batch 32 three times over, at a
    constant rate (``fit_batch``, ``compute_update``), at a
    ``CosineSchedule`` by iteration (``*_cosine``: a new rate, so a new
    constant-rate updater, every step) and with ``ClipGlobalNorm`` at a
    norm every step exceeds (``*_clip``: the norm and the scaling pass);
    and the added work alone, ``schedule_only`` (the step's rate resolved
    at a new iteration) and ``clip_only`` (the clipping of LeNet's
    gradient), which a loaded machine blurs less than the difference of two
    whole steps.  The table's last lines give each one's extra time over
    the constant rate's step.

For the engine both ``compute_update`` (into a caller's buffer, as the
gradient-sharing worker calls it) and ``fit_batch`` (as parameter
averaging's workers and a local fit call it) are timed.  Everything runs
in alternating blocks of ``--block`` steps after a warm-up, so load from
other processes hits every variant alike; the figures are medians in
milliseconds.  Prints a table, then JSON (``--out`` writes it)::

    OPENBLAS_NUM_THREADS=2 python benchmarks/bench_step.py --out /tmp/step.json
    python benchmarks/bench_step.py --cases mlp16 --threads 1 --steps 300   # quick

Before/after a change, in one run: ``--against DIR`` names another source
tree of sparkavg (say ``git worktree add /tmp/before <commit>`` with its
kernels built in place).  Two worker processes, one importing each tree,
build the same cases and run the engine's variants in alternating blocks
on the parent's command (only one runs at a time), so both see the same
machine; the table then compares ``fit_batch`` and ``compute_update``
of this tree against the other::

    python benchmarks/bench_step.py --against /tmp/before --out /tmp/step_vs_before.json
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

import numpy as np
from report import alternating_blocks, emit

if "--serve" not in sys.argv:  # a --serve worker imports the tree its PYTHONPATH names
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

CASES = ("mlp16", "lenet32", "lenet64", "resnet32", "resnet64", "lenet32opts")
#: The variants of ``lenet32opts`` beside the constant rate's, by suffix.
OPTIONS = ("_cosine", "_clip")
LEAKY = np.float32(0.01)


def mnist_mlp(seed: int):
    """As benchmarks/bench_averaging.py's ``mnist_mlp``."""
    from sparkavg.nn import Dense, Nesterov, Network, Output

    return Network((784,), [Dense(500, activation="leaky_relu"), Dense(100, activation="leaky_relu"),
                            Output(10, activation="softmax", loss="nll")],
                   updater=Nesterov(lr=0.02, momentum=0.9), l2=1e-4, seed=seed)


class NumpyMLP:
    """The MnistMLP step written out in plain numpy: every buffer allocated
    once, every element-wise op in place; float32 like the engine."""

    def __init__(self, net, batch: int, lr=0.02, momentum=0.9, l2=1e-4):
        f = np.float32
        self.W = [layer.W.copy() for layer in net.layers]
        self.b = [layer.b.copy() for layer in net.layers]
        self.dW = [np.zeros_like(w) for w in self.W]
        self.db = [np.zeros_like(b) for b in self.b]
        self.vW = [np.zeros_like(w) for w in self.W]
        self.vb = [np.zeros_like(b) for b in self.b]
        self.tmpW = [np.zeros_like(w) for w in self.W]
        self.tmpb = [np.zeros_like(b) for b in self.b]
        self.a = [np.zeros((batch, w.shape[1]), f) for w in self.W]  # activations
        self.t = [np.zeros_like(a) for a in self.a]  # scratch
        self.d = [np.zeros_like(a) for a in self.a]
        self.ones = np.ones(batch, f)
        self.lr, self.mu, self.l2 = f(lr), f(momentum), f(l2)

    def gemms(self, x):
        a, W, d = self.a, self.W, self.d
        np.matmul(x, W[0], out=a[0])
        np.matmul(a[0], W[1], out=a[1])
        np.matmul(a[1], W[2], out=a[2])
        np.matmul(a[1].T, d[2], out=self.dW[2])
        np.matmul(d[2], W[2].T, out=d[1])
        np.matmul(a[0].T, d[1], out=self.dW[1])
        np.matmul(d[1], W[1].T, out=d[0])
        np.matmul(x.T, d[0], out=self.dW[0])

    def step(self, x, y) -> float:
        a, W, b, t, d = self.a, self.W, self.b, self.t, self.d
        n = x.shape[0]
        h = x
        for i in range(3):
            np.matmul(h, W[i], out=a[i])
            a[i] += b[i]
            if i < 2:  # leaky ReLU: max(z, alpha z)
                np.multiply(a[i], LEAKY, out=t[i])
                np.maximum(a[i], t[i], out=a[i])
            h = a[i]
        z, p = a[2], t[2]
        zmax = z.max(axis=1, keepdims=True)
        np.subtract(z, zmax, out=p)
        np.exp(p, out=p)
        zsum = p.sum(axis=1, keepdims=True)
        loss = float((zmax + np.log(zsum) - z[np.arange(n), y][:, None]).sum()) / n
        p /= zsum
        d[2][...] = p
        d[2][np.arange(n), y] -= 1
        d[2] *= np.float32(1.0 / n)
        for i in (2, 1, 0):
            inp = x if i == 0 else a[i - 1]
            np.matmul(inp.T, d[i], out=self.dW[i])
            np.matmul(self.ones, d[i], out=self.db[i])
            if i > 0:
                np.matmul(d[i], W[i].T, out=d[i - 1])
                np.greater(a[i - 1], 0, out=t[i - 1])  # leaky ReLU': max(a > 0, alpha)
                np.maximum(t[i - 1], LEAKY, out=t[i - 1])
                d[i - 1] *= t[i - 1]
        penalty = 0.0
        for i in range(3):
            penalty += 0.5 * float(self.l2) * float(W[i].ravel() @ W[i].ravel())
            np.multiply(W[i], self.l2, out=self.tmpW[i])
            self.dW[i] += self.tmpW[i]
            for p_, g, v, tmp in ((W[i], self.dW[i], self.vW[i], self.tmpW[i]),
                                  (b[i], self.db[i], self.vb[i], self.tmpb[i])):
                # DL4J Nesterov: v' = mu v - lr g; p += -mu v + (1 + mu) v'
                np.multiply(v, -self.mu, out=tmp)
                p_ += tmp
                v *= self.mu
                np.multiply(g, self.lr, out=tmp)
                v -= tmp
                np.multiply(v, self.mu + np.float32(1), out=tmp)
                p_ += tmp
        return loss + penalty


def lenet_gemms(batch: int):
    """The GEMMs of one LeNet step (forward, dW, dx) with preallocated outputs."""
    rng = np.random.default_rng(0)

    def r(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    shapes = [  # (M, K, N) of forward; backward adds dW = A^T dZ and dX = dZ W^T where needed
        (batch * 24 * 24, 26, 20, False),   # conv1 (im2col rows + ones column), no dx
        (batch * 8 * 8, 501, 50, True),     # conv2
        (batch, 800, 500, True),            # dense
        (batch, 500, 10, True),             # output
    ]
    ops = []
    for m, k, n, need_dx in shapes:
        a, w, z = r(m, k), r(k, n), r(m, n)
        y, dw = np.empty((m, n), np.float32), np.empty((k, n), np.float32)
        ops.append((a, w, y))
        ops.append((a.T, z, dw))
        if need_dx:
            ops.append((z, w.T, np.empty((m, k), np.float32)))

    def run():
        for left, right, out in ops:
            np.matmul(left, right, out=out)
    return run


def _images(batch, shape, seed):
    rng = np.random.default_rng(seed)
    return rng.random((batch,) + shape, dtype=np.float32), rng.integers(0, 10, batch)


def mnist_resnet(seed: int):
    """examples/mnist_resnet.py's Graph (this tree's file, on the sparkavg
    that is imported: the same model in both workers of ``--against``)."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
    from mnist_resnet import build

    return build(seed=seed)


def option_variants(seed: int) -> dict:
    """``lenet32opts``: LeNet's step at a constant rate, at a CosineSchedule
    and with ClipGlobalNorm, each through ``compute_update`` and ``fit_batch``."""
    from sparkavg.nn import Adam, ClipGlobalNorm, CosineSchedule, lenet

    x, y = _images(32, (1, 28, 28), seed)
    models = {suffix: lenet(seed=seed) for suffix in ("",) + OPTIONS}
    models["_cosine"].updater = Adam(lr=CosineSchedule(1e-3, steps=10 ** 7, warmup=10))
    models["_clip"].gradient_normalization = ClipGlobalNorm(1e-6)  # below any step's norm: always scaled
    steps = {}
    for suffix, net in models.items():
        out = np.zeros(net.num_params, net.dtype)
        steps["compute_update" + suffix] = lambda net=net, out=out: net.compute_update(x, y, out)
        steps["fit_batch" + suffix] = lambda net=net: net.fit_batch(x, y)
    scheduled, clipped = models["_cosine"], models["_clip"]

    def schedule_only():
        scheduled.iteration += 1
        scheduled.flat.step_updater()

    steps["schedule_only"] = schedule_only
    steps["clip_only"] = clipped.flat.normalize_gradient
    return steps


def variants(case: str, seed: int) -> dict:
    """name -> zero-argument step function for one case."""
    from sparkavg.nn import lenet

    if case == "lenet32opts":
        return option_variants(seed)
    if case == "mlp16":
        batch, make, shape = 16, mnist_mlp, (784,)
    elif case.startswith("resnet"):
        batch, make, shape = int(case[len("resnet"):]), mnist_resnet, (1, 28, 28)
    else:
        batch, make, shape = int(case[len("lenet"):]), lenet, (1, 28, 28)
    x, y = _images(batch, shape, seed)
    net_cu, net_fit = make(seed), make(seed)
    out = np.zeros(net_cu.num_params, net_cu.dtype)
    steps = {
        "compute_update": lambda: net_cu.compute_update(x, y, out),
        "fit_batch": lambda: net_fit.fit_batch(x, y),
    }
    if case == "mlp16":
        plain = NumpyMLP(make(seed), batch)
        xf = x.reshape(batch, -1)
        steps["numpy_step"] = lambda: plain.step(xf, y)
        steps["gemm_only"] = lambda: plain.gemms(xf)
    elif case.startswith("lenet"):
        steps["gemm_only"] = lenet_gemms(batch)
    return steps


def measure(steps: dict, warmup: int, total: int, block: int, settle: int) -> dict:
    """Median ms per step of each variant, in alternating blocks of ``block``
    steps until each has ``total`` (rounded up to whole blocks)."""
    times = alternating_blocks(steps, -(-total // block), block, warmup, settle)
    return {name: round(1e3 * statistics.median(ts), 4) for name, ts in times.items()}


ENGINE = ("compute_update", "fit_batch")


def serve() -> None:
    """Worker mode (``--serve``): build cases on command and time blocks of one variant.

    Commands on stdin, one JSON per line: ``{"case", "seed"}`` builds a
    case's variants; ``{"run", "threads", "block", "settle"}`` runs a
    block and answers the seconds of each timed step; ``{"quit"}``."""
    import json

    from sparkavg.threads import limit_threads

    steps = {}
    for line in sys.stdin:
        cmd = json.loads(line)
        if "quit" in cmd:
            return
        if "case" in cmd:
            steps = variants(cmd["case"], cmd["seed"])
            reply = {"ok": True}
        else:
            fn = steps[cmd["run"]]
            with limit_threads(cmd["threads"]):
                for _ in range(cmd["settle"]):
                    fn()
                times = []
                for _ in range(cmd["block"]):
                    t = time.perf_counter()
                    fn()
                    times.append(time.perf_counter() - t)
            reply = {"times": times}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


def against(args) -> dict:
    """This tree's engine against ``args.against``'s, alternating blocks in two workers."""
    import json
    import subprocess

    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    trees = {"this": os.path.abspath(here), "other": os.path.abspath(args.against)}
    workers = {}
    for name, tree in trees.items():
        env = dict(os.environ, PYTHONPATH=tree)
        workers[name] = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--serve"], env=env,
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=tree)

    def ask(name, **cmd):
        workers[name].stdin.write(json.dumps(cmd) + "\n")
        workers[name].stdin.flush()
        return json.loads(workers[name].stdout.readline())

    rows = []
    try:
        for case in args.cases:
            for name in trees:
                ask(name, case=case, seed=args.seed)
            total = args.steps if case.startswith("mlp") else max(args.block, args.steps // 5)
            for threads in args.threads:
                times = {(t, v): [] for t in trees for v in ENGINE}
                for t in trees:
                    for v in ENGINE:
                        ask(t, run=v, threads=threads, block=args.warmup, settle=0)
                for _ in range(0, total, args.block):
                    for v in ENGINE:
                        for t in trees:
                            times[(t, v)] += ask(t, run=v, threads=threads, block=args.block,
                                                 settle=args.settle)["times"]
                ms = {f"{t}_{v}": round(1e3 * statistics.median(ts), 4) for (t, v), ts in times.items()}
                ratios = {f"{v}_ratio": ms[f"this_{v}"] / ms[f"other_{v}"] for v in ENGINE}
                rows.append({"case": case, "threads": threads, "ms": ms, **ratios})
                print(f"{case:<9} {threads:>3} " + " ".join(f"{v} {ms[f'this_{v}']:.3f} vs {ms[f'other_{v}']:.3f} "
                                                           f"({ratios[f'{v}_ratio']:.3f}x)" for v in ENGINE),
                      file=sys.stderr)
    finally:
        for name in trees:
            try:
                ask(name, quit=True)
            except (BrokenPipeError, ValueError):
                pass
            workers[name].wait(timeout=30)
    return {"benchmark": "bench_step --against", "unit": "ms per step (median)", "trees": trees,
            "machine": {"python": platform.python_version(), "numpy": np.__version__, "cpu_count": os.cpu_count()},
            "settings": {k: v for k, v in vars(args).items() if k != "out"}, "rows": rows}


def _parse(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES))
    p.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--steps", type=int, default=600, help="timed steps per variant (LeNet: a fifth)")
    p.add_argument("--block", type=int, default=20)
    p.add_argument("--settle", type=int, default=2)
    p.add_argument("--seed", type=int, default=123)
    p.add_argument("--out", help="also write the JSON here")
    p.add_argument("--against", help="another sparkavg source tree: compare the engine's steps, same run")
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv=None):
    args = _parse(argv)
    if args.serve:
        return serve()
    if args.against:
        return emit(against(args), args.out)
    from sparkavg.ops import have_extension
    from sparkavg.threads import limit_threads

    rows = []
    for case in args.cases:
        steps = variants(case, args.seed)
        total = args.steps if case.startswith("mlp") else max(args.block, args.steps // 5)
        for threads in args.threads:
            with limit_threads(threads):
                ms = measure(steps, args.warmup, total, args.block, args.settle)
            rows.append({"case": case, "threads": threads, "ms": ms})
    names = ("compute_update", "fit_batch", "numpy_step", "gemm_only")
    print(f"{'case':<11} {'thr':>3} " + " ".join(f"{n:>15}" for n in names), file=sys.stderr)
    for row in rows:
        cells = [f"{row['ms'][n]:>15.3f}" if n in row["ms"] else f"{'-':>15}" for n in names]
        print(f"{row['case']:<11} {row['threads']:>3} " + " ".join(cells), file=sys.stderr)
    for row in rows:
        if row["case"] == "lenet32opts":
            ms = row["ms"]
            row["extra_percent"] = {f"{v}{s}": round(100 * (ms[v + s] / ms[v] - 1), 2) for v in ENGINE
                                    for s in OPTIONS}
            row["extra_percent"].update({part: round(100 * ms[part] / ms["fit_batch"], 3)
                                         for part in ("schedule_only", "clip_only")})
            print(f"lenet32opts {row['threads']:>3} threads, extra time over the constant rate: "
                  + ", ".join(f"{k} {ms[k]:.3f} ms ({p:+.2f}%)" for k, p in row["extra_percent"].items()),
                  file=sys.stderr)
    result = {
        "benchmark": "bench_step",
        "unit": "ms per step (median)",
        "machine": {"python": platform.python_version(), "numpy": np.__version__,
                    "cpu_count": os.cpu_count(), "cython_kernels": have_extension()},
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        "rows": rows,
    }
    emit(result, args.out)
    return result


if __name__ == "__main__":
    main()
