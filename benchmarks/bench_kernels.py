"""Kernel throughput: sparkavg.ops against np.copyto and the numpy reference.

For each vector length N (float32) the script measures, in one run:

- ``copy``: ``np.copyto`` of N float32 (the memory read rate baseline);
- sparse ``threshold_encode`` / ``threshold_decode`` and ``bitmap_encode`` /
  ``bitmap_decode`` at densities 1e-4, 1e-3, 1e-2 (threshold = the matching
  quantile of |r|, r ~ N(0, 1e-3)); each encode trial gets a fresh copy of
  the residual, made outside the timed region;
- ``accumulate`` (weight 0.5) and one fused ``adam_step``;
- ``clip_residual`` at 5 τ, τ = 1e-4 and 1e-3 (each trial on a fresh copy);
- ``sparse_encode_sweep``: ``threshold_encode`` alone on N = ``--sweep-n``
  (default 8M) values at every density up to the bitmap switch
  (``SWEEP_DENSITIES``, 0.01% .. 6.25% = 1/16), with its own copy baseline;

each for the fast path (Cython on numpy float32; CuPy with ``--gpu``) and
the numpy reference (:mod:`sparkavg.ops.reference`).  Throughput is "input
GB/s": N * 4 bytes (the dense float32 vector an op consumes or, for the
decoders, rebuilds) over the best timing (at least ``--repeats`` trials,
more while a case has used under 0.3 s).  Decoders only touch what a message
sends, so their "GB/s" can exceed the copy rate; ``fast_ms`` is the time.

Prints one JSON document to stdout (and writes it to ``--out``).  The
``checks`` block states the targets: encode >= 5x the reference and >= 30%
of the copy read rate (must), encode and accumulate >= 50% (aim); sparse
encode in the sweep >= 5x the reference and >= 50% of the copy read rate at
every density (must).

With ``--gpu`` the arrays are CuPy arrays on the current device, the sizes
run from 64K to 16M (``GPU_SIZES``), the baseline is a device-to-device
``cupy.copyto`` and the reference is the numpy twin run on CuPy arrays;
timings are CUDA events around each call, host synchronisations inside the
call included.  The ``gpu_checks`` block states issue 12's GPU targets:
threshold and bitmap encode >= 30% of the copy read rate at 16M (aim 50%)
and never slower than the CuPy reference at any size; decode, accumulate
and Adam >= 50% of the copy read rate at 16M.  Accumulate (12 bytes moved
per value) and Adam (28) cannot reach a read rate of 50% of a copy (8
bytes per value) on a bandwidth-bound device, so their rows also give
``traffic_fraction_of_copy``: bytes moved per second over the copy's.

    python benchmarks/bench_kernels.py [--quick] [--sweep-only] [--out PATH] [--gpu]
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time

import numpy as np

from sparkavg import backend, ops
from sparkavg.ops import reference

from report import emit

DENSITIES = (1e-4, 1e-3, 1e-2)
FULL_SIZES = (1 << 20, 1 << 22, 1 << 24)
QUICK_SIZES = (1 << 16, 1 << 18, 1 << 20)
GPU_SIZES = (1 << 16, 1 << 18, 1 << 20, 1 << 22, 1 << 24)
#: Bytes each op moves per value (reads + writes), for traffic_fraction_of_copy.
BYTES_MOVED = {"copy": 8, "accumulate": 12, "adam_step": 28}
# Up to libnd4j's switch to bitmaps: a sparse message of N // 16 entries.
SWEEP_DENSITIES = (1e-4, 1e-3, 1e-2, 0.046, 0.0625)
SWEEP_N = 1 << 23


# ------------------------------------------------------------------ timing
BUDGET_S = 0.3  # keep repeating a case (past its minimum) while under this
MAX_REPEATS = 400


class CpuTimer:
    xp = np

    @staticmethod
    def best(fn, setup=None, repeats=7):
        """Best wall time of fn(state): at least `repeats` trials, more while
        the timed total stays under BUDGET_S (a shared machine preempts
        some trials; the best one is the kernel's).  setup() -> state runs
        before each trial, untimed."""
        best, spent, k = float("inf"), 0.0, 0
        while k < repeats or (spent < BUDGET_S and k < MAX_REPEATS):
            state = setup() if setup else None
            t0 = time.perf_counter()
            fn(state)
            dt = time.perf_counter() - t0
            best, spent, k = min(best, dt), spent + dt, k + 1
        return best

    @staticmethod
    def copy(dst, src):
        np.copyto(dst, src)


class GpuTimer:
    def __init__(self):
        self.xp = backend.cupy()

    def best(self, fn, setup=None, repeats=7):
        cp = self.xp
        best, spent, k = float("inf"), 0.0, 0
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        while k < repeats or (spent < BUDGET_S and k < MAX_REPEATS):
            state = setup() if setup else None
            cp.cuda.get_current_stream().synchronize()  # sync: setup done before timing
            start.record()
            fn(state)
            stop.record()
            stop.synchronize()  # sync: wait for the timed work
            dt = cp.cuda.get_elapsed_time(start, stop) / 1e3
            best, spent, k = min(best, dt), spent + dt, k + 1
        return best

    def copy(self, dst, src):
        self.xp.copyto(dst, src)  # device-to-device


# ------------------------------------------------------------------- cases
def gbps(nbytes, seconds):
    return nbytes / seconds / 1e9


def bench_size(n, timer, repeats, ref_repeats, threads):
    xp = timer.xp
    rng = np.random.default_rng(n)
    host = (rng.standard_normal(n) * 1e-3).astype(np.float32)
    base = xp.asarray(host)
    work = xp.empty_like(base)
    nbytes = n * 4
    rows = []

    t_copy = timer.best(lambda _: timer.copy(work, base), repeats=repeats)
    copy_gbps = gbps(nbytes, t_copy)

    def fresh():
        work[...] = base
        return work

    def row(op, fast_s, ref_s, **extra):
        if op in BYTES_MOVED:
            extra["traffic_fraction_of_copy"] = round(
                BYTES_MOVED[op] / fast_s / (BYTES_MOVED["copy"] / t_copy), 3)
        entry = {
            "op": op,
            "n": n,
            **extra,
            "fast_gbps": round(gbps(nbytes, fast_s), 3),
            "reference_gbps": round(gbps(nbytes, ref_s), 3) if ref_s else None,
            "copy_gbps": round(copy_gbps, 3),
            "fast_ms": round(fast_s * 1e3, 4),
            "speedup_vs_reference": round(ref_s / fast_s, 2) if ref_s else None,
            "fraction_of_copy": round(gbps(nbytes, fast_s) / copy_gbps, 3),
        }
        rows.append(entry)

    magnitudes = np.sort(np.abs(host))
    for density in DENSITIES:
        tau = float(magnitudes[int(n * (1 - density))])
        sent = int(ops.count_above(host, tau))
        limit = n  # never capped: measure the whole message
        message = ops.threshold_encode(fresh(), tau, limit)
        bitmap = ops.bitmap_encode(fresh(), tau)
        target = xp.zeros_like(base)
        extra = {"density": density, "values_sent": sent}
        row("threshold_encode",
            timer.best(lambda r: ops.threshold_encode(r, tau, limit), fresh, repeats),
            timer.best(lambda r: reference.threshold_encode(r, tau, limit), fresh, ref_repeats),
            **extra)
        row("threshold_decode",
            timer.best(lambda _: ops.threshold_decode(message, target), None, repeats),
            timer.best(lambda _: reference.threshold_decode(message, target), None, ref_repeats),
            **extra)
        row("bitmap_encode",
            timer.best(lambda r: ops.bitmap_encode(r, tau), fresh, repeats),
            timer.best(lambda r: reference.bitmap_encode(r, tau), fresh, ref_repeats),
            **extra)
        row("bitmap_decode",
            timer.best(lambda _: ops.bitmap_decode(bitmap, target), None, repeats),
            timer.best(lambda _: reference.bitmap_decode(bitmap, target), None, ref_repeats),
            **extra)

    buf = xp.zeros_like(base)
    row("accumulate",
        timer.best(lambda _: ops.accumulate(buf, base, 0.5), None, repeats),
        timer.best(lambda _: reference.accumulate(buf, base, 0.5), None, ref_repeats))
    # DL4J's residual clip (every 5th sharing iteration) at 5 τ, τ = 1e-4 (half the values clipped) and 1e-3
    # (hardly any: the usual case, a residual under τ where nothing was sent)
    for clip_tau in (1e-4, 1e-3):
        row("clip_residual",
            timer.best(lambda r: ops.clip_residual(r, clip_tau, 5.0), fresh, repeats),
            timer.best(lambda r: reference.clip_residual(r, clip_tau, 5.0), fresh, ref_repeats),
            tau=clip_tau)
    params, m = xp.zeros_like(base), xp.zeros_like(base)
    v = xp.abs(base)
    row("adam_step",
        timer.best(lambda _: ops.adam_step(params, base, m, v, 1e-3, t=10), None, repeats),
        timer.best(lambda _: reference.adam_step(params, base, m, v, 1e-3, t=10), None,
                   ref_repeats))
    if threads > 1:
        row("accumulate", timer.best(
            lambda _: ops.accumulate(buf, base, 0.5, n_threads=threads), None, repeats),
            None, n_threads=threads)
        row("adam_step", timer.best(
            lambda _: ops.adam_step(params, base, m, v, 1e-3, t=10, n_threads=threads),
            None, repeats), None, n_threads=threads)
    return rows


def sweep_sparse_encode(n, timer, repeats, ref_repeats):
    """threshold_encode at every density of SWEEP_DENSITIES on n values:
    time, x reference, fraction of the copy read rate (one copy baseline,
    measured first, and again last to show drift)."""
    xp = timer.xp
    host = (np.random.default_rng(n).standard_normal(n) * 1e-3).astype(np.float32)
    base = xp.asarray(host)
    work = xp.empty_like(base)
    nbytes = n * 4
    copy_before = timer.best(lambda _: timer.copy(work, base), repeats=repeats)

    def fresh():
        work[...] = base
        return work

    magnitudes = np.sort(np.abs(host))
    rows = []
    for density in SWEEP_DENSITIES:
        tau = float(magnitudes[int(n * (1 - density))])
        fast = timer.best(lambda r: ops.threshold_encode(r, tau, n), fresh, repeats)
        ref = timer.best(lambda r: reference.threshold_encode(r, tau, n), fresh, ref_repeats)
        rows.append({
            "op": "threshold_encode",
            "n": n,
            "density": density,
            "values_sent": int(ops.count_above(host, tau)),
            "fast_ms": round(fast * 1e3, 4),
            "reference_ms": round(ref * 1e3, 4),
            "fast_gbps": round(gbps(nbytes, fast), 3),
            "speedup_vs_reference": round(ref / fast, 2),
            "fraction_of_copy": round(copy_before / fast, 3),
        })
    copy_after = timer.best(lambda _: timer.copy(work, base), repeats=repeats)
    return {
        "n": n,
        "copy_ms": round(copy_before * 1e3, 4),
        "copy_gbps": round(gbps(nbytes, copy_before), 3),
        "copy_ms_after": round(copy_after * 1e3, 4),
        "rows": rows,
    }


def sweep_checks(sweep):
    rows = sweep["rows"]
    return {
        "sweep_encode_at_least_5x_reference": all(r["speedup_vs_reference"] >= 5 for r in rows),
        "sweep_encode_at_least_50pct_of_copy": all(r["fraction_of_copy"] >= 0.50 for r in rows),
        "sweep_min_speedup": min(r["speedup_vs_reference"] for r in rows),
        "sweep_min_fraction_of_copy": min(r["fraction_of_copy"] for r in rows),
    }


def checks(rows):
    enc = [r for r in rows if r["op"] == "threshold_encode"]
    acc = [r for r in rows if r["op"] == "accumulate" and "n_threads" not in r]
    if not rows:
        return {}
    return {
        "encode_at_least_5x_reference": all(r["speedup_vs_reference"] >= 5 for r in enc),
        "encode_at_least_30pct_of_copy": all(r["fraction_of_copy"] >= 0.30 for r in enc),
        "aim_encode_50pct_of_copy": all(r["fraction_of_copy"] >= 0.50 for r in enc),
        "aim_accumulate_50pct_of_copy": all(r["fraction_of_copy"] >= 0.50 for r in acc),
        "min_encode_fraction_of_copy": min(r["fraction_of_copy"] for r in enc),
        "min_encode_speedup": min(r["speedup_vs_reference"] for r in enc),
    }


def gpu_checks(rows):
    """Issue 12's GPU targets, from the rows of a --gpu run."""
    if not rows:
        return {}
    top = max(r["n"] for r in rows)

    def of(*ops_):
        return [r for r in rows if r["op"] in ops_ and "n_threads" not in r]

    encoders = of("threshold_encode", "bitmap_encode")
    at_top = [r for r in encoders if r["n"] == top]
    others = [r for r in of("threshold_decode", "bitmap_decode", "accumulate", "adam_step")
              if r["n"] == top]
    return {
        "largest_n": top,
        "encode_at_least_30pct_of_copy_at_largest": all(r["fraction_of_copy"] >= 0.30
                                                        for r in at_top),
        "aim_encode_50pct_of_copy_at_largest": all(r["fraction_of_copy"] >= 0.50 for r in at_top),
        "encode_never_slower_than_reference": all(r["speedup_vs_reference"] >= 1
                                                  for r in encoders),
        "decode_accumulate_adam_50pct_of_copy_at_largest": all(r["fraction_of_copy"] >= 0.50
                                                               for r in others),
        "min_encode_fraction_of_copy_at_largest": min(r["fraction_of_copy"] for r in at_top),
        "min_encode_speedup": min(r["speedup_vs_reference"] for r in encoders),
        "fraction_of_copy_at_largest": {f"{r['op']}@{r.get('density', '-')}":
                                        r["fraction_of_copy"] for r in at_top + others},
    }


def machine(gpu):
    info = {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
    }
    if gpu:
        cp = backend.cupy()
        info["gpu"] = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
    return info


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="N in 64K, 256K, 1M")
    parser.add_argument("--sizes", type=lambda v: tuple(int(x) for x in v.split(",")),
                        help="comma-separated N to run (default: 1M, 4M, 16M; with --gpu "
                             "64K .. 16M)")
    parser.add_argument("--sweep-only", action="store_true",
                        help="only the sparse-encode density sweep")
    parser.add_argument("--sweep-n", type=int, default=SWEEP_N,
                        help=f"values in the density sweep (default {SWEEP_N})")
    parser.add_argument("--out", help="also write the JSON here")
    parser.add_argument("--gpu", action="store_true", help="CuPy arrays, vs device copy")
    parser.add_argument("--repeats", type=int, default=7, help="trials per fast timing")
    parser.add_argument("--reference-repeats", type=int, default=3,
                        help="trials per numpy-reference timing")
    parser.add_argument("--threads", type=int, default=2,
                        help="also time accumulate/adam with this many OpenMP threads (1: skip)")
    args = parser.parse_args(argv)

    if args.gpu:
        if not backend.available():
            sys.exit("bench_kernels.py --gpu needs CuPy and a CUDA device, and none is "
                     "available here (pip install sparkavg[gpu] on a machine with an "
                     "NVIDIA driver); run without --gpu for the CPU kernels")
        timer = GpuTimer()
    else:
        if not ops.have_extension():
            sys.exit("sparkavg_ext is not built: python setup.py build_ext --inplace")
        timer = CpuTimer()

    sizes = (() if args.sweep_only else args.sizes or (
        QUICK_SIZES if args.quick else GPU_SIZES if args.gpu else FULL_SIZES))
    started = time.time()
    rows = []
    for n in sizes:
        rows += bench_size(n, timer, args.repeats, args.reference_repeats,
                           1 if args.gpu else args.threads)
    sweep = sweep_sparse_encode(args.sweep_n, timer, args.repeats, args.reference_repeats)
    report = {
        "benchmark": "kernels",
        "command": " ".join(["python", "benchmarks/bench_kernels.py", *sys.argv[1:]]),
        "device": "gpu" if args.gpu else "cpu",
        "machine": machine(args.gpu),
        "throughput_unit": "input GB/s = N * 4 bytes / best time",
        "seconds": round(time.time() - started, 1),
        "results": rows,
        "sparse_encode_sweep": sweep,
        "checks": {**checks(rows), **sweep_checks(sweep)},
    }
    if args.gpu:
        report["gpu_checks"] = gpu_checks(rows)
    return emit(report, args.out)


if __name__ == "__main__":
    main()
