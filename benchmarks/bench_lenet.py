"""Train-step time: sparkavg.nn against PyTorch (CPU, or CUDA with --gpu), same run.

``--model lenet`` (default), ``--model resnet`` (examples/mnist_resnet.py's
Graph: two residual blocks with BatchNorm, 43,914 parameters; the same
architecture written in PyTorch: conv 3x3 -> BatchNorm2d -> ReLU, two basic
blocks with identity skips, max-pools, a linear output; CPU only) or
``--model lstm`` (examples/mnist_lstm.py: the image rows as 28 steps into
LSTM(128), the last output to a softmax layer, 81,674 parameters; in
PyTorch ``nn.LSTM(28, 128, batch_first=True)`` and ``nn.Linear(128, 10)`` on
its last output, 82,186 parameters: PyTorch keeps two bias vectors where
one does; CPU only).

One step = forward + backward + Adam(lr=1e-3) on a batch of 64 1x28x28
inputs, for the seeds' LeNet (conv 5x5x20 -> max-pool 2 -> conv 5x5x50 ->
max-pool 2 -> dense 500 relu -> softmax NLL; 431,080 parameters) in both
frameworks, float32, with the same number of BLAS/OpenMP threads
(``torch.set_num_threads`` and ``sparkavg.threads.set_threads``).

The two are measured in alternating blocks of steps (after a warm-up), so
that load from other processes on a shared machine hits both alike; each
block starts with a few untimed steps, because the other library's idle
pool threads (OpenBLAS's, PyTorch's OpenMP) keep spinning for a while after
a hand-over.  The figure is the median step time of each and their ratio.  PyTorch is only
the baseline here, never a dependency of sparkavg.

    python benchmarks/bench_lenet.py --threads 2 --out /tmp/lenet.json

With ``--gpu`` both run on the current CUDA device: the network after
``to_gpu()`` (CuPy) against the same model in PyTorch CUDA (cuDNN, as
installed), at each of ``--batch-sizes`` (default 64, 256, 1024).  The
batches are on the device before timing.  Device work is asynchronous, so
steps are timed in blocks: the device is synchronised, ``--block`` steps
run, the device is synchronised again, and the block's wall time over its
steps is one sample (host overhead and host-device syncs inside a step
count, as they do in training).  ``fit_batch`` returns the loss as a Python
float (a sync every step); PyTorch's step reads nothing back unless
``--torch-item``.  Issue 12's target: sparkavg's median step <= 1.5x
PyTorch CUDA's at every batch size (``checks``).

    python benchmarks/bench_lenet.py --gpu --out /tmp/lenet_gpu.json
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys

import numpy as np
from report import alternating_blocks, emit, indexed


def _parse(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=["lenet", "resnet", "lstm"], default="lenet")
    p.add_argument("--threads", type=int, default=2, help="BLAS/OpenMP threads for both (default 2)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--warmup", type=int, default=20, help="steps of each before timing")
    p.add_argument("--steps", type=int, default=400, help="timed steps of each")
    p.add_argument("--block", type=int, default=10, help="timed steps per alternating block")
    p.add_argument("--settle", type=int, default=3,
                   help="untimed steps at the start of each block (the other library's idle "
                        "threads still spin for a while after it hands over)")
    p.add_argument("--seed", type=int, default=123)
    p.add_argument("--out", help="also write the JSON here")
    p.add_argument("--gpu", action="store_true",
                   help="CuPy on the current CUDA device against PyTorch CUDA")
    p.add_argument("--batch-sizes", type=lambda v: [int(b) for b in v.split(",")],
                   default=[64, 256, 1024], help="with --gpu: batch sizes to run (default 64,256,1024)")
    p.add_argument("--torch-item", action="store_true",
                   help="with --gpu: PyTorch reads the loss back every step, as fit_batch does")
    p.add_argument("--cudnn-benchmark", action="store_true",
                   help="with --gpu: torch.backends.cudnn.benchmark = True")
    return p.parse_args(argv)


def _torch_lenet(torch, seed):
    torch.manual_seed(seed)
    nn = torch.nn
    return nn.Sequential(
        nn.Conv2d(1, 20, 5), nn.MaxPool2d(2), nn.Conv2d(20, 50, 5), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(800, 500), nn.ReLU(), nn.Linear(500, 10),
    )


def _torch_resnet(torch, seed, width=16):
    """examples/mnist_resnet.py's graph, in PyTorch (NCHW)."""
    torch.manual_seed(seed)
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.conv1, self.bn1 = nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c)
            self.conv2, self.bn2 = nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c)

        def forward(self, x):
            y = torch.relu(self.bn1(self.conv1(x)))
            return torch.relu(self.bn2(self.conv2(y)) + x)

    w = width
    return nn.Sequential(
        nn.Conv2d(1, w, 3, padding=1), nn.BatchNorm2d(w), nn.ReLU(), Block(w), nn.MaxPool2d(2),
        nn.Conv2d(w, 2 * w, 3, padding=1), nn.BatchNorm2d(2 * w), nn.ReLU(), Block(2 * w), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(2 * w * 7 * 7, 10),
    )


def _torch_lstm(torch, seed, units=128):
    """examples/mnist_lstm.py's network, in PyTorch: the rows of (N, 1, 28, 28) as 28 steps."""
    torch.manual_seed(seed)
    nn = torch.nn

    class RowLSTM(nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm, self.out = nn.LSTM(28, units, batch_first=True), nn.Linear(units, 10)

        def forward(self, x):
            seq, _ = self.lstm(x.reshape(x.shape[0], 28, 28))
            return self.out(seq[:, -1])

    return RowLSTM()


#: Parameters PyTorch has beyond sparkavg's for the same architecture.
_TORCH_EXTRA_PARAMS = {"lstm": 4 * 128}  # nn.LSTM's second bias vector (bias_hh_l0)


def _models(args, torch):
    """(sparkavg model, torch module) of ``--model``."""
    from sparkavg.nn import Adam, lenet

    if args.model == "lenet":
        return lenet(seed=args.seed, updater=Adam(lr=1e-3)), _torch_lenet(torch, args.seed)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
    if args.model == "lstm":
        from mnist_lstm import build

        return build(seed=args.seed), _torch_lstm(torch, args.seed)
    from mnist_resnet import build

    return build(seed=args.seed), _torch_resnet(torch, args.seed)


def _stats(v):
    q = statistics.quantiles(v, n=4) if len(v) > 1 else [v[0]] * 3
    return {"median_ms": statistics.median(v) * 1e3, "p25_ms": q[0] * 1e3, "p75_ms": q[2] * 1e3,
            "min_ms": min(v) * 1e3}


GPU_TARGET_RATIO = 1.5


def _gpu_requirements():
    """(cupy, torch) or exit saying what is missing."""
    from sparkavg import backend

    if not backend.available():
        raise SystemExit("bench_lenet.py --gpu needs CuPy and a CUDA device: "
                         + backend.unavailable_reason())
    try:
        import torch
    except ImportError as exc:
        raise SystemExit(f"bench_lenet.py --gpu needs PyTorch with CUDA as the baseline, "
                         f"and it does not import ({exc})") from exc
    if not torch.cuda.is_available():
        raise SystemExit(f"bench_lenet.py --gpu needs PyTorch with CUDA as the baseline; "
                         f"torch {torch.__version__} sees no CUDA device")
    return backend.cupy(), torch


def _alternate(args, ours, theirs, sync=None) -> dict:
    """Warm both steps up, then time them in alternating blocks of
    ``args.block`` steps (each after ``args.settle`` untimed ones): per step
    on the CPU; per block between two device syncs (``sync``) on a GPU,
    where a step only queues work.  Returns seconds per step."""
    return alternating_blocks({"sparkavg": indexed(ours), "torch": indexed(theirs)}, -(-args.steps // args.block),
                              args.block, args.warmup, args.settle, sync=sync)


def _torch_step(torch, model, txs, tys, read_loss: bool):
    """PyTorch's Adam(lr=1e-3) training step over the batches ``txs``/``tys``, as ``step(i)``."""
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step(i):
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(txs[i % len(txs)]), tys[i % len(tys)])
        loss.backward()
        opt.step()
        if read_loss:
            loss.item()

    return step


def _gpu_batch(args, cp, torch, batch_size):
    """Both frameworks at one batch size on the device -> result row."""
    rng = np.random.default_rng(args.seed)
    n_batches = 8
    xs = rng.random((n_batches, batch_size, 1, 28, 28), dtype=np.float32)
    ys = rng.integers(0, 10, size=(n_batches, batch_size))
    dxs, dys = [cp.asarray(x) for x in xs], [cp.asarray(y) for y in ys]

    net, model = _models(args, torch)
    net, model = net.to_gpu(), model.cuda()
    txs = [torch.from_numpy(x).cuda() for x in xs]
    tys = [torch.from_numpy(y).cuda() for y in ys]

    def ours(i):
        net.fit_batch(dxs[i % n_batches], dys[i % n_batches])

    theirs = _torch_step(torch, model, txs, tys, read_loss=args.torch_item)  # reading syncs, as fit_batch does

    def sync():
        cp.cuda.Device().synchronize()
        torch.cuda.synchronize()

    times = _alternate(args, ours, theirs, sync)
    ours_s, theirs_s = _stats(times["sparkavg"]), _stats(times["torch"])
    ratio = ours_s["median_ms"] / theirs_s["median_ms"]
    return {
        "batch_size": batch_size,
        "sparkavg": ours_s,
        "torch": theirs_s,
        "sparkavg_ms": ours_s["median_ms"],
        "torch_ms": theirs_s["median_ms"],
        "ratio": ratio,
        "within_target": ratio <= GPU_TARGET_RATIO,
    }


def main_gpu(args):
    cp, torch = _gpu_requirements()
    torch.backends.cudnn.benchmark = bool(args.cudnn_benchmark)
    rows = [_gpu_batch(args, cp, torch, b) for b in args.batch_sizes]
    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    result = {
        "benchmark": f"{args.model}_train_step_gpu",
        "step": "forward+backward+Adam(lr=1e-3), float32, on the device",
        "timing": "blocks of steps between device synchronisations; median of per-step means",
        "steps": args.steps,
        "warmup": args.warmup,
        "block": args.block,
        "settle": args.settle,
        "torch_reads_loss": bool(args.torch_item),
        "cudnn_benchmark": bool(args.cudnn_benchmark),
        "results": rows,
        "checks": {
            f"step_within_{GPU_TARGET_RATIO}x_torch_at_every_batch": all(r["within_target"]
                                                                         for r in rows),
            "max_ratio": max(r["ratio"] for r in rows),
        },
        "gpu": props["name"].decode(),
        "cupy_version": cp.__version__,
        "torch_version": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cudnn_version": torch.backends.cudnn.version(),
        "numpy_version": np.__version__,
        "python": platform.python_version(),
        "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
    }
    return emit(result, args.out)


def main(argv=None):
    args = _parse(argv)
    if args.gpu:
        return main_gpu(args)
    # Both libraries must see the limit before their pools start.
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(args.threads)
    import torch

    from sparkavg import ops
    from sparkavg.threads import set_threads

    torch.set_num_threads(args.threads)
    set_threads(args.threads)

    rng = np.random.default_rng(args.seed)
    n_batches = 8
    xs = rng.random((n_batches, args.batch_size, 1, 28, 28), dtype=np.float32)
    ys = rng.integers(0, 10, size=(n_batches, args.batch_size))

    net, model = _models(args, torch)
    n_torch = sum(p.numel() for p in model.parameters())
    if n_torch - _TORCH_EXTRA_PARAMS.get(args.model, 0) != net.num_params:
        raise SystemExit(f"architectures differ: torch {n_torch} vs sparkavg {net.num_params} parameters")
    txs = [torch.from_numpy(x) for x in xs]
    tys = [torch.from_numpy(y) for y in ys]

    def ours(i):
        net.fit_batch(xs[i % n_batches], ys[i % n_batches])

    theirs = _torch_step(torch, model, txs, tys, read_loss=False)

    times = _alternate(args, ours, theirs)
    ours_s, theirs_s = _stats(times["sparkavg"]), _stats(times["torch"])
    result = {
        "benchmark": f"{args.model}_train_step",
        "step": "forward+backward+Adam(lr=1e-3), float32",
        "batch_size": args.batch_size,
        "threads": args.threads,
        "steps": args.steps,
        "warmup": args.warmup,
        "block": args.block,
        "settle": args.settle,
        "num_params": net.num_params,
        "sparkavg": ours_s,
        "torch": theirs_s,
        "sparkavg_ms": ours_s["median_ms"],
        "torch_ms": theirs_s["median_ms"],
        "ratio": ours_s["median_ms"] / theirs_s["median_ms"],
        "cython_kernels": ops.have_extension(),
        "torch_version": torch.__version__,
        "numpy_version": np.__version__,
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "load_average": os.getloadavg(),
        "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
    }
    return emit(result, args.out)


if __name__ == "__main__":
    main()
