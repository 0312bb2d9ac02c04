#!/usr/bin/env python
"""BatchNorm and LayerNorm forward + backward on a small ResNet's activation
(64, 28, 28, 16) float32, three ways in alternating blocks in one process:

- ``kernels``: the layers as they run (numpy float32 -> the Cython kernels
  of :mod:`sparkavg.ops.norm`: two fused passes each way);
- ``twins``:   the same layers on the numpy twins (``SPARKAVG_PURE_NUMPY=1``);
- ``tuned``:   BatchNorm in numpy as tight as it goes without a kernel
  (GEMV sums, ``out=`` everywhere, dx over dy: the layer before the
  kernels, commit 9682abd);
- ``naive``:   BatchNorm written plainly in numpy (the textbook formulas).

Each timed call copies dy first (the layers write dx over it), in every
variant.  One BLAS thread (a Spark task owns one core).

    python benchmarks/bench_norm.py --out benchmarks/results/norm.json
"""
from __future__ import annotations

import argparse
import os
import statistics

import numpy as np
from threadpoolctl import threadpool_limits

from report import alternating_blocks, emit
from sparkavg.nn import BatchNorm, LayerNorm


def naive_batchnorm(x, dy, gamma, beta, eps=1e-5):
    c = x.shape[-1]
    x2, dy2 = x.reshape(-1, c), dy.reshape(-1, c)
    m = x2.shape[0]
    mean, var = x2.mean(0), x2.var(0)
    inv = 1 / np.sqrt(var + eps)
    xhat = (x2 - mean) * inv
    y = gamma * xhat + beta
    dbeta, dgamma = dy2.sum(0), (dy2 * xhat).sum(0)
    dx = (gamma * inv / m) * (m * dy2 - dbeta - xhat * dgamma)
    return y, dx


def tuned_batchnorm(x, dy, gamma, beta, eps=1e-5, ws={}):
    c = x.shape[-1]
    x2, dy2 = x.reshape(-1, c), dy.reshape(-1, c)
    m = x2.shape[0]
    if "ones" not in ws:
        ws.update(ones=np.ones(m, x.dtype), y=np.empty_like(x2), xc=np.empty_like(x2), tmp=np.empty_like(x2))
    ones, y, xc, tmp = ws["ones"], ws["y"], ws["xc"], ws["tmp"]
    mean = np.matmul(ones, x2)
    mean *= 1.0 / m
    np.subtract(x2, mean, out=xc)
    np.multiply(xc, xc, out=y)
    var = np.matmul(ones, y)
    var *= 1.0 / m
    inv_std = 1.0 / np.sqrt(var + eps)
    np.multiply(xc, gamma * inv_std, out=y)
    y += beta
    dbeta = np.matmul(ones, dy2)
    np.multiply(dy2, xc, out=tmp)
    sum_dy_xc = np.matmul(ones, tmp)
    a = gamma * inv_std
    np.multiply(xc, a * inv_std * inv_std * sum_dy_xc * (-1.0 / m), out=tmp)
    np.multiply(dy2, a, out=dy2)
    dy2 += tmp
    dy2 += a * dbeta * (-1.0 / m)
    return y, dy2


def layer_step(cls, x, dy):
    c = x.shape[-1]
    layer = cls()
    layer.build((c, x.shape[1], x.shape[2]))
    params = np.r_[np.ones(c), np.zeros(c)].astype(np.float32)
    layer.bind(params, np.zeros_like(params))
    layer.bind_buffers(np.r_[np.zeros(c), np.ones(c)].astype(np.float32)[:2 * c if cls is BatchNorm else 0])
    work = np.empty_like(dy)

    def step():
        layer.forward(x, True)
        work[...] = dy
        layer.backward(work, True)
    return step


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="64,28,28,16", help="N,H,W,C")
    p.add_argument("--blocks", type=int, default=10)
    p.add_argument("--block", type=int, default=10, help="timed calls per block")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    shape = tuple(int(s) for s in args.shape.split(","))
    rng = np.random.default_rng(0)
    x = (1.0 + rng.standard_normal(shape)).astype(np.float32)
    dy = rng.standard_normal(shape).astype(np.float32)
    gamma, beta = np.ones(shape[-1], np.float32), np.zeros(shape[-1], np.float32)
    work = np.empty_like(dy)

    def naive():
        work[...] = dy
        naive_batchnorm(x, work, gamma, beta)

    def tuned():
        work[...] = dy
        tuned_batchnorm(x, work, gamma, beta)

    def pure(fn):
        def run():
            os.environ["SPARKAVG_PURE_NUMPY"] = "1"  # read by the router on every call
            try:
                fn()
            finally:
                os.environ.pop("SPARKAVG_PURE_NUMPY")
        return run

    variants = {
        "batchnorm_kernels": layer_step(BatchNorm, x, dy),
        "batchnorm_twins": pure(layer_step(BatchNorm, x, dy)),
        "batchnorm_tuned_numpy": tuned,
        "batchnorm_naive": naive,
        "layernorm_kernels": layer_step(LayerNorm, x, dy),
        "layernorm_twins": pure(layer_step(LayerNorm, x, dy)),
    }
    with threadpool_limits(1):
        times = alternating_blocks(variants, args.blocks, args.block, warmup=3)
    ms = {label: 1000 * statistics.median(t) for label, t in times.items()}
    result = {"benchmark": "norm", "shape_nhwc": list(shape), "dtype": "float32", "blas_threads": 1,
              "median_ms": ms,
              "batchnorm_twins_over_kernels": ms["batchnorm_twins"] / ms["batchnorm_kernels"],
              "batchnorm_tuned_numpy_over_kernels": ms["batchnorm_tuned_numpy"] / ms["batchnorm_kernels"],
              "batchnorm_naive_over_kernels": ms["batchnorm_naive"] / ms["batchnorm_kernels"],
              "layernorm_twins_over_kernels": ms["layernorm_twins"] / ms["layernorm_kernels"]}
    return emit(result, args.out)


if __name__ == "__main__":
    main()
