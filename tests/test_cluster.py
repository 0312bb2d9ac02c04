"""Training on a real Spark standalone cluster (master + 2 workers on 127.0.0.1)."""
import pytest

from .test_example import run_example

pytestmark = [pytest.mark.spark, pytest.mark.slow]


# One master on loopback: both run the same command on simulated hosts in test_cluster_hosts.py
# (test_readme_main_command_with_a_cluster_master); sharing here, for its UDP between the loopback workers.
@pytest.mark.parametrize("mode", ["sharing"])
def test_example_trains_on_standalone_cluster(tmp_path, fashion_dir, standalone_cluster, mode):
    report, log = run_example(tmp_path, "--mode", mode, "--data-dir", str(fashion_dir), "--epochs", "1",
                              "--limit-train", "2000", "--limit-test", "500", "--master", standalone_cluster,
                              "--workers", "2")
    assert report["workers"] == 2
    assert report["test_accuracy"] > 0.4  # chance is 0.1
    if mode == "sharing":
        assert report["replica_max_abs_diff"] < 1e-4
