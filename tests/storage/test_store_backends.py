"""What only one backend can show, beside the contract every backend keeps
(``test_store_*_contract.py``): Redis round trips, hash tags and outages (no server, a server
that stalls); SQLite durability on disk (closed and reopened, a writer killed with -9, a path
it cannot use). The helpers are in ``contract_support.py``.
"""

from __future__ import annotations

import asyncio
import signal
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from contract_support import KEY, append, assistant, chains, load, message, tool, user
from ports import free_port
from redis.asyncio import Redis
from redis.asyncio.connection import AbstractConnection
from redis.crc import key_slot
from redis_server import RedisServer, redis_server_available

from storage.base import StoreUnavailable
from storage.redis import SOCKET_TIMEOUT, RedisStore
from storage.sqlite import SqliteStore
from strategies.records import LoadSpec, SessionKey, SummaryRecord, TurnWrite

# --- Redis only --------------------------------------------------------------------------

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


async def test_a_redis_connection_closed_under_a_write_fails_it_as_unavailable_and_stores_nothing(
    redis_store: RedisStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failover closes connections calls are using; under uvloop the write on one raises
    RuntimeError. The turn fails as the store being unavailable (a 503, which a client
    retries), never as an internal error, and nothing of it is stored."""
    await redis_store.append_turn(KEY, TurnWrite([user("first"), assistant("one")]))

    async def closed(self: AbstractConnection, command: Any, check_health: bool = True) -> None:
        raise RuntimeError(
            "unable to perform operation on <TCPTransport closed=True reading=False "
            "0x55dcb00b8940>; the handler is closed"
        )

    with monkeypatch.context() as patch:
        patch.setattr(AbstractConnection, "send_packed_command", closed)
        with pytest.raises(StoreUnavailable, match="closed while in use"):
            await redis_store.append_turn(KEY, TurnWrite([user("second"), assistant("two")]))

    assert [m.content for m in (await redis_store.load(KEY, LoadSpec())).messages] == [
        "first", "one"]

    async def broken(self: AbstractConnection, command: Any, check_health: bool = True) -> None:
        raise RuntimeError("a defect, not a closed connection")

    with monkeypatch.context() as patch:  # any other RuntimeError is not the store's state
        patch.setattr(AbstractConnection, "send_packed_command", broken)
        with pytest.raises(RuntimeError, match="a defect"):
            await redis_store.append_turn(KEY, TurnWrite([user("third")]))


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


# --- SQLite only -------------------------------------------------------------------------


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
