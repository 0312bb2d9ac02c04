#!/usr/bin/env python
"""A table with categorical and numeric columns: embeddings + dense layers
in a two-input Graph, trained from a DataFrame by NetworkEstimator in a
pyspark.ml Pipeline (saved, loaded back, then transform()), against the
same Graph trained in this process.

    python examples/tabular_embeddings.py                        # local, averaging, sharing
    python examples/tabular_embeddings.py --masters averaging --session connect
    python examples/tabular_embeddings.py --rows 4000 --epochs 2 --report out.json

The data is synthetic, made here (seeded) with a rule a model can learn:
three categorical columns (``city`` of 200, ``device`` of 12, ``hour`` of
24 values; each value has a hidden effect) and four numeric ones; the
label is 1 when the sum of the categories' effects and a nonlinear score
of the numbers is positive.  The categories become one ``array<long>``
column of ids (each column's ids offset into one shared table), the
numbers one ``array<float>`` column; the Graph's two inputs read them by
name (``featuresCols=["cats", "nums"]``): ids stay integer all the way
to the Embedding.

``--masters`` picks the Spark runs (ParameterAveraging, GradientSharing
or both); the report puts each one's test accuracy beside the
one-process run's, and for sharing the bytes on the wire against sending
every update dense (the run's statistics: ``bytes_sent`` counts what went
over UDP, headers and retransmissions included; ``dense_bytes_equivalent``
what a dense float32 update per message would have been).
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from mnist_example import per_rank_figures, save_report, spark_session  # noqa: E402

from sparkavg.nn import Adam, Dense, Dropout, Embedding, Flatten, Graph, Merge, Output  # noqa: E402

log = logging.getLogger("tabular_embeddings")

#: The categorical columns and their number of values; their ids share one embedding table.
CATEGORIES = {"city": 200, "device": 12, "hour": 24}
NUMERIC = ["x1", "x2", "x3", "x4"]


def make_table(rows: int, seed: int) -> dict:
    """The synthetic table as numpy columns (seeded): categories, numbers, label."""
    rng = np.random.default_rng(seed)
    effects = np.random.default_rng(12345)  # the hidden rule: the same for every split and seed
    table, score = {}, np.zeros(rows)
    for name, size in CATEGORIES.items():
        table[name] = rng.integers(0, size, rows)
        score += effects.normal(0.0, 1.0, size)[table[name]]
    x = rng.standard_normal((rows, len(NUMERIC))).astype(np.float32)
    for j, name in enumerate(NUMERIC):
        table[name] = x[:, j]
    score += 1.5 * x[:, 0] - x[:, 1] + np.tanh(2.0 * x[:, 2] * x[:, 3])
    table["label"] = (score > 0).astype(np.int64)
    return table


def model_inputs(table: dict) -> dict:
    """The Graph's inputs from the table: ``cats`` (n, 3) int64 ids, each
    column offset into one table; ``nums`` (n, 4) float32."""
    offsets = np.cumsum([0] + list(CATEGORIES.values()))[:-1]
    cats = np.stack([table[name] + off for name, off in zip(CATEGORIES, offsets)], axis=1).astype(np.int64)
    nums = np.stack([table[name] for name in NUMERIC], axis=1).astype(np.float32)
    return {"cats": cats, "nums": nums}


def build(seed: int, lr: float = 1e-3) -> Graph:
    """Embeddings of the categories (8 each) merged with a dense layer of the numbers."""
    vocab = sum(CATEGORIES.values())
    return Graph({"cats": (len(CATEGORIES),), "nums": (len(NUMERIC),)},
                 [("embed", Embedding(vocab, 8), "cats"),
                  ("flat", Flatten(), "embed"),
                  ("numeric", Dense(32, activation="relu"), "nums"),
                  ("merge", Merge(), ["flat", "numeric"]),
                  ("hidden", Dense(64, activation="relu"), "merge"),
                  ("drop", Dropout(0.1), "hidden"),
                  ("output", Output(2), "drop")],
                 ["output"], updater=Adam(lr=lr), seed=seed)


def write_parquet(table: dict, folder: str, files: int) -> str:
    """The raw table (one column per category and number) as Parquet files."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(folder, exist_ok=True)
    n = len(table["label"])
    for i, idx in enumerate(np.array_split(np.arange(n), files)):
        pq.write_table(pa.table({k: v[idx] for k, v in table.items()}), os.path.join(folder, f"part-{i:05d}.parquet"))
    return folder


def as_model_columns(df):
    """The DataFrame with the Graph's two input columns: ``cats``
    (array<long>: each category's id offset into the shared table) and
    ``nums`` (array<float>) -- plain DataFrame operations, on either flavour."""
    from pyspark.sql import functions as F

    offset, ids = 0, []
    for name, size in CATEGORIES.items():
        ids.append((F.col(name) + F.lit(offset)).cast("long"))
        offset += size
    return df.select(F.array(*ids).alias("cats"), F.array(*[F.col(c).cast("float") for c in NUMERIC]).alias("nums"),
                     F.col("label"))


def accuracy(net, inputs: dict, y: np.ndarray) -> float:
    return float(np.mean(np.asarray(net.predict(inputs)) == y))


def train_local(args, train: dict, test: dict) -> dict:
    net = build(args.seed, args.lr)
    x, y = model_inputs(train), train["label"]
    t0 = time.time()
    losses = net.fit(x, y, batch_size=args.batch_size, epochs=args.epochs)
    seconds = time.time() - t0
    acc = accuracy(net, model_inputs(test), test["label"])
    log.info("one process: test accuracy %.4f after %d epoch(s) in %.1fs (loss %.4f)", acc, args.epochs, seconds,
             losses[-1])
    return {"test_accuracy": acc, "train_seconds": seconds, "loss": float(losses[-1])}


def make_master(args, kind: str):
    from sparkavg.spark import AdaptiveThreshold, GradientSharing, ParameterAveraging

    if kind == "averaging":
        return ParameterAveraging(batch_size_per_worker=args.batch_size, workers=args.workers, seed=args.seed)
    return GradientSharing(threshold=AdaptiveThreshold(initial=args.threshold), batch_size_per_worker=args.batch_size,
                           workers=args.workers, seed=args.seed)


def train_pipeline(args, spark, kind: str, train_df, test_df, work_dir: str) -> dict:
    """NetworkEstimator in a Pipeline: fit, save, load back, transform the test set."""
    from pyspark.ml import Pipeline, PipelineModel

    from sparkavg.ml import NetworkEstimator

    est = NetworkEstimator(network=build(args.seed, args.lr), master=make_master(args, kind), epochs=args.epochs,
                           featuresCols=["cats", "nums"], labelCol="label")
    t0 = time.time()
    fitted = Pipeline(stages=[est]).fit(train_df)
    fit_seconds = time.time() - t0
    stage = fitted.stages[-1]
    path = os.path.join(work_dir, f"pipeline-{kind}")
    fitted.write().overwrite().save(path)
    loaded = PipelineModel.load(path)
    out = loaded.transform(test_df).select("label", "prediction").toArrow()
    acc = float(np.mean(out.column("label").to_numpy() == out.column("prediction").to_numpy()))
    result = {"test_accuracy": acc, "train_seconds": sum(h["seconds"] for h in stage.history),
              "fit_seconds": fit_seconds, "loss": stage.history[-1]["loss"], "saved_model": path}
    if kind == "averaging":
        result["averaging_frequency"] = [h.get("averaging_frequency") for h in stage.history]
    else:
        c = stage.stats.counters
        result.update({
            "bytes_sent": int(c["bytes_sent"]),
            "payload_bytes_sent": int(c["payload_bytes_sent"]),
            "dense_bytes_equivalent": int(c["dense_bytes_equivalent"]),
            "compression_ratio": c["dense_bytes_equivalent"] / max(c["bytes_sent"], 1),
            "payload_compression_ratio": c["dense_bytes_equivalent"] / max(c["payload_bytes_sent"], 1),
            "messages_sent": int(c["messages_sent"]),
            **per_rank_figures(c, args.workers),
            "mean_entries_per_message": c["entries_sent"] / max(c["messages_sent"], 1),
            "num_params": int(stage.network.num_params),
            "replica_max_abs_diff": max(h["replica_max_abs_diff"] for h in stage.history),
        })
    log.info("%s (%s, Pipeline saved and loaded): test accuracy %.4f, %.1fs training", kind, args.session, acc,
             result["train_seconds"])
    return result


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=40000, help="training rows (default 40000)")
    p.add_argument("--test-rows", type=int, default=10000, help="test rows (default 10000)")
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=32, help="minibatch size (per worker on Spark)")
    p.add_argument("--lr", type=float, default=1e-3, help="Adam's learning rate")
    p.add_argument("--masters", choices=["both", "averaging", "sharing", "none"], default="both",
                   help="the Spark runs beside the one-process run (default both)")
    p.add_argument("--master", default="local[2]", help="Spark master URL (default local[2])")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--threshold", type=float, default=1e-3,
                   help="gradient sharing: initial tau of DL4J's adaptive algorithm (default 1e-3)")
    p.add_argument("--session", choices=["classic", "connect"], default="classic",
                   help="a classic Spark session or Spark Connect (a local Connect server for a local[N] --master)")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--work-dir", default=None, help="where the Parquet table and the saved Pipelines go "
                                                    "(default: a temporary folder; on a cluster, a shared folder)")
    p.add_argument("--report", default=None, help="write a JSON report here")
    args = p.parse_args(argv)
    if args.epochs < 1 or args.rows < 1 or args.test_rows < 1:
        p.error("--epochs, --rows and --test-rows must be >= 1")
    return args


def main(argv=None) -> dict:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    train, test = make_table(args.rows, args.seed), make_table(args.test_rows, args.seed + 1)
    log.info("synthetic table: %d training and %d test rows, %.1f%% positive", args.rows, args.test_rows,
             100.0 * train["label"].mean())
    report = {"rows": args.rows, "test_rows": args.test_rows, "epochs": args.epochs, "batch_size": args.batch_size,
              "workers": args.workers, "session": args.session, "num_params": int(build(args.seed).num_params),
              "local": train_local(args, train, test)}
    kinds = {"both": ["averaging", "sharing"], "none": []}.get(args.masters, [args.masters])
    if kinds:
        spark = spark_session(args.master, "sparkavg-tabular", connect=args.session == "connect")
        tmp = None if args.work_dir else tempfile.TemporaryDirectory(prefix="sparkavg-tabular-")
        work_dir = args.work_dir or tmp.name
        try:
            frames = [as_model_columns(spark.read.parquet(write_parquet(t, os.path.join(work_dir, name),
                                                                          args.workers)))
                      .repartition(args.workers) for name, t in (("train", train), ("test", test))]
            for kind in kinds:
                result = train_pipeline(args, spark, kind, *frames, work_dir)
                result["accuracy_minus_local"] = result["test_accuracy"] - report["local"]["test_accuracy"]
                report[kind] = result
        finally:
            spark.stop()
            if tmp is not None:
                tmp.cleanup()
    lines = [f"one process: {report['local']['test_accuracy']:.4f}"]
    for kind in kinds:
        r = report[kind]
        line = f"{kind}: {r['test_accuracy']:.4f} ({100 * r['accuracy_minus_local']:+.2f} points)"
        if kind == "sharing":
            line += (f"; {r['bytes_sent']:,} bytes on the wire vs {r['dense_bytes_equivalent']:,} dense "
                     f"({r['compression_ratio']:.1f}x less)")
        lines.append(line)
    log.info("test accuracy after %d epoch(s): %s", args.epochs, "; ".join(lines))
    save_report(args.report, report)
    return report


if __name__ == "__main__":
    main()
