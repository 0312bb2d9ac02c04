"""A driver program on a :class:`~.hosts.SimulatedCluster` that waits on
its caller between steps: it prints a JSON line ``{"event": ...}`` and reads
``go`` from its stdin before it goes on, so that the caller reads the hosts'
counters, cuts a link or kills a host at exactly that point.  Any other JSON
line is a result (the last one counts).  The cluster tests
(``tests/cluster_driver.py --handshake``) and the cluster benchmarks
(``benchmarks/bench_cluster.py``, ``bench_torch_hosts.py``) drive theirs
through :func:`drive`."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Callable, Optional, Sequence, Tuple

__all__ = ["DrivenProgram", "drive"]


class DrivenProgram:
    """The driver program as ``on_event`` sees it."""

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc
        self.waiting = False  # it printed an event and waits for "go"

    def go(self) -> None:
        """Answer ``go`` now (to act while it goes on); :func:`drive` answers
        after ``on_event`` returns otherwise.  Once per event."""
        if self.waiting:
            self.waiting = False
            self.proc.stdin.write("go\n")
            self.proc.stdin.flush()

    def running(self) -> bool:
        return self.proc.poll() is None


def drive(cluster, argv: Sequence[str], on_event: Callable[[dict, DrivenProgram], None], *,
          cwd: Optional[str] = None, timeout: float = 60) -> Tuple[int, Optional[dict], str]:
    """Run ``argv`` on ``cluster``'s driver host; ``on_event(event, program)``
    for each event line, each answered with ``go``.  Waits ``timeout``
    seconds for it to exit once its stdout closes; kills it if anything
    raises.  Returns ``(exit code, its last result line or None, its
    stderr)``; the stderr is also ``driver-program.log`` in the cluster's
    ``log_dir``."""
    log_path = Path(cluster.log_dir) / "driver-program.log"
    last = None
    with open(log_path, "w") as stderr:
        proc = cluster.spawn("driver", argv, cwd=cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=stderr, text=True)
        program = DrivenProgram(proc)
        try:
            for line in proc.stdout:
                if not line.startswith("{"):
                    continue
                event = json.loads(line)
                if "event" not in event:
                    last = event
                    continue
                program.waiting = True
                on_event(event, program)
                program.go()
            code = proc.wait(timeout)
        finally:
            if proc.poll() is None:
                proc.kill()
    return code, last, log_path.read_text()
