"""The SQLite store's Responses API response ids: each names the turn write that made it
(its first seq and its reply's), written in that append's transaction
(``sqlite_turns``), removed with the session (``sqlite_sessions.delete_session``)."""

from __future__ import annotations

import sqlite3

from storage.sqlite_prompts import Ids
from storage.sqlite_schema import SESSION, Transaction
from strategies.records import ResponseRef, TurnWrite

__all__ = ["SCHEMA", "delete_session", "find", "forget", "record"]

SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    sid INTEGER NOT NULL,
    response_id TEXT NOT NULL,
    first_seq INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    created_at REAL NOT NULL,
    PRIMARY KEY (sid, response_id)
) WITHOUT ROWID;
"""


def record(conn: sqlite3.Connection, sid: int, write: TurnWrite, first: int, now: float) -> None:
    """Within the append's transaction, after its ``write.messages`` got seqs from
    ``first``."""
    if write.response_id and write.messages:
        conn.execute(
            "INSERT OR REPLACE INTO responses (sid, response_id, first_seq, seq, created_at)"
            " VALUES (?, ?, ?, ?, ?)",
            (sid, write.response_id, first, first + len(write.messages) - 1, now),
        )


def find(conn: sqlite3.Connection, ids: Ids, response_id: str) -> ResponseRef | None:
    row = conn.execute(
        f"SELECT first_seq, seq, created_at FROM responses WHERE {SESSION}"
        " AND response_id = ?",
        (*ids, response_id),
    ).fetchone()
    return ResponseRef(response_id, row[0], row[1], row[2]) if row else None


def forget(conn: sqlite3.Connection, ids: Ids, response_id: str) -> bool:
    with Transaction(conn):
        cursor = conn.execute(
            f"DELETE FROM responses WHERE {SESSION} AND response_id = ?", (*ids, response_id)
        )
    return cursor.rowcount > 0


def delete_session(conn: sqlite3.Connection, ids: Ids) -> None:
    """Within ``sqlite_sessions.delete_session``'s transaction, before the session's row."""
    conn.execute(f"DELETE FROM responses WHERE {SESSION}", ids)
