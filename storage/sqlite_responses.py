"""The SQLite store's Responses API response ids: each names the turn write that made it
(its first seq and its reply's), written in that append's transaction, removed with the
session."""

from __future__ import annotations

import sqlite3

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


def find(conn: sqlite3.Connection, sid: int, response_id: str) -> ResponseRef | None:
    row = conn.execute(
        "SELECT first_seq, seq, created_at FROM responses WHERE sid = ? AND response_id = ?",
        (sid, response_id),
    ).fetchone()
    return ResponseRef(response_id, row[0], row[1], row[2]) if row else None


def forget(conn: sqlite3.Connection, sid: int, response_id: str) -> bool:
    cursor = conn.execute(
        "DELETE FROM responses WHERE sid = ? AND response_id = ?", (sid, response_id)
    )
    return cursor.rowcount > 0


def delete_session(conn: sqlite3.Connection, sid: int) -> None:
    conn.execute("DELETE FROM responses WHERE sid = ?", (sid,))
