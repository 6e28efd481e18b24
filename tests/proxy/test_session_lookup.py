"""An admin URL names a session by agent and id: found exactly, however many sessions the
agent has (a lookup by listing stopped at the newest 10,000)."""

from __future__ import annotations

import asyncio
import time

import httpx
from e2e import ADMIN_TOKEN, CLIENT_KEY, RunningProxy

from strategies.records import StoredMessage, TurnWrite

AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
SESSIONS = 10_050


async def sessions(proxy: RunningProxy, agent: str, numbers: range) -> None:
    """One-message sessions ``s-{n}``, a few writes at a time."""
    store = proxy.services.store
    await asyncio.gather(*(
        store.append_turn(proxy.key(agent, f"s-{n}"),
                          TurnWrite([StoredMessage("user", f"q{n}", tokens=2)]))
        for n in numbers
    ))


def many_sessions(proxy: RunningProxy, agent: str, count: int) -> None:
    """``count`` sessions ``s-0`` (the oldest) … ``s-{count-1}``."""
    for start in range(0, count, 50):
        proxy.call(sessions(proxy, agent, range(start, min(start + 50, count))))
        if start == 0:
            time.sleep(0.01)  # s-0's batch is the oldest by the index's clock


def test_the_oldest_of_10050_sessions_is_found_deleted_and_shown_by_name(
    proxy: RunningProxy,
) -> None:
    many_sessions(proxy, "crowded", SESSIONS)
    base = f"{proxy.base}/admin/api/agents/crowded/sessions/s-0"
    shown = httpx.get(base, headers=AUTH, timeout=30)
    assert shown.status_code == 200, shown.text
    assert shown.json()["session"] == "s-0"
    memory = httpx.get(f"{proxy.base}/memory/crowded/s-0", headers=AUTH, timeout=30)
    assert memory.status_code == 200, memory.text
    deleted = httpx.delete(base, headers=AUTH, timeout=30)
    assert deleted.status_code == 200, deleted.text
    assert proxy.stored("crowded", "s-0", CLIENT_KEY) == []
    assert httpx.delete(base, headers=AUTH, timeout=30).status_code == 404
