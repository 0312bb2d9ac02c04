"""Training on a real Spark standalone cluster (master + 2 workers on 127.0.0.1)."""
import pytest

from .test_example import run_example

pytestmark = [pytest.mark.spark, pytest.mark.slow]


@pytest.mark.parametrize("mode", ["averaging", "sharing"])
def test_example_trains_on_standalone_cluster(tmp_path, fashion_dir, standalone_cluster, mode):
    report, log = run_example(tmp_path, "--mode", mode, "--data-dir", str(fashion_dir), "--epochs", "1",
                              "--limit-train", "2000", "--limit-test", "500", "--master", standalone_cluster,
                              "--workers", "2")
    assert report["workers"] == 2
    assert report["test_accuracy"] > 0.4  # chance is 0.1
    if mode == "sharing":
        assert report["replica_max_abs_diff"] < 1e-4
