"""The embedded store's session heads: a turn on a session the loop's connection last
read or wrote reads neither its meta nor its agent's config again, until anything else
writes to the database."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

import storage.sqlite
from storage.sqlite import SqliteStore
from storage.sqlite_heads import Heads
from strategies.records import LoadSpec, SessionKey, SessionMeta, StoredMessage, TurnWrite

KEY = SessionKey("ns", "agent", "session")


def write(text: str, **fields: object) -> TurnWrite:
    message = StoredMessage(role="user", content=text, tokens=3, fingerprint=f"fp-{text}")
    return TurnWrite(messages=[message], **fields)  # type: ignore[arg-type]


@pytest.fixture
def store(sqlite_store: SqliteStore) -> SqliteStore:
    """The SQLite store alone (the suite's ``store`` runs every backend)."""
    return sqlite_store


@pytest.fixture
async def second(tmp_path: Path, store: SqliteStore) -> SqliteStore:
    """Another process's store on the same file."""
    opened = SqliteStore(f"sqlite:///{tmp_path}/store.db")
    await opened.open()
    yield opened
    await opened.close()


@pytest.fixture
def statements(store: SqliteStore) -> list[str]:
    seen: list[str] = []
    assert store._conn is not None
    store._conn.set_trace_callback(seen.append)
    return seen


def reads_of_the_head(statements: list[str]) -> list[str]:
    return [sql for sql in statements if "FROM sessions" in sql or "FROM agent_configs" in sql]


async def turn_one(store: SqliteStore) -> SessionMeta:
    """The session's first turn, and a load that lets the heads learn the agent's config
    (an append learns only the session's meta)."""
    first = await store.append_turn(KEY, write("one"))
    assert await unchanged(store, first.meta.version)
    return first.meta


async def unchanged(store: SqliteStore, version: int) -> bool:
    return (await store.load(KEY, LoadSpec(), known_version=version)).unchanged


async def test_a_turn_on_a_session_the_connection_knows_reads_no_head(
    store: SqliteStore, statements: list[str]
) -> None:
    await store.load(SessionKey("ns", "agent", "other"), LoadSpec())  # the agent's config
    first = await store.append_turn(KEY, write("one"))
    statements.clear()
    snapshot = await store.load(KEY, LoadSpec(), known_version=first.meta.version)
    assert snapshot.unchanged and snapshot.meta == first.meta
    second = await store.append_turn(KEY, write("two"))
    assert reads_of_the_head(statements) == []
    assert statements.count("PRAGMA data_version") == 2  # what it costs instead
    assert second.seqs == [2] and second.meta.version == first.meta.version + 1
    assert second.meta.head_chain != first.meta.head_chain
    # what the heads answered is what is stored
    stored = await store.load(KEY, LoadSpec(limit=10))
    assert stored.meta == second.meta
    assert [m.content for m in stored.messages] == ["one", "two"]


async def test_the_meta_handed_out_is_the_callers_own(store: SqliteStore) -> None:
    first = await turn_one(store)
    snapshot = await store.load(KEY, LoadSpec(), known_version=first.version)
    snapshot.meta.head_seq = 99
    first.head_seq = 98
    assert (await store.append_turn(KEY, write("two"))).seqs == [2]


async def test_another_processs_writes_are_seen(
    store: SqliteStore, second: SqliteStore, statements: list[str]
) -> None:
    first = await turn_one(store)
    by_other = await second.append_turn(KEY, write("other"))
    assert not await unchanged(store, first.version)
    assert await unchanged(store, by_other.meta.version)
    assert (await store.append_turn(KEY, write("three"))).seqs == [3]
    # the agent's config too
    await second.set_agent_config("agent", {"kind": "windowed"})
    snapshot = await store.load(KEY, LoadSpec(), known_version=by_other.meta.version + 1)
    assert snapshot.agent_config == {"kind": "windowed"}


async def test_the_loops_own_other_writes_are_seen(store: SqliteStore) -> None:
    first = await turn_one(store)
    await store.set_compressed(KEY, {1: "[stub]"})  # changes the version
    assert not await unchanged(store, first.version)
    await store.set_agent_config("agent", {"kind": "full"})
    latest = await store.load(KEY, LoadSpec(limit=10))
    assert latest.agent_config == {"kind": "full"}
    assert latest.messages[0].compressed_content == "[stub]"
    assert await unchanged(store, latest.meta.version)
    assert (await store.append_turn(KEY, write("two"))).seqs == [2]


async def test_writes_on_the_stores_thread_are_seen(store: SqliteStore, tmp_path: Path) -> None:
    """The session's append goes straight to the thread (a job is queued there before it):
    the loop's heads still hold the session, and only data_version tells them."""
    first = await turn_one(store)
    other = sqlite3.connect(tmp_path / "store.db", isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
        ahead = asyncio.create_task(
            store.append_turn(SessionKey("ns", "agent", "ahead"), write("first in line"))
        )
        await asyncio.sleep(0.05)  # met the lock inline, now waiting on the thread
        assert store._queued == 1
        waiting = asyncio.create_task(store.append_turn(KEY, write("locked")))
        await asyncio.sleep(0.05)
        other.execute("COMMIT")
        await ahead
        on_thread = await waiting  # written by the thread's connection
    finally:
        other.close()
    assert on_thread.seqs == [2]
    assert not await unchanged(store, first.version)
    assert await unchanged(store, on_thread.meta.version)
    assert (await store.append_turn(KEY, write("three"))).seqs == [3]


async def test_a_rolled_back_append_is_forgotten(
    store: SqliteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a group, the first append wrote its head, then another failed before changing a
    row; alone again, the first fails too. Nothing was stored, so the head it wrote in
    the rolled back transaction must not answer for the session."""
    first = await turn_one(store)
    encode = storage.sqlite._encode_message
    calls = {"flaky": 0}

    def failing(message: StoredMessage, now: float) -> str:
        if message.content == "flaky":
            calls["flaky"] += 1
        if message.content == "poison" or (message.content == "flaky" and calls["flaky"] > 1):
            raise ValueError("cannot encode")
        return encode(message, now)

    with monkeypatch.context() as patch:
        patch.setattr(storage.sqlite, "_encode_message", failing)
        outcomes = await asyncio.gather(
            store.append_turn(KEY, write("flaky"), with_others=True),
            store.append_turn(SessionKey("ns", "agent", "p"), write("poison"), with_others=True),
            return_exceptions=True,
        )
    assert [type(o) for o in outcomes] == [ValueError, ValueError]
    assert not await unchanged(store, first.version + 1)  # the version rolled back
    assert await unchanged(store, first.version)
    assert (await store.append_turn(KEY, write("two"))).seqs == [2]
    assert [m.content for m in (await store.load(KEY, LoadSpec(limit=10))).messages] == [
        "one",
        "two",
    ]


def test_the_heads_keep_the_latest_sessions_only(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "heads.db", isolation_level=None)
    try:
        heads = Heads(conn, max_sessions=2)
        heads.check(conn)
        for number, name in enumerate(("a", "b", "c"), start=1):
            heads.wrote(conn, ("ns", "agent", name), SessionMeta(head_seq=1), 0, number)
        assert heads.meta(("ns", "agent", "a")) is None
        assert heads.meta(("ns", "agent", "c")) == (SessionMeta(head_seq=1), 0, 3)
        # a session's prompt stored at a revision is kept out of its head, as stored
        prompt = [{"role": "system", "content": "hi"}]
        heads.wrote(conn, ("ns", "agent", "d"), SessionMeta(system_prompt=prompt), 7, 4)
        assert heads.meta(("ns", "agent", "d")) == (SessionMeta(), 7, 4)
        # a change the heads were not told about: forgotten
        conn.execute("CREATE TABLE t (x)")
        conn.execute("INSERT INTO t VALUES (1)")
        heads.check(conn)
        assert heads.meta(("ns", "agent", "d")) is None
    finally:
        conn.close()
