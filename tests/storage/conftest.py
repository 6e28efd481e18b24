"""Fixtures of the store contract suite: every backend, against a real ``redis-server``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster as ClusterClient
from redis_cluster import RedisCluster
from redis_server import RedisServer

from storage.base import Store
from storage.cached import CachedStore
from storage.redis import RedisStore
from storage.sqlite import SqliteStore

BACKENDS = ["sqlite", "redis", "cluster", "cached_sqlite", "cached_redis"]


@pytest.fixture
async def redis_client(redis_server: RedisServer) -> AsyncIterator[Redis]:
    """A raw client on a flushed database, to look behind a RedisStore's back."""
    client = Redis.from_url(redis_server.url)
    await client.flushdb()
    yield client
    await client.aclose()


@pytest.fixture
async def redis_store(redis_server: RedisServer, redis_client: Redis) -> AsyncIterator[RedisStore]:
    store = RedisStore(redis_server.url)
    await store.open()
    yield store
    await store.close()


@pytest.fixture
async def cluster_client(redis_cluster: RedisCluster) -> AsyncIterator[ClusterClient]:
    """A raw cluster client on flushed masters."""
    client = ClusterClient.from_url(redis_cluster.url.replace("redis+cluster", "redis"))
    await client.flushdb(target_nodes=ClusterClient.PRIMARIES)
    yield client
    await client.aclose()


@pytest.fixture
async def cluster_store(
    redis_cluster: RedisCluster, cluster_client: ClusterClient
) -> AsyncIterator[RedisStore]:
    store = RedisStore(redis_cluster.url)
    await store.open()
    yield store
    await store.close()


@pytest.fixture
async def sqlite_store(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    store = SqliteStore(f"sqlite:///{tmp_path}/store.db")
    await store.open()
    yield store
    await store.close()


@pytest.fixture
def cached_sqlite_store(sqlite_store: SqliteStore) -> CachedStore:
    """The SQLite store behind the session cache (opened and closed with it)."""
    return CachedStore(sqlite_store, 16 << 20)


@pytest.fixture
def cached_redis_store(redis_store: RedisStore) -> CachedStore:
    return CachedStore(redis_store, 16 << 20)


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest) -> Store:
    """A fresh, open store of each backend, and the first two behind the session cache."""
    backend: Store = request.getfixturevalue(f"{request.param}_store")
    return backend
