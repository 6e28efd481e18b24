"""Two ``memory-proxy serve`` processes on a Redis Cluster (three masters, three
replicas): concurrent turns of many sessions spread over the slots are each stored once,
in order; a master killed under load fails the turns on its slots fast with a 503 until
its replica takes over, then they recover by themselves, and no acknowledged turn is lost.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2e import ADMIN_TOKEN, CLIENT_KEY
from redis_cluster import RedisCluster
from reliability_support import ProxyProcess, is_openai_error, report, start_proxies
from test_concurrent_turns import TURNS_PER_WRITER, WRITERS, check_log, read_session, run_writers

from proxy.testing.fake_upstream import FakeUpstream
from proxy.turn.identity import namespace_for
from storage.redis import RedisStore
from strategies.records import SessionKey

AGENT = "helper"


def spread_sessions(cluster: RedisCluster, per_master: int) -> dict[str, int]:
    """Session names, ``per_master`` on each master: name -> the port serving it."""
    found: dict[str, int] = {}
    counts: Counter[int] = Counter()
    masters = len(cluster.nodes) // 2
    index = 0
    while len(found) < per_master * masters:
        name = f"spread-{index}"
        index += 1
        tag = SessionKey(namespace_for(CLIENT_KEY), AGENT, name).tag
        port = cluster.master_of(f"mp:{tag}:meta").port
        if counts[port] < per_master:
            counts[port] += 1
            found[name] = port
    return found


def two_proxies(url: str, fake: FakeUpstream, root: Path) -> list[ProxyProcess]:
    agents = root / "agents"
    agents.mkdir(exist_ok=True)
    env = {"MEMORY_PROXY_STORE_URL": url, "MEMORY_PROXY_UPSTREAM_URL": fake.url,
           "MEMORY_PROXY_AGENTS_DIR": str(agents), "MEMORY_PROXY_ADMIN_TOKEN": ADMIN_TOKEN,
           "MEMORY_PROXY_LOG_LEVEL": "warning"}
    return start_proxies(2, env, root)


@pytest.fixture
def flushed_cluster(redis_cluster: RedisCluster) -> RedisCluster:
    for node in redis_cluster.nodes:
        if node.ping() and node.cli("INFO", "replication")["role"] == "master":
            node.cli("FLUSHALL")
    return redis_cluster


async def listed_sessions(url: str) -> set[str]:
    store = RedisStore(url)
    await store.open()
    try:
        return {s.session for s in await store.list_sessions(AGENT, limit=10_000)}
    finally:
        await store.close()


def test_two_proxy_processes_on_a_cluster_store_every_turn_of_many_sessions_once(
    flushed_cluster: RedisCluster, fake: FakeUpstream, tmp_path: Path
) -> None:
    sessions = spread_sessions(flushed_cluster, per_master=2)
    processes = two_proxies(flushed_cluster.url, fake, tmp_path)
    started = time.monotonic()

    async def every_session() -> list[int]:
        # two sessions at a time: 100 concurrent turns, as many as the machine serves
        # without its own stalls turning into client timeouts
        names, done = list(sessions), []
        for first in range(0, len(names), 2):
            done += await asyncio.gather(*(
                run_writers([f"{p.base}/agents/{AGENT}/sessions/{name}/v1" for p in processes])
                for name in names[first:first + 2]
            ))
        return done

    try:
        acknowledged = asyncio.run(every_session())
    finally:
        for process in processes:
            process.stop()
    seconds = time.monotonic() - started

    assert acknowledged == [WRITERS * TURNS_PER_WRITER] * len(sessions)
    for name in sessions:
        check_log(*asyncio.run(read_session(flushed_cluster.url, name)))
    assert asyncio.run(listed_sessions(flushed_cluster.url)) == set(sessions)
    report("cluster, two processes", sessions=len(sessions), masters=len(set(sessions.values())),
           writers_per_session=WRITERS, turns=sum(acknowledged), seconds=round(seconds, 1))


# --- failover ------------------------------------------------------------------------------

FAIL_FAST = 3.5  # seconds: a lost reply is checked (at most one more socket timeout)


@pytest.fixture
def own_cluster() -> Iterator[RedisCluster]:
    """A cluster of its own: the test kills one of its masters."""
    with RedisCluster() as cluster:
        yield cluster


class Outcomes:
    """What every turn of the failover run answered."""

    def __init__(self) -> None:
        self.acked: dict[str, list[str]] = {}
        self.last_ok: dict[str, float] = {}
        self.statuses: Counter[int] = Counter()
        self.slow: list[float] = []
        self.bad: list[str] = []

    async def writer(self, client: httpx.AsyncClient, base: str, session: str, writer: int,
                     until: list[float]) -> None:
        turn = 0
        while time.monotonic() < until[0]:
            text = f"{session}-w{writer}-t{turn}"
            turn += 1
            body = {"model": "gpt-4o", "messages": [{"role": "user", "content": text}]}
            started = time.monotonic()
            try:
                response = await client.post(f"{base}/chat/completions", json=body)
            except httpx.HTTPError as exc:
                self.bad.append(f"{text}: {exc!r}")
                continue
            elapsed = time.monotonic() - started
            self.statuses[response.status_code] += 1
            if response.status_code == 200:
                self.acked.setdefault(session, []).append(text)
                self.last_ok[session] = time.monotonic()
            elif response.status_code == 503 and is_openai_error(response.json()):
                if elapsed > FAIL_FAST:
                    self.slow.append(round(elapsed, 2))
                await asyncio.sleep(0.05)
            else:
                self.bad.append(f"{text}: {response.status_code} {response.text[:200]}")


def test_a_master_killed_under_load_fails_its_turns_fast_and_loses_no_acknowledged_turn(
    own_cluster: RedisCluster, fake: FakeUpstream, tmp_path: Path
) -> None:
    sessions = spread_sessions(own_cluster, per_master=2)
    victim_port = next(iter(sessions.values()))
    victim = next(node for node in own_cluster.nodes if node.port == victim_port)
    processes = two_proxies(own_cluster.url, fake, tmp_path)
    outcomes = Outcomes()
    until = [time.monotonic() + 60]  # moved once the cluster has recovered
    timings: dict[str, float] = {}

    async def load() -> None:
        limits = httpx.Limits(max_connections=200, keepalive_expiry=1.0)
        async with httpx.AsyncClient(timeout=30, limits=limits,
                                     headers={"Authorization": f"Bearer {CLIENT_KEY}"}) as client:
            writers = [
                outcomes.writer(client, f"{processes[w % 2].base}/agents/{AGENT}/sessions/"
                                f"{name}/v1", name, w, until)
                for name in sessions for w in range(4)
            ]
            await asyncio.gather(*writers, failover())

    async def failover() -> None:
        # under load: every session has had a turn acknowledged before the master dies
        warm_by = time.monotonic() + 10
        while time.monotonic() < warm_by and set(outcomes.acked) != set(sessions):  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        victim.kill()
        killed = time.monotonic()
        await asyncio.to_thread(own_cluster.wait_promoted, victim)
        timings["promoted"] = time.monotonic() - killed
        # the turns on the promoted replica's slots succeed again, without a restart
        promoted = time.monotonic()
        recovered_by = promoted + 20
        while time.monotonic() < recovered_by and \
                min(outcomes.last_ok.get(name, 0) for name in sessions) < promoted:  # noqa: ASYNC110
            await asyncio.sleep(0.1)
        timings["recovered"] = time.monotonic() - killed
        until[0] = time.monotonic() + 1

    try:
        asyncio.run(load())
        after = {}
        with httpx.Client(timeout=10, headers={"Authorization": f"Bearer {CLIENT_KEY}"}) as http:
            for name in sessions:  # every session answers again, the victim's included
                body: dict[str, Any] = {"model": "gpt-4o",
                                        "messages": [{"role": "user", "content": f"{name}-end"}]}
                after[name] = http.post(f"{processes[0].base}/agents/{AGENT}/sessions/{name}"
                                        "/v1/chat/completions", json=body).status_code
    finally:
        for process in processes:
            process.stop()

    assert outcomes.bad == [] and outcomes.slow == []
    assert set(outcomes.statuses) <= {200, 503} and outcomes.statuses[503] > 0
    assert after == dict.fromkeys(sessions, 200)
    assert timings["recovered"] < timings["promoted"] + 20
    lost = duplicated = 0
    for name in sessions:
        stored, _ = asyncio.run(read_session(own_cluster.url, name))
        users = [m.content for m in stored if m.role == "user"]
        lost += len(set(outcomes.acked.get(name, [])) - set(users))
        duplicated += len(users) - len(set(users))
        for index, message in enumerate(stored):  # each stored input beside its reply
            if message.role == "user":
                assert stored[index + 1].content == f"ok: {message.content}"
    assert (lost, duplicated) == (0, 0)
    report("cluster failover", sessions=len(sessions), acknowledged=outcomes.statuses[200],
           answered_503=outcomes.statuses[503], lost=lost, duplicated=duplicated,
           promoted_after_s=round(timings["promoted"], 1),
           recovered_after_s=round(timings["recovered"], 1))
