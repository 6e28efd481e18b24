"""Concurrent turns on one session: every message stored exactly once, each writer's order
kept, each turn's user message and reply adjacent.

50 delta clients write to one session at once (half of them streaming), each sending a
few turns in a row; with Redis, through two proxies sharing it (two apps in this process,
and two ``memory-proxy serve`` processes). ``SOAK=1`` repeats it many times.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from e2e import ADMIN_TOKEN, CLIENT_KEY, RunningProxy
from redis_server import RedisServer, flush_redis
from reliability_support import report, scaled, start_proxies

from proxy.testing.fake_upstream import FakeUpstream
from proxy.turn.identity import namespace_for
from storage.redis import RedisStore
from strategies.records import LoadSpec, SessionKey, StoredMessage

WRITERS = 50
TURNS_PER_WRITER = scaled(2, 4)
REPETITIONS = scaled(2, 20)


async def write_turns(client: httpx.AsyncClient, base: str, writer: int) -> int:
    """One writer's turns, in order; returns how many were acknowledged."""
    acknowledged = 0
    stream = writer % 2 == 1
    for turn in range(TURNS_PER_WRITER):
        body = {"model": "gpt-4o", "stream": stream,
                "messages": [{"role": "user", "content": f"w{writer}-t{turn}"}]}
        if stream:
            async with client.stream("POST", f"{base}/chat/completions", json=body) as response:
                assert response.status_code == 200
                lines = [line async for line in response.aiter_lines() if line]
            assert lines[-1] == "data: [DONE]", lines[-3:]
        else:
            response = await client.post(f"{base}/chat/completions", json=body)
            assert response.status_code == 200, response.text
        acknowledged += 1
    return acknowledged


async def run_writers(bases: list[str]) -> int:
    # a connection per request: a request sent on a kept-alive connection just as the
    # server's keep-alive timer closes it fails with no reply (the race every HTTP client
    # retries). With a hundred turns in flight on two cores a server's loop can lag past
    # that timer, and a POST is not retried here: each turn must be stored exactly once
    limits = httpx.Limits(max_connections=WRITERS * 2, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=60, limits=limits,
                                 headers={"Authorization": f"Bearer {CLIENT_KEY}"}) as client:
        done = await asyncio.gather(*(
            write_turns(client, bases[writer % len(bases)], writer) for writer in range(WRITERS)
        ))
    return sum(done)


def check_log(messages: list[StoredMessage], superseded_too: list[StoredMessage]) -> None:
    expected = {f"w{w}-t{t}" for w in range(WRITERS) for t in range(TURNS_PER_WRITER)}
    users = [m.content for m in messages if m.role == "user"]
    assert len(users) == len(expected) and set(users) == expected  # each exactly once
    assert len(messages) == 2 * len(expected)
    assert len(superseded_too) == len(messages)  # nothing superseded, nothing extra
    assert [m.seq for m in messages] == list(range(1, len(messages) + 1))
    for index in range(0, len(messages), 2):
        user, reply = messages[index], messages[index + 1]
        assert (user.role, reply.role) == ("user", "assistant")
        assert reply.content == f"ok: {user.content}"  # the reply to this very message
    for writer in range(WRITERS):
        order = [u for u in users if u.startswith(f"w{writer}-")]
        assert order == [f"w{writer}-t{t}" for t in range(TURNS_PER_WRITER)]


@pytest.mark.soak
def test_fifty_concurrent_writers_on_one_session_lose_and_duplicate_nothing(
    make_proxy: Callable[..., RunningProxy], store_url: str, fake: FakeUpstream
) -> None:
    proxies = [make_proxy()]
    if store_url.startswith("redis"):
        proxies.append(make_proxy())  # two proxies, one Redis
    started = time.monotonic()
    for repetition in range(REPETITIONS):
        session = f"crowd-{repetition}"
        acknowledged = asyncio.run(run_writers([p.url("helper", session) for p in proxies]))
        assert acknowledged == WRITERS * TURNS_PER_WRITER
        key = proxies[0].key("helper", session)
        messages = proxies[0].stored("helper", session)
        every = proxies[0].call(proxies[0].services.store.get_messages(
            key, range(1, 4 * WRITERS * TURNS_PER_WRITER)))
        check_log(messages, every)
    report("concurrent writers", store=store_url.split(":")[0], proxies=len(proxies),
           repetitions=REPETITIONS, writers=WRITERS, turns_per_writer=TURNS_PER_WRITER,
           turns=REPETITIONS * WRITERS * TURNS_PER_WRITER,
           seconds=round(time.monotonic() - started, 1))


async def read_session(url: str, session: str) -> tuple[list[StoredMessage], list[StoredMessage]]:
    store = RedisStore(url)
    await store.open()
    try:
        key = SessionKey(namespace_for(CLIENT_KEY), "helper", session)
        active = (await store.load(key, LoadSpec(limit=1_000_000))).messages
        every = await store.get_messages(key, range(1, 4 * WRITERS * TURNS_PER_WRITER))
        return active, every
    finally:
        await store.close()


@pytest.mark.soak
def test_two_proxy_processes_on_one_redis_store_every_turn_once(
    redis_server: RedisServer, fake: FakeUpstream, tmp_path: Path
) -> None:
    flush_redis(redis_server.url)
    agents = tmp_path / "agents"
    agents.mkdir()
    env = {"MEMORY_PROXY_STORE_URL": redis_server.url, "MEMORY_PROXY_UPSTREAM_URL": fake.url,
           "MEMORY_PROXY_AGENTS_DIR": str(agents), "MEMORY_PROXY_ADMIN_TOKEN": ADMIN_TOKEN,
           "MEMORY_PROXY_LOG_LEVEL": "warning"}
    processes = start_proxies(2, env, tmp_path)
    try:
        for repetition in range(REPETITIONS):
            session = f"procs-{repetition}"
            bases = [f"{p.base}/agents/helper/sessions/{session}/v1" for p in processes]
            assert asyncio.run(run_writers(bases)) == WRITERS * TURNS_PER_WRITER
            check_log(*asyncio.run(read_session(redis_server.url, session)))
    finally:
        for process in processes:
            process.stop()
    report("concurrent writers, two processes", repetitions=REPETITIONS, writers=WRITERS,
           turns=REPETITIONS * WRITERS * TURNS_PER_WRITER)
