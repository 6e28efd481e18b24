"""An admin save reaches every replica of a deployment (two proxies on one store)."""

from __future__ import annotations

from pathlib import Path

import pytest
from redis.asyncio import Redis


@pytest.fixture(params=["sqlite", "redis"])
async def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/memory.db"
    server = request.getfixturevalue("redis_server")
    client = Redis.from_url(server.url)
    await client.flushdb()
    await client.aclose()
    return str(server.url)


async def test_a_config_saved_on_one_replica_applies_to_the_next_turn_on_another(
    make_proxy, fake
):
    first, second = await make_proxy(), await make_proxy()
    for n in range(3):
        response = await second.chat("helper", "s1", f"message {n}")
    assert response.headers["x-memory-strategy"] == "summarizing_window"

    saved = await first.api("PUT", "/agents/helper",
                            json={"memoryConfig": {"kind": "windowed", "windowSize": 3}})
    assert saved.status_code == 200, saved.text
    response = await second.chat("helper", "s1", "message 3")

    assert response.headers["x-memory-strategy"] == "windowed"
    assert [m["content"] for m in fake.chat_requests[-1].body["messages"]] == [
        "Be brief.", "message 2", "ok: message 2", "message 3"]
    detail = (await second.api("GET", "/agents/helper")).json()
    assert (detail["kind"], detail["source"]) == ("windowed", "store")


async def test_removing_the_override_on_one_replica_applies_on_another(make_proxy, fake):
    first, second = await make_proxy(), await make_proxy()
    await first.api("PUT", "/agents/helper", json={"memoryConfig": {"kind": "none"}})
    response = await second.chat("helper", "s1", "hello")
    assert response.headers["x-memory-strategy"] == "none"

    await first.api("DELETE", "/agents/helper")
    response = await second.chat("helper", "s1", "again")

    assert response.headers["x-memory-strategy"] == "summarizing_window"
    assert len(fake.chat_requests[-1].body["messages"]) == 4
