#!/usr/bin/env python
"""torch.optim optimizers behind a TorchModel (``TorchModel(optimizer=...)``),
same run, Fashion-MNIST:

``lenet``
    The torch LeNet (``sparkavg.torch.zoo:lenet``) in one process, batch
    ``--batch-size``, trained with ``torch.optim.Adam(lr=1e-3)`` through the
    adapter and with sparkavg's ``Adam(lr=1e-3)``: the same seed, initial
    weights and minibatch order, epochs alternating; test accuracy (the
    whole test set) after every epoch and the gap in points.
``overhead``
    One thread, batch ``--batch-size``, steps alternating, medians: a
    ``TorchModel`` step with ``torch.optim.Adam`` against a bare torch step
    of the same module with ``torch.optim.Adam`` (the same arithmetic: the
    adapter's cost is the difference) and against the ``TorchModel`` step
    with sparkavg's ``Adam``; and the adapter's own work inside its steps
    (setting the rates and steps, keeping the state in the flat vector:
    the binding's step less torch's ``optimizer.step``).
``adadelta``
    PyTorch's mnist recipe (``examples/torch_mnist.py``: its Net,
    ``Adadelta(lr=1.0)``, ``StepLR(step_size=1, gamma=0.7)`` per epoch,
    nll_loss of log_softmax outputs) on the first ``--recipe-limit-train``
    training examples (default: all) for ``--recipe-epochs`` epochs: one
    plain torch process (2 threads) at the workers' combined batch (2 x
    ``--batch-size``) and at one worker's, then ``ParameterAveraging`` at
    its defaults on ``local[2]`` (2 workers x ``--batch-size``); test
    accuracy after every epoch and the gaps.

The machine's load (1-minute load average, before and after each section)
is recorded: the figures are only comparable within one run.

    PYTHONPATH=$PWD python benchmarks/bench_torch_optim.py --out benchmarks/results/torch_optim.json
    PYTHONPATH=$PWD python benchmarks/bench_torch_optim.py --limit-train 3000 --recipe-limit-train 2000 \\
        --epochs 1 --recipe-epochs 1 --overhead-steps 30       # sanity run
"""
from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import time

import numpy as np

from report import emit, torch_epoch

EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples")
sys.path.insert(0, EXAMPLES)

SECTIONS = ("lenet", "overhead", "adadelta")
LR = 1e-3


def _load(data_dir, limit):
    from sparkavg.data.mnist import load_mnist

    x, y = load_mnist(data_dir, "train", limit=limit)
    xt, yt = load_mnist(data_dir, "test")
    return (x, y), (xt, yt)


def _machine() -> dict:
    return {"load_average_1min": os.getloadavg()[0], "cpus": os.cpu_count()}


def _accuracy(model, xt, yt) -> float:
    return float(np.mean(model.predict(xt) == yt))


def _lenets(seed):
    from sparkavg.nn import Adam
    from sparkavg.torch import TorchModel

    return {"torch_optim_adam": TorchModel("sparkavg.torch.zoo:lenet", input_shape=(1, 28, 28), seed=seed,
                                           optimizer="torch.optim:Adam", optimizer_kwargs={"lr": LR}),
            "sparkavg_adam": TorchModel("sparkavg.torch.zoo:lenet", input_shape=(1, 28, 28), seed=seed,
                                        updater=Adam(lr=LR))}


# ---------------------------------------------------------------------- lenet
def lenet(data, args) -> dict:
    from sparkavg.data.batching import minibatches
    from sparkavg.threads import set_threads

    set_threads(2)
    (x, y), (xt, yt) = data
    models = _lenets(args.seed)
    np.testing.assert_array_equal(*(m.params for m in models.values()))  # the same initial weights
    out = {name: {"accuracy": [], "epoch_seconds": []} for name in models}
    for epoch in range(args.epochs):
        for name, model in models.items():
            t = time.perf_counter()
            for xb, yb in minibatches(x, y, args.batch_size, shuffle=True, seed=args.seed + epoch):
                model.fit_batch(xb, yb)
            model.epoch += 1
            out[name]["epoch_seconds"].append(time.perf_counter() - t)
            out[name]["accuracy"].append(_accuracy(model, xt, yt))
            logging.info("lenet %s epoch %d: accuracy %.4f", name, epoch + 1, out[name]["accuracy"][-1])
    out["gap_points"] = 100 * (out["torch_optim_adam"]["accuracy"][-1] - out["sparkavg_adam"]["accuracy"][-1])
    out.update(examples=int(len(x)), test_examples=int(len(xt)), epochs=args.epochs, batch_size=args.batch_size)
    return out


# ------------------------------------------------------------------- overhead
def overhead(data, args) -> dict:
    import torch

    from sparkavg.threads import set_threads
    from sparkavg.torch.zoo import lenet as torch_lenet

    set_threads(1)
    (x, y), _ = data
    b = args.batch_size
    batches = [(np.ascontiguousarray(x[i:i + b]), y[i:i + b]) for i in range(0, 50 * b, b)]
    tensors = [(torch.from_numpy(xb), torch.from_numpy(yb)) for xb, yb in batches]
    models = _lenets(args.seed)
    adapter = models["torch_optim_adam"]
    torch.manual_seed(args.seed)
    bare = torch_lenet()
    opt = torch.optim.Adam(bare.parameters(), lr=LR)

    def bare_step(i):
        xb, yb = tensors[i % len(tensors)]
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(bare(xb), yb)
        loss.backward()
        opt.step()
        return loss.item()

    def model_step(model):
        def step(i):
            xb, yb = batches[i % len(batches)]
            return model.fit_batch(xb, yb)
        return step

    steps = {"adapter_torch_adam": model_step(adapter), "bare_torch_adam": bare_step,
             "sparkavg_adam": model_step(models["sparkavg_adam"])}
    adapter_step(adapter, batches[0])  # binds: its first step builds the optimizer over the flat vectors
    binding = adapter.flat._bound
    inner = binding.optimizer.step
    inside = {"binding": [], "torch_step": []}

    def timed_torch_step(*a, **k):
        t = time.perf_counter()
        result = inner(*a, **k)
        inside["torch_step"].append(time.perf_counter() - t)
        return result

    binding.optimizer.step = timed_torch_step
    outer = binding.step

    def timed_binding(*a, **k):
        t = time.perf_counter()
        outer(*a, **k)
        inside["binding"].append(time.perf_counter() - t)

    binding.step = timed_binding
    times = {k: [] for k in steps}
    for i in range(args.overhead_steps + 10):
        for name, step in steps.items():
            t = time.perf_counter()
            step(i)
            if i >= 10:
                times[name].append(time.perf_counter() - t)
    med = {k: 1000 * statistics.median(v) for k, v in times.items()}
    own = [a - s for a, s in zip(inside["binding"][10:], inside["torch_step"][10:])]
    return {"median_ms": med, "steps": args.overhead_steps, "batch_size": b, "threads": 1,
            "adapter_vs_bare_torch": med["adapter_torch_adam"] / med["bare_torch_adam"] - 1,
            "adapter_own_ms": 1000 * statistics.median(own),
            "adapter_own_share_of_step": statistics.median(own) / statistics.median(times["adapter_torch_adam"]),
            "torch_adam_vs_sparkavg_adam": med["adapter_torch_adam"] / med["sparkavg_adam"] - 1}


def adapter_step(model, batch):
    model.fit_batch(*batch)


# ------------------------------------------------------------------- adadelta
def _one_process(data, args, batch: int) -> dict:
    """The recipe in one plain torch process at ``batch``: its Net, Adadelta, StepLR per epoch, nll_loss."""
    import torch

    import torch_mnist

    (x, y), (xt, yt) = data
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        torch.manual_seed(args.seed)  # as TorchModel builds it: the same initial weights
        module = torch_mnist.net()
        opt = torch.optim.Adadelta(module.parameters(), lr=1.0)
        scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.7)
        xs, ys, xts = torch.from_numpy(x), torch.from_numpy(y), torch.from_numpy(xt)
        accuracy, seconds = [], []
        for epoch in range(args.recipe_epochs):
            took, acc = torch_epoch(torch, module, opt, torch.nn.functional.nll_loss, xs, ys, xts, yt, batch,
                                    args.seed, epoch)
            scheduler.step()
            seconds.append(took)
            accuracy.append(acc)
            logging.info("recipe, one process at batch %d, epoch %d: accuracy %.4f", batch, epoch + 1, accuracy[-1])
    finally:
        torch.set_num_threads(threads)
    return {"accuracy": accuracy, "epoch_seconds": seconds, "batch_size": batch, "threads": 2}


def adadelta(data, args) -> dict:
    from mnist_example import as_minibatch_rdd, spark_session

    import torch_mnist
    from sparkavg.spark import ParameterAveraging, SparkTrainer

    (x, y), (xt, yt) = data
    out = {"examples": int(len(x)), "test_examples": int(len(xt)), "epochs": args.recipe_epochs,
           "one_process": _one_process(data, args, 2 * args.batch_size),
           "one_process_worker_batch": _one_process(data, args, args.batch_size)}
    spark = spark_session("local[2]", "bench-torch-optim")
    try:
        spark.sparkContext.addPyFile(os.path.join(EXAMPLES, "torch_mnist.py"))
        sc = spark.sparkContext
        rdd, test = as_minibatch_rdd(sc, x, y, 2), as_minibatch_rdd(sc, xt, yt, 2)
        master = ParameterAveraging(batch_size_per_worker=args.batch_size, workers=2, seed=args.seed)
        model = torch_mnist.build(seed=args.seed)
        with SparkTrainer(spark, model, master) as trainer:
            trainer.fit(rdd, epochs=args.recipe_epochs, validation_data=test)
            h = trainer.history
        out["averaging"] = {"master": master.to_config(), "accuracy": [e["accuracy"] for e in h],
                            "epoch_seconds": [e["seconds"] for e in h],
                            "averaging_frequency": [e.get("averaging_frequency") for e in h],
                            "rates": [model.updater.rate(0, e) for e in range(args.recipe_epochs)]}
        rdd.unpersist()
        test.unpersist()
    finally:
        spark.stop()
    last = out["averaging"]["accuracy"][-1]
    out["gap_points"] = 100 * (last - out["one_process"]["accuracy"][-1])
    out["gap_points_worker_batch"] = 100 * (last - out["one_process_worker_batch"]["accuracy"][-1])
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", default=None)
    p.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated subset of {SECTIONS}")
    p.add_argument("--epochs", type=int, default=2, help="lenet epochs")
    p.add_argument("--batch-size", type=int, default=32, help="examples per step (per worker for adadelta)")
    p.add_argument("--limit-train", type=int, default=None, help="lenet's training examples (default: all)")
    p.add_argument("--overhead-steps", type=int, default=200)
    p.add_argument("--recipe-limit-train", type=int, default=None, help="adadelta's training examples (default: all)")
    p.add_argument("--recipe-epochs", type=int, default=3)
    p.add_argument("--seed", type=int, default=123)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    sections = [s for s in args.sections.split(",") if s]
    result = {"sections": sections, "machine": _machine()}
    for section in sections:
        before = _machine()["load_average_1min"]
        if section == "adadelta":
            result[section] = adadelta(_load(args.data_dir, args.recipe_limit_train), args)
        else:
            result[section] = globals()[section](_load(args.data_dir, args.limit_train), args)
        result[section]["load_average_1min"] = [before, _machine()["load_average_1min"]]
    emit(result, args.out)
    return result


if __name__ == "__main__":
    main()
