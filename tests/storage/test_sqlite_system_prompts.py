"""The embedded store keeps a session's system prompt in its own row, written when it
changes: the meta rewritten by every append stays small (storage/sqlite_prompts.py)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import orjson
import pytest

from storage.sqlite import SqliteStore
from strategies.records import LoadSpec, SessionKey, StoredMessage, TurnWrite

KEY = SessionKey("ns", "agent", "session")
BIG = [{"role": "system", "content": "You are a careful assistant. " * 400}]  # ~12 KB


def message(text: str) -> StoredMessage:
    return StoredMessage(role="user", content=text, tokens=3, fingerprint=f"fp-{text}")


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "store.db"  # where conftest's sqlite_store keeps its database


@pytest.fixture
def store(sqlite_store: SqliteStore) -> SqliteStore:
    return sqlite_store


def rows(path: Path, sql: str) -> list[tuple]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def prompt_row(path: Path) -> tuple[int, str] | None:
    found = rows(path, "SELECT revision, data FROM system_prompts")
    assert len(found) <= 1
    return found[0] if found else None


async def test_an_unchanged_prompt_is_written_once_and_kept_out_of_the_meta(
    store: SqliteStore, path: Path
) -> None:
    await store.append_turn(KEY, TurnWrite([message("q0")], system_prompt=BIG, system_tokens=9))
    first = prompt_row(path)
    assert first is not None and orjson.loads(first[1]) == BIG
    for i in range(1, 5):
        await store.append_turn(KEY, TurnWrite([message(f"q{i}")], model="m", calibration=1.1))

    assert prompt_row(path) == first  # the same revision: never rewritten
    [(meta_json,)] = rows(path, "SELECT meta FROM sessions")
    assert len(meta_json) < 1000 and "careful assistant" not in meta_json
    snapshot = await store.load(KEY, LoadSpec())
    assert snapshot.meta.system_prompt == BIG and snapshot.meta.system_tokens == 9
    assert [m.content for m in snapshot.messages] == [f"q{i}" for i in range(5)]


async def test_a_changed_prompt_replaces_the_stored_one(store: SqliteStore, path: Path) -> None:
    other = [{"role": "system", "content": "be brief"}]
    await store.append_turn(KEY, TurnWrite([message("q0")], system_prompt=BIG))
    result = await store.append_turn(KEY, TurnWrite([message("q1")], system_prompt=other))

    assert result.meta.system_prompt == other
    revision, data = prompt_row(path)
    assert orjson.loads(data) == other and revision == result.meta.version
    assert (await store.load(KEY, LoadSpec())).meta.system_prompt == other


async def test_a_prompt_changed_by_another_process_is_read_not_served_from_the_cache(
    store: SqliteStore, path: Path
) -> None:
    first = await store.append_turn(KEY, TurnWrite([message("q0")], system_prompt=BIG))
    cached = await store.load(KEY, LoadSpec(), held_version=first.meta.version)
    assert cached.held and cached.meta.system_prompt == BIG

    other = SqliteStore(f"sqlite:///{path}")
    await other.open()
    try:
        changed = [{"role": "system", "content": "from the other process"}]
        await other.append_turn(KEY, TurnWrite([message("q1")], system_prompt=changed))
    finally:
        await other.close()

    snapshot = await store.load(KEY, LoadSpec(), held_version=first.meta.version)
    assert not snapshot.held and snapshot.meta.system_prompt == changed
    assert [m.content for m in snapshot.messages] == ["q0", "q1"]


async def test_the_prompt_survives_a_reopen_and_every_other_meta_write(
    store: SqliteStore, path: Path
) -> None:
    await store.append_turn(KEY, TurnWrite([message("q0")], system_prompt=BIG))
    await store.set_calibration(KEY, 1.3)
    await store.set_compressed(KEY, {1: "[stub]"})
    await store.close()

    reopened = SqliteStore(f"sqlite:///{path}")
    await reopened.open()
    try:
        meta = (await reopened.load(KEY, LoadSpec())).meta
        assert meta.system_prompt == BIG and meta.calibration == 1.3
    finally:
        await reopened.close()
    await store.open()  # the fixture closes it


async def test_a_prompt_stored_inline_by_an_earlier_version_is_read_and_moved_out(
    store: SqliteStore, path: Path
) -> None:
    await store.append_turn(KEY, TurnWrite([message("q0")]))
    # the meta as the previous release wrote it: the prompt inline, no revision
    conn = sqlite3.connect(path, isolation_level=None)
    [(meta_json,)] = conn.execute("SELECT meta FROM sessions").fetchall()
    legacy = orjson.loads(meta_json) | {"system_prompt": BIG, "version": 1}
    conn.execute("UPDATE sessions SET meta = ?", (orjson.dumps(legacy).decode(),))
    conn.close()

    assert (await store.load(KEY, LoadSpec())).meta.system_prompt == BIG
    await store.append_turn(KEY, TurnWrite([message("q1")]))

    assert orjson.loads(prompt_row(path)[1]) == BIG
    [(meta_json,)] = rows(path, "SELECT meta FROM sessions")
    assert "careful assistant" not in meta_json
    assert (await store.load(KEY, LoadSpec())).meta.system_prompt == BIG


async def test_deleting_a_session_deletes_its_prompt(store: SqliteStore, path: Path) -> None:
    await store.append_turn(KEY, TurnWrite([message("q0")], system_prompt=BIG))
    assert await store.delete_session(KEY)
    assert prompt_row(path) is None
    assert (await store.load(KEY, LoadSpec())).meta.system_prompt is None
