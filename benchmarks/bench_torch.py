#!/usr/bin/env python
"""A torch module trained by sparkavg (``sparkavg.torch.TorchModel``), same run,
2 workers x 1 thread on ``local[2]``, Fashion-MNIST, 32 examples per
worker (or process) per step, Adam(lr=1e-3):

``averaging``
    The seeds' LeNet as a torch module (``sparkavg.torch.zoo:lenet``) and
    the native ``sparkavg.nn`` LeNet, each trained by ``ParameterAveraging``
    at its defaults, epochs alternating: test accuracy after every epoch,
    examples/s (median epoch).
``ceiling``
    The module's own ceiling here: two single-thread torch processes
    (``torch.optim.Adam``, no Spark), started together, each training the
    module on its half of the examples for one epoch; examples/s = all
    examples / the slower process's seconds.
``distributor``
    pyspark's ``TorchDistributor`` (local mode, 2 processes x 1 thread,
    DDP over gloo) training the same module on the same data for the same
    epochs: examples/s of the training loops (process start-up apart, and
    with it), test accuracy after every epoch.
``sharing``
    The torch LeNet under ``GradientSharing`` with the adaptive threshold
    starting at 1e-2 (as ``bench_sharing.py`` and the example: a fixed
    1e-3 is below Adam's ~1e-3 steps, so nearly every entry crosses it):
    bytes on the wire against dense float32 updates, replica agreement,
    accuracy.
``overhead``
    One thread, batch 32: ``TorchModel.fit_batch`` against a bare torch
    step of the same module with the same updater arithmetic (parameters
    and gradients as views of flat vectors, sparkavg's fused Adam kernel,
    inputs already tensors) and, for reference, against ``torch.optim.Adam``;
    steps alternate, medians.
``resnet``, ``lstm`` (not in the default run; accuracy only)
    A torch ResNet with BatchNorm (``sparkavg.torch.zoo:resnet``, the
    graph of ``examples/mnist_resnet.py``) and a torch LSTM classifier
    reading the image's rows as 28 steps of 28 pixels
    (``sparkavg.torch.zoo:lstm``, 128 units, as ``examples/mnist_lstm.py``),
    each on the first ``--model-limit-train`` training examples (default
    12,000) for ``--model-epochs`` epochs (default 2): one torch process
    (``torch.optim.Adam``, batch 2 x 32, 2 threads, no Spark), then
    ``ParameterAveraging`` at its defaults and ``GradientSharing`` (adaptive
    threshold from 1e-2), 2 workers x 32 on ``local[2]``: test accuracy
    after every epoch.

Prints JSON (and writes it with --out)::

    PYTHONPATH=$PWD python benchmarks/bench_torch.py --out benchmarks/results/torch.json
    PYTHONPATH=$PWD python benchmarks/bench_torch.py --limit-train 6000 --epochs 1   # sanity run
    PYTHONPATH=$PWD python benchmarks/bench_torch.py --sections resnet,lstm --out benchmarks/results/torch_models.json

The same comparison on simulated hosts with shaped links is ``bench_torch_hosts.py``.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import time

import numpy as np

from report import emit, subset, torch_epoch, torch_step

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))

SECTIONS = ("averaging", "ceiling", "distributor", "sharing", "overhead")
MODEL_SECTIONS = {"resnet": "sparkavg.torch.zoo:resnet", "lstm": "sparkavg.torch.zoo:lstm"}
LR = 1e-3


def _load(data_dir, limit):
    from sparkavg.data.mnist import load_mnist

    x, y = load_mnist(data_dir, "train", limit=limit)
    xt, yt = load_mnist(data_dir, "test")
    return (x, y), (xt, yt)


def _torch_lenet(seed):
    from sparkavg.nn import Adam
    from sparkavg.torch import TorchModel

    return TorchModel("sparkavg.torch.zoo:lenet", updater=Adam(lr=LR), input_shape=(1, 28, 28), seed=seed)


def _history(trainer, examples) -> dict:
    h = trainer.history
    return {"accuracy": [e["accuracy"] for e in h], "epoch_seconds": [e["seconds"] for e in h],
            "examples_per_second": examples / statistics.median(e["seconds"] for e in h),
            "averaging_frequency": [e.get("averaging_frequency") for e in h]}


# ------------------------------------------------------------------ averaging
def averaging(spark, data, args) -> dict:
    from mnist_lenet import as_minibatch_rdd

    from sparkavg.nn import Adam, lenet
    from sparkavg.spark import ParameterAveraging, SparkTrainer

    (x, y), (xt, yt) = data
    sc = spark.sparkContext
    rdd, test = as_minibatch_rdd(sc, x, y, args.workers), as_minibatch_rdd(sc, xt, yt, args.workers)
    master = ParameterAveraging(batch_size_per_worker=args.batch_size, workers=args.workers, seed=args.seed)
    trainers = {"native": SparkTrainer(spark, lenet(seed=args.seed, updater=Adam(lr=LR)), master),
                "torch": SparkTrainer(spark, _torch_lenet(args.seed), master)}
    for _ in range(args.epochs):
        for trainer in trainers.values():
            trainer.fit(rdd, epochs=1, validation_data=test)
    out = {name: _history(t, len(x)) for name, t in trainers.items()}
    for t in trainers.values():
        t.close()
    rdd.unpersist()
    test.unpersist()
    out["master"] = master.to_config()
    out["accuracy_gap_points"] = 100 * (out["native"]["accuracy"][-1] - out["torch"]["accuracy"][-1])
    return out


# -------------------------------------------------------------------- ceiling
def _single_process(args) -> dict:
    """Child mode: one single-thread torch process, one epoch over its half."""
    import torch

    from sparkavg.torch.zoo import lenet

    torch.set_num_threads(1)
    (x, y), _ = _load(args.data_dir, args.limit_train)
    idx = np.random.default_rng([args.seed, args.part]).permutation(len(x))[args.part::2]
    xs, ys = torch.from_numpy(x[idx]), torch.from_numpy(y[idx])
    torch.manual_seed(args.seed)
    model = lenet()
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    t = time.perf_counter()
    for start in range(0, len(idx), args.batch_size):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(xs[start:start + args.batch_size]),
                                                 ys[start:start + args.batch_size])
        loss.backward()
        opt.step()
        loss.item()
    return {"examples": int(len(idx)), "seconds": time.perf_counter() - t}


def ceiling(args) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--single-process", "--batch-size", str(args.batch_size),
           "--seed", str(args.seed)] + (["--data-dir", args.data_dir] if args.data_dir else []) + \
        (["--limit-train", str(args.limit_train)] if args.limit_train else [])
    procs = [subprocess.Popen(cmd + ["--part", str(p)], stdout=subprocess.PIPE, text=True,
                              env=dict(os.environ, OMP_NUM_THREADS="1")) for p in (0, 1)]
    runs = [json.loads(p.communicate()[0].strip().splitlines()[-1]) for p in procs]
    examples = sum(r["examples"] for r in runs)
    return {"processes": runs, "examples_per_second": examples / max(r["seconds"] for r in runs),
            "one_process_examples_per_second": [r["examples"] / r["seconds"] for r in runs]}


# ---------------------------------------------------------------- distributor
#: What each TorchDistributor process trains, as importable names (resolved in the process):
#: the module's factory, the loss of its outputs and integer targets, torch's optimizer and,
#: optionally, a scheduler stepped after every epoch; ``paths`` go first on the process's sys.path.
LENET_ADAM = {"module": "sparkavg.torch.zoo:lenet", "loss": "torch.nn.functional:cross_entropy",
              "optimizer": "torch.optim:Adam", "optimizer_kwargs": {"lr": LR}}


def _ddp_train(data_dir, limit, epochs, batch, seed, recipe, turns=None):
    """Runs in each TorchDistributor process: DDP over gloo, one thread, ``recipe`` (as LENET_ADAM).

    With ``turns`` (a folder: :class:`DistributorTurns`), every epoch waits for the driver's
    ``go-<epoch>`` file there, and rank 0 writes ``ready`` before the first and ``done-<epoch>`` after
    each epoch and its evaluation; the seconds spent waiting are returned as ``waited_seconds``."""
    import importlib
    import os
    import sys
    import time

    import numpy as np
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from sparkavg.data.mnist import load_mnist

    def named(reference):
        module, _, attr = reference.partition(":")
        return getattr(importlib.import_module(module), attr)

    def signal(name):
        if turns is not None and rank == 0:
            with open(os.path.join(turns, name + ".tmp"), "w") as fh:
                fh.write(name)
            os.replace(os.path.join(turns, name + ".tmp"), os.path.join(turns, name))

    def wait_turn(epoch):
        t = time.perf_counter()
        while turns is not None and not os.path.exists(os.path.join(turns, f"go-{epoch}")):
            time.sleep(0.02)
        return time.perf_counter() - t

    sys.path[:0] = recipe.get("paths", [])
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    x, y = load_mnist(data_dir, "train", limit=limit)
    xt, yt = load_mnist(data_dir, "test")
    xs, ys = torch.from_numpy(x), torch.from_numpy(y)
    torch.manual_seed(seed)
    model = DistributedDataParallel(named(recipe["module"])(**recipe.get("module_kwargs", {})))
    opt = named(recipe["optimizer"])(model.parameters(), **recipe.get("optimizer_kwargs", {}))
    scheduler = (named(recipe["scheduler"])(opt, **recipe.get("scheduler_kwargs", {}))
                 if recipe.get("scheduler") else None)
    loss_of = named(recipe["loss"])
    per_rank = len(x) // world
    seconds, accuracy, waited = [], [], 0.0
    dist.barrier()
    signal("ready")
    for epoch in range(epochs):
        order = torch.from_numpy(np.random.default_rng([seed, epoch]).permutation(len(x))[rank::world][:per_rank])
        waited += wait_turn(epoch)
        dist.barrier()
        t = time.perf_counter()
        model.train()
        for start in range(0, per_rank, batch):
            idx = order[start:start + batch]
            opt.zero_grad()
            loss = loss_of(model(xs[idx]), ys[idx])
            loss.backward()
            opt.step()
            loss.item()
        dist.barrier()
        seconds.append(time.perf_counter() - t)
        if scheduler is not None:
            scheduler.step()
        if rank == 0:
            model.eval()
            with torch.no_grad():
                pred = torch.cat([model.module(torch.from_numpy(xt[i:i + 1000])).argmax(1)
                                  for i in range(0, len(xt), 1000)])
            accuracy.append(float((pred.numpy() == yt).mean()))
        signal(f"done-{epoch}")
    dist.destroy_process_group()
    return {"epoch_seconds": seconds, "accuracy": accuracy, "examples": per_rank * world, "waited_seconds": waited}


def run_distributor(workers, data_dir, limit, epochs, batch, seed, recipe=LENET_ADAM, turns=None) -> dict:
    """pyspark's TorchDistributor (local mode, ``workers`` processes x 1 thread, DDP over gloo) training
    ``recipe`` on the first ``limit`` training examples (each process its half, ``batch`` per process per
    step): the epochs' seconds (the training loops between barriers), accuracy after every epoch, and
    the wall time of ``TorchDistributor.run`` (process start-up, imports, data loading, gloo, every
    epoch and its evaluation; less the time spent waiting for ``turns``).  Needs an active SparkSession."""
    from pyspark import cloudpickle
    from pyspark.ml.torch.distributor import TorchDistributor

    from sparkavg.data.mnist import default_data_dir

    if _ddp_train.__module__ != "__main__":  # imported by another benchmark: its processes cannot import this file
        cloudpickle.register_pickle_by_value(sys.modules[_ddp_train.__module__])
    t = time.perf_counter()
    run = TorchDistributor(num_processes=workers, local_mode=True, use_gpu=False).run(
        _ddp_train, str(data_dir or default_data_dir()), limit, epochs, batch, seed, recipe, turns)
    wall = time.perf_counter() - t - run["waited_seconds"]
    run["examples_per_second"] = run["examples"] / statistics.median(run["epoch_seconds"])
    run["wall_seconds_with_startup"] = wall
    run["examples_per_second_with_startup"] = run["examples"] * epochs / wall
    return run


class DistributorTurns:
    """:func:`run_distributor` in a background thread, its epochs taken in turns with other work in
    this process: :meth:`start` returns once the processes are up and the data loaded (their start-up
    alone on the machine); each :meth:`epoch` lets one epoch (and its evaluation) run and waits for it."""

    def __init__(self, *args, **kwargs):
        import tempfile
        import threading

        self.folder = tempfile.mkdtemp(prefix="sparkavg-ddp-turns-")
        self.result, self.error = None, None

        def target():
            try:
                self.result = run_distributor(*args, turns=self.folder, **kwargs)
            except BaseException as exc:  # raised in the driver's thread by _wait
                self.error = exc

        self.thread = threading.Thread(target=target, name="distributor-turns", daemon=True)

    def _wait(self, name: str) -> float:
        t = time.perf_counter()
        while not os.path.exists(os.path.join(self.folder, name)):
            if not self.thread.is_alive():
                raise RuntimeError(f"TorchDistributor ended before {name!r}") from self.error
            time.sleep(0.02)
        return time.perf_counter() - t

    def start(self) -> float:
        """Start the processes; the seconds until they are ready."""
        self.thread.start()
        return self._wait("ready")

    def epoch(self, epoch: int) -> float:
        """Run epoch ``epoch`` (from 0); the seconds it and its evaluation took, as the driver saw them."""
        with open(os.path.join(self.folder, f"go-{epoch}"), "w"):
            pass
        return self._wait(f"done-{epoch}")

    def finish(self) -> dict:
        """Wait for the processes to end; :func:`run_distributor`'s result."""
        import shutil

        self.thread.join()
        shutil.rmtree(self.folder, ignore_errors=True)
        if self.error is not None:
            raise self.error
        return self.result


def distributor(spark, args) -> dict:
    return run_distributor(args.workers, args.data_dir, args.limit_train, args.epochs, args.batch_size, args.seed)


# -------------------------------------------------------------------- sharing
def sharing(spark, data, args) -> dict:
    from mnist_lenet import as_minibatch_rdd

    from sparkavg.spark import AdaptiveThreshold, GradientSharing, SparkTrainer

    (x, y), (xt, yt) = data
    sc = spark.sparkContext
    rdd, test = as_minibatch_rdd(sc, x, y, args.workers), as_minibatch_rdd(sc, xt, yt, args.workers)
    master = GradientSharing(batch_size_per_worker=args.batch_size, workers=args.workers, seed=args.seed,
                             threshold=AdaptiveThreshold(initial=1e-2))
    trainer = SparkTrainer(spark, _torch_lenet(args.seed), master)
    trainer.fit(rdd, epochs=args.sharing_epochs, validation_data=test)
    trainer.close()
    c, h = trainer.stats.counters, trainer.history
    rdd.unpersist()
    test.unpersist()
    return {"master": master.to_config(), "accuracy": [e["accuracy"] for e in h],
            "epoch_seconds": [e["seconds"] for e in h],
            "examples_per_second": len(x) / statistics.median(e["seconds"] for e in h),
            "bytes_sent": int(c["bytes_sent"]), "dense_bytes_equivalent": int(c["dense_bytes_equivalent"]),
            "compression_ratio": c["dense_bytes_equivalent"] / c["bytes_sent"],
            "replica_max_abs_diff": max(e["replica_max_abs_diff"] for e in h)}


# ------------------------------------------------------------------- overhead
def overhead(data, args) -> dict:
    import torch

    from sparkavg import ops
    from sparkavg.threads import set_threads
    from sparkavg.torch.zoo import lenet

    set_threads(1)
    (x, y), _ = data
    b = args.batch_size
    batches = [(np.ascontiguousarray(x[i:i + b]), y[i:i + b]) for i in range(0, 50 * b, b)]
    tensors = [(torch.from_numpy(xb), torch.from_numpy(yb)) for xb, yb in batches]
    adapter = _torch_lenet(args.seed)

    torch.manual_seed(args.seed)
    bare = lenet()
    params = [p for p in bare.parameters()]
    n = sum(p.numel() for p in params)
    flat, flat_grad = torch.zeros(n), torch.zeros(n)
    offset = 0
    for p in params:
        k = p.numel()
        flat[offset:offset + k] = p.detach().reshape(-1)
        p.data, p.grad = flat[offset:offset + k].view(p.shape), flat_grad[offset:offset + k].view(p.shape)
        offset += k
    pnp, gnp, m, v = flat.numpy(), flat_grad.numpy(), np.zeros(n, np.float32), np.zeros(n, np.float32)
    it = [0]

    def bare_step(i):
        xb, yb = tensors[i % len(tensors)]
        flat_grad.zero_()
        loss = torch.nn.functional.cross_entropy(bare(xb), yb)
        loss.backward()
        ops.adam_step(pnp, gnp, m, v, LR, 0.9, 0.999, 1e-8, t=it[0] + 1)
        it[0] += 1
        return loss.item()

    torch.manual_seed(args.seed)
    ref = lenet()
    optim_step = torch_step(torch, ref, torch.optim.Adam(ref.parameters(), lr=LR), tensors)

    def adapter_step(i):
        xb, yb = batches[i % len(batches)]
        return adapter.fit_batch(xb, yb)

    steps = {"adapter": adapter_step, "bare_same_arithmetic": bare_step, "bare_torch_optim_adam": optim_step}
    times = {k: [] for k in steps}
    for i in range(args.overhead_steps + 10):
        for name, step in steps.items():
            t = time.perf_counter()
            step(i)
            if i >= 10:
                times[name].append(time.perf_counter() - t)
    med = {k: 1000 * statistics.median(v) for k, v in times.items()}
    return {"median_ms": med, "steps": args.overhead_steps, "batch_size": b,
            "overhead_vs_same_arithmetic": med["adapter"] / med["bare_same_arithmetic"] - 1,
            "overhead_vs_torch_optim": med["adapter"] / med["bare_torch_optim_adam"] - 1}


# ------------------------------------------------------------- resnet, lstm
def _one_process(factory, data, args) -> dict:
    """One plain torch process (torch.optim.Adam, batch workers x batch_size,
    2 threads): test accuracy after every epoch."""
    import torch

    from sparkavg.references import resolve

    (x, y), (xt, yt) = data
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        torch.manual_seed(args.seed)  # as TorchModel builds it: the same initial weights
        module = resolve(factory, "module factory")()
        opt = torch.optim.Adam(module.parameters(), lr=LR)
        xs, ys, xts = torch.from_numpy(x), torch.from_numpy(y), torch.from_numpy(xt)
        batch = args.workers * args.batch_size
        accuracy, seconds = [], []
        for epoch in range(args.model_epochs):
            took, acc = torch_epoch(torch, module, opt, torch.nn.functional.cross_entropy, xs, ys, xts, yt, batch,
                                    args.seed, epoch)
            seconds.append(took)
            accuracy.append(acc)
    finally:
        torch.set_num_threads(threads)
    return {"accuracy": accuracy, "epoch_seconds": seconds, "batch_size": batch, "threads": 2}


def model_section(spark, name, args) -> dict:
    """A torch model of MODEL_SECTIONS: one torch process, then both masters."""
    from mnist_lenet import as_minibatch_rdd

    from sparkavg.nn import Adam
    from sparkavg.spark import AdaptiveThreshold, GradientSharing, ParameterAveraging, SparkTrainer
    from sparkavg.torch import TorchModel

    factory = MODEL_SECTIONS[name]
    data = _load(args.data_dir, args.model_limit_train)
    (x, y), (xt, yt) = data
    out = {"factory": factory, "examples": int(len(x)), "epochs": args.model_epochs,
           "one_process": _one_process(factory, data, args)}
    sc = spark.sparkContext
    rdd, test = as_minibatch_rdd(sc, x, y, args.workers), as_minibatch_rdd(sc, xt, yt, args.workers)
    masters = {"averaging": ParameterAveraging(batch_size_per_worker=args.batch_size, workers=args.workers,
                                               seed=args.seed),
               "sharing": GradientSharing(batch_size_per_worker=args.batch_size, workers=args.workers,
                                          seed=args.seed, threshold=AdaptiveThreshold(initial=1e-2))}
    for f in args.model_frequencies:  # diagnostics: averaging at fixed frequencies
        masters[f"averaging_f{f}"] = ParameterAveraging(batch_size_per_worker=args.batch_size, workers=args.workers,
                                                        seed=args.seed, averaging_frequency=f)
    for master_name, master in masters.items():
        model = TorchModel(factory, updater=Adam(lr=LR), input_shape=(1, 28, 28), seed=args.seed)
        trainer = SparkTrainer(spark, model, master)
        trainer.fit(rdd, epochs=args.model_epochs, validation_data=test)
        trainer.close()
        h, c = trainer.history, trainer.stats.counters
        run = {"master": master.to_config(), "accuracy": [e["accuracy"] for e in h],
               "epoch_seconds": [e["seconds"] for e in h]}
        if master_name.startswith("averaging"):
            run["averaging_frequency"] = [e.get("averaging_frequency") for e in h]
        if master_name == "sharing":
            run.update(compression_ratio=c["dense_bytes_equivalent"] / c["bytes_sent"],
                       replica_max_abs_diff=max(e["replica_max_abs_diff"] for e in h))
        out[master_name] = run
    rdd.unpersist()
    test.unpersist()
    out["num_params"], out["num_buffers"] = int(model.num_params), int(model.state["buffers"].size)
    one = out["one_process"]["accuracy"][-1]
    for master_name in masters:
        out[f"{master_name}_minus_one_process_points"] = 100 * (out[master_name]["accuracy"][-1] - one)
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", default=None)
    p.add_argument("--sections", default=",".join(SECTIONS),
                   help=f"comma-separated subset of {SECTIONS + tuple(MODEL_SECTIONS)}")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--sharing-epochs", type=int, default=1)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=32, help="examples per worker (process) per step")
    p.add_argument("--limit-train", type=int, default=None)
    p.add_argument("--overhead-steps", type=int, default=200)
    p.add_argument("--model-limit-train", type=int, default=12000, help="training examples of resnet and lstm")
    p.add_argument("--model-epochs", type=int, default=2, help="epochs of resnet and lstm")
    p.add_argument("--model-frequencies", default="",
                   help="resnet and lstm: also averaging at these fixed frequencies (comma-separated; diagnostics)")
    p.add_argument("--seed", type=int, default=123)
    p.add_argument("--out", default=None)
    p.add_argument("--single-process", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--part", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.model_frequencies = [int(f) for f in args.model_frequencies.split(",") if f]
    if args.single_process:
        print(json.dumps(_single_process(args)))
        return None
    sections = subset(p, args.sections, SECTIONS + tuple(MODEL_SECTIONS), "sections")
    logging.basicConfig(level=logging.WARNING)

    from mnist_lenet import spark_session

    data = _load(args.data_dir, args.limit_train)
    result = {"benchmark": "torch module", "examples": int(len(data[0][0])), "test_examples": int(len(data[1][0])),
              "epochs": args.epochs, "workers": args.workers, "batch_size_per_worker": args.batch_size,
              "cpu_count": os.cpu_count(), "load_average_1min_before": os.getloadavg()[0], "sections": sections}
    if "overhead" in sections:
        result["overhead"] = overhead(data, args)
    if "ceiling" in sections:
        result["ceiling"] = ceiling(args)
    spark = spark_session(f"local[{args.workers}]", "bench-torch")
    try:
        if "averaging" in sections:
            result["averaging"] = averaging(spark, data, args)
        if "distributor" in sections:
            result["distributor"] = distributor(spark, args)
        if "sharing" in sections:
            result["sharing"] = sharing(spark, data, args)
        for name in MODEL_SECTIONS:
            if name in sections:
                result[name] = model_section(spark, name, args)
    finally:
        spark.stop()
    verdict = {}
    avg = result.get("averaging")
    if avg:
        verdict["accuracy_gap_points_native_minus_torch"] = avg["accuracy_gap_points"]
        verdict["accuracy_within_0.5"] = abs(avg["accuracy_gap_points"]) <= 0.5
        if "ceiling" in result:
            verdict["share_of_ceiling"] = avg["torch"]["examples_per_second"] / result["ceiling"]["examples_per_second"]
        if "distributor" in result:
            verdict["vs_torch_distributor"] = (avg["torch"]["examples_per_second"]
                                               / result["distributor"]["examples_per_second"])
    if "sharing" in result:
        verdict["sharing_compression_ge_100"] = result["sharing"]["compression_ratio"] >= 100
        verdict["replicas_agree_le_1e-4"] = result["sharing"]["replica_max_abs_diff"] <= 1e-4
    if "overhead" in result:
        verdict["adapter_overhead_le_10pct"] = result["overhead"]["overhead_vs_same_arithmetic"] <= 0.10
    for name in MODEL_SECTIONS:
        if name in result:
            gap = result[name]["averaging_minus_one_process_points"]
            verdict[f"{name}_averaging_within_0.5_of_one_process"] = abs(gap) <= 0.5
            verdict[f"{name}_averaging_not_0.5_below_one_process"] = gap >= -0.5
    result["verdict"] = verdict
    result["load_average_1min_after"] = os.getloadavg()[0]
    return emit(result, args.out)


if __name__ == "__main__":
    main()
