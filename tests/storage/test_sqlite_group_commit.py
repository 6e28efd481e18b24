"""The embedded store's group commit: appends made while other turns are under way share
one transaction; one made alone is written at once."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

import storage.sqlite
from storage.base import StoreUnavailable
from storage.sqlite import SqliteStore
from storage.sqlite_prompts import SystemPrompts
from strategies.records import LoadSpec, SessionKey, StoredMessage, TurnWrite


def key(session: str) -> SessionKey:
    return SessionKey("ns", "agent", session)


def message(text: str) -> StoredMessage:
    return StoredMessage(role="user", content=text, tokens=3, fingerprint=f"fp-{text}")


def write(text: str, **fields: object) -> TurnWrite:
    return TurnWrite(messages=[message(text)], **fields)  # type: ignore[arg-type]


@pytest.fixture
def store(sqlite_store: SqliteStore) -> SqliteStore:
    """The SQLite store alone (the suite's ``store`` runs every backend)."""
    return sqlite_store


@pytest.fixture
def commits(store: SqliteStore) -> list[str]:
    """The transactions the loop's connection ends."""
    ended: list[str] = []
    assert store._conn is not None
    store._conn.set_trace_callback(
        lambda sql: ended.append(sql) if sql in ("COMMIT", "ROLLBACK") else None
    )
    return ended


async def contents(store: SqliteStore, session: str) -> list[str]:
    snapshot = await store.load(key(session), LoadSpec(limit=100))
    return [m.content for m in snapshot.messages]


async def test_appends_that_come_together_are_committed_in_one_transaction(
    store: SqliteStore, commits: list[str]
) -> None:
    results = await asyncio.gather(
        *(
            store.append_turn(key(f"s{i % 3}"), write(f"turn {i}"), with_others=True)
            for i in range(9)
        )
    )
    # they waited for the end of the loop's pass and were written together
    assert commits == ["COMMIT"]
    assert [r.seqs for r in results] == [[1], [1], [1], [2], [2], [2], [3], [3], [3]]
    assert [r.meta.head_seq for r in results] == [1, 1, 1, 2, 2, 2, 3, 3, 3]
    for session in range(3):
        assert await contents(store, f"s{session}") == [f"turn {i}" for i in range(session, 9, 3)]


async def test_an_append_made_alone_is_written_without_waiting_for_the_loop(
    store: SqliteStore, commits: list[str]
) -> None:
    pending = store.append_turn(key("s"), write("alone"))
    with pytest.raises(StopIteration) as done:
        pending.send(None)  # it never suspends
    assert done.value.value.seqs == [1]
    assert commits == ["COMMIT"]


async def test_one_failing_append_takes_no_other_in_its_group_down(
    store: SqliteStore, commits: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    encode = storage.sqlite._encode_message

    def fails_on_poison(message: StoredMessage, now: float) -> str:
        if message.content == "poison":
            raise ValueError("cannot encode")
        return encode(message, now)

    monkeypatch.setattr(storage.sqlite, "_encode_message", fails_on_poison)
    await store.append_turn(key("a"), write("first"))
    commits.clear()
    outcomes = await asyncio.gather(
        store.append_turn(key("a"), write("second"), with_others=True),
        store.append_turn(key("b"), write("poison"), with_others=True),
        store.append_turn(key("c"), write("third"), with_others=True),
        return_exceptions=True,
    )
    assert [o.seqs if not isinstance(o, Exception) else repr(o) for o in outcomes] == [
        [2],
        "ValueError('cannot encode')",
        [1],
    ]
    # the group rolled back, then each append ran alone
    assert commits == ["ROLLBACK", "COMMIT", "ROLLBACK", "COMMIT"]
    assert await contents(store, "a") == ["first", "second"]
    assert await contents(store, "b") == []
    assert await contents(store, "c") == ["third"]


async def test_a_group_meeting_another_processs_lock_is_written_on_the_thread_in_order(
    store: SqliteStore, tmp_path: Path
) -> None:
    other = sqlite3.connect(tmp_path / "store.db", isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
        tasks = [
            asyncio.create_task(store.append_turn(key("s"), write(f"turn {i}"), with_others=True))
            for i in range(4)
        ]
        await asyncio.sleep(0.05)
        assert not any(task.done() for task in tasks)  # waiting on the thread, loop free
        loading = asyncio.create_task(store.load(key("s"), LoadSpec(limit=100)))
        other.execute("COMMIT")
        assert [(await task).seqs for task in tasks] == [[1], [2], [3], [4]]
        # a load sent after them queued behind them and sees them all
        assert [m.content for m in (await loading).messages] == [f"turn {i}" for i in range(4)]
    finally:
        other.close()
    assert store._queued == 0
    assert await contents(store, "s") == [f"turn {i}" for i in range(4)]


async def test_a_load_of_a_session_with_appends_waiting_sees_them(
    store: SqliteStore,
) -> None:
    await store.append_turn(key("s"), write("before"))
    appended = asyncio.create_task(store.append_turn(key("s"), write("waiting"), with_others=True))
    await asyncio.sleep(0)  # the append now waits for the end of the pass
    assert store._appends and not appended.done()
    loaded = await store.load(key("s"), LoadSpec(limit=100))
    assert [m.content for m in loaded.messages] == ["before", "waiting"]
    assert (await appended).seqs == [2]


async def test_an_append_whose_caller_gave_up_is_still_written(store: SqliteStore) -> None:
    appended = asyncio.create_task(store.append_turn(key("s"), write("kept"), with_others=True))
    await asyncio.sleep(0)
    appended.cancel()
    with pytest.raises(asyncio.CancelledError):
        await appended
    await asyncio.sleep(0)
    assert await contents(store, "s") == ["kept"]


async def test_appends_waiting_at_close_are_written(tmp_path: Path) -> None:
    store = SqliteStore(f"sqlite:///{tmp_path}/store.db")
    await store.open()
    appended = asyncio.create_task(store.append_turn(key("s"), write("last"), with_others=True))
    await asyncio.sleep(0)
    await store.close()
    assert (await appended).seqs == [1]
    reopened = SqliteStore(f"sqlite:///{tmp_path}/store.db")
    await reopened.open()
    try:
        assert await contents(reopened, "s") == ["last"]
    finally:
        await reopened.close()
    with pytest.raises(StoreUnavailable):
        await store.append_turn(key("s"), write("after close"))


async def test_a_prompt_read_back_in_a_rolled_back_group_is_not_kept(
    store: SqliteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second append to a session in a group reads back the prompt the first one
    wrote. When the group rolls back and the first fails on its own, that prompt was never
    stored: its revision must not stay cached (another process may store a different
    prompt under the same revision)."""
    prompt = [{"role": "system", "content": "be brief"}]
    encode = storage.sqlite._encode_message
    seen: dict[str, int] = {}

    def failing(message: StoredMessage, now: float) -> str:
        seen[message.content] = seen.get(message.content, 0) + 1
        if message.content == "poison" or (message.content == "flaky" and seen["flaky"] > 1):
            raise ValueError("cannot encode")
        return encode(message, now)

    monkeypatch.setattr(storage.sqlite, "_encode_message", failing)
    first = await store.append_turn(key("s"), write("first"))
    revision = first.meta.version + 1  # the version the flaky append writes its prompt at
    outcomes = await asyncio.gather(
        store.append_turn(key("s"), write("flaky", system_prompt=prompt), with_others=True),
        store.append_turn(key("s"), write("after"), with_others=True),
        store.append_turn(key("p"), write("poison"), with_others=True),
        return_exceptions=True,
    )
    assert [isinstance(o, ValueError) for o in outcomes] == [True, False, True]
    assert store._prompts.cached(("ns", "agent", "s"), revision) is None
    snapshot = await store.load(key("s"), LoadSpec(limit=100))
    assert snapshot.meta.system_prompt is None
    assert [m.content for m in snapshot.messages] == ["first", "after"]


def test_forgetting_sessions_drops_only_their_prompts() -> None:
    prompts = SystemPrompts()
    a, b = ("ns", "agent", "a"), ("ns", "agent", "b")
    prompts.committed(a, 1, [{"content": "a1"}], 10)
    prompts.committed(a, 2, [{"content": "a2"}], 10)
    prompts.committed(b, 1, [{"content": "b1"}], 10)
    prompts.forget({a})
    assert prompts.cached(a, 1) is None and prompts.cached(a, 2) is None
    assert prompts.cached(b, 1) == [{"content": "b1"}]
    assert prompts._size == 10


async def test_an_append_meeting_a_lock_after_others_in_its_group_committed_is_retried(
    store: SqliteStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The group failed and its appends run one by one; another process takes the lock
    after the first of them committed: the rest wait for it on the store's thread."""
    other = sqlite3.connect(tmp_path / "store.db", isolation_level=None)
    encode, append = storage.sqlite._encode_message, storage.sqlite._append
    alone: list[str] = []

    def fails_on_poison(message: StoredMessage, now: float) -> str:
        if message.content == "poison":
            raise ValueError("cannot encode")
        return encode(message, now)

    def append_then_lock(conn: sqlite3.Connection, ids, write, *caches):  # type: ignore[no-untyped-def]
        result = append(conn, ids, write, *caches)
        alone.append(write.messages[0].content)
        if len(alone) == 1:
            other.execute("BEGIN IMMEDIATE")
            asyncio.get_running_loop().call_later(0.05, other.execute, "COMMIT")
        return result

    monkeypatch.setattr(storage.sqlite, "_encode_message", fails_on_poison)
    monkeypatch.setattr(storage.sqlite, "_append", append_then_lock)
    try:
        outcomes = await asyncio.gather(
            store.append_turn(key("a"), write("first"), with_others=True),
            store.append_turn(key("b"), write("poison"), with_others=True),
            store.append_turn(key("c"), write("third"), with_others=True),
            return_exceptions=True,
        )
    finally:
        other.close()
    assert [o.seqs if not isinstance(o, Exception) else type(o) for o in outcomes] == [
        [1],
        ValueError,
        [1],
    ]
    # "third" met the lock inline, then was written on the thread once it was released
    assert alone == ["first", "third"] and store._queued == 0
    assert await contents(store, "c") == ["third"]
