#!/usr/bin/env python
"""One convolution's forward + backward three ways, same run: the direct
kernels (``sparkavg.ops.conv2d_*``), im2col + GEMM (what ``Conv2D`` ran
before them: im2col with the ones column and ``cols @ [W; b]``, the
``[dW; db]`` GEMM in the layer's orientation, ``dz @ W.T`` then col2im),
and PyTorch CPU's ``nn.Conv2d`` (oneDNN; forward, then backward for the
weights, the bias and -- except for a first layer's 1 input channel --
the input).

Shapes (``--convs``): the convolutions of examples/mnist_resnet.py
(3x3, padding 1: 1->16 and 16->16 at 28x28, 16->32 and 32->32 at 14x14)
and of LeNet (5x5, no padding: 1->20 at 28x28, 20->50 at 12x12).  Each
variant runs in alternating blocks (``--blocks`` of ``--reps`` calls,
after a warm-up); the figure is the median over blocks of each block's
median, in milliseconds, per part (fwd / dW / dx) and in total.  Threads:
``threadpoolctl`` limits OpenBLAS and OpenMP, ``torch.set_num_threads``
PyTorch's.

    python benchmarks/bench_conv_direct.py --threads 1 2 --out /tmp/conv_direct.json
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np
from threadpoolctl import threadpool_limits

from report import emit

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

# name -> (C, F, H=W, kernel, padding)
CONVS = {
    "1-16@28": (1, 16, 28, 3, 1),
    "16-16@28": (16, 16, 28, 3, 1),
    "16-32@14": (16, 32, 14, 3, 1),
    "32-32@14": (32, 32, 14, 3, 1),
    "lenet1": (1, 20, 28, 5, 0),
    "lenet2": (20, 50, 12, 5, 0),
}


def variants(conv, batch, rng):
    """name -> {part: callable} for one convolution."""
    import torch

    from sparkavg import ops
    from sparkavg.ops.elementwise import unchecked

    c, f, hw, k, p = CONVS[conv]
    o = hw + 2 * p - k + 1
    x = rng.standard_normal((batch, hw, hw, c)).astype(np.float32)
    w = rng.standard_normal((k, k, c, f)).astype(np.float32)
    b = rng.standard_normal(f).astype(np.float32)
    dy = rng.standard_normal((batch, o, o, f)).astype(np.float32)
    y, dx, dw, db = np.empty_like(dy), np.empty_like(x), np.empty_like(w), np.empty_like(b)
    kk = k * k * c
    rows = batch * o * o
    cols = np.empty((rows, kk + 1), np.float32)
    wb = np.concatenate([w.reshape(kk, f), b[None]], 0)
    y2, dwb, dwb_t = np.empty((rows, f), np.float32), np.empty_like(wb), np.empty((f, kk + 1), np.float32)
    dcols = np.empty((rows, kk), np.float32)
    dz = dy.reshape(rows, f)

    def gemm_fwd():
        unchecked("im2col", x, x, k, k, 1, 1, p, p, cols, True)
        np.matmul(cols, wb, out=y2)

    def gemm_dw():  # Conv2D.backward's orientation choice
        if kk + 1 >= 2 * f:
            np.matmul(dz.T, cols, out=dwb_t)
            dwb[...] = dwb_t.T
        else:
            np.matmul(cols.T, dz, out=dwb)

    def gemm_dx():
        np.matmul(dz, wb[:kk].T, out=dcols)
        unchecked("col2im", dz, dcols, k, k, 1, 1, p, p, dx)

    tx = torch.from_numpy(x).permute(0, 3, 1, 2).contiguous().requires_grad_(c > 1)
    tconv = torch.nn.Conv2d(c, f, k, padding=p)
    tdy = torch.from_numpy(dy).permute(0, 3, 1, 2).contiguous()
    state = {}

    def torch_fwd():
        state["y"] = tconv(tx)

    def torch_bwd():
        state["y"].backward(tdy)

    out = {
        "direct": {"fwd": lambda: ops.conv2d_forward(x, w, b, p, p, y, n_threads=torch.get_num_threads()),
                   "dW": lambda: ops.conv2d_backward_weights(x, dy, p, p, dw, db,
                                                             n_threads=torch.get_num_threads()),
                   "dx": lambda: ops.conv2d_backward_data(dy, w, p, p, dx,
                                                          n_threads=torch.get_num_threads())},
        "gemm": {"fwd": gemm_fwd, "dW": gemm_dw, "dx": gemm_dx},
        "torch": {"fwd": torch_fwd, "bwd": torch_bwd},
    }
    if c == 1:  # a first layer: no input gradient (PyTorch skips it too)
        del out["direct"]["dx"], out["gemm"]["dx"]
    return out


def block_median(fn, reps):
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--convs", nargs="+", choices=list(CONVS), default=list(CONVS))
    p.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--blocks", type=int, default=7)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--out")
    args = p.parse_args(argv)
    import torch

    from sparkavg import ops

    rng = np.random.default_rng(0)
    rows = []
    for threads in args.threads:
        torch.set_num_threads(threads)
        with threadpool_limits(threads):
            for conv in args.convs:
                vs = variants(conv, args.batch_size, rng)
                times = {(v, part): [] for v, parts in vs.items() for part in parts}
                for v, parts in vs.items():  # warm-up
                    for fn in parts.values():
                        fn()
                for _ in range(args.blocks):
                    for v, parts in vs.items():
                        for part, fn in parts.items():
                            if v == "torch" and part == "bwd":
                                continue  # timed with its forward below
                            if v == "torch":
                                t = []
                                for _ in range(args.reps):
                                    t0 = time.perf_counter()
                                    parts["fwd"]()
                                    t1 = time.perf_counter()
                                    parts["bwd"]()
                                    t.append((t1 - t0, time.perf_counter() - t1))
                                times[(v, "fwd")].append(statistics.median(a for a, _ in t) * 1e3)
                                times[(v, "bwd")].append(statistics.median(b for _, b in t) * 1e3)
                            else:
                                times[(v, part)].append(block_median(fn, args.reps))
                ms = {f"{v}_{part}": statistics.median(ts) for (v, part), ts in times.items()}
                total = {v: sum(ms[f"{v}_{part}"] for part in vs[v]) for v in vs}
                row = {"conv": conv, "threads": threads, "ms": ms, "total_ms": total,
                       "direct_vs_gemm": total["direct"] / total["gemm"],
                       "direct_vs_torch": total["direct"] / total["torch"]}
                rows.append(row)
                print(f"{conv:<9} T={threads} direct {total['direct']:6.2f} (fwd {ms['direct_fwd']:.2f} "
                      f"dW {ms['direct_dW']:.2f} dx {ms.get('direct_dx', 0):.2f})  gemm {total['gemm']:6.2f} "
                      f"(fwd {ms['gemm_fwd']:.2f} dW {ms['gemm_dW']:.2f} dx {ms.get('gemm_dx', 0):.2f})  "
                      f"torch {total['torch']:6.2f}  direct/gemm {row['direct_vs_gemm']:.2f} "
                      f"direct/torch {row['direct_vs_torch']:.2f}", file=sys.stderr, flush=True)
    emit({"benchmark": "conv_direct", "batch_size": args.batch_size, "direct_kernels": ops.have_direct_conv(),
          "torch_version": torch.__version__, "load_average": list(os.getloadavg()),
          "command": "python bench_conv_direct.py " + " ".join(argv if argv is not None else sys.argv[1:]),
          "rows": rows}, args.out)


if __name__ == "__main__":
    main()
