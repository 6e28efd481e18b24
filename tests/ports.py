"""Loopback ports for the servers tests start: below the kernel's ephemeral range, one
block per xdist worker.

A port the kernel hands out for ``bind(0)`` comes from the ephemeral range, the same range
every outgoing connection takes its local port from. With four workers opening thousands
of connections, a port probed free is often taken by someone's client socket before
``redis-server`` binds it — or while a test has the server stopped to restart it on the
same port. Ports below the ephemeral range are never handed out implicitly, and each
worker takes its own block, so a port given here stays free until its owner binds it.

A Redis Cluster node also binds its bus port (port + 10000): ``free_port(bus=True)``
checks both and keeps both below the ephemeral range.
"""

from __future__ import annotations

import itertools
import os
import socket
from pathlib import Path

FIRST = 10000
BUS_OFFSET = 10000


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _worker_block() -> range:
    """This process's share of the ports below the ephemeral range (the bus ports too)."""
    last = _ephemeral_low() - BUS_OFFSET
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index = int(worker.removeprefix("gw") or 0)
    count = max(int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")), index + 1)
    size = (last - FIRST) // count
    return range(FIRST + index * size, FIRST + (index + 1) * size)


_BLOCK = _worker_block()
_CANDIDATES = itertools.cycle(_BLOCK)


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port(*, bus: bool = False) -> int:
    """A loopback port nothing is bound to, from this worker's block; with ``bus``, one
    whose cluster bus port (port + 10000) is free as well."""
    for port in itertools.islice(_CANDIDATES, len(_BLOCK)):
        if _bindable(port) and (not bus or _bindable(port + BUS_OFFSET)):
            return port
    raise RuntimeError(f"no free port in {_BLOCK}")


__all__ = ["free_port"]
