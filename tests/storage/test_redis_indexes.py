"""The Redis store's cross-session indexes follow each turn and are repaired when they
missed one; a turn write whose reply was lost is acknowledged only when it is stored.

Run on one redis-server and on the cluster: the indexes live on other slots than the
sessions they list (``storage/redis_indexes.py``).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from contract_support import KEY, assistant, load, user
from redis.asyncio import Redis
from redis_server import RedisServer

from storage.base import StoreUnavailable
from storage.redis import SOCKET_TIMEOUT, RedisStore
from strategies.records import AppendResult, LoadSpec, SessionKey, StoredMessage, TurnWrite

SOAK = os.environ.get("SOAK") == "1"

SESSIONS = f"mp:agent:{KEY.agent}:sessions"
MEMBER = f'["{KEY.namespace}","{KEY.session}"]'.encode()


@pytest.fixture(params=["redis", "cluster"])
def deployment(request: pytest.FixtureRequest) -> tuple[RedisStore, Any]:
    """A store and a raw client beside it, on one server or on the cluster."""
    store = request.getfixturevalue(f"{request.param}_store")
    client = request.getfixturevalue(f"{request.param}_client")
    return store, client


async def wait_for(check: Any) -> None:
    """Until ``check()`` is true; five seconds at most."""
    async with asyncio.timeout(5):
        while not await check():  # noqa: ASYNC110 (polls another process's state)
            await asyncio.sleep(0.05)


async def test_a_turn_whose_index_write_failed_is_acknowledged_and_indexed_once_it_can_be(
    deployment: tuple[RedisStore, Any],
) -> None:
    store, client = deployment
    await client.set(SESSIONS, b"not a sorted set")  # every write to the index now fails

    result = await store.append_turn(KEY, TurnWrite([user("q"), assistant("a")]))

    assert result.seqs == [1, 2]
    assert await load(store) == ["q", "a"]
    await client.delete(SESSIONS)  # the fault clears; no other turn comes

    async def indexed() -> bool:
        return await client.zscore(SESSIONS, MEMBER) is not None

    await wait_for(indexed)
    assert [s.session for s in await store.list_sessions(KEY.agent)] == [KEY.session]
    assert [(a.agent, a.session_count) for a in await store.list_agents()] == [(KEY.agent, 1)]


async def test_a_listing_repairs_the_index_before_it_reads_it(
    deployment: tuple[RedisStore, Any],
) -> None:
    store, client = deployment
    await client.set(SESSIONS, b"not a sorted set")
    await store.append_turn(KEY, TurnWrite([user("q")]))
    await client.delete(SESSIONS)

    sessions = await store.list_sessions(KEY.agent)

    assert [(s.session, s.message_count) for s in sessions] == [(KEY.session, 1)]


async def test_an_index_entry_that_outlived_its_session_is_dropped_by_a_listing(
    deployment: tuple[RedisStore, Any],
) -> None:
    store, client = deployment
    await store.append_turn(KEY, TurnWrite([user("kept")]))
    await client.zadd(SESSIONS, {b'["ns-1","gone"]': time.time()})

    assert [s.session for s in await store.list_sessions(KEY.agent)] == [KEY.session]
    assert await client.zrange(SESSIONS, 0, -1) == [MEMBER]


async def test_an_index_entry_never_moves_back_in_time(
    deployment: tuple[RedisStore, Any],
) -> None:
    store, client = deployment
    other = SessionKey(KEY.namespace, KEY.agent, "other")
    await store.append_turn(KEY, TurnWrite([user("first")]))
    await store.append_turn(other, TurnWrite([user("second")]))
    newest = await client.zscore(SESSIONS, MEMBER)

    await client.zadd(SESSIONS, {MEMBER: 1.0}, gt=True)  # a late repair of an old turn

    assert await client.zscore(SESSIONS, MEMBER) == newest
    assert [s.session for s in await store.list_sessions(KEY.agent)] == ["other", KEY.session]


# --- a write whose reply was lost --------------------------------------------------------


@pytest.fixture
async def own_redis() -> AsyncIterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.mark.parametrize("thaw_after", [SOCKET_TIMEOUT + 0.4, 0.5])
async def test_a_write_whose_reply_was_lost_is_acknowledged_only_when_it_was_stored(
    own_redis: RedisServer, thaw_after: float
) -> None:
    """Redis freezes with the write on its way: the reply times out. Before answering, the
    store asks whether the write applied (it does once Redis thaws, within the check's
    own timeout): acknowledged then, or refused from then on; never stored and failed."""
    store = RedisStore(own_redis.url)
    await store.open()
    try:
        await store.append_turn(KEY, TurnWrite([user("before")]))
        write = TurnWrite([user("frozen"), assistant("reply")])
        own_redis.kill(signal.SIGSTOP)
        thaw = asyncio.get_running_loop().call_later(
            thaw_after, own_redis.kill, signal.SIGCONT)
        try:
            outcome: Any = await store.append_turn(KEY, write)
        except StoreUnavailable as exc:
            outcome = exc
        finally:
            thaw.cancel()
            own_redis.kill(signal.SIGCONT)
        await asyncio.sleep(0.2)
        stored = await load(store)
        again = await store.append_turn(KEY, write)  # a retry of the same write
        after_retry = await load(store)
    finally:
        await store.close()

    if isinstance(outcome, StoreUnavailable):
        assert stored == ["before"]
    else:
        assert outcome.seqs == [2, 3] and stored == ["before", "frozen", "reply"]
        assert again.seqs == [2, 3] and after_retry == stored


async def test_a_write_given_up_on_is_refused_when_it_arrives_late(
    redis_store: RedisStore, redis_client: Redis
) -> None:
    """What ``landed.lua`` leaves behind when the write had not arrived: the write id is
    given up on, so the write, arriving after all, stores nothing."""
    write = TurnWrite([user("late")])
    await redis_store.append_turn(KEY, TurnWrite([user("before")]))
    await redis_client.zadd(f"mp:{KEY.tag}:writes", {write.write_id: 0})

    with pytest.raises(StoreUnavailable):
        await redis_store.append_turn(KEY, write)

    assert await load(redis_store) == ["before"]
    assert (await redis_store.load(KEY, LoadSpec())).meta.head_seq == 1


@pytest.mark.soak
async def test_concurrent_huge_turns_are_each_stored_and_acknowledged_or_neither(
    own_redis: RedisServer,
) -> None:
    """Four turns that resend 50,000 messages each (~2 MB; 5,000 in the short form) at once
    keep Redis busy past the socket timeout: whatever each is answered, an acknowledged
    turn is stored once and a failed one is not stored, even after Redis is done."""
    size = 50_000 if SOAK else 5_000
    store = RedisStore(own_redis.url)
    await store.open()
    keys = [SessionKey("ns", "agent", f"huge-{n}") for n in range(4)]
    writes = [
        TurnWrite([
            StoredMessage(role="user" if i % 2 == 0 else "assistant", content=f"{n}/{i} " * 4,
                          fingerprint=f"{n}-{i}", tokens=10)
            for i in range(size)
        ])
        for n in range(4)
    ]
    try:
        outcomes = await asyncio.gather(
            *(store.append_turn(key, write) for key, write in zip(keys, writes, strict=True)),
            return_exceptions=True,
        )
        await asyncio.sleep(1)
        stored = [(await store.load(key, LoadSpec(limit=1))).meta.head_seq for key in keys]
    finally:
        await store.close()

    assert all(isinstance(o, (AppendResult, StoreUnavailable)) for o in outcomes), outcomes
    acknowledged = [isinstance(o, AppendResult) for o in outcomes]
    assert stored == [size if ok else 0 for ok in acknowledged]
    print(f"\n[reliability] huge turns: size={size} acknowledged={sum(acknowledged)} "
          f"failed={4 - sum(acknowledged)} stored_and_failed=0", flush=True)
