"""One round of the TCP all-reduce (:class:`sparkavg.transport.CollectiveGroup`)
on 127.0.0.1, against the local work it replaces.

Vectors (float32), their sizes read from the models themselves:

- ``lenet``: :func:`sparkavg.nn.zoo.lenet`'s parameters, and ``lenet_adam``
  its parameters plus Adam's two slots (3x);
- ``mlp``: DL4J's MnistMLP (784-1000-10, relu, softmax), ``mlp_adam`` with
  Adam's state (3x).

For W = 2 and 4 ranks, each a spawned process (as executors are), the script
connects one group and times ``--rounds`` rounds after ``--warmup``: a
multiprocessing barrier starts each round, each rank times its call, and the
round's time is the slowest rank's.  ``round_ms`` is the median (``best_ms``
the fastest); ``payload_gbps`` is the vector bytes one rank sends,
``2 (W - 1) / W * n * 4``, over the median; ``cpu_ms_per_rank`` the median
CPU time of one rank's round, all its threads (what a loaded machine's
wall times hide); ``connect_cpu_ms_per_rank`` the median CPU time of one
rank's ``connect`` (its ``W - 1`` connections, key agreements and
handshakes).  ``lenet_round`` is what an in-stage round of LeNet + Adam
sums at the defaults (params, two moments, the first moment's square).
With ``--worlds 2 4 8 16`` the per-peer CPU costs of a round and of the
mesh's connection are the slopes over ``W - 1`` (cost_model.py's
``peer_s`` and ``connect_s`` at full speed, measured directly).

Baselines on this machine, in the same run: ``copy_ms``, one ``np.copyto`` of
the vector (the memory rate), and ``accumulate_chain_ms``, the driver's
local reduce of W results (``W - 1`` :func:`sparkavg.ops.accumulate` of the
whole vector, one :func:`sparkavg.ops.scale`), the best of ``--repeats``.

Prints one JSON document (and writes it to ``--out``)::

    python benchmarks/bench_allreduce.py [--rounds 20] [--warmup 3] [--worlds 2 4] [--vectors ...] [--out PATH]
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import platform
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from sparkavg import ops  # noqa: E402
from sparkavg.transport import CollectiveGroup, KeyAgreement  # noqa: E402

from report import emit  # noqa: E402

CTX = multiprocessing.get_context("spawn")
WAIT = 120.0


def model_sizes() -> dict:
    """``{name: float32 elements}`` of the benchmarked vectors."""
    from sparkavg.nn import Dense, Network, Output
    from sparkavg.nn.zoo import lenet

    sizes = {}
    for name, net in (("lenet", lenet()),
                      ("mlp", Network((1, 28, 28), [Dense(1000, activation="relu"), Output(10)], seed=1))):
        sizes[name] = int(net.state["params"].size)
        sizes[f"{name}_adam"] = int(net.state["params"].size + net.state["updater"].size)
    # what an in-stage round of LeNet + Adam sums at the defaults: params, the two moments, the first's square
    sizes["lenet_round"] = 4 * sizes["lenet"]
    return sizes


def _rank(rank, world, sizes, rounds, warmup, entry_q, table_q, result_q, barrier):
    group = CollectiveGroup(KeyAgreement(rank, 1), world, host="127.0.0.1", stall_timeout=WAIT)
    try:
        entry_q.put(group.entry())
        table = table_q.get(timeout=WAIT)
        began_cpu = time.process_time()
        group.connect(table)
        times, cpu = {"connect": []}, {"connect": [time.process_time() - began_cpu]}  # every thread of the rank
        rng = np.random.default_rng(rank)
        for name, n in sizes.items():
            vector = rng.standard_normal(n).astype(np.float32)
            times[name], cpu[name] = [], []
            for r in range(warmup + rounds):
                barrier.wait(WAIT)
                began, began_cpu = time.perf_counter(), time.process_time()
                group.allreduce_weighted(vector, 100.0 + rank)
                if r >= warmup:
                    times[name].append(time.perf_counter() - began)
                    cpu[name].append(time.process_time() - began_cpu)  # every thread of the rank
        result_q.put((rank, times, cpu))
    except BaseException as exc:  # report, do not hang the parent
        result_q.put((rank, repr(exc), None))
    finally:
        group.close()


def run_world(world, sizes, rounds, warmup) -> dict:
    entry_q, result_q = CTX.Queue(), CTX.Queue()
    table_qs = [CTX.Queue() for _ in range(world)]
    barrier = CTX.Barrier(world)
    procs = [CTX.Process(target=_rank, args=(r, world, sizes, rounds, warmup, entry_q, table_qs[r], result_q,
                                             barrier), daemon=True) for r in range(world)]
    for p in procs:
        p.start()
    table = [entry_q.get(timeout=WAIT) for _ in range(world)]
    for q in table_qs:
        q.put(table)
    reports = [result_q.get(timeout=WAIT * len(sizes)) for _ in range(world)]
    for p in procs:
        p.join(WAIT)
    failed = [(r, t) for r, t, _ in reports if isinstance(t, str)]
    if failed:
        raise RuntimeError(f"ranks failed: {failed}")
    out = {"connect_cpu_ms_per_rank": round(1e3 * statistics.median(c["connect"][0] for _, _, c in reports), 3),
           "connect_cpu_ms_max_rank": round(1e3 * max(c["connect"][0] for _, _, c in reports), 3)}
    for name, n in sizes.items():
        per_round = [max(times[name][i] for _, times, _ in reports) for i in range(rounds)]
        median = statistics.median(per_round)
        sent = 2 * (world - 1) / world * n * 4
        cpu = statistics.median(statistics.median(c[name]) for _, _, c in reports)
        out[name] = {"elements": n, "round_ms": round(median * 1e3, 3), "best_ms": round(min(per_round) * 1e3, 3),
                     "cpu_ms_per_rank": round(cpu * 1e3, 3), "payload_bytes_per_rank": int(sent),
                     "payload_gbps": round(sent / median / 1e9, 3)}
    return out


def best_of(fn, repeats) -> float:
    best = float("inf")
    for _ in range(repeats):
        began = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - began)
    return best


def baselines(sizes, worlds, repeats) -> dict:
    out = {}
    rng = np.random.default_rng(0)
    for name, n in sizes.items():
        src, dst = rng.standard_normal(n).astype(np.float32), np.empty(n, np.float32)
        row = {"copy_ms": round(best_of(lambda: np.copyto(dst, src), repeats) * 1e3, 3)}
        for world in worlds:
            parts = [rng.standard_normal(n).astype(np.float32) for _ in range(world)]

            def chain():
                acc = parts[0]
                for p in parts[1:]:
                    ops.accumulate(acc, p)
                ops.scale(acc, 1.0 / world)

            row[f"accumulate_chain_ms_w{world}"] = round(best_of(chain, repeats) * 1e3, 3)
        out[name] = row
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--worlds", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--vectors", nargs="+", default=None, help="a subset of the vectors (default: all)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    sizes = model_sizes()
    if args.vectors:
        sizes = {name: sizes[name] for name in args.vectors}
    report = {"benchmark": "allreduce", "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                                                    "load_1min": os.getloadavg()[0]},
              "collective": "halving",  # the all-reduce measured (before issue 37's halving: "mesh")
              "rounds": args.rounds, "warmup": args.warmup, "baseline": baselines(sizes, args.worlds, args.repeats)}
    for world in args.worlds:
        report[f"w{world}"] = run_world(world, sizes, args.rounds, args.warmup)
    report["machine"]["load_1min_after"] = os.getloadavg()[0]
    return emit(report, args.out)


if __name__ == "__main__":
    main()
