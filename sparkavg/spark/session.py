"""Spark settings sparkavg relies on, and a check of a running session.

Every averaging round returns a parameter + updater-state vector per worker;
Spark ships a task result larger than ``spark.task.maxDirectResultSize``
(default 1 MB) through the block manager: one more copy and round trip.
These settings can only be given when the session starts, so
:func:`recommended_conf` returns them for the builder and
:func:`check_session` says when the result size is not covered.
"""
from __future__ import annotations

import logging
import re
from typing import Dict

__all__ = ["recommended_conf", "check_session", "check_result_path", "size_bytes", "check_security",
           "SECURITY_SETTINGS"]

logger = logging.getLogger(__name__)

#: Spark caps direct results at spark.rpc.message.maxSize (default 128 MB).
_DIRECT_RESULT = "128m"

_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def size_bytes(text: str) -> int:
    """Parse a Spark size string (``"1m"``, ``"512k"``, ``"1048576"``, ``"2gb"``) to bytes."""
    match = re.fullmatch(r"(\d+)([kmgt]?)b?", str(text).strip().lower())
    if match is None:
        raise ValueError(f"Expect a Spark size such as '1m' or '1048576', got {text!r}")
    return int(match.group(1)) * _UNITS[match.group(2)]


def recommended_conf(master: str = "local[2]") -> Dict[str, str]:
    """Session settings for sparkavg, to pass to ``SparkSession.builder.config``
    (each measured by ``benchmarks/bench_spark_session.py``; the figures are in
    ``benchmarks/history/averaging.md``):

    - ``spark.python.unix.domain.socket.enabled``: the JVM talks to its Python
      workers over Unix domain sockets, not TCP loopback: a task starts sooner
      (Spark 4.1+; older versions ignore it).
    - ``spark.task.maxDirectResultSize``: round results come back with the
      task status, not through the block manager.
    - ``spark.broadcast.compress``: off: lz4 cannot shrink float parameters and
      optimizer state, and (de)compressing them costs every round.
    - ``spark.ui.showConsoleProgress``: off, so that sparkavg's own progress
      lines are readable.
    - for a ``local`` master only, ``-XX:TieredStopAtLevel=1`` on the driver
      JVM: it shares the cores with the Python workers, and its optimising
      (C2) JIT compiler takes CPU from them in the first epochs.  If you set
      ``spark.driver.extraJavaOptions`` yourself, append this flag to yours:
      a later ``config`` call replaces the whole value.
    """
    conf = {"spark.task.maxDirectResultSize": _DIRECT_RESULT,
            "spark.python.unix.domain.socket.enabled": "true",
            "spark.broadcast.compress": "false",
            "spark.ui.showConsoleProgress": "false"}
    if str(master).startswith("local"):
        conf["spark.driver.extraJavaOptions"] = "-XX:TieredStopAtLevel=1"
    return conf


def check_session(sc, result_bytes: int) -> bool:
    """Warn when task results of ``result_bytes`` would take the
    block-manager detour; True when the session is set up for them."""
    return check_result_path(sc.getConf().get("spark.task.maxDirectResultSize", "1m"), result_bytes)


def check_result_path(configured: str, result_bytes: int) -> bool:
    """:func:`check_session` given the session's ``spark.task.maxDirectResultSize``."""
    try:
        limit = size_bytes(configured)
    except ValueError:
        logger.warning("cannot read spark.task.maxDirectResultSize=%r; expected a size such as '128m'", configured)
        return False
    if result_bytes + (64 << 10) <= limit:  # pickling adds a little
        return True
    logger.warning(
        "each worker returns %.1f MB per round but spark.task.maxDirectResultSize is %s: results take a "
        "detour through the block manager (tens of ms per round). Start the session with "
        "spark.task.maxDirectResultSize=%s (sparkavg.spark.recommended_conf()).",
        result_bytes / 1e6, configured, _DIRECT_RESULT)
    return False


#: Spark's own protection of its channels: authentication of its RPC, encryption of the network and of
#: what it spills to local disk (broadcast blocks included).
SECURITY_SETTINGS = ("spark.authenticate", "spark.network.crypto.enabled", "spark.io.encryption.enabled")

_security_warned: set = set()  # the combinations of settings off already warned about, once per process


def check_security(conf) -> list:
    """Warn once per process (per combination) when Spark's authentication or
    encryption is off; returns the settings that are off.

    ``conf(key, default)`` reads the session's configuration.  Gradient
    sharing's UDP keys are agreed by its ranks and never shipped, but the
    task closure and the broadcast of the parameters travel over Spark's own
    channels, protected only by these settings.
    """
    off = []
    for key in SECURITY_SETTINGS:
        try:
            value = conf(key, "false")
        except Exception:  # a Connect server that will not say: counted as off
            value = None
        if str(value).strip().lower() != "true":
            off.append(f"{key}={value}")
    if off and tuple(off) not in _security_warned:
        _security_warned.add(tuple(off))
        logger.warning(
            "Spark's authentication or encryption is off (%s): gradient sharing's UDP datagram keys are now "
            "agreed by the ranks (X25519) and never shipped, but Spark's own channels -- the task closure, the "
            "broadcast of the parameters (and its blocks on local disk) -- are still in clear, and whoever can "
            "alter them can replace the ranks' public keys; on an untrusted network start the session with "
            "spark.authenticate=true, spark.network.crypto.enabled=true and spark.io.encryption.enabled=true",
            ", ".join(off))
    return off
