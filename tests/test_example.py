"""The example everyone runs, as a user runs it: a subprocess, real data."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "mnist_lenet.py"
RESNET = EXAMPLE.with_name("mnist_resnet.py")
LSTM = EXAMPLE.with_name("mnist_lstm.py")
REPORT_KEYS = {"mode", "epochs", "workers", "test_accuracy", "train_seconds", "examples_per_second", "epochs_detail"}
SHARING_KEYS = {"bytes_sent", "dense_bytes_equivalent", "compression_ratio", "replica_max_abs_diff",
                "datagrams_retransmitted", "datagrams_rejected", "messages_applied_per_iteration",
                "bytes_received_per_rank"}


def run_example(tmp_path, *args, timeout=600, example=EXAMPLE):
    report = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, str(example), *args, "--report", str(report)],
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(report.read_text()), proc.stderr


@pytest.mark.slow
def test_local_mode_learns_fashion_mnist_subset(tmp_path, fashion_dir):
    report, log = run_example(tmp_path, "--mode", "local", "--data-dir", str(fashion_dir), "--epochs", "1",
                              "--limit-train", "4000", "--limit-test", "1000", "--threads", "2")
    assert REPORT_KEYS <= report.keys()
    assert report["mode"] == "local" and report["train_examples"] == 4000
    assert report["test_accuracy"] > 0.6  # chance is 0.1
    assert len(report["epochs_detail"]) == 1 and report["epochs_detail"][0]["seconds"] > 0
    assert "test accuracy" in log


def test_bad_data_dir_is_named(tmp_path):
    proc = subprocess.run([sys.executable, str(EXAMPLE), "--mode", "local", "--data-dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert str(tmp_path) in proc.stderr and "train-images" in proc.stderr


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.parametrize("mode", ["averaging", "sharing"])
def test_spark_modes_on_local2(tmp_path, fashion_dir, mode, monkeypatch):
    html = tmp_path / "stats.html"
    # Averaging also reports to MLflow (a file store here) and TensorBoard, as a user would ask for them.
    listen = ["--mlflow", (tmp_path / "mlruns").as_uri(), "--tensorboard", str(tmp_path / "tb")]
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    # Averaging runs 2 epochs of 1500 (the same examples as sharing's 1 of 3000): a frequency for each epoch.
    epochs, limit = ("2", "1500") if mode == "averaging" else ("1", "3000")
    report, log = run_example(tmp_path, "--mode", mode, "--data-dir", str(fashion_dir), "--epochs", epochs,
                              "--limit-train", limit, "--limit-test", "1000", "--master", "local[2]",
                              "--workers", "2", "--stats-html", str(html), *(listen if mode == "averaging" else []))
    assert REPORT_KEYS <= report.keys() and report["workers"] == 2
    if mode == "averaging":
        import mlflow

        runs = mlflow.tracking.MlflowClient((tmp_path / "mlruns").as_uri()).search_runs(["0"])
        assert [(r.info.run_name, r.info.status) for r in runs] == [("lenet-averaging", "FINISHED")]
        assert runs[0].data.metrics["loss"] == pytest.approx(report["epochs_detail"][-1]["loss"])
        freq = report["averaging_frequency"]  # the report carries the frequency of each epoch
        assert isinstance(freq, list) and len(freq) == 2 and all(isinstance(f, int) and 1 <= f <= 400 for f in freq)
        assert "averaging_frequency" in log  # the choice is logged with its reason
        assert len(list((tmp_path / "tb").glob("events.out.tfevents.*"))) == 1
        assert report["listener_seconds"]["epoch_end"] > 0
    page = html.read_text()
    assert "<svg" in page and "http://" not in page and "https://" not in page  # self-contained timeline
    assert report["test_accuracy"] > 0.5
    assert "very large size" not in log  # the data ships once by broadcast, not inside every task
    if mode == "sharing":
        assert SHARING_KEYS <= report.keys()
        assert report["compression_ratio"] > 10 and report["replica_max_abs_diff"] < 1e-4
        # 2 workers share PLAIN: a rank applies its own message and its peer's, when each sent one
        assert 0.5 < report["messages_applied_per_iteration"] <= 2.0
        assert 0 < report["bytes_received_per_rank"] < report["bytes_sent"]


@pytest.mark.slow
def test_resnet_example_learns_locally(tmp_path, fashion_dir):
    report, log = run_example(tmp_path, "--mode", "local", "--data-dir", str(fashion_dir), "--epochs", "1",
                              "--limit-train", "3000", "--limit-test", "1000", "--threads", "2", example=RESNET)
    assert REPORT_KEYS <= report.keys() and report["train_examples"] == 3000
    assert report["test_accuracy"] > 0.6


@pytest.mark.slow
@pytest.mark.spark
def test_resnet_example_through_a_pipeline_saved_and_loaded(tmp_path, fashion_dir):
    report, log = run_example(tmp_path, "--mode", "averaging", "--api", "pipeline", "--data-dir", str(fashion_dir),
                              "--epochs", "1", "--limit-train", "1500", "--limit-test", "500", "--work-dir",
                              str(tmp_path / "work"), example=RESNET)
    assert REPORT_KEYS <= report.keys() and report["api"] == "pipeline"
    assert (tmp_path / "work" / "pipeline-model" / "stages").is_dir()  # the fitted Pipeline was saved
    assert "loaded back" in log
    assert report["test_accuracy"] > 0.4  # from the loaded model's transform(); chance is 0.1


@pytest.mark.slow
def test_lstm_example_learns_locally(tmp_path, fashion_dir):
    report, _ = run_example(tmp_path, "--mode", "local", "--data-dir", str(fashion_dir), "--epochs", "1",
                            "--limit-train", "3000", "--limit-test", "1000", "--threads", "1", example=LSTM)
    assert REPORT_KEYS <= report.keys() and report["train_examples"] == 3000
    assert report["test_accuracy"] > 0.55  # 0.70 measured; chance is 0.1


@pytest.mark.slow
@pytest.mark.spark
def test_lstm_example_averages_on_local2(tmp_path, fashion_dir):
    """The recurrent layers travel to executors by their configs and train there."""
    report, _ = run_example(tmp_path, "--mode", "averaging", "--data-dir", str(fashion_dir), "--epochs", "1",
                            "--limit-train", "2000", "--limit-test", "500", "--master", "local[2]",
                            "--workers", "2", example=LSTM)
    assert REPORT_KEYS <= report.keys() and report["workers"] == 2
    assert report["test_accuracy"] > 0.3  # chance is 0.1


TABULAR = EXAMPLE.with_name("tabular_embeddings.py")


def test_tabular_example_learns_in_one_process(tmp_path):
    report, log = run_example(tmp_path, "--masters", "none", "--rows", "3000", "--test-rows", "1000", "--epochs", "3",
                              example=TABULAR)
    assert report["rows"] == 3000 and report["local"]["test_accuracy"] > 0.85  # chance is 0.5
    assert "one process:" in log


@pytest.mark.slow
@pytest.mark.spark
def test_tabular_example_with_both_masters_on_local2(tmp_path):
    report, log = run_example(tmp_path, "--rows", "3000", "--test-rows", "1000", "--epochs", "3", "--master",
                              "local[2]", example=TABULAR)
    for kind in ("averaging", "sharing"):
        assert report[kind]["test_accuracy"] > 0.75 and os.path.basename(report[kind]["saved_model"])
    assert report["sharing"]["dense_bytes_equivalent"] > 10 * report["sharing"]["bytes_sent"]
    assert "bytes on the wire" in log


CLASSIFICATION = EXAMPLE.with_name("tabular_classification.py")


def test_classification_example_learns_an_imbalanced_problem_in_one_process(tmp_path):
    report, log = run_example(tmp_path, "--mode", "local", "--rows", "4000", "--test-rows", "2000", "--epochs", "3",
                              example=CLASSIFICATION)
    assert 0.05 < report["positive_share"] < 0.12
    local = report["local"]
    assert local["auc"] > 0.9 and local["pr_auc"] > 3 * report["positive_share"]  # chance: 0.5 and the share
    assert 1 <= local["best_epoch"] <= local["epochs_run"] <= 3


TORCH_MNIST = EXAMPLE.with_name("torch_mnist.py")


@pytest.mark.slow
@pytest.mark.spark
def test_classification_example_tunes_stops_early_and_agrees_with_sklearn(tmp_path):
    args = ("--rows", "4000", "--test-rows", "2000", "--epochs", "3", "--master", "local[2]")
    report, _ = run_example(tmp_path, *args, example=CLASSIFICATION)
    for kind in ("averaging", "sharing"):
        r = report[kind]
        assert r["auc"] > 0.85 and len(r["cv_auc"]) == 2 and 1 <= r["best_epoch"] <= r["epochs_run"] <= 3
        assert r["auc_spark"] == pytest.approx(r["auc_sklearn"], abs=1e-9)
        assert r["auc"] == pytest.approx(r["auc_sklearn"], abs=1e-9)
        assert r["pr_auc"] == pytest.approx(r["pr_auc_sklearn"], abs=1e-9)
        assert os.path.basename(r["saved_model"]) == f"pipeline-{kind}"


@pytest.mark.slow
@pytest.mark.spark
def test_torch_recipe_example_averages_with_its_own_optimizer_and_scheduler(tmp_path, fashion_dir):
    """PyTorch's mnist recipe (Adadelta + StepLR, log_softmax with an nll loss) on local[2]; the example's
    own module reaches the executors as a file."""
    pytest.importorskip("torch")
    report, log = run_example(tmp_path, "--mode", "averaging", "--data-dir", str(fashion_dir), "--epochs", "2",
                              "--limit-train", "2000", "--limit-test", "500", "--master", "local[2]",
                              "--workers", "2", example=TORCH_MNIST)
    assert REPORT_KEYS <= report.keys() and report["workers"] == 2 and len(report["epochs_detail"]) == 2
    assert report["test_accuracy"] > 0.6  # 0.78 measured; chance is 0.1


def test_torch_recipe_example_export_flag(tmp_path, fashion_dir):
    """``--export-onnx`` writes the model where the models can export, and otherwise fails before training,
    naming the method it needs."""
    pytest.importorskip("torch")
    from sparkavg.torch import TorchModel

    out = tmp_path / "cnn.onnx"
    args = [sys.executable, str(TORCH_MNIST), "--mode", "local", "--data-dir", str(fashion_dir), "--epochs", "1",
            "--limit-train", "200", "--limit-test", "100", "--threads", "1", "--export-onnx", str(out),
            "--report", str(tmp_path / "report.json")]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=600)
    if hasattr(TorchModel, "export_onnx"):
        assert proc.returncode == 0, proc.stderr[-4000:]
        assert out.stat().st_size > 0 and json.loads((tmp_path / "report.json").read_text())["onnx"] == str(out)
    else:
        assert proc.returncode != 0 and "NotImplementedError" in proc.stderr and "export_onnx" in proc.stderr
        assert "loaded" not in proc.stderr  # refused before the data was read
