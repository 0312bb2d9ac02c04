"""A Spark Connect server in its own JVM, started from the installed pyspark.

``SparkSession.builder.remote("local[2]")`` would start the server inside
the calling process, which pyspark refuses while that process holds a
classic SparkContext; in its own process the server is also what a
Connect client really talks to.
"""
from __future__ import annotations

import contextlib
import os
import secrets
import socket
import subprocess
import sys
import time
from typing import Dict, Iterator, Optional

__all__ = ["connect_server"]

_CLIENT_MODE_VARS = ("SPARK_REMOTE", "SPARK_LOCAL_REMOTE", "SPARK_CONNECT_MODE_ENABLED")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def connect_server(master: str, log_path: str, conf: Optional[Dict[str, str]] = None,
                   timeout: float = 180.0, cwd: Optional[str] = None) -> Iterator[str]:
    """Run a Spark Connect server for ``master`` on 127.0.0.1; yields its ``sc://`` URL.

    The server gets :func:`sparkavg.spark.recommended_conf`, the UI off, a
    fresh authentication token and ``conf`` on top; its output goes to
    ``log_path``; it runs in ``cwd`` (where Spark may leave a warehouse
    folder).  It is stopped on leaving the block.
    """
    import pyspark

    from sparkavg.spark import recommended_conf

    home = os.path.dirname(pyspark.__file__)
    token, port = secrets.token_hex(16), _free_port()
    env = dict(os.environ, SPARK_HOME=home, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable,
               SPARK_CONNECT_MODE="0", SPARK_CONNECT_AUTHENTICATE_TOKEN=token)
    for var in _CLIENT_MODE_VARS:
        env.pop(var, None)
    settings = {**recommended_conf(master), "spark.ui.enabled": "false", **(conf or {}),
                "spark.connect.grpc.binding.address": "127.0.0.1", "spark.connect.grpc.binding.port": str(port)}
    args = [os.path.join(home, "bin", "spark-submit"), "--class",
            "org.apache.spark.sql.connect.service.SparkConnectServer", "--master", master]
    for key, value in settings.items():
        args += ["--conf", f"{key}={value}"]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=cwd)
    try:
        deadline = time.monotonic() + timeout
        while True:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                with open(log_path) as fh:
                    tail = fh.read()[-3000:]
                raise RuntimeError(f"Expect the Spark Connect server to open port {port} within {timeout:g} s, "
                                   f"got exit status {proc.poll()}; {log_path}:\n{tail}")
            time.sleep(0.3)
        yield f"sc://localhost:{port}/;token={token}"
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
