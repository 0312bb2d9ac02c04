#!/usr/bin/env python
"""What gradient sharing's local view (the default preset's
:class:`~sparkavg.spark.policies.sharing.LocalView`) adds to a sharing step, against the
step itself, same process, one thread (issue 22).

Times, on the example's LeNet (0.43 M parameters, batch 32) and optionally
the ResNet of ``examples/mnist_resnet.py``:

``step``         ``compute_update`` of one minibatch (the work every step does);
``view``         :func:`sparkavg.sharing.local_view` -- ``out = shared + residual``,
                 one pass (what the executors run);
``three_passes`` the first implementation, for reference: save the parameters,
                 add the residual, restore them (two copies and one addition);
``copy``         ``np.copyto`` of the parameter vector (the memory-copy baseline).

Medians of ``--repeats`` alternating trials.  Prints JSON (and writes it with --out)::

    python benchmarks/bench_view.py --models lenet,resnet --out benchmarks/results/view_cost.json
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

from report import emit

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def measure(model: str, repeats: int, seed: int) -> dict:
    from bench_parity import build

    from sparkavg import ops
    from sparkavg.data.mnist import default_data_dir, load_mnist
    from sparkavg.sharing import FixedThreshold, SharingState, local_view

    net = build(model, seed)
    n = net.num_params
    x, y = load_mnist(default_data_dir(), "train", limit=32)
    rng = np.random.default_rng(seed)
    state = SharingState(FixedThreshold(1e-2), n)
    state.clip = None
    state.residual[:] = rng.uniform(-1e-2, 1e-2, n).astype(np.float32)
    shared, scratch, update = net.params.copy(), np.empty(n, np.float32), np.zeros(n, np.float32)
    params = net.params

    def three_passes():
        scratch[...] = params
        ops.accumulate(params, state.residual)
        params[...] = scratch

    cases = {
        "step": lambda: net.compute_update(x, y, update),
        "view": lambda: local_view(state, shared, params),
        "three_passes": three_passes,
        "copy": lambda: np.copyto(scratch, params),
    }
    for fn in cases.values():  # warm-up
        for _ in range(5):
            fn()
    times = {k: [] for k in cases}
    for _ in range(repeats):
        for k, fn in cases.items():
            times[k].append(_timed(fn))
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"model": model, "num_params": n, "median_seconds": med,
            "view_over_step": med["view"] / med["step"], "three_passes_over_step": med["three_passes"] / med["step"],
            "view_over_copy": med["view"] / med["copy"]}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="lenet")
    p.add_argument("--repeats", type=int, default=200)
    p.add_argument("--seed", type=int, default=123)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    from sparkavg.threads import set_threads

    set_threads(1)
    result = {"benchmark": "view", "threads": 1, "repeats": args.repeats,
              "load_average_1min_before": os.getloadavg()[0],
              "models": [measure(m, args.repeats, args.seed) for m in args.models.split(",")]}
    result["load_average_1min_after"] = os.getloadavg()[0]
    return emit(result, args.out)


if __name__ == "__main__":
    main()
