#!/usr/bin/env python
"""Driver program of the multi-host tests (tests/test_cluster_hosts.py).

Runs named scenarios against a Spark master in ONE SparkSession (a driver
JVM costs 15-30 s to start on a small machine) and prints one JSON line::

    {"driver_host": ..., "results": {scenario: {...}}, "errors": {scenario: traceback},
     "seconds": {scenario: s}}

A scenario that raises is recorded under ``errors`` and the others still
run, so each test names its own failure.  The program only measures; the
tests decide what is right.

    python tests/cluster_driver.py --conf '{"spark.master": "spark://10.0.0.1:7077"}' \\
        --shared /a/folder/every/host/sees averaging_defaults sharing_defaults inference

Data are tiny separable blobs and a 154-parameter network (tests/nets.py):
what is tested is what crosses hosts, not learning.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import sys
import tempfile
import time
import traceback

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from nets import blobs, job_properties, small_net  # noqa: E402  (tests/nets.py, next to this file)

from sparkavg.evaluation import Evaluation  # noqa: E402
from sparkavg.spark import (DataOptions, GradientSharing, ParameterAveraging, SparkTrainer, Topology,  # noqa: E402
                            recommended_conf)

KILL_MARKER = "sparkavg.test.kill_marker"  # sparkavg.spark.executor.hooks.KILL_MARKER
STALL_TIMEOUT = "sparkavg.test.stall_timeout"  # sparkavg.spark.executor.hooks.STALL_TIMEOUT


class LogCapture(logging.Handler):
    """sparkavg's log lines (INFO and up), to check what the library said it did."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())

    def since(self, mark: int, prefix: str):
        return [line for line in self.lines[mark:] if line.startswith(prefix)]


class Context:
    def __init__(self, spark, shared: str, network_mask, logs: LogCapture):
        self.spark, self.sc, self.shared, self.network_mask, self.logs = spark, spark.sparkContext, shared, \
            network_mask, logs
        self.kept = {}

    def pairs(self, x, y, parts: int):
        return self.sc.parallelize(list(zip(x, y.tolist())), parts)


def lane_hosts(stats):
    """Hostnames of the worker lanes (``host/pid/pN``) of a fit's statistics."""
    return sorted({lane.split("/")[0] for lane in stats.lanes if "/" in lane})


def accuracy(net, x, y) -> float:
    return float(np.mean(np.argmax(net.output(x), axis=1) == y))


def udp_decisions(stats):
    return [{"value": d["value"], "reason": d["reason"]} for d in stats.decisions if d["name"] == "udp_address"]


def max_abs_diff(a, b) -> float:
    return float(np.max(np.abs(np.asarray(a) - np.asarray(b))))


# -- scenarios ---------------------------------------------------------------------------

def averaging_defaults(ctx: Context) -> dict:
    """ParameterAveraging() exactly at its defaults, data options included."""
    x, y = blobs(800, seed=1)
    rdd = ctx.pairs(x, y, 4)
    net = small_net(seed=2)
    mark = len(ctx.logs.lines)
    trainer = SparkTrainer(ctx.spark, net)
    trainer.fit(rdd, epochs=2)
    trainer.close()
    ctx.kept["averaged"] = (trainer, net)
    return {"workers": trainer.workers, "examples": [h["examples"] for h in trainer.history],
            "averaging_frequency": [h.get("averaging_frequency") for h in trainer.history],
            "accuracy": accuracy(net, x, y), "prepared": ctx.logs.since(mark, "prepared"),
            "lane_hosts": lane_hosts(trainer.stats)}


def sharing_defaults(ctx: Context) -> dict:
    """GradientSharing() exactly at its defaults; the UDP address each worker chose."""
    x, y = blobs(800, seed=3)
    rdd = ctx.pairs(x, y, 4)
    net = small_net(seed=4)
    mark = len(ctx.logs.lines)
    trainer = SparkTrainer(ctx.spark, net, GradientSharing())
    trainer.fit(rdd, epochs=2)
    trainer.close()
    ctx.kept["shared"] = trainer
    c = trainer.stats.counters
    return {"workers": trainer.workers, "examples": [h["examples"] for h in trainer.history],
            "replica_max_abs_diff": max(h["replica_max_abs_diff"] for h in trainer.history),
            "accuracy": accuracy(net, x, y), "prepared": ctx.logs.since(mark, "prepared"),
            "lane_hosts": lane_hosts(trainer.stats), "udp_addresses": udp_decisions(trainer.stats),
            "bytes_sent": int(c.get("bytes_sent", 0)), "messages_received": int(c.get("messages_received", 0)),
            "datagrams_forged": int(c.get("datagrams_forged", 0)),
            "sharing_state": [d["value"] for d in trainer.stats.decisions if d["name"] == "sharing_state"],
            "resident_state_misses": int(c.get("resident_state_misses", 0))}


def inference(ctx: Context) -> dict:
    """evaluate, score and keyed predict on the cluster against the same network on the driver."""
    if "averaged" not in ctx.kept:
        averaging_defaults(ctx)
    trainer, net = ctx.kept["averaged"]
    x, y = blobs(300, seed=5)
    rdd = ctx.pairs(x, y, 3)
    ev = trainer.evaluate(rdd)
    local = Evaluation(2).eval(y, net.output(x))
    keyed = ctx.sc.parallelize([(f"row-{i}", x[i]) for i in range(len(x))], 3)
    predicted = dict(trainer.predict(keyed).collect())
    trainer.close()
    expected = net.output(x)
    keys = [f"row-{i}" for i in range(len(x))]
    return {"count": ev.count, "confusion": ev.confusion_matrix.tolist(),
            "local_confusion": local.confusion_matrix.tolist(), "accuracy": ev.accuracy(),
            "score": trainer.score(rdd), "local_score": float(net.score(x, y)),
            "predicted_keys_match": sorted(predicted) == sorted(keys),
            "predict_max_abs_diff": max_abs_diff([predicted[k] for k in keys], expected)
            if sorted(predicted) == sorted(keys) else None}


def checkpoint_resume(ctx: Context) -> dict:
    """2 epochs with checkpoints, then resume_from to 3, against 3 epochs straight (pinned frequency:
    "auto" chooses from timings, which differ run to run)."""
    x, y = blobs(200, seed=6)
    rdd = ctx.pairs(x, y, 2)
    master = ParameterAveraging(batch_size_per_worker=10, averaging_frequency=5, workers=2)
    straight = small_net(seed=7)
    with SparkTrainer(ctx.spark, straight, master) as trainer:
        trainer.fit(rdd, epochs=3)
    ckpt = os.path.join(ctx.shared, "checkpoints")
    first = SparkTrainer(ctx.spark, small_net(seed=7), master, checkpoint_dir=ckpt)
    first.fit(rdd, epochs=2)
    first.close()
    listed = sorted(os.listdir(ckpt))
    resumed = SparkTrainer(ctx.spark, small_net(seed=99), master, checkpoint_dir=ckpt)  # all from the checkpoint
    resumed.fit(rdd, epochs=3, resume_from=ckpt)
    resumed.close()
    return {"checkpoints_after_2": listed, "epochs_done": resumed.epochs_done,
            "history_epochs": [h["epoch"] for h in resumed.history],
            "params_max_abs_diff": max_abs_diff(resumed.network.params, straight.params),
            "updater_max_abs_diff": max_abs_diff(resumed.network.updater_state, straight.updater_state),
            "iterations": [resumed.network.iteration, straight.iteration]}


def stats_page(ctx: Context) -> dict:
    """The HTML stats page of the sharing fit: one lane per worker host."""
    if "shared" not in ctx.kept:
        sharing_defaults(ctx)
    stats = ctx.kept["shared"].stats
    path = os.path.join(ctx.shared, "stats.html")
    stats.to_html(path)
    page = open(path, encoding="utf-8").read()
    hosts = lane_hosts(stats)
    return {"path": path, "bytes": len(page), "lane_hosts": hosts,
            "hosts_on_page": [h for h in hosts if f"{h}/" in page], "has_svg": "<svg" in page}


def _with_kill_marker(ctx: Context, name: str, fit):
    """Run ``fit()`` with the kill marker set: the first task to start kills its Python worker."""
    marker = os.path.join(ctx.shared, name)
    with open(marker, "w") as fh:
        fh.write("kill the first task that starts\n")
    ctx.sc.setLocalProperty(KILL_MARKER, marker)
    try:
        fit()
    finally:
        ctx.sc.setLocalProperty(KILL_MARKER, None)
    return {"claimed": os.path.exists(marker + ".claimed"), "marker_left": os.path.exists(marker)}


def kill_averaging(ctx: Context) -> dict:
    """Epoch 2 of an averaging fit loses a Python worker: Spark retries the task; the result is a clean run's."""
    x, y = blobs(200, seed=8)
    rdd = ctx.pairs(x, y, 2)
    master = ParameterAveraging(batch_size_per_worker=10, averaging_frequency=5, workers=2)
    clean = SparkTrainer(ctx.spark, small_net(seed=9), master)
    clean.fit(rdd, epochs=1)
    clean.fit(rdd, epochs=1)
    clean.close()
    crashed = SparkTrainer(ctx.spark, small_net(seed=9), master)
    crashed.fit(rdd, epochs=1)
    out = _with_kill_marker(ctx, "kill-averaging", lambda: crashed.fit(rdd, epochs=1))
    crashed.close()
    out.update({"examples": [h["examples"] for h in crashed.history],
                "params_max_abs_diff": max_abs_diff(crashed.network.params, clean.network.params),
                "iterations": [crashed.network.iteration, clean.network.iteration]})
    return out


def kill_sharing(ctx: Context) -> dict:
    """Epoch 2 of a sharing fit loses a Python worker: the driver restarts the epoch once."""
    n = 200
    x, y = blobs(n, seed=10)
    rdd = ctx.pairs(x, y, 2)
    master = GradientSharing(batch_size_per_worker=10, workers=2)
    trainer = SparkTrainer(ctx.spark, small_net(seed=11), master)
    with job_properties(ctx.sc, {STALL_TIMEOUT: 20.0}):  # the transport's test hook: a lost peer named sooner
        trainer.fit(rdd, epochs=1)
        out = _with_kill_marker(ctx, "kill-sharing", lambda: trainer.fit(rdd, epochs=1))
    trainer.close()
    out.update({"n": n, "stage_restarts": int(trainer.stats.counters.get("stage_restarts", 0)),
                "examples": [h["examples"] for h in trainer.history],
                "replica_max_abs_diff": max(h["replica_max_abs_diff"] for h in trainer.history),
                "accuracy": accuracy(trainer.network, x, y)})
    return out


def lose_host(ctx: Context) -> dict:
    """Epoch 2 of a sharing fit loses rank 1's host while it trains (the test kills the host's processes or
    cuts its link once ``LOSE_HOST/reached`` names it): how the fit ends, how long it took, and whether the
    network and the checkpoints are as epoch 1 left them."""
    from data_transforms import LOSE_HOST  # tests/data_transforms.py, next to this file

    from sparkavg.spark.checkpoint import list_checkpoints

    x, y = blobs(400, seed=14)
    rdd = ctx.pairs(x, y, 2)
    folder = tempfile.mkdtemp(prefix="lose-host-checkpoints-", dir=ctx.shared)  # a fresh run's folder
    master = GradientSharing(batch_size_per_worker=5, workers=2,
                             data=DataOptions(transform="tests.data_transforms:reach_and_wait"))
    trainer = SparkTrainer(ctx.spark, small_net(seed=15), master, checkpoint_dir=folder)
    stall = 10.0
    with job_properties(ctx.sc, {STALL_TIMEOUT: stall}):
        trainer.fit(rdd, epochs=1)
        kept = trainer.network.params.copy()
        with open(os.path.join(LOSE_HOST, "armed"), "w"):
            pass
        began, error = time.monotonic(), None
        try:
            trainer.fit(rdd, epochs=1)
        except Exception as exc:
            error = {"type": type(exc).__name__, "message": str(exc)[:3000]}
        seconds = time.monotonic() - began
    return {"error": error, "seconds": seconds, "stall_timeout": stall,
            "restored": bool(np.array_equal(trainer.network.params, kept)),
            "checkpoints": [c.epochs_done for c in list_checkpoints(folder)],
            "stage_restarts": int(trainer.stats.counters.get("stage_restarts", 0))}


def shared_dir(ctx: Context) -> dict:
    """DataOptions(shared_dir=...) at a folder every host sees: files there, and the same training as
    through Spark blocks; both masters."""
    x, y = blobs(200, seed=12)
    rdd = ctx.pairs(x, y, 2)
    folder = os.path.join(ctx.shared, "minibatches")
    os.makedirs(folder, exist_ok=True)
    base = dict(batch_size_per_worker=10, averaging_frequency=5, workers=2)
    blocks = small_net(seed=13)  # the same deal for both ("auto" deals files balanced, blocks in place)
    first = SparkTrainer(ctx.spark, blocks, ParameterAveraging(**base, data=DataOptions(repartition="balanced")))
    first.fit(rdd, epochs=1)
    first.close()
    files = small_net(seed=13)
    mark = len(ctx.logs.lines)
    trainer = SparkTrainer(ctx.spark, files, ParameterAveraging(
        **base, data=DataOptions(shared_dir=folder, repartition="balanced")))
    trainer.fit(rdd, epochs=1)
    written = sorted(os.listdir(os.path.join(folder, d)) for d in os.listdir(folder))
    trainer.close()
    left = os.listdir(folder)
    sharing = SparkTrainer(ctx.spark, small_net(seed=14),
                           GradientSharing(batch_size_per_worker=10, workers=2, data=DataOptions(shared_dir=folder)))
    sharing.fit(rdd, epochs=1)
    sharing.close()
    return {"prepared": ctx.logs.since(mark, "prepared"), "files_per_fit": [len(w) for w in written],
            "minibatch_files": all(name.endswith(".minibatch") for w in written for name in w), "left_after_close": left,
            "params_max_abs_diff_vs_blocks": max_abs_diff(files.params, blocks.params),
            "lane_hosts": lane_hosts(trainer.stats), "sharing_examples": sharing.history[0]["examples"],
            "sharing_replica_max_abs_diff": sharing.history[0]["replica_max_abs_diff"]}


def private_dir(ctx: Context) -> dict:
    """shared_dir at a folder only the driver host sees (its private /tmp): the fit must fail, saying so."""
    x, y = blobs(40, seed=15)
    rdd = ctx.pairs(x, y, 2)
    master = ParameterAveraging(batch_size_per_worker=10, averaging_frequency=1, workers=2,
                                data=DataOptions(shared_dir="/tmp/sparkavg-not-shared"))
    try:
        with SparkTrainer(ctx.spark, small_net(seed=16), master) as trainer:
            trainer.fit(rdd, epochs=1)
    except Exception as exc:  # what the user would see
        return {"raised": type(exc).__name__, "message": str(exc)[:3000]}
    return {"raised": None, "message": ""}


def _many_hosts(ctx: Context, master_for) -> dict:
    """One fit on every worker host (tests/test_cluster_hosts.py's 8-host test): what each rank did, by
    sparkavg's own statistics."""
    workers = int(ctx.sc.defaultParallelism)
    x, y = blobs(128 * workers, seed=41)
    rdd = ctx.pairs(x, y, workers)
    trainer = SparkTrainer(ctx.spark, small_net(seed=42), master_for(workers))
    trainer.fit(rdd, epochs=2)
    trainer.close()
    c = trainer.stats.counters
    return {"workers": workers, "n": len(x), "examples": [h["examples"] for h in trainer.history],
            "replica_max_abs_diff": max((h.get("replica_max_abs_diff", 0.0) for h in trainer.history), default=0.0),
            "rounds": [h.get("rounds") for h in trainer.history], "accuracy": accuracy(trainer.network, x, y),
            "lane_hosts": lane_hosts(trainer.stats), "udp_addresses": udp_decisions(trainer.stats),
            "state_bytes": int(4 * (trainer.network.num_params + trainer.network.updater_state.size)),
            "bytes_sent": int(c.get("bytes_sent", 0)), "messages_received": int(c.get("messages_received", 0)),
            "datagrams_sent": int(c.get("datagrams_sent", 0)),
            "decisions": {d["name"]: d["value"] for d in trainer.stats.decisions}}


def many_averaging(ctx: Context) -> dict:
    """ParameterAveraging at its defaults but the worker count, on every host."""
    return _many_hosts(ctx, lambda workers: ParameterAveraging(workers=workers))


def many_plain(ctx: Context) -> dict:
    """GradientSharing with PLAIN (its default up to 4 workers) on every host, addresses by network_mask."""
    return _many_hosts(ctx, lambda workers: GradientSharing(workers=workers, network_mask=ctx.network_mask,
                                                            topology=Topology.PLAIN))


def many_tree(ctx: Context) -> dict:
    """GradientSharing with TREE on every host."""
    return _many_hosts(ctx, lambda workers: GradientSharing(workers=workers, network_mask=ctx.network_mask,
                                                            topology=Topology.TREE))


def _stages(sc) -> list:
    """Completed stages' shuffle metrics from the driver's status store (what the UI shows; the UI is off
    here).  The listener bus is asynchronous: read until two reads agree."""
    qs = sc._gateway.new_array(sc._jvm.double, 0)
    last = None
    for _ in range(50):
        seq = sc._jsc.sc().statusStore().stageList(None, False, False, qs, None)
        it, stages = seq.iterator(), []
        while it.hasNext():
            st = it.next()
            if st.status().toString() == "COMPLETE":
                stages.append({"stageId": st.stageId(), "shuffleReadBytes": st.shuffleReadBytes(),
                               "shuffleRemoteBytesRead": st.shuffleRemoteBytesRead()})
        if last is not None and stages == last:
            return stages
        last = stages
        time.sleep(0.2)
    return last


def data_stays_on_hosts(ctx: Context) -> dict:
    """Both masters at their default deal (minibatches stay on their hosts) and at repartition='balanced':
    the shuffle bytes each fit read from another host, by Spark's own task metrics."""
    x, y = blobs(1600, seed=21)
    rdd = ctx.pairs(x, y, 2)
    out = {}
    for deal in ("auto", "balanced"):
        for name, master in (("averaging", ParameterAveraging(averaging_frequency=10, workers=2,
                                                              data=DataOptions(repartition=deal))),
                             ("sharing", GradientSharing(workers=2, data=DataOptions(repartition=deal)))):
            before = max((st["stageId"] for st in _stages(ctx.sc)), default=-1)
            trainer = SparkTrainer(ctx.spark, small_net(seed=22), master)
            trainer.fit(rdd, epochs=2)
            trainer.close()
            stages = [st for st in _stages(ctx.sc) if st["stageId"] > before]
            out[f"{name}_{deal}"] = {
                "remote_bytes": sum(int(st.get("shuffleRemoteBytesRead", 0)) for st in stages),
                "read_bytes": sum(int(st.get("shuffleReadBytes", 0)) for st in stages),
                "deal": [(d["value"], d["reason"]) for d in trainer.stats.decisions if d["name"] == "deal"],
                "examples": [h["examples"] for h in trainer.history]}
    return out


def models_across_hosts(ctx: Context) -> dict:
    """Models other than a sequential Network, each master at its defaults: a
    residual Graph with BatchNorm (its buffers averaged across hosts) and, when
    torch is installed, a torch module with BatchNorm rebuilt on each host from
    its factory name (tests.torch_models:conv_bn)."""
    from nets import small_graph

    x, y = blobs(400, seed=31)
    rdd = ctx.pairs(x, y, 4)
    makers = {"graph": small_graph}
    try:
        from sparkavg.nn import Adam
        from sparkavg.torch import TorchModel
    except ImportError:
        pass
    else:
        makers["torch"] = lambda seed: TorchModel("tests.torch_models:conv_bn", updater=Adam(lr=0.01),
                                                  input_shape=(1, 4, 4), seed=seed)
    out = {}
    for name, make in makers.items():
        for master in (ParameterAveraging(), GradientSharing()):
            model = make(seed=32)
            before = np.array(model.buffers, copy=True)
            trainer = SparkTrainer(ctx.spark, model, master)
            trainer.fit(rdd, epochs=2)
            trainer.close()
            key = f"{name}_{type(master).__name__}"
            out[key] = {"examples": [h["examples"] for h in trainer.history], "accuracy": accuracy(model, x, y),
                        "lane_hosts": lane_hosts(trainer.stats),
                        "buffers_moved": max_abs_diff(model.buffers, before) if before.size else None,
                        "replica_max_abs_diff": max((h.get("replica_max_abs_diff") or 0.0)
                                                    for h in trainer.history)}
    return out


SCENARIOS = {f.__name__: f for f in (averaging_defaults, sharing_defaults, inference, checkpoint_resume, stats_page,
                                     kill_averaging, kill_sharing, lose_host, shared_dir, private_dir,
                                     data_stays_on_hosts, models_across_hosts, many_averaging, many_plain,
                                     many_tree)}


def _handshake(event: str, scenario: str) -> None:
    print(json.dumps({"event": event, "scenario": scenario}), flush=True)
    if sys.stdin.readline().strip() != "go":
        raise SystemExit("the caller went away")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--conf", required=True, help="JSON object of Spark settings (spark.master included)")
    p.add_argument("--shared", required=True, help="a folder every host reads and writes")
    p.add_argument("--network-mask", default=None, help="GradientSharing.network_mask of the many-host sharing scenarios")
    p.add_argument("--handshake", action="store_true",
                   help='around each scenario print {"event": "ready"|"done", "scenario": ...} and wait for a '
                        '"go" line on stdin (the caller reads host counters around exactly that scenario)')
    p.add_argument("scenarios", nargs="+", choices=sorted(SCENARIOS))
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logs = LogCapture()
    logging.getLogger("sparkavg").addHandler(logs)
    logging.getLogger("sparkavg").setLevel(logging.INFO)

    from pyspark.sql import SparkSession

    conf = json.loads(args.conf)
    builder = SparkSession.builder.appName("sparkavg-cluster-tests")
    for key, value in {**recommended_conf(conf["spark.master"]), **conf}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    out = {"driver_host": socket.gethostname(), "results": {}, "errors": {}, "seconds": {}}
    ctx = Context(spark, args.shared, args.network_mask, logs)
    try:
        for name in args.scenarios:
            if args.handshake:
                _handshake("ready", name)
            began = time.monotonic()
            try:
                out["results"][name] = SCENARIOS[name](ctx)
            except Exception:
                out["errors"][name] = traceback.format_exc()[-6000:]
            out["seconds"][name] = round(time.monotonic() - began, 2)
            if args.handshake:
                _handshake("done", name)
    finally:
        spark.stop()
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
