"""Simulated hosts (tests/harness): each host its own network and mount
namespace, links shaped with tc, Spark standalone across them, teardown."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

PY = sys.executable
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests.harness imports from here

# Receives until EOF on (ip, port), then replies "<bytes> <seconds from first byte>".
RECEIVER = r"""
import socket, sys, time
server = socket.create_server((sys.argv[1], int(sys.argv[2])))
print("listening", flush=True)
conn, _ = server.accept()
received, first = 0, None
while True:
    chunk = conn.recv(1 << 20)
    if first is None:
        first = time.monotonic()
    if not chunk:
        break
    received += len(chunk)
conn.sendall(b"%d %f" % (received, time.monotonic() - first))
conn.close()
"""

# Sends N bytes to (ip, port), prints the receiver's reply and the seconds from connect to reply.
SENDER = r"""
import socket, sys, time
payload = b"\x5a" * int(sys.argv[3])
started = time.monotonic()
sock = socket.create_connection((sys.argv[1], int(sys.argv[2])))
sock.sendall(payload)
sock.shutdown(socket.SHUT_WR)
reply = sock.recv(100).decode()
print(reply, time.monotonic() - started)
"""


def transfer(cluster, sender, receiver, nbytes, port=5001):
    """Send ``nbytes`` over TCP between two hosts; returns (bytes received, seconds)."""
    listener = cluster.spawn(receiver, [PY, "-c", RECEIVER, receiver.ip, str(port)],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert listener.stdout.readline().strip() == "listening", "receiver did not start"
        done = cluster.exec(sender, [PY, "-c", SENDER, receiver.ip, str(port), str(nbytes)], timeout=60)
        assert done.returncode == 0, done.stderr
        received, _, seconds = done.stdout.split()
        return int(received), float(seconds)
    finally:
        listener.kill()
        listener.wait()


def our_namespaces(cluster_id):
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return [line.split()[0] for line in listed.splitlines() if line.startswith(cluster_id)]


# -- the network alone (no Spark): fast ------------------------------------------

def test_each_host_has_its_own_address_hostname_and_no_route_out(sim_cluster_factory):
    cluster = sim_cluster_factory(workers=2, spark=False)
    seen = {}
    for host in cluster.all_hosts:
        done = cluster.exec(host, ["sh", "-c", "hostname; ip -4 -o addr show; ip -4 route"], check=True)
        seen[host.name] = done.stdout
        lines = done.stdout.splitlines()
        assert lines[0] == host.name
        assert f"inet {host.ip}/24" in done.stdout
        assert "default" not in done.stdout, f"{host.name} has a route out:\n{done.stdout}"
    addresses = [h.ip for h in cluster.all_hosts]
    assert len(set(addresses)) == 3
    root = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True, check=True).stdout
    assert not any(f"inet {ip}/" in root for ip in addresses), "an address leaked into the root namespace"
    # Hosts reach each other by name through their own /etc/hosts.
    refused = cluster.exec("worker0", [PY, "-c", "import socket; socket.create_connection(('driver', 7), 5)"])
    assert "ConnectionRefusedError" in refused.stderr, refused.stderr  # the driver host answered
    assert cluster.exec("worker0", ["getent", "hosts", "worker1"], check=True).stdout.split()[0] == addresses[2]


def test_interface_counters_count_a_transfer_on_the_hosts_it_crossed(sim_cluster_factory):
    cluster = sim_cluster_factory(workers=2, spark=False)
    worker0, worker1 = cluster.hosts
    before = cluster.interface_bytes()
    received, _ = transfer(cluster, worker0, cluster.driver, 5 << 20)
    after = cluster.interface_bytes()
    grew = {h: {k: after[h][k] - before[h][k] for k in ("tx", "rx")} for h in after}
    assert received == 5 << 20
    assert grew["worker0"]["tx"] >= 5 << 20, grew
    assert grew["driver"]["rx"] >= 5 << 20, grew
    assert grew["worker1"]["rx"] < 1 << 20, f"the bridge flooded worker1 with the transfer: {grew}"


@pytest.mark.slow
def test_shaped_link_limits_throughput_both_ways(sim_cluster_factory):
    # Only worker1's link is shaped: worker0 -> worker1 crosses its hub-side
    # egress, worker1 -> worker0 its host-side egress.
    cluster = sim_cluster_factory(workers=2, spark=False, link_rates={"worker1": "100mbit"})
    worker0, worker1 = cluster.hosts
    nbytes = 20 << 20
    for sender, receiver in ((worker0, worker1), (worker1, worker0)):
        received, seconds = transfer(cluster, sender, receiver, nbytes)
        mbit_s = received * 8 / seconds / 1e6
        assert received == nbytes
        assert 50 < mbit_s < 110, f"{sender.name} -> {receiver.name}: {mbit_s:.0f} Mbit/s on a 100mbit link"
    # An unshaped pair is far faster: the limit comes from the shaping.
    received, seconds = transfer(cluster, worker0, cluster.driver, nbytes)
    assert received * 8 / seconds / 1e6 > 300


def test_worker_host_cannot_see_the_drivers_temp_files(sim_cluster_factory):
    cluster = sim_cluster_factory(workers=2, spark=False)
    made = cluster.run_driver([PY, "-c", "import tempfile; f = tempfile.NamedTemporaryFile(delete=False); "
                                         "f.write(b'secret'); f.close(); print(f.name)"], check=True)
    path = made.stdout.strip()
    assert os.path.dirname(path) == "/tmp"
    assert cluster.exec("driver", ["cat", path], check=True).stdout == "secret"
    assert cluster.host_path("driver", path).read_bytes() == b"secret"
    for worker in cluster.hosts:
        seen = cluster.exec(worker, ["test", "-e", path])
        assert seen.returncode == 1, f"{worker.name} sees the driver's {path}"
    assert not os.path.exists(path), "the driver's temp file is visible in the root namespace"
    # The code tree stays shared, as installed software is on every host.
    assert cluster.exec("worker0", ["test", "-f", os.path.abspath(__file__)]).returncode == 0


def test_teardown_removes_processes_and_namespaces_even_after_an_error(sim_cluster_factory):
    with pytest.raises(ZeroDivisionError):
        with sim_cluster_factory(workers=2, spark=False, start=False) as cluster:
            cluster_id = cluster.id
            sleeper = cluster.spawn("worker1", ["sleep", "300"])
            assert len(our_namespaces(cluster_id)) == 4  # hub, driver, 2 workers
            1 / 0
    assert our_namespaces(cluster_id) == []
    assert sleeper.poll() is not None
    with pytest.raises(RuntimeError, match="closed"):
        cluster.exec("driver", ["true"])


def test_namespaces_of_a_dead_owner_are_reaped(sim_cluster_factory):
    from tests.harness import netns

    gone = subprocess.Popen(["true"])
    gone.wait()  # its pid now names no process
    name = f"{netns.NAME_PREFIX}-{gone.pid}-abcdef-worker0"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        assert name in netns.reap_stale()
        assert name not in netns.list_netns()
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


def test_sigterm_of_the_owning_process_tears_down(sim_cluster_factory):
    # (the factory only gates: it skips or fails where namespaces cannot be made)
    owner = subprocess.Popen(
        [PY, "-c", "import sys, time\nfrom tests.harness import SimulatedCluster\n"
                   "c = SimulatedCluster(workers=1, spark=False).start()\n"
                   "c.spawn('worker0', ['sleep', '300'])\nprint(c.id, flush=True)\ntime.sleep(300)"],
        stdout=subprocess.PIPE, text=True, cwd=REPO)
    cluster_id = owner.stdout.readline().strip()
    assert cluster_id and len(our_namespaces(cluster_id)) == 3
    owner.send_signal(signal.SIGTERM)
    assert owner.wait(30) == -signal.SIGTERM
    assert our_namespaces(cluster_id) == []


# -- Spark across the hosts --------------------------------------------------------

@pytest.mark.spark
@pytest.mark.slow
def test_master_sees_every_worker_host(sim_cluster):
    done = sim_cluster.run_driver(
        [PY, "-c", f"import urllib.request; print(urllib.request.urlopen('{sim_cluster.master_web_url}/json/', "
                   "timeout=10).read().decode())"], timeout=30, check=True)
    workers = [w for w in json.loads(done.stdout)["workers"] if w["state"] == "ALIVE"]
    assert sorted(w["host"] for w in workers) == sorted(h.ip for h in sim_cluster.hosts)
    assert all(w["cores"] == 1 for w in workers)
    # Spark's scratch space is on each worker host's private /tmp.
    assert sim_cluster.host_path("worker0", "/tmp/spark-worker").is_dir()
    assert not os.path.exists("/tmp/spark-worker") or not os.path.samefile(
        "/tmp/spark-worker", sim_cluster.host_path("worker0", "/tmp/spark-worker"))


# Waits for both executors (the cluster's spark_conf), then reports where each
# task ran: hostname and source address towards the driver, and the worker pid.
WHERE_JOB = r"""
import json, socket, sys
from pyspark.sql import SparkSession
conf, driver_ip = json.loads(sys.argv[1]), sys.argv[2]
builder = SparkSession.builder.appName("simhosts")
for key, value in conf.items():
    builder = builder.config(key, value)
spark = builder.getOrCreate()
sc = spark.sparkContext

def where(_):
    import os, socket
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    probe.connect((driver_ip, 9))
    return socket.gethostname(), probe.getsockname()[0], os.getpid()

def run():
    return sorted(set(sc.parallelize(range(100), 2).map(where).collect()))

print(json.dumps({"driver": socket.gethostname(), "tasks": run()}), flush=True)
if len(sys.argv) > 3:  # a second job once the test says so
    sys.stdin.readline()
    print(json.dumps({"tasks": run()}), flush=True)
spark.stop()
"""


def where_job(cluster, *extra):
    conf = dict(cluster.spark_conf(), **{
        "spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false",
        # the JVMs only schedule here: the quick JIT starts them sooner
        "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1",
        "spark.executor.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"})
    return [PY, "-c", WHERE_JOB, json.dumps(conf), cluster.driver_host, *extra]


@pytest.mark.spark
@pytest.mark.slow
def test_job_from_the_driver_host_runs_on_both_worker_hosts(sim_cluster):
    done = sim_cluster.run_driver(where_job(sim_cluster), timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["driver"] == "driver"
    assert {(name, ip) for name, ip, _ in report["tasks"]} == {(h.name, h.ip) for h in sim_cluster.hosts}


@pytest.mark.spark
@pytest.mark.slow
def test_kill_python_worker_kills_the_task_process_and_spark_recovers(sim_cluster, tmp_path):
    with pytest.raises(LookupError, match="Expect a PySpark Python worker on driver"):
        sim_cluster.kill_python_worker("driver")
    errors = tmp_path / "driver.stderr"
    with open(errors, "w") as stderr:
        driver = sim_cluster.spawn("driver", where_job(sim_cluster, "twice"), stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, stderr=stderr, text=True)
    try:
        first = json.loads(driver.stdout.readline() or "null")
        assert first is not None, f"first job failed:\n{errors.read_text()[-3000:]}"
        pid_before = {name: pid for name, _, pid in first["tasks"]}
        killed = sim_cluster.kill_python_worker("worker0")
        assert killed == [pid_before["worker0"]]  # the (reused) process that ran worker0's task
        assert killed[0] not in sim_cluster.pids("worker0")
        driver.stdin.write("go\n")
        driver.stdin.flush()
        second = json.loads(driver.stdout.readline() or "null")
        assert second is not None, f"second job failed:\n{errors.read_text()[-3000:]}"
        pid_after = {name: pid for name, _, pid in second["tasks"]}
        assert set(pid_after) == {"worker0", "worker1"}
        assert pid_after["worker0"] != pid_before["worker0"]
        assert pid_after["worker1"] == pid_before["worker1"]  # untouched host keeps its worker
        assert driver.wait(60) == 0, errors.read_text()[-3000:]
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()


BUSY = """
import time
cpu, wall = time.process_time(), time.monotonic()
while time.monotonic() - wall < 1.5:
    pass
print(time.process_time() - cpu)
"""


@pytest.mark.slow
def test_a_hosts_cpu_quota_caps_all_its_processes(sim_cluster_factory):
    """cpu=/cpu_limits=/limit_cpu (a cpu cgroup per host): a busy loop on a host gets at most its quota of a core
    (bench_scale.py's hosts and its half-speed host)."""
    from tests.conftest import simhosts_required
    from tests.harness.cpu import cgroup_root

    if cgroup_root() is None:  # the same rule as namespaces: a failure where simulated hosts are required
        message = "no writable cgroup cpu controller here (v1 /sys/fs/cgroup/cpu or v2 'cpu' in subtree_control)"
        if simhosts_required():
            pytest.fail(f"{message} (required: {simhosts_required()})")
        pytest.skip(message)
    cluster = sim_cluster_factory(workers=2, spark=False, cpu=0.2, cpu_limits={"worker1": 0.1})
    assert cluster.cpu_limits() == {"driver": None, "worker0": 0.2, "worker1": 0.1}
    used = {h: float(cluster.exec(h, [sys.executable, "-c", BUSY], timeout=30, check=True).stdout)
            for h in ("worker0", "worker1")}
    assert 0 < used["worker0"] <= 1.5 * 0.2 * 1.25, used  # at most its quota (some slack for the period edges)
    assert 0 < used["worker1"] <= 1.5 * 0.1 * 1.25, used
    cluster.limit_cpu("worker1", None)  # (what it then gets depends on the machine's load: not asserted)
    assert cluster.cpu_limits()["worker1"] is None
    with pytest.raises(ValueError, match="Expect a host's CPU limit as a number of cores > 0"):
        cluster.limit_cpu("worker0", 0)
    # A shorter period keeps the share exact: 0.2 core in 1 ms quotas of 5 ms, 0.1 core's period lengthened to 10 ms.
    assert cluster.limit_cpu("worker0", 0.2, period_us=5000) == 5000
    assert cluster.limit_cpu("worker1", 0.1, period_us=5000) == 10_000
    used = float(cluster.exec("worker0", [sys.executable, "-c", BUSY], timeout=30, check=True).stdout)
    assert 0 < used <= 1.5 * 0.2 * 1.25, used
    with pytest.raises(ValueError, match="quota period"):
        cluster.limit_cpu("worker0", 0.2, period_us=500)
    # What bench_scale reads around a fit: the quota's accounting and the CPU by process and thread.
    throttling = cluster.cpu_throttling()
    assert throttling["worker0"]["throttled"] > 0 and throttling["worker0"]["throttled_s"] > 0, throttling
    assert throttling["worker0"]["periods"] >= throttling["worker0"]["throttled"]


PARENT = """
import os, subprocess, sys
print("ready", flush=True)
sys.stdin.readline()
code = "import os; print(sorted(os.sched_getaffinity(0)))"
print(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip(), flush=True)
"""


@pytest.mark.slow
def test_a_pinned_host_runs_on_its_own_core_and_its_children_inherit_it(sim_cluster_factory):
    """pin_cpu (bench_scale --pin): every thread of the host is bound to the cores named, and so is every
    process it starts later; None binds them to every core again."""
    from tests.conftest import simhosts_required
    from tests.harness.cpu import cgroup_root

    if cgroup_root() is None:
        message = "no writable cgroup cpu controller here (v1 /sys/fs/cgroup/cpu or v2 'cpu' in subtree_control)"
        if simhosts_required():
            pytest.fail(f"{message} (required: {simhosts_required()})")
        pytest.skip(message)
    cluster = sim_cluster_factory(workers=2, spark=False)
    # A process on the host that, once told, starts a child and reports the child's cores.
    parent = cluster.spawn("worker0", [sys.executable, "-c", PARENT], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                           text=True)
    try:
        assert parent.stdout.readline().strip() == "ready"
        core = min(os.sched_getaffinity(0))  # a CPU this machine lets us use (a container may hold a subset)
        assert cluster.pin_cpu("worker0", [core]) >= 1
        assert os.sched_getaffinity(parent.pid) == {core}
        parent.stdin.write("go\n")
        parent.stdin.flush()
        assert parent.stdout.readline().strip() == f"[{core}]"  # started after the pin: it inherited it
        cpu = cluster.thread_cpu()["worker0"]
        assert any(k.startswith("python") for k in cpu), cpu
        assert cluster.pin_cpu("worker0", None) >= 1
        assert os.sched_getaffinity(parent.pid) == os.sched_getaffinity(0)
    finally:
        parent.kill()
        parent.wait()
