"""The Redis store's script wire (storage/redis_wire.py): commands packed as redis-py packs
them, replies matched to their own call, and a connection that timed out, failed or was
cancelled mid-call never reused.

The frozen and restarted servers are each test's own ``redis-server``.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.asyncio.connection import Connection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis_server import RedisServer, free_port

import storage.redis
from storage.base import StoreUnavailable
from storage.redis import RedisStore
from storage.redis_wire import Command, ScriptWire, pack
from strategies.records import LoadSpec, SessionKey, StoredMessage, TurnWrite

SHORT_TIMEOUT = 0.3


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    """A server of this test alone, on a fixed port (it is frozen or restarted)."""
    with RedisServer(port=free_port()) as server:
        yield server


@pytest.fixture
async def wire(own_redis: RedisServer) -> AsyncIterator[ScriptWire]:
    client = Redis.from_url(own_redis.url, socket_timeout=SHORT_TIMEOUT)
    wire = ScriptWire(client.connection_pool, SHORT_TIMEOUT)
    yield wire
    await wire.close()
    await client.aclose()


async def call(wire: ScriptWire, *commands: Command) -> list[Any]:
    return await wire.call(pack(commands), len(commands))


def test_commands_are_packed_byte_for_byte_as_redis_py_packs_them() -> None:
    commands: list[Command] = [
        ("EVALSHA", "f" * 40, 2, "mp:{ns:a:s}:meta", "mp:{ns:a:s}:msgs", 1_700_000_000.25, 0),
        (b"ZADD", "mp:agents", 1.0, "agent-é"),
        ("SET", b"binary\r\n\x00", -12, "", 3.0e-7, 10**18),
    ]
    expected = b"".join(Connection().pack_commands(commands))

    assert pack(commands) == expected


def test_a_value_redis_py_would_refuse_is_refused() -> None:
    with pytest.raises(TypeError):
        pack([("SET", "k", True)])


async def test_an_error_reply_takes_its_commands_place_and_the_connection_stays_in_step(
    wire: ScriptWire,
) -> None:
    replies = await call(wire, ("SET", "k", "v"), ("INCR", "k"), ("GET", "k"))

    assert replies[0] == b"OK" and replies[2] == b"v"
    assert isinstance(replies[1], ResponseError)
    assert await call(wire, ("GET", "k")) == [b"v"]


async def test_a_call_that_timed_out_never_hands_its_late_reply_to_the_next_call(
    wire: ScriptWire, own_redis: RedisServer
) -> None:
    await call(wire, ("SET", "k", "old"))
    own_redis.kill(signal.SIGSTOP)
    try:
        started = time.monotonic()
        with pytest.raises(RedisTimeoutError):
            await call(wire, ("GET", "k"))
        assert time.monotonic() - started < SHORT_TIMEOUT + 0.5
    finally:
        own_redis.kill(signal.SIGCONT)

    # on the frozen call's connection the next reply read would be its late b"old"
    assert await call(wire, ("SET", "k", "new")) == [b"OK"]
    assert await call(wire, ("GET", "k")) == [b"new"]


async def test_a_call_cancelled_mid_flight_never_hands_its_reply_to_the_next_call(
    wire: ScriptWire, own_redis: RedisServer
) -> None:
    await call(wire, ("SET", "k", "old"))
    own_redis.kill(signal.SIGSTOP)
    try:
        pending = asyncio.ensure_future(call(wire, ("GET", "k")))
        await asyncio.sleep(0.05)
        pending.cancel()
        with pytest.raises(asyncio.CancelledError):
            await pending
    finally:
        own_redis.kill(signal.SIGCONT)

    assert await call(wire, ("SET", "k", "new")) == [b"OK"]
    assert await call(wire, ("GET", "k")) == [b"new"]


async def test_an_idle_connection_the_server_closed_is_replaced_before_anything_is_sent(
    wire: ScriptWire, own_redis: RedisServer
) -> None:
    await call(wire, ("SET", "k", "v"))
    own_redis.kill(signal.SIGKILL)
    own_redis.start()
    await asyncio.sleep(0.05)  # the loop sees the old connection's end

    assert await call(wire, ("PING",)) == [b"PONG"]


async def test_a_call_to_a_server_that_is_down_fails_as_a_connection_error(
    wire: ScriptWire, own_redis: RedisServer
) -> None:
    own_redis.stop()

    with pytest.raises(RedisConnectionError):
        await call(wire, ("PING",))


async def test_closing_the_store_closes_every_connection_it_opened(
    own_redis: RedisServer,
) -> None:
    observer = Redis.from_url(own_redis.url)
    store = RedisStore(own_redis.url)
    await store.open()
    key = SessionKey("ns", "agent", "s")
    await asyncio.gather(*(
        store.append_turn(SessionKey("ns", "agent", f"s{i}"), TurnWrite([user("q")]))
        for i in range(5)
    ))  # fmt: skip
    await store.load(key, LoadSpec())
    assert len(await observer.client_list()) > 1

    await store.close()
    await asyncio.sleep(0.05)

    assert len(await observer.client_list()) == 1  # the observer itself
    await observer.aclose()


async def test_an_append_that_timed_out_is_stored_at_most_once(
    own_redis: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The write may still run when Redis thaws; it is never sent a second time."""
    monkeypatch.setattr(storage.redis, "SOCKET_TIMEOUT", SHORT_TIMEOUT)
    store = RedisStore(own_redis.url)
    await store.open()
    key = SessionKey("ns", "agent", "frozen")
    await store.append_turn(key, TurnWrite([user("first")]))
    own_redis.kill(signal.SIGSTOP)
    try:
        with pytest.raises(StoreUnavailable):
            await store.append_turn(key, TurnWrite([user("while frozen")]))
    finally:
        own_redis.kill(signal.SIGCONT)
    await asyncio.sleep(0.1)

    stored = [m.content for m in (await store.load(key, LoadSpec())).messages]
    await store.close()
    assert stored in (["first"], ["first", "while frozen"])


def user(text: str) -> StoredMessage:
    return StoredMessage(role="user", content=text, tokens=1, fingerprint=f"fp-{text}")
