"""The embedded SQLite store: the default, one proxy process, one database file.

Every public method is one job and one transaction, except appends made while other
turns are under way: those made in one pass of the event loop share a transaction (group
commit, ``append_turn``). Jobs run inline on the event loop's own connection: a turn's
load or append is a few hundred microseconds of page-cache I/O (WAL, ``synchronous =
NORMAL``: a commit never waits for the disk), far less than the hop to a thread and back,
and one loop thread serializes concurrent turns without locks. Whatever may wait goes to
the store's thread and its second connection instead: a job that finds the database
locked by another process (the thread waits ``busy_timeout``, the loop never does) and
the WAL checkpoints, the only step that syncs to disk.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import orjson

from storage import sqlite_prompts, sqlite_responses, sqlite_search
from storage.base import StoreUnavailable
from storage.codec import encode_message, message_from_body
from storage.sqlite_heads import Heads, Stored
from storage.sqlite_prompts import Ids, SystemPrompts
from strategies.records import (
    AgentInfo,
    AppendResult,
    LoadSpec,
    LogPage,
    ResponseRef,
    SessionInfo,
    SessionKey,
    SessionMeta,
    SessionSnapshot,
    StoredMessage,
    SummaryRecord,
    TurnWrite,
    chain_hash,
    first_version,
)

T = TypeVar("T")
AppendJob = tuple[Ids, TurnWrite, float]  # the session, the write, its time
WrittenPrompt = tuple[Ids, int, list[dict[str, Any]], int]  # SystemPrompts.committed's
Row = tuple[Any, ...]
# write transactions between two background checkpoints (a few pages each, ~1000 pages)
CHECKPOINT_EVERY = 256
# Passive checkpoints never hold writers back, so under sustained writes the log is never
# fully copied at a moment without a write, and never starts over; past this many 4 KiB
# frames the checkpoint that copied it restarts it (see ``SqliteStore._settle``).
WAL_RESTART_FRAMES = 4096
# a restart comes after a copy during which at most this many writes were made (a copy
# taken while more were made is followed by another, at most MAX_CATCH_UPS times): what the
# restart copies holds the loop's jobs back
CATCH_UP_WRITES = 16
MAX_CATCH_UPS = 2
# how long a restart waits for another process's transaction before it gives up (the
# loop's jobs wait behind it meanwhile); the next checkpoint tries again
RESTART_WAIT_MS = 100
# a log restarted after it grew past this is cut back to it (it never shrinks otherwise)
JOURNAL_SIZE_LIMIT = 2 * WAL_RESTART_FRAMES * 4096
# the store thread's connection waits this long for a lock held by another process
THREAD_BUSY_TIMEOUT_MS = 5000

KEY = "namespace = ? AND agent = ? AND session = ?"
# A session's messages are keyed by its number (``sessions.id``), not by its three names:
# each entry of the index every append inserts into is a few bytes instead of the names
# (tens of bytes), so more fit a page and they compare as integers. A statement that
# knows only the names looks the number up first, in the same statement.
SESSION = f"sid = (SELECT id FROM sessions WHERE {KEY})"
READ_SESSION = f"SELECT meta, id FROM sessions WHERE {KEY}"

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
SCHEMA = f"""
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
# The ids of the latest turn writes (of every session), to recognise one applied before
# (``TurnWrite.write_id``): a retry comes within seconds, so the oldest are dropped.
KEPT_WRITES = 100_000

# Sessions are listed newest first by the minute of their last turn (indexed), then by the
# exact time within it: the same order as by the time alone, while most turns land in the
# minute of the one before and leave the index alone. An index on the exact time moved
# with every append: two of its six pages, a third of what a checkpoint copies.
ACTIVITY_SECONDS = 60
ACTIVITY_SCHEMA = """
CREATE INDEX IF NOT EXISTS sessions_by_activity ON sessions (agent, active_at);
CREATE INDEX IF NOT EXISTS sessions_by_name ON sessions (agent, session);
DROP INDEX IF EXISTS sessions_by_agent;
"""
# Made once the tables have their current columns (``_number_sessions``). The primary key
# serves the tail reads (superseded rows are few and skipped); an index on the same
# columns would only add a b-tree to every insert (25% of an append). A resent history is
# matched by reading the tail too (_match_probe): an index on chains would cost every
# append another 25%.
INDEX_SCHEMA = """
DROP INDEX IF EXISTS messages_active;
DROP INDEX IF EXISTS messages_chain;
CREATE INDEX IF NOT EXISTS messages_tool
    ON messages (sid, tool_call_id) WHERE tool_call_id IS NOT NULL;
"""

MESSAGE_COLUMNS = "seq, chain, compressed, data"
INSERT_MESSAGE = (
    "INSERT INTO messages (sid, seq, role, chain, tool_call_id, compressed, data)"
    " VALUES (?, ?, ?, ?, ?, ?, ?)"
)
# An append knows whether its session exists (it read the meta): no upsert needed. A new
# session's row is made first, for its number, and written in full with the others.
INSERT_SESSION = (
    "INSERT INTO sessions (namespace, agent, session, meta, updated_at, message_count)"
    " VALUES (?, ?, ?, '{}', ?, 0) RETURNING id"
)
UPDATE_SESSION = "UPDATE sessions SET meta = ?, updated_at = ?, message_count = ? WHERE id = ?"
# the same, in a new minute of activity
UPDATE_ACTIVE_SESSION = (
    "UPDATE sessions SET meta = ?, updated_at = ?, message_count = ?, active_at = ?"
    " WHERE id = ?"
)
# The agent's stored config, the session's meta and its number, in one statement (one
# row, the session's columns NULL when it is not stored)
LOAD_HEAD = (
    "SELECT (SELECT config FROM agent_configs WHERE agent = ?), sessions.meta, sessions.id"
    " FROM (SELECT 1) LEFT JOIN sessions ON sessions.namespace = ?"
    " AND sessions.agent = ? AND sessions.session = ?"
)
# The active chains, newest first (the primary key, backwards)
ACTIVE_CHAINS = "SELECT seq, chain FROM messages WHERE sid = ? AND superseded = 0 ORDER BY seq DESC"


def database_path(url: str) -> str:
    """``sqlite:///relative.db``, ``sqlite:////absolute.db`` (SQLAlchemy's convention)."""
    scheme, sep, path = url.partition(":///")
    if scheme.lower() != "sqlite" or not sep or not path:
        raise ValueError(f"not a sqlite URL: {url!r}; use sqlite:///path/to/file.db")
    return path


class SqliteStore:
    """Store backend on an SQLite file (``sqlite:///path/to/file.db``)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.path = database_path(url)
        self._executor: ThreadPoolExecutor | None = None
        self._conn: sqlite3.Connection | None = None  # the event loop's
        self._thread_conn: sqlite3.Connection | None = None  # the store thread's
        self._queued = 0  # jobs sent to the thread and not finished: later ones follow them
        self._writes = 0  # write transactions since the last checkpoint was started
        # the checkpoint step running on the store's thread, if any ("copy" or "restart")
        self._step: tuple[Future[Any], str] | None = None
        self._catch_ups = 0  # copies since the one that found the log long
        self._prompts = SystemPrompts()
        self._heads = Heads(None)  # the loop connection's, once open
        # appends waiting for the end of the loop's pass, to be written in one transaction
        self._appends: list[tuple[AppendJob, asyncio.Future[AppendResult]]] = []

    async def open(self) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite-store")
        try:
            await self._on_thread(self._connect)
            if self.path == ":memory:":  # a second connection would be another database
                self._conn = self._thread_conn
            else:
                self._conn = _open_connection(self.path, busy_timeout_ms=0, checkpoints=False)
                self._heads = Heads(self._conn)
        except BaseException:
            await self._on_thread(self._disconnect)
            self._executor.shutdown(wait=False)
            self._executor = None
            raise

    async def close(self) -> None:
        if self._executor is None:
            return
        self._write_appends()
        conn, self._conn = self._conn, None
        if conn is not None and conn is not self._thread_conn:
            conn.close()
        await self._on_thread(self._disconnect)
        self._executor.shutdown(wait=True)
        self._executor = None

    async def ping(self) -> bool:
        try:
            return await self._submit(lambda conn: conn.execute("SELECT 1").fetchone() == (1,))
        except StoreUnavailable:
            return False

    async def load(
        self,
        key: SessionKey,
        spec: LoadSpec,
        *,
        probe: Sequence[str] = (),
        known_version: int | None = None,
        known_head: int | None = None,
    ) -> SessionSnapshot:
        ids = _ids(key)
        if any(job[0] == ids for job, _ in self._appends):
            self._write_appends()  # a session's jobs keep their order
        return await self._run(
            _load, ids, spec, list(probe), known_version, known_head, self._prompts, self._heads
        )

    async def append_turn(
        self, key: SessionKey, write: TurnWrite, *, with_others: bool = False
    ) -> AppendResult:
        """Group commit: an append made while other turns are under way (``with_others``)
        waits for the end of the event loop's pass, and is written with the others made
        in it, in one transaction (``_write_appends``). Turns that end together end in the
        same pass; they share a commit, and the pages they all change (the messages
        table's last leaf above all) are written once. An append made alone is written at
        once: a pass's wait would only add to its latency."""
        if self._conn is None:
            raise StoreUnavailable(f"sqlite database {self.path} is not open")
        if _large(write):
            # megabytes to encode and write: on the store's thread, the loop serves on
            # (in order: jobs after it follow it there)
            if self._appends:
                self._write_appends()
            args = (_ids(key), write, time.time(), self._prompts, self._heads)
            return await self._on_thread(lambda: _append(self._thread_connection(), *args))
        if not self._appends:
            if not with_others:
                return await self._run(
                    _append, _ids(key), write, time.time(), self._prompts, self._heads
                )
            asyncio.get_running_loop().call_soon(self._write_appends)
        future: asyncio.Future[AppendResult] = asyncio.get_running_loop().create_future()
        self._appends.append(((_ids(key), write, time.time()), future))
        return await future

    async def set_compressed(self, key: SessionKey, stubs: dict[int, str | None]) -> None:
        rows = [(stub or None, *_ids(key), seq) for seq, stub in stubs.items()]

        def update(conn: sqlite3.Connection) -> None:
            with _Transaction(conn):
                conn.executemany(
                    f"UPDATE messages SET compressed = ? WHERE {SESSION} AND seq = ?", rows
                )
                _bump_version(conn, _ids(key))

        await self._submit(update)

    async def add_summary(
        self, key: SessionKey, summary: SummaryRecord, *, expect_boundary: int | None = None
    ) -> SummaryRecord | None:
        return await self._submit(_add_summary, _ids(key), summary, expect_boundary)

    async def get_messages(self, key: SessionKey, seqs: Sequence[int]) -> list[StoredMessage]:
        def read(conn: sqlite3.Connection) -> list[StoredMessage]:
            rows = conn.execute(
                f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE {SESSION}"
                " AND seq IN (SELECT value FROM json_each(?))",
                (*_ids(key), orjson.dumps(list(seqs)).decode()),
            ).fetchall()
            found = {row[0]: row for row in rows}
            return [_decode_message(found[seq]) for seq in seqs if seq in found]

        return await self._submit(read) if seqs else []

    async def get_range(self, key: SessionKey, from_seq: int, to_seq: int) -> list[StoredMessage]:
        rows = await self._execute(
            f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE {SESSION} AND superseded = 0"
            " AND seq >= ? AND seq <= ? ORDER BY seq",
            (*_ids(key), from_seq, to_seq),
        )
        return [_decode_message(row) for row in rows]

    async def find_tool_result(self, key: SessionKey, tool_call_id: str) -> StoredMessage | None:
        rows = await self._execute(
            f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE {SESSION} AND tool_call_id = ?"
            " ORDER BY superseded, seq DESC LIMIT 1",
            (*_ids(key), tool_call_id),
        )
        return _decode_message(rows[0]) if rows else None

    async def read_log(self, key: SessionKey, *, after: int = 0, limit: int = 100) -> LogPage:
        def read(conn: sqlite3.Connection) -> LogPage:
            stored = _read_session(conn, _ids(key))
            if stored is None:
                return LogPage([])
            return sqlite_search.read_log(conn, stored[2], after, max(1, limit))

        return await self._submit(read)

    async def search_messages(
        self,
        key: SessionKey,
        words: Sequence[str],
        *,
        exclude: Sequence[int] = (),
        limit: int = 5,
    ) -> list[StoredMessage]:
        def search() -> list[StoredMessage]:
            conn = self._thread_connection()
            with _Transaction(conn):
                stored = _read_session(conn, _ids(key))
                if stored is None:
                    return []
                sqlite_search.catch_up(conn, stored[2])
            return sqlite_search.search(conn, stored[2], words, exclude, limit)

        if not words or limit <= 0:
            return []
        if self._appends:
            self._write_appends()
        # on the store's thread: catching up the index of a long session takes a while
        return await self._on_thread(search)

    async def find_response(self, key: SessionKey, response_id: str) -> ResponseRef | None:
        def read(conn: sqlite3.Connection) -> ResponseRef | None:
            stored = _read_session(conn, _ids(key))
            return sqlite_responses.find(conn, stored[2], response_id) if stored else None

        return await self._submit(read)

    async def forget_response(self, key: SessionKey, response_id: str) -> bool:
        def forget(conn: sqlite3.Connection) -> bool:
            with _Transaction(conn):
                stored = _read_session(conn, _ids(key))
                return sqlite_responses.forget(conn, stored[2], response_id) if stored else False

        return await self._submit(forget)

    async def set_calibration(self, key: SessionKey, value: float) -> None:
        def update(conn: sqlite3.Connection) -> None:
            with _Transaction(conn):
                stored = _read_meta(conn, _ids(key))
                if stored is not None:
                    meta, revision = stored
                    meta.calibration = float(value)
                    _write_meta(conn, _ids(key), meta, revision)

        await self._submit(update)

    async def list_agents(self) -> list[AgentInfo]:
        return await self._submit(_list_agents)

    async def list_sessions(self, agent: str, *, limit: int = 200) -> list[SessionInfo]:
        rows = await self._execute(
            "SELECT namespace, agent, session, message_count, updated_at FROM sessions"
            " WHERE agent = ? ORDER BY active_at DESC, updated_at DESC LIMIT ?",
            (agent, max(limit, 0)),
        )
        return [SessionInfo(*row) for row in rows]

    async def find_sessions(self, agent: str, session: str) -> list[SessionInfo]:
        rows = await self._execute(
            "SELECT namespace, agent, session, message_count, updated_at FROM sessions"
            " WHERE agent = ? AND session = ? ORDER BY active_at DESC, updated_at DESC",
            (agent, session),
        )
        return [SessionInfo(*row) for row in rows]

    async def count_sessions(self, namespace: str) -> int:
        rows = await self._execute(
            "SELECT COUNT(*) FROM sessions WHERE namespace = ?", (namespace,)
        )
        return int(rows[0][0])

    async def delete_session(self, key: SessionKey) -> bool:
        def delete(conn: sqlite3.Connection) -> bool:
            with _Transaction(conn):
                # the messages first: they are found by the session's row
                stored = _read_session(conn, _ids(key))
                if stored is not None:
                    sqlite_search.unindex(conn, stored[2])
                    sqlite_responses.delete_session(conn, stored[2])
                conn.execute(f"DELETE FROM messages WHERE {SESSION}", _ids(key))
                conn.execute(f"DELETE FROM turn_writes WHERE {SESSION}", _ids(key))
                for table in ("summaries", "locks", "system_prompts", "session_parts"):
                    conn.execute(f"DELETE FROM {table} WHERE {KEY}", _ids(key))
                existed = conn.execute(f"DELETE FROM sessions WHERE {KEY}", _ids(key)).rowcount
            return existed > 0

        return await self._submit(delete)

    async def get_agent_config(self, agent: str) -> dict[str, Any] | None:
        rows = await self._execute("SELECT config FROM agent_configs WHERE agent = ?", (agent,))
        return orjson.loads(rows[0][0]) if rows else None

    async def set_agent_config(self, agent: str, config: dict[str, Any] | None) -> None:
        if config is None:
            await self._execute("DELETE FROM agent_configs WHERE agent = ?", (agent,))
            return
        await self._execute(
            "INSERT OR REPLACE INTO agent_configs (agent, config, updated_at) VALUES (?, ?, ?)",
            (agent, orjson.dumps(config).decode(), time.time()),
        )

    async def acquire_lock(self, key: SessionKey, name: str, ttl: float) -> str | None:
        return await self._submit(_acquire_lock, _ids(key), name, ttl)

    async def release_lock(self, key: SessionKey, name: str, token: str) -> None:
        await self._execute(
            f"DELETE FROM locks WHERE {KEY} AND name = ? AND token = ?",
            (*_ids(key), name, token),
        )

    async def put_part(self, key: SessionKey, digest: str, data: bytes, media_type: str) -> None:
        await self.put_parts(key, [(digest, data, media_type)])

    async def get_part(self, key: SessionKey, digest: str) -> tuple[bytes, str] | None:
        return (await self.get_parts(key, [digest])).get(digest)

    async def put_parts(self, key: SessionKey, parts: Sequence[tuple[str, bytes, str]]) -> None:
        if not parts:
            return
        ids = _ids(key)
        rows = [(*ids, d, t, data) for d, data, t in parts]
        if sum(len(data) for _, data, _ in parts) < LARGE_WRITE:
            await self._submit(_put_parts, rows)
            return
        if self._appends:
            self._write_appends()
        await self._on_thread(lambda: _put_parts(self._thread_connection(), rows))

    async def get_parts(
        self, key: SessionKey, digests: Sequence[str]
    ) -> dict[str, tuple[bytes, str]]:
        if not digests:
            return {}
        rows = await self._execute(
            f"SELECT digest, data, media_type FROM session_parts WHERE {KEY} AND digest IN"
            " (SELECT value FROM json_each(?))",
            (*_ids(key), orjson.dumps(list(digests)).decode()),
        )
        return {row[0]: (bytes(row[1]), row[2]) for row in rows}

    def _connect(self) -> None:
        """On the store's thread: its connection, and the schema."""
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        conn = _open_connection(
            self.path, busy_timeout_ms=THREAD_BUSY_TIMEOUT_MS, checkpoints=True
        )
        conn.executescript(
            SCHEMA + sqlite_prompts.SCHEMA + sqlite_search.SCHEMA + sqlite_responses.SCHEMA
        )
        _add_activity(conn)
        _number_sessions(conn)
        _scope_parts(conn)
        conn.executescript(ACTIVITY_SCHEMA + INDEX_SCHEMA)
        self._thread_conn = conn

    def _disconnect(self) -> None:
        if self._thread_conn is not None:
            self._thread_conn.close()
            self._thread_conn = None

    def _thread_connection(self) -> sqlite3.Connection:
        if self._thread_conn is None:
            raise StoreUnavailable(f"sqlite database {self.path} is not open")
        return self._thread_conn

    async def _execute(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        """One statement, one (implicit) transaction."""
        return await self._submit(lambda conn: conn.execute(sql, params).fetchall())

    async def _submit(self, job: Callable[..., T], *args: Any) -> T:
        """Run ``job(connection, *args)``: inline on the loop's connection, or on the
        store's thread when the database is locked by another process (or jobs sent there
        before are not done yet: they keep their order). Appends still waiting to be
        written together go first."""
        if self._appends:
            self._write_appends()
        return await self._run(job, *args)

    async def _run(self, job: Callable[..., T], *args: Any) -> T:
        """``_submit`` for a job that leaves waiting appends alone (a load of another
        session need not wait for them, nor break their group up)."""
        conn = self._conn
        if conn is None:
            raise StoreUnavailable(f"sqlite database {self.path} is not open")
        if not self._queued:
            changes = conn.total_changes
            try:
                result = job(conn, *args)
            except sqlite3.OperationalError as exc:
                if not _is_busy(exc):
                    raise StoreUnavailable(f"sqlite database {self.path}: {exc}") from exc
            else:
                if conn.total_changes != changes:
                    self._wrote()
                return result
        return await self._on_thread(lambda: job(self._thread_connection(), *args))

    def _write_appends(self) -> None:
        """The appends waiting, in one transaction: inline, or on the store's thread like
        any job (``_submit``). Each append's caller gets its own result or error."""
        pending, self._appends = self._appends, []
        if not pending:
            return
        jobs = [job for job, _ in pending]
        futures = [future for _, future in pending]
        conn = self._conn
        if conn is None:
            self._not_open(futures)
            return
        if not self._queued:
            try:
                outcomes = _append_group(conn, jobs, self._prompts, self._heads)
            except sqlite3.OperationalError:
                pass  # locked by another process: the store's thread waits for the lock
            else:
                self._wrote(sum(not isinstance(outcome, Exception) for outcome in outcomes))
                locked = []  # met the lock after others in the group committed
                for job, future, outcome in zip(jobs, futures, outcomes, strict=True):
                    if isinstance(outcome, sqlite3.OperationalError) and _is_busy(outcome):
                        locked.append((job, future))
                    else:
                        _deliver(future, self._store_error(outcome))
                if not locked:
                    return
                jobs, futures = [job for job, _ in locked], [future for _, future in locked]
        self._appends_on_thread(jobs, futures)

    def _appends_on_thread(
        self, jobs: list[AppendJob], futures: list[asyncio.Future[AppendResult]]
    ) -> None:
        if self._executor is None:
            self._not_open(futures)
            return
        loop = asyncio.get_running_loop()
        self._queued += 1  # jobs submitted after these follow them

        def write() -> list[AppendResult | Exception]:
            return _append_group(self._thread_connection(), jobs, self._prompts, self._heads)

        def done(result: Future[list[AppendResult | Exception]]) -> None:
            self._queued -= 1
            error = result.exception()
            if error is not None:
                for future in futures:
                    _deliver(future, self._store_error(error))
            else:
                for future, outcome in zip(futures, result.result(), strict=True):
                    _deliver(future, self._store_error(outcome))

        def written(result: Future[list[AppendResult | Exception]]) -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed without closing us
                loop.call_soon_threadsafe(done, result)

        self._executor.submit(write).add_done_callback(written)

    def _not_open(self, futures: list[asyncio.Future[AppendResult]]) -> None:
        for future in futures:
            _deliver(future, StoreUnavailable(f"sqlite database {self.path} is not open"))

    def _store_error(self, outcome: T) -> T | StoreUnavailable:
        """sqlite3's operational errors (a lock, a full disk) as the store's own."""
        if isinstance(outcome, sqlite3.OperationalError):
            return StoreUnavailable(f"sqlite database {self.path}: {outcome}")
        return outcome

    async def _on_thread(self, call: Callable[[], T]) -> T:
        """Run ``call`` on the store's thread; sqlite3 failures become ``StoreUnavailable``."""
        if self._executor is None:
            raise StoreUnavailable(f"sqlite database {self.path} is not open")
        self._queued += 1
        try:
            return await asyncio.wrap_future(self._executor.submit(call))
        except sqlite3.OperationalError as exc:
            raise StoreUnavailable(f"sqlite database {self.path}: {exc}") from exc
        finally:
            self._queued -= 1

    def _wrote(self, count: int = 1) -> None:
        """Count an inline write; every ``CHECKPOINT_EVERY`` start a checkpoint on the
        store's thread, so the syncing step never runs on the event loop. A finished step
        is settled here as well as by a callback on the loop, so a writer that does not
        yield still moves the checkpoints on."""
        self._writes += count
        if self._step is not None and self._step[0].done():
            self._settle(self._step[0])
        if self._writes < CHECKPOINT_EVERY or self._step is not None or self._executor is None:
            return
        if self._conn is self._thread_conn:  # in memory: no WAL
            return
        self._writes = 0
        self._run_step("copy", self._copy_log)

    def _run_step(self, kind: str, job: Callable[[], Any]) -> None:
        assert self._executor is not None
        future = self._executor.submit(job)
        self._step = (future, kind)
        loop = asyncio.get_running_loop()

        def done(future: Future[Any]) -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed without closing us
                loop.call_soon_threadsafe(self._settle, future)

        future.add_done_callback(done)

    def _settle(self, future: Future[Any]) -> None:
        """On the loop, once a step is done (the first of ``_wrote`` and the callback).

        A copy that found the log past ``WAL_RESTART_FRAMES`` is followed by a restart:
        only the frames written during the copy are left to copy, a millisecond's work
        (when many writes were made during it, another copy takes them first: a copy does
        not hold the loop back). The loop's jobs queue behind the restart on the store's
        thread (``_submit``), so the restart never finds the loop's connection in a
        transaction: SQLite's busy handler would wait for it in sleeps of whole
        milliseconds, with every write arriving meanwhile stuck behind it."""
        if self._step is None or self._step[0] is not future:
            return  # settled already
        kind = self._step[1]
        self._step = None
        if kind == "restart":
            self._queued -= 1
            return
        frames = None if future.cancelled() or future.exception() else future.result()
        if frames is None or frames <= WAL_RESTART_FRAMES or self._executor is None:
            self._catch_ups = 0
        elif self._writes > CATCH_UP_WRITES and self._catch_ups < MAX_CATCH_UPS:
            self._catch_ups += 1
            self._writes = 0
            self._run_step("copy", self._copy_log)
        else:
            self._catch_ups = 0
            self._queued += 1
            self._run_step("restart", self._restart_log)

    @property
    def checkpointing(self) -> bool:
        """A checkpoint (a copy or a restart of the log) is running."""
        return self._step is not None

    def _copy_log(self) -> int | None:
        """On the store's thread: copy the log into the database and sync it, while the
        loop goes on writing (PASSIVE never waits); the log's length in frames, None when
        the copy failed (the next one catches up; the log stays valid either way)."""
        if self._thread_conn is None:
            return None
        try:
            _, frames, _ = self._thread_conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        except sqlite3.Error:
            return None
        return int(frames)

    def _restart_log(self) -> None:
        """On the store's thread: the rest of the log copied, and the log starts over at
        the next write. The file keeps its size (up to ``JOURNAL_SIZE_LIMIT``), so the
        writes that follow overwrite blocks instead of growing it."""
        conn = self._thread_conn
        if conn is None:
            return
        try:
            conn.execute(f"PRAGMA busy_timeout = {RESTART_WAIT_MS}")
            try:
                conn.execute("PRAGMA wal_checkpoint(RESTART)").fetchone()
            finally:
                conn.execute(f"PRAGMA busy_timeout = {THREAD_BUSY_TIMEOUT_MS}")
        except sqlite3.Error:
            pass  # another process held the database: the next checkpoint tries again


def _list_agents(conn: sqlite3.Connection) -> list[AgentInfo]:
    """Agents by their latest turn: sessions counted on the activity index alone, then the
    exact time read from each agent's latest minute (a few rows) instead of every row."""
    conn.execute("BEGIN")  # one snapshot for both reads
    try:
        counted = conn.execute(
            "SELECT agent, COUNT(*), MAX(active_at) FROM sessions GROUP BY agent"
        ).fetchall()
        agents = [
            AgentInfo(agent, count, conn.execute(
                "SELECT MAX(updated_at) FROM sessions WHERE agent = ? AND active_at IS ?",
                (agent, latest),
            ).fetchone()[0])
            for agent, count, latest in counted
        ]  # fmt: skip
    finally:
        conn.execute("COMMIT")
    return sorted(agents, key=lambda agent: agent.updated_at, reverse=True)


def activity(when: float) -> int:
    """The minute of activity a session last active at ``when`` is listed under."""
    return int(when // ACTIVITY_SECONDS)


def _add_activity(conn: sqlite3.Connection) -> None:
    """A database from before ``active_at`` gets the column, filled from ``updated_at``
    by ``activity`` itself (SQLite's own arithmetic could round a minute differently)."""
    def added() -> bool:
        return any(row[1] == "active_at" for row in conn.execute("PRAGMA table_info(sessions)"))

    if added():
        return
    conn.create_function("activity", 1, activity, deterministic=True)
    with _Transaction(conn):
        if not added():  # another process opening the same file may have been first
            conn.execute("ALTER TABLE sessions ADD COLUMN active_at INTEGER")
            conn.execute("UPDATE sessions SET active_at = activity(updated_at)")


def _number_sessions(conn: sqlite3.Connection) -> None:
    """A database from before sessions had numbers: ``sessions`` and ``messages`` are
    copied into tables of the current shape (each session numbered, each message keyed by
    its session's number) in one transaction, and take the old tables' places. A message
    without its session's row (which no version writes) stops the migration, with nothing
    changed, rather than be left behind."""
    def columns(table: str) -> set[str]:
        return {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}

    if "id" in columns("sessions"):
        return
    with _Transaction(conn):
        if "id" in columns("sessions"):  # another process opening the file was first
            return
        conn.execute(f"CREATE TABLE numbered_sessions {SESSIONS_TABLE}")
        conn.execute(
            "INSERT INTO numbered_sessions (namespace, agent, session, meta, updated_at,"
            " message_count, active_at) SELECT namespace, agent, session, meta, updated_at,"
            " message_count, active_at FROM sessions ORDER BY rowid"
        )
        conn.execute("DROP TABLE sessions")
        conn.execute("ALTER TABLE numbered_sessions RENAME TO sessions")
        if "sid" in columns("messages"):  # made just now, empty, by SCHEMA
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


def _open_connection(path: str, *, busy_timeout_ms: int, checkpoints: bool) -> sqlite3.Connection:
    # autocommit mode: transactions are opened explicitly by _Transaction
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode = WAL")
    # WAL + NORMAL: a commit is in the WAL (the OS page cache) when append_turn
    # returns, so an acknowledged turn survives kill -9 of the proxy; only an OS
    # crash or power loss can drop the last commits, and the file stays consistent.
    conn.execute("PRAGMA synchronous = NORMAL")
    conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
    conn.execute(f"PRAGMA journal_size_limit = {JOURNAL_SIZE_LIMIT}")
    if not checkpoints:
        conn.execute("PRAGMA wal_autocheckpoint = 0")
    return conn


def _is_busy(exc: sqlite3.OperationalError) -> bool:
    """The database is locked by another connection (a retry that waits will do)."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
    return "locked" in str(exc) or "busy" in str(exc)


# characters (or media bytes) of one write past which it runs on the store's thread
LARGE_WRITE = 1 << 20


def _large(write: TurnWrite) -> bool:
    size = 0
    for message in write.messages:
        content = message.content
        if isinstance(content, str):
            size += len(content)
        elif isinstance(content, list):
            size += sum(len(p["text"]) for p in content
                        if isinstance(p, dict) and isinstance(p.get("text"), str))
    return size >= LARGE_WRITE


def _put_parts(conn: sqlite3.Connection, rows: list[tuple[str, str, str, str, str, bytes]]
               ) -> None:
    with _Transaction(conn):
        conn.executemany(
            "INSERT OR IGNORE INTO session_parts (namespace, agent, session, digest,"
            " media_type, data) VALUES (?, ?, ?, ?, ?, ?)", rows
        )


def _scope_parts(conn: sqlite3.Connection) -> None:
    """A database from before parts belonged to their sessions: each part of the shared
    ``parts`` table is copied to every session whose messages refer to it, in one
    transaction; parts no message refers to are dropped with the old table."""
    old = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'parts'"
    if conn.execute(old).fetchone() is None:
        return
    with _Transaction(conn):
        if conn.execute(old).fetchone() is None:  # another process opening the file was first
            return
        conn.execute(
            "INSERT OR IGNORE INTO session_parts (namespace, agent, session, digest,"
            " media_type, data) SELECT s.namespace, s.agent, s.session, p.digest,"
            " p.media_type, p.data FROM messages m JOIN sessions s ON s.id = m.sid"
            " JOIN json_each(m.data, '$.meta.parts') j"
            " JOIN parts p ON p.digest = json_extract(j.value, '$.digest')"
        )
        conn.execute("DROP TABLE parts")


class _Transaction:
    """One write transaction: committed, or rolled back when the block raises. A class,
    not ``@contextmanager``: a generator per append costs more than the statements' glue."""

    __slots__ = ("conn",)

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def __enter__(self) -> None:
        # IMMEDIATE takes the write lock up front: another process on the same file waits
        # (busy_timeout) instead of failing halfway through an upgrade from read to write
        self.conn.execute("BEGIN IMMEDIATE")

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        self.conn.execute("COMMIT" if kind is None else "ROLLBACK")


def _deliver(future: asyncio.Future[T], outcome: T | BaseException) -> None:
    """A waiting append's outcome; one whose caller gave up (cancelled) is still written,
    like any job already sent."""
    if future.done():
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)


def _ids(key: SessionKey) -> Ids:
    return key.namespace, key.agent, key.session


def _read_meta(
    conn: sqlite3.Connection, ids: Ids
) -> tuple[SessionMeta, int] | None:
    """The session's meta (its system prompt not read, see ``_with_prompt``) and the
    prompt's revision."""
    stored = _read_session(conn, ids)
    return None if stored is None else stored[:2]


def _read_session(conn: sqlite3.Connection, ids: Ids) -> Stored | None:
    """``_read_meta``, and the session's number."""
    row = conn.execute(READ_SESSION, ids).fetchone()
    return None if row is None else (*_decode_meta(row[0]), row[1])


def _decode_meta(text: str) -> tuple[SessionMeta, int]:
    """The meta as ``_encode_meta`` wrote it, and its system prompt's revision: 0 when the
    prompt, if any, is inline (written before prompts had their own table)."""
    data = orjson.loads(text)
    revision = data.pop("system_revision", 0)
    try:
        meta = SessionMeta(**data)  # as _encode_meta wrote it: a third of from_dict's cost
    except TypeError:  # written by a version with fields this one no longer has
        meta = SessionMeta.from_dict(data)
    return meta, revision


def _with_prompt(
    conn: sqlite3.Connection,
    ids: Ids,
    decoded: tuple[SessionMeta, int],
    prompts: SystemPrompts,
) -> SessionMeta:
    meta, revision = decoded
    if revision:
        meta.system_prompt = prompts.read(conn, ids, revision)
    return meta


def _load(
    conn: sqlite3.Connection,
    ids: Ids,
    spec: LoadSpec,
    probe: list[str],
    known_version: int | None,
    known_head: int | None,
    prompts: SystemPrompts,
    heads: Heads,
) -> SessionSnapshot:
    if known_version is not None and not probe:
        # the common turn of a cached session: the heads, or one statement, are its
        # snapshot
        head = None
        if heads.serves(conn):
            heads.check(conn)
            head = heads.head(ids)
        if head is not None:
            config_json, (meta, revision) = head
        else:
            config_json, meta_json, sid = conn.execute(LOAD_HEAD, (ids[1], *ids)).fetchone()
            decoded = _decode_meta(meta_json) if meta_json is not None else None
            if heads.serves(conn):
                heads.read(ids, config_json, decoded, sid)
            if decoded is None:
                agent_config = orjson.loads(config_json) if config_json else None
                return SessionSnapshot(SessionMeta(), [], [], agent_config=agent_config)
            meta, revision = decoded
        # a prompt read by another statement could be newer than this meta: only a cached
        # one is taken here, else the snapshot below reads both
        prompt = prompts.cached(ids, revision) if revision else meta.system_prompt
        if meta.version == known_version and (prompt is not None or not revision):
            meta.system_prompt = prompt
            agent_config = orjson.loads(config_json) if config_json else None
            return SessionSnapshot(meta, [], [], 0, 0, agent_config, exists=True, unchanged=True)
    conn.execute("BEGIN")  # one snapshot for the whole read
    try:
        config_json, meta_json, sid = conn.execute(LOAD_HEAD, (ids[1], *ids)).fetchone()
        agent_config = orjson.loads(config_json) if config_json else None
        decoded = _decode_meta(meta_json) if meta_json is not None else None
        if heads.serves(conn):
            heads.check(conn)
            heads.read(ids, config_json, decoded, sid)
        if decoded is None:
            return SessionSnapshot(SessionMeta(), [], [], agent_config=agent_config)
        meta = _with_prompt(conn, ids, decoded, prompts)
        if known_version is not None and meta.version == known_version:
            matched, matched_seq = _match_probe(conn, sid, probe)
            return SessionSnapshot(
                meta, [], [], matched, matched_seq, agent_config, exists=True, unchanged=True
            )
        low = {"all": 0, "boundary": meta.boundary_seq + 1, "turn": meta.last_user_seq}
        start = low[spec.since]
        grown = False
        if (
            known_version is not None
            and known_head is not None
            and spec.since != "turn"
            and meta.only_grew_since(known_version)
            and known_head <= meta.head_seq
        ):
            grown, start = True, max(start, known_head + 1)
        rows = conn.execute(
            f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE sid = ? AND superseded = 0"
            " AND seq >= ? ORDER BY seq DESC LIMIT ?",
            (sid, start, max(spec.limit, 0)),
        ).fetchall()
        summaries = [] if grown else conn.execute(
            f"SELECT data FROM summaries WHERE {KEY} ORDER BY id", ids
        ).fetchall()
        matched, matched_seq = _match_probe(conn, sid, probe)
    finally:
        conn.execute("COMMIT")
    return SessionSnapshot(
        meta=meta,
        messages=[_decode_message(row) for row in reversed(rows)],
        summaries=[SummaryRecord.from_dict(orjson.loads(row[0])) for row in summaries],
        matched=matched,
        matched_seq=matched_seq,
        agent_config=agent_config,
        exists=True,
        grown=grown,
    )


def _match_probe(conn: sqlite3.Connection, sid: int, probe: list[str]) -> tuple[int, int]:
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


def _append(
    conn: sqlite3.Connection,
    ids: Ids,
    write: TurnWrite,
    now: float,
    prompts: SystemPrompts,
    heads: Heads,
) -> AppendResult:
    """One append in its own transaction."""
    written: list[WrittenPrompt] = []
    try:
        with _Transaction(conn):
            result = _append_rows(conn, ids, write, now, prompts, written, _heads(conn, heads))
    except BaseException:
        if heads.serves(conn):
            heads.forget({ids})
        raise
    for prompt in written:
        prompts.committed(*prompt)
    return result


def _append_group(
    conn: sqlite3.Connection, jobs: list[AppendJob], prompts: SystemPrompts, heads: Heads
) -> list[AppendResult | Exception]:
    """Appends that arrived together, in one transaction: one commit (and the pages
    they share, the messages table's last leaf above all, written once) instead of one
    per append. If the group fails, each append runs again in its own transaction, so one
    failing append takes no other down with it. A database locked by another process
    raises for the whole group (it goes to the store's thread); an append that meets the
    lock after others committed has that error as its outcome, to be retried alone."""
    if len(jobs) > 1:
        written: list[WrittenPrompt] = []
        try:
            with _Transaction(conn):
                serving = _heads(conn, heads)
                results: list[AppendResult | Exception] = [
                    _append_rows(conn, *job, prompts, written, serving) for job in jobs
                ]
        except Exception as exc:
            if heads.serves(conn):
                heads.forget({job[0] for job in jobs})
            if isinstance(exc, sqlite3.OperationalError) and _is_busy(exc):
                raise
            # a prompt read back within the rolled back transaction may have been cached
            prompts.forget({job[0] for job in jobs})
        else:
            for prompt in written:
                prompts.committed(*prompt)
            return results
    outcomes: list[AppendResult | Exception] = []
    for job in jobs:
        try:
            outcomes.append(_append(conn, *job, prompts, heads))
        except sqlite3.OperationalError as exc:
            if _is_busy(exc) and not outcomes:
                raise
            outcomes.append(exc)
        except Exception as exc:
            outcomes.append(exc)
    return outcomes


def _heads(conn: sqlite3.Connection, heads: Heads) -> Heads | None:
    """The heads, checked within the write transaction just begun, if they serve ``conn``."""
    if not heads.serves(conn):
        return None
    heads.check(conn)
    return heads


def _append_rows(
    conn: sqlite3.Connection,
    ids: Ids,
    write: TurnWrite,
    now: float,
    prompts: SystemPrompts,
    written: list[WrittenPrompt],
    heads: Heads | None,
) -> AppendResult:
    """An append within the caller's transaction; a prompt it wrote is added to
    ``written``, to be cached once the transaction commits. ``heads``, checked in this
    transaction, answer for the meta when they know it, and learn the new one."""
    stored = heads.meta(ids) if heads is not None else None
    if stored is None:
        stored = _read_session(conn, ids)
    if stored is None:
        meta, revision = SessionMeta(created_at=now, version=first_version(now)), 0
        [(sid,)] = conn.execute(INSERT_SESSION, (*ids, now)).fetchall()
        previous_activity = None
    else:
        meta, revision, sid = stored
        previous_activity = activity(meta.updated_at)
        applied = _applied(conn, sid, write)
        if applied is not None:
            if revision:
                meta.system_prompt = prompts.read(conn, ids, revision)
            return AppendResult(seqs=list(range(applied, applied + len(write.messages))),
                                superseded=0, meta=meta)
    if not meta.rewrite_version:
        # created here, or stored before rewrites were kept: nothing earlier is known to
        # have only grown
        meta.rewrite_version = meta.version
    meta.version += 1
    superseded = 0
    if write.supersede_after is not None:
        superseded = _supersede(conn, sid, meta, write.supersede_after, write.supersede_until)
    if superseded or write.compressed:
        meta.rewrote()
    rows = []
    chain = meta.head_chain
    for seq, message in enumerate(write.messages, start=meta.head_seq + 1):
        chain = chain_hash(chain, message.fingerprint)
        tool_call_id = message.tool_call_id if message.role == "tool" else None
        if message.role == "user":
            meta.last_user_seq = seq
        rows.append(
            (sid, seq, message.role, chain, tool_call_id,
             message.compressed_content or None, _encode_message(message, now))
        )  # fmt: skip
    conn.executemany(INSERT_MESSAGE, rows)
    if write.compressed:
        conn.executemany(
            "UPDATE messages SET compressed = ? WHERE sid = ? AND seq = ?",
            [(stub or None, sid, seq) for seq, stub in write.compressed.items()],
        )
    first = meta.head_seq + 1
    sqlite_responses.record(conn, sid, write, first, now)
    if write.write_id:
        written_at = int(conn.execute(
            "INSERT INTO turn_writes (sid, write_id, first_seq) VALUES (?, ?, ?)",
            (sid, write.write_id, first),
        ).lastrowid or 0)
        conn.execute("DELETE FROM turn_writes WHERE rowid <= ?", (written_at - KEPT_WRITES,))
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
    encoded, active = _encode_meta(meta, revision), activity(now)
    if active == previous_activity:
        conn.execute(UPDATE_SESSION, (encoded, now, meta.active_count, sid))
    else:
        conn.execute(UPDATE_ACTIVE_SESSION, (encoded, now, meta.active_count, active, sid))
    if heads is not None:
        heads.wrote(conn, ids, meta, revision, sid)
    if new_prompt is not None:
        meta.system_prompt = new_prompt
    elif revision:
        meta.system_prompt = prompts.read(conn, ids, revision)
    return AppendResult(
        seqs=list(range(first, first + len(rows))), superseded=superseded, meta=meta
    )


def _applied(conn: sqlite3.Connection, sid: int, write: TurnWrite) -> int | None:
    """The first seq of ``write`` when a write of its id was applied already."""
    if not write.write_id:
        return None
    row = conn.execute(
        "SELECT first_seq FROM turn_writes WHERE sid = ? AND write_id = ?", (sid, write.write_id)
    ).fetchone()
    return None if row is None else int(row[0])


def _supersede(
    conn: sqlite3.Connection,
    sid: int,
    meta: SessionMeta,
    after: int,
    until: int | None,
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


def _add_summary(
    conn: sqlite3.Connection,
    ids: Ids,
    summary: SummaryRecord,
    expect_boundary: int | None,
) -> SummaryRecord | None:
    with _Transaction(conn):
        stored = _read_meta(conn, ids)
        if stored is None or expect_boundary not in (None, stored[0].boundary_seq):
            return None
        meta, revision = stored
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
        meta.rewrote()
        _write_meta(conn, ids, meta, revision)
    return record


def _acquire_lock(
    conn: sqlite3.Connection, ids: Ids, name: str, ttl: float
) -> str | None:
    now = time.time()
    with _Transaction(conn):
        held = conn.execute(
            f"SELECT expires_at FROM locks WHERE {KEY} AND name = ?", (*ids, name)
        ).fetchone()
        if held and held[0] > now:
            return None
        token = uuid.uuid4().hex
        conn.execute(
            "INSERT OR REPLACE INTO locks (namespace, agent, session, name, token, expires_at)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            (*ids, name, token, now + ttl),
        )
    return token


def _bump_version(conn: sqlite3.Connection, ids: Ids) -> None:
    stored = _read_meta(conn, ids)
    if stored is not None:
        meta, revision = stored
        meta.version += 1
        meta.rewrote()
        _write_meta(conn, ids, meta, revision)


def _write_meta(
    conn: sqlite3.Connection, ids: Ids, meta: SessionMeta, revision: int
) -> None:
    conn.execute(f"UPDATE sessions SET meta = ? WHERE {KEY}", (_encode_meta(meta, revision), *ids))


def _encode_meta(meta: SessionMeta, revision: int) -> str:
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



def _encode_message(message: StoredMessage, now: float) -> str:
    """The message JSON; seq, chain and compressed_content live in their own columns."""
    return encode_message(message, now).decode()


def _decode_message(row: Row) -> StoredMessage:
    seq, chain, compressed, data = row
    return message_from_body(orjson.loads(data), seq, chain, compressed)
