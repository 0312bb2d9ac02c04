"""Test and benchmark harnesses, apart from the installed package: a Spark
standalone cluster of simulated hosts (network + mount namespaces on one
machine, links optionally shaped; needs root) and a Spark Connect server in
its own JVM (:mod:`.connect`).

Tests import it as ``tests.harness`` (pytest puts the repository root on
``sys.path``); benchmarks put the repository root on ``sys.path`` first.

>>> from tests.harness import SimulatedCluster
>>> ok, reason = SimulatedCluster.available()        # root and iproute2 needed
>>> with SimulatedCluster(workers=2, rate="100mbit") as cluster:   # doctest: +SKIP
...     cluster.run_driver([sys.executable, "job.py", cluster.master_url], timeout=120)
"""
from .hosts import SimulatedCluster, SimulatedHost

__all__ = ["SimulatedCluster", "SimulatedHost"]
