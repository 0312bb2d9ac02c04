"""Shared fixtures: hypothesis profiles, one Spark session, a standalone
cluster on loopback, the Fashion-MNIST folder, and GPU skipping."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("dev", max_examples=50, deadline=None)
settings.register_profile(
    "ci", max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))

# Spark's Python workers must run the interpreter (and venv) the tests run in.
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
# ... and import the tests' own modules (torch module factories named
# "tests.torch_models:..."), as a user's executors import the user's package:
# every JVM the tests start (local, standalone, Connect server) hands its
# PYTHONPATH to its Python workers.
_ROOT = str(Path(__file__).resolve().parent.parent)
if _ROOT not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (_ROOT, os.environ.get("PYTHONPATH", "")) if p)

FASHION_DIR = Path(os.environ.get("SPARKAVG_FASHION_DIR", "/usr/share/datasets/fashion-mnist"))


@pytest.fixture(scope="session")
def fashion_dir() -> Path:
    """Folder with Fashion-MNIST IDX files (Debian package dataset-fashion-mnist)."""
    if not (FASHION_DIR / "train-images-idx3-ubyte.gz").exists():
        pytest.fail(
            f"Fashion-MNIST not found in {FASHION_DIR}: install it with "
            "'apt-get install dataset-fashion-mnist' or set SPARKAVG_FASHION_DIR"
        )
    return FASHION_DIR


def _gpu_available() -> bool:
    from sparkavg import backend

    return backend.available()


def pytest_collection_modifyitems(config, items):
    if any("gpu" in item.keywords for item in items) and not _gpu_available():
        skip = pytest.mark.skip(reason="no CUDA device / CuPy on this machine")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


@pytest.fixture(scope="session")
def spark():
    """One local[2] SparkSession (task retries on) for the whole run (UI off, temp local dir)."""
    from pyspark.sql import SparkSession

    from sparkavg.spark import recommended_conf

    local_dir = tempfile.mkdtemp(prefix="sparkavg-spark-")
    builder = SparkSession.builder
    for key, value in recommended_conf("local[2,4]").items():
        builder = builder.config(key, value)
    session = (
        builder.master("local[2,4]")  # 4 attempts: local mode retries only this way
        .appName("sparkavg-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.local.dir", local_dir)
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.python.worker.reuse", "true")
        .config("spark.task.maxFailures", "4")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
    shutil.rmtree(local_dir, ignore_errors=True)


@pytest.fixture()
def sc(spark):
    return spark.sparkContext


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_port(port: int, timeout: float, what: str, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise RuntimeError(f"{what} did not open port {port} within {timeout}s; log:\n{log.read_text()[-3000:]}")


@pytest.fixture(scope="session")
def standalone_cluster(tmp_path_factory):
    """A real Spark standalone master and two workers on 127.0.0.1, started
    with ``spark-class`` from the installed pyspark; yields the master URL."""
    import pyspark

    spark_home = Path(pyspark.__file__).parent
    spark_class = spark_home / "bin" / "spark-class"
    workdir = tmp_path_factory.mktemp("standalone")
    env = dict(os.environ, SPARK_HOME=str(spark_home), SPARK_LOCAL_IP="127.0.0.1",
               SPARK_WORKER_DIR=str(workdir / "work"), PYSPARK_PYTHON=sys.executable)
    port, web = _free_port(), _free_port()
    procs = []
    logs = []

    def start(args, name):
        log = workdir / f"{name}.log"
        logs.append(log)
        fh = open(log, "w")
        procs.append(subprocess.Popen([str(spark_class), *args], env=env, stdout=fh,
                                      stderr=subprocess.STDOUT, cwd=workdir))
        return log

    try:
        mlog = start(["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port",
                      str(port), "--webui-port", str(web)], "master")
        _wait_port(port, 60, "Spark master", mlog)
        url = f"spark://127.0.0.1:{port}"
        for i in range(2):
            start(["org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--cores", "1",
                   "--memory", "1g", "--webui-port", str(_free_port()), url], f"worker{i}")
        # Workers register asynchronously; the master log says so.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and mlog.read_text().count("Registering worker") < 2:
            time.sleep(0.2)
        if mlog.read_text().count("Registering worker") < 2:
            raise RuntimeError("standalone workers did not register:\n" + mlog.read_text()[-3000:])
        yield url
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()


# -- simulated hosts (tests/harness): network + mount namespaces, needs root --

SIM_FIXTURES = ("sim_cluster", "sim_cluster_factory")


def simhosts_required():
    """Why simulated hosts must work here (a reason), or None when tests may skip.

    ``SPARKAVG_REQUIRE_SIMHOSTS=1`` requires them, ``=0`` never; unset, they
    are required on CI (``CI=true``, which CI services set) when running as
    root with iproute2 -- there a namespace failure is a failure, not a skip.
    """
    flag = os.environ.get("SPARKAVG_REQUIRE_SIMHOSTS", "")
    if flag:
        return "SPARKAVG_REQUIRE_SIMHOSTS is set" if flag != "0" else None
    if (os.environ.get("CI", "").lower() in ("true", "1") and hasattr(os, "geteuid") and os.geteuid() == 0
            and shutil.which("ip") is not None):
        return "CI=true, running as root with iproute2"
    return None


def _simulated_cluster_class():
    """SimulatedCluster, or a skip that says exactly why namespaces cannot be
    made here; a failure instead where they are required (:func:`simhosts_required`)."""
    from tests.harness import SimulatedCluster

    ok, reason = SimulatedCluster.available()
    if not ok:
        message = f"simulated hosts unavailable: {reason}"
        required = simhosts_required()
        if required:
            pytest.fail(f"{message} (required: {required})")
        pytest.skip(message)
    return SimulatedCluster


# Outcomes of the tests on simulated hosts, summed up at the end of the run so
# that even ``pytest -q`` shows whether they ran.
_sim_outcomes: dict = {}
_sim_nodeids: set = set()


def pytest_itemcollected(item):
    if any(name in getattr(item, "fixturenames", ()) for name in SIM_FIXTURES):
        _sim_nodeids.add(item.nodeid)


def pytest_runtest_logreport(report):
    if report.nodeid not in _sim_nodeids:
        return
    if report.when == "call" or (report.when == "setup" and not report.passed):
        outcome = "error" if report.when == "setup" and report.failed else report.outcome
        _sim_outcomes[report.nodeid] = outcome


def pytest_terminal_summary(terminalreporter):
    if not _sim_outcomes:
        return
    counts = {}
    for outcome in _sim_outcomes.values():
        counts[outcome] = counts.get(outcome, 0) + 1
    from tests.harness import SimulatedCluster

    ok, reason = SimulatedCluster.available()
    required = simhosts_required()
    terminalreporter.write_line(
        f"simulated hosts (network + mount namespaces): {', '.join(f'{n} {o}' for o, n in sorted(counts.items()))}"
        f"; namespaces {'available' if ok else 'unavailable: ' + reason}"
        f"; {'required (' + required + ')' if required else 'not required (skips allowed)'}")


@pytest.fixture(scope="session")
def sim_cluster(tmp_path_factory):
    """A Spark standalone cluster of simulated hosts: a driver host (Master,
    driver programs via ``run_driver``) and 2 worker hosts x 1 core, each in
    its own network and mount namespace; logs under the pytest temp dir."""
    cls = _simulated_cluster_class()
    with cls(workers=2, cores_per_worker=1, memory="1g",
             log_dir=tmp_path_factory.mktemp("sim_cluster")) as cluster:
        yield cluster


@pytest.fixture()
def sim_cluster_factory(tmp_path):
    """``make(**kwargs)`` starts a SimulatedCluster of another shape
    (``workers=3``, ``rate="100mbit"``, ``spark=False`` ...; ``start=False``
    returns it unstarted); all are torn down when the test ends."""
    cls = _simulated_cluster_class()
    clusters = []

    def make(start=True, **kwargs):
        kwargs.setdefault("log_dir", tmp_path / f"sim_cluster{len(clusters)}")
        cluster = cls(**kwargs)
        clusters.append(cluster)
        return cluster.start() if start else cluster

    yield make
    errors = []
    for cluster in reversed(clusters):
        try:
            cluster.close()
        except Exception as exc:  # close every cluster, then report
            errors.append(exc)
    if errors:
        raise errors[0]


# -- Spark Connect: a local server in its own JVM, started from the installed pyspark --

@pytest.fixture(scope="session")
def connect_server(tmp_path_factory):
    """A Spark Connect server (``local[2,4]``, recommended_conf, UI off) in its
    own JVM from the installed pyspark, bound to 127.0.0.1 with a fresh
    token; yields its ``sc://`` URL (see :mod:`tests.harness.connect`)."""
    from tests.harness.connect import connect_server as server

    workdir = tmp_path_factory.mktemp("connect")
    conf = {"spark.local.dir": str(workdir / "local"), "spark.sql.shuffle.partitions": "4",
            "spark.task.maxFailures": "4"}
    with server("local[2,4]", str(workdir / "server.log"), conf, timeout=180, cwd=str(workdir)) as url:
        yield url


@pytest.fixture(scope="session")
def connect_session(connect_server):
    """One Spark Connect session on :func:`connect_server` for the whole run."""
    from pyspark.sql.connect.session import SparkSession as RemoteSparkSession

    session = RemoteSparkSession.builder.remote(connect_server).getOrCreate()
    yield session
    session.stop()


@pytest.fixture()
def connect(connect_session, monkeypatch):
    """The Connect session, with this process in Connect mode for the test.

    pyspark decides per process (``SPARK_CONNECT_MODE_ENABLED``, set by
    ``builder.remote``) whether ``pyspark.sql.functions`` and ``pyspark.ml``
    speak Connect; a Connect program sets it once, and here it is set only
    while a Connect test runs so that classic tests in the same run stay
    classic."""
    monkeypatch.setenv("SPARK_CONNECT_MODE_ENABLED", "1")
    return connect_session


@pytest.fixture(scope="session")
def _mlflow_schema(tmp_path_factory):
    """An empty SQLite tracking store with MLflow's schema, made once: creating the schema
    (MLflow's migrations) takes seconds; each test's store is a copy of this file."""
    mlflow = pytest.importorskip("mlflow")
    path = tmp_path_factory.mktemp("mlflow_schema") / "mlflow.db"
    mlflow.tracking.MlflowClient(tracking_uri=f"sqlite:///{path}").search_experiments()
    return path
