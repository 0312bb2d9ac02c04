"""The executor's averaging round on the GPU: device='gpu' against device='cpu', same run.

A Spark executor on the GPU machine trains with ``device="gpu"``; no JVM
can start on the device machine, so the executor task function runs
directly with a TaskContext whose resources name the GPU, and the record
says so.  That is what a Spark Python worker does when it starts a task
(pyspark's ``worker.py``): it sets ``TaskContext`` (partition, cpus,
resources ``{"gpu": ResourceInformation("gpu", ["0"])}``) and calls the
task's function on the partition's iterator.  Here:

- the task context is ``pyspark.TaskContext._getOrCreate()`` with those
  attributes set (``_partitionId``, ``_cpus``, ``_resources`` ...);
- the function is ``make_round_task(config_json, shipped, ..., device=...)``
  (``sparkavg.spark.executor.averaging``), called on an iterator of
  minibatches ``({"input": x}, y)`` (host numpy arrays, as Spark blocks
  arrive; the round copies each to the device), with the model's state as
  the shipped broadcast value;
- its ``RoundResult`` carries the device decision (``devices``: kind,
  index, address, reason), which goes into the JSON as it came.

Models: the seeds' LeNet (``sparkavg.nn.lenet``) and the torch zoo's LeNet
as a ``TorchModel`` (``--models``), Adam(lr=1e-3), on Fashion-MNIST-shaped
random data (1x28x28 in [0, 1), 10 classes) or the real training images
(``--data-dir``).  Each round fits ``--batches`` minibatches of
``--batch-size``; after one warm-up round of each, ``--rounds`` rounds run
alternating between device="gpu" and device="cpu" (the CPU side on
``--task-cpus`` threads: the task's ``cpus()``), each from the same shipped
state.  Figures: ms per round (the task function's wall time: state onto
the device, every step, the result back to the host) and examples/s, the
round's own fit and task seconds (``speeds``) and phase totals (``stats``).
One ``device="auto"`` round records what auto picks with that context.

Also: the gradient-sharing step (encode on the device, messages as bytes,
applied back; tests/test_gpu_executor.py's loop) on two in-process LeNet
replicas, GPU against CPU, examples/s.

``--cpu-only`` runs the CPU side with a task context naming no GPU, plus a
device="auto" round (the CPU, with its reason) and a device="gpu" round
(the task's permanent DeviceError, as its TaskFailure).

    PYTHONPATH=$PWD python3 benchmarks/bench_gpu_executor.py --out $OUT/executor_gpu.json
    PYTHONPATH=$PWD python benchmarks/bench_gpu_executor.py --cpu-only
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
import traceback

import numpy as np

from report import emit
from sparkavg.data.validation import DEFAULT_INPUT

SPARK = ("executor task function run directly with a TaskContext whose resources name GPU {address} "
         "(no JVM on the device machine)")
SPARK_CPU_ONLY = "executor task function run directly with a TaskContext naming no GPU (--cpu-only)"
LR = 1e-3
TAU = 1e-3


def _parse(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cpu-only", action="store_true", help="the CPU side only, with a context naming no GPU")
    p.add_argument("--models", default="native,torch", help="comma-separated among native, torch (default both)")
    p.add_argument("--rounds", type=int, default=None, help="timed rounds per device (default 5; cpu 2)")
    p.add_argument("--batches", type=int, default=None, help="minibatches per round (default 32; cpu 4)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--task-cpus", type=int, default=min(4, os.cpu_count() or 1),
                   help="the task context's cpus(): the CPU network's threads (default min(4, cores))")
    p.add_argument("--gpu-address", default="0", help="the GPU address the task context names (default '0')")
    p.add_argument("--sharing-steps", type=int, default=None,
                   help="timed sharing iterations (default 20; cpu 3); 0 skips")
    p.add_argument("--data-dir", help="Fashion-MNIST (IDX files) instead of random 28x28 data")
    p.add_argument("--seed", type=int, default=123)
    p.add_argument("--out", help="also write the JSON here")
    args = p.parse_args(argv)
    args.models = [m for m in args.models.split(",") if m]
    if not args.models or set(args.models) - {"native", "torch"}:
        p.error(f"Expect --models among native, torch, got {args.models}")
    for name, gpu_default, cpu_default in (("rounds", 5, 2), ("batches", 32, 4), ("sharing_steps", 20, 3)):
        if getattr(args, name) is None:
            setattr(args, name, cpu_default if args.cpu_only else gpu_default)
    return args


class Shipped:
    """What a task reads from a Spark broadcast: ``.value``."""

    def __init__(self, value):
        self.value = value


def _task_context(address, cpus: int):
    """The running task's context, as a Spark Python worker sets it: partition 0,
    ``cpus``, resources naming GPU ``address`` (none when None)."""
    from pyspark import TaskContext
    from pyspark.resource import ResourceInformation

    ctx = TaskContext._getOrCreate()
    ctx._stageId, ctx._partitionId, ctx._attemptNumber, ctx._taskAttemptId = 0, 0, 0, 0
    ctx._cpus, ctx._localProperties = int(cpus), {}
    ctx._resources = {} if address is None else {"gpu": ResourceInformation("gpu", [str(address)])}
    TaskContext._setTaskContext(ctx)
    assert TaskContext.get() is ctx
    return ctx


def _data(args, n: int):
    if args.data_dir:
        from sparkavg.data.mnist import load_mnist

        x, y = load_mnist(args.data_dir, "train", limit=n)
        return x, y, f"{args.data_dir} (train, first {len(x)})"
    rng = np.random.default_rng(args.seed)
    return (rng.random((n, 1, 28, 28), dtype=np.float32), rng.integers(0, 10, n).astype(np.int64),
            "random 1x28x28 in [0, 1), 10 classes")


def _model(kind: str, seed: int):
    from sparkavg.nn import Adam, lenet

    if kind == "native":
        return lenet(seed=seed, updater=Adam(lr=LR))
    from sparkavg.torch import TorchModel

    return TorchModel("sparkavg.torch.zoo:lenet", updater=Adam(lr=LR), input_shape=(1, 28, 28), seed=seed)


def _error(exc) -> str:
    return "".join(traceback.format_exception_only(type(exc), exc)).strip()[-600:]


def _round(config_json, state, minibatches, device: str, round_no: int) -> dict:
    """One averaging round task over ``minibatches``, timed: a plain record."""
    from sparkavg.spark.executor.averaging import make_round_task

    task = make_round_task(config_json, Shipped(state), round_no=round_no, save_updater=True, uniform=False,
                           collect_stats=True, prefetch=1, device=device)
    t = time.perf_counter()
    out = list(task(iter(minibatches)))
    wall = time.perf_counter() - t
    if len(out) != 1 or type(out[0]).__name__ != "RoundResult":
        failure = out[0] if out else None
        return {"device_requested": device, "failure": {s: getattr(failure, s, None)
                                                         for s in ("kind", "message", "where")}}
    r = out[0]
    phases: dict = {}
    for payload in r.stats:
        for phase, _start, duration, _fields in payload.get("events", []):
            phases[str(phase)] = phases.get(str(phase), 0.0) + float(duration)
    _, examples, fit_s, task_s, _ = r.speeds[0]
    return {"device_requested": device, "devices": r.devices, "ms": wall * 1e3, "examples": int(r.examples),
            "examples_per_s": r.examples / wall, "fit_seconds": fit_s, "task_seconds": task_s,
            "phase_seconds": phases, "mean_loss": r.loss_sum / r.examples, "_params": r.params / r.weight}


def _summary(rounds: list) -> dict:
    ms = [r["ms"] for r in rounds]
    return {"ms_per_round_median": statistics.median(ms), "ms_per_round": ms,
            "examples_per_s_median": statistics.median(r["examples_per_s"] for r in rounds),
            "fit_seconds_median": statistics.median(r["fit_seconds"] for r in rounds),
            "phase_seconds_last": rounds[-1]["phase_seconds"], "mean_loss": [r["mean_loss"] for r in rounds],
            "device_decision": rounds[-1]["devices"]}


def _averaging(args, kind: str, devices: list, x, y) -> dict:
    net = _model(kind, args.seed)
    from sparkavg.spark.runners.base import network_state

    config_json, state = net.to_json(), network_state(net, with_updater=True)
    b = args.batch_size
    minibatches = [({DEFAULT_INPUT: x[i:i + b]}, y[i:i + b]) for i in range(0, args.batches * b, b)]
    out = {"model": kind, "num_params": int(net.num_params), "examples_per_round": args.batches * b}
    rounds = {d: [] for d in devices}
    for d in devices:  # warm-up: the worker's network is built, kernels compiled
        warm = _round(config_json, state, minibatches, d, 0)
        if "failure" in warm:
            out.setdefault("failures", {})[d] = warm["failure"]
    devices = [d for d in devices if d not in out.get("failures", {})]
    for r in range(1, args.rounds + 1):
        for d in devices:
            rounds[d].append(_round(config_json, state, minibatches, d, r))
    out["by_device"] = {d: _summary(rounds[d]) for d in devices}
    if "gpu" in devices and "cpu" in devices:
        g, c = out["by_device"]["gpu"], out["by_device"]["cpu"]
        out["gpu_speedup_per_round"] = c["ms_per_round_median"] / g["ms_per_round_median"]
        out["max_abs_param_diff_gpu_vs_cpu"] = float(np.max(np.abs(rounds["gpu"][-1]["_params"]
                                                                   - rounds["cpu"][-1]["_params"])))
    return out


def _sharing(args, on_gpu: bool, x, y) -> dict:
    """tests/test_gpu_executor.py's two-replica loop (executor/sharing.py's steps), timed."""
    from sparkavg import backend
    from sparkavg.sharing import SharingState, apply_message, apply_received, encode_update, message_bytes
    from sparkavg.sharing.thresholds import FixedThreshold
    from sparkavg.spark.executor.context import load_state
    from sparkavg.spark.runners.base import network_state

    nets = [_model("native", args.seed) for _ in range(2)]
    state = network_state(nets[0], with_updater=True)
    for net in nets:
        if on_gpu:
            net.to_gpu()
        load_state(net, state, with_updater=True)
    xp, n, b = nets[0].xp, nets[0].num_params, args.batch_size
    states = [SharingState(FixedThreshold(TAU), n, xp=xp) for _ in nets]
    updates = [xp.zeros(n, xp.float32) for _ in nets]
    sent = [0]

    def step(i):
        outbox = []
        for w, (net, st, update) in enumerate(zip(nets, states, updates)):
            j = ((2 * i + w) * b) % (len(x) - b)
            net.compute_update({DEFAULT_INPUT: x[j:j + b]}, y[j:j + b], update)
            message = encode_update(st, update)
            if message is not None:
                outbox.append((w, message_bytes(message)))  # device -> host: only the message crosses
                apply_message(message, net.params)
        for w, (net, st) in enumerate(zip(nets, states)):
            apply_received(st, [m for src, m in outbox if src != w], net.params)  # host -> device
        sent[0] += sum(len(m) for _, m in outbox)

    for i in range(2):
        step(i)
    sync = backend.cupy().cuda.Device().synchronize if on_gpu else (lambda: None)
    sync()
    sent[0], t = 0, time.perf_counter()
    for i in range(2, 2 + args.sharing_steps):
        step(i)
    sync()
    seconds = time.perf_counter() - t
    return {"iterations": args.sharing_steps, "examples_per_s": 2 * b * args.sharing_steps / seconds,
            "ms_per_iteration": seconds * 1e3 / args.sharing_steps, "message_bytes_per_iteration":
            sent[0] / args.sharing_steps, "on_device": bool(backend.is_gpu_array(nets[0].params))}


def main(argv=None):
    args = _parse(argv)
    began = time.perf_counter()
    from sparkavg import backend, ops

    if not args.cpu_only and not backend.available():
        raise SystemExit("bench_gpu_executor.py needs CuPy and a CUDA device (or --cpu-only): "
                         + str(backend.unavailable_reason()))
    try:
        ctx = _task_context(None if args.cpu_only else args.gpu_address, args.task_cpus)
    except ImportError as exc:
        raise SystemExit(f"bench_gpu_executor.py needs pyspark's Python sources importable (no JVM is "
                         f"started): {exc}") from exc
    n = args.batches * args.batch_size
    x, y, data = _data(args, max(n, 4 * args.batch_size))
    devices = ["cpu"] if args.cpu_only else ["gpu", "cpu"]
    result = {
        "benchmark": "executor_round_gpu" if not args.cpu_only else "executor_round_cpu_only",
        "spark": SPARK.format(address=args.gpu_address) if not args.cpu_only else SPARK_CPU_ONLY,
        "task_context": {"how": "pyspark.TaskContext._getOrCreate() with _partitionId, _cpus, _resources set, "
                                "as a Spark Python worker sets it before running a task",
                         "partitionId": ctx.partitionId(), "cpus": ctx.cpus(),
                         "resources": {k: list(v.addresses) for k, v in ctx.resources().items()}},
        "task": "sparkavg.spark.executor.averaging.make_round_task(..., device=D) on an iterator of "
                "({'input': x}, y) host minibatches; LeNet, Adam(lr=1e-3), float32",
        "data": data, "batch_size": args.batch_size, "batches_per_round": args.batches, "rounds": args.rounds,
        "models": [],
    }
    for kind in args.models:
        try:
            result["models"].append(_averaging(args, kind, devices, x, y))
        except Exception as exc:  # noqa: BLE001 -- recorded; the rest still runs
            result["models"].append({"model": kind, "error": _error(exc)})
    from sparkavg.spark.runners.base import network_state

    native = _model("native", args.seed)
    config_json, state = native.to_json(), network_state(native, with_updater=True)
    few = [({DEFAULT_INPUT: x[i:i + args.batch_size]}, y[i:i + args.batch_size]) for i in range(0, 2 * args.batch_size,
                                                                                       args.batch_size)]
    extra = ["auto"] + (["gpu"] if args.cpu_only else [])
    result["other_requests"] = {}
    for d in extra:
        try:
            r = _round(config_json, state, few, d, 99)
            result["other_requests"][d] = {k: v for k, v in r.items() if k in ("devices", "failure")}
        except Exception as exc:  # noqa: BLE001
            result["other_requests"][d] = {"error": _error(exc)}
    if args.sharing_steps > 0:
        try:
            sharing = {d: _sharing(args, d == "gpu", x, y) for d in devices}
            if "gpu" in sharing:
                sharing["gpu_speedup"] = sharing["gpu"]["examples_per_s"] / sharing["cpu"]["examples_per_s"]
            result["sharing_two_replicas"] = {"threshold": f"FixedThreshold({TAU})", "model": "native LeNet",
                                              **sharing}
        except Exception as exc:  # noqa: BLE001
            result["sharing_two_replicas"] = {"error": _error(exc)}
    if not args.cpu_only:
        gpu = [m["by_device"]["gpu"]["device_decision"][0] for m in result["models"] if "gpu" in m.get("by_device", {})]
        result["checks"] = {
            "every_gpu_round_on_the_spark_assigned_gpu": len(gpu) == len(args.models) and all(
                d["kind"] == "gpu" and d["address"] == str(args.gpu_address) for d in gpu),
            "gpu_faster_per_round": all(m.get("gpu_speedup_per_round", 0) > 1 for m in result["models"]),
        }
    env = {"cython_kernels": ops.have_extension(), "numpy_version": np.__version__,
           "python": platform.python_version(), "cpu_count": os.cpu_count()}
    try:
        import pyspark

        env["pyspark_version"] = pyspark.__version__
    except Exception:  # noqa: BLE001
        pass
    if not args.cpu_only:
        cp = backend.cupy()
        env["gpu"] = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["name"].decode()
        env["cupy_version"] = cp.__version__
    if "torch" in args.models:
        import torch

        env["torch_version"] = torch.__version__
    result.update(env)
    result["command"] = " ".join([os.path.basename(sys.executable), *sys.argv])
    result["seconds"] = time.perf_counter() - began
    from pyspark import TaskContext

    TaskContext._setTaskContext(None)
    return emit(result, args.out)


if __name__ == "__main__":
    main()
