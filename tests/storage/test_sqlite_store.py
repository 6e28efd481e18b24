"""The embedded store's own behaviour: jobs on the store's thread (the event loop serves on
while one waits), a database locked by another process, the write-ahead log kept bounded,
sessions listed by activity, migrations."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

import storage.sqlite
import storage.sqlite_checkpoint
import storage.sqlite_schema
from storage.base import StoreUnavailable
from storage.sqlite import SqliteStore
from strategies.records import LoadSpec, SessionKey, StoredMessage, TurnWrite

KEY = SessionKey("ns", "agent", "session")


def message(text: str) -> StoredMessage:
    return StoredMessage(role="user", content=text, tokens=3, fingerprint=f"fp-{text}")


@pytest.fixture
def store(sqlite_store: SqliteStore) -> SqliteStore:
    """The SQLite store alone (the suite's ``store`` runs every backend)."""
    return sqlite_store


@pytest.fixture
def other(tmp_path: Path, store: SqliteStore) -> sqlite3.Connection:
    """Another process's connection to the same file."""
    conn = sqlite3.connect(tmp_path / "store.db", isolation_level=None)
    yield conn
    conn.close()


async def test_a_turn_waits_for_a_lock_held_by_another_process_without_blocking_the_loop(
    store: SqliteStore, other: sqlite3.Connection
) -> None:
    other.execute("BEGIN IMMEDIATE")
    write = asyncio.create_task(store.append_turn(KEY, TurnWrite(messages=[message("hi")])))
    ticks = 0
    for _ in range(10):
        await asyncio.sleep(0.01)
        ticks += 1
    assert ticks == 10 and not write.done()
    other.execute("COMMIT")
    result = await asyncio.wait_for(write, 5)
    assert result.seqs == [1]
    snapshot = await store.load(KEY, LoadSpec())
    assert [m.content for m in snapshot.messages] == ["hi"]


async def test_turns_queued_behind_a_waiting_one_keep_their_order(
    store: SqliteStore, other: sqlite3.Connection
) -> None:
    other.execute("BEGIN IMMEDIATE")
    first = asyncio.create_task(store.append_turn(KEY, TurnWrite(messages=[message("one")])))
    await asyncio.sleep(0.05)
    second = asyncio.create_task(store.append_turn(KEY, TurnWrite(messages=[message("two")])))
    await asyncio.sleep(0.05)
    other.execute("COMMIT")
    assert (await first).seqs == [1]
    assert (await second).seqs == [2]


async def test_loads_answer_while_another_process_holds_the_write_lock(
    store: SqliteStore, other: sqlite3.Connection
) -> None:
    await store.append_turn(KEY, TurnWrite(messages=[message("kept")]))
    other.execute("BEGIN IMMEDIATE")
    try:
        snapshot = await asyncio.wait_for(store.load(KEY, LoadSpec()), 1)
    finally:
        other.execute("COMMIT")
    assert [m.content for m in snapshot.messages] == ["kept"]


async def test_a_held_sessions_check_answers_while_the_stores_thread_waits(
    store: SqliteStore, other: sqlite3.Connection
) -> None:
    """Whether a session the cache holds is still at its version is read on the event
    loop's own connection: it answers while the store's thread waits for another
    process's write lock, and a session that moved is then loaded whole."""
    await store.append_turn(KEY, TurnWrite(messages=[message("kept")], system_prompt=[
        {"role": "system", "content": "be brief"}]))
    version = (await store.load(KEY, LoadSpec())).meta.version
    other.execute("BEGIN IMMEDIATE")
    try:
        write = asyncio.create_task(
            store.append_turn(KEY, TurnWrite(messages=[message("later")])))
        await asyncio.sleep(0.05)
        held = await asyncio.wait_for(store.load(KEY, LoadSpec(), held_version=version), 1)
        assert held.held and held.exists and not held.messages
        assert held.meta.version == version
        assert held.meta.system_prompt == [{"role": "system", "content": "be brief"}]
        assert not write.done()
    finally:
        other.execute("COMMIT")
    await asyncio.wait_for(write, 5)
    moved = await store.load(KEY, LoadSpec(), held_version=version)
    assert not moved.held and [m.content for m in moved.messages] == ["kept", "later"]


async def test_the_write_ahead_log_stays_bounded_under_sustained_writes(
    store: SqliteStore, tmp_path: Path
) -> None:
    """Back-to-back writes give the background checkpoints no quiet moment to finish the
    log; past ``BACKSTOP_PAGES`` the store's own connection does, and it starts over: a
    stream of turns many times that size leaves a log of a fraction of what was written."""
    for turn in range(4000):
        await store.append_turn(KEY, TurnWrite(messages=[message(f"{turn} " + "x" * 4000)]))
    assert (tmp_path / "store.db").stat().st_size > 16 << 20  # 16 MB of text and more
    # over 100 MB of log frames written: a log that never started over would hold them
    # all (journal_size_limit cuts it back only when it starts over)
    assert (tmp_path / "store.db-wal").stat().st_size < 2 * storage.sqlite_schema.JOURNAL_SIZE_LIMIT
    snapshot = await store.load(KEY, LoadSpec(limit=5000))
    assert len(snapshot.messages) == 4000


async def test_the_log_is_copied_back_beside_the_store_s_calls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Checkpoints run on a thread of their own: once the store changed the rows a
    checkpoint waits for, the database file takes the log's pages, with no further call
    (far below the backstop, where the store's own connection would)."""
    monkeypatch.setattr(storage.sqlite_checkpoint, "CHECKPOINT_ROWS", 10)
    store = SqliteStore(f"sqlite:///{tmp_path}/idle.db")
    await store.open()
    try:
        for turn in range(20):  # 400 KB: about 100 pages, the backstop is 2000
            await store.append_turn(KEY, TurnWrite(messages=[message(f"{turn} " + "y" * 20_000)]))
        database = tmp_path / "idle.db"
        for _ in range(500):
            if database.stat().st_size > 400_000:
                break
            await asyncio.sleep(0.01)
        assert database.stat().st_size > 400_000
        assert len((await store.load(KEY, LoadSpec())).messages) == 20
    finally:
        await store.close()


async def test_a_closed_store_answers_unavailable(tmp_path: Path) -> None:
    store = SqliteStore(f"sqlite:///{tmp_path}/closed.db")
    await store.open()
    await store.close()
    with pytest.raises(StoreUnavailable):
        await store.load(KEY, LoadSpec())
    assert not await store.ping()


async def test_sessions_are_listed_by_their_last_turn(
    store: SqliteStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = [6_000.0]  # minute 100
    monkeypatch.setattr(storage.sqlite.time, "time", lambda: clock[0])

    async def turn(session: str, at: float) -> None:
        clock[0] = at
        await store.append_turn(
            SessionKey("ns", "agent", session), TurnWrite(messages=[message(f"{session}{at}")])
        )

    await turn("a", 6_000.0)
    await turn("b", 6_010.0)
    await turn("c", 6_070.0)  # minute 101
    await turn("a", 6_075.0)  # a moves to minute 101
    await turn("b", 6_019.5)  # b stays in minute 100, later than before
    listed = await store.list_sessions("agent")
    assert [(s.session, s.updated_at) for s in listed] == [
        ("a", 6_075.0), ("c", 6_070.0), ("b", 6_019.5)
    ]

async def test_a_database_from_before_the_activity_column_is_migrated(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    conn.executescript(
        "CREATE TABLE sessions (namespace TEXT NOT NULL, agent TEXT NOT NULL,"
        " session TEXT NOT NULL, meta TEXT NOT NULL, updated_at REAL NOT NULL,"
        " message_count INTEGER NOT NULL, PRIMARY KEY (namespace, agent, session));"
        "CREATE INDEX sessions_by_agent ON sessions (agent, updated_at);"
    )
    times = {"early": 6_000.25, "late": 6_059.999999, "later": 6_060.0, "latest": 9_000.5}
    conn.executemany(
        "INSERT INTO sessions VALUES ('ns', 'agent', ?, ?, ?, 1)",
        [(name, f'{{"updated_at": {at}, "version": 5}}', at) for name, at in times.items()],
    )
    conn.commit()
    conn.close()

    store, another = SqliteStore(f"sqlite:///{path}"), SqliteStore(f"sqlite:///{path}")
    await asyncio.gather(store.open(), another.open())  # both migrate: one adds the column
    await another.close()
    try:
        listed = await store.list_sessions("agent")
        assert [s.session for s in listed] == ["latest", "later", "late", "early"]
        check = sqlite3.connect(path)
        rows = dict(check.execute("SELECT session, active_at FROM sessions"))
        indexes = {row[0] for row in check.execute(
            "SELECT name FROM sqlite_master WHERE type = 'index'")}
        check.close()
        assert rows == {name: storage.sqlite_schema.activity(at) for name, at in times.items()}
        assert rows["late"] == 100 and rows["later"] == 101
        assert "sessions_by_agent" not in indexes and "sessions_by_activity" in indexes
        # an append to a migrated session keeps the order
        await store.append_turn(SessionKey("ns", "agent", "early"), TurnWrite(
            messages=[message("back")]))
        assert (await store.list_sessions("agent", limit=1))[0].session == "early"
    finally:
        await store.close()


async def test_agents_are_listed_by_their_latest_turn_from_the_activity_index(
    store: SqliteStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = [0.0]
    monkeypatch.setattr(storage.sqlite.time, "time", lambda: clock[0])
    for i in range(120):  # three agents, turns spread over several minutes, out of order
        clock[0] = 6_000.0 + (i * 37) % 400 + i / 1000
        await store.append_turn(
            SessionKey("ns", f"agent{i % 3}", f"s{i % 50}"), TurnWrite(messages=[message(f"{i}")])
        )
    listed = [(a.agent, a.session_count, a.updated_at) for a in await store.list_agents()]
    direct = sqlite3.connect(tmp_path / "store.db")
    try:
        expected = direct.execute(
            "SELECT agent, COUNT(*), MAX(updated_at) FROM sessions"
            " GROUP BY agent ORDER BY MAX(updated_at) DESC"
        ).fetchall()
    finally:
        direct.close()
    assert listed == expected and len(listed) == 3


async def test_a_session_stored_with_fields_of_an_earlier_version_loads_and_grows(
    tmp_path: Path,
) -> None:
    """A meta written by an earlier version (with ``rewrite_version``, which this one no
    longer keeps) is read, and the next append continues its version."""
    url = f"sqlite:///{tmp_path}/earlier.db"
    store = SqliteStore(url)
    await store.open()
    written = await store.append_turn(KEY, TurnWrite(messages=[message("before")]))
    await store.close()
    with sqlite3.connect(tmp_path / "earlier.db") as conn:
        conn.execute(
            "UPDATE sessions SET meta = json_set(meta, '$.rewrite_version', ?)",
            (written.meta.version,),
        )
    reopened = SqliteStore(url)
    await reopened.open()
    try:
        loaded = await reopened.load(KEY, LoadSpec())
        assert [m.content for m in loaded.messages] == ["before"]
        assert loaded.meta.version == written.meta.version
        grown = await reopened.append_turn(KEY, TurnWrite(messages=[message("after")]))
        assert grown.meta.version == written.meta.version + 1
        assert [m.content for m in (await reopened.load(KEY, LoadSpec())).messages] == [
            "before", "after"
        ]
    finally:
        await reopened.close()
