"""A Spark standalone cluster of simulated hosts on one machine.

Each host -- a ``driver`` host that runs the standalone Master and the
driver programs, and ``worker0`` ... ``workerN-1`` that run one Spark
Worker each -- is its own network namespace, with a veth link to a bridge
in a hub namespace, and its own mount and UTS namespaces: an empty private
tmpfs on ``/tmp``, ``/var/tmp`` and ``/dev/shm``, its own hostname and an
``/etc/hosts`` naming every host.  The software (``/usr``, ``/work``, the
venv) stays visible, as it would be installed on every real host; nothing
else is shared but the network.  Links can be shaped with ``tc tbf``.

Driver programs run inside the driver host through
:meth:`SimulatedCluster.run_driver` (a subprocess: Python 3.11 has no
``os.setns``).  Everything is torn down on :meth:`~SimulatedCluster.close`,
on leaving the ``with`` block, at interpreter exit and on SIGTERM.

Needs root; :meth:`SimulatedCluster.available` says why not otherwise::

    with SimulatedCluster(workers=2, rate="100mbit") as cluster:
        done = cluster.run_driver([sys.executable, "job.py", cluster.master_url], timeout=120)
"""
from __future__ import annotations

import ipaddress
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from . import netns, processes, safety
from .cpu import PERIOD_US, HostCgroup, cgroup_root, reap_stale_cgroups
from .netns import HostLink

__all__ = ["SimulatedCluster", "SimulatedHost"]

logger = logging.getLogger(__name__)

MASTER_PORT = 7077
MASTER_WEBUI_PORT = 8080
WORKER_WEBUI_PORT = 8081

# Inside every host (its private tmpfs).
SPARK_LOCAL_DIR = "/tmp/spark-local"
SPARK_WORKER_DIR = "/tmp/spark-worker"

# Master and Worker only route messages: the quick JIT and a small serial
# heap start them sooner on a small machine.
DAEMON_JAVA_OPTS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"

_SIZE_RE = re.compile(r"^\d+[kmgt]?$")
_REGISTERED_RE = re.compile(r"Registering worker (\S+):\d+")

HostRef = Union[str, "SimulatedHost"]


@dataclass(frozen=True)
class SimulatedHost:
    """One simulated host.

    Attributes
    ----------
    name : str
        Hostname inside the host (``"driver"``, ``"worker0"``, ...).
    ip : str
        Its address on the cluster's private /24 (interface ``eth0``).
    netns : str
        Name of its network namespace (``ip netns exec <netns> ...``).
    rate : str or None
        ``tc`` rate of its link, both ways; None when unshaped.
    """

    name: str
    ip: str
    netns: str
    rate: Optional[str]


class SimulatedCluster:
    """A Spark standalone cluster whose hosts share only a network.

    Parameters
    ----------
    workers : int, default 2
        Number of worker hosts, one Spark Worker each.
    cores_per_worker : int, default 1
        ``--cores`` of each Worker.
    memory : str, default "1g"
        ``--memory`` of each Worker (a Spark size: ``"512m"``, ``"1g"``); a
        driver's ``spark.executor.memory`` (default 1g) must fit in it, or
        its executors never start.
    rate : str or None, default None
        ``tc`` rate (``"100mbit"``, ``"1gbit"``) of every host's link, the
        driver's included, in both directions; None leaves links unshaped.
    link_rates : mapping of str to (str or None), optional
        Per-host overrides of ``rate`` by host name, e.g.
        ``{"driver": None}`` to leave the driver's link unshaped.
    burst : str, optional
        ``tbf`` burst; default 10 ms of the rate, at least 32 KiB.
    latency : str, default "50ms"
        ``tbf`` latency: how long a packet may queue before it is dropped.
    spark : bool, default True
        Start the Master and Workers; False gives only the hosts and network.
    python : str, optional
        Interpreter for driver programs and PySpark workers
        (``PYSPARK_PYTHON``); default ``sys.executable`` (the venv's).
    log_dir : path, optional
        Where the Master's and Workers' logs go (kept after close); default
        a temporary folder removed on close.
    start_timeout : float, default 120
        Seconds to wait for the Master and all Workers to register.
    cpu : float, optional
        CPU limit of every worker host, in cores (``0.25``: a quarter of a
        core for all its processes together -- Worker, executor JVM, Python
        workers), through a cpu cgroup per host (:mod:`.cpu`); None leaves
        them unlimited.  :meth:`limit_cpu` changes a host's limit while the
        cluster runs.
    cpu_limits : mapping of str to (float or None), optional
        Per-host overrides of ``cpu`` by host name (the driver host included).
    """

    def __init__(self, workers: int = 2, cores_per_worker: int = 1, memory: str = "1g",
                 rate: Optional[str] = None, *, link_rates: Optional[Mapping[str, Optional[str]]] = None,
                 burst: Optional[str] = None, latency: str = "50ms", spark: bool = True,
                 python: Optional[str] = None, log_dir: Optional[Union[str, Path]] = None,
                 start_timeout: float = 120.0, cpu: Optional[float] = None,
                 cpu_limits: Optional[Mapping[str, Optional[float]]] = None) -> None:
        if not isinstance(workers, int) or workers < 1:
            raise ValueError(f"Expect workers >= 1, got {workers!r}")
        if not isinstance(cores_per_worker, int) or cores_per_worker < 1:
            raise ValueError(f"Expect cores_per_worker >= 1, got {cores_per_worker!r}")
        if not _SIZE_RE.match(str(memory).lower()):
            raise ValueError(f"Expect memory as a Spark size such as '512m' or '1g', got {memory!r}")
        names = ["driver"] + [f"worker{i}" for i in range(workers)]
        rates = {name: rate for name in names}
        for name, value in dict(link_rates or {}).items():
            if name not in rates:
                raise ValueError(f"Expect link_rates keys among {names}, got {name!r}")
            rates[name] = value
        for value in rates.values():
            if value is not None:
                netns.rate_bits_per_second(value)  # raises with the bad value
        cpus = {name: (None if name == "driver" else cpu) for name in names}
        for name, value in dict(cpu_limits or {}).items():
            if name not in cpus:
                raise ValueError(f"Expect cpu_limits keys among {names}, got {name!r}")
            cpus[name] = value
        for value in cpus.values():
            if value is not None and not (isinstance(value, (int, float)) and not isinstance(value, bool)
                                          and value > 0):
                raise ValueError(f"Expect a host's CPU limit as a number of cores > 0 (or None), got {value!r}")
        self._cpus = cpus
        self._cgroups: Dict[str, HostCgroup] = {}
        self.workers, self.cores_per_worker, self.memory = workers, cores_per_worker, str(memory)
        self.burst, self.latency, self.spark, self.start_timeout = burst, latency, spark, start_timeout
        self.python = python or sys.executable
        self._rates = rates
        self._names = names
        self._given_log_dir = Path(log_dir) if log_dir is not None else None
        self.log_dir: Optional[Path] = None
        self.id: Optional[str] = None
        self.subnet: Optional[ipaddress.IPv4Network] = None
        self._links: Dict[str, HostLink] = {}
        self._hub: Optional[str] = None
        self._created: List[str] = []      # namespaces, in creation order
        self._spawned: List[subprocess.Popen] = []
        self._daemons: Dict[str, subprocess.Popen] = {}
        self._logs: List[IO] = []
        self._lock = threading.Lock()
        self._started = self._closed = False
        self.startup_seconds: Optional[float] = None

    # -- availability and lifecycle -------------------------------------------

    @staticmethod
    def available() -> Tuple[bool, str]:
        """``(True, "")`` when namespaces can be created here, else
        ``(False, reason)``: not root, a missing tool, or the error of a trial."""
        return netns.namespaces_available()

    def __enter__(self) -> "SimulatedCluster":
        return self.start()

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            self.close()
        except Exception:
            if exc_type is None:
                raise
            logger.exception("tearing down %s after %s", self.id, exc_type.__name__)

    def start(self) -> "SimulatedCluster":
        """Create the hosts and network, then (``spark=True``) the Master and
        Workers; returns once every Worker has registered.  On any failure
        everything created so far is torn down before the error propagates."""
        if self._started:
            raise RuntimeError(f"Expect a cluster to be started once, {self.id} already was")
        ok, reason = self.available()
        if not ok:
            raise RuntimeError(f"Expect to be able to create namespaces for simulated hosts: {reason}")
        self._started = True
        began = time.monotonic()
        netns.reap_stale()
        reap_stale_cgroups(processes.alive)
        if any(v is not None for v in self._cpus.values()) and cgroup_root() is None:
            raise RuntimeError("Expect a writable cgroup cpu controller to limit hosts' CPU (cpu=/cpu_limits=), "
                               "found none")
        safety.register(self)
        try:
            self._start_hosts()
            if self.spark:
                self._start_spark()
        except BaseException:
            self.close()
            raise
        self.startup_seconds = time.monotonic() - began
        logger.info("simulated cluster %s (%s) up in %.1f s", self.id, self.subnet, self.startup_seconds)
        return self

    def _start_hosts(self) -> None:
        self.id = netns.new_cluster_id()
        self.subnet = netns.pick_subnet(c.subnet for c in safety.live() if c.subnet is not None)
        if self._given_log_dir is not None:
            self.log_dir = self._given_log_dir
            self.log_dir.mkdir(parents=True, exist_ok=True)
        else:
            self.log_dir = Path(tempfile.mkdtemp(prefix=f"{self.id}-"))
        self._hub = f"{self.id}-hub"
        self._created.append(self._hub)
        netns.create_hub(self._hub)
        if cgroup_root() is not None:  # limits can be set later (limit_cpu), so every host gets its cgroup
            for name in self._names:
                group = HostCgroup(f"{self.id}-{name}")
                self._cgroups[name] = group.create()
                group.limit(self._cpus[name])
        addresses = self.subnet.hosts()
        for name in self._names:
            link = HostLink(name=name, netns=f"{self.id}-{name}", ip=str(next(addresses)),
                            prefixlen=self.subnet.prefixlen, rate=self._rates[name])
            self._created.append(link.netns)
            link.create(self._hub)
            link.shape(self._hub, self.burst, self.latency)
            self._links[name] = link
        hosts_file = self.log_dir / "hosts"
        hosts_file.write_text("127.0.0.1\tlocalhost\n::1\tlocalhost\n"
                              + "".join(f"{link.ip}\t{name}\n" for name, link in self._links.items()))
        for link in self._links.values():
            link.start_anchor(hosts_file)
        for link in self._links.values():
            link.wait_anchor()

    def _start_spark(self) -> None:
        import pyspark

        spark_class = str(Path(pyspark.__file__).parent / "bin" / "spark-class")
        driver = self._links["driver"]
        self._spawn_daemon("master", [
            spark_class, "org.apache.spark.deploy.master.Master", "--host", driver.ip,
            "--port", str(MASTER_PORT), "--webui-port", str(MASTER_WEBUI_PORT)])
        # A Worker that finds no Master retries only after 5-15 s: wait for the leader.
        self._wait_log("master", "I have been elected leader", 1)
        for i in range(self.workers):
            name = f"worker{i}"
            self._spawn_daemon(name, [
                spark_class, "org.apache.spark.deploy.worker.Worker", "--host", self._links[name].ip,
                "--cores", str(self.cores_per_worker), "--memory", self.memory,
                "--webui-port", str(WORKER_WEBUI_PORT), self.master_url])
        expected = {self._links[f"worker{i}"].ip for i in range(self.workers)}
        self._wait_log("master", _REGISTERED_RE, expected)

    def _spawn_daemon(self, name: str, argv: List[str]) -> subprocess.Popen:
        log = open(self.log_dir / f"{name}.log", "wb")
        self._logs.append(log)
        proc = self.spawn(self._daemon_host(name), argv, env={"SPARK_DAEMON_JAVA_OPTS": DAEMON_JAVA_OPTS}, cwd="/tmp",
                          stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        self._daemons[name] = proc
        return proc

    @staticmethod
    def _daemon_host(name: str) -> str:
        return "driver" if name == "master" else name

    def _wait_log(self, name: str, pattern, expected) -> None:
        """Until ``name``'s log shows ``pattern`` (a count, or for a regex the
        set of its first groups); fail early when a daemon exits."""
        path = self.log_dir / f"{name}.log"
        deadline = time.monotonic() + self.start_timeout
        while True:
            text = path.read_text(errors="replace")
            if isinstance(expected, int):
                got = text.count(pattern)
                done = got >= expected
            else:
                got = set(pattern.findall(text))
                done = got >= expected
            if done:
                return
            dead = {n: p.returncode for n, p in self._daemons.items() if p.poll() is not None}
            if dead or time.monotonic() > deadline:
                why = f"{', '.join(f'{n} exited with {rc}' for n, rc in dead.items())}" if dead else \
                    f"timed out after {self.start_timeout:.0f} s"
                raise RuntimeError(f"starting Spark on {self.id}: expected {expected!r} in the {name} log, "
                                   f"got {got!r} ({why}); logs in {self.log_dir}:\n"
                                   + self._log_tails())
            time.sleep(0.1)

    def _log_tails(self, chars: int = 2000) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-chars:]}"
                         for p in sorted(self.log_dir.glob("*.log")))

    def close(self) -> None:
        """End every process in the cluster's namespaces, delete the
        namespaces (their veths and the bridge go with them), and check with
        ``ip netns list`` that none is left.  Safe to call more than once."""
        with self._lock:
            if self._closed or not self._started:
                self._closed = True
                return
            self._closed = True
        began = time.monotonic()
        try:
            # Spark daemons and driver programs first, by process group, so
            # that a Worker can stop its executors; then whatever is left
            # in the namespaces; the namespace holders last.
            groups = [p for p in self._spawned if p.poll() is None]
            for sig, grace in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
                for proc in groups:
                    processes.killpg(proc, sig)
                deadline = time.monotonic() + grace
                for proc in groups:
                    try:
                        proc.wait(max(0.0, deadline - time.monotonic()))
                    except subprocess.TimeoutExpired:
                        pass
                groups = [p for p in groups if p.poll() is None]
                if not groups:
                    break
            inodes = set()
            for name in self._created:
                try:
                    inodes.add(netns.netns_inode(name))
                except OSError:
                    pass
            anchors = {link.anchor.pid for link in self._links.values() if link.anchor is not None}
            stray = [p for p in processes.pids_in_netns(inodes) if p not in anchors]
            left = processes.kill_pids(stray, grace=2.0)
            left += processes.kill_pids(anchors, grace=0.5)
            for link in self._links.values():
                if link.anchor is not None:
                    link.anchor.wait(5)
            failed = []
            for name in reversed(self._created):
                proc = subprocess.run(["ip", "netns", "del", name], capture_output=True, text=True)
                if proc.returncode != 0 and name in netns.list_netns():
                    failed.append(f"{name}: {proc.stderr.strip()}")
            for group in self._cgroups.values():
                try:
                    group.remove()
                except RuntimeError as exc:
                    failed.append(str(exc))
            remaining = sorted(set(netns.list_netns()) & set(self._created))
            if left or failed or remaining:
                raise RuntimeError(f"tearing down {self.id}: expected no process and no namespace left, got "
                                   f"processes {left}, namespaces {remaining} ({'; '.join(failed)})")
        finally:
            for log in self._logs:
                log.close()
            safety.unregister(self)
            if self._given_log_dir is None and self.log_dir is not None:
                shutil.rmtree(self.log_dir, ignore_errors=True)
            logger.info("simulated cluster %s torn down in %.1f s", self.id, time.monotonic() - began)

    # -- the hosts -------------------------------------------------------------

    def _public(self, link: HostLink) -> SimulatedHost:
        return SimulatedHost(name=link.name, ip=link.ip, netns=link.netns, rate=link.rate)

    def _link(self, host: HostRef) -> HostLink:
        if not self._started or self._closed:
            raise RuntimeError(f"Expect a running cluster, got one that is "
                               f"{'closed' if self._closed else 'not started'}")
        key = host.name if isinstance(host, SimulatedHost) else str(host)
        for link in self._links.values():
            if key in (link.name, link.ip, link.netns):
                return link
        raise KeyError(f"Expect a host name or address among {[(n, l.ip) for n, l in self._links.items()]}, "
                       f"got {key!r}")

    @property
    def driver(self) -> SimulatedHost:
        """The host of the Master and of driver programs."""
        return self._public(self._link("driver"))

    @property
    def driver_host(self) -> str:
        """The driver host's address (``spark.driver.host`` of driver programs)."""
        return self._link("driver").ip

    @property
    def hosts(self) -> Tuple[SimulatedHost, ...]:
        """The worker hosts, ``worker0`` first."""
        return tuple(self._public(self._link(f"worker{i}")) for i in range(self.workers))

    @property
    def all_hosts(self) -> Tuple[SimulatedHost, ...]:
        """The driver host, then the worker hosts."""
        return (self.driver,) + self.hosts

    @property
    def master_url(self) -> str:
        """``spark://<driver ip>:7077``."""
        if not self.spark:
            raise RuntimeError("Expect a cluster started with spark=True for a master URL, got spark=False")
        return f"spark://{self.driver_host}:{MASTER_PORT}"

    @property
    def master_web_url(self) -> str:
        """The Master's web UI (``/json`` lists the workers), reachable from the hosts only."""
        return f"http://{self.driver_host}:{MASTER_WEBUI_PORT}"

    def spark_conf(self) -> Dict[str, str]:
        """Settings for a driver on this cluster: its master, every core, and
        no job before all executors have registered (else the first tasks
        may all land on the first executor up)."""
        return {"spark.master": self.master_url,
                "spark.cores.max": str(self.workers * self.cores_per_worker),
                "spark.scheduler.minRegisteredResourcesRatio": "1.0",
                "spark.scheduler.maxRegisteredResourcesWaitingTime": f"{int(self.start_timeout)}s"}

    def host_env(self, host: HostRef) -> Dict[str, str]:
        """Environment of processes on ``host``: this process's, less its
        Spark and temp-dir settings, plus the host's: ``SPARK_HOME``,
        ``SPARK_LOCAL_IP``, ``SPARK_LOCAL_DIRS`` / ``SPARK_WORKER_DIR`` under
        the private ``/tmp``, ``TMPDIR=/tmp``, ``PYSPARK_PYTHON``."""
        import pyspark

        link = self._link(host)
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("SPARK_", "PYSPARK_")) and k not in ("TMPDIR", "TEMP", "TMP", "SPARKAVG_IP")}
        env.update(SPARK_HOME=str(Path(pyspark.__file__).parent), SPARK_LOCAL_IP=link.ip,
                   SPARK_LOCAL_DIRS=SPARK_LOCAL_DIR, SPARK_WORKER_DIR=SPARK_WORKER_DIR,
                   SPARK_LOG_DIR="/tmp/spark-logs", TMPDIR="/tmp",
                   PYSPARK_PYTHON=self.python, PYSPARK_DRIVER_PYTHON=self.python)
        return env

    def spawn(self, host: HostRef, argv: Sequence[str], *, env: Optional[Mapping[str, str]] = None,
              cwd: Optional[str] = None, **popen_kwargs) -> subprocess.Popen:
        """Start ``argv`` on ``host`` (its network, mount and UTS namespaces)
        in a new process group; it is ended on close if still running.

        ``env`` is added to :meth:`host_env`; ``cwd`` is a path as the host
        sees it (default: this process's working directory, which must not
        be under a host-private folder such as ``/tmp``).  Other keywords go
        to :class:`subprocess.Popen`.
        """
        link = self._link(host)
        full_env = self.host_env(link.name)
        full_env.update(env or {})
        group = self._cgroups.get(link.name)
        proc = subprocess.Popen(link.enter([str(a) for a in argv], cwd), env=full_env,
                                start_new_session=True, preexec_fn=group.join if group is not None else None,
                                **popen_kwargs)
        self._spawned.append(proc)
        return proc

    def exec(self, host: HostRef, argv: Sequence[str], *, env: Optional[Mapping[str, str]] = None,
             cwd: Optional[str] = None, timeout: Optional[float] = None, input: Optional[str] = None,
             check: bool = False) -> subprocess.CompletedProcess:
        """Run ``argv`` on ``host`` to completion, capturing text output, like
        :func:`subprocess.run`; on timeout its whole process group is killed
        and :class:`subprocess.TimeoutExpired` raised."""
        proc = self.spawn(host, argv, env=env, cwd=cwd, text=True, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE,
                          stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL)
        try:
            out, err = proc.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired:
            processes.killpg(proc, signal.SIGKILL)
            out, err = proc.communicate()
            raise subprocess.TimeoutExpired(proc.args, timeout, out, err) from None
        finally:
            processes.killpg(proc, signal.SIGKILL)  # children it left behind
        done = subprocess.CompletedProcess(list(argv), proc.returncode, out, err)
        if check:
            done.check_returncode()
        return done

    def run_driver(self, argv: Sequence[str], *, env: Optional[Mapping[str, str]] = None,
                   cwd: Optional[str] = None, timeout: Optional[float] = None, input: Optional[str] = None,
                   check: bool = False) -> subprocess.CompletedProcess:
        """Run a driver program (e.g. ``[sys.executable, script, ...]``) in the
        driver host; see :meth:`exec`.  Its Spark driver binds the driver
        host's address (``SPARK_LOCAL_IP``); pass :attr:`master_url` to it."""
        return self.exec("driver", argv, env=env, cwd=cwd, timeout=timeout, input=input, check=check)

    def host_path(self, host: HostRef, path: Union[str, Path]) -> Path:
        """The path, readable from this process, of ``path`` as ``host`` sees it
        (through ``/proc/<pid>/root``): to copy files onto or off a host."""
        return self._link(host).root_path(str(path))

    def pids(self, host: HostRef) -> List[int]:
        """Processes running on ``host``, its namespace holder excluded."""
        link = self._link(host)
        return [p for p in processes.pids_in_netns({netns.netns_inode(link.netns)}) if p != link.anchor.pid]

    def interface_bytes(self) -> Dict[str, Dict[str, int]]:
        """``{host name: {"tx": bytes, "rx": bytes}}`` from the kernel counters
        of each host's ``eth0`` (``/sys/class/net/eth0/statistics``)."""
        return {name: self._link(name).interface_bytes() for name in self._links}

    def limit_cpu(self, host: HostRef, cores: Optional[float], period_us: int = PERIOD_US) -> int:
        """Limit ``host``'s processes together to ``cores`` cores (None: no
        limit), now, through its cpu cgroup, in quotas of ``period_us``
        (:meth:`~.cpu.HostCgroup.limit`); returns the period set."""
        link = self._link(host)
        if link.name not in self._cgroups:
            raise RuntimeError("Expect a writable cgroup cpu controller to limit a host's CPU, found none")
        period = self._cgroups[link.name].limit(cores, period_us)
        self._cpus[link.name] = cores
        return period

    def cpu_throttling(self) -> Dict[str, dict]:
        """Each host's quota accounting so far (:meth:`~.cpu.HostCgroup.throttling`)."""
        return {name: group.throttling() for name, group in self._cgroups.items()}

    def pin_cpu(self, host: HostRef, cpus) -> int:
        """Bind ``host``'s threads to the CPUs ``cpus`` (None: every CPU this process may use), now
        (:meth:`~.cpu.HostCgroup.pin`); returns how many threads were bound."""
        link = self._link(host)
        if link.name not in self._cgroups:
            raise RuntimeError("Expect a host cgroup to pin a host's threads, found none")
        return self._cgroups[link.name].pin(cpus)

    def thread_cpu(self) -> Dict[str, dict]:
        """Each host's CPU seconds so far by process and thread (:meth:`~.cpu.HostCgroup.thread_cpu`)."""
        return {name: group.thread_cpu() for name, group in self._cgroups.items()}

    def cpu_limits(self) -> Dict[str, Optional[float]]:
        """Each host's CPU limit in cores (None: unlimited)."""
        return dict(self._cpus)

    def kill_python_worker(self, host: HostRef, *, sig: int = signal.SIGKILL, every: bool = False) -> List[int]:
        """Kill one PySpark Python worker process on ``host`` (all with
        ``every=True``) -- a worker forked by ``pyspark.daemon``, or a
        ``pyspark.worker`` process when the daemon is off; never the daemon.
        Returns the pids killed, once they are gone.  Raises LookupError when
        the host runs no Python worker."""
        link = self._link(host)
        workers = sorted(p for p in self.pids(link.name) if processes.is_python_worker(p))
        if not workers:
            raise LookupError(f"Expect a PySpark Python worker on {link.name} ({link.ip}), found none among "
                              f"{[processes.cmdline(p)[:4] for p in self.pids(link.name)]}")
        targets = workers if every else workers[:1]
        for pid in targets:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 10
        while any(processes.alive(p) for p in targets) and time.monotonic() < deadline:
            time.sleep(0.02)
        logger.info("killed Python worker(s) %s on %s", targets, link.name)
        return targets

    def __repr__(self) -> str:
        state = "closed" if self._closed else "running" if self._started else "not started"
        return (f"SimulatedCluster(id={self.id!r}, subnet={str(self.subnet) if self.subnet else None!r}, "
                f"workers={self.workers}, rates={self._rates}, {state})")
