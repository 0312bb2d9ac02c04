"""Which local IPv4 address a worker binds and advertises to its peers."""
from __future__ import annotations

import ipaddress
import json
import logging
import os
import re
import shutil
import socket
import subprocess

__all__ = ["ENV_VAR", "local_ipv4_addresses", "select_address"]

logger = logging.getLogger(__name__)

#: Environment variable consulted when neither an explicit address nor a
#: matching network mask gives one (DL4J: ``DL4J_VOID_IP``).
ENV_VAR = "SPARKAVG_IP"


def local_ipv4_addresses() -> list[str]:
    """IPv4 addresses of this machine's interfaces, in interface order.

    Reads ``ip -j addr`` when the ``ip`` tool exists, else the ``LOCAL``
    entries of ``/proc/net/fib_trie``; returns ``[]`` if neither works.
    """
    ip_tool = shutil.which("ip")
    if ip_tool:
        try:
            res = subprocess.run([ip_tool, "-j", "-4", "addr"], capture_output=True, timeout=5, check=True)
            found = [info["local"] for iface in json.loads(res.stdout)
                     for info in iface.get("addr_info", []) if info.get("family") == "inet"]
            if found:
                return found
        except (OSError, subprocess.SubprocessError, ValueError, KeyError, TypeError) as exc:
            logger.debug("ip -j addr failed: %s", exc)
    try:
        with open("/proc/net/fib_trie") as fh:
            text = fh.read()
    except OSError as exc:
        logger.debug("cannot read /proc/net/fib_trie: %s", exc)
        return []
    # "|-- 10.1.1.5\n   /32 host LOCAL": an address assigned to this host.
    found = re.findall(r"\|-- (\d+\.\d+\.\d+\.\d+)\n\s+/32 host LOCAL", text)
    return list(dict.fromkeys(found))


def select_address(network_mask: str | None = None, explicit: str | None = None,
                   fallback: str | None = None) -> str:
    """Pick the address this worker binds and advertises.

    Order, first that applies wins:

    1. ``explicit`` when given (returned as is).
    2. The first local interface address inside ``network_mask`` (CIDR,
       e.g. ``"10.1.1.0/24"``; see :func:`local_ipv4_addresses`). If no
       interface matches, a warning is logged and the search goes on.
    3. The environment variable ``SPARKAVG_IP``.
    4. ``fallback`` when given: on Spark, the address the executor is known
       by to the cluster (its Spark host), which peers can reach.
    5. The address the hostname resolves to.
    6. ``"127.0.0.1"`` if even that fails (logged as a warning).

    Parameters
    ----------
    network_mask : str, optional
        IPv4 network in CIDR notation.
    explicit : str, optional
        Address to use verbatim.
    fallback : str, optional
        Address (or host name, resolved here) to use before the hostname.

    Returns
    -------
    str
    """
    if explicit:
        return explicit.strip()
    if network_mask:
        try:
            network = ipaddress.ip_network(network_mask.strip(), strict=False)
        except ValueError as exc:
            raise ValueError(f"Expect network_mask in CIDR form like '10.1.1.0/24', got {network_mask!r}") from exc
        addresses = local_ipv4_addresses()
        for addr in addresses:
            if ipaddress.ip_address(addr) in network:
                return addr
        logger.warning("no local interface address in network_mask %s (have %s); falling back",
                       network_mask, addresses)
    env = os.environ.get(ENV_VAR, "").strip()
    if env:
        return env
    if fallback:
        try:
            return socket.gethostbyname(fallback.strip())
        except OSError as exc:
            logger.warning("cannot resolve the fallback address %r (%s); trying the hostname", fallback, exc)
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError as exc:
        logger.warning("cannot resolve this host's name (%s); using 127.0.0.1", exc)
        return "127.0.0.1"
