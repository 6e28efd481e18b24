"""The SQLite store's session log: a turn's load, its append, and the writes that change
a session's messages or summaries (compression stubs, summaries, calibration).

Each function runs on the store's thread, on its connection, in one transaction.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterable, Sequence
from typing import Any

import orjson

from storage import sqlite_responses, sqlite_search
from storage.codec import encode_message, message_from_body
from storage.sqlite_prompts import Ids, SystemPrompts
from storage.sqlite_schema import KEY, SESSION, Snapshot, Transaction, activity
from strategies.records import (
    AppendResult,
    LoadSpec,
    LogPage,
    RangeBudget,
    SessionMeta,
    SessionSnapshot,
    StoredMessage,
    SummaryRecord,
    TurnWrite,
    chain_hash,
    first_version,
)

Row = tuple[Any, ...]
Stored = tuple[SessionMeta, int, int]  # a meta (prompt not read), its prompt's revision, sid
WrittenPrompt = tuple[Ids, int, list[dict[str, Any]], int]  # SystemPrompts.committed's

MESSAGE_COLUMNS = "seq, chain, compressed, data"
READ_SESSION = f"SELECT meta, id FROM sessions WHERE {KEY}"
# The agent's stored config, the session's meta and its number, in one statement (one
# row, the session's columns NULL when it is not stored)
LOAD_HEAD = (
    "SELECT (SELECT config FROM agent_configs WHERE agent = ?), sessions.meta, sessions.id"
    " FROM (SELECT 1) LEFT JOIN sessions ON sessions.namespace = ?"
    " AND sessions.agent = ? AND sessions.session = ?"
)
TAIL = (
    f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE sid = ? AND superseded = 0"
    " AND seq >= ? ORDER BY seq DESC LIMIT ?"
)
# The active chains, newest first (the primary key, backwards)
ACTIVE_CHAINS = "SELECT seq, chain FROM messages WHERE sid = ? AND superseded = 0 ORDER BY seq DESC"
INSERT_MESSAGE = (
    "INSERT INTO messages (sid, seq, role, chain, tool_call_id, compressed, data)"
    " VALUES (?, ?, ?, ?, ?, ?, ?)"
)
INSERT_SESSION = (
    "INSERT INTO sessions (namespace, agent, session, meta, updated_at, message_count)"
    " VALUES (?, ?, ?, '{}', ?, 0) RETURNING id"
)
UPDATE_SESSION = "UPDATE sessions SET meta = ?, updated_at = ?, message_count = ? WHERE id = ?"
# the same, in a new minute of activity (the activity index moves only then)
UPDATE_ACTIVE_SESSION = (
    "UPDATE sessions SET meta = ?, updated_at = ?, message_count = ?, active_at = ?"
    " WHERE id = ?"
)
# The ids of the latest turn writes (of every session), to recognise one applied before
# (``TurnWrite.write_id``): a retry comes within seconds, so the oldest are dropped, every
# ``PRUNE_WRITES``-th write (a statement fewer in the others).
KEPT_WRITES = 100_000
PRUNE_WRITES = 1_000


def load(
    conn: sqlite3.Connection,
    ids: Ids,
    spec: LoadSpec,
    probe: Sequence[str],
    held_version: int | None,
    prompts: SystemPrompts,
) -> SessionSnapshot:
    """``Store.load`` in one read transaction."""
    with Snapshot(conn):
        config_json, meta_json, sid = conn.execute(LOAD_HEAD, (ids[1], *ids)).fetchone()
        agent_config = orjson.loads(config_json) if config_json else None
        if meta_json is None:
            return SessionSnapshot(SessionMeta(), [], [], agent_config=agent_config)
        meta = _with_prompt(conn, ids, decode_meta(meta_json), prompts)
        matched, matched_seq = match_probe(conn, sid, probe)
        if held_version is not None and meta.version == held_version:
            return SessionSnapshot(
                meta, [], [], matched, matched_seq, agent_config, exists=True, held=True
            )
        low = {"all": 0, "boundary": meta.boundary_seq + 1, "turn": meta.last_user_seq}
        rows = conn.execute(TAIL, (sid, low[spec.since], max(spec.limit, 0))).fetchall()
        summaries = conn.execute(f"SELECT data FROM summaries WHERE {KEY} ORDER BY id", ids)
        return SessionSnapshot(
            meta=meta,
            messages=decode_rows(reversed(rows)),
            summaries=[SummaryRecord.from_dict(orjson.loads(row[0])) for row in summaries],
            matched=matched,
            matched_seq=matched_seq,
            agent_config=agent_config,
            exists=True,
        )


def load_held(
    conn: sqlite3.Connection, ids: Ids, held_version: int, prompts: SystemPrompts
) -> SessionSnapshot | None:
    """``Store.load`` of a session a cache holds at ``held_version`` (no probe), when the
    session is still at that version: one statement, and the system prompt from
    ``prompts`` or one more (a revision names one prompt only, so the two need no
    transaction around them). None when it moved or is gone, or its prompt is not the one
    the meta names: ``load`` answers then."""
    config_json, meta_json, _ = conn.execute(LOAD_HEAD, (ids[1], *ids)).fetchone()
    if meta_json is None:
        return None
    meta, revision = decode_meta(meta_json)
    if meta.version != held_version:
        return None
    if revision:
        meta.system_prompt = prompts.read(conn, ids, revision)
        if meta.system_prompt is None:
            return None
    agent_config = orjson.loads(config_json) if config_json else None
    return SessionSnapshot(meta, [], [], 0, 0, agent_config, exists=True, held=True)


def match_probe(conn: sqlite3.Connection, sid: int, probe: Sequence[str]) -> tuple[int, int]:
    """Length of the longest probe prefix ending at an active chain, and that chain's seq.

    Chains are cumulative: a probe chain equals an active one only when the whole prefix
    up to it does, at the same position. So the newest active message whose chain is in
    the probe is the answer. A resent history usually matches at the head (or, after an
    edit, a few messages below it): the active chains are read from the head down, until
    one is found.
    """
    if not probe:
        return 0, 0
    positions = {chain: index for index, chain in enumerate(probe)}
    cursor = conn.execute(ACTIVE_CHAINS, (sid,))
    try:
        for seq, chain in cursor:
            index = positions.get(chain)
            if index is not None:
                return index + 1, seq
    finally:
        cursor.close()  # stops the read before the snapshot's COMMIT
    return 0, 0


def append(
    conn: sqlite3.Connection, ids: Ids, write: TurnWrite, now: float, prompts: SystemPrompts
) -> AppendResult:
    """``Store.append_turn`` in one write transaction. A prompt it stores is cached once
    the transaction committed: a rolled back write is never served."""
    written: list[WrittenPrompt] = []
    try:
        with Transaction(conn):
            result = _append_rows(conn, ids, write, now, prompts, written)
    except BaseException:
        prompts.forget({ids})  # a prompt read back within the transaction may be cached
        raise
    for prompt in written:
        prompts.committed(*prompt)
    return result


def _append_rows(
    conn: sqlite3.Connection,
    ids: Ids,
    write: TurnWrite,
    now: float,
    prompts: SystemPrompts,
    written: list[WrittenPrompt],
) -> AppendResult:
    stored = read_session(conn, ids)
    if stored is None:
        meta, revision = SessionMeta(created_at=now, version=first_version(now)), 0
        [(sid,)] = conn.execute(INSERT_SESSION, (*ids, now)).fetchall()
        previous_activity = None
    else:
        meta, revision, sid = stored
        previous_activity = activity(meta.updated_at)
    applied = _claim(conn, sid, write, meta.head_seq + 1)
    if applied is not None:
        if revision:
            meta.system_prompt = prompts.read(conn, ids, revision)
        return AppendResult(seqs=list(range(applied, applied + len(write.messages))),
                            superseded=0, meta=meta)  # fmt: skip
    meta.version += 1
    superseded = 0
    if write.supersede_after is not None:
        superseded = _supersede(conn, sid, meta, write.supersede_after, write.supersede_until)
    rows = []
    chain = meta.head_chain
    for seq, message in enumerate(write.messages, start=meta.head_seq + 1):
        chain = chain_hash(chain, message.fingerprint)
        tool_call_id = message.tool_call_id if message.role == "tool" else None
        if message.role == "user":
            meta.last_user_seq = seq
        rows.append(
            (sid, seq, message.role, chain, tool_call_id,
             message.compressed_content or None, encode_message(message, now).decode())
        )  # fmt: skip
    conn.executemany(INSERT_MESSAGE, rows)
    if write.compressed:
        conn.executemany(
            "UPDATE messages SET compressed = ? WHERE sid = ? AND seq = ?",
            [(stub or None, sid, seq) for seq, stub in write.compressed.items()],
        )
    first = meta.head_seq + 1
    sqlite_responses.record(conn, sid, write, first, now)
    meta.head_seq += len(rows)
    meta.active_count += len(rows)
    meta.head_chain = chain
    meta.updated_at = now
    for name in ("system_tokens", "model", "calibration"):
        value = getattr(write, name)
        if value is not None:
            setattr(meta, name, value)
    # a new prompt (or one still inline in the meta) gets its own row; an unchanged one
    # is neither written nor read
    prompt = write.system_prompt if write.system_prompt is not None else meta.system_prompt
    new_prompt = None
    if prompt is not None and (write.system_prompt is not None or not revision):
        revision = meta.version
        new_prompt = prompt
        written.append((ids, revision, prompt, prompts.write(conn, ids, revision, prompt)))
    encoded, active = encode_meta(meta, revision), activity(now)
    if active == previous_activity:
        conn.execute(UPDATE_SESSION, (encoded, now, meta.active_count, sid))
    else:
        conn.execute(UPDATE_ACTIVE_SESSION, (encoded, now, meta.active_count, active, sid))
    if new_prompt is not None:
        meta.system_prompt = new_prompt
    elif revision:
        meta.system_prompt = prompts.read(conn, ids, revision)
    return AppendResult(
        seqs=list(range(first, first + len(rows))), superseded=superseded, meta=meta
    )


def _claim(conn: sqlite3.Connection, sid: int, write: TurnWrite, first: int) -> int | None:
    """Record ``write``'s id with its first seq, in its transaction; the first seq of the
    write of that id applied before instead, when there was one (then nothing is
    recorded)."""
    if not write.write_id:
        return None
    cursor = conn.execute(
        "INSERT OR IGNORE INTO turn_writes (sid, write_id, first_seq) VALUES (?, ?, ?)",
        (sid, write.write_id, first),
    )
    if cursor.rowcount:
        written_at = int(cursor.lastrowid or 0)
        if written_at % PRUNE_WRITES == 0:
            conn.execute("DELETE FROM turn_writes WHERE rowid <= ?", (written_at - KEPT_WRITES,))
        return None
    row = conn.execute(
        "SELECT first_seq FROM turn_writes WHERE sid = ? AND write_id = ?", (sid, write.write_id)
    ).fetchone()
    return int(row[0])


def _supersede(
    conn: sqlite3.Connection, sid: int, meta: SessionMeta, after: int, until: int | None
) -> int:
    superseded = conn.execute(
        "UPDATE messages SET superseded = 1 WHERE sid = ? AND superseded = 0"
        " AND seq > ? AND seq <= ?",
        (sid, after, meta.head_seq if until is None else until),
    ).rowcount
    if superseded:
        meta.active_count -= superseded
        # new messages chain from the last message still active
        last = conn.execute(
            "SELECT chain FROM messages WHERE sid = ? AND superseded = 0 ORDER BY seq DESC"
            " LIMIT 1",
            (sid,),
        ).fetchone()
        meta.head_chain = last[0] if last else ""
        user = conn.execute(
            "SELECT seq FROM messages WHERE sid = ? AND superseded = 0 AND role = 'user'"
            " ORDER BY seq DESC LIMIT 1",
            (sid,),
        ).fetchone()
        meta.last_user_seq = user[0] if user else 0
    return superseded


def get_messages(conn: sqlite3.Connection, ids: Ids, seqs: Sequence[int]) -> list[StoredMessage]:
    rows = conn.execute(
        f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE {SESSION}"
        " AND seq IN (SELECT value FROM json_each(?))",
        (*ids, orjson.dumps(list(seqs)).decode()),
    ).fetchall()
    found = {row[0]: row for row in rows}
    return [decode_message(found[seq]) for seq in seqs if seq in found]


def get_range(
    conn: sqlite3.Connection, ids: Ids, from_seq: int, to_seq: int, budget: RangeBudget | None
) -> list[StoredMessage]:
    if budget is None:
        rows = conn.execute(
            f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE {SESSION} AND superseded = 0"
            " AND seq >= ? AND seq <= ? ORDER BY seq",
            (*ids, from_seq, to_seq),
        )
        return decode_rows(rows)
    # newest first, row by row: the rows below the budget are never stepped to
    cursor = conn.execute(
        f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE {SESSION} AND superseded = 0"
        " AND seq >= ? AND seq <= ? ORDER BY seq DESC",
        (*ids, from_seq, to_seq),
    )
    try:
        return budget.take(
            message_from_body(orjson.loads(data), seq, chain, compressed)
            for seq, chain, compressed, data in cursor
        )
    finally:
        cursor.close()  # ends the statement's read


def find_tool_result(
    conn: sqlite3.Connection, ids: Ids, tool_call_id: str
) -> StoredMessage | None:
    row = conn.execute(
        f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE {SESSION} AND tool_call_id = ?"
        " ORDER BY superseded, seq DESC LIMIT 1",
        (*ids, tool_call_id),
    ).fetchone()
    return None if row is None else decode_message(row)


def read_log(conn: sqlite3.Connection, ids: Ids, after: int, limit: int) -> LogPage:
    with Snapshot(conn):
        stored = read_session(conn, ids)
        if stored is None:
            return LogPage([])
        return sqlite_search.read_log(conn, stored[2], after, max(1, limit))


def search(
    conn: sqlite3.Connection, ids: Ids, words: Sequence[str], exclude: Sequence[int], limit: int
) -> list[StoredMessage]:
    """The session's index brought up to date (``sqlite_search``), then searched."""
    with Transaction(conn):
        stored = read_session(conn, ids)
        if stored is None:
            return []
        sqlite_search.catch_up(conn, stored[2])
    return sqlite_search.search(conn, stored[2], words, exclude, limit)


def set_compressed(conn: sqlite3.Connection, ids: Ids, stubs: dict[int, str | None]) -> None:
    with Transaction(conn):
        conn.executemany(
            f"UPDATE messages SET compressed = ? WHERE {SESSION} AND seq = ?",
            [(stub or None, *ids, seq) for seq, stub in stubs.items()],
        )
        stored = read_session(conn, ids)
        if stored is not None:
            meta, revision, _ = stored
            meta.version += 1
            _write_meta(conn, ids, meta, revision)


def add_summary(
    conn: sqlite3.Connection, ids: Ids, summary: SummaryRecord, expect_boundary: int | None
) -> SummaryRecord | None:
    with Transaction(conn):
        stored = read_session(conn, ids)
        if stored is None or expect_boundary not in (None, stored[0].boundary_seq):
            return None
        meta, revision, _ = stored
        (last_id,) = conn.execute(
            f"SELECT COALESCE(MAX(id), 0) FROM summaries WHERE {KEY}", ids
        ).fetchone()
        record = SummaryRecord.from_dict(
            summary.to_dict() | {"id": last_id + 1, "created_at": summary.created_at or time.time()}
        )
        conn.execute(
            "INSERT INTO summaries (namespace, agent, session, id, data) VALUES (?, ?, ?, ?, ?)",
            (*ids, record.id, orjson.dumps(record.to_dict()).decode()),
        )
        if record.kind == "compaction":
            meta.boundary_seq = record.to_seq
        meta.version += 1
        _write_meta(conn, ids, meta, revision)
    return record


def set_calibration(conn: sqlite3.Connection, ids: Ids, value: float) -> None:
    with Transaction(conn):
        stored = read_session(conn, ids)
        if stored is not None:
            meta, revision, _ = stored
            meta.calibration = float(value)
            _write_meta(conn, ids, meta, revision)


def read_session(conn: sqlite3.Connection, ids: Ids) -> Stored | None:
    """The session's meta (its system prompt not read), the prompt's revision, and the
    session's number."""
    row = conn.execute(READ_SESSION, ids).fetchone()
    return None if row is None else (*decode_meta(row[0]), row[1])


def _write_meta(conn: sqlite3.Connection, ids: Ids, meta: SessionMeta, revision: int) -> None:
    conn.execute(f"UPDATE sessions SET meta = ? WHERE {KEY}", (encode_meta(meta, revision), *ids))


def encode_meta(meta: SessionMeta, revision: int) -> str:
    """The meta JSON. With a ``revision`` the system prompt is in ``system_prompts`` and
    the meta names it; without, any prompt stays inline (as a row written before)."""
    if not revision:
        return orjson.dumps(meta).decode()  # a dataclass: the object of its fields, in order
    prompt, meta.system_prompt = meta.system_prompt, None
    try:
        text = orjson.dumps(meta)
    finally:
        meta.system_prompt = prompt
    return text[:-1].decode() + f',"system_revision":{revision}}}'


def decode_meta(text: str) -> tuple[SessionMeta, int]:
    """The meta as ``encode_meta`` wrote it (fields of earlier versions ignored), and its
    system prompt's revision: 0 when the prompt, if any, is inline (written before prompts
    had their own table)."""
    data = orjson.loads(text)
    revision = data.pop("system_revision", 0)
    try:
        meta = SessionMeta(**data)  # as encode_meta wrote it: a third of from_dict's cost
    except TypeError:  # written by a version with fields this one no longer has
        meta = SessionMeta.from_dict(data)
    return meta, revision


def _with_prompt(
    conn: sqlite3.Connection, ids: Ids, decoded: tuple[SessionMeta, int], prompts: SystemPrompts
) -> SessionMeta:
    meta, revision = decoded
    if revision:
        meta.system_prompt = prompts.read(conn, ids, revision)
    return meta


def decode_message(row: Row) -> StoredMessage:
    seq, chain, compressed, data = row
    return message_from_body(orjson.loads(data), seq, chain, compressed)


def decode_rows(rows: Iterable[Row]) -> list[StoredMessage]:
    """``decode_message`` of each row, in one loop (a load decodes hundreds)."""
    loads = orjson.loads
    return [
        message_from_body(loads(data), seq, chain, compressed)
        for seq, chain, compressed, data in rows
    ]
