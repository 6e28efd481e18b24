"""The embedded store's own behaviour: jobs inline on the event loop, a database locked by
another process, checkpoints in the background."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from pathlib import Path

import pytest

import storage.sqlite
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


async def test_the_write_ahead_log_is_checkpointed_in_the_background(
    store: SqliteStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(storage.sqlite, "CHECKPOINT_EVERY", 8)
    monkeypatch.setattr(storage.sqlite, "WAL_RESTART_FRAMES", 64)
    for turn in range(400):
        await store.append_turn(KEY, TurnWrite(messages=[message(f"{turn} " + "x" * 2000)]))
        for _ in range(500):  # let a checkpoint this write started finish (a slow disk)
            if not store.checkpointing:
                break
            await asyncio.sleep(0.002)
    # without checkpoints the log holds every page written: several megabytes by now
    assert (tmp_path / "store.db-wal").stat().st_size < 1_000_000
    snapshot = await store.load(KEY, LoadSpec(limit=1000))
    assert len(snapshot.messages) == 400


async def test_a_long_log_is_restarted_with_the_loops_jobs_held_behind_the_restart(
    store: SqliteStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The copy runs while the loop writes on; the restart after it copies the few frames
    written meanwhile, and jobs that arrive during it wait on the store's thread, in order,
    instead of holding a transaction the restart would have to wait for."""
    monkeypatch.setattr(storage.sqlite, "CHECKPOINT_EVERY", 4)
    monkeypatch.setattr(storage.sqlite, "WAL_RESTART_FRAMES", 0)
    started, release = threading.Event(), threading.Event()
    restart, copy = store._restart_log, store._copy_log
    steps: list[tuple[str, str]] = []

    def held_restart() -> None:
        steps.append(("restart", threading.current_thread().name.split("_")[0]))
        started.set()
        release.wait(5)
        restart()

    def recorded_copy() -> int | None:
        steps.append(("copy", threading.current_thread().name.split("_")[0]))
        return copy()

    monkeypatch.setattr(store, "_restart_log", held_restart)
    monkeypatch.setattr(store, "_copy_log", recorded_copy)
    for turn in range(4):  # the fourth write starts the checkpoint
        await store.append_turn(KEY, TurnWrite(messages=[message(f"{turn} " + "x" * 5000)]))
    assert await asyncio.to_thread(started.wait, 5)
    assert steps == [("copy", "sqlite-store"), ("restart", "sqlite-store")]
    log_before = (tmp_path / "store.db-wal").stat().st_size

    late = [
        asyncio.create_task(store.append_turn(KEY, TurnWrite(messages=[message(f"late {i}")])))
        for i in range(3)
    ]
    loaded = asyncio.create_task(store.load(KEY, LoadSpec(limit=100)))
    await asyncio.sleep(0.05)
    assert not any(task.done() for task in [*late, loaded])
    release.set()
    assert [(await task).seqs for task in late] == [[5], [6], [7]]
    assert [m.content for m in (await loaded).messages][-3:] == ["late 0", "late 1", "late 2"]
    assert not store.checkpointing and store._queued == 0

    # the log started over: the writes after the restart reused its first frames
    probe = sqlite3.connect(tmp_path / "store.db")
    try:
        _, frames, _ = probe.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
    finally:
        probe.close()
    assert 0 < frames * 4096 < log_before
    # and jobs run inline on the loop again
    await store.append_turn(KEY, TurnWrite(messages=[message("after")]))
    assert store._queued == 0


async def test_a_restart_gives_up_soon_on_another_processs_lock(
    store: SqliteStore, other: sqlite3.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The loop's jobs wait behind a restart, so it must not wait the thread's whole busy
    timeout for another process: it gives up after ``RESTART_WAIT_MS`` and the next
    checkpoint tries again. The jobs behind it still wait for the lock as long as ever."""
    monkeypatch.setattr(storage.sqlite, "CHECKPOINT_EVERY", 4)
    monkeypatch.setattr(storage.sqlite, "WAL_RESTART_FRAMES", 0)
    locked, copied = threading.Event(), threading.Event()
    copy, restart = store._copy_log, store._restart_log
    took: list[float] = []

    def signalled_copy() -> int | None:
        locked.wait(5)
        try:
            return copy()
        finally:
            copied.set()

    def timed_restart() -> None:
        began = time.perf_counter()
        restart()
        took.append(time.perf_counter() - began)

    monkeypatch.setattr(store, "_copy_log", signalled_copy)
    monkeypatch.setattr(store, "_restart_log", timed_restart)
    for turn in range(4):  # the fourth starts the copy
        await store.append_turn(KEY, TurnWrite(messages=[message(f"{turn}")]))
    other.execute("BEGIN IMMEDIATE")  # the restart after the copy finds it held
    locked.set()
    try:
        assert await asyncio.to_thread(copied.wait, 5)
        late = asyncio.create_task(store.append_turn(KEY, TurnWrite(messages=[message("4")])))
        await asyncio.sleep(0.4)
        assert not late.done()  # behind the restart, then waiting for the lock
    finally:
        other.execute("COMMIT")
    assert (await late).seqs == [5]
    assert len(took) == 1 and took[0] < 1.0  # not the thread's 5 s
    assert store._thread_conn.execute("PRAGMA busy_timeout").fetchone() == (
        storage.sqlite.THREAD_BUSY_TIMEOUT_MS,
    )


async def test_a_writer_that_never_yields_still_moves_checkpoints_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Appends run inline and do not yield to the loop: each write settles a finished
    checkpoint step itself, so the log is still copied and restarted; and a log restarted
    after it grew is cut back to ``JOURNAL_SIZE_LIMIT``."""
    monkeypatch.setattr(storage.sqlite, "WAL_RESTART_FRAMES", 64)
    monkeypatch.setattr(storage.sqlite, "JOURNAL_SIZE_LIMIT", 128 * 4096)
    store = SqliteStore(f"sqlite:///{tmp_path}/busy.db")
    await store.open()
    wal = tmp_path / "busy.db-wal"
    try:
        monkeypatch.setattr(storage.sqlite, "CHECKPOINT_EVERY", 10**9)
        for turn in range(300):  # no checkpoint: the log grows
            await store.append_turn(KEY, TurnWrite(messages=[message(f"{turn} " + "x" * 2000)]))
        grown = wal.stat().st_size
        monkeypatch.setattr(storage.sqlite, "CHECKPOINT_EVERY", 8)
        sizes = []
        for turn in range(300, 900):
            await store.append_turn(KEY, TurnWrite(messages=[message(f"{turn} " + "x" * 2000)]))
            sizes.append(wal.stat().st_size)
        assert grown > 2_000_000
        # cut back to the limit when restarted, and never grown back to where it was
        assert min(sizes) <= 128 * 4096
        assert max(sizes[len(sizes) // 2 :]) < grown
        snapshot = await store.load(KEY, LoadSpec(limit=1000))
        assert len(snapshot.messages) == 900
    finally:
        await store.close()


async def test_sessions_are_listed_by_their_last_turn_and_only_a_new_minute_moves_the_index(
    store: SqliteStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = [6_000.0]  # minute 100
    monkeypatch.setattr(storage.sqlite.time, "time", lambda: clock[0])
    monkeypatch.setattr(storage.sqlite, "CHECKPOINT_EVERY", 10**9)  # frames are counted

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

    def frames() -> int:
        """Frames written since the last call (the log is emptied after counting)."""
        probe = sqlite3.connect(tmp_path / "store.db")
        try:
            written = probe.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()[1]
            assert probe.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0] == 0
            return int(written)
        finally:
            probe.close()

    sessions = [f"s{i}" for i in range(200)]
    for i, session in enumerate(sessions):
        await turn(session, 7_200.0 + i / 1000)  # minute 120
    frames()
    for i, session in enumerate(sessions):
        await turn(session, 7_201.0 + i / 1000)  # the same minute: the index stays
    same_minute = frames()
    for i, session in enumerate(sessions):
        await turn(session, 7_260.0 + i / 1000)  # minute 121: every entry moves
    new_minute = frames()
    # an index entry moved is about a page more in the log, per append
    assert new_minute - same_minute >= len(sessions) * 9 // 10
    listed = await store.list_sessions("agent", limit=3)
    assert [s.session for s in listed] == ["s199", "s198", "s197"]


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
        assert rows == {name: storage.sqlite.activity(at) for name, at in times.items()}
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
