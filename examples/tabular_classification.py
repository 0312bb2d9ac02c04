#!/usr/bin/env python
"""An imbalanced binary problem from a DataFrame, trained the way people
train: a sigmoid output with binary cross-entropy, class weights, a cosine
learning-rate schedule with warm-up, early stopping that restores the best
epoch, AUC and PR-AUC through Spark's own evaluator, a Pipeline tuned by
CrossValidator, saved and loaded back -- beside the same model trained in
this process.

    python examples/tabular_classification.py                       # local, averaging, sharing
    python examples/tabular_classification.py --mode averaging --session connect
    python examples/tabular_classification.py --rows 8000 --epochs 4 --no-tune --report out.json

The data is synthetic, made here (seeded): 16 numeric columns, about 8% of
rows positive; the label is 1 when a nonlinear score of the columns is
high.  ``--weighting class`` (the default) weighs the positive class by the
ratio of negatives to positives (``Output(1, loss="bce",
class_weights=(1, w))``); ``none`` trains unweighted.

Every run holds out ``--validation-share`` of its training rows (the
``is_val`` column, ``validationIndicatorCol``) for early stopping on the
validation AUC; the test rows are never seen before the end.  The report
gives each run's test AUC and PR-AUC -- sparkavg's ``ROC``, Spark's
``BinaryClassificationEvaluator`` on the loaded Pipeline's output (its
AUC agrees; its PR area is the trapezoid's, not the average precision),
and scikit-learn's on the same probabilities when it is installed -- and
the AUC gap to the one-process run.
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

from mnist_example import save_report, spark_session  # noqa: E402

from sparkavg.evaluation import ROC  # noqa: E402
from sparkavg.nn import Adam, CosineSchedule, Dense, Network, Output  # noqa: E402

log = logging.getLogger("tabular_classification")

FEATURES = 16


def _rule():
    """The hidden rule's weights and threshold: the same for every split and seed."""
    rule = np.random.default_rng(2024)
    w1, w2 = rule.normal(0, 1, (FEATURES, 8)), rule.normal(0, 1, 8)
    reference = rule.standard_normal((50000, FEATURES))
    return w1, w2, float(np.quantile(_score(reference, w1, w2), 0.92))


def _score(x, w1, w2):
    return np.tanh(x @ w1) @ w2 + 0.5 * x[:, 0] * x[:, 1]


def make_table(rows: int, seed: int) -> tuple:
    """``(x (rows, 16) float32, y (rows,) 0/1)``, about 8% of labels 1 (seeded)."""
    rng = np.random.default_rng(seed)
    w1, w2, threshold = _rule()
    x = rng.standard_normal((rows, FEATURES)).astype(np.float32)
    noisy = _score(x, w1, w2) + 0.3 * rng.standard_normal(rows)
    return x, (noisy > threshold).astype(np.int64)


def build(args, positive_share: float, steps: int, seed: int) -> Network:
    """16 -> 64 -> 32 -> 1 sigmoid, Adam on a cosine schedule with warm-up over ``steps`` iterations."""
    weights = None
    if args.weighting == "class":
        weights = (1.0, (1.0 - positive_share) / positive_share)
    schedule = CosineSchedule(peak=args.lr, steps=max(2, steps), warmup=max(1, steps // 20), floor=args.lr / 50)
    return Network((FEATURES,), [Dense(64, activation="relu"), Dense(32, activation="relu"),
                                 Output(1, loss="bce", class_weights=weights)],
                   updater=Adam(lr=schedule), seed=seed)


def aucs(y: np.ndarray, p: np.ndarray) -> dict:
    roc = ROC(2).eval(y, p)
    return {"auc": float(roc.auc()), "pr_auc": float(roc.pr_auc())}


def train_local(args, x, y, val, xt, yt) -> dict:
    """One process: epochs with the same early-stopping rule (patience on
    the validation AUC), the best epoch restored."""
    fit = ~val
    batch = args.batch_size * args.workers  # the same examples per update as the Spark runs
    steps = args.epochs * -(-int(fit.sum()) // batch)
    net = build(args, float(y[fit].mean()), steps, args.seed)
    best, best_auc, waited, t0 = None, -1.0, 0, time.time()
    history = []
    for epoch in range(args.epochs):
        loss = net.fit(x[fit], y[fit].astype(np.float32), batch_size=batch, epochs=1)[0]
        val_auc = aucs(y[val], net.output(x[val]))["auc"]
        history.append({"epoch": epoch + 1, "loss": loss, "val_auc": val_auc})
        if val_auc > best_auc:
            best, best_auc, waited = net.state, val_auc, 0
            best = {k: v.copy() for k, v in best.items()}
        else:
            waited += 1
            if waited > args.patience:
                break
    net.load_state(best)
    result = {**aucs(yt, net.output(xt)[:, 0]), "train_seconds": time.time() - t0, "epochs_run": len(history),
              "best_epoch": 1 + int(np.argmax([h["val_auc"] for h in history])), "history": history}
    log.info("one process: test AUC %.4f, PR-AUC %.4f (best epoch %d of %d)", result["auc"], result["pr_auc"],
             result["best_epoch"], result["epochs_run"])
    return result


def make_master(args, kind: str):
    from sparkavg.spark import GradientSharing, ParameterAveraging

    if kind == "averaging":
        return ParameterAveraging(batch_size_per_worker=args.batch_size, workers=args.workers, seed=args.seed)
    return GradientSharing(batch_size_per_worker=args.batch_size, workers=args.workers, seed=args.seed)


def train_pipeline(args, spark, kind: str, train_df, test_df, positive_share: float, fit_rows: int,
                   work_dir: str) -> dict:
    """NetworkEstimator in a Pipeline, its learning rate tuned by
    CrossValidator on the training rows (unless ``--no-tune``), early
    stopping on the validation rows; saved, loaded back, and scored on the
    test rows by Spark's evaluator."""
    from pyspark.ml import Pipeline, PipelineModel
    from pyspark.ml.evaluation import BinaryClassificationEvaluator
    from pyspark.ml.tuning import CrossValidator, ParamGridBuilder

    from sparkavg.fitting import EarlyStopping
    from sparkavg.ml import NetworkEstimator

    steps = args.epochs * -(-fit_rows // (args.batch_size * args.workers))
    est = NetworkEstimator(network=build(args, positive_share, steps, args.seed), master=make_master(args, kind),
                           epochs=args.epochs, featuresCol="features", labelCol="label",
                           validationIndicatorCol="is_val", metrics=["auc", "pr_auc"],
                           earlyStopping=EarlyStopping(monitor="val_auc", patience=args.patience, restore_best=True))
    evaluator = BinaryClassificationEvaluator(metricName="areaUnderROC", numBins=0)  # 0: every score, not bins
    stage = est
    if args.tune:
        grid = ParamGridBuilder().addGrid(est.learningRate, [args.lr / 3, args.lr]).build()
        stage = CrossValidator(estimator=est, estimatorParamMaps=grid, evaluator=evaluator, numFolds=2,
                               seed=args.seed)
    t0 = time.time()
    fitted = Pipeline(stages=[stage]).fit(train_df)
    fit_seconds = time.time() - t0
    path = os.path.join(work_dir, f"pipeline-{kind}")
    fitted.write().overwrite().save(path)
    loaded = PipelineModel.load(path)
    out = loaded.transform(test_df).cache()
    result = {"auc_spark": evaluator.evaluate(out),
              "pr_auc_spark": BinaryClassificationEvaluator(metricName="areaUnderPR", numBins=0).evaluate(out),
              "fit_seconds": fit_seconds, "saved_model": path}
    model = fitted.stages[-1]
    if args.tune:
        result["cv_auc"] = [float(m) for m in model.avgMetrics]
        model = model.bestModel
    result.update({"best_epoch": model.best_epoch, "epochs_run": len(model.history),
                   "learning_rate_chosen": model.history[0].get("learning_rate"),
                   "history": [{k: h.get(k) for k in ("epoch", "loss", "val_loss", "val_auc", "val_pr_auc")}
                               for h in model.history]})
    from pyspark.ml.functions import vector_to_array
    from pyspark.sql import functions as F

    rows = out.select("label", F.element_at(vector_to_array("probability"), 2).alias("p")).toArrow()
    labels, p = rows.column("label").to_numpy(), rows.column("p").to_numpy()
    result.update(aucs(labels, p))
    try:
        from sklearn.metrics import average_precision_score, roc_auc_score

        result["auc_sklearn"] = float(roc_auc_score(labels, p))
        result["pr_auc_sklearn"] = float(average_precision_score(labels, p))
    except ImportError:
        pass
    out.unpersist()
    log.info("%s (%s, Pipeline tuned, saved and loaded): test AUC %.4f (Spark's evaluator %.4f), PR-AUC %.4f, "
             "best epoch %d of %d", kind, args.session, result["auc"], result["auc_spark"], result["pr_auc"],
             result["best_epoch"], result["epochs_run"])
    return result


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=40000, help="training rows, validation share included (default 40000)")
    p.add_argument("--test-rows", type=int, default=10000)
    p.add_argument("--validation-share", type=float, default=0.2)
    p.add_argument("--epochs", type=int, default=10, help="at most this many epochs (early stopping may end sooner)")
    p.add_argument("--patience", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=64, help="minibatch size per worker")
    p.add_argument("--lr", type=float, default=3e-3, help="Adam's peak learning rate")
    p.add_argument("--weighting", choices=["class", "none"], default="class")
    p.add_argument("--tune", action=argparse.BooleanOptionalAction, default=True,
                   help="tune the learning rate with CrossValidator (2 folds x 2 rates; default on)")
    p.add_argument("--mode", choices=["all", "local", "averaging", "sharing"], default="all")
    p.add_argument("--master", default="local[2]", help="Spark master URL (default local[2])")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--session", choices=["classic", "connect"], default="classic")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--work-dir", default=None, help="where the saved Pipelines go (default: a temporary folder)")
    p.add_argument("--report", default=None, help="write a JSON report here")
    args = p.parse_args(argv)
    if args.epochs < 1 or args.rows < 10 or args.test_rows < 10 or not 0 < args.validation_share < 1:
        p.error("--epochs >= 1, --rows and --test-rows >= 10 and 0 < --validation-share < 1")
    return args


def main(argv=None) -> dict:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    x, y = make_table(args.rows, args.seed)
    xt, yt = make_table(args.test_rows, args.seed + 1)
    val = np.random.default_rng(args.seed).random(args.rows) < args.validation_share
    share = float(y[~val].mean())
    log.info("synthetic table: %d training rows (%d for validation), %d test rows; %.1f%% positive", args.rows,
             int(val.sum()), args.test_rows, 100 * share)
    report = {"rows": args.rows, "test_rows": args.test_rows, "positive_share": share, "epochs": args.epochs,
              "batch_size": args.batch_size, "workers": args.workers, "session": args.session,
              "weighting": args.weighting, "tuned": args.tune}
    if args.mode in ("all", "local"):
        report["local"] = train_local(args, x, y, val, xt, yt)
    kinds = ["averaging", "sharing"] if args.mode == "all" else [args.mode] if args.mode != "local" else []
    if kinds:
        spark = spark_session(args.master, "sparkavg-tabular-classification", connect=args.session == "connect")
        tmp = None if args.work_dir else tempfile.TemporaryDirectory(prefix="sparkavg-tabular-")
        work_dir = args.work_dir or tmp.name
        try:
            train_df = spark.createDataFrame(
                [(r.tolist(), float(t), bool(v)) for r, t, v in zip(x, y, val)],
                "features array<float>, label double, is_val boolean").repartition(args.workers)
            test_df = spark.createDataFrame([(r.tolist(), float(t)) for r, t in zip(xt, yt)],
                                            "features array<float>, label double").repartition(args.workers)
            for kind in kinds:
                result = train_pipeline(args, spark, kind, train_df, test_df, share, int((~val).sum()), work_dir)
                if "local" in report:
                    result["auc_minus_local_points"] = 100 * (result["auc"] - report["local"]["auc"])
                report[kind] = result
        finally:
            spark.stop()
            if tmp is not None:
                tmp.cleanup()
    save_report(args.report, report)
    return report


if __name__ == "__main__":
    main()
