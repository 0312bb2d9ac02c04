#!/usr/bin/env python
"""Spark Connect against classic Spark, and the Arrow path for DataFrames.

One process holds both flavours on local[2]: a classic session (its JVM
in this process) and a Spark Connect server started from the installed
pyspark in its own JVM (``spark-submit --class ...SparkConnectServer``),
both with ``recommended_conf``.  pyspark keys its Connect dispatch on a
process-wide variable; it is set only while the Connect flavour runs.

1. Preparing Fashion-MNIST's 60k training rows from Parquet
   (``features`` array<float>, ``label`` int), rows/s of the seam's
   ``prepare`` (validate + minibatch + store): the former Row path
   (``df.rdd.map(row -> numpy)`` then per-example validation, kept here
   as the "before") against the Arrow path, on classic and Connect,
   minibatches at the default placement (shared temp files on local[2])
   and as Spark blocks.
2. Epoch throughput of LeNet, both masters at their defaults, classic
   and Connect epochs alternating (a drift of the shared machine hits
   both); the must: Connect >= 0.8x classic.
3. Inference over the 10k test rows: ``NetworkModel.transform`` (batched
   Arrow) against ``SparkTrainer.predict``, rows/s, both flavours.

    python benchmarks/bench_connect.py --epochs 2 --out benchmarks/results/connect.json
"""
from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np
from report import emit

# tests.harness (the Connect server in its own JVM) is not part of the installed package.
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

MODE_VAR = "SPARK_CONNECT_MODE_ENABLED"


# ------------------------------------------------------------------ sessions
@contextlib.contextmanager
def flavour(name: str):
    """pyspark's per-process Connect switch, on only while Connect runs."""
    os.environ.pop(MODE_VAR, None)
    if name == "connect":
        os.environ[MODE_VAR] = "1"
    try:
        yield
    finally:
        os.environ.pop(MODE_VAR, None)


def classic_session(master: str, local_dir: str):
    from pyspark.sql import SparkSession

    from sparkavg.spark import recommended_conf

    builder = SparkSession.builder.master(master).appName("bench-connect-classic")
    for key, value in {**recommended_conf(master), "spark.ui.enabled": "false", "spark.local.dir": local_dir,
                       "spark.driver.bindAddress": "127.0.0.1", "spark.driver.host": "127.0.0.1"}.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


@contextlib.contextmanager
def connect_session(master: str, local_dir: str, log_path: str):
    """A Connect server (own JVM, recommended_conf) and a client session on it."""
    from pyspark.sql.connect.session import SparkSession as RemoteSparkSession

    from tests.harness.connect import connect_server

    with connect_server(master, log_path, {"spark.local.dir": local_dir}, timeout=300) as url:
        session = RemoteSparkSession.builder.remote(url).getOrCreate()
        try:
            yield session
        finally:
            session.stop()


# ---------------------------------------------------------------------- data
def write_parquet(x, y, folder: str, files: int) -> str:
    """``features`` array<float> (flat), ``label`` int, in ``files`` Parquet files."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(folder, exist_ok=True)
    flat = x.reshape(len(x), -1).astype(np.float32)
    width = flat.shape[1]
    for i, idx in enumerate(np.array_split(np.arange(len(x)), files)):
        offsets = pa.array(np.arange(0, len(idx) * width + 1, width, dtype=np.int32))
        features = pa.ListArray.from_arrays(offsets, pa.array(flat[idx].ravel()))
        pq.write_table(pa.table({"features": features, "label": pa.array(y[idx].astype(np.int32))}),
                       os.path.join(folder, f"part-{i:05d}.parquet"))
    return folder


def _row_to_pair(row):
    """The former DataFrame path: one Row -> numpy per example (for "before")."""
    features, label = row[0], row[1]
    if hasattr(features, "toArray"):
        features = features.toArray()
    return np.asarray(features, dtype=np.float32), label


def prepare_rows_per_second(session, df, spec, batch_size: int, placement: str, path: str, repeats: int) -> dict:
    from sparkavg.spark import DataOptions
    from sparkavg.spark.data import STORAGE_LEVEL, placement_for, prepare, resolve_features
    from sparkavg.spark.seam import seam_for

    seam = seam_for(session)
    options = DataOptions(placement=placement)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        if path == "rows":  # before: what as_example_rdd did for a DataFrame, then the RDD path
            rdd = df.select("features", "label").rdd.map(_row_to_pair)
            prepared = prepare(seam, rdd, spec, batch_size, placement_for(options, seam.local), STORAGE_LEVEL)
        else:
            prepared = seam.prepare(df, spec, batch_size, options, resolve_features("features", spec), "label")
        times.append(time.perf_counter() - t)
        examples = prepared.examples
        prepared.release()
    return {"seconds": times, "examples": examples, "rows_per_second": examples / min(times),
            "placement": placement}


# ------------------------------------------------------------------ training
def alternating_epochs(sessions: dict, frames: dict, make_master, args) -> dict:
    """Classic and Connect epochs alternating on LeNet; seconds and rates per flavour."""
    from sparkavg.nn import lenet
    from sparkavg.spark import SparkTrainer

    trainers = {}
    for name, session in sessions.items():
        with flavour(name):
            trainers[name] = SparkTrainer(session, lenet(seed=args.seed), make_master())
    loads = []
    try:
        for _ in range(args.epochs):
            for name in sessions:
                loads.append(round(os.getloadavg()[0], 2))
                with flavour(name):
                    trainers[name].fit(frames[name], epochs=1)
    finally:
        for name, trainer in trainers.items():
            with flavour(name):
                trainer.close()
    out = {"load_average_1min_before_epochs": loads}
    for name, trainer in trainers.items():
        h = trainer.history
        seconds = [e["seconds"] for e in h]
        out[name] = {"epoch_seconds": seconds, "examples_per_second": [e["examples_per_second"] for e in h],
                     "median_examples_per_second": h[0]["examples"] / statistics.median(seconds),
                     "loss": [e["loss"] for e in h],
                     "averaging_frequency": [e.get("averaging_frequency") for e in h],
                     "rounds_per_epoch": [e["rounds"] for e in h],
                     "replica_max_abs_diff": [e.get("replica_max_abs_diff") for e in h],
                     "overhead_lane_seconds": {k: round(v, 3) for k, v in
                                               list(trainer.stats.overhead_breakdown().items())[:6]},
                     "fit_lane_seconds": round(trainer.stats.compute_seconds, 3)}
        out[name]["_network"] = trainer.network
    out["connect_over_classic"] = (out["connect"]["median_examples_per_second"]
                                   / out["classic"]["median_examples_per_second"])
    out["must_connect_ge_0.8x"] = out["connect_over_classic"] >= 0.8
    return out


# ----------------------------------------------------------------- inference
def inference_rows_per_second(session, name: str, df, net, rows: int, repeats: int) -> dict:
    from sparkavg.ml import NetworkModel
    from sparkavg.spark import SparkTrainer

    def run_transform():
        NetworkModel(network=net).transform(df).write.format("noop").mode("overwrite").save()

    trainer = SparkTrainer(session, net)

    def run_predict():
        out = trainer.predict(df)
        if hasattr(out, "write"):  # Connect: a DataFrame
            out.write.format("noop").mode("overwrite").save()
        else:  # classic: an RDD of output rows
            out.count()

    result = {}
    for label, fn in (("transform", run_transform), ("predict", run_predict)):
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        result[label] = {"seconds": times, "rows_per_second": rows / min(times)}
    trainer.close()
    result["transform_over_predict"] = result["transform"]["rows_per_second"] / result["predict"]["rows_per_second"]
    return result


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--master", default="local[2]")
    p.add_argument("--epochs", type=int, default=2, help="epochs per flavour and master (default 2)")
    p.add_argument("--examples", type=int, default=60000, help="training rows (default all 60k)")
    p.add_argument("--repeats", type=int, default=3, help="repeats of each inference measurement (default 3)")
    p.add_argument("--prepare-repeats", type=int, default=2, help="repeats of each prepare measurement (default 2)")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--skip-training", action="store_true")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

    from sparkavg.data.mnist import load_mnist
    from sparkavg.data.validation import DataSpec
    from sparkavg.spark import GradientSharing, ParameterAveraging

    train, test = load_mnist(split="train"), load_mnist(split="test")
    x, y = train.images[:args.examples], train.labels[:args.examples]
    xt, yt = test.images, test.labels
    work = tempfile.mkdtemp(prefix="sparkavg-bench-connect-")
    result = {"master": args.master, "machine_cpus": os.cpu_count(), "examples": int(len(x)),
              "load_average_1min_at_start": round(os.getloadavg()[0], 2)}
    try:
        train_dir = write_parquet(x, y, os.path.join(work, "train"), files=4)
        test_dir = write_parquet(xt, yt, os.path.join(work, "test"), files=4)
        with flavour("classic"):
            classic = classic_session(args.master, os.path.join(work, "classic-local"))
        with connect_session(args.master, os.path.join(work, "connect-local"),
                             os.path.join(work, "connect-server.log")) as connect:
            sessions = {"classic": classic, "connect": connect}
            frames, tests = {}, {}
            for name, session in sessions.items():
                with flavour(name):
                    frames[name] = session.read.parquet(train_dir)
                    tests[name] = session.read.parquet(test_dir)
            spec = DataSpec((1, 28, 28), 10, "nll")

            prep = {}
            cases = [("classic", "rows", "auto"), ("classic", "arrow", "auto"), ("connect", "arrow", "auto"),
                     ("classic", "rows", "spark"), ("classic", "arrow", "spark"), ("connect", "arrow", "spark")]
            for name, path, placement in cases:
                with flavour(name):
                    prep[f"{name}_{path}_{placement}"] = prepare_rows_per_second(
                        sessions[name], frames[name], spec, 16, placement, path, args.prepare_repeats)
            prep["arrow_over_rows_classic_auto"] = (prep["classic_arrow_auto"]["rows_per_second"]
                                                    / prep["classic_rows_auto"]["rows_per_second"])
            prep["arrow_over_rows_classic_spark"] = (prep["classic_arrow_spark"]["rows_per_second"]
                                                     / prep["classic_rows_spark"]["rows_per_second"])
            result["prepare_fashion_mnist_from_parquet"] = prep
            emit(result, None)

            nets = {}
            if not args.skip_training:
                for label, make in (("averaging", ParameterAveraging), ("sharing", GradientSharing)):
                    run = alternating_epochs(sessions, frames, make, args)
                    for name in sessions:
                        nets.setdefault(name, run[name].pop("_network"))
                    run["master"] = make().to_config()
                    result[f"lenet_{label}"] = run
                    emit({label: run}, None)

            from sparkavg.nn import lenet

            inference = {}
            for name, session in sessions.items():
                with flavour(name):
                    inference[name] = inference_rows_per_second(session, name, tests[name],
                                                                nets.get(name) or lenet(seed=args.seed),
                                                                len(xt), args.repeats)
            result["inference_10k_test_rows"] = inference
        classic.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result["load_average_1min_at_end"] = round(os.getloadavg()[0], 2)
    return emit(result, args.out)


if __name__ == "__main__":
    main()
