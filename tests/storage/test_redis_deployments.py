"""Which Redis a store URL reaches: one server, a cluster, or the master Sentinel names."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from contract_support import KEY, assistant, load, user
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster as ClusterClient
from redis_cluster import SentinelServer
from redis_server import RedisServer

from storage import open_store
from storage.base import StoreUnavailable
from storage.redis import RedisStore
from storage.redis_client import connect
from strategies.records import TurnWrite

ROOT = Path(__file__).resolve().parents[2]


async def test_the_url_scheme_picks_the_client() -> None:
    assert type(connect("redis://127.0.0.1:1/0")) is Redis
    assert type(connect("rediss://127.0.0.1:1/0")) is Redis
    assert type(connect("redis+cluster://127.0.0.1:1")) is ClusterClient
    assert type(connect("rediss+cluster://127.0.0.1:1")) is ClusterClient
    assert type(connect("redis+sentinel://127.0.0.1:1,127.0.0.1:2/mymaster/0")) is Redis
    assert isinstance(open_store("redis+cluster://127.0.0.1:1"), RedisStore)
    with pytest.raises(ValueError, match="service"):
        connect("redis+sentinel://127.0.0.1:1")


async def test_a_store_behind_sentinel_writes_to_the_master_it_names() -> None:
    with RedisServer() as master, SentinelServer(master) as sentinel:
        store = RedisStore(sentinel.url)
        await store.open()
        try:
            await store.append_turn(KEY, TurnWrite([user("q"), assistant("a")]))

            assert await load(store) == ["q", "a"]
            assert [s.session for s in await store.list_sessions(KEY.agent)] == [KEY.session]
        finally:
            await store.close()
        direct = Redis.from_url(master.url)
        assert await direct.exists(f"mp:{KEY.tag}:meta") == 1
        await direct.aclose()


def test_docker_compose_runs_two_proxies_on_a_cluster_in_its_cluster_profile() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    cluster = {name for name, service in services.items()
               if "cluster" in service.get("profiles", [])}
    nodes = sorted(name for name in cluster if name.startswith("redis-node-"))
    proxies = [services[name] for name in cluster if name.startswith("memory-proxy")]

    assert len(nodes) == 6
    assert all("--cluster-enabled" in services[name]["command"] for name in nodes)
    assert "--cluster-replicas 1" in services["redis-cluster-init"]["command"][0]
    assert len(proxies) == 2
    for proxy in proxies:
        url = proxy["environment"]["MEMORY_PROXY_STORE_URL"]
        assert url.startswith("redis+cluster://redis-node-")
        assert proxy["depends_on"] == {
            "redis-cluster-init": {"condition": "service_completed_successfully"}}
    assert not {"redis", "memory-proxy"} & cluster  # the default services stay as they were


async def test_a_store_pointed_at_a_replica_is_unavailable_for_writes_not_broken() -> None:
    """A master demoted to a replica by a failover answers writes with READONLY, an error
    reply: the store reports itself unavailable (a 503), never an internal error."""
    with RedisServer() as master, RedisServer() as replica:
        raw = Redis.from_url(replica.url)
        await raw.replicaof("127.0.0.1", master.port)
        await raw.aclose()
        store = RedisStore(replica.url)
        await store.open()
        try:
            with pytest.raises(StoreUnavailable, match="read only replica"):
                await store.append_turn(KEY, TurnWrite([user("q")]))
            with pytest.raises(StoreUnavailable, match="read only replica"):
                await store.set_agent_config(KEY.agent, {"name": KEY.agent})
        finally:
            await store.close()
