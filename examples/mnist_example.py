"""What the MNIST examples share: flags, local and Spark training, the report.

``examples/mnist_lenet.py`` (DL4J's LeNet) and ``examples/mnist_resnet.py``
(a small ResNet as a :class:`sparkavg.nn.Graph`) are this runner with
their model; any model of the contract would do.

``--mode local`` trains in this process, no Spark; ``averaging`` and
``sharing`` train on Spark with ParameterAveraging or GradientSharing.
``--session connect`` runs them on a Spark Connect session (a local
Connect server for a ``local[N]`` master; DataFrames only), ``--api
pipeline`` through ``NetworkEstimator`` in a pyspark.ml ``Pipeline``
whose fitted model is saved, loaded back and used to ``transform`` the
test set.  After every epoch the test set is evaluated; ``--report``
writes JSON (``train_seconds`` counts training only, not data loading or
evaluation).
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time

import numpy as np

from sparkavg.backend import current_device, to_cpu
from sparkavg.data.batching import minibatches
from sparkavg.data.mnist import default_data_dir, load_mnist
from sparkavg.evaluation import Evaluation
from sparkavg.threads import set_threads

log = logging.getLogger("mnist_example")


def averaging_frequency(text: str):
    """``--averaging-frequency``: ``"auto"`` or an int >= 1."""
    if text == "auto":
        return text
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an int >= 1 or 'auto', got {text!r}")
    return value


def parse_args(argv=None, description=__doc__, add_flags=None):
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    if add_flags is not None:
        add_flags(p)  # an example's own flags
    p.add_argument("--data-dir", default=None,
                   help="folder with train-/t10k- images/labels IDX files, .gz or raw "
                        "(default: $SPARKAVG_DATA_DIR or /usr/share/datasets/fashion-mnist)")
    p.add_argument("--mode", choices=["local", "averaging", "sharing"], default="averaging")
    p.add_argument("--master", default="local[2]", help="Spark master URL (default local[2])")
    p.add_argument("--workers", type=int, default=2, help="Spark workers per round (default 2)")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=None,
                   help="minibatch size (per worker on Spark); default 64 local, 32 on Spark")
    p.add_argument("--averaging-frequency", type=averaging_frequency, default="auto",
                   help="minibatches per worker between averagings: an int, or 'auto' (default: chosen every "
                        "epoch from the measured round and iteration costs)")
    p.add_argument("--threshold", type=float, default=1e-2,
                   help="gradient sharing: initial tau of DL4J's adaptive algorithm (default 1e-2: Adam's steps "
                        "are about lr=1e-3 per parameter, so tau must be several steps to compress)")
    p.add_argument("--fixed-threshold", action="store_true", help="gradient sharing: keep tau fixed")
    p.add_argument("--simulate-udp-loss", type=float, default=0.0,
                   help="sharing, fault injection for demos: the transport drops this fraction of datagrams and "
                        "duplicates and reorders half as many (the test hook sparkavg.test.udp_loss; never in "
                        "production)")
    p.add_argument("--threads", type=int, default=None,
                   help="BLAS threads (local mode; default: all cores). Spark workers use their task's cores")
    p.add_argument("--device", choices=["auto", "cpu", "gpu"], default="auto",
                   help="Spark modes: the masters' device (auto: each task's Spark-assigned GPU when it has one "
                        "and CuPy works, else the CPU; gpu: an error without one; cpu). --mode local: gpu trains "
                        "on the current CUDA device with CuPy (an error when unavailable), auto and cpu on the CPU")
    p.add_argument("--seed", type=int, default=123)
    p.add_argument("--limit-train", type=int, default=None, help="use only the first N training examples")
    p.add_argument("--limit-test", type=int, default=None, help="use only the first N test examples")
    p.add_argument("--report", default=None, help="write a JSON report here")
    p.add_argument("--stats-html", default=None, help="write the training-stats HTML page here (Spark modes)")
    p.add_argument("--checkpoint-dir", default=None, help="Spark modes: checkpoint after every epoch")
    p.add_argument("--resume-from", default=None, help="Spark modes: resume from this checkpoint folder")
    p.add_argument("--mlflow", nargs="?", const="", default=None, metavar="TRACKING_URI",
                   help="Spark modes: log the run to MLflow (sparkavg[mlflow]); optional tracking URI "
                        "(default: $MLFLOW_TRACKING_URI / MLflow's own)")
    p.add_argument("--tensorboard", default=None, metavar="LOG_DIR",
                   help="Spark modes: write TensorBoard event files here (sparkavg[tensorboard])")
    p.add_argument("--session", choices=["classic", "connect"], default="classic",
                   help="Spark modes: a classic session, or Spark Connect (a local Connect server for a local[N] "
                        "--master, else --master is the sc:// URL); Connect trains from DataFrames")
    p.add_argument("--api", choices=["trainer", "pipeline"], default="trainer",
                   help="Spark modes: SparkTrainer, or NetworkEstimator in a pyspark.ml Pipeline (fitted, saved, "
                        "loaded back, then transform() on the test set)")
    p.add_argument("--work-dir", default=None,
                   help="where DataFrame sources and the saved Pipeline model go (default: a temporary folder; on "
                        "a cluster, a folder every host reads)")
    args = p.parse_args(argv)
    if args.epochs < 1:
        p.error(f"--epochs must be >= 1, got {args.epochs}")
    if args.batch_size is None:
        args.batch_size = 64 if args.mode == "local" else 32
    return args


def evaluate_local(net, x, y, batch_size=1000) -> Evaluation:
    ev = Evaluation(10)
    for start in range(0, len(x), batch_size):
        ev.eval(y[start:start + batch_size], to_cpu(net.output(x[start:start + batch_size])))
    return ev


def train_local(args, net, train, test):
    set_threads(args.threads or os.cpu_count() or 1)
    if args.device == "gpu":
        try:
            net.to_gpu()
        except RuntimeError as exc:  # CuPy or CUDA unavailable: the backend says how to get it
            raise SystemExit(f"--device gpu: {exc}") from None
    device = "cpu" if net.xp is np else f"gpu:{current_device()}"
    log.info("training on %s", device)
    x, y = train
    detail, train_seconds, examples = [], 0.0, 0
    for epoch in range(args.epochs):
        t0, last_log, seen, loss_sum = time.time(), time.time(), 0, 0.0
        batches = -(-len(x) // args.batch_size)
        for i, (xb, yb) in enumerate(minibatches(x, y, args.batch_size, shuffle=True, seed=args.seed + epoch)):
            loss_sum += net.fit_batch(xb, yb) * len(xb)
            seen += len(xb)
            if time.time() - last_log > 5:
                last_log = time.time()
                log.info("epoch %d: batch %d/%d (%.0f%%), loss %.4f, %.0f ex/s", epoch + 1, i + 1, batches,
                         100.0 * (i + 1) / batches, loss_sum / seen, seen / (last_log - t0))
        seconds = time.time() - t0
        train_seconds += seconds
        examples += seen
        ev = evaluate_local(net, *test)
        detail.append({"epoch": epoch + 1, "accuracy": ev.accuracy(), "seconds": seconds,
                       "examples_per_second": seen / seconds, "loss": loss_sum / seen})
        log.info("epoch %d: test accuracy %.4f, loss %.4f, %.1fs, %.0f examples/s", epoch + 1, ev.accuracy(),
                 loss_sum / seen, seconds, seen / seconds)
    return detail, train_seconds, examples, ev, {"device": device}


def as_minibatch_rdd(sc, x, y, slices, rows_per_record=500):
    """A cached RDD of (x, y) chunks, materialised now (not inside timed epochs).

    Chunks mean far fewer Python objects than one record per example.  The
    arrays travel once, by broadcast; the tasks carry only chunk numbers (a
    ``parallelize`` of the chunks themselves would put megabytes into every
    task, which Spark warns about), dealt to the same partitions."""
    arrays = sc.broadcast((x, y))
    starts = list(range(0, len(x), rows_per_record))

    def chunk(i):
        bx, by = arrays.value
        return bx[i:i + rows_per_record], by[i:i + rows_per_record]

    rdd = sc.parallelize(starts, slices).map(chunk).cache()
    rdd.count()
    return rdd


def save_report(path, report: dict) -> None:
    """Write an example's JSON report (nothing without a path)."""
    if path:
        with open(path, "w") as fh:
            json.dump(report, fh, indent=2)
        log.info("report written to %s", path)


def spark_session(master: str, app: str, connect: bool = False):
    """A SparkSession for the examples and the benchmarks: sparkavg's
    recommended settings (see sparkavg.spark.recommended_conf).  With
    ``connect``, a Spark Connect session: ``builder.remote(master)`` starts
    a local Connect server for a ``local[N]`` master."""
    from pyspark.sql import SparkSession

    from sparkavg.spark import recommended_conf

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.remote(master) if connect else SparkSession.builder.master(master)
    builder = builder.appName(app).config("spark.driver.memory", "4g")
    for key, value in recommended_conf(master).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    if not connect:
        spark.sparkContext.setLogLevel("WARN")
    return spark


def write_parquet(x, y, folder: str, files: int) -> str:
    """Images as Parquet: ``features`` array<float> (flattened), ``label`` int."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(folder, exist_ok=True)
    flat = x.reshape(len(x), -1).astype(np.float32)
    width = flat.shape[1]
    for i, idx in enumerate(np.array_split(np.arange(len(x)), files)):
        values = pa.array(flat[idx].ravel())
        features = pa.ListArray.from_arrays(pa.array(np.arange(0, len(idx) * width + 1, width, dtype=np.int32)),
                                            values)
        table = pa.table({"features": features, "label": pa.array(y[idx].astype(np.int32))})
        pq.write_table(table, os.path.join(folder, f"part-{i:05d}.parquet"))
    return folder


def make_master(args):
    from sparkavg.spark import AdaptiveThreshold, FixedThreshold, GradientSharing, ParameterAveraging

    if args.mode == "averaging":
        return ParameterAveraging(batch_size_per_worker=args.batch_size, workers=args.workers,
                                  averaging_frequency=args.averaging_frequency, seed=args.seed, device=args.device)
    threshold = FixedThreshold(args.threshold) if args.fixed_threshold else AdaptiveThreshold(initial=args.threshold)
    return GradientSharing(threshold=threshold, batch_size_per_worker=args.batch_size, workers=args.workers,
                           seed=args.seed, device=args.device)


def simulate_udp_loss(spark, args) -> None:
    """``--simulate-udp-loss``: fault injection for demos, through the
    transport's test hook ``sparkavg.test.udp_loss`` (read per job: a local
    property of a classic session, a session conf on Spark Connect)."""
    if args.mode != "sharing" or not args.simulate_udp_loss:
        return
    from sparkavg.spark.executor.hooks import UDP_LOSS

    if args.session == "connect":
        spark.conf.set(UDP_LOSS, str(args.simulate_udp_loss))
    else:
        spark.sparkContext.setLocalProperty(UDP_LOSS, str(args.simulate_udp_loss))
    log.warning("fault injection: %.0f%% of the datagrams dropped (and half as many duplicated and reordered)",
                100 * args.simulate_udp_loss)


def make_listeners(args, name: str) -> list:
    """The listeners ``--mlflow`` and ``--tensorboard`` ask for."""
    listeners = []
    if args.mlflow is not None:
        from sparkavg.listeners import MLflowListener

        listeners.append(MLflowListener(args.mlflow or None, run_name=f"{name}-{args.mode}"))
    if args.tensorboard:
        from sparkavg.listeners import TensorBoardListener

        listeners.append(TensorBoardListener(args.tensorboard))
    return listeners


def spark_data(args, spark, train, test, work_dir):
    """The training and test data as the chosen session and API take them:
    cached RDDs of minibatch chunks (classic SparkTrainer), else DataFrames
    read from Parquet written once."""
    if args.session == "classic" and args.api == "trainer":
        sc = spark.sparkContext
        return as_minibatch_rdd(sc, *train, slices=args.workers), as_minibatch_rdd(sc, *test, slices=args.workers)
    frames = []
    for name, (x, y) in (("train", train), ("test", test)):
        folder = write_parquet(x, y, os.path.join(work_dir, name), files=args.workers)
        frames.append(spark.read.parquet(folder).repartition(args.workers))
    return frames


def per_rank_figures(counters, workers: int) -> dict:
    """A gradient-sharing fit's per-rank figures from its counters: the mean
    over ranks of the messages a rank applied per iteration (its own
    included; one total under ``Topology.TREE``) and the bytes a rank received."""
    iterations = int(counters.get("iterations", 0))
    return {"messages_applied_per_iteration": int(counters.get("messages_applied", 0)) / iterations
            if iterations else None,
            "bytes_received_per_rank": int(counters.get("bytes_received", 0)) / max(1, workers)}


def stats_extra(args, stats, history) -> dict:
    """The report's Spark fields from a fit's stats and history."""
    extra = {"stats_summary": stats.summary(),  # device: where the workers trained (the last decision)
             "device": next((d["value"] for d in reversed(stats.decisions) if d["name"] == "device"), None)}
    if args.mode == "averaging":  # the frequency each epoch used (chosen per epoch with "auto")
        extra["averaging_frequency"] = [h.get("averaging_frequency") for h in history]
    if args.mode == "sharing":
        c = stats.counters
        extra.update({
            "bytes_sent": int(c.get("bytes_sent", 0)),
            "payload_bytes_sent": int(c.get("payload_bytes_sent", 0)),
            "dense_bytes_equivalent": int(c.get("dense_bytes_equivalent", 0)),
            "compression_ratio": stats.compression_ratio,
            "replica_max_abs_diff": max(h["replica_max_abs_diff"] for h in history),
            "datagrams_retransmitted": int(c.get("datagrams_retransmitted", 0)),
            "datagrams_rejected": int(c.get("datagrams_rejected", 0)),
            "messages_sent": int(c.get("messages_sent", 0)),
            **per_rank_figures(c, args.workers),
            "simulated_loss": args.simulate_udp_loss,
            "threshold": args.threshold,
        })
    return extra


def _epochs_detail(history):
    return [{k: h[k] for k in ("epoch", "accuracy", "seconds", "examples_per_second", "loss") if k in h}
            for h in history]


def train_spark(args, net, train, test):
    import tempfile

    from sparkavg.spark import SparkTrainer

    spark = spark_session(args.master, f"sparkavg-{args.mode}", connect=args.session == "connect")
    for path in args.py_files:  # the example's own module, which executors import its model's code from
        if args.session == "connect":
            spark.addArtifacts(path, pyfile=True)
        else:
            spark.sparkContext.addPyFile(path)
    simulate_udp_loss(spark, args)  # the session ends with the run: the hook goes with it
    tmp = None if args.work_dir else tempfile.TemporaryDirectory(prefix="sparkavg-example-")
    work_dir = args.work_dir or tmp.name
    try:
        train_data, test_data = spark_data(args, spark, train, test, work_dir)
        if args.api == "pipeline":
            return train_pipeline(args, net, spark, train_data, test_data, work_dir)
        trainer = SparkTrainer(spark, net, make_master(args), checkpoint_dir=args.checkpoint_dir,
                               listeners=make_listeners(args, args.name))
        trainer.fit(train_data, epochs=args.epochs, resume_from=args.resume_from, validation_data=test_data)
        trainer.close()
        ev = trainer.evaluate(test_data)
        train_seconds = sum(h["seconds"] for h in trainer.history[-args.epochs:])
        examples = sum(h["examples"] for h in trainer.history[-args.epochs:])
        if args.stats_html:
            trainer.stats.to_html(args.stats_html)
            log.info("training stats page: %s", args.stats_html)
        extra = {"session": args.session, "api": args.api, "listener_seconds": trainer.listener_seconds,
                 **stats_extra(args, trainer.stats, trainer.history)}
        return _epochs_detail(trainer.history), train_seconds, examples, ev, extra
    finally:
        spark.stop()
        if tmp is not None:
            tmp.cleanup()


def train_pipeline(args, net, spark, train_df, test_df, work_dir):
    """NetworkEstimator in a Pipeline: fit, save, load back, transform the test set."""
    from pyspark.ml import Pipeline, PipelineModel

    from sparkavg.ml import NetworkEstimator

    if args.checkpoint_dir or args.resume_from:
        raise SystemExit("--api pipeline: checkpoints are a SparkTrainer option (use --api trainer)")
    est = NetworkEstimator(network=net, master=make_master(args), epochs=args.epochs, featuresCol="features",
                           labelCol="label", listeners=make_listeners(args, args.name))
    fitted = Pipeline(stages=[est]).fit(train_df)
    history = fitted.stages[-1].history
    path = os.path.join(work_dir, "pipeline-model")
    fitted.write().overwrite().save(path)
    loaded = PipelineModel.load(path)
    log.info("pipeline model saved to %s and loaded back", path)
    rows = loaded.transform(test_df).select("label", "probability").toPandas()
    ev = Evaluation(10)
    ev.eval(rows["label"].to_numpy(np.int64), np.stack(rows["probability"].to_numpy()).astype(np.float32))
    stats = fitted.stages[-1].stats
    train_seconds = sum(h["seconds"] for h in history)
    examples = sum(h["examples"] for h in history)
    extra = {"session": args.session, "api": args.api, "saved_model": path,
             **(stats_extra(args, stats, history) if stats is not None else {})}
    return _epochs_detail(history), train_seconds, examples, ev, extra


def main(build_model, argv=None, description=__doc__, name="model", add_flags=None, finish=None,
         py_files=()) -> dict:
    """Run the example ``name`` for ``build_model(num_classes=..., seed=..., input_shape=...)``.

    An example may add flags (``add_flags(parser)``), act on the trained
    model before the report is written (``finish(args, model, report)``) and
    name Python files the Spark executors import its code from (``py_files``:
    ``SparkContext.addPyFile``, or ``addArtifacts`` on Connect)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = parse_args(argv, description, add_flags)
    args.name, args.py_files = name, list(py_files)
    data_dir = args.data_dir or default_data_dir()
    t_load = time.time()
    train = tuple(load_mnist(data_dir, "train", limit=args.limit_train))
    test = tuple(load_mnist(data_dir, "test", limit=args.limit_test))
    log.info("loaded %d training and %d test examples from %s in %.1fs", len(train[0]), len(test[0]), data_dir,
             time.time() - t_load)
    net = build_model(num_classes=10, seed=args.seed, input_shape=tuple(train[0].shape[1:]))
    if args.mode == "local":
        detail, train_seconds, examples, ev, extra = train_local(args, net, train, test)
    else:
        detail, train_seconds, examples, ev, extra = train_spark(args, net, train, test)
    report = {
        "mode": args.mode,
        "epochs": args.epochs,
        "workers": 1 if args.mode == "local" else args.workers,
        "batch_size": args.batch_size,
        "data_dir": str(data_dir),
        "train_examples": int(len(train[0])),
        "test_examples": int(len(test[0])),
        "test_accuracy": ev.accuracy(),
        "test_f1": ev.f1(),
        "train_seconds": train_seconds,
        "examples_per_second": examples / train_seconds if train_seconds > 0 else None,
        "epochs_detail": detail,
        **extra,
    }
    if finish is not None:
        finish(args, net, report)
    log.info("\n%s", ev.stats())
    log.info("test accuracy %.4f after %d epoch(s), %.1fs training, %.0f examples/s", report["test_accuracy"],
             args.epochs, train_seconds, report["examples_per_second"] or 0)
    if args.report:
        with open(args.report, "w") as fh:
            json.dump(report, fh, indent=2)
        log.info("report written to %s", args.report)
    return report

