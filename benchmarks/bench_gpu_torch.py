"""TorchModel on CUDA: step time against the same module's plain torch loop (must <= 1.1x).

For each torch zoo module (``sparkavg.torch.zoo``: ``lenet``, ``resnet``,
``lstm``; all on 1x28x28 inputs, 10 classes) at each of ``--batch-sizes``
(default 64, 256, 1024), in one process and on the same CUDA device:

``fit_batch_nosync``
    ``TorchModel(..., updater=Adam(lr=1e-3)).to_gpu()`` stepping with
    ``fit_batch(x, y, sync=False)``, as the executor's averaging round does
    (``make_round_task``): the loss stays a 0-d device array.  This is the
    figure the check is on.
``fit_batch``
    The same with the default ``sync=True``: the loss is read back as a
    float every step (a device -> host sync).
``torch``
    The same module (same factory, same seed) in a plain torch loop:
    ``torch.optim.Adam(lr=1e-3)``, ``CrossEntropyLoss``,
    ``zero_grad(set_to_none=True)`` / ``backward`` / ``step``, reading
    nothing back.
``torch_item``
    The plain loop reading ``loss.item()`` every step (like for like with
    ``fit_batch``).
``fit_batch_host`` / ``torch_host``
    The executor's path: batches from host memory each step -- the
    TorchModel's ``fit_batch(x, y, sync=False)`` on numpy arrays (it
    copies them to the device, and checks the labels on the host before
    they cross), against the plain loop copying the same numpy batches with
    ``torch.from_numpy(...).cuda()`` each step.
``fit_batch_torch_adam`` (LeNet only)
    The TorchModel with ``optimizer="torch.optim:Adam"`` (lr 1e-3;
    :mod:`sparkavg.torch.optim`) instead of sparkavg's updater, ``sync=False``.

Both sides get the batches already on the device (CuPy arrays for the
TorchModel, CUDA tensors for torch): this is the step alone (the
``_host`` rows add each step's copy from host memory).  A step's check of
labels already on the device is read later (:mod:`sparkavg.nn.device_checks`),
so ``sync=False`` steps do not wait for the device.

Timing (bench_lenet.py's ``--gpu`` scheme, for several variants): after a
warm-up, the variants run in alternating blocks; each block starts with a
few untimed steps, then the device is synchronised, ``--block`` steps run,
the device is synchronised again, and the block's wall time over its steps
is one sample.  Figures: medians of those per-step means, and each
TorchModel variant's ratio to ``torch`` (``fit_batch`` also to
``torch_item``).  Checks: ``within_1.1x_at_every_batch`` (``fit_batch_nosync``
/ ``torch`` <= 1.1 for every model and batch size) and the same for
``fit_batch`` / ``torch_item``.

A variant that fails is recorded with its error and left out; the JSON is
rewritten to ``--out`` after every row, so a run cut short keeps what it
measured.

    PYTHONPATH=$PWD python3 benchmarks/bench_gpu_torch.py --out $OUT/torch_gpu.json
    PYTHONPATH=$PWD python benchmarks/bench_gpu_torch.py --cpu-only      # the same code on CPU tensors, tiny counts
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import traceback

import numpy as np

from bench_lenet import _stats
from report import alternating_blocks, emit, indexed

TARGET = 1.1
LR = 1e-3
INPUT_SHAPE = (1, 28, 28)
MODELS = ("lenet", "resnet", "lstm")


def _parse(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cpu-only", action="store_true",
                   help="the same comparison on CPU tensors with tiny step counts (no CUDA needed)")
    p.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, among {MODELS}")
    p.add_argument("--batch-sizes", type=lambda v: [int(b) for b in v.split(",") if b], default=None,
                   help="default 64,256,1024 (--cpu-only: 16,64)")
    p.add_argument("--warmup", type=int, default=None, help="untimed steps of each variant (default 15; cpu 2)")
    p.add_argument("--steps", type=int, default=None, help="timed steps of each variant (default 150; cpu 4)")
    p.add_argument("--block", type=int, default=None, help="timed steps per block (default 10; cpu 2)")
    p.add_argument("--settle", type=int, default=None, help="untimed steps per block (default 2; cpu 1)")
    p.add_argument("--threads", type=int, default=2, help="--cpu-only: torch and sparkavg threads (default 2)")
    p.add_argument("--budget-s", type=float, default=240.0,
                   help="skip the rows left once this many seconds have passed (default 240)")
    p.add_argument("--seed", type=int, default=123)
    p.add_argument("--out", help="also write the JSON here")
    args = p.parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    unknown = sorted(set(models) - set(MODELS))
    if unknown:
        p.error(f"Expect models among {MODELS}, got {unknown}")
    args.models = models
    cpu = args.cpu_only
    for name, gpu_default, cpu_default in (("batch_sizes", [64, 256, 1024], [16, 64]), ("warmup", 15, 2),
                                           ("steps", 150, 4), ("block", 10, 2), ("settle", 2, 1)):
        if getattr(args, name) is None:
            setattr(args, name, cpu_default if cpu else gpu_default)
    return args


def _requirements(cpu_only: bool):
    """(cupy or None, torch) or exit saying what is missing."""
    try:
        import torch
    except ImportError as exc:
        raise SystemExit(f"bench_gpu_torch.py needs PyTorch ({exc})") from exc
    if cpu_only:
        return None, torch
    from sparkavg import backend

    if not backend.available():
        raise SystemExit("bench_gpu_torch.py needs CuPy and a CUDA device (or --cpu-only): "
                         + str(backend.unavailable_reason()))
    if not torch.cuda.is_available():
        raise SystemExit(f"bench_gpu_torch.py needs PyTorch with CUDA; torch {torch.__version__} sees no CUDA device")
    return backend.cupy(), torch


def _error(exc) -> str:
    return "".join(traceback.format_exception_only(type(exc), exc)).strip()[-600:]


def _variants(args, cp, torch, model: str, batch: int) -> tuple:
    """``({name: step(i)}, {name: error})`` for one model at one batch size."""
    from sparkavg.nn import Adam
    from sparkavg.torch import TorchModel, zoo

    factory = f"sparkavg.torch.zoo:{model}"
    rng = np.random.default_rng([args.seed, batch])
    n_batches = 4
    xs = rng.random((n_batches, batch) + INPUT_SHAPE, dtype=np.float32)
    ys = rng.integers(0, 10, size=(n_batches, batch)).astype(np.int64)
    if cp is not None:
        dxs, dys = [cp.asarray(x) for x in xs], [cp.asarray(y) for y in ys]
        txs, tys = [torch.from_numpy(x).cuda() for x in xs], [torch.from_numpy(y).cuda() for y in ys]
    else:
        dxs, dys = list(xs), list(ys)
        txs, tys = [torch.from_numpy(x) for x in xs], [torch.from_numpy(y) for y in ys]

    def ours(net, sync, host=False):
        bx, by = (xs, ys) if host else (dxs, dys)

        def step(i):
            net.fit_batch(bx[i % n_batches], by[i % n_batches], sync=sync)
        return step

    def theirs(read_loss, host=False):
        torch.manual_seed(args.seed)
        module = getattr(zoo, model)()
        if cp is not None:
            module = module.cuda()
        module.train()
        opt = torch.optim.Adam(module.parameters(), lr=LR)
        loss_fn = torch.nn.CrossEntropyLoss()

        def step(i):
            opt.zero_grad(set_to_none=True)
            if host:  # the numpy batch to the device, as a loop over host data does
                tx, ty = torch.from_numpy(xs[i % n_batches]), torch.from_numpy(ys[i % n_batches])
                tx, ty = (tx.cuda(), ty.cuda()) if cp is not None else (tx, ty)
            else:
                tx, ty = txs[i % n_batches], tys[i % n_batches]
            loss = loss_fn(module(tx), ty)
            loss.backward()
            opt.step()
            if read_loss:
                loss.item()
        return step

    def torch_model(**kwargs):
        net = TorchModel(factory, input_shape=INPUT_SHAPE, seed=args.seed, **kwargs)
        return net.to_gpu() if cp is not None else net

    makers = {
        "fit_batch_nosync": lambda: ours(torch_model(updater=Adam(lr=LR)), False),
        "fit_batch": lambda: ours(torch_model(updater=Adam(lr=LR)), True),
        "torch": lambda: theirs(False),
        "torch_item": lambda: theirs(True),
        "fit_batch_host": lambda: ours(torch_model(updater=Adam(lr=LR)), False, host=True),
        "torch_host": lambda: theirs(False, host=True),
    }
    if model == "lenet":
        makers["fit_batch_torch_adam"] = lambda: ours(
            torch_model(optimizer="torch.optim:Adam", optimizer_kwargs={"lr": LR}), False)
    steps, errors = {}, {}
    for name, make in makers.items():
        try:
            step = make()
            step(0)  # a variant that cannot step is left out, with its error
            steps[name] = step
        except Exception as exc:  # noqa: BLE001 -- recorded in the JSON
            errors[name] = _error(exc)
    return steps, errors


def _row(args, cp, torch, model: str, batch: int) -> dict:
    steps, errors = _variants(args, cp, torch, model, batch)
    row = {"model": model, "batch_size": batch}
    if errors:
        row["errors"] = errors
    if not steps:
        return row

    def sync():
        if cp is not None:
            cp.cuda.Device().synchronize()
            torch.cuda.synchronize()

    times = alternating_blocks({name: indexed(step) for name, step in steps.items()}, -(-args.steps // args.block),
                               args.block, args.warmup, args.settle, sync=sync)
    row["variants"] = {name: _stats(v) for name, v in times.items()}
    ms = {name: s["median_ms"] for name, s in row["variants"].items()}
    row["median_ms"] = ms
    for ratio, (num, den) in {"ratio": ("fit_batch_nosync", "torch"),
                              "ratio_sync_vs_torch_item": ("fit_batch", "torch_item"),
                              "ratio_sync_vs_torch": ("fit_batch", "torch"),
                              "ratio_torch_adam_vs_torch": ("fit_batch_torch_adam", "torch"),
                              "ratio_host": ("fit_batch_host", "torch_host")}.items():
        if num in ms and den in ms:
            row[ratio] = ms[num] / ms[den]
    return row


def _checks(rows: list) -> dict:
    def within(key):
        values = [r.get(key) for r in rows]
        if not values or any(v is None for v in values):
            return None  # a row or variant missing: not shown
        return all(v <= TARGET for v in values)

    ratios = [r["ratio"] for r in rows if "ratio" in r]
    return {
        f"within_{TARGET}x_at_every_batch": within("ratio"),
        f"within_{TARGET}x_at_every_batch_sync_vs_torch_item": within("ratio_sync_vs_torch_item"),
        f"within_{TARGET}x_at_every_batch_from_host": within("ratio_host"),
        "max_ratio": max(ratios) if ratios else None,
        "by_model": {m: all(r.get("ratio", float("inf")) <= TARGET for r in rows if r["model"] == m)
                     for m in dict.fromkeys(r["model"] for r in rows)},
    }


def _environment(cp, torch) -> dict:
    from sparkavg import ops

    env = {"torch_version": torch.__version__, "numpy_version": np.__version__,
           "python": platform.python_version(), "cython_kernels": ops.have_extension()}
    if cp is not None:
        env.update({"gpu": torch.cuda.get_device_name(), "cupy_version": cp.__version__,
                    "torch_cuda": torch.version.cuda, "cudnn_version": torch.backends.cudnn.version(),
                    "cudnn_benchmark": bool(torch.backends.cudnn.benchmark)})
    else:
        env.update({"gpu": None, "cpu_count": os.cpu_count()})
    return env


def main(argv=None):
    args = _parse(argv)
    cp, torch = _requirements(args.cpu_only)
    if cp is None:
        from sparkavg.threads import set_threads

        torch.set_num_threads(args.threads)
        set_threads(args.threads)
    began = time.perf_counter()
    result = {
        "benchmark": "torch_model_step_gpu" if cp is not None else "torch_model_step_cpu_only",
        "device": "cuda" if cp is not None else "cpu (--cpu-only: the code path check, not the measurement)",
        "step": "forward+backward+Adam(lr=1e-3), float32, cross-entropy on 10 classes, 1x28x28 inputs, "
                "batches already on the device",
        "timing": "alternating blocks of steps between device synchronisations; median of per-step means",
        "target": f"fit_batch(sync=False) median step <= {TARGET}x the plain torch loop's at every batch size",
        "models": args.models, "batch_sizes": args.batch_sizes, "warmup": args.warmup, "steps": args.steps,
        "block": args.block, "settle": args.settle,
        "results": [],
        **_environment(cp, torch),
        "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
    }
    if cp is None:
        result["threads"] = args.threads
    skipped = []
    for model in args.models:
        for batch in args.batch_sizes:
            if time.perf_counter() - began > args.budget_s:
                skipped.append(f"{model}@{batch}")
                continue
            t = time.perf_counter()
            try:
                row = _row(args, cp, torch, model, batch)
            except Exception as exc:  # noqa: BLE001 -- recorded; the next rows still run
                row = {"model": model, "batch_size": batch, "error": _error(exc)}
            row["seconds"] = time.perf_counter() - t
            result["results"].append(row)
            print(f"# {model} batch {batch}: {json.dumps(row.get('median_ms', row.get('error')))}",
                  file=sys.stderr, flush=True)
            if args.out:  # what was measured so far survives a cut-short run
                with open(args.out, "w") as fh:
                    json.dump(result, fh, indent=2)
    if skipped:
        result["skipped_over_budget"] = skipped
    result["checks"] = _checks(result["results"])
    result["seconds"] = time.perf_counter() - began
    return emit(result, args.out)


if __name__ == "__main__":
    main()
