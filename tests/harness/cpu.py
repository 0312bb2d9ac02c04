"""CPU quotas of simulated hosts: one cgroup per host (the ``cpu``
controller, cgroup v1 or v2), so that a host's processes -- its Spark
Worker, the executor JVM it starts, that executor's Python workers -- share
a fixed share of the machine's cores, as a real host's processes share its
own cores.

A quota of ``cores`` (e.g. ``0.25``) lets the host's processes run
``cores * period`` microseconds of CPU per ``period`` (10 ms) in all,
however many of them there are: a host's speed is then well defined on a
small machine that many hosts share, and one host can be made exactly half
as fast as the others.
"""
from __future__ import annotations

import logging
import os
import re
import time
from pathlib import Path
from typing import List, Optional

__all__ = ["HostCgroup", "cgroup_root", "PERIOD_US", "reap_stale_cgroups"]

logger = logging.getLogger(__name__)

PERIOD_US = 10_000  # 10 ms: short enough that a host throttled to a small share still runs every few ms
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

    def limit(self, cores: Optional[float]) -> None:
        """At most ``cores`` cores for the host's processes together (None: no limit)."""
        if cores is not None and not (isinstance(cores, (int, float)) and cores > 0):
            raise ValueError(f"Expect a host's CPU limit as a number of cores > 0 (or None), got {cores!r}")
        quota = -1 if cores is None else max(1000, int(round(cores * PERIOD_US)))
        if self.v1:
            (self.path / "cpu.cfs_period_us").write_text(str(PERIOD_US))
            (self.path / "cpu.cfs_quota_us").write_text(str(quota))
        else:
            (self.path / "cpu.max").write_text(f"{'max' if quota < 0 else quota} {PERIOD_US}")
        self.cores = cores

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
