"""Executor inference on the GPU against the CPU, same run: rows per second (issue 40, item 3).

What is timed is the executor's predict function as ``SparkTrainer.predict``
and ``NetworkModel.transform`` run it in a task --
``make_predict_fn(config, shipped, batch_size, None, device)()`` -- called
on host float32 matrices of ``--call-rows`` rows (``predict_rows`` gathers
an RDD's rows into matrices of 1,024; ``predict_arrow`` passes each Arrow
record batch) until ``--rows`` rows are through: the user's path minus the
JVM, the Arrow/pickle transfers and the row validation.  The network
chunks each matrix by ``--batch-size`` (default: the trainer's evaluation
batch size); on the GPU each chunk crosses to the device and its outputs
cross back in one copy, so every pass ends synchronised.

Models (``--models``): ``lenet`` (``sparkavg.nn.lenet``: 431,080
parameters), ``resnet`` (examples/mnist_resnet.py's Graph: two residual
blocks with BatchNorm, 43,914 parameters) and ``mlp`` (DL4J's MnistMLP:
784-500-100-10 leaky ReLU, as benchmarks/bench_mlp_parquet.py), on random
1x28x28 (784 for the MLP) inputs.

Each device: one untimed warm-up call (the network built, moved and its
kernels compiled), then ``--repeats`` timed passes; the figure is the
median pass's rows per second.  The CPU runs ``--cpu-rows`` rows per pass
(fewer: it is slow) with ``--cpu-threads`` BLAS/OpenMP threads (default 1,
what a task with ``spark.task.cpus=1`` gets); ``speedup`` compares rows per
second.  The GPU's and the CPU's outputs for the CPU's rows are compared
(``max_abs_diff``; ``match``: ``allclose(rtol=1e-4, atol=1e-5)``).

This runs outside Spark: pyspark's ``TaskContext.get()`` is None, so
``device="gpu"`` means the current CUDA device (as it does for executor
functions called directly); in a task, ``"auto"`` and ``"gpu"`` take the
GPU Spark assigned.  The JSON records that (``outside_spark``).  The GPU
needs CuPy with a CUDA device and pyspark's Python package (no JVM is
started; on the lent GPU machines carry its sources as
scripts/gpu_run.sh's ``.gpucarry/site`` says).

    python benchmarks/bench_gpu_inference.py --out /tmp/gpu_inference.json
    python benchmarks/bench_gpu_inference.py --cpu-only --rows 2048 --models mlp   # no GPU: CPU rows/s only
"""
from __future__ import annotations

import argparse
import importlib
import logging
import os
import platform
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(1, os.path.join(HERE, "..", "examples"))

from report import commit, emit, subset  # noqa: E402

MODELS = ("lenet", "resnet", "mlp")

logger = logging.getLogger("bench_gpu_inference")


class Shipped:
    """What a task reads from a Spark broadcast: ``.value``."""

    def __init__(self, value):
        self.value = value


def build(model: str, seed: int = 123):
    """The network of ``model``."""
    if model == "lenet":
        from sparkavg.nn import lenet
        return lenet(seed=seed)
    from bench_parity import build as parity_build  # resnet: examples/mnist_resnet.py; mlp: DL4J's MnistMLP
    return parity_build(model, seed)


def _gpu_requirements():
    """The CuPy module, or exit saying what is missing."""
    from sparkavg import backend

    if not backend.available():
        raise SystemExit("bench_gpu_inference.py needs CuPy and a CUDA device for the GPU (or --cpu-only): "
                         + backend.unavailable_reason())
    try:
        importlib.import_module("pyspark")  # task_device reads TaskContext.get(): None here
    except ImportError as exc:
        raise SystemExit("bench_gpu_inference.py needs pyspark's Python package for device='gpu' (the executor "
                         "reads TaskContext; no JVM is started): carry its sources as scripts/gpu_run.sh's "
                         f".gpucarry/site says, or run --cpu-only ({exc})") from exc
    return backend.cupy()


def _inputs(net, rows: int, seed: int) -> dict:
    """Random host float32 features of ``rows`` rows by input name."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return {spec.name: rng.random((rows,) + tuple(spec.shape), dtype=np.float32) for spec in net.spec.inputs}


def _calls(x: dict, call_rows: int) -> list:
    """``x`` cut into the matrices a task's ``predict`` is called on."""
    n = len(next(iter(x.values())))
    return [{k: a[s:s + call_rows] for k, a in x.items()} for s in range(0, n, call_rows)]


def _measure(predict, calls: list, rows: int, repeats: int) -> dict:
    """One untimed warm-up call, then ``repeats`` timed passes over ``calls``."""
    predict(calls[0])
    seconds = []
    for _ in range(repeats):
        began = time.perf_counter()
        for x in calls:
            predict(x)  # a host array back: on the GPU each chunk's copy waited for the device
        seconds.append(time.perf_counter() - began)
    median = statistics.median(seconds)
    return {"rows": rows, "pass_seconds": [round(s, 4) for s in seconds],
            "rows_per_second": round(rows / median, 1)}


def run_model(args, name: str, cpu_only: bool) -> dict:
    import numpy as np

    from sparkavg.spark.executor.inference import make_predict_fn
    from sparkavg.spark.runners.base import network_state
    from sparkavg.threads import set_threads

    net = build(name)
    config_json, shipped = net.to_json(), Shipped(network_state(net, with_updater=False))
    x = _inputs(net, max(args.rows, args.cpu_rows), seed=7)
    cpu_x = {k: a[:args.cpu_rows] for k, a in x.items()}
    row = {"model": name, "params": int(net.num_params), "input_shape": [list(s.shape) for s in net.spec.inputs]}

    cpu_predict = make_predict_fn(config_json, shipped, args.batch_size, None, "cpu")()
    set_threads(args.cpu_threads)  # after the process's first network build, which sets the task's cores
    cpu = _measure(cpu_predict, _calls(cpu_x, args.call_rows), args.cpu_rows, args.repeats)
    row["cpu"] = cpu
    logger.info("%s cpu: %.0f rows/s", name, cpu["rows_per_second"])
    if cpu_only:
        return row

    gpu_predict = make_predict_fn(config_json, shipped, args.batch_size, None, "gpu")()
    gpu = _measure(gpu_predict, _calls({k: a[:args.rows] for k, a in x.items()}, args.call_rows), args.rows,
                   args.repeats)
    row["gpu"] = gpu
    want = np.concatenate([cpu_predict(c) for c in _calls(cpu_x, args.call_rows)])
    got = np.concatenate([gpu_predict(c) for c in _calls(cpu_x, args.call_rows)])
    row["max_abs_diff"] = float(np.abs(got - want).max())
    row["match"] = bool(np.allclose(got, want, rtol=1e-4, atol=1e-5))
    row["speedup"] = round(gpu["rows_per_second"] / cpu["rows_per_second"], 2)
    logger.info("%s gpu: %.0f rows/s (%.1fx the cpu)", name, gpu["rows_per_second"], row["speedup"])
    return row


def main(argv=None) -> dict:
    from sparkavg.spark.executor.inference import ROWS_PER_CALL
    from sparkavg.spark.trainer import EVAL_BATCH_SIZE

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="also write the JSON here")
    parser.add_argument("--rows", type=int, default=65536, help="rows per timed GPU pass (default 65536)")
    parser.add_argument("--cpu-rows", type=int, default=8192, help="rows per timed CPU pass (default 8192)")
    parser.add_argument("--batch-size", type=int, default=EVAL_BATCH_SIZE,
                        help=f"examples per forward pass (default {EVAL_BATCH_SIZE}: SparkTrainer's eval batch size)")
    parser.add_argument("--call-rows", type=int, default=ROWS_PER_CALL,
                        help=f"rows per predict call (default {ROWS_PER_CALL}: predict_rows's matrices)")
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {MODELS}")
    parser.add_argument("--repeats", type=int, default=3, help="timed passes per device (default 3)")
    parser.add_argument("--cpu-threads", type=int, default=1,
                        help="BLAS/OpenMP threads on the CPU (default 1: spark.task.cpus=1)")
    parser.add_argument("--cpu-only", action="store_true", help="no GPU: the CPU's rows per second only")
    args = parser.parse_args(argv)
    models = subset(parser, args.models, MODELS, "models")
    for flag in ("rows", "cpu_rows", "batch_size", "call_rows", "repeats", "cpu_threads"):
        if getattr(args, flag) < 1:
            parser.error(f"Expect --{flag.replace('_', '-')} >= 1, got {getattr(args, flag)}")
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")

    import numpy as np

    import sparkavg

    result = {
        "benchmark": "executor_predict_gpu_vs_cpu" if not args.cpu_only else "executor_predict_cpu",
        "what": "make_predict_fn(...)() on host float32 matrices of call_rows rows, chunked by batch_size; "
                "rows per second of the median of the timed passes",
        "outside_spark": True,
        "device_rule": "outside a Spark task device='gpu' is the current CUDA device (TaskContext.get() is None)",
        "command": [sys.executable] + sys.argv,
        "commit": commit(),
        "rows": args.rows, "cpu_rows": args.cpu_rows, "batch_size": args.batch_size, "call_rows": args.call_rows,
        "repeats": args.repeats, "cpu_threads": args.cpu_threads,
        "versions": {"python": platform.python_version(), "numpy": np.__version__,
                     "sparkavg": getattr(sparkavg, "__version__", None)},
        "host_cpu": platform.processor() or platform.machine(),
    }
    if not args.cpu_only:
        cp = _gpu_requirements()
        props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
        name = props["name"]
        result["device"] = name.decode() if isinstance(name, bytes) else str(name)
        result["versions"].update(cupy=cp.__version__, cuda_runtime=cp.cuda.runtime.runtimeGetVersion(),
                                  cuda_driver=cp.cuda.runtime.driverGetVersion())
    began = time.perf_counter()
    result["results"] = [run_model(args, m, args.cpu_only) for m in models]
    result["seconds"] = round(time.perf_counter() - began, 1)
    return emit(result, args.out)


if __name__ == "__main__":
    main()
