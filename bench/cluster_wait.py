"""What ``WAIT 1`` after each append would cost on a Redis Cluster (docs/RELIABILITY.md,
"What replication guarantees"): the append script of a two-message turn on one connection,
one after another, with and without ``WAIT 1 100`` after it (until the replica acknowledged
the write), on a six-node cluster on loopback. Median microseconds per append, three
rounds of 300 each.

    python bench/cluster_wait.py
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import _paths  # noqa: F401  (the repository's packages)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from redis.asyncio.cluster import RedisCluster as ClusterClient
from redis_cluster import RedisCluster

from storage.redis import SESSION_PARTS, _keys
from storage.redis_calls import source
from storage.redis_codec import append_args
from strategies.records import SessionKey, StoredMessage, TurnWrite

APPEND_KEYS = ("meta", "msgs", "active", "users", "stubs", "tools", "writes")
assert set(APPEND_KEYS) <= set(SESSION_PARTS)


def turn_args(i: int) -> list[Any]:
    write = TurnWrite(
        [StoredMessage(role="user", content=f"q{i}", fingerprint=f"a{i}"),
         StoredMessage(role="assistant", content="r", fingerprint=f"b{i}")],
        model="gpt-4o-mini", calibration=1.0,
    )
    now = time.time()
    return append_args(write, now, repr(now).encode())


async def measure(url: str) -> dict[str, list[float]]:
    # one connection per node: the WAIT follows the append on the connection that wrote it
    client = ClusterClient.from_url(url.replace("redis+cluster", "redis"), max_connections=1)
    script = client.register_script(source("append"))
    keys = _keys(SessionKey("ns", "agent", "wait"), *APPEND_KEYS)
    await client.initialize()
    node = client.get_node_from_key(keys[0])
    for _ in range(50):  # until the replica's link is up
        await script(keys, turn_args(0))
        if await client.execute_command("WAIT", 1, 200, target_nodes=node) == 1:
            break
    medians: dict[str, list[float]] = {"append": [], "append + WAIT 1": []}
    for _ in range(3):
        for mode in medians:
            took = []
            for i in range(300):
                args = turn_args(i)
                started = time.perf_counter()
                await script(keys, args)
                if mode != "append":
                    assert await client.execute_command("WAIT", 1, 100, target_nodes=node) == 1
                took.append((time.perf_counter() - started) * 1e6)
            medians[mode].append(statistics.median(took))
    await client.aclose()
    return medians


def main() -> None:
    with RedisCluster() as cluster:
        medians = asyncio.run(measure(cluster.url))
    for mode, values in medians.items():
        print(f"{mode:>16}: {' '.join(f'{v:.0f}' for v in values)} us per append (medians)")


if __name__ == "__main__":
    main()
