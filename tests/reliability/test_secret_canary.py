"""A client's API key appears in no log line, no stored record and no admin page.

A canary key drives every path that could leak it (turns streamed and not, bad input, an
upstream error that echoes the key, a failing background summary, the admin surfaces,
metrics), with every logger at DEBUG. Then the logs, a dump of the whole store (every
SQLite table and the database files; every Redis key) and every admin answer are searched.
The key lives only in memory, where background summaries need it.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2e import ADMIN_TOKEN, RunningProxy, write_agent
from redis.asyncio import Redis

from proxy.testing.fake_upstream import FakeUpstream, Reply, echo_reply
from strategies.summary_prompt import is_summarizer_request

CANARY = f"sk-CANARY-{uuid.uuid4().hex}"
LOGGERS = ["", "memory_proxy", "uvicorn", "uvicorn.error", "aiohttp", "httpx", "LiteLLM"]


def turn(proxy: RunningProxy, session: str, text: str, *, stream: bool = False,
         header: str = "authorization") -> httpx.Response:
    value = f"Bearer {CANARY}" if header == "authorization" else CANARY
    return httpx.post(
        f"{proxy.url('vault', session)}/chat/completions",
        json={"model": "gpt-4o", "stream": stream, "messages": [{"role": "user", "content": text}]},
        headers={header: value}, timeout=20)


ECHOED = {"error": {"message": f"Incorrect API key provided: {CANARY}",
                    "type": "invalid_request_error", "param": None, "code": "invalid_api_key"}}


def is_summarizer_call(body: dict[str, Any]) -> bool:
    return is_summarizer_request(body)


def upstream(body: dict[str, Any]) -> Reply:
    """Refuses the key (echoing it, as OpenAI does) for summaries and for turns that ask
    to fail; answers the rest."""
    if is_summarizer_call(body) or "fail" in str(body["messages"][-1].get("content")):
        return Reply.error(401, ECHOED)
    return echo_reply(body)


@pytest.fixture
def fake(fake_upstream: FakeUpstream) -> FakeUpstream:
    fake_upstream.reset(default_reply=upstream)
    return fake_upstream


def sqlite_dump(url: str) -> str:
    path = url.removeprefix("sqlite:///")
    connection = sqlite3.connect(path)
    try:
        tables = [row[0] for row in connection.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table'")]
        rows = [repr(row) for table in tables
                for row in connection.execute(f"SELECT * FROM {table}")]
    finally:
        connection.close()
    raw = b"".join(p.read_bytes() for p in Path(path).parent.glob(Path(path).name + "*"))
    return "\n".join(rows) + raw.decode("latin-1")


def redis_dump(url: str) -> str:
    async def dump() -> str:
        client = Redis.from_url(url)
        out = []
        async for key in client.scan_iter(count=1000):
            out.append(repr(key))
            out.append(repr(await client.dump(key)))
        await client.aclose()
        return "\n".join(out)

    return asyncio.run(dump())


@pytest.mark.parametrize("header", ["authorization", "api-key"])
def test_the_client_key_is_in_no_log_no_record_and_no_admin_page(
    make_proxy, store_url: str, fake: FakeUpstream, agents_dir: Path,
    caplog: pytest.LogCaptureFixture, header: str,
) -> None:
    for name in LOGGERS:
        caplog.set_level(logging.DEBUG, logger=name)
    write_agent(agents_dir, "vault", llm={"model": "gpt-4o", "contextWindow": 1200},
                memoryConfig={"kind": "auto_compact", "compactAtRatio": 0.3})
    proxy = make_proxy()
    assert turn(proxy, "s1", "hello " * 400, header=header).status_code == 200
    proxy.drain()  # a compaction ran in the background with the client's key, and failed
    assert turn(proxy, "s1", "more", stream=True, header=header).status_code == 200
    assert turn(proxy, "s1", "please fail", header=header).status_code == 401
    assert turn(proxy, "s1", "please fail", stream=True, header=header).status_code == 401
    assert httpx.post(f"{proxy.url('vault', 's1')}/chat/completions", content=b"{oops",
                      headers={header: CANARY}).status_code == 400
    proxy.drain()
    # the key did reach the upstream, for turns and background summaries alike
    assert any(is_summarizer_call(r.body) for r in fake.chat_requests)
    for request in fake.chat_requests:
        assert CANARY in request.headers.get("authorization", "") + request.headers.get(
            "api-key", "")

    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    pages = [f"{proxy.base}{path}" for path in (
        "/memory/vault", "/memory/vault/s1", "/admin/api/agents", "/admin/api/agents/vault",
        "/admin/api/agents/vault/sessions/s1", "/admin/", "/admin/agents/vault",
        "/admin/agents/vault/sessions/s1", "/metrics", "/ready", "/health")]
    answers = [httpx.get(url, headers=admin) for url in pages]
    assert [a.status_code for a in answers[:5]] == [200] * 5
    dump = sqlite_dump(store_url) if store_url.startswith("sqlite") else redis_dump(store_url)
    assert "hello" in dump  # the dump does hold the session

    logs = "\n".join(
        f"{r.getMessage()} {r.exc_text or ''} {r.args!r}" for r in caplog.records)
    assert caplog.records, "the logs were captured"
    for where, text in [("logs", logs), ("store", dump),
                        *((a.url.path, a.text + str(a.headers)) for a in answers)]:
        assert CANARY not in text, f"the client key leaked into {where}"
        assert CANARY[3:] not in text, f"part of the client key leaked into {where}"
