#!/usr/bin/env python
"""Both masters on a multi-host Spark cluster, links unshaped, 1 Gbit/s and
100 Mbit/s, next to one process on one core -- same run, same data.

Hosts are simulated (:class:`tests.harness.SimulatedCluster`: each host
its own network and mount namespace on this machine, links shaped with
``tc tbf`` both ways): a driver host (Spark master and the driver program)
and 2 worker hosts x 1 core.  Per link speed a fresh cluster runs, in one
driver program, LeNet on Fashion-MNIST with

* parameter averaging at the library's defaults (``averaging_frequency``
  "auto", block momentum, data through Spark blocks) but the batch size, and
* gradient sharing as the example runs it (``AdaptiveThreshold(1e-2)``),

both with ``batch_size_per_worker=32`` on the whole training set (or its
first ``--limit-train`` examples), which the executors read from the IDX
files themselves (:func:`executor_loaded_rdd`) -- or, with ``--data driver``,
that the driver hands over as the README and ``examples/mnist_lenet.py`` do
(:func:`driver_rdd`: ``sc.parallelize`` of numpy chunks, cached); and, before
and after the clusters, one local process on one core (``set_threads(1)``,
batch 32; ``--no-local`` skips it).
Throughput = examples / seconds of the last epoch (with ``--epochs 1``, the
only one: it includes averaging's probe rounds, as a user's first epoch does).

Bytes on the wire come from the kernel, not from sparkavg: each host's
``eth0`` counters, and per protocol the counters of an ``htb`` qdisc that a
``u32`` filter feeds with UDP (class 10:10) and everything else, Spark's
TCP, (10:20).  The qdisc sits under the link's ``tbf`` (it only counts; its
classes are not limited) and counts frames as they leave the host:
Ethernet + IP header per IP fragment, UDP header per datagram, payload.
These are compared with sparkavg's own ``bytes_sent`` (every datagram it
sent: payload, its headers and HMAC, acks, retransmissions).

Needs root (namespaces).  Prints JSON (``--out`` writes it):

    python benchmarks/bench_cluster.py --out benchmarks/results/cluster.json
    python benchmarks/bench_cluster.py --limit-train 2000 --epochs 1 --rates none,100mbit   # a quick check
    python benchmarks/bench_cluster.py --data driver --epochs 2 --rates none,100mbit --no-local  # the README's path
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import socket
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(1, REPO)  # tests.harness: the simulated hosts are not part of the installed package

from report import emit  # noqa: E402

BATCH = 32
SEED = 123
THRESHOLD = 1e-2
# Ethernet + IPv4 header of every frame (IP fragment), UDP header of every datagram.
FRAME_HEADER, UDP_HEADER, MTU = 14 + 20, 8, 1500

# The counting qdisc: UDP to 10:10, the rest to 10:20; rates far above any link here.
COUNTERS = ("tc qdisc add dev eth0 {parent} handle 10: htb default 20 r2q 100000 && "
            "tc class add dev eth0 parent 10: classid 10:10 htb rate 100gbit && "
            "tc class add dev eth0 parent 10: classid 10:20 htb rate 100gbit && "
            "tc filter add dev eth0 parent 10: protocol ip prio 1 u32 match ip protocol 17 0xff flowid 10:10")
_SENT_RE = re.compile(r"class htb 10:(10|20) .*?\n\s*Sent (\d+) bytes (\d+) pkt", re.S)


# -- the driver program (runs inside the cluster's driver host) ------------------------------

def executor_loaded_rdd(sc, data_dir: str, limit, slices: int, rows: int = 500):
    """The training set as a cached RDD of ``(x, y)`` chunks that the executors
    read from the IDX files themselves, as data already in a distributed store
    would be read (every simulated host sees the files).

    Not ``sc.parallelize(chunks)``: a parallelized collection's partitions
    hold the data, and every task over it -- also over its cached blocks,
    and every epoch's deal of the minibatches derived from it -- carries its
    partition from the driver, i.e. the whole dataset crosses the driver's
    link once per job."""
    def load(part, _):
        from sparkavg.data.mnist import load_mnist

        x, y = load_mnist(data_dir, "train", limit=limit)
        lo, hi = part * len(x) // slices, (part + 1) * len(x) // slices
        for i in range(lo, hi, rows):
            yield x[i:min(i + rows, hi)], y[i:min(i + rows, hi)]

    rdd = sc.parallelize(range(slices), slices).mapPartitionsWithIndex(load).cache()
    rdd.count()
    return rdd


def driver_rdd(sc, data_dir: str, limit, slices: int, rows: int = 500):
    """The training set as the README and ``examples/mnist_lenet.py`` hand it
    over (``as_minibatch_rdd``): loaded on the driver, ``sc.parallelize`` of
    ``(x, y)`` chunks, cached and counted.  Its partitions hold the data, so
    it crosses the driver's link in every job over it that is not cut off
    from its lineage (issue 24)."""
    from sparkavg.data.mnist import load_mnist

    x, y = load_mnist(data_dir, "train", limit=limit)
    rdd = sc.parallelize([(x[i:i + rows], y[i:i + rows]) for i in range(0, len(x), rows)], slices).cache()
    rdd.count()
    return rdd


def job(args) -> None:
    """Both masters, one after the other, in one session.  Talks to the
    benchmark over stdin/stdout: prints ``{"event": "ready"}`` before a fit
    and ``{"event": "done", ...}`` after it, each time waiting for a line on
    stdin, so that the host counters are read around exactly that fit."""
    import numpy as np

    from sparkavg.data.mnist import load_mnist
    from sparkavg.nn.zoo import lenet
    from sparkavg.spark import AdaptiveThreshold, GradientSharing, ParameterAveraging, SparkTrainer

    spark = job_session(args.conf, "bench-cluster")
    try:
        xt, yt = load_mnist(args.data_dir, "test", limit=args.limit_test)
        load = driver_rdd if args.data == "driver" else executor_loaded_rdd
        rdd = load(spark.sparkContext, args.data_dir, args.limit_train or None, slices=2)
        masters = {
            "averaging": ParameterAveraging(batch_size_per_worker=BATCH, workers=2, seed=SEED),
            "sharing": GradientSharing(threshold=AdaptiveThreshold(initial=THRESHOLD), batch_size_per_worker=BATCH,
                                       workers=2, seed=SEED),
        }
        for name, master in masters.items():
            net = lenet(num_classes=10, seed=SEED)
            trainer = SparkTrainer(spark, net, master)
            handshake({"event": "ready", "strategy": name})
            trainer.fit(rdd, epochs=args.epochs)
            trainer.close()
            out = np.argmax(np.concatenate([net.output(xt[i:i + 1000]) for i in range(0, len(xt), 1000)]), axis=1)
            c = trainer.stats.counters
            handshake({"event": "done", "strategy": name, "history": [
                    {k: h[k] for k in ("epoch", "seconds", "examples", "rounds", "averaging_frequency",
                                       "replica_max_abs_diff") if k in h} for h in trainer.history],
                 "accuracy": float(np.mean(out == yt)), "counters": {k: float(v) for k, v in c.items()},
                 "lanes": trainer.stats.lanes, "stats_summary": trainer.stats.summary(),
                 "phase_totals": trainer.stats.phase_totals(), "state_bytes": int(4 * (net.num_params + net.updater_state.size)),
                 "udp_addresses": sorted({str(d["value"]) for d in trainer.stats.decisions
                                          if d["name"] == "udp_address"}),
                 "decisions": [d for d in trainer.stats.decisions if d["name"] in ("sharing_state", "deal")]})
    finally:
        spark.stop()


# -- the benchmark (root namespace) ------------------------------------------------------------

def local_baseline(data_dir, limit, epochs) -> dict:
    """One process, one core: the same LeNet, batch and epochs."""
    import numpy as np

    from sparkavg.data.batching import minibatches
    from sparkavg.data.mnist import load_mnist
    from sparkavg.nn.zoo import lenet
    from sparkavg.threads import set_threads

    set_threads(1)
    x, y = load_mnist(data_dir, "train", limit=limit)
    xt, yt = load_mnist(data_dir, "test")
    net = lenet(num_classes=10, seed=SEED)
    seconds = []
    for epoch in range(epochs):
        t0 = time.perf_counter()
        for xb, yb in minibatches(x, y, BATCH, shuffle=True, seed=SEED + epoch):
            net.fit_batch(xb, yb)
        seconds.append(time.perf_counter() - t0)
    out = np.argmax(np.concatenate([net.output(xt[i:i + 1000]) for i in range(0, len(xt), 1000)]), axis=1)
    return {"epoch_seconds": seconds, "examples": int(len(x)), "examples_per_second": len(x) / seconds[-1],
            "accuracy": float(np.mean(out == yt))}


def _tc(cluster, host, command: str) -> str:
    done = cluster.exec(host, ["sh", "-c", command], timeout=30)
    if done.returncode != 0:
        raise RuntimeError(f"on {getattr(host, 'name', host)}: expected exit status 0 from {command!r}, got "
                           f"{done.returncode}: {done.stderr.strip()}")
    return done.stdout


# -- the driver-program handshake every cluster benchmark speaks (bench_scale, bench_torch_hosts too) ----------

def handshake(event: dict) -> None:
    """Driver program side: one event as a JSON line, then wait for the benchmark's "go"
    (it reads the hosts' counters between the two)."""
    print(json.dumps(event), flush=True)
    if sys.stdin.readline().strip() != "go":
        raise SystemExit("the benchmark went away")


def job_session(conf_json: str, app_name: str):
    """Driver program side: the job's SparkSession on the cluster (recommended_conf, then ``conf_json``)."""
    from pyspark.sql import SparkSession

    from sparkavg.spark import recommended_conf

    conf = json.loads(conf_json)
    builder = SparkSession.builder.appName(app_name).config("spark.driver.memory", "2g")
    for key, value in {**recommended_conf(conf["spark.master"]), **conf}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


def drive_counted(cluster, argv, on_done) -> tuple:
    """Benchmark side: run ``argv`` (a driver program) on the cluster's driver host
    (:func:`tests.harness.driving.drive`), read the hosts' counters at each of its ``ready``
    events and call ``on_done(event, hosts)`` at each ``done`` with what they counted in between
    (:func:`_delta`).  Returns ``(exit code, its stderr log)``."""
    from tests.harness.driving import drive

    before = {}

    def on_event(event, program):
        if event["event"] == "ready":
            before["counters"] = read_counters(cluster)
        elif event["event"] == "done":
            on_done(event, _delta(read_counters(cluster), before["counters"]))

    code, _, log = drive(cluster, argv, on_event, cwd=REPO)
    return code, log


def install_counters(cluster) -> None:
    """The UDP / other counting qdisc on every host's eth0 (under the link's tbf when shaped)."""
    for host in cluster.all_hosts:
        shown = _tc(cluster, host, "tc qdisc show dev eth0")
        tbf = re.search(r"qdisc tbf (\w+): root", shown)
        _tc(cluster, host, COUNTERS.format(parent=f"parent {tbf.group(1)}:1" if tbf else "root"))


def read_counters(cluster) -> dict:
    """Per host: eth0 tx/rx bytes, and tx bytes/frames of UDP and of the rest (htb classes)."""
    iface = cluster.interface_bytes()
    out = {}
    for host in cluster.all_hosts:
        classes = {cls: (int(b), int(p)) for cls, b, p in _SENT_RE.findall(_tc(cluster, host,
                                                                                "tc -s class show dev eth0"))}
        if set(classes) != {"10", "20"}:
            raise RuntimeError(f"expected htb classes 10:10 and 10:20 on {host.name}, got {sorted(classes)}")
        out[host.name] = {"tx": iface[host.name]["tx"], "rx": iface[host.name]["rx"],
                          "udp_tx": classes["10"][0], "udp_tx_frames": classes["10"][1],
                          "other_tx": classes["20"][0], "other_tx_frames": classes["20"][1]}
    return out


def _delta(after: dict, before: dict) -> dict:
    return {h: {k: after[h][k] - before[h][k] for k in after[h]} for h in after}


def modelled_udp_wire(payload: float, datagrams: float) -> float:
    """sparkavg's bytes_sent plus the headers the kernel adds, assuming every
    datagram is as large as the mean one (fragments of MTU - 20 bytes)."""
    if datagrams <= 0:
        return 0.0
    mean = payload / datagrams
    fragments = math.ceil((mean + UDP_HEADER) / (MTU - 20))
    return payload + datagrams * (UDP_HEADER + fragments * FRAME_HEADER)


def summarise(done: dict, hosts: dict, local_eps: float, workers) -> dict:
    h = done["history"]
    last = h[-1]
    eps = last["examples"] / last["seconds"]
    c = done["counters"]
    worker_hosts = [w.name for w in workers]
    out = {"epoch_seconds": [e["seconds"] for e in h], "examples_per_second": eps,
           "speedup_vs_local": eps / local_eps, "accuracy": done["accuracy"], "hosts": hosts,
           "busiest_link_bytes_per_epoch": max(max(v["tx"], v["rx"]) for v in hosts.values()) / len(h),
           "lane_hosts": sorted({lane.split("/")[0] for lane in done["lanes"] if "/" in lane}),
           "stats_summary": done["stats_summary"], "phase_totals": done["phase_totals"],
           "decisions": done.get("decisions"), "resident_state_misses": c.get("resident_state_misses", 0.0),
           "replica_max_abs_diff": [e.get("replica_max_abs_diff") for e in h]}
    if done["strategy"] == "averaging":
        out["rounds"] = [e.get("rounds") for e in h]
        out["averaging_frequency"] = [e.get("averaging_frequency") for e in h]
        # Not a sparkavg counter: what the rounds ship (state out, weighted state back), by the model.
        out["modelled_state_bytes"] = sum(e.get("rounds") or 0 for e in h) * len(workers) * 2 * done["state_bytes"]
    else:
        udp = sum(hosts[name]["udp_tx"] for name in worker_hosts)
        sent, datagrams = c.get("bytes_sent", 0.0), c.get("datagrams_sent", 0.0)
        model = modelled_udp_wire(sent, datagrams)
        out.update({
            "sparkavg": {k: c.get(k, 0.0) for k in ("bytes_sent", "payload_bytes_sent", "datagrams_sent",
                                                      "datagrams_retransmitted", "datagrams_rejected",
                                                      "messages_sent", "dense_bytes_equivalent")},
            "udp_addresses": done["udp_addresses"],
            "udp_wire_bytes": udp,
            "udp_wire_over_bytes_sent": udp / sent if sent else None,
            "udp_wire_over_modelled": udp / model if model else None,
            "agree_within_10pct": bool(sent) and abs(udp / sent - 1) <= 0.10,
            "replica_max_abs_diff": max(e.get("replica_max_abs_diff", 0.0) for e in h),
        })
    return out


def run_cluster(rate, args, local_eps: float) -> dict:
    from tests.harness import SimulatedCluster

    started = time.monotonic()
    with SimulatedCluster(workers=2, cores_per_worker=1, memory="1g", rate=rate) as cluster:
        install_counters(cluster)
        conf = cluster.spark_conf()
        argv = [sys.executable, os.path.abspath(__file__), "--job", "--conf", json.dumps(conf), "--data-dir",
                args.data_dir, "--epochs", str(args.epochs), "--limit-test", str(args.limit_test), "--data", args.data]
        if args.limit_train:
            argv += ["--limit-train", str(args.limit_train)]
        result = {"rate": rate or "unshaped", "cluster_start_seconds": time.monotonic() - started}

        def on_done(event, hosts):
            result[event["strategy"]] = summarise(event, hosts, local_eps, cluster.hosts)

        code, log = drive_counted(cluster, argv, on_done)
        if code != 0 or "sharing" not in result:
            raise RuntimeError(f"the driver program on {result['rate']} exited with {code}:\n{log[-5000:]}")
        result["worker_ips"] = [h.ip for h in cluster.hosts]
    return result


def breakeven_rate(epoch_seconds: float, busiest_bytes: float, local_seconds: float):
    """Link speed (bit/s) below which a strategy's epoch is slower than one
    core's: its unshaped epoch plus its busiest link's bytes at that speed.
    None when it is slower than one core even unshaped."""
    spare = local_seconds - epoch_seconds
    return busiest_bytes * 8 / spare if spare > 0 else None


STRATEGIES = ("averaging", "sharing")


def verdicts(result: dict) -> dict:
    """The musts and the link speed where each strategy stops paying, from the
    medians over repeats (every run is in ``result["runs"]``)."""
    runs, local_eps, examples = result["runs"], result["local_examples_per_second"], result["examples"]
    rates = list(dict.fromkeys(r["rate"] for r in runs))
    median = {rate: {name: statistics.median(r[name]["examples_per_second"] for r in runs if r["rate"] == rate)
                     for name in STRATEGIES} for rate in rates}
    v = {"median_examples_per_second": median,
         "median_speedup_vs_local": {rate: {n: median[rate][n] / local_eps for n in STRATEGIES} for rate in rates},
         "udp_wire_over_bytes_sent": [r["sharing"]["udp_wire_over_bytes_sent"] for r in runs],
         "sharing_bytes_agree_within_10pct_every_run": all(r["sharing"]["agree_within_10pct"] for r in runs)}
    if "unshaped" in median:
        for rate in rates:
            if rate != "unshaped":
                for name in STRATEGIES:
                    v[f"{name}_{rate}_over_unshaped"] = median[rate][name] / median["unshaped"][name]
        if "100mbit" in median:
            v["sharing_keeps_85pct_at_100mbit"] = v["sharing_100mbit_over_unshaped"] >= 0.85
        for name in STRATEGIES:
            base = [r[name] for r in runs if r["rate"] == "unshaped"]
            rate = breakeven_rate(examples / median["unshaped"][name],
                                  statistics.mean(x["busiest_link_bytes_per_epoch"] for x in base),
                                  examples / local_eps)
            v[f"{name}_pays_down_to_mbit_s"] = rate / 1e6 if rate is not None else None
    v["pays_at"] = {name: {rate: median[rate][name] > local_eps for rate in rates} for name in STRATEGIES}
    return v


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--limit-train", type=int, default=0, help="first N training examples (default 0: all 60000)")
    p.add_argument("--limit-test", type=int, default=10000)
    p.add_argument("--epochs", type=int, default=1, help="epochs per fit; throughput is the last epoch's")
    p.add_argument("--rates", default="none,1gbit,100mbit", help="link speeds, 'none' = unshaped")
    p.add_argument("--repeats", type=int, default=2,
                   help="times through the rates, every other time in reverse order (default 2); verdicts use "
                        "the median of each rate")
    p.add_argument("--data", choices=["executors", "driver"], default="executors",
                   help="executors: they read the IDX files (executor_loaded_rdd, default); driver: the README's "
                        "sc.parallelize of chunks from the driver (driver_rdd)")
    p.add_argument("--no-local", action="store_true", help="skip the one-process baseline (only the link ratios)")
    p.add_argument("--out", default=None)
    p.add_argument("--table", default=None, help="also write the history/cluster.md tables (markdown) here")
    p.add_argument("--job", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--conf", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.job:
        return job(args)
    from tests.harness import SimulatedCluster

    ok, reason = SimulatedCluster.available()
    if not ok:
        raise SystemExit(f"bench_cluster needs simulated hosts: {reason}")
    args.limit_train = args.limit_train or None
    rates = [None if r.strip() == "none" else r.strip() for r in args.rates.split(",")]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                            text=True).stdout.strip()
    result = {"benchmark": "cluster", "commit": commit, "cpus": os.cpu_count(), "hostname": socket.gethostname(),
              "examples": args.limit_train or 60000, "epochs": args.epochs, "batch_size_per_worker": BATCH,
              "workers": "2 hosts x 1 core", "threshold": f"AdaptiveThreshold(initial={THRESHOLD})",
              "data": args.data}
    skipped = {"epoch_seconds": [], "examples_per_second": float("nan"), "accuracy": float("nan"), "skipped": True}
    before = skipped if args.no_local else local_baseline(args.data_dir, args.limit_train, args.epochs)
    runs = []
    for repeat in range(args.repeats):
        for rate in (rates if repeat % 2 == 0 else rates[::-1]):
            runs.append({"repeat": repeat + 1, **run_cluster(rate, args, before["examples_per_second"])})
    after = skipped if args.no_local else local_baseline(args.data_dir, args.limit_train, args.epochs)
    local_eps = (before["examples_per_second"] + after["examples_per_second"]) / 2
    for run in runs:  # against the mean of both local runs
        for name in STRATEGIES:
            run[name]["speedup_vs_local"] = run[name]["examples_per_second"] / local_eps
    result.update({"local_before": before, "local_after": after, "local_examples_per_second": local_eps,
                   "runs": runs})
    result["verdict"] = verdicts(result)
    if args.table:
        with open(args.table, "w") as fh:
            fh.write(markdown(result))
    return emit(result, args.out)


def markdown(result: dict) -> str:
    """The history/cluster.md tables: medians per link speed, then every run (the local process first)."""
    mb = lambda b: f"{b / 1e6:.1f}"  # noqa: E731
    v = result["verdict"]
    med = v["median_examples_per_second"]
    rows = ["| link | averaging ex/s | vs 1 core | vs unshaped | sharing ex/s | vs 1 core | vs unshaped |",
            "|---|---|---|---|---|---|---|"]
    for rate, m in med.items():
        cells = []
        for name in STRATEGIES:
            rel = f"{m[name] / med['unshaped'][name]:.2f}" if "unshaped" in med else "-"
            cells += [f"{m[name]:.0f}", f"{m[name] / result['local_examples_per_second']:.2f}", rel]
        rows.append(f"| {rate} | " + " | ".join(cells) + " |")
    rows.append(f"| 1 process, 1 core | {result['local_examples_per_second']:.0f} (mean of before/after) | 1 | - | "
                "- | - | - |")
    rows += ["", "| link | # | run | epoch s | examples/s | vs 1 core | test acc. | wire tx / rx MB: driver; "
             "worker0; worker1 (eth0) | UDP on the wire MB (kernel, workers) | sparkavg bytes_sent MB | kernel / "
             "sparkavg |", "|" + "---|" * 11]
    for key in ("local_before", "local_after"):
        loc = result[key]
        rows.append(f"| - | {key.split('_')[1]} | 1 process, 1 core | "
                    f"{', '.join(f'{s:.1f}' for s in loc['epoch_seconds'])} | {loc['examples_per_second']:.0f} | "
                    f"{loc['examples_per_second'] / result['local_examples_per_second']:.2f} | "
                    f"{loc['accuracy']:.4f} | - | - | - | - |")
    for run in sorted(result["runs"], key=lambda r: (list(med).index(r["rate"]), r["repeat"])):
        for name in STRATEGIES:
            x = run[name]
            hosts = "; ".join(f"{mb(h['tx'])} / {mb(h['rx'])}" for h in x["hosts"].values())
            label = name if name == "sharing" else f"averaging (F {', '.join(map(str, x['averaging_frequency']))})"
            udp = (f"{mb(x['udp_wire_bytes'])} | {mb(x['sparkavg']['bytes_sent'])} | "
                   f"{x['udp_wire_over_bytes_sent']:.3f}") if name == "sharing" else "- | - | -"
            rows.append(f"| {run['rate']} | {run['repeat']} | {label} | "
                        f"{', '.join(f'{s:.1f}' for s in x['epoch_seconds'])} | {x['examples_per_second']:.0f} | "
                        f"{x['speedup_vs_local']:.2f} | {x['accuracy']:.4f} | {hosts} | {udp} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    main()
