"""The SQLite store's full-text index of messages and its whole-log reads.

``messages_fts`` is a contentless FTS5 table (the text lives only in ``messages``): one
row per stored message, its rowid the session's number and the seq in one integer
(``sid << 32 | seq``), its text ``storage.search.searchable_text``.

The index is brought up to date by the search, not by the append: ``fts_indexed`` holds
each session's indexed seqs (every seq up to it), and a search first indexes the
session's messages after it, on the store's thread, in one transaction. Indexing on
append tripled the CPU of a turn's write (store_micro: 218 against 82 us) and put the
index's pages in every commit, for a tool most agents never call. A database from before
the index needs no migration beyond the two tables: its sessions are indexed by their
first search. A session's rows are removed with it (a contentless table deletes a row
given its text, recomputed from the message). Superseded messages stay indexed; the
search leaves them out.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Sequence
from typing import Any

import orjson

from storage.codec import message_from_body
from storage.search import searchable_text
from strategies.records import LogPage, StoredMessage

SCHEMA = """
CREATE VIRTUAL TABLE IF NOT EXISTS messages_fts USING fts5(
    text, content='', tokenize='unicode61 remove_diacritics 0'
);
CREATE TABLE IF NOT EXISTS fts_indexed (sid INTEGER PRIMARY KEY, seq INTEGER NOT NULL);
"""
INSERT = "INSERT INTO messages_fts (rowid, text) VALUES (?, ?)"
DELETE = "INSERT INTO messages_fts (messages_fts, rowid, text) VALUES ('delete', ?, ?)"
SEQ_BITS = 32
SEQ_MASK = (1 << SEQ_BITS) - 1
# The best matches of a session among its active messages, the excluded seqs left out;
# bm25's rank, newest first among equals.
SEARCH = (
    "SELECT m.seq, m.chain, m.compressed, m.data FROM messages_fts f"
    f" JOIN messages m ON m.sid = ? AND m.seq = (f.rowid & {SEQ_MASK})"
    " WHERE messages_fts MATCH ? AND f.rowid BETWEEN ? AND ? AND m.superseded = 0"
    " AND m.seq NOT IN (SELECT value FROM json_each(?))"
    " ORDER BY f.rank, m.seq DESC LIMIT ?"
)
LOG = (
    "SELECT seq, chain, compressed, data, superseded FROM messages"
    " WHERE sid = ? AND seq > ? ORDER BY seq LIMIT ?"
)


def rowid(sid: int, seq: int) -> int:
    return (sid << SEQ_BITS) | seq


def _indexed_through(conn: sqlite3.Connection, sid: int) -> int:
    row = conn.execute("SELECT seq FROM fts_indexed WHERE sid = ?", (sid,)).fetchone()
    return int(row[0]) if row else 0


def _entries(rows: Iterable[tuple[int, str]], sid: int) -> Iterable[tuple[int, str]]:
    for seq, data in rows:
        message = message_from_body(orjson.loads(data), seq, "", None)
        yield rowid(sid, seq), searchable_text(message)


def catch_up(conn: sqlite3.Connection, sid: int) -> None:
    """Index the session's messages stored since its last search (in the caller's
    transaction)."""
    through = _indexed_through(conn, sid)
    rows = conn.execute(
        "SELECT seq, data FROM messages WHERE sid = ? AND seq > ? ORDER BY seq", (sid, through)
    ).fetchall()
    if not rows:
        return
    conn.executemany(INSERT, _entries(rows, sid))
    conn.execute(
        "INSERT OR REPLACE INTO fts_indexed (sid, seq) VALUES (?, ?)", (sid, rows[-1][0])
    )


def unindex(conn: sqlite3.Connection, sid: int) -> None:
    """Remove a session's rows (before its messages are deleted, in the same transaction)."""
    rows = conn.execute(
        "SELECT seq, data FROM messages WHERE sid = ? AND seq <= ?",
        (sid, _indexed_through(conn, sid)),
    ).fetchall()
    conn.executemany(DELETE, _entries(rows, sid))
    conn.execute("DELETE FROM fts_indexed WHERE sid = ?", (sid,))


def search(
    conn: sqlite3.Connection,
    sid: int,
    words: Sequence[str],
    exclude: Sequence[int],
    limit: int,
) -> list[StoredMessage]:
    match = " OR ".join(f'"{word}"' for word in words)
    rows = conn.execute(
        SEARCH,
        (sid, match, rowid(sid, 0), rowid(sid, SEQ_MASK),
         orjson.dumps(list(exclude)).decode(), limit),
    ).fetchall()  # fmt: skip
    return [message_from_body(orjson.loads(data), seq, chain, stub)
            for seq, chain, stub, data in rows]  # fmt: skip


def read_log(conn: sqlite3.Connection, sid: int, after: int, limit: int) -> LogPage:
    rows: list[Any] = conn.execute(LOG, (sid, after, limit + 1)).fetchall()
    more = len(rows) > limit
    rows = rows[:limit]
    messages = [message_from_body(orjson.loads(data), seq, chain, stub)
                for seq, chain, stub, data, _ in rows]  # fmt: skip
    return LogPage(
        messages=messages,
        superseded={row[0] for row in rows if row[4]},
        next_after=messages[-1].seq if more and messages else None,
    )
