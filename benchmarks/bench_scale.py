#!/usr/bin/env python
"""Past three hosts (issue 26): both masters on 2, 4 and 8 simulated hosts,
a straggler, and the numbers the cost model (benchmarks/cost_model.py) is
calibrated from.

Hosts are :class:`tests.harness.SimulatedCluster` (each its own network
and mount namespace, 1 Spark core).  On a 2-core machine 8 hosts share 2
cores, so a host's speed is made well defined with a CPU quota: every
worker host's processes together (Worker, executor JVM, Python workers)
get ``--cpu`` cores (default 0.2: 8 hosts = 1.6 cores, the rest left to
the driver host, which is not limited) through a cpu cgroup per host.
"Half speed" is a quota of half that (``--cpu / 2``) on the last worker
host; it is set just before a fit starts and lifted after it (the JVMs
start at full speed).

Per run one cluster of ``--hosts`` hosts and one driver program fit LeNet
on the first ``--limit-train`` Fashion-MNIST examples (read by the
executors from the IDX files, as from a distributed store), batch 32 per
worker, ``--epochs`` epochs, then test on the 10k test set:

* ``scale`` runs: parameter averaging at its defaults (frequency "auto",
  the ``"sparkavg"`` preset, Spark blocks), gradient sharing with ``PLAIN``
  and ``TREE`` (``AdaptiveThreshold(1e-2)``; MESH until issue 38 removed it);
  ``topologies`` the sharing fits alone;
* ``straggler`` runs: averaging with no slow host, with one at half speed
  under the ``"dl4j"`` preset (equal shares: no tolerance; frequency still
  "auto"), and with one at half speed under the default preset (shares by
  measured speed); gradient sharing (PLAIN) with no slow host and with one
  at half speed;
* ``instage`` runs: averaging at its defaults with an epoch's rounds inside
  one barrier stage (the all-reduce between executors) and with a Spark
  job per round, each path forced through the tests' hook
  ``sparkavg.test.averaging_path`` (issue 37; the cost model's in-stage
  term is calibrated from these).

Bytes per rank on the wire come from each host's ``eth0`` kernel counters
(``/sys/class/net/eth0/statistics``, read around each fit; UDP apart from
the rest, Spark's TCP, by bench_cluster's counting qdisc), beside
sparkavg's own ``bytes_sent`` (sharing) and the state a round ships
(averaging: state out and weighted state back per worker per round).

Needs root.  Prints JSON (``--out`` writes it)::

    python benchmarks/bench_scale.py --hosts 8 --runs scale --out benchmarks/results/scale_h8.json
    python benchmarks/bench_scale.py --hosts 8 --runs straggler --out benchmarks/results/straggler_h8.json
    python benchmarks/bench_scale.py --hosts 8 --runs instage --rate 1gbit --limit-test 2000 --out benchmarks/results/scale_instage_h8.json
"""
from __future__ import annotations

import argparse
import json
import math
import os
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(1, REPO)  # tests.harness

from report import emit  # noqa: E402

BATCH = 32
PROBE_ROUNDS = 2  # sparkavg.spark.runners.averaging.PROBE_ROUNDS
SEED = 123
THRESHOLD = 1e-2

RUNS = {
    "scale": [{"name": "averaging", "master": "averaging"},
              {"name": "sharing_plain", "master": "sharing", "topology": "plain"},
              {"name": "sharing_tree", "master": "sharing", "topology": "tree"}],
    # issue 38: the topologies of sharing side by side (no averaging; MESH, measured then, is gone)
    "topologies": [{"name": "sharing_plain", "master": "sharing", "topology": "plain"},
                   {"name": "sharing_tree", "master": "sharing", "topology": "tree"}],
    "straggler": [{"name": "averaging_even", "master": "averaging"},
                  {"name": "averaging_slow_dl4j", "master": "averaging", "slow": True, "preset": "dl4j"},
                  {"name": "averaging_slow_auto", "master": "averaging", "slow": True, "preset": "sparkavg"},
                  {"name": "sharing_even", "master": "sharing", "topology": "plain"},
                  {"name": "sharing_slow", "master": "sharing", "topology": "plain", "slow": True}],
    # the must's two fits only (issue 26: with tolerance <= 1.2x the no-straggler epoch)
    "straggler_auto": [{"name": "averaging_even", "master": "averaging"},
                       {"name": "averaging_slow_auto", "master": "averaging", "slow": True, "preset": "sparkavg"}],
    # issue 37: averaging at its defaults with the rounds inside one barrier stage, and the same fit with a
    # Spark job per round (each path forced through the tests' hook, whatever the path decision says)
    "instage": [{"name": "in_stage", "master": "averaging", "path": "in_stage"},
                {"name": "jobs", "master": "averaging", "path": "jobs"}],
}


def driver_timeline(stats) -> list:
    """Per epoch, the driver's spans (phase, start after the epoch's start, seconds): where an
    epoch's time outside its rounds goes (the plan and deal, the stage's launch, its result)."""
    from sparkavg.stats import DRIVER_LANE

    out = []
    for ep in (e for e in stats.events if e.lane == DRIVER_LANE and e.phase == "epoch"):
        out.append({"epoch": ep.epoch, "seconds": round(ep.duration, 4), "spans": [
            [str(e.phase), e.round, round(e.start - ep.start, 4), round(e.duration, 4)] for e in stats.events
            if e.lane == DRIVER_LANE and e.epoch == ep.epoch and e.phase != "epoch"]})
    return out


def round_timeline(stats) -> list:
    """Per driver round (epoch, round): its span, the driver's broadcast and
    merge, and per worker task its start and end after the round began
    (seconds) and its fetch / model_init / data_load / fit seconds -- where a
    round's time goes (who it waits for, and on what)."""
    rounds = [e for e in stats.events if e.phase == "round"]
    out = []
    for rd in rounds:
        tasks = [t for t in stats.tasks if t.epoch == rd.epoch and t.round == rd.round]
        phases, fitted = {}, {}
        for e in stats.events:
            if e.epoch == rd.epoch and e.round == rd.round:
                by = phases.setdefault(e.lane, {})
                by[e.phase] = by.get(e.phase, 0.0) + e.duration
                fitted[e.lane] = fitted.get(e.lane, 0) + (e.phase == "fit")
        out.append({"epoch": rd.epoch, "round": rd.round, "seconds": rd.duration,
                    "driver": {k: round(v, 4) for k, v in phases.get("driver", {}).items()},
                    "tasks": [{"lane": t.lane, "start": round(t.start - rd.start, 4), "end": round(t.end - rd.start, 4),
                               "minibatches": fitted.get(t.lane, 0),
                               **{k: round(v, 4) for k, v in phases.get(t.lane, {}).items()}}
                              for t in sorted(tasks, key=lambda t: t.lane)]})
    return out


#: Steps of each rank's epoch that step_spread counts as its start, not its steady spread.
STEP_WARMUP = 32


def exchange_chain(stats, exchanges: int) -> dict:
    """Gradient sharing's waits, told apart.  A rank waits (phase ``wait``)
    from publishing iteration ``k``'s message until it holds what it
    applies before step ``k + 1``; the rank that published last waits only
    for the exchanges after it (its partners' parts are ready: theirs hold
    only earlier ranks'), so its wait is the chain of ``exchanges``
    exchanges alone (``chain_s``; per exchange ``hop_s``), and the rest of
    the mean wait (``lockstep_s``) is waiting for the slower ranks' steps.
    Per epoch, not per iteration: a rank's first wait (its peers' addresses
    come from the meeting while it trains its first step), and its last two
    (``finish``, ``leave``): ``epoch_waits_s``, per rank and epoch.  From
    the last epoch; its ``i``-th loop wait of every rank is iteration
    ``i``; the lanes' clocks are the simulated hosts' one kernel clock."""
    from sparkavg.stats import DRIVER_LANE

    last = max((e.epoch for e in stats.events if e.epoch is not None), default=None)
    lanes: dict = {}
    for e in stats.events:
        if e.phase == "wait" and e.epoch == last and e.lane != DRIVER_LANE:
            lanes.setdefault(e.lane, []).append(e)
    ordered = [sorted(v, key=lambda e: e.start) for v in lanes.values()]
    waits = [w[1:-2] for w in ordered]
    n = min((len(w) for w in waits), default=0)
    if len(waits) < 2 or n == 0:
        return {}
    chains, means = [], []
    for i in range(n):
        row = [w[i] for w in waits]
        chains.append(max(row, key=lambda e: e.start).duration)
        means.append(sum(e.duration for e in row) / len(row))
    chain, mean = sum(chains) / n, sum(means) / n
    epoch_waits = sum(w[0].duration + w[-1].duration + w[-2].duration for w in ordered) / len(ordered)
    return {"iterations": n, "loop_wait_s": mean, "chain_s": chain, "lockstep_s": mean - chain,
            "exchanges": exchanges, "hop_s": chain / max(exchanges, 1), "epoch_waits_s": epoch_waits}


def step_spread(stats, draws: int = 20000, seed: int = 0, warmup: int = STEP_WARMUP) -> dict:
    """The spread of the ranks' steps (phase ``fit``) in the last epoch, and
    what a lock step over ``W`` ranks would wait for if every rank drew its
    steps from that spread independently: the mean of ``max - mean`` over
    ``W`` draws (``wait_at``, of the steps after each rank's first
    ``warmup`` of the epoch: the steady steps; ``wait_at_all``, of every
    step), for the cost model's doubling rule to be held against.  The
    epoch's first steps share the core with its start (the minibatch
    prefetch filling up, the peers' meeting and keys in a thread): their
    cost is the epoch's, paid once, not a spread the ranks draw from every
    iteration.  The slowest steps (above the 99th percentile of all):
    their iterations, and how many overlapped another rank's slow step in
    time (a cause the hosts share, such as this machine's cores).
    Milliseconds."""
    import numpy as np
    from sparkavg.stats import DRIVER_LANE

    last = max((e.epoch for e in stats.events if e.epoch is not None), default=None)
    by_lane: dict = {}
    for e in stats.events:
        if e.phase == "fit" and e.epoch == last and e.lane != DRIVER_LANE:
            by_lane.setdefault(e.lane, []).append(e)
    ordered = {lane: sorted(es, key=lambda e: e.start) for lane, es in by_lane.items()}
    steps = np.array([e.duration for es in ordered.values() for e in es]) * 1e3
    steady = np.array([e.duration for es in ordered.values() for e in es[warmup:]]) * 1e3
    if steady.size < 10:
        return {}
    rng = np.random.default_rng(seed)

    def wait(sample, w: int) -> float:
        s = sample[rng.integers(0, sample.size, (draws, w))]
        return float((s.max(axis=1) - s.mean(axis=1)).mean())
    cut = np.percentile(steps, 99) / 1e3
    slow = [(lane, i, e) for lane, es in ordered.items() for i, e in enumerate(es) if e.duration > cut]
    shared = sum(any(other != lane and e.start < o.end and o.start < e.end for other, _, o in slow)
                 for lane, _, e in slow)
    widths = (2, 4, 8, 16, 32, 64, 128, 256)
    return {"steps": int(steps.size), "mean_ms": float(steps.mean()), "warmup": warmup,
            "steady_mean_ms": float(steady.mean()),
            **{f"p{q}_ms": float(np.percentile(steps, q)) for q in (50, 95, 99)}, "max_ms": float(steps.max()),
            "steady_p99_ms": float(np.percentile(steady, 99)),
            "slow_steps": len(slow), "slow_overlapping_another_ranks": shared,
            "slow_iterations": sorted(i for _, i, _ in slow),
            "wait_at": {w: wait(steady, w) for w in widths}, "wait_at_all": {w: wait(steps, w) for w in widths}}


# -- the driver program (inside the cluster's driver host) -----------------------------------

def job(args) -> None:
    import numpy as np

    from bench_cluster import executor_loaded_rdd, handshake, job_session
    from sparkavg.data.mnist import load_mnist
    from sparkavg.nn.zoo import lenet
    from sparkavg.spark import (AdaptiveThreshold, GradientSharing, ParameterAveraging, SparkTrainer, Topology)
    from sparkavg.averaging.merge import moment_blocks
    from sparkavg.spark.executor.hooks import AVERAGING_PATH
    from cost_model import doubling_exchanges

    spark = job_session(args.conf, "bench-scale")
    hosts = args.hosts
    try:
        xt, yt = load_mnist(args.data_dir, "test", limit=args.limit_test)
        rdd = executor_loaded_rdd(spark.sparkContext, args.data_dir, args.limit_train, slices=hosts)
        for spec in json.loads(args.fits):
            if spec["master"] == "averaging":
                master = ParameterAveraging(batch_size_per_worker=BATCH, workers=hosts, seed=SEED,
                                            preset=spec.get("preset", "sparkavg"))
            else:
                master = GradientSharing(threshold=AdaptiveThreshold(initial=THRESHOLD), batch_size_per_worker=BATCH,
                                         workers=hosts, seed=SEED, network_mask=args.network_mask,
                                         topology=Topology(spec.get("topology", "plain")))
            net = lenet(num_classes=10, seed=SEED)
            trainer = SparkTrainer(spark, net, master)
            handshake({"event": "ready", "spec": spec})
            spark.sparkContext.setLocalProperty(AVERAGING_PATH, spec.get("path"))
            began = time.perf_counter()
            try:
                trainer.fit(rdd, epochs=args.epochs)
            finally:
                spark.sparkContext.setLocalProperty(AVERAGING_PATH, None)
            fit_seconds = time.perf_counter() - began
            trainer.close()
            handshake({"event": "fitted", "spec": spec})  # the benchmark reads the counters, lifts the quota
            out = np.argmax(np.concatenate([net.output(xt[i:i + 1000]) for i in range(0, len(xt), 1000)]), axis=1)
            stats = trainer.stats
            handshake({"event": "done", "spec": spec, "fit_seconds": fit_seconds, "history": [
                    {k: h[k] for k in ("epoch", "seconds", "examples", "rounds", "averaging_frequency",
                                       "averaging_path", "worker_shares", "replica_max_abs_diff") if k in h}
                    for h in trainer.history],
                 "accuracy": float(np.mean(out == yt)),
                 "counters": {k: float(v) for k, v in stats.counters.items()},
                 "phase_totals": stats.phase_totals(), "compute_seconds": stats.compute_seconds,
                 "decisions": [d for d in stats.decisions if d["name"] in ("worker_shares", "averaging_frequency",
                                                                          "deal", "topology", "averaging_path",
                                                                          "moment_correction")],
                 "state_bytes": int(4 * (net.num_params + net.updater_state.size)), "num_params": int(net.num_params),
                 # what a round sums, per worker: params, updater state, buffers and, under the moment
                 # correction, the first moment's sums of squares, one per parameter block (the in-stage
                 # all-reduce's vector)
                 "round_bytes": int(4 * (net.num_params + net.updater_state.size + net.state["buffers"].size
                                         + (len(moment_blocks(net)) if any(d["name"] == "moment_correction"
                                                                           and d["value"] for d in stats.decisions)
                                            else 0))),
                 "lane_hosts": sorted({lane.split("/")[0] for lane in stats.lanes if "/" in lane}),
                 "round_timeline": round_timeline(stats), "driver_timeline": driver_timeline(stats),
                 **({"exchange_chain": exchange_chain(stats, doubling_exchanges(hosts) if spec.get("topology") == "tree"
                                                      else 1),
                     "step_spread": step_spread(stats)} if spec["master"] == "sharing" else {})})
    finally:
        spark.stop()


# -- the benchmark (root namespace) -------------------------------------------------------------

def summarise(done: dict, wire: dict, worker_names) -> dict:
    h = done["history"]
    workers = len(worker_names)
    per_rank = [wire[n]["tx"] + wire[n]["rx"] for n in worker_names]
    c = done["counters"]
    out = {"spec": done["spec"], "epoch_seconds": [e["seconds"] for e in h], "fit_seconds": done["fit_seconds"],
           "examples": [e["examples"] for e in h], "accuracy": done["accuracy"],
           "wire": wire, "wire_bytes_per_rank_mean": sum(per_rank) / workers,
           "wire_bytes_per_rank_max": max(per_rank), "wire_bytes_driver": wire["driver"]["tx"] + wire["driver"]["rx"],
           "decisions": done["decisions"], "lane_hosts": done["lane_hosts"], "state_bytes": done["state_bytes"],
           "num_params": done["num_params"], "round_bytes": done.get("round_bytes"),
           "compute_seconds": done["compute_seconds"],
           "minibatches": c.get("minibatches"),
           "fit_phase": done["phase_totals"].get("fit"), "round_timeline": done.get("round_timeline"),
           "driver_timeline": done.get("driver_timeline")}
    if done["spec"]["master"] == "averaging":
        out["rounds"] = [e.get("rounds") for e in h]
        out["averaging_frequency"] = [e.get("averaging_frequency") for e in h]
        out["averaging_path"] = [e.get("averaging_path") for e in h]
        out["worker_shares"] = [e.get("worker_shares") for e in h]
        # sparkavg's own view: the state shipped out and the weighted state back, per worker per round
        # (the probe rounds before the first epoch included).
        probes = PROBE_ROUNDS if any(d["name"] == "averaging_frequency" for d in done["decisions"]) else 0
        out["sparkavg_bytes_per_rank"] = (sum(e.get("rounds") or 0 for e in h) + probes) * 2 * done["state_bytes"]
        out["wire_other_bytes_per_rank_mean"] = sum(wire[n]["other_tx"] + 0 for n in worker_names) / workers
    else:
        out["sparkavg_bytes_per_rank"] = c.get("bytes_sent", 0.0) / workers  # sent; a rank receives as much
        out["wire_udp_tx_per_rank_mean"] = sum(wire[n]["udp_tx"] for n in worker_names) / workers
        out["wire_udp_tx_per_rank_max"] = max(wire[n]["udp_tx"] for n in worker_names)
        out["sparkavg"] = {k: c.get(k, 0.0) for k in ("bytes_sent", "bytes_received", "datagrams_sent",
                                                        "datagrams_retransmitted", "messages_sent",
                                                        "messages_received", "payload_bytes_sent", "iterations",
                                                        "merge_seconds")}
        out["replica_max_abs_diff"] = max(e.get("replica_max_abs_diff", 0.0) for e in h)
        # per rank and iteration (the counters are summed over the ranks; "iterations" counts rank-iterations)
        its = max(c.get("iterations", 0.0), 1.0)
        phases = done["phase_totals"]
        out["per_rank_iteration"] = {
            "messages_applied": c.get("messages_received", 0.0) / its,
            "bytes_sent": c.get("bytes_sent", 0.0) / its, "bytes_received": c.get("bytes_received", 0.0) / its,
            "payload_bytes_sent": c.get("payload_bytes_sent", 0.0) / its,
            "apply_s": (phases.get("apply") or {}).get("total", 0.0) / its,
            "merge_cpu_s": c.get("merge_seconds", 0.0) / its,
            "wait_s": (phases.get("wait") or {}).get("total", 0.0) / its,
            "encode_s": (phases.get("encode") or {}).get("total", 0.0) / its,
            "send_s": (phases.get("send") or {}).get("total", 0.0) / its}
        out["iterations"] = c.get("iterations", 0.0)
        out["exchange_chain"] = done.get("exchange_chain")
        out["step_spread"] = done.get("step_spread")
    return out


def run(args) -> dict:
    from bench_cluster import _delta, install_counters, read_counters
    from tests.harness import SimulatedCluster
    from tests.harness.driving import drive

    fits = RUNS[args.runs]
    slow_host = f"worker{args.hosts - 1}"
    started = time.monotonic()
    period = int(round(args.cpu_period_ms * 1000))
    result = {"hosts": args.hosts, "cpu_per_host": 1.0 if args.pin else args.cpu, "pinned": bool(args.pin),
              "slow_host": slow_host, "slow_cpu": args.cpu / 2,
              "cpu_period_us": max(period, math.ceil(1000 / args.cpu)), "fits": {}}
    with SimulatedCluster(workers=args.hosts, cores_per_worker=1, memory="1g", rate=args.rate) as cluster:
        install_counters(cluster)
        conf = {**cluster.spark_conf(), "spark.executor.memory": "600m", "spark.ui.enabled": "false",
                "spark.executor.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
                **dict(kv.split("=", 1) for kv in args.spark_conf)}
        argv = [sys.executable, os.path.abspath(__file__), "--job", "--conf", json.dumps(conf), "--data-dir",
                args.data_dir, "--epochs", str(args.epochs), "--limit-test", str(args.limit_test), "--limit-train",
                str(args.limit_train), "--hosts", str(args.hosts), "--network-mask", str(cluster.subnet),
                "--fits", json.dumps(fits)]
        result["cluster_start_seconds"] = time.monotonic() - started
        worker_names = [h.name for h in cluster.hosts]
        seen = {}

        def on_event(event, program):
            spec = event["spec"]
            if event["event"] == "ready":
                cores = sorted(os.sched_getaffinity(0))
                for i, name in enumerate(worker_names):
                    if args.pin:  # a dedicated core per host, no quota
                        cluster.pin_cpu(name, [cores[i % len(cores)]])
                        continue
                    cluster.limit_cpu(name, args.cpu / 2 if spec.get("slow") and name == slow_host else args.cpu,
                                      period)
                seen["before"] = read_counters(cluster)
                seen["cpu_before"] = cluster.cpu_throttling()
                seen["threads_before"] = cluster.thread_cpu()
            elif event["event"] == "fitted":
                seen["wire"] = _delta(read_counters(cluster), seen["before"])
                seen["throttling"] = {name: {k: v - seen["cpu_before"][name][k] for k, v in t.items()}
                                      for name, t in cluster.cpu_throttling().items() if name in worker_names}
                seen["thread_cpu"] = {name: dict(sorted(((k, round(v - seen["threads_before"][name].get(k, 0.0), 3))
                                                         for k, v in t.items()), key=lambda kv: -kv[1])[:12])
                                      for name, t in cluster.thread_cpu().items()}  # the driver host's too
                for name in worker_names:
                    cluster.limit_cpu(name, None)
                    if args.pin:
                        cluster.pin_cpu(name, None)
            elif event["event"] == "done":
                result["fits"][spec["name"]] = {**summarise(event, seen["wire"], worker_names),
                                                "throttling": seen["throttling"], "thread_cpu": seen["thread_cpu"]}
                print(json.dumps({spec["name"]: result["fits"][spec["name"]]["epoch_seconds"]}), file=sys.stderr,
                      flush=True)

        code, _, log = drive(cluster, argv, on_event, cwd=REPO)
        if code != 0 or len(result["fits"]) != len(fits):
            raise RuntimeError(f"the driver program exited with {code}:\n{log[-6000:]}")
        result["worker_ips"] = [h.ip for h in cluster.hosts]
    return result


def markdown(scale_files, straggler_file=None, model_file=None) -> str:
    """The history/cluster.md tables: epoch time and bytes per rank per host count, the straggler, the model."""
    mb = lambda b: f"{b / 1e6:.1f}"  # noqa: E731
    runs = sorted((json.load(open(f)) for f in scale_files), key=lambda r: r["hosts"])
    rows = ["| hosts | strategy | epoch s (1st, 2nd) | test acc. | wire MB per rank: mean / max (tx+rx, eth0) | "
            "UDP tx MB per rank (kernel) | sparkavg MB per rank | driver wire MB | F / rounds |",
            "|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        for name, f in r["fits"].items():
            udp = mb(f["wire_udp_tx_per_rank_mean"]) if "wire_udp_tx_per_rank_mean" in f else "-"
            fr = (f"{f['averaging_frequency'][-1]} / {f['rounds'][-1]}" if "rounds" in f else "-")
            rows.append(f"| {r['hosts']} | {name} | {', '.join(f'{x:.1f}' for x in f['epoch_seconds'])} | "
                        f"{f['accuracy']:.4f} | {mb(f['wire_bytes_per_rank_mean'])} / "
                        f"{mb(f['wire_bytes_per_rank_max'])} | "
                        f"{udp} | {mb(f['sparkavg_bytes_per_rank'])} | {mb(f['wire_bytes_driver'])} | {fr} |")
    out = "\n".join(rows) + "\n"
    if straggler_file:
        st = json.load(open(straggler_file))
        fits = st["fits"]
        bases = {"averaging": fits["averaging_even"], "sharing": fits.get("sharing_even")}
        rows = ["", "| fit | slow host | preset | epoch s (1st, 2nd) | vs no slow host (2nd epoch) | "
                    "test acc. | vs no slow host (points) | shares of the last epoch |",
                "|---|---|---|---|---|---|---|---|"]
        for name, f in fits.items():
            spec = f["spec"]
            base = bases[spec["master"]] or bases["averaging"]
            shares = f.get("worker_shares", [None])[-1]
            slow = f"{st['slow_host']} at {st['slow_cpu']} core" if spec.get("slow") else "-"
            # files written before presets name the retired switch instead
            preset = spec.get("preset") or f"worker_shares={spec.get('worker_shares', 'auto')}"
            rows.append(f"| {name} | {slow} | "
                        f"{preset if spec['master'] == 'averaging' else '(sharing)'} | "
                        f"{', '.join(f'{x:.1f}' for x in f['epoch_seconds'])} | "
                        f"{f['epoch_seconds'][-1] / base['epoch_seconds'][-1]:.2f} | {f['accuracy']:.4f} | "
                        f"{100 * (f['accuracy'] - base['accuracy']):+.2f} | "
                        f"{'-' if not shares else ', '.join(f'{x:.3f}' for x in shares)} |")
        out += "\n".join(rows) + "\n"
    if model_file:
        m = json.load(open(model_file))
        rows = ["", "| strategy | calibrated overheads | error at 2 / 4 / 8 hosts | leave-one-out error |",
                "|---|---|---|---|"]
        for s_, c in m["calibrated"].items():
            o = {k: round(v, 4) for k, v in c["overheads"].items() if v}
            pct = lambda es: " / ".join(f"{100 * e['error']:+.1f}%" for e in es)  # noqa: E731
            rows.append(f"| {s_} | {o} | {pct(c['points'])} | {pct(c['leave_one_out'])} |")
        out += "\n".join(rows) + "\n"
        for rate, by in m["predictions"].items():
            rows = ["", f"Predicted at {rate}/s ({m['examples_per_worker']} examples per worker): epoch s "
                        "(efficiency = examples/s over workers x one worker's compute-only rate)", "",
                    "| workers | " + " | ".join(by) + " |", "|---|" + "---|" * len(by)]
            for n in sorted(next(iter(by.values())), key=int):
                cells = [f"{by[s_][n]['seconds']:.1f} ({100 * by[s_][n]['efficiency']:.0f}%)" for s_ in by]
                rows.append(f"| {n} | " + " | ".join(cells) + " |")
            out += "\n".join(rows) + "\n"
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hosts", type=int, default=8)
    p.add_argument("--runs", choices=sorted(RUNS), default="scale")
    p.add_argument("--cpu", type=float, default=0.2, help="cores per worker host (its cgroup quota)")
    p.add_argument("--pin", action="store_true",
                   help="instead of a quota (--cpu), bind each worker host to a core of its own (host i to the i-th CPU this process may use): "
                        "hosts of one dedicated core, not sharing the machine's cores with each other's quota")
    p.add_argument("--cpu-period-ms", type=float, default=10.0,
                   help="the quota's period (a throttled host waits up to (1 - cpu) x period for its next quota: "
                        "a run at another period shows whether a latency-bound cost is the harness's)")
    p.add_argument("--rate", default=None, help="tc rate of every link (default: unshaped)")
    p.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--limit-train", type=int, default=8192)
    p.add_argument("--limit-test", type=int, default=10000)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--spark-conf", action="append", default=[], metavar="KEY=VALUE",
                   help="a Spark setting of the driver program on top of the benchmark's (repeatable; "
                        "for experiments, not the user's path)")
    p.add_argument("--out", default=None)
    p.add_argument("--table", nargs="+", default=None, metavar="JSON",
                   help="only print the history/cluster.md tables of these scale_scale_h*.json files "
                        "(with --straggler, --model)")
    p.add_argument("--straggler", default=None)
    p.add_argument("--model", default=None)
    p.add_argument("--job", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--conf", default=None, help=argparse.SUPPRESS)
    p.add_argument("--network-mask", default=None, help=argparse.SUPPRESS)
    p.add_argument("--fits", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.job:
        return job(args)
    if args.table:
        print(markdown(args.table, args.straggler, args.model))
        return None
    from tests.harness import SimulatedCluster

    ok, reason = SimulatedCluster.available()
    if not ok:
        raise SystemExit(f"bench_scale needs simulated hosts: {reason}")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                            text=True).stdout.strip()
    load = os.getloadavg()
    result = {"benchmark": "scale", "commit": commit, "cpus": os.cpu_count(), "hostname": socket.gethostname(),
              "load_before": load, "examples": args.limit_train, "epochs": args.epochs, "batch_size_per_worker": BATCH,
              "runs": args.runs, "rate": args.rate or "unshaped", "model": "LeNet (431,080 params, Adam)",
              "spark_conf": args.spark_conf,
              "threshold": f"AdaptiveThreshold(initial={THRESHOLD})",
              "collective": "halving"}  # the in-stage all-reduce measured (before issue 37's halving: "mesh")
    result.update(run(args))
    result["load_after"] = os.getloadavg()
    return emit(result, args.out)


if __name__ == "__main__":
    main()
