"""Where the GPU paths' fixed costs go: a diagnosis for issue 40, not a figure.

Sections (``--sections``, default all):

``encode``
    16M float32 at density 1e-3: ``cupyx.profiler.benchmark`` (host and
    device time per call) of the whole sparse and bitmap encoders and of
    each of their pieces (the count kernel, the
    emit kernel, the one device -> host read, the allocations).
``count``
    what bounds the sparse encoder's count pass (57 us for a 64 MB read on
    an H200, about 3x a bandwidth-bound read): the library's kernel against
    variants compiled here -- the same tiles without the group sums'
    atomics, one chunk per warp, and a float4 grid-stride count -- and
    CuPy's ``count_nonzero``, device time per call.
``torch``
    ``torch.profiler`` and ``cProfile`` over steps of the torch zoo's LeNet
    as a ``TorchModel`` (``fit_batch(sync=False)``) and in a plain torch
    loop, batch 256: the operators and Python functions the TorchModel
    step spends its host time in; and a variant of the step that takes the
    gradient whole (no zero fill, no in-place add per parameter: one
    ``torch.cat``), to see what those launches cost.
``resnet``
    ``cProfile`` over CuPy ResNet steps at batch 64 (host-bound there):
    the Python functions by own time.

Writes one text report (``--out``).  Runs where CuPy and PyTorch CUDA are.

    PYTHONPATH=$PWD python3 benchmarks/diag_gpu.py --out $OUT/diag_gpu.txt
"""
from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import time
import types

import numpy as np

SECTIONS = ("encode", "count", "torch", "resnet")


def _bench(cp, name, fn, report, n_repeat=50):
    from cupyx.profiler import benchmark

    r = benchmark(fn, n_repeat=n_repeat, n_warmup=5)
    cpu, gpu = float(np.median(r.cpu_times)) * 1e3, float(np.median(r.gpu_times[0])) * 1e3
    report.append(f"  {name:<44} host {cpu:8.4f} ms   device {gpu:8.4f} ms")


def encode(report):
    import cupy as cp

    from sparkavg.ops import _cuda
    from sparkavg.ops._checks import float_bits
    from sparkavg.ops.cuda_src import device

    n, tau = 1 << 24, 1.0
    rng = np.random.default_rng(0)
    host = (0.1 * rng.standard_normal(n)).astype(np.float32)  # none reaches tau = 1.0 but the spikes
    host[rng.random(n) < 1e-3] = 5.0
    r = cp.asarray(host)
    launcher = device()
    work = r.copy()
    ntiles, chunks = _cuda._tiles(n)
    report.append(f"encode: n={n}, tiles={ntiles} x {chunks} chunks")

    def whole_sparse():
        cp.copyto(work, r)
        _cuda._encode_sparse(launcher, work, tau, n // 16)

    def whole_bitmap():
        cp.copyto(work, r)
        _cuda._encode_bitmap(launcher, work, tau)

    # The two passes as _cuda._encode_sparse launches them (its argument lists).
    per1, per2 = _cuda._groups(ntiles)
    n1 = -(-ntiles // per1)
    n2 = -(-n1 // per2)
    i64 = np.int64
    counts = cp.empty(ntiles, dtype=np.int32)
    zeroed = cp.zeros(3 + n1 + n2, dtype=np.int64)
    info, g1, g2 = zeroed[:3], zeroed[3:3 + n1], zeroed[3 + n1:]

    def count():  # adds into the group sums: their totals grow, the work is the same
        launcher.launch("encode", "sparkavg_sparse_count", r.dtype, i64, 32 * ntiles,
                        (r, i64(n), r.dtype.type(tau), i64(ntiles), i64(chunks), counts, info, g1, g2,
                         i64(per1), i64(per2)))

    zeroed.fill(0)
    count()
    clean = zeroed.copy()
    out = cp.empty(4 + n // 16, dtype=np.int32)

    def emit():  # on a copy, from the one count's sums: the same work every call
        cp.copyto(work, r)
        cp.copyto(zeroed, clean)
        launcher.launch("encode", "sparkavg_sparse_emit", r.dtype, i64, 32 * ntiles,
                        (work, i64(n), r.dtype.type(tau), i64(ntiles), i64(chunks), counts, g1, g2, i64(per1),
                         i64(per2), i64(n // 16), out, info, np.int32(1), np.int32(float_bits(tau))))

    _bench(cp, "copy of the vector (the emit rows include one)", lambda: cp.copyto(work, r), report)
    _bench(cp, "sparse encode, whole (with its copy)", whole_sparse, report)
    _bench(cp, "bitmap encode, whole (with its copy)", whole_bitmap, report)
    _bench(cp, "sparse count kernel", count, report)
    _bench(cp, "sparse emit kernel (with its two copies)", emit, report)
    _bench(cp, "device -> host read of info", lambda: cp.asnumpy(info), report)
    _bench(cp, "allocations (counts, info and sums zeroed, out)",
           lambda: (cp.empty(ntiles, dtype=np.int32), cp.zeros(3 + n1 + n2, dtype=np.int64),
                    cp.empty(4 + n // 16, dtype=np.int32)), report)


#: The count pass's variants (``count`` section): the library's tiles without the group sums'
#: atomics, and a float4 grid-stride count, as plain CUDA (no sparkavg macros).
COUNT_VARIANTS = r"""
extern "C" __global__ void tiles_no_atomics(const float *r, long long n, float tau, long long ntiles,
                                            long long chunks, int *counts)
{
    const long long lane = threadIdx.x & 31, warps = ((long long)blockDim.x * gridDim.x) >> 5;
    for (long long t = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5; t < ntiles; t += warps) {
        int count = 0;
        for (long long k = 0; k < chunks; k += 8) {
            float x[8];
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                const long long e = (t * chunks + k + j) * 32 + lane;
                x[j] = r[e < n ? e : n - 1];
            }
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                const long long e = (t * chunks + k + j) * 32 + lane;
                const int in = k + j < chunks && e < n && (x[j] >= tau || x[j] <= -tau);
                count += __popc(__ballot_sync(0xffffffffu, in));
            }
        }
        if (lane == 0) counts[t] = count;
    }
}

extern "C" __global__ void float4_count(const float4 *r, long long n4, float tau, unsigned long long *total)
{
    unsigned int count = 0;
    const long long stride = (long long)blockDim.x * gridDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += stride) {
        const float4 v = r[i];
        count += (fabsf(v.x) >= tau) + (fabsf(v.y) >= tau) + (fabsf(v.z) >= tau) + (fabsf(v.w) >= tau);
    }
    count = __reduce_add_sync(0xffffffffu, count);
    if ((threadIdx.x & 31) == 0 && count) atomicAdd(total, (unsigned long long)count);
}
"""


def count(report):
    import cupy as cp

    from sparkavg.ops import _cuda
    from sparkavg.ops.cuda_src import device

    n, tau = 1 << 24, 1.0
    rng = np.random.default_rng(0)
    host = (0.1 * rng.standard_normal(n)).astype(np.float32)
    host[rng.random(n) < 1e-3] = 5.0
    r = cp.asarray(host)
    expect = int(np.count_nonzero(np.abs(host) >= tau))
    launcher, i64 = device(), np.int64
    module = cp.RawModule(code=COUNT_VARIANTS, options=("--std=c++14",))
    tiles_no_atomics, float4_count = module.get_function("tiles_no_atomics"), module.get_function("float4_count")
    block = 256

    def library(chunks_target):
        ntiles, chunks = _cuda._tiles(n, target=chunks_target)
        per1, per2 = _cuda._groups(ntiles)
        n1 = -(-ntiles // per1)
        zeroed = cp.zeros(3 + n1 + -(-n1 // per2), dtype=np.int64)
        counts = cp.empty(ntiles, dtype=np.int32)
        info, g1, g2 = zeroed[:3], zeroed[3:3 + n1], zeroed[3 + n1:]

        def run():
            launcher.launch("encode", "sparkavg_sparse_count", r.dtype, i64, 32 * ntiles,
                            (r, i64(n), np.float32(tau), i64(ntiles), i64(chunks), counts, info, g1, g2,
                             i64(per1), i64(per2)))
        run()
        assert int(counts.sum()) == expect, "the library's count"
        return run, f"{ntiles} tiles x {chunks} chunks"

    def no_atomics(chunks_target):
        ntiles, chunks = _cuda._tiles(n, target=chunks_target)
        counts = cp.empty(ntiles, dtype=np.int32)
        grid = (min(-(-32 * ntiles // block), 1 << 16),)

        def run():
            tiles_no_atomics(grid, (block,), (r, i64(n), np.float32(tau), i64(ntiles), i64(chunks), counts))
        run()
        assert int(counts.sum()) == expect, "the count without atomics"
        return run, f"{ntiles} tiles x {chunks} chunks"

    total = cp.zeros(1, dtype=np.uint64)

    def vectorised():
        total.fill(0)
        float4_count((132 * 16,), (block,), (r, i64(n // 4), np.float32(tau), total))

    vectorised()
    assert int(total[0]) == expect, "the float4 count"
    _bench(cp, "copy of the vector", lambda: cp.copyto(cp.empty_like(r), r), report)
    for target in (4096, 1 << 16, 1 << 19):  # tiles of 32, 8 and 1 chunks
        run, what = library(target)
        _bench(cp, f"library count kernel, {what}", run, report)
        run, what = no_atomics(target)
        _bench(cp, f"same tiles, no group atomics, {what}", run, report)
    _bench(cp, "float4 grid-stride count (one atomic a warp)", vectorised, report)
    _bench(cp, "cupy count_nonzero(abs(r) >= tau)", lambda: cp.count_nonzero(cp.abs(r) >= tau), report)


def _cprofile(fn, steps, report, title, sort="tottime", top=30):
    prof = cProfile.Profile()
    prof.enable()
    for i in range(steps):
        fn(i)
    prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats(sort).print_stats(top)
    report.append(f"--- cProfile: {title} ({steps} steps, by {sort})")
    report.append(text.getvalue())


def _loss_terms_grad_whole(self, x, y, weights=None):
    """A variant of ``TorchModel._loss_terms`` for the ``torch`` section: no zero fill of the flat gradient
    and no in-place add into each parameter's view (1 + P launches); each ``p.grad`` is None before the
    backward pass (autograd hands over its own tensor) and one ``torch.cat`` writes the flat gradient after.
    The same parameters bit for bit on the CPU (checked when it was written); kept here to measure on a GPU."""
    import torch

    xt, n = self._inputs(x)
    yt = self._targets(y, n, weights)
    params = self._torch_params
    for p in params:
        p.grad = None
    self._mode(True)
    self._copy_in()
    loss = self._batch_loss(xt, yt)
    loss.backward()
    grads = self._tensor(self.flat.grads)
    with torch.no_grad():
        parts = [p.grad.reshape(-1) if p.grad is not None else torch.zeros(p.numel(), dtype=p.dtype, device=p.device)
                 for p in params]
        torch.cat(parts, out=grads)
        for seg, p in zip(self.flat.param_segments, params):
            p.grad = grads[seg.start:seg.stop].view(seg.shape)
    from sparkavg import backend
    return [(1.0, backend.cupy().from_dlpack(loss.detach()), 1)]


def torch_section(report):
    import cupy as cp
    import torch

    from sparkavg.nn import Adam
    from sparkavg.torch import TorchModel, zoo

    batch, lr = 256, 1e-3
    rng = np.random.default_rng(1)
    x = rng.random((batch, 1, 28, 28), dtype=np.float32)
    y = rng.integers(0, 10, size=batch).astype(np.int64)
    dx, dy = cp.asarray(x), cp.asarray(y)
    tx, ty = torch.from_numpy(x).cuda(), torch.from_numpy(y).cuda()
    net = TorchModel("sparkavg.torch.zoo:lenet", input_shape=(1, 28, 28), seed=1, updater=Adam(lr=lr)).to_gpu()
    module = zoo.lenet().cuda()
    opt = torch.optim.Adam(module.parameters(), lr=lr)
    loss_fn = torch.nn.CrossEntropyLoss()

    def ours(i):
        net.fit_batch(dx, dy, sync=False)

    def theirs(i):
        opt.zero_grad(set_to_none=True)
        loss_fn(module(tx), ty).backward()
        opt.step()

    stolen = TorchModel("sparkavg.torch.zoo:lenet", input_shape=(1, 28, 28), seed=1, updater=Adam(lr=lr)).to_gpu()
    stolen._loss_terms = types.MethodType(_loss_terms_grad_whole, stolen)

    def ours_grad_whole(i):
        stolen.fit_batch(dx, dy, sync=False)

    for name, step in (("TorchModel.fit_batch(sync=False)", ours), ("plain torch loop", theirs),
                       ("TorchModel, the gradient taken whole (a variant, not the library's)", ours_grad_whole)):
        for i in range(20):
            step(i)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for i in range(100):
            step(i)
        torch.cuda.synchronize()
        report.append(f"{name}: {(time.perf_counter() - t0) * 10:.4f} ms a step (100 steps, synced at the ends)")
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                torch.profiler.ProfilerActivity.CUDA]) as prof:
            for i in range(30):
                step(i)
            torch.cuda.synchronize()
        report.append(f"--- torch.profiler: {name}, 30 steps, by self CPU time")
        report.append(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
    _cprofile(ours, 100, report, "TorchModel.fit_batch(sync=False), LeNet, batch 256")


def resnet(report):
    import cupy as cp

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
    from mnist_resnet import build

    rng = np.random.default_rng(2)
    x = cp.asarray(rng.random((64, 1, 28, 28), dtype=np.float32))
    y = cp.asarray(rng.integers(0, 10, size=64))
    net = build(seed=2).to_gpu()

    def step(i):
        net.fit_batch(x, y, sync=False)

    for i in range(10):
        step(i)
    cp.cuda.Device().synchronize()
    t0 = time.perf_counter()
    for i in range(50):
        step(i)
    cp.cuda.Device().synchronize()
    report.append(f"resnet batch 64: {(time.perf_counter() - t0) * 20:.3f} ms a step (50 steps)")
    _cprofile(step, 50, report, "CuPy ResNet fit_batch(sync=False), batch 64")
    _cprofile(step, 50, report, "CuPy ResNet fit_batch(sync=False), batch 64", sort="cumulative", top=40)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sections", default=",".join(SECTIONS))
    p.add_argument("--out", help="also write the report here")
    args = p.parse_args(argv)
    report = []
    for name in args.sections.split(","):
        t0 = time.perf_counter()
        try:
            {"encode": encode, "count": count, "torch": torch_section, "resnet": resnet}[name](report)
        except Exception as exc:  # noqa: BLE001 -- a diagnosis reports what broke and goes on
            report.append(f"section {name} failed: {type(exc).__name__}: {exc}")
        report.append(f"[{name}: {time.perf_counter() - t0:.1f} s]\n")
    text = "\n".join(report)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
