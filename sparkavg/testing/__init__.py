"""Test and benchmark helpers: a Spark standalone cluster of simulated
hosts (network + mount namespaces on one machine, links optionally shaped).

>>> from sparkavg.testing import SimulatedCluster
>>> ok, reason = SimulatedCluster.available()        # root and iproute2 needed
>>> with SimulatedCluster(workers=2, rate="100mbit") as cluster:   # doctest: +SKIP
...     cluster.run_driver([sys.executable, "job.py", cluster.master_url], timeout=120)
"""
from .hosts import SimulatedCluster, SimulatedHost

__all__ = ["SimulatedCluster", "SimulatedHost"]
