"""The embedded store numbers its sessions: messages are keyed by the session's number,
not its three names. A database written before is migrated when opened, with nothing lost."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from storage.base import StoreUnavailable
from storage.sqlite import SqliteStore
from strategies.records import LoadSpec, SessionKey, StoredMessage, SummaryRecord, TurnWrite

KEY = SessionKey("ns", "agent", "session")
OTHER = SessionKey("ns", "agent", "other")
PROMPT = [{"role": "system", "content": "You are terse."}]

# sessions and messages as the store wrote them before sessions had numbers
LEGACY = """
CREATE TABLE legacy_sessions (
    namespace TEXT NOT NULL, agent TEXT NOT NULL, session TEXT NOT NULL,
    meta TEXT NOT NULL, updated_at REAL NOT NULL, message_count INTEGER NOT NULL,
    active_at INTEGER,
    PRIMARY KEY (namespace, agent, session)
);
CREATE TABLE legacy_messages (
    namespace TEXT NOT NULL, agent TEXT NOT NULL, session TEXT NOT NULL,
    seq INTEGER NOT NULL, superseded INTEGER NOT NULL DEFAULT 0,
    role TEXT NOT NULL, chain TEXT NOT NULL, tool_call_id TEXT,
    compressed TEXT, data TEXT NOT NULL,
    PRIMARY KEY (namespace, agent, session, seq)
);
INSERT INTO legacy_sessions SELECT namespace, agent, session, meta, updated_at,
    message_count, active_at FROM sessions ORDER BY id DESC;
INSERT INTO legacy_messages SELECT namespace, agent, session, seq, superseded, role, chain,
    tool_call_id, compressed, data FROM messages JOIN sessions ON sessions.id = messages.sid;
DROP TABLE messages;
DROP TABLE sessions;
ALTER TABLE legacy_sessions RENAME TO sessions;
ALTER TABLE legacy_messages RENAME TO messages;
CREATE INDEX sessions_by_activity ON sessions (agent, active_at);
CREATE INDEX messages_tool
    ON messages (namespace, agent, session, tool_call_id) WHERE tool_call_id IS NOT NULL;
CREATE INDEX messages_chain ON messages (namespace, agent, session, chain);
"""


def message(text: str, role: str = "user", **fields: object) -> StoredMessage:
    return StoredMessage(role=role, content=text, tokens=3, fingerprint=f"fp-{text}",
                         **fields)  # type: ignore[arg-type]


def to_legacy(path: Path) -> None:
    """Rewrite a closed database into the shape written before sessions had numbers."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.executescript(f"BEGIN; {LEGACY} COMMIT;")
    finally:
        conn.close()


def columns(path: Path, table: str) -> list[str]:
    conn = sqlite3.connect(path)
    try:
        return [row[1] for row in conn.execute(f"PRAGMA table_info({table})")]
    finally:
        conn.close()


def indexes(path: Path) -> dict[str, str]:
    conn = sqlite3.connect(path)
    try:
        return dict(conn.execute(
            "SELECT name, sql FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL"))
    finally:
        conn.close()


async def fill(store: SqliteStore) -> None:
    """Two sessions with what a session can hold: a system prompt, tool calls and their
    results, a rewound (superseded) stretch, compression stubs, a summary."""
    call = [{"id": "call-1", "type": "function",
             "function": {"name": "lookup", "arguments": "{}"}}]
    await store.append_turn(KEY, TurnWrite(
        messages=[message("hello"), message("", "assistant", tool_calls=call),
                  message("result " * 50, "tool", tool_call_id="call-1"),
                  message("done", "assistant")],
        system_prompt=PROMPT, system_tokens=5, model="gpt-4o", calibration=1.1,
    ))
    await store.append_turn(KEY, TurnWrite(
        messages=[message("again"), message("sure", "assistant")]
    ))
    await store.append_turn(KEY, TurnWrite(  # the client rewound past "again"
        messages=[message("instead"), message("fine", "assistant")], supersede_after=4,
    ))
    await store.set_compressed(KEY, {3: "[tool result stored: 50 words]"})
    await store.add_summary(KEY, SummaryRecord(kind="compaction", text="greeted", from_seq=1,
                                               to_seq=2))
    await store.append_turn(OTHER, TurnWrite(messages=[message("other one")]))


async def picture(store: SqliteStore) -> dict[str, object]:
    """Everything a reader sees of the two sessions."""
    seen: dict[str, object] = {}
    for key in (KEY, OTHER):
        whole = await store.load(key, LoadSpec(limit=100, since="all"))
        seen[key.session] = (
            whole.meta,
            whole.messages,
            whole.summaries,
            await store.get_range(key, 1, 100),
            await store.get_messages(key, [1, 2, 3, 5, 6]),
            await store.find_tool_result(key, "call-1"),
        )
    seen["sessions"] = await store.list_sessions("agent")
    seen["agents"] = await store.list_agents()
    return seen


async def legacy_database(path: Path, *, filled: bool = True) -> dict[str, object]:
    """A database at ``path`` as written before sessions had numbers: ``fill``ed (or
    empty) by the store, then rewritten into the old shape. Returns what a reader saw of it."""
    store = SqliteStore(f"sqlite:///{path}")
    await store.open()
    if filled:
        await fill(store)
    seen = await picture(store)
    await store.close()
    to_legacy(path)
    return seen


async def test_a_database_from_before_numbered_sessions_is_migrated_with_nothing_lost(
    tmp_path: Path,
) -> None:
    path = tmp_path / "store.db"
    before = await legacy_database(path)
    assert "sid" not in columns(path, "messages") and "id" not in columns(path, "sessions")

    store = SqliteStore(f"sqlite:///{path}")
    await store.open()
    try:
        assert await picture(store) == before
        assert columns(path, "messages")[:2] == ["sid", "seq"]
        assert columns(path, "sessions")[0] == "id"
        made = indexes(path)
        assert "messages_chain" not in made
        assert "(sid, tool_call_id)" in made["messages_tool"]
        assert "sessions_by_activity" in made
        # the sessions go on where they were: seqs and chains continue
        old_head = (await store.load(KEY, LoadSpec(limit=100))).messages[-1]
        added = await store.append_turn(KEY, TurnWrite(messages=[message("later")]))
        assert added.seqs == [old_head.seq + 1]
        assert added.meta.system_prompt == PROMPT
        reloaded = (await store.load(KEY, LoadSpec(limit=100))).messages
        assert [m.content for m in reloaded][-3:] == ["instead", "fine", "later"]
        resent = [m.chain for m in reloaded]
        matched = await store.load(KEY, LoadSpec(limit=1), probe=[*resent, "new"])
        assert (matched.matched, matched.matched_seq) == (len(resent), added.seqs[0])
        await store.append_turn(SessionKey("ns", "agent", "new"),
                                TurnWrite(messages=[message("first")]))
        assert (await store.list_sessions("agent", limit=1))[0].session == "new"
    finally:
        await store.close()


async def test_two_processes_opening_an_old_database_at_once_both_serve_it(
    tmp_path: Path,
) -> None:
    path = tmp_path / "store.db"
    before = await legacy_database(path)

    first, second = SqliteStore(f"sqlite:///{path}"), SqliteStore(f"sqlite:///{path}")
    await asyncio.gather(first.open(), second.open())  # one migrates, the other finds it done
    try:
        assert await picture(first) == before
        assert await picture(second) == before
    finally:
        await first.close()
        await second.close()


async def test_an_old_database_with_a_message_without_its_session_is_left_as_it_was(
    tmp_path: Path,
) -> None:
    path = tmp_path / "store.db"
    await legacy_database(path)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("DELETE FROM sessions WHERE session = 'other'")  # its message stays
    dump = list(conn.iterdump())
    conn.close()

    store = SqliteStore(f"sqlite:///{path}")
    with pytest.raises(StoreUnavailable, match="1 of 9 messages have no session row"):
        await store.open()
    conn = sqlite3.connect(path)
    assert list(conn.iterdump()) == dump
    conn.close()


async def test_a_session_made_after_a_delete_sees_none_of_the_deleted_ones_messages(
    sqlite_store: SqliteStore, tmp_path: Path
) -> None:
    """SQLite may give a new row the number of the newest deleted one: the messages go
    with their session, in the same transaction, so a new session never inherits any."""
    await sqlite_store.append_turn(KEY, TurnWrite(messages=[message("kept")]))
    doomed = SessionKey("ns", "agent", "doomed")
    await sqlite_store.append_turn(doomed, TurnWrite(messages=[message("a"), message("b")]))
    await sqlite_store.add_summary(doomed, SummaryRecord(kind="compaction", text="ab",
                                                         from_seq=1, to_seq=2))
    assert await sqlite_store.delete_session(doomed)
    conn = sqlite3.connect(tmp_path / "store.db")
    try:
        assert conn.execute("SELECT COUNT(*) FROM messages").fetchone() == (1,)
        assert conn.execute("SELECT COUNT(*) FROM summaries").fetchone() == (0,)
    finally:
        conn.close()

    reborn = SessionKey("ns", "agent", "reborn")
    added = await sqlite_store.append_turn(reborn, TurnWrite(messages=[message("fresh")]))
    assert added.seqs == [1]
    assert [m.content for m in (await sqlite_store.load(reborn, LoadSpec())).messages] == [
        "fresh"
    ]
    assert [m.content for m in (await sqlite_store.load(KEY, LoadSpec())).messages] == ["kept"]
    assert await sqlite_store.get_range(doomed, 1, 10) == []


async def test_a_resent_history_is_matched_without_an_index_on_chains(tmp_path: Path) -> None:
    """A database made by an earlier version loses its index on chains when opened (every
    append paid for it); a resent history is still matched, at the head or deep below it."""
    path = tmp_path / "old.db"
    await legacy_database(path, filled=False)
    assert "messages_chain" in indexes(path)
    store = SqliteStore(f"sqlite:///{path}")
    await store.open()
    try:
        assert "messages_chain" not in indexes(path)

        texts = [f"m{i}" for i in range(300)]
        await store.append_turn(KEY, TurnWrite(messages=[message(t) for t in texts]))
        chains = (await store.load(KEY, LoadSpec(limit=1000))).messages
        probe = [m.chain for m in chains]

        whole = await store.load(KEY, LoadSpec(limit=5), probe=[*probe, "new"])
        assert (whole.matched, whole.matched_seq) == (300, 300)
        edited = await store.load(KEY, LoadSpec(limit=5), probe=[*probe[:3], "edited", "x"])
        assert (edited.matched, edited.matched_seq) == (3, 3)
        unrelated = await store.load(KEY, LoadSpec(limit=5), probe=["a", "b"])
        assert (unrelated.matched, unrelated.matched_seq) == (0, 0)
    finally:
        await store.close()
