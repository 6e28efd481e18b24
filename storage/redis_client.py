"""The redis-py client of a store URL, and the errors that mean "Redis is unavailable".

    redis://[user:password@]host:port/db           one server (rediss:// for TLS)
    redis+cluster://[user:password@]host:port      a Redis Cluster (rediss+cluster://)
    redis+sentinel://[user:password@]host:port[,host:port...]/service[/db]
                                                   the master Sentinel names for service

For a cluster, any node is a starting point: the client reads the slot map from it and
follows the cluster's changes (a failover, a resharding). For Sentinel, the password (if
any) is the master's; the sentinels are asked without one.

No command is retried by redis-py: a script whose reply was lost may still have run, so
the store decides what to do about it (see ``RedisStore.append_turn``), and a Redis that
is down fails a request at once instead of holding it through backoffs.

A stalled Redis fails a call within ``SOCKET_TIMEOUT``. On one server (and behind
Sentinel) the store puts that deadline around each whole call (``call_timeout``): with a
socket timeout of its own, redis-py runs every write in a task under ``wait_for``, which
cost more CPU than the rest of the call. A cluster client keeps the socket timeout: it is
what tells redis-py to read the slot map again (a stalled master being failed over).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote, urlsplit

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.connection import Connection, SSLConnection
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool
from redis.backoff import NoBackoff
from redis.connection import HiredisRespSerializer
from redis.exceptions import (
    ClusterDownError,
    ConnectionError,
    MasterDownError,
    ReadOnlyError,
    RedisClusterException,
    TimeoutError,
    TryAgainError,
)

__all__ = ["SCHEMES", "SOCKET_TIMEOUT", "UNAVAILABLE", "call_timeout", "connect", "disconnect"]

# A stalled Redis must fail a request fast instead of hanging it.
SOCKET_TIMEOUT = 1.5
# Connections per cluster node and process. redis-py's cluster client fails a command when
# its node's pool is full instead of waiting (its default, 100, fails turns at 150
# concurrent requests); a connection is cheap, Redis allows 10,000 clients by default.
CLUSTER_CONNECTIONS = 2000
SCHEMES = ("redis", "rediss", "redis+cluster", "rediss+cluster", "redis+sentinel")

# Redis cannot serve the command now; another try later may succeed. Besides lost and
# refused connections and timeouts (``BusyLoadingError`` is a ``ConnectionError``): a
# cluster that is failing over (CLUSTERDOWN, TRYAGAIN, MASTERDOWN, a slot map that cannot
# be read) and a write that reached a master just demoted to a replica (READONLY).
UNAVAILABLE: tuple[type[Exception], ...] = (
    ConnectionError,
    TimeoutError,
    ClusterDownError,
    TryAgainError,
    MasterDownError,
    ReadOnlyError,
    RedisClusterException,
)


class HiredisConnection(Connection):
    """redis-py's connection, packing commands with hiredis as its synchronous client does
    (its asyncio client packs them in Python: a fifth of a turn's CPU in the store)."""

    _packer = HiredisRespSerializer()

    def pack_command(self, *args: Any) -> list[bytes]:
        return self._packer.pack(*args)


class HiredisSSLConnection(SSLConnection):
    _packer = HiredisRespSerializer()

    def pack_command(self, *args: Any) -> list[bytes]:
        return self._packer.pack(*args)


def connect(url: str) -> Redis | RedisCluster:
    """The client for ``url`` (nothing connects yet)."""
    scheme, _, rest = url.partition("://")
    scheme = scheme.lower()
    options: dict[str, Any] = {
        "socket_timeout": None,
        "socket_connect_timeout": SOCKET_TIMEOUT,
        "retry": Retry(NoBackoff(), 0),
        "decode_responses": False,
    }
    if scheme in ("redis+cluster", "rediss+cluster"):
        plain = scheme.removesuffix("+cluster")
        # a slot whose master is gone fails its own commands only; the rest serve on
        options["socket_timeout"] = SOCKET_TIMEOUT
        return RedisCluster.from_url(f"{plain}://{rest}", require_full_coverage=False,
                                     max_connections=CLUSTER_CONNECTIONS, **options)
    if scheme == "redis+sentinel":
        return _sentinel_master(rest, options)
    if scheme not in SCHEMES:
        raise ValueError(f"not a Redis URL scheme: {scheme!r}")
    tls = scheme == "rediss"
    return Redis.from_url(url, connection_class=HiredisSSLConnection if tls else HiredisConnection,
                          **options)


def call_timeout(client: Redis | RedisCluster) -> float | None:
    """The deadline the store puts around each call to ``client`` (None: the client's
    socket timeout is the deadline)."""
    return None if isinstance(client, RedisCluster) else SOCKET_TIMEOUT


async def disconnect(client: Redis | RedisCluster) -> None:
    """Close ``client``'s connections (for Sentinel, those to the sentinels too)."""
    await client.aclose()
    pool = getattr(client, "connection_pool", None)
    if isinstance(pool, SentinelConnectionPool):
        for sentinel in pool.sentinel_manager.sentinels:
            await sentinel.aclose()


def _sentinel_master(rest: str, options: dict[str, Any]) -> Redis:
    parts = urlsplit(f"//{rest}")
    hosts = parts.netloc.rpartition("@")[2]
    sentinels = []
    for host in hosts.split(","):
        name, _, port = host.rpartition(":")
        sentinels.append((name or host, int(port or 26379)))
    path = [p for p in parts.path.split("/") if p]
    if not path:
        raise ValueError("a redis+sentinel:// URL names the service: .../service[/db]")
    service, db = unquote(path[0]), int(path[1]) if len(path) > 1 else 0
    sentinel = Sentinel(
        sentinels,
        sentinel_kwargs={"socket_timeout": SOCKET_TIMEOUT,
                         "socket_connect_timeout": SOCKET_TIMEOUT},
    )
    password = unquote(parts.password) if parts.password else None
    username = unquote(parts.username) if parts.username else None
    master: Redis = sentinel.master_for(service, db=db, password=password,
                                        username=username, **options)
    return master
