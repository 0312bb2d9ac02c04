"""CPU quotas of simulated hosts: one cgroup per host (the ``cpu``
controller, cgroup v1 or v2), so that a host's processes -- its Spark
Worker, the executor JVM it starts, that executor's Python workers -- share
a fixed share of the machine's cores, as a real host's processes share its
own cores.

A quota of ``cores`` (e.g. ``0.25``) lets the host's processes run
``cores * period`` microseconds of CPU per ``period`` (10 ms unless
told) in all, however many of them there are: a host's speed is then well
defined on a small machine that many hosts share, and one host can be made
exactly half as fast as the others.

The period is also what a throttled host waits: a process that used its
quota sleeps until the next period, so anything latency-bound on a host
(an exchange of small messages, a wake-up per datagram) costs up to
``(1 - cores) * period`` more than on a real host of that speed.  A shorter
period bounds that (``period_us``; the kernel's floor is a 1 ms quota, so a
share of ``cores`` gets a period of at least ``1000 / cores`` µs;
``bench_scale.py --cpu-period-ms`` runs at another period to see whether a
measured cost is the period's).
"""
from __future__ import annotations

import logging
import math
import os
import re
import time
from pathlib import Path
from typing import List, Optional

__all__ = ["HostCgroup", "cgroup_root", "PERIOD_US", "MIN_QUOTA_US", "reap_stale_cgroups"]

logger = logging.getLogger(__name__)

PERIOD_US = 10_000  # 10 ms: short enough that a host throttled to a small share still runs every few ms
MIN_QUOTA_US = 1000  # the kernel's floor for a cgroup's quota
_V1 = Path("/sys/fs/cgroup/cpu")
_V2 = Path("/sys/fs/cgroup")
_STALE_RE = re.compile(r"^sparkavg-(\d+)-[0-9a-f]+-")


def cgroup_root() -> Optional[Path]:
    """The folder under which per-host cpu cgroups are made (v1's ``cpu``
    hierarchy, or the v2 root when its ``cpu`` controller is enabled for
    children); None when neither is writable here."""
    if (_V1 / "cpu.cfs_quota_us").exists() and os.access(_V1, os.W_OK):
        return _V1
    controllers = _V2 / "cgroup.subtree_control"
    if controllers.exists() and "cpu" in controllers.read_text().split() and os.access(_V2, os.W_OK):
        return _V2
    return None


class HostCgroup:
    """The cpu cgroup of one simulated host (created on :meth:`create`)."""

    def __init__(self, name: str):
        root = cgroup_root()
        if root is None:
            raise RuntimeError("Expect a writable cgroup cpu controller (/sys/fs/cgroup/cpu of cgroup v1, or "
                               "'cpu' in /sys/fs/cgroup/cgroup.subtree_control of v2) to limit a host's CPU, "
                               "got neither")
        self.path = root / name
        self.v1 = root == _V1
        self.cores: Optional[float] = None

    def create(self) -> "HostCgroup":
        self.path.mkdir(exist_ok=True)
        return self

    @property
    def procs_file(self) -> str:
        return str(self.path / "cgroup.procs")

    def join(self) -> None:
        """Move the calling process into this cgroup (its children follow);
        for ``preexec_fn`` of a process started on the host."""
        with open(self.procs_file, "w") as fh:
            fh.write(str(os.getpid()))

    def limit(self, cores: Optional[float], period_us: int = PERIOD_US) -> int:
        """At most ``cores`` cores for the host's processes together (None: no
        limit), in quotas of ``period_us`` -- lengthened where the share's
        quota would fall under the kernel's 1 ms floor, so the share stays
        exact.  Returns the period set (µs)."""
        if cores is not None and not (isinstance(cores, (int, float)) and cores > 0):
            raise ValueError(f"Expect a host's CPU limit as a number of cores > 0 (or None), got {cores!r}")
        if not (isinstance(period_us, int) and 1000 <= period_us <= 1_000_000):
            raise ValueError(f"Expect a quota period in µs within [1000, 1000000] (the kernel's bounds), "
                             f"got {period_us!r}")
        period = period_us if cores is None else max(period_us, math.ceil(MIN_QUOTA_US / cores))
        quota = -1 if cores is None else int(round(cores * period))
        if self.v1:
            (self.path / "cpu.cfs_period_us").write_text(str(period))
            (self.path / "cpu.cfs_quota_us").write_text(str(quota))
        else:
            (self.path / "cpu.max").write_text(f"{'max' if quota < 0 else quota} {period}")
        self.cores = cores
        return period

    def pids(self) -> List[int]:
        try:
            return [int(p) for p in Path(self.procs_file).read_text().split()]
        except OSError:
            return []

    def remove(self, timeout: float = 5.0) -> None:
        """Remove the (emptied) cgroup; its processes must have exited."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"Expect cgroup {self.path} to be empty on teardown, it still holds "
                                       f"{self.pids()}") from None
                time.sleep(0.05)


def reap_stale_cgroups(alive) -> List[str]:
    """Remove empty host cgroups of clusters whose owning process is gone
    (``alive(pid)`` says whether it still runs)."""
    root = cgroup_root()
    removed = []
    if root is None:
        return removed
    for path in root.glob("sparkavg-*"):
        match = _STALE_RE.match(path.name)
        if match is None or alive(int(match.group(1))):
            continue
        try:
            path.rmdir()
            removed.append(path.name)
        except OSError:
            pass
    return removed
