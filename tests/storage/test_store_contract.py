"""The Store contract: every test runs against every backend (see ``conftest.store``).

The backend-specific sections at the end hold what only one backend can show: Redis round
trips, hash tags and outages; SQLite durability on disk.
"""

from __future__ import annotations

import asyncio
import hashlib
import signal
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from contract_support import KEY, append, assistant, chains, conversation, load, message, tool, user
from redis.asyncio import Redis
from redis.asyncio.connection import AbstractConnection
from redis.crc import key_slot
from redis_server import RedisServer, free_port, redis_server_available

from storage.base import Store, StoreUnavailable
from storage.redis import SOCKET_TIMEOUT, RedisStore
from storage.sqlite import SqliteStore
from strategies.records import (
    LoadSpec,
    SessionKey,
    SummaryRecord,
    TurnWrite,
)

# --- sessions, agents, config ----------------------------------------------------------------


async def test_set_calibration_is_stored_in_the_meta(store: Store) -> None:
    await conversation(store, 1)

    await store.set_calibration(KEY, 1.375)

    assert (await store.load(KEY, LoadSpec())).meta.calibration == 1.375


async def test_sessions_are_isolated_by_namespace(store: Store) -> None:
    other = SessionKey("ns-2", KEY.agent, KEY.session)
    await append(store, user("mine"))
    await append(store, user("theirs"), key=other)

    assert await load(store) == ["mine"]
    assert await load(store, key=other) == ["theirs"]


async def test_ids_with_separators_never_share_a_session(store: Store) -> None:
    one, two = SessionKey("ns", "a:b", "c"), SessionKey("ns", "a", "b:c")
    await append(store, user("one"), key=one)
    await append(store, user("two"), key=two)
    await append(store, user("braces"), key=SessionKey("ns", "a}", "{b"))

    assert await load(store, key=one) == ["one"]
    assert await load(store, key=two) == ["two"]


async def test_list_agents_counts_sessions_newest_first(store: Store) -> None:
    await append(store, user("q"), key=SessionKey("ns-1", "alpha", "s1"))
    await append(store, user("q"), key=SessionKey("ns-2", "alpha", "s2"))
    await append(store, user("q"), key=SessionKey("ns-1", "beta", "s1"))
    await append(store, user("again"), key=SessionKey("ns-1", "alpha", "s1"))

    agents = await store.list_agents()

    assert [(a.agent, a.session_count) for a in agents] == [("alpha", 2), ("beta", 1)]
    assert agents[0].updated_at >= agents[1].updated_at > 0


async def test_list_sessions_spans_namespaces_newest_first(store: Store) -> None:
    await append(store, user("q"), assistant("a"), key=SessionKey("ns-1", "alpha", "old"))
    await append(store, user("q"), key=SessionKey("ns-2", "alpha", "new"))
    await append(store, user("q"), key=SessionKey("ns-1", "beta", "elsewhere"))

    sessions = await store.list_sessions("alpha")

    assert [(s.namespace, s.session, s.message_count) for s in sessions] == [
        ("ns-2", "new", 1),
        ("ns-1", "old", 2),
    ]
    assert [s.session for s in await store.list_sessions("alpha", limit=1)] == ["new"]
    assert await store.list_sessions("nobody") == []


async def test_delete_session_removes_every_record(store: Store) -> None:
    await conversation(store, 2)
    await store.add_summary(KEY, SummaryRecord("compaction", "s", 1, 2))
    await store.set_compressed(KEY, {2: "stub"})
    await store.acquire_lock(KEY, "compact", 30)
    other = SessionKey(KEY.namespace, KEY.agent, "kept")
    await append(store, user("stays"), key=other)

    assert await store.delete_session(KEY) is True

    snapshot = await store.load(KEY, LoadSpec())
    assert snapshot.exists is False and snapshot.messages == [] and snapshot.summaries == []
    assert await store.get_messages(KEY, [1, 2]) == []
    assert [s.session for s in await store.list_sessions(KEY.agent)] == ["kept"]
    assert await store.acquire_lock(KEY, "compact", 30) is not None
    assert await store.delete_session(KEY) is False
    assert await load(store, key=other) == ["stays"]


async def test_an_agent_without_sessions_is_no_longer_listed(store: Store) -> None:
    await append(store, user("q"))

    await store.delete_session(KEY)

    assert await store.list_agents() == []


async def test_agent_config_can_be_set_read_and_cleared(store: Store) -> None:
    config = {"memoryConfig": {"kind": "windowed", "maxMessages": 20}, "name": "agent-a"}

    assert await store.get_agent_config("agent-a") is None
    await store.set_agent_config("agent-a", config)
    assert await store.get_agent_config("agent-a") == config
    await store.set_agent_config("agent-a", None)
    assert await store.get_agent_config("agent-a") is None


async def test_load_returns_the_agent_config_override(store: Store) -> None:
    config = {"memoryConfig": {"kind": "full"}}
    await store.set_agent_config(KEY.agent, config)

    assert (await store.load(KEY, LoadSpec())).agent_config == config
    await append(store, user("q"))
    assert (await store.load(KEY, LoadSpec())).agent_config == config


# --- locks and parts ---------------------------------------------------------------------------


async def test_a_lock_has_one_holder_until_released(store: Store) -> None:
    token = await store.acquire_lock(KEY, "compact", 30)

    assert token is not None
    assert await store.acquire_lock(KEY, "compact", 30) is None
    assert await store.acquire_lock(KEY, "other", 30) is not None
    await store.release_lock(KEY, "compact", token)
    assert await store.acquire_lock(KEY, "compact", 30) is not None


async def test_a_lock_expires_after_its_ttl(store: Store) -> None:
    assert await store.acquire_lock(KEY, "compact", 0.2) is not None
    assert await store.acquire_lock(KEY, "compact", 0.2) is None

    await asyncio.sleep(0.3)

    assert await store.acquire_lock(KEY, "compact", 30) is not None


async def test_a_stale_token_releases_nothing(store: Store) -> None:
    stale = await store.acquire_lock(KEY, "compact", 0.1)
    await asyncio.sleep(0.2)
    current = await store.acquire_lock(KEY, "compact", 30)
    assert stale is not None and current is not None

    await store.release_lock(KEY, "compact", stale)

    assert await store.acquire_lock(KEY, "compact", 30) is None


async def test_parts_are_stored_once_by_digest(store: Store) -> None:
    data = bytes(range(256)) + b"\n\x00tail"
    digest = hashlib.sha256(data).hexdigest()

    await store.put_part(KEY, digest, data, "image/png")
    await store.put_part(KEY, digest, data, "image/png")

    assert await store.get_part(KEY, digest) == (data, "image/png")
    assert await store.get_part(KEY, "0" * 64) is None


async def test_parts_are_written_and_read_in_batches(store: Store) -> None:
    first, second = b"\x89PNG first\n", b"%PDF-1.4 second"
    digests = ["sha256:" + hashlib.sha256(d).hexdigest() for d in (first, second)]
    await store.put_part(KEY, digests[0], first, "image/png")

    await store.put_parts(KEY, [(digests[0], b"ignored: already stored", "image/png"),
                                (digests[1], second, "application/pdf"),
                                (digests[1], second, "application/pdf")])
    await store.put_parts(KEY, [])

    assert await store.get_parts(KEY, [*digests, "sha256:" + "0" * 64]) == {
        digests[0]: (first, "image/png"),
        digests[1]: (second, "application/pdf"),
    }
    assert await store.get_parts(KEY, []) == {}


@pytest.mark.parametrize("other", [
    pytest.param(SessionKey("ns-2", KEY.agent, KEY.session), id="another-namespace"),
    pytest.param(SessionKey(KEY.namespace, KEY.agent, "session-2"), id="another-session"),
    pytest.param(SessionKey(KEY.namespace, "agent-b", KEY.session), id="another-agent"),
])
async def test_a_part_is_readable_only_under_the_session_that_stored_it(
    store: Store, other: SessionKey
) -> None:
    data = b"\x89PNG tenant one's image"
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    await append(store, user("look"))
    await store.put_parts(KEY, [(digest, data, "image/png")])

    assert await store.get_parts(other, [digest]) == {}
    assert await store.get_part(other, digest) is None
    # the same bytes sent in the other session are its own copy
    await store.put_parts(other, [(digest, data, "image/png")])
    await store.delete_session(other)
    assert await store.get_parts(other, [digest]) == {}
    assert await store.get_parts(KEY, [digest]) == {digest: (data, "image/png")}


async def test_deleting_a_session_reclaims_its_parts(store: Store) -> None:
    data = b"%PDF-1.4 a report"
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    await append(store, user("read this"))
    await store.put_parts(KEY, [(digest, data, "application/pdf")])

    assert await store.delete_session(KEY) is True

    assert await store.get_parts(KEY, [digest]) == {}


async def test_ping_answers(store: Store) -> None:
    assert await store.ping() is True


# --- Redis only --------------------------------------------------------------------------------

INDEX_PREFIXES = (b"mp:agents", b"mp:agent:", b"mp:agentcfg:", b"mp:ns:")


async def all_keys(client: Redis) -> list[bytes]:
    return [k async for k in client.scan_iter(match="*", count=1000)]


async def test_every_redis_key_of_a_session_carries_its_hash_tag(
    redis_store: RedisStore, redis_client: Redis
) -> None:
    await append(redis_store, user("q"), assistant("", ["c1"]), tool("c1", "r"))
    await redis_store.set_compressed(KEY, {3: "stub"})
    await redis_store.add_summary(KEY, SummaryRecord("compaction", "s", 1, 2))
    await redis_store.acquire_lock(KEY, "compact", 30)
    await redis_store.set_agent_config(KEY.agent, {"name": KEY.agent})
    await redis_store.put_part(KEY, "d1", b"bytes", "image/png")

    keys = await all_keys(redis_client)
    session_keys = [k for k in keys if not k.startswith(INDEX_PREFIXES)]

    assert len(session_keys) >= 7
    assert all(KEY.tag.encode() in k for k in session_keys)
    assert len({key_slot(k) for k in session_keys}) == 1


async def test_deleting_a_redis_session_leaves_no_key_behind(
    redis_store: RedisStore, redis_client: Redis
) -> None:
    await append(redis_store, user("q"), assistant("", ["c1"]), tool("c1", "r"))
    await redis_store.set_compressed(KEY, {3: "stub"})
    await redis_store.add_summary(KEY, SummaryRecord("compaction", "s", 1, 2))
    await redis_store.acquire_lock(KEY, "compact", 30)
    await redis_store.put_part(KEY, "sha256:d1", b"bytes", "image/png")

    await redis_store.delete_session(KEY)

    assert [k for k in await all_keys(redis_client) if KEY.tag.encode() in k] == []
    assert await redis_client.zcard(f"mp:agent:{KEY.agent}:sessions") == 0


async def test_redis_load_and_append_cost_one_round_trip_whatever_the_history_length(
    redis_store: RedisStore, redis_client: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    writes: list[Any] = []
    send = AbstractConnection.send_packed_command

    async def counted(self: AbstractConnection, command: Any, check_health: bool = True) -> None:
        writes.append(command)
        await send(self, command, check_health)

    monkeypatch.setattr(AbstractConnection, "send_packed_command", counted)
    for length in (10, 1000):
        key = SessionKey("ns", "agent", f"history-{length}")
        history = [message("user" if i % 2 else "assistant", f"m{i}") for i in range(length)]
        await redis_store.append_turn(key, TurnWrite(history))  # also warms the connection
        await redis_store.load(key, LoadSpec())  # and the load script, on a server new to it
        await redis_client.config_resetstat()

        writes.clear()
        snapshot = await redis_store.load(key, LoadSpec(limit=500), probe=chains(history))
        load_trips = len(writes)
        writes.clear()
        await redis_store.append_turn(key, TurnWrite([user("next"), assistant("reply")]))
        append_trips = len(writes)

        assert (load_trips, append_trips) == (1, 1), f"history of {length}"
        assert len(snapshot.messages) == min(length, 500) and snapshot.matched == length
        stats = await redis_client.info("commandstats")
        assert stats["cmdstat_evalsha"]["calls"] == 2
        assert "cmdstat_script|exists" not in stats and "cmdstat_eval" not in stats


async def test_redis_scripts_are_reloaded_after_the_script_cache_is_flushed(
    redis_store: RedisStore, redis_client: Redis
) -> None:
    await append(redis_store, user("before"))

    await redis_client.script_flush()
    await append(redis_store, assistant("after"))

    assert await load(redis_store) == ["before", "after"]


async def test_a_redis_store_without_a_server_starts_and_reports_it_unavailable() -> None:
    store = RedisStore(f"redis://127.0.0.1:{free_port()}/0")
    await store.open()
    try:
        assert await store.ping() is False
        started = time.monotonic()
        with pytest.raises(StoreUnavailable):
            await store.load(KEY, LoadSpec())
        with pytest.raises(StoreUnavailable):
            await store.append_turn(KEY, TurnWrite([user("q")]))
        assert time.monotonic() - started < 2
    finally:
        await store.close()


@pytest.mark.skipif(not redis_server_available(), reason="redis-server is not installed")
async def test_a_stalled_redis_fails_a_request_within_the_socket_timeout() -> None:
    with RedisServer() as server:
        store = RedisStore(server.url)
        await store.open()
        await append(store, user("q"))
        server.kill(signal.SIGSTOP)
        try:
            started = time.monotonic()
            with pytest.raises(StoreUnavailable):
                await store.load(KEY, LoadSpec())
            assert time.monotonic() - started < SOCKET_TIMEOUT + 0.5
        finally:
            server.kill(signal.SIGCONT)
        assert await load(store) == ["q"]
        await store.close()


# --- SQLite only -------------------------------------------------------------------------------


async def test_sqlite_data_survives_close_and_reopen(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/nested/dir/store.db"
    store = SqliteStore(url)
    await store.open()
    await append(store, user("q"), assistant("a"))
    await store.add_summary(KEY, SummaryRecord("compaction", "s", 1, 1))
    await store.close()

    reopened = SqliteStore(url)
    await reopened.open()
    snapshot = await reopened.load(KEY, LoadSpec(since="boundary"))
    await reopened.close()

    assert [m.content for m in snapshot.messages] == ["a"]
    assert snapshot.meta.head_seq == 2 and snapshot.summaries[0].text == "s"


async def test_a_sqlite_store_on_an_unusable_path_fails_to_open(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a directory")
    store = SqliteStore(f"sqlite:///{tmp_path}/file/store.db")

    with pytest.raises((StoreUnavailable, OSError)):
        await store.open()
    assert await store.ping() is False


async def test_sqlite_runs_in_wal_mode(sqlite_store: SqliteStore) -> None:
    with sqlite3.connect(sqlite_store.path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)


CRASHING_WRITER = """
import asyncio, os, signal, sys
from storage.sqlite import SqliteStore
from strategies.records import SessionKey, StoredMessage, TurnWrite

async def main() -> None:
    store = SqliteStore(sys.argv[1])
    await store.open()
    key = SessionKey(*sys.argv[2:5])
    await store.append_turn(key, TurnWrite([StoredMessage(role="user", content="acked")]))
    os.kill(os.getpid(), signal.SIGKILL)

asyncio.run(main())
"""


async def test_an_acknowledged_sqlite_turn_survives_kill_9(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/store.db"
    writer = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CRASHING_WRITER, url, KEY.namespace, KEY.agent, KEY.session
    )
    assert await writer.wait() == -signal.SIGKILL

    store = SqliteStore(url)
    await store.open()
    assert await load(store) == ["acked"]
    await store.close()


async def test_find_sessions_is_exact_whatever_the_agent_has(store: Store) -> None:
    await append(store, user("q"), assistant("a"), key=SessionKey("ns-1", "alpha", "s-0"))
    await append(store, user("q"), key=SessionKey("ns-2", "alpha", "s-0"))
    await append(store, user("q"), key=SessionKey("ns-1", "alpha", "s-00"))
    await append(store, user("q"), key=SessionKey("ns-1", "beta", "s-0"))
    await append(store, user("q"), key=SessionKey("ns-1", "alpha", "s*[0]?"))

    found = await store.find_sessions("alpha", "s-0")

    assert [(s.namespace, s.session, s.message_count) for s in found] == [
        ("ns-2", "s-0", 1), ("ns-1", "s-0", 2)]
    assert [s.namespace for s in await store.find_sessions("alpha", "s*[0]?")] == ["ns-1"]
    assert await store.find_sessions("alpha", "s-") == []
    assert await store.find_sessions("nobody", "s-0") == []
    await store.delete_session(SessionKey("ns-2", "alpha", "s-0"))
    assert [s.namespace for s in await store.find_sessions("alpha", "s-0")] == ["ns-1"]


async def test_count_sessions_counts_one_namespace_across_agents(store: Store) -> None:
    await append(store, user("q"), key=SessionKey("ns-1", "alpha", "s1"))
    await append(store, user("q"), key=SessionKey("ns-1", "beta", "s1"))
    await append(store, user("again"), key=SessionKey("ns-1", "alpha", "s1"))
    await append(store, user("q"), key=SessionKey("ns-2", "alpha", "s2"))

    assert await store.count_sessions("ns-1") == 2
    assert await store.count_sessions("ns-2") == 1
    assert await store.count_sessions("nobody") == 0
    await store.delete_session(SessionKey("ns-1", "beta", "s1"))
    assert await store.count_sessions("ns-1") == 1
