#!/usr/bin/env python
"""The conv weight-gradient GEMM two ways, on LeNet's shapes (batch 64).

``Conv2D.backward`` computes [dW; db] = cols.T @ dz, a (K+1, F) matrix.
For a tall one (K+1 >= 2F) it computes the (F, K+1) transpose
dz.T @ cols and copies it back instead.  This times both formulations,
in alternating blocks in one process, on conv1 (36864 x 26 -> 26 x 20,
not tall) and conv2 (4096 x 501 -> 501 x 50, tall), with 1 and 2 BLAS
threads; the baseline is the plain formulation in the same run.

    python benchmarks/bench_conv_dw.py --out benchmarks/results/conv_dw.json
"""
from __future__ import annotations

import argparse
import statistics

import numpy as np
from threadpoolctl import threadpool_limits

from report import alternating_blocks, emit

# (rows = N*OH*OW, K+1, F) of LeNet's two convolutions at batch 64
SHAPES = {"conv1": (36864, 26, 20), "conv2": (4096, 501, 50)}


def formulations(cols, dz):
    k1, f = cols.shape[1], dz.shape[1]
    out = np.empty((k1, f), np.float32)
    out_t = np.empty((f, k1), np.float32)

    def plain():
        np.matmul(cols.T, dz, out=out)

    def transposed():
        np.matmul(dz.T, cols, out=out_t)
        out[...] = out_t.T

    return {"plain": plain, "transposed": transposed}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--blocks", type=int, default=20)
    p.add_argument("--block", type=int, default=10, help="timed calls per block")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    rng = np.random.default_rng(0)
    rows = []
    for name, (m, k1, f) in SHAPES.items():
        cols = rng.random((m, k1), dtype=np.float32)
        dz = rng.random((m, f), dtype=np.float32)
        funcs = formulations(cols, dz)
        for threads in (1, 2):
            with threadpool_limits(threads):
                times = alternating_blocks(funcs, args.blocks, args.block, warmup=5)
            plain, transposed = (1000 * statistics.median(times[k]) for k in ("plain", "transposed"))
            rows.append({"layer": name, "shape": [m, k1, f], "tall": k1 >= 2 * f, "threads": threads,
                         "plain_ms": plain, "transposed_ms": transposed, "transposed_over_plain": transposed / plain})
    return emit({"benchmark": "conv_dw", "results": rows}, args.out)


if __name__ == "__main__":
    main()
