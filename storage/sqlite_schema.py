"""The SQLite store's schema, its migrations and its connection.

A database made by any earlier version opens and is brought to the current shape on
open, in one transaction per step (each step checks again inside its transaction: two
processes opening one old file at once both serve it).
"""

from __future__ import annotations

import sqlite3
import time

from storage import sqlite_prompts, sqlite_search
from storage.base import StoreUnavailable

KEY = "namespace = ? AND agent = ? AND session = ?"
# A session's messages are keyed by its number (``sessions.id``), not by its three names:
# each entry of the index every append inserts into is a few bytes instead of the names
# (tens of bytes), so more fit a page and they compare as integers. A statement that
# knows only the names looks the number up first, in the same statement.
SESSION = f"sid = (SELECT id FROM sessions WHERE {KEY})"

SESSIONS_TABLE = """(
    id INTEGER PRIMARY KEY,
    namespace TEXT NOT NULL, agent TEXT NOT NULL, session TEXT NOT NULL,
    meta TEXT NOT NULL, updated_at REAL NOT NULL, message_count INTEGER NOT NULL,
    active_at INTEGER,
    UNIQUE (namespace, agent, session)
)"""
MESSAGES_TABLE = """(
    sid INTEGER NOT NULL, seq INTEGER NOT NULL, superseded INTEGER NOT NULL DEFAULT 0,
    role TEXT NOT NULL, chain TEXT NOT NULL, tool_call_id TEXT,
    compressed TEXT, data TEXT NOT NULL,
    PRIMARY KEY (sid, seq)
)"""
# The tables a session has rows in besides its messages (few rows, rarely written) keep
# its names as their key.
TABLES = f"""
CREATE TABLE IF NOT EXISTS sessions {SESSIONS_TABLE};
CREATE TABLE IF NOT EXISTS messages {MESSAGES_TABLE};
CREATE TABLE IF NOT EXISTS summaries (
    namespace TEXT NOT NULL, agent TEXT NOT NULL, session TEXT NOT NULL,
    id INTEGER NOT NULL, data TEXT NOT NULL,
    PRIMARY KEY (namespace, agent, session, id)
);
CREATE TABLE IF NOT EXISTS agent_configs (
    agent TEXT PRIMARY KEY, config TEXT NOT NULL, updated_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS locks (
    namespace TEXT NOT NULL, agent TEXT NOT NULL, session TEXT NOT NULL,
    name TEXT NOT NULL, token TEXT NOT NULL, expires_at REAL NOT NULL,
    PRIMARY KEY (namespace, agent, session, name)
);
CREATE TABLE IF NOT EXISTS session_parts (
    namespace TEXT NOT NULL, agent TEXT NOT NULL, session TEXT NOT NULL,
    digest TEXT NOT NULL, media_type TEXT NOT NULL, data BLOB NOT NULL,
    PRIMARY KEY (namespace, agent, session, digest)
);
CREATE TABLE IF NOT EXISTS turn_writes (
    sid INTEGER NOT NULL, write_id TEXT NOT NULL, first_seq INTEGER NOT NULL
);
CREATE UNIQUE INDEX IF NOT EXISTS turn_writes_by_id ON turn_writes (sid, write_id);
"""
# Sessions are listed newest first by the minute of their last turn (indexed), then by the
# exact time within it: the same order as by the time alone, while most turns land in the
# minute of the one before and leave the index alone.
ACTIVITY_SECONDS = 60
# Made once the tables have their current columns (``_number_sessions``). The primary key
# serves the tail reads (superseded rows are few and skipped) and the match of a resent
# history (``sqlite_turns.match_probe`` reads the tail): an index on chains would cost
# every append a b-tree more.
INDEXES = """
CREATE INDEX IF NOT EXISTS sessions_by_activity ON sessions (agent, active_at);
CREATE INDEX IF NOT EXISTS sessions_by_name ON sessions (agent, session);
DROP INDEX IF EXISTS sessions_by_agent;
DROP INDEX IF EXISTS messages_active;
DROP INDEX IF EXISTS messages_chain;
CREATE INDEX IF NOT EXISTS messages_tool
    ON messages (sid, tool_call_id) WHERE tool_call_id IS NOT NULL;
"""
# how long a statement waits for a write lock held by another process (then the call
# fails with StoreUnavailable)
BUSY_TIMEOUT_MS = 5000
# tries at changing into WAL mode, spread over the busy timeout
WAL_ATTEMPTS = 100
# the write-ahead log is cut back to this after a checkpoint (it never shrinks otherwise)
JOURNAL_SIZE_LIMIT = 32 << 20


def database_path(url: str) -> str:
    """``sqlite:///relative.db``, ``sqlite:////absolute.db`` (SQLAlchemy's convention)."""
    scheme, sep, path = url.partition(":///")
    if scheme.lower() != "sqlite" or not sep or not path:
        raise ValueError(f"not a sqlite URL: {url!r}; use sqlite:///path/to/file.db")
    return path


def connect(path: str) -> sqlite3.Connection:
    """The store's connection, the schema made and migrated.

    WAL with ``synchronous = NORMAL``: a commit is in the log (the OS page cache) when the
    call returns, so an acknowledged turn survives kill -9 of the proxy; only an OS crash
    or power loss can drop the last commits, and the file stays consistent. The log is
    copied back into the database by the store's checkpointer
    (``storage/sqlite_checkpoint.py``), never on the event loop."""
    # autocommit mode: transactions are opened explicitly by Transaction
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        # first: another process opening (or migrating) the file is waited for
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        _into_wal(conn)
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute(f"PRAGMA journal_size_limit = {JOURNAL_SIZE_LIMIT}")
        # (imported here: sqlite_responses builds on this module)
        from storage.sqlite_responses import SCHEMA as RESPONSES_SCHEMA

        conn.executescript(
            TABLES + sqlite_prompts.SCHEMA + sqlite_search.SCHEMA + RESPONSES_SCHEMA
        )
        _add_activity(conn)
        _number_sessions(conn)
        _scope_parts(conn)
        conn.executescript(INDEXES)
    except BaseException:
        conn.close()
        raise
    return conn


def _into_wal(conn: sqlite3.Connection) -> None:
    """WAL mode. Changing into it takes the file for itself, and SQLite answers "locked"
    at once, without waiting, while another connection opening a file still in the
    rollback journal holds it (two stores migrating an old file at once): so it is tried
    again, up to the busy timeout."""
    for attempt in range(WAL_ATTEMPTS):
        try:
            conn.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or attempt == WAL_ATTEMPTS - 1:
                raise
            time.sleep(BUSY_TIMEOUT_MS / 1000 / WAL_ATTEMPTS)


class Transaction:
    """One write transaction: committed, or rolled back when the block raises."""

    __slots__ = ("conn",)

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def __enter__(self) -> None:
        # IMMEDIATE takes the write lock up front: another process on the same file waits
        # (busy_timeout) instead of failing halfway through an upgrade from read to write
        self.conn.execute("BEGIN IMMEDIATE")

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        self.conn.execute("COMMIT" if kind is None else "ROLLBACK")


class Snapshot:
    """One read transaction: every statement in it sees the same database."""

    __slots__ = ("conn",)

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def __enter__(self) -> None:
        self.conn.execute("BEGIN")

    def __exit__(self, *_: object) -> None:
        self.conn.execute("COMMIT")


def activity(when: float) -> int:
    """The minute of activity a session last active at ``when`` is listed under."""
    return int(when // ACTIVITY_SECONDS)


def _columns(conn: sqlite3.Connection, table: str) -> set[str]:
    return {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}


def _add_activity(conn: sqlite3.Connection) -> None:
    """A database from before ``active_at`` gets the column, filled from ``updated_at``
    by ``activity`` itself (SQLite's own arithmetic could round a minute differently)."""
    if "active_at" in _columns(conn, "sessions"):
        return
    conn.create_function("activity", 1, activity, deterministic=True)
    with Transaction(conn):
        if "active_at" not in _columns(conn, "sessions"):
            conn.execute("ALTER TABLE sessions ADD COLUMN active_at INTEGER")
            conn.execute("UPDATE sessions SET active_at = activity(updated_at)")


def _number_sessions(conn: sqlite3.Connection) -> None:
    """A database from before sessions had numbers: ``sessions`` and ``messages`` are
    copied into tables of the current shape (each session numbered, each message keyed by
    its session's number) in one transaction, and take the old tables' places. A message
    without its session's row (which no version writes) stops the migration, with nothing
    changed, rather than be left behind."""
    if "id" in _columns(conn, "sessions"):
        return
    with Transaction(conn):
        if "id" in _columns(conn, "sessions"):
            return
        conn.execute(f"CREATE TABLE numbered_sessions {SESSIONS_TABLE}")
        conn.execute(
            "INSERT INTO numbered_sessions (namespace, agent, session, meta, updated_at,"
            " message_count, active_at) SELECT namespace, agent, session, meta, updated_at,"
            " message_count, active_at FROM sessions ORDER BY rowid"
        )
        conn.execute("DROP TABLE sessions")
        conn.execute("ALTER TABLE numbered_sessions RENAME TO sessions")
        if "sid" in _columns(conn, "messages"):  # made just now, empty, by TABLES
            return
        conn.execute(f"CREATE TABLE numbered_messages {MESSAGES_TABLE}")
        copied = conn.execute(
            "INSERT INTO numbered_messages (sid, seq, superseded, role, chain, tool_call_id,"
            " compressed, data) SELECT sessions.id, seq, superseded, role, chain,"
            " tool_call_id, compressed, data FROM messages JOIN sessions"
            " USING (namespace, agent, session) ORDER BY sessions.id, seq"
        ).rowcount
        (stored,) = conn.execute("SELECT COUNT(*) FROM messages").fetchone()
        if copied != stored:
            raise StoreUnavailable(
                f"sqlite database: {stored - copied} of {stored} messages have no session"
                " row; the store was not migrated to numbered sessions"
            )
        conn.execute("DROP TABLE messages")
        conn.execute("ALTER TABLE numbered_messages RENAME TO messages")


def _scope_parts(conn: sqlite3.Connection) -> None:
    """A database from before parts belonged to their sessions: each part of the shared
    ``parts`` table is copied to every session whose messages refer to it, in one
    transaction; parts no message refers to are dropped with the old table."""
    old = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'parts'"
    if conn.execute(old).fetchone() is None:
        return
    with Transaction(conn):
        if conn.execute(old).fetchone() is None:
            return
        conn.execute(
            "INSERT OR IGNORE INTO session_parts (namespace, agent, session, digest,"
            " media_type, data) SELECT s.namespace, s.agent, s.session, p.digest,"
            " p.media_type, p.data FROM messages m JOIN sessions s ON s.id = m.sid"
            " JOIN json_each(m.data, '$.meta.parts') j"
            " JOIN parts p ON p.digest = json_extract(j.value, '$.digest')"
        )
        conn.execute("DROP TABLE parts")
