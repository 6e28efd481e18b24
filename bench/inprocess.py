"""What one turn costs inside the proxy, counted rather than timed: store calls, network
round trips to Redis, SQLite jobs, and the text handed to the tokenizer.

The app runs in this process (``create_app`` with its lifespan, requests through
``httpx.ASGITransport``) against the run's fake upstream, with counters patched onto
the store, the Redis connection and tiktoken's ``Encoding``.
"""

from __future__ import annotations

import collections
import contextlib
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import populate
import tiktoken.core
from servers import redis_commandstats

Counter = collections.Counter[str]


@dataclass
class TurnCost:
    """Averages per measured turn."""

    scenario: str
    store: str
    turns: int
    store_calls: dict[str, float] = field(default_factory=dict)
    # Redis: packets of commands sent; SQLite: jobs on the store's thread (transactions)
    round_trips: float = 0.0
    redis_commands: dict[str, float] = field(default_factory=dict)
    tokenized_chars: float = 0.0
    tokenize_calls: float = 0.0


class Counting:
    """Counters the patches below add to."""

    def __init__(self) -> None:
        self.store_calls: Counter = collections.Counter()
        self.round_trips = 0
        self.tokenized_chars = 0
        self.tokenize_calls = 0

    def reset(self) -> None:
        self.__init__()  # type: ignore[misc]


class CountingStore:
    """Wraps a Store: every awaited method call is counted by name."""

    def __init__(self, inner: Any, counting: Counting) -> None:
        self._inner = inner
        self._counting = counting

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._inner, name)
        if not callable(target) or name.startswith("_"):
            return target

        @functools.wraps(target)
        async def counted(*args: Any, **kwargs: Any) -> Any:
            self._counting.store_calls[name] += 1
            return await target(*args, **kwargs)

        return counted


@contextlib.contextmanager
def patched(counting: Counting) -> Iterator[None]:
    """Count Redis packets, SQLite jobs (each one transaction on the store's thread) and
    tokenizer input while inside."""
    from redis.asyncio.connection import AbstractConnection

    from storage.sqlite import SqliteStore

    send, run = AbstractConnection.send_packed_command, SqliteStore._run
    encode_ordinary, encode = tiktoken.core.Encoding.encode_ordinary, tiktoken.core.Encoding.encode

    async def send_packed_command(self: Any, command: Any, check_health: bool = True) -> None:
        counting.round_trips += 1
        await send(self, command, check_health)

    async def counted_run(self: Any, job: Callable[..., Any], *args: Any) -> Any:
        counting.round_trips += 1  # one job, one transaction
        return await run(self, job, *args)

    def counted_encode_ordinary(self: Any, text: str) -> list[int]:
        counting.tokenize_calls += 1
        counting.tokenized_chars += len(text)
        return encode_ordinary(self, text)

    def counted_encode(self: Any, text: str, **kwargs: Any) -> list[int]:
        counting.tokenize_calls += 1
        counting.tokenized_chars += len(text)
        return encode(self, text, **kwargs)

    AbstractConnection.send_packed_command = send_packed_command  # type: ignore[method-assign]
    SqliteStore._run = counted_run  # type: ignore[method-assign]
    tiktoken.core.Encoding.encode_ordinary = counted_encode_ordinary  # type: ignore[method-assign]
    tiktoken.core.Encoding.encode = counted_encode  # type: ignore[method-assign]
    try:
        yield
    finally:
        AbstractConnection.send_packed_command = send  # type: ignore[method-assign]
        SqliteStore._run = run  # type: ignore[method-assign]
        tiktoken.core.Encoding.encode_ordinary = encode_ordinary  # type: ignore[method-assign]
        tiktoken.core.Encoding.encode = encode  # type: ignore[method-assign]


@dataclass
class Scenario:
    name: str
    agent: str
    stored: int  # messages stored before the measured turn
    full_history: bool = False
    stream: bool = False


SCENARIOS = [
    Scenario("delta turn, 20 stored", populate.DEFAULT_AGENT, 20),
    Scenario("delta turn, 1,000 stored", populate.DEFAULT_AGENT, 1000),
    Scenario("delta turn, 10,000 stored", populate.DEFAULT_AGENT, 10000),
    Scenario("streamed delta turn, 20 stored", populate.DEFAULT_AGENT, 20, stream=True),
    Scenario("full-history client, 20 resent", populate.DEFAULT_AGENT, 20, full_history=True),
    Scenario("windowed 100, 10,000 stored", populate.WINDOWED_AGENT, 10000),
]


def request_body(scenario: Scenario) -> dict[str, Any]:
    messages: list[dict[str, Any]] = []
    if scenario.full_history:
        messages = [{"role": m.role, "content": m.content}
                    for m in populate.history(scenario.stored)]
    messages.append({"role": "user", "content": "What should we check first?"})
    body: dict[str, Any] = {"model": populate.MODEL, "messages": messages}
    if scenario.stream:
        body["stream"] = True
    return body


async def measure(
    store_url: str, upstream: str, agents_dir: Path, *, turns: int, tag: str,
    redis_port: int | None = None, scenarios: list[Scenario] = SCENARIOS,
) -> list[TurnCost]:
    """Populate one session per measured turn (a full-history turn needs its own), then
    run the turns one by one, each after the previous one's background work."""
    from proxy.http.app import create_app
    from proxy.settings import Settings
    from storage.registry import open_store

    for scenario in scenarios:
        sessions = populate.session_ids(f"{tag}-{scenario_slug(scenario)}", turns + 1)
        await populate.populate(store_url, scenario.agent, sessions, scenario.stored)

    counting = Counting()
    settings = Settings(store_url=store_url, upstream_url=upstream, agents_dir=agents_dir,
                        log_level="warning")
    app = create_app(settings, store=CountingStore(open_store(store_url), counting))
    services = app.state.services
    results = []
    transport = httpx.ASGITransport(app=app)
    async with app.router.lifespan_context(app), httpx.AsyncClient(
        transport=transport, base_url="http://proxy", headers=_headers(), timeout=60
    ) as client:
        for scenario in scenarios:
            sessions = populate.session_ids(f"{tag}-{scenario_slug(scenario)}", turns + 1)
            body = orjson.dumps(request_body(scenario))
            # the first turn opens connections and loads caches; it is not counted
            await _turn(client, scenario.agent, sessions[0], body)
            await services.drain()
            counting.reset()
            before = redis_commandstats(redis_port) if redis_port else {}
            with patched(counting):
                for session in sessions[1:]:
                    await _turn(client, scenario.agent, session, body)
                    await services.drain()
            after = redis_commandstats(redis_port) if redis_port else {}
            commands = {name: (after[name] - before.get(name, 0)) / turns for name in after
                        if name not in ("info",) and after[name] != before.get(name, 0)}
            results.append(TurnCost(
                scenario=scenario.name, store="redis" if redis_port else "sqlite", turns=turns,
                store_calls={k: v / turns for k, v in sorted(counting.store_calls.items())},
                round_trips=counting.round_trips / turns,
                redis_commands=commands,
                tokenized_chars=counting.tokenized_chars / turns,
                tokenize_calls=counting.tokenize_calls / turns,
            ))
    return results


def scenario_slug(scenario: Scenario) -> str:
    return "".join(c if c.isalnum() else "-" for c in scenario.name)


def _headers() -> dict[str, str]:
    return {"Authorization": f"Bearer {populate.API_KEY}", "Content-Type": "application/json"}


async def _turn(client: httpx.AsyncClient, agent: str, session: str, body: bytes) -> None:
    response = await client.post(f"/agents/{agent}/sessions/{session}/v1/chat/completions",
                                 content=body)
    if response.status_code != 200:
        raise RuntimeError(f"turn failed: {response.status_code} {response.text[:300]}")
