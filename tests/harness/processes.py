"""Finding and ending processes by namespace, and telling PySpark's
Python workers from their daemon -- all from ``/proc``, no external tools."""
from __future__ import annotations

import os
import signal
import subprocess
import time
from typing import Iterable, List, Optional, Set

__all__ = ["pids_in_netns", "alive", "kill_pids", "killpg", "cmdline", "is_python_worker"]


def pids_in_netns(inodes: Set[int]) -> List[int]:
    """Every process whose network namespace is one of ``inodes``."""
    wanted = {f"net:[{ino}]" for ino in inodes}
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            if os.readlink(f"/proc/{entry.name}/ns/net") in wanted:
                found.append(int(entry.name))
        except OSError:
            continue  # exited meanwhile, or a kernel thread
    return found


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            state = fh.read().rsplit(b")", 1)[1].split()[0]
        return state not in (b"Z", b"X")
    except (OSError, IndexError):
        return False


def kill_pids(pids: Iterable[int], grace: float = 5.0) -> List[int]:
    """SIGTERM ``pids``, SIGKILL what is left after ``grace`` seconds;
    returns those that still exist afterwards (should be none)."""
    pids = [p for p in pids if p != os.getpid()]
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            pids = [p for p in pids if alive(p)]
            if not pids:
                return []
            time.sleep(0.05)
    return [p for p in pids if alive(p)]


def killpg(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def cmdline(pid: int) -> List[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return [a.decode(errors="replace") for a in fh.read().split(b"\0") if a]
    except OSError:
        return []


def _module(argv: List[str]) -> Optional[str]:
    """The ``-m`` module of a Python command line."""
    for i, arg in enumerate(argv[:-1]):
        if arg == "-m":
            return argv[i + 1]
    return None


def _parent(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return int(fh.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def is_python_worker(pid: int) -> bool:
    module = _module(cmdline(pid))
    if module == "pyspark.worker":
        return True
    # The daemon forks its workers: same command line, the daemon as parent.
    return module == "pyspark.daemon" and _module(cmdline(_parent(pid))) == "pyspark.daemon"
