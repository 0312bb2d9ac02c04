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
    training examples (default: all) for ``--recipe-epochs`` epochs, the
    runs of ``--recipe-runs``: one plain torch process (2 threads) at the
    workers' combined batch (2 x ``--batch-size``, ``one_process``) and at
    one worker's (``one_process_worker_batch``), one after the other; then,
    on one ``local[2]`` session whose start is in neither's time,
    ``ParameterAveraging`` at its defaults (2 workers x ``--batch-size``,
    the example's ``SparkTrainer(...).fit``, one ``fit(epochs=1)`` per
    epoch on the same trainer) and pyspark's ``TorchDistributor`` (local
    mode, 2 processes x 1 thread, DDP over gloo, the same module, loss,
    optimizer and scheduler by name, each process its half of every
    epoch's shuffle, ``--batch-size`` per process), each started alone,
    then their epochs in turns (averaging's first: ``_spark_runs``).  Test
    accuracy after every epoch and the gaps; examples/s of the epochs
    (sparkavg: the history's epoch seconds, the first epoch's worker
    start-up and probe included, validation not; TorchDistributor: its
    training loops between barriers, start-up and evaluation not) and
    with start-up (sparkavg: the data into Spark, the trainer, every fit
    with its validation pass; TorchDistributor: ``run`` from start to end,
    evaluation after every epoch included, less its waits for its turns).

The machine's load (1-minute load average, before and after each section)
is recorded: the figures are only comparable within one run.

    PYTHONPATH=$PWD python benchmarks/bench_torch_optim.py --out benchmarks/results/torch_optim.json
    PYTHONPATH=$PWD python benchmarks/bench_torch_optim.py --limit-train 3000 --recipe-limit-train 2000 \\
        --epochs 1 --recipe-epochs 1 --overhead-steps 30       # sanity run
    PYTHONPATH=$PWD python benchmarks/bench_torch_optim.py --sections adadelta --batch-size 64 \\
        --recipe-limit-train 20000 --out benchmarks/results/torch_recipe.json    # issue 36's figure
"""
from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import time

import numpy as np

from report import emit, subset, torch_epoch, torch_step

EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples")
sys.path.insert(0, EXAMPLES)

SECTIONS = ("lenet", "overhead", "adadelta")
RECIPE_RUNS = ("one_process", "one_process_worker_batch", "averaging", "distributor")
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
    bare_step = torch_step(torch, bare, torch.optim.Adam(bare.parameters(), lr=LR), tensors)

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


def _ddp_recipe(model) -> dict:
    """``model``'s module, loss, optimizer and scheduler as TorchDistributor's processes build them
    (``bench_torch.run_distributor``): the same names, so the same code."""
    u = model.updater
    return {"module": model.factory_ref, "module_kwargs": dict(model.factory_kwargs),
            "loss": model.config_arguments()["loss"], "optimizer": u.optimizer,
            "optimizer_kwargs": {"lr": u.lr, **u.kwargs}, "scheduler": u.scheduler,
            "scheduler_kwargs": dict(u.scheduler_kwargs), "paths": [os.path.abspath(EXAMPLES)]}


def _throughput(run: dict, examples: int, wall: float) -> dict:
    """Examples/s of the epochs' training (their seconds summed) and of the whole run (``wall``)."""
    epochs = len(run["epoch_seconds"])
    run.update(train_seconds=sum(run["epoch_seconds"]), wall_seconds_with_startup=wall,
               examples_per_second=examples * epochs / sum(run["epoch_seconds"]),
               examples_per_second_with_startup=examples * epochs / wall)
    return run


class _Averaging:
    """The recipe as examples/torch_mnist.py trains it, ``SparkTrainer(...).fit`` at the defaults, one
    ``fit(epochs=1)`` per :meth:`epoch` on the same trainer (the state, the frequencies' measurements and
    the scheduler carry over), so that its epochs can take turns with TorchDistributor's."""

    def __init__(self, spark, data, args):
        self.spark, self.data, self.args = spark, data, args
        self.fit_seconds, self.model_init_seconds = [], []

    def start(self) -> float:
        """The data into Spark (as the example's ``as_minibatch_rdd``) and the trainer; its seconds."""
        from mnist_example import as_minibatch_rdd

        import torch_mnist
        from sparkavg.spark import ParameterAveraging, SparkTrainer

        (x, y), (xt, yt) = self.data
        t = time.perf_counter()
        sc = self.spark.sparkContext
        self.rdd, self.test = as_minibatch_rdd(sc, x, y, 2), as_minibatch_rdd(sc, xt, yt, 2)
        self.master = ParameterAveraging(batch_size_per_worker=self.args.batch_size, workers=2, seed=self.args.seed)
        self.model = torch_mnist.build(seed=self.args.seed)
        self.trainer = SparkTrainer(self.spark, self.model, self.master)
        self.setup_seconds = time.perf_counter() - t
        return self.setup_seconds

    def epoch(self, epoch: int) -> float:
        """One fit of one epoch (minibatching the data once, in the first), its validation included."""
        before = self.trainer.stats.overhead_breakdown().get("model_init", 0.0)
        t = time.perf_counter()
        self.trainer.fit(self.rdd, epochs=1, validation_data=self.test)
        self.fit_seconds.append(time.perf_counter() - t)
        # the workers' seconds building or loading the model: high where Spark forked fresh Python workers
        self.model_init_seconds.append(self.trainer.stats.overhead_breakdown().get("model_init", 0.0) - before)
        return self.fit_seconds[-1]

    def finish(self) -> dict:
        t = time.perf_counter()
        self.trainer.close()
        close = time.perf_counter() - t
        self.rdd.unpersist()
        self.test.unpersist()
        h = self.trainer.history
        run = {"master": self.master.to_config(), "accuracy": [e["accuracy"] for e in h],
               "epoch_seconds": [e["seconds"] for e in h], "fit_seconds": self.fit_seconds,
               "model_init_seconds": self.model_init_seconds,
               "setup_seconds": self.setup_seconds,
               "averaging_frequency": [e.get("averaging_frequency") for e in h],
               "rates": [self.model.updater.rate(0, e) for e in range(len(h))]}
        return _throughput(run, len(self.data[0][0]), self.setup_seconds + sum(self.fit_seconds) + close)


def _distributor_turns(data, args):
    """The same module, loss, optimizer and scheduler under TorchDistributor (DDP, gloo, 2 x 1 thread),
    its epochs in turns (``bench_torch.DistributorTurns``)."""
    from bench_torch import DistributorTurns

    import torch_mnist

    recipe = _ddp_recipe(torch_mnist.build(seed=args.seed))
    turns = DistributorTurns(2, args.data_dir, args.recipe_limit_train, args.recipe_epochs, args.batch_size,
                             args.seed, recipe)
    turns.recipe = recipe
    return turns


def _spark_runs(spark, data, args, names) -> dict:
    """``averaging`` and ``distributor`` (either or both): each started alone, then their epochs in
    turns, averaging's first in every epoch: Spark ends a Python worker idle for a minute
    (PythonWorkerFactory), so two TorchDistributor epochs in a row would send averaging's next
    epoch to fresh workers (torch imported, the model built again), which no continuous fit does."""
    runs = {}
    if "distributor" in names:
        runs["distributor"] = _distributor_turns(data, args)
    if "averaging" in names:
        runs["averaging"] = _Averaging(spark, data, args)
    turns = {name: {"start_seconds": None, "turn_seconds": [], "load_average_1min": []} for name in runs}
    for name, run in runs.items():
        turns[name]["start_seconds"] = run.start()
    for epoch in range(args.recipe_epochs):
        for name in [name for name in ("averaging", "distributor") if name in runs]:
            before = _machine()["load_average_1min"]
            turns[name]["turn_seconds"].append(runs[name].epoch(epoch))
            turns[name]["load_average_1min"].append([before, _machine()["load_average_1min"]])
            logging.info("recipe, %s epoch %d: %.1f s", name, epoch + 1, turns[name]["turn_seconds"][-1])
    out = {}
    for name, run in runs.items():
        out[name] = run.finish()
        if name == "distributor":
            assert out[name]["examples"] == len(data[0][0]), (out[name]["examples"], len(data[0][0]))
            out[name] = _throughput(out[name], out[name]["examples"], out[name]["wall_seconds_with_startup"])
            out[name]["recipe"] = run.recipe
        out[name].update(turns[name])
    return out


def adadelta(data, args) -> dict:
    from mnist_example import spark_session

    (x, y), (xt, yt) = data
    out = {"examples": int(len(x)), "test_examples": int(len(xt)), "epochs": args.recipe_epochs,
           "batch_size_per_worker": args.batch_size, "runs": args.recipe_runs}
    for name, batch in (("one_process", 2 * args.batch_size), ("one_process_worker_batch", args.batch_size)):
        if name in args.recipe_runs:
            before = _machine()["load_average_1min"]
            out[name] = _one_process(data, args, batch)
            out[name]["load_average_1min"] = [before, _machine()["load_average_1min"]]
    names = [n for n in args.recipe_runs if n in ("averaging", "distributor")]
    if names:
        spark = spark_session("local[2]", "bench-torch-optim")  # its start is in neither Spark run's time
        try:
            spark.sparkContext.addPyFile(os.path.join(EXAMPLES, "torch_mnist.py"))
            out.update(_spark_runs(spark, data, args, names))
        finally:
            spark.stop()
    last = {name: out[name]["accuracy"][-1] for name in args.recipe_runs}
    verdict = {}
    if "averaging" in last:
        if "one_process" in last:
            out["gap_points"] = 100 * (last["averaging"] - last["one_process"])
            verdict["averaging_within_0.5_of_one_process"] = abs(out["gap_points"]) <= 0.5
        if "one_process_worker_batch" in last:
            out["gap_points_worker_batch"] = 100 * (last["averaging"] - last["one_process_worker_batch"])
            verdict["averaging_within_0.5_of_one_process_worker_batch"] = abs(out["gap_points_worker_batch"]) <= 0.5
        if "distributor" in last:
            avg, ddp = out["averaging"], out["distributor"]
            out["vs_torch_distributor"] = avg["examples_per_second"] / ddp["examples_per_second"]
            out["vs_torch_distributor_with_startup"] = (avg["examples_per_second_with_startup"]
                                                        / ddp["examples_per_second_with_startup"])
            out["vs_torch_distributor_per_epoch"] = [d / a for a, d in zip(avg["epoch_seconds"],
                                                                            ddp["epoch_seconds"])]
            verdict["vs_torch_distributor_ge_1.0"] = out["vs_torch_distributor"] >= 1.0
            verdict["vs_torch_distributor_with_startup_ge_1.0"] = out["vs_torch_distributor_with_startup"] >= 1.0
    for name in ("distributor", "one_process_worker_batch"):
        if name in last and "one_process" in last:
            out[f"{name}_gap_points"] = 100 * (last[name] - last["one_process"])
    out["verdict"] = verdict
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
    p.add_argument("--recipe-runs", default=",".join(RECIPE_RUNS),
                   help=f"adadelta's runs, comma-separated, in the order they run: a subset of {RECIPE_RUNS}")
    p.add_argument("--seed", type=int, default=123)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    args.recipe_runs = subset(p, args.recipe_runs, RECIPE_RUNS, "recipe runs")
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
