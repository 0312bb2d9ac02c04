"""Linux plumbing for simulated hosts: network and mount namespaces, a
bridge in a hub namespace, veth links shaped with ``tc tbf``, and the
clean-up of namespaces whose owner died.

Nothing here knows about Spark; :mod:`tests.harness.hosts` builds the
cluster on top.  Every address and interface exists only inside
namespaces created here; the root namespace is never touched except for
the ``/run/netns/<name>`` handles that ``ip netns add`` creates.
"""
from __future__ import annotations

import functools
import ipaddress
import logging
import os
import re
import secrets
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from . import processes

__all__ = [
    "NAME_PREFIX",
    "HostLink",
    "namespaces_available",
    "rate_bits_per_second",
    "pick_subnet",
    "new_cluster_id",
    "create_hub",
    "list_netns",
    "netns_inode",
    "reap_stale",
]

logger = logging.getLogger(__name__)

#: Every namespace created here is named ``sparkavg-<owner pid>-<6 hex>-<host>``.
NAME_PREFIX = "sparkavg"
_NAME_RE = re.compile(rf"^{NAME_PREFIX}-(\d+)-([0-9a-f]{{6}})-[a-z0-9]+$")

#: Paths each host gets as a private, empty tmpfs.
PRIVATE_DIRS = ("/tmp", "/var/tmp", "/dev/shm")

_RATE_RE = re.compile(r"^(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit|tbit|bps|kbps|mbps|gbps|tbps)$")
_RATE_UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12,
               "bps": 8, "kbps": 8e3, "mbps": 8e6, "gbps": 8e9, "tbps": 8e12}

# The host side of every link; the hub side is "v-<host name>".
HOST_INTERFACE = "eth0"

# Sets up the private mounts and hostname, reports, then holds the
# namespaces open for nsenter.  "$1" = host name, "$2" = hosts file,
# "$3"... = installed software (a checkout, a virtual environment) that
# happens to live under a private folder: held aside on a scratch tmpfs
# over /mnt, then moved back on top of the new private folder -- every real
# host has the software installed.
_ANCHOR_SCRIPT = """set -e
name="$1"
if [ -e /etc/hosts ]; then mount --bind "$2" /etc/hosts; fi
shift 2
if [ "$#" -gt 0 ]; then
  mount -t tmpfs "sparkavg-hold-$name" /mnt
  i=0
  for k in "$@"; do mkdir -p "/mnt/k$i"; mount --bind "$k" "/mnt/k$i"; i=$((i + 1)); done
fi
for d in {dirs}; do
  if [ -d "$d" ]; then mount -t tmpfs -o mode=1777 "sparkavg-$name" "$d"; fi
done
if [ "$#" -gt 0 ]; then
  i=0
  for k in "$@"; do mkdir -p "$k"; mount --move "/mnt/k$i" "$k"; i=$((i + 1)); done
  umount /mnt
fi
hostname "$name"
echo ready
exec sleep infinity
""".format(dirs=" ".join(PRIVATE_DIRS))


def software_under_private_dirs() -> list:
    """The checkout, the virtual environment and the working directory, where
    they lie under a folder every host gets privately (e.g. a clone in /tmp)."""
    import sys

    import sparkavg

    candidates = {os.path.realpath(p) for p in (os.getcwd(), sys.prefix,
                                               os.path.dirname(os.path.dirname(sparkavg.__file__)))}
    private = [os.path.realpath(d) for d in PRIVATE_DIRS]
    keep = sorted(c for c in candidates if any(c == d or c.startswith(d + os.sep) for d in private))
    # a path inside another kept path is already visible through it
    return [k for k in keep if not any(k != o and k.startswith(o + os.sep) for o in keep)]


def rate_bits_per_second(rate: str) -> float:
    """Parse a ``tc`` rate (``"100mbit"``, ``"1gbit"``, ``"500kbit"``,
    ``"10mbps"`` = bytes) to bits per second."""
    match = _RATE_RE.match(str(rate).strip().lower())
    if match is None:
        raise ValueError(f"Expect a tc rate such as '100mbit' or '1gbit', got {rate!r}")
    bits = float(match.group(1)) * _RATE_UNITS[match.group(2)]
    if bits <= 0:
        raise ValueError(f"Expect a positive link rate, got {rate!r}")
    return bits


def _run(argv: Sequence[str], what: str, timeout: float = 30.0) -> str:
    """Run a short plumbing command; raise with its stderr when it fails."""
    proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{what}: expected exit status 0 from {' '.join(argv)!r}, got "
                           f"{proc.returncode}: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc.stdout


@functools.lru_cache(maxsize=None)
def namespaces_available() -> Tuple[bool, str]:
    """Whether this process can create network + mount namespaces.

    Returns ``(True, "")`` or ``(False, reason)`` where the reason names the
    missing privilege or tool, or quotes the error of a trial namespace.
    """
    if not os.path.isdir("/proc/self/ns"):
        return False, "no /proc/self/ns: not Linux, or /proc is not mounted"
    if os.geteuid() != 0:
        return False, (f"creating network namespaces needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN); "
                       f"this process runs as uid {os.geteuid()}")
    missing = [tool for tool in ("ip", "unshare", "nsenter", "mount", "sh", "sleep") if shutil.which(tool) is None]
    if missing:
        return False, f"missing tools on PATH: {', '.join(missing)} (iproute2, util-linux, coreutils)"
    probe = f"{NAME_PREFIX}-{os.getpid()}-{secrets.token_hex(3)}-probe"
    try:
        _run(["ip", "netns", "add", probe], "trial network namespace")
    except (RuntimeError, subprocess.TimeoutExpired, OSError) as exc:
        return False, f"cannot create a network namespace: {exc}"
    try:
        _run(["ip", "-n", probe, "link", "add", "br0", "type", "bridge"], "trial bridge")
        _run(["ip", "netns", "exec", probe, "unshare", "--mount", "--uts", "--propagation", "private",
              "sh", "-c", "mount -t tmpfs sparkavg-probe /tmp && hostname probe"], "trial mount namespace")
    except (RuntimeError, subprocess.TimeoutExpired, OSError) as exc:
        return False, str(exc)
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return True, ""


def create_hub(name: str) -> None:
    """The hub namespace and its bridge ``br0``, which every host's veth joins.
    It has no address: it switches frames and routes nothing."""
    _run(["ip", "netns", "add", name], "create the hub namespace")
    _run(["ip", "-n", name, "link", "add", "br0", "type", "bridge"], "create the bridge")
    _run(["ip", "-n", name, "link", "set", "br0", "up"], "bring the bridge up")
    _run(["ip", "-n", name, "link", "set", "lo", "up"], "loopback of the hub")


def new_cluster_id() -> str:
    """``sparkavg-<pid>-<6 hex>``: unique per cluster, and says who owns it."""
    return f"{NAME_PREFIX}-{os.getpid()}-{secrets.token_hex(3)}"


def pick_subnet(taken: Iterable[ipaddress.IPv4Network] = ()) -> ipaddress.IPv4Network:
    """A random ``10.x.y.0/24`` that overlaps no route of the root namespace
    (nor ``taken``), so an address of a simulated host never shadows a real one."""
    routes = []
    for line in _run(["ip", "-4", "route", "show", "table", "all"], "list routes").splitlines():
        dest = line.split()[0] if line.split() else ""
        if dest in ("local", "broadcast", "unreachable", "blackhole", "prohibit") and len(line.split()) > 1:
            dest = line.split()[1]
        try:
            routes.append(ipaddress.ip_network(dest, strict=False))
        except ValueError:
            continue  # "default" and the like
    routes.extend(taken)
    for _ in range(1000):
        candidate = ipaddress.IPv4Network(f"10.{secrets.randbelow(256)}.{secrets.randbelow(256)}.0/24")
        if not any(candidate.overlaps(r) for r in routes if r.version == 4 and r.prefixlen > 0):
            return candidate
    raise RuntimeError("Expect a free 10.x.y.0/24 for the simulated hosts, found none in 1000 random tries")


def list_netns() -> List[str]:
    """Names from ``ip netns list`` (the ``(id: N)`` suffix dropped)."""
    return [line.split()[0] for line in _run(["ip", "netns", "list"], "list namespaces").splitlines() if line.strip()]


def netns_inode(name: str) -> int:
    """Inode of a named network namespace: what ``/proc/<pid>/ns/net`` links to."""
    return os.stat(f"/run/netns/{name}").st_ino


def reap_stale() -> List[str]:
    """Delete namespaces this module made for a process that no longer
    exists (a run killed with SIGKILL), ending what still runs in them.
    Returns the names deleted."""
    deleted = []
    for name in list_netns():
        match = _NAME_RE.match(name)
        if match is None or processes.alive(int(match.group(1))):
            continue
        try:
            processes.kill_pids(processes.pids_in_netns({netns_inode(name)}), grace=1.0)
        except OSError:
            pass
        if subprocess.run(["ip", "netns", "del", name], capture_output=True).returncode == 0:
            deleted.append(name)
    if deleted:
        logger.warning("deleted namespaces left by dead processes: %s", ", ".join(deleted))
    return deleted


@dataclass
class HostLink:
    """One host's network namespace, its veth into the hub's bridge, and the
    ``sleep`` process that holds its private mount and UTS namespaces.

    Parameters
    ----------
    name : str
        Host name (``"driver"``, ``"worker0"``, ...): its hostname and the
        last part of its namespace's name.
    netns : str
        Network namespace name.
    ip : str
        The host's address on ``eth0``.
    prefixlen : int
        Length of the subnet's prefix.
    rate : str or None
        ``tc`` rate both ways on the link, or None for unshaped.
    """

    name: str
    netns: str
    ip: str
    prefixlen: int
    rate: Optional[str] = None
    anchor: Optional[subprocess.Popen] = None

    @property
    def hub_interface(self) -> str:
        return f"v-{self.name}"[:15]

    def create(self, hub: str) -> None:
        """Namespace, veth pair (one end straight into the host, one in the hub
        on the bridge), address, ``lo`` up; nothing passes the root namespace."""
        _run(["ip", "netns", "add", self.netns], f"create namespace of {self.name}")
        _run(["ip", "-n", hub, "link", "add", self.hub_interface, "type", "veth", "peer", "name",
              HOST_INTERFACE, "netns", self.netns], f"veth for {self.name}")
        _run(["ip", "-n", hub, "link", "set", self.hub_interface, "master", "br0", "up"],
             f"attach {self.name} to the bridge")
        _run(["ip", "-n", self.netns, "addr", "add", f"{self.ip}/{self.prefixlen}", "dev", HOST_INTERFACE],
             f"address of {self.name}")
        _run(["ip", "-n", self.netns, "link", "set", HOST_INTERFACE, "up"], f"link of {self.name}")
        _run(["ip", "-n", self.netns, "link", "set", "lo", "up"], f"loopback of {self.name}")

    def shape(self, hub: str, burst: Optional[str], latency: str) -> None:
        """``tc tbf`` on the egress of both ends, so the rate holds each way."""
        if self.rate is None:
            return
        if shutil.which("tc") is None:
            raise RuntimeError(f"Expect 'tc' (iproute2) on PATH to shape links to {self.rate}, found none")
        bits = rate_bits_per_second(self.rate)
        # 10 ms of traffic (>= 32 KiB): large enough for the timer granularity
        # and a GSO packet, small enough not to blur the rate.
        burst = burst or f"{max(32 << 10, int(bits / 8 / 100))}b"
        for ns, dev in ((self.netns, HOST_INTERFACE), (hub, self.hub_interface)):
            _run(["tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "tbf", "rate", self.rate,
                  "burst", burst, "latency", latency], f"shape {self.name}'s link to {self.rate}")

    def start_anchor(self, hosts_file: Path) -> subprocess.Popen:
        """Start the process that owns the host's private mounts (``/tmp``,
        ``/var/tmp``, ``/dev/shm`` as empty tmpfs, ``/etc/hosts``) and hostname.
        ``ip netns exec`` and ``unshare`` both exec, so its pid is the shell's,
        then ``sleep``'s.  Call :meth:`wait_anchor` afterwards."""
        self.anchor = subprocess.Popen(
            ["ip", "netns", "exec", self.netns, "unshare", "--mount", "--uts", "--propagation", "private",
             "sh", "-c", _ANCHOR_SCRIPT, "sh", self.name, str(hosts_file), *software_under_private_dirs()],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            start_new_session=True)
        return self.anchor

    def wait_anchor(self, timeout: float = 30.0) -> None:
        line = self.anchor.stdout.readline()  # "ready", or EOF when the script failed
        if line.strip() != b"ready":
            try:
                _, err = self.anchor.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.anchor.kill()
                _, err = self.anchor.communicate()
            raise RuntimeError(f"setting up the private mounts of {self.name}: expected 'ready', got "
                               f"{line!r}, exit status {self.anchor.returncode}: {err.decode(errors='replace')}")
        self.anchor.stdout.close()
        self.anchor.stderr.close()

    def enter(self, argv: Sequence[str], cwd: Optional[str] = None) -> List[str]:
        """``argv`` wrapped to run inside this host's namespaces (network,
        mount, UTS), in ``cwd`` as the host sees it."""
        if self.anchor is None or self.anchor.poll() is not None:
            raise RuntimeError(f"Expect host {self.name} to be running, but its namespace holder has exited")
        enter = ["nsenter", f"--target={self.anchor.pid}", "--mount", "--net", "--uts", "--"]
        # Entering a mount namespace moves to its root; go where the caller asked.
        return enter + ["sh", "-c", 'cd "$0" && exec "$@"', cwd or os.getcwd(), *argv]

    def root_path(self, path: str) -> Path:
        """Where ``path`` as this host sees it can be read from the root mount namespace."""
        if self.anchor is None:
            raise RuntimeError(f"Expect host {self.name} to be running, it was never started")
        return Path(f"/proc/{self.anchor.pid}/root") / str(path).lstrip("/")

    def interface_bytes(self) -> Dict[str, int]:
        """tx/rx byte counters of the host's ``eth0`` (kernel counters in sysfs)."""
        stats = self.root_path(f"/sys/class/net/{HOST_INTERFACE}/statistics")
        return {key: int((stats / f"{key}_bytes").read_text()) for key in ("tx", "rx")}
