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

    def throttling(self) -> dict:
        """The cgroup's CPU accounting so far: ``periods`` (quota periods in
        which it ran), ``throttled`` (those that ran out of quota) and
        ``throttled_s`` (the time its processes waited for a new quota)."""
        fields = dict(line.split() for line in (self.path / "cpu.stat").read_text().splitlines() if line.strip())
        waited = int(fields.get("throttled_time", 0)) / 1e9 if self.v1 else int(fields.get("throttled_usec", 0)) / 1e6
        return {"periods": int(fields.get("nr_periods", 0)), "throttled": int(fields.get("nr_throttled", 0)),
                "throttled_s": waited}

    def pin(self, cpus) -> int:
        """Bind every thread of the host's processes to the CPUs ``cpus``
        (None: every CPU this process may run on), now; threads and processes they start later
        inherit it.  Returns how many threads were bound.  A host of
        ``len(cpus)`` dedicated cores, where a quota of as many cores would
        share the machine's cores with the other hosts'."""
        cpus = os.sched_getaffinity(0) if cpus is None else set(cpus)
        bound = 0
        tasks = self.path / ("tasks" if self.v1 else "cgroup.threads")
        for tid in (int(t) for t in tasks.read_text().split()):
            try:
                os.sched_setaffinity(tid, cpus)
                bound += 1
            except OSError:  # the thread ended
                pass
        return bound

    def thread_cpu(self) -> dict:
        """CPU seconds so far of every thread of the host's processes, by
        ``"process/thread"`` name (a process by its executable's name --
        java, python --, a thread by its kernel name), threads of one name summed."""
        tick = os.sysconf("SC_CLK_TCK")
        out: dict = {}
        for pid in self.pids():
            try:
                exe = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
                tasks = list(Path(f"/proc/{pid}/task").iterdir())
            except OSError:
                continue
            kind = os.path.basename(exe) or "?"
            for task in tasks:
                try:
                    stat = (task / "stat").read_text()
                except OSError:
                    continue
                name = stat[stat.index("(") + 1:stat.rindex(")")]
                fields = stat[stat.rindex(")") + 2:].split()
                key = f"{kind}/{name}"
                out[key] = out.get(key, 0.0) + (int(fields[11]) + int(fields[12])) / tick
        return out

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
