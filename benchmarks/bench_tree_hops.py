"""The sums of ``Topology.TREE`` on 127.0.0.1: what an iteration costs beyond
the step, and the CPU of the hops (issue 38).

``W`` ranks, each a spawned process with its own UDP endpoint (as executors
are), run the executors' loop at ``staleness=0`` for ``--iterations``
iterations after ``--warmup``: wait for the last iteration's total and apply
it (:func:`sparkavg.sharing.apply_totals`), the step, then
:func:`sparkavg.sharing.tree_step` (encode at the group's τ, publish) and a
poll.  The step is a sleep of ``--step-ms`` (a full core's LeNet step is
about 7 ms), so that the ranks' steps do not take the machine's few cores
from the sums: what is measured is the sums' latency and CPU.  Every
rank's update puts about ``--entries`` entries over τ (about a 4 KB
message for LeNet's 431,080 parameters, as measured on simulated hosts).

Per world size: ``extra_ms``, the median over iterations of the slowest
rank's iteration beyond the step (the critical path: encode, send, the
sums' hops, the wait, apply); ``cpu_ms_per_iteration`` the median rank's
CPU per iteration (every thread: the I/O thread's authentication too; ``main_thread_cpu_ms``
the training thread's alone),
with ``cpu_ms_by_role`` apart by role (recursive doubling: ``core`` ranks
exchange and merge, ``extra`` ones only publish and apply; the binary tree
before it: ``leaf``, ``relay``, ``root``); ``merge_ms`` the merging ranks'
main-thread CPU in ``merge`` per iteration; and what the endpoint counts
(datagrams, bytes) per rank and iteration.

``--baseline REF`` runs the same worlds first with the library of git
commit ``REF`` (its ``sparkavg/`` from ``git archive``, with this tree's
compiled ``sparkavg_ext``), in the same run::

    python benchmarks/bench_tree_hops.py --worlds 2 4 8 --baseline 03bfb58 --out benchmarks/results/tree_hops.json
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CTX = multiprocessing.get_context("spawn")
WAIT = 120.0
KEY = b"k" * 32


def _updates(rank: int, n: int, entries: int, tau: float, count: int):
    """``count`` update vectors of ``rank``: ``entries`` random indices at ±1.25 τ, the rest zero."""
    import numpy as np

    rng = np.random.default_rng(1000 + rank)
    out = []
    for _ in range(count):
        u = np.zeros(n, np.float32)
        idx = rng.choice(n, entries, replace=False)
        u[idx] = np.where(rng.random(entries) < 0.5, -1.25, 1.25).astype(np.float32) * np.float32(tau)
        out.append(u)
    return out


def _rank(root, rank, world, n, entries, iterations, warmup, step_s, entry_q, table_q, result_q, barrier):
    sys.path.insert(0, root)
    try:
        import numpy as np

        from sparkavg.sharing import FixedThreshold, SharingState, apply_totals, merge_payloads, tree_step
        from sparkavg.sharing.order import InOrder
        from sparkavg.transport import ReliableEndpoint, TreeGroup, prompt_io_thread
        from sparkavg.transport.group import wait_for_peers

        tau = 0.01
        endpoint = ReliableEndpoint(rank, KEY, 38, limits={"stall_timeout": WAIT})
        entry_q.put((rank, endpoint.address))
        endpoint.set_peers(table_q.get(timeout=WAIT))
        group = TreeGroup(rank, world, endpoint, lambda parts: merge_payloads(parts, n))
        state = SharingState(FixedThreshold(tau), n)
        params = np.zeros(n, np.float32)
        updates = _updates(rank, n, entries, tau, 8)
        ordered = InOrder()

        def receive(timeout):
            ordered.add(group.poll(timeout, numbered=True))

        extra, cpu, main_cpu, before = [], [], [], None
        barrier.wait(WAIT)
        total = warmup + iterations
        with prompt_io_thread():  # as the executors run it
            for k in range(total):
                began, began_cpu, began_main = time.perf_counter(), time.process_time(), time.thread_time()
                if k:
                    wait_for_peers(group, receive, k, WAIT)
                    apply_totals(state, ordered.take(k), params, world)
                asleep = time.perf_counter()
                time.sleep(step_s)
                slept = time.perf_counter()
                tree_step(state, updates[k % len(updates)], group.publish)
                receive(0)
                ended = time.perf_counter()
                if k == warmup:
                    before = (endpoint.stats(), group.merge_seconds)
                if k >= warmup:
                    extra.append((ended - began) - (slept - asleep))  # the step's own time, as slept
                    cpu.append(time.process_time() - began_cpu)
                    main_cpu.append(time.thread_time() - began_main)
        after = (endpoint.stats(), group.merge_seconds)
        group.finish(WAIT)
        group.leave(WAIT)
        endpoint.close()
        counts = {k: (after[0][k] - before[0][k]) / iterations
                  for k in ("datagrams_sent", "datagrams_received", "wire_bytes_sent", "wire_bytes_received",
                            "datagrams_retransmitted")}
        if hasattr(group, "children"):  # the binary tree (before issue 38's recursive doubling)
            role = "leaf" if not group.children else ("root" if rank == 0 else "relay")
        else:
            role = "extra" if group.extra else "core"
        result_q.put((rank, {"extra": extra, "cpu": cpu, "main_cpu": main_cpu, "role": role, "counts": counts,
                             "merge_s": (after[1] - before[1]) / iterations,
                             "messages_received": state.messages_received}))
    except BaseException as exc:  # report, never hang the parent
        import traceback

        result_q.put((rank, traceback.format_exc() + repr(exc)))


def run_world(root, world, n, entries, iterations, warmup, step_s) -> dict:
    entry_q, result_q = CTX.Queue(), CTX.Queue()
    table_qs = [CTX.Queue() for _ in range(world)]
    barrier = CTX.Barrier(world)
    procs = [CTX.Process(target=_rank, args=(root, r, world, n, entries, iterations, warmup, step_s, entry_q,
                                             table_qs[r], result_q, barrier), daemon=True) for r in range(world)]
    for p in procs:
        p.start()
    table = dict(entry_q.get(timeout=WAIT) for _ in range(world))
    for q in table_qs:
        q.put(table)
    reports = dict(result_q.get(timeout=WAIT * 4) for _ in range(world))
    for p in procs:
        p.join(WAIT)
    failed = {r: v for r, v in reports.items() if isinstance(v, str)}
    if failed:
        raise RuntimeError(f"ranks failed: {failed}")
    slowest = [max(reports[r]["extra"][i] for r in reports) for i in range(iterations)]
    per_rank_cpu = {r: statistics.median(v["cpu"]) for r, v in reports.items()}
    roles = {}
    for r, v in reports.items():
        roles.setdefault(v["role"], []).append(per_rank_cpu[r])
    relays = [v["merge_s"] for v in reports.values() if v["role"] != "leaf"]
    ms = lambda s: round(s * 1e3, 4)  # noqa: E731
    return {"extra_ms": ms(statistics.median(slowest)), "extra_ms_p90": ms(sorted(slowest)[int(0.9 * len(slowest))]),
            "cpu_ms_per_iteration": ms(statistics.median(per_rank_cpu.values())),
            "cpu_ms_by_role": {k: ms(statistics.median(v)) for k, v in sorted(roles.items())},
            "main_thread_cpu_ms": ms(statistics.median(statistics.median(v["main_cpu"]) for v in reports.values())),
            "merge_ms": ms(statistics.median(relays)) if relays else 0.0,
            "per_rank_iteration": {k: round(statistics.median(v["counts"][k] for v in reports.values()), 2)
                                   for k in next(iter(reports.values()))["counts"]},
            "totals_applied_per_iteration": round(statistics.median(v["messages_received"] for v in reports.values())
                                                  / (iterations + warmup), 3)}


def main(argv=None) -> dict:
    sys.path.insert(0, ROOT)
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    from report import commit, emit, library_at

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worlds", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--iterations", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--step-ms", type=float, default=7.0)
    ap.add_argument("--entries", type=int, default=1000, help="entries over τ per rank and iteration")
    ap.add_argument("--params", type=int, default=431080, help="N (LeNet's)")
    ap.add_argument("--baseline", default=None, help="a git commit whose library runs the same worlds first")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    report = {"benchmark": "tree_hops", "commit": commit(), "machine": {
        "cpus": os.cpu_count(), "python": platform.python_version(), "load_before": list(os.getloadavg())},
        "params": args.params, "entries": args.entries, "step_ms": args.step_ms, "iterations": args.iterations,
        "warmup": args.warmup}
    runs = [("this", ROOT)]
    tmp = None
    if args.baseline:
        tmp = tempfile.mkdtemp(prefix="tree_hops_")
        runs.insert(0, ("baseline", library_at(args.baseline, tmp)))
        report["baseline_commit"] = commit(args.baseline)
    try:
        for label, root in runs:
            report[label] = {f"w{w}": run_world(root, w, args.params, args.entries, args.iterations, args.warmup,
                                                args.step_ms / 1e3) for w in args.worlds}
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    report["machine"]["load_after"] = list(os.getloadavg())
    return emit(report, args.out)


if __name__ == "__main__":
    main()
