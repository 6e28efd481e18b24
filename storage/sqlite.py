"""The embedded SQLite store: the default, one proxy process, one database file.

One connection is owned by one worker thread; every public method is one job on that
thread and one transaction, so the event loop never blocks on disk and concurrent turns
of a session are serialized without locks.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import fields
from pathlib import Path
from typing import Any, TypeVar

import orjson

from storage.base import StoreUnavailable
from strategies.records import (
    AgentInfo,
    AppendResult,
    LoadSpec,
    SessionInfo,
    SessionKey,
    SessionMeta,
    SessionSnapshot,
    StoredMessage,
    SummaryRecord,
    TurnWrite,
    chain_hash,
)

T = TypeVar("T")
Row = tuple[Any, ...]
KEY = "namespace = ? AND agent = ? AND session = ?"
META_FIELDS = tuple(f.name for f in fields(SessionMeta))

SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    namespace TEXT NOT NULL, agent TEXT NOT NULL, session TEXT NOT NULL,
    meta TEXT NOT NULL, updated_at REAL NOT NULL, message_count INTEGER NOT NULL,
    PRIMARY KEY (namespace, agent, session)
);
CREATE INDEX IF NOT EXISTS sessions_by_agent ON sessions (agent, updated_at);
CREATE TABLE IF NOT EXISTS messages (
    namespace TEXT NOT NULL, agent TEXT NOT NULL, session TEXT NOT NULL,
    seq INTEGER NOT NULL, superseded INTEGER NOT NULL DEFAULT 0,
    role TEXT NOT NULL, chain TEXT NOT NULL, tool_call_id TEXT,
    compressed TEXT, data TEXT NOT NULL,
    PRIMARY KEY (namespace, agent, session, seq)
);
CREATE INDEX IF NOT EXISTS messages_active
    ON messages (namespace, agent, session, seq) WHERE superseded = 0;
CREATE INDEX IF NOT EXISTS messages_chain
    ON messages (namespace, agent, session, chain) WHERE superseded = 0;
CREATE INDEX IF NOT EXISTS messages_tool
    ON messages (namespace, agent, session, tool_call_id) WHERE tool_call_id IS NOT NULL;
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
CREATE TABLE IF NOT EXISTS parts (
    digest TEXT PRIMARY KEY, media_type TEXT NOT NULL, data BLOB NOT NULL
);
"""

MESSAGE_COLUMNS = "seq, chain, compressed, data"
INSERT_MESSAGE = (
    "INSERT INTO messages (namespace, agent, session, seq, role, chain, tool_call_id,"
    " compressed, data) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
UPSERT_SESSION = (
    "INSERT INTO sessions (namespace, agent, session, meta, updated_at, message_count)"
    " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (namespace, agent, session) DO UPDATE SET"
    " meta = excluded.meta, updated_at = excluded.updated_at,"
    " message_count = excluded.message_count"
)
# The last probe hash that is an active chain. CROSS JOIN keeps the probe as the outer
# loop: one index lookup per probe hash.
MATCH_PROBE = (
    "SELECT probe.key + 1, m.seq FROM json_each(?) AS probe CROSS JOIN messages AS m"
    " WHERE m.namespace = ? AND m.agent = ? AND m.session = ? AND m.superseded = 0"
    " AND m.chain = probe.value ORDER BY probe.key DESC LIMIT 1"
)


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
        self._conn: sqlite3.Connection | None = None

    async def open(self) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite-store")
        try:
            await self._on_thread(self._connect)
        except BaseException:
            self._executor.shutdown(wait=False)
            self._executor = None
            raise

    async def close(self) -> None:
        if self._executor is None:
            return
        await self._on_thread(self._disconnect)
        self._executor.shutdown(wait=True)
        self._executor = None

    async def ping(self) -> bool:
        try:
            return await self._submit(lambda conn: conn.execute("SELECT 1").fetchone() == (1,))
        except StoreUnavailable:
            return False

    async def load(
        self, key: SessionKey, spec: LoadSpec, *, probe: Sequence[str] = ()
    ) -> SessionSnapshot:
        return await self._submit(_load, _ids(key), spec, list(probe))

    async def append_turn(self, key: SessionKey, write: TurnWrite) -> AppendResult:
        return await self._submit(_append, _ids(key), write, time.time())

    async def set_compressed(self, key: SessionKey, stubs: dict[int, str | None]) -> None:
        rows = [(stub or None, *_ids(key), seq) for seq, stub in stubs.items()]

        def update(conn: sqlite3.Connection) -> None:
            with _transaction(conn):
                conn.executemany(
                    f"UPDATE messages SET compressed = ? WHERE {KEY} AND seq = ?", rows
                )

        await self._submit(update)

    async def add_summary(
        self, key: SessionKey, summary: SummaryRecord, *, expect_boundary: int | None = None
    ) -> SummaryRecord | None:
        return await self._submit(_add_summary, _ids(key), summary, expect_boundary)

    async def get_messages(self, key: SessionKey, seqs: Sequence[int]) -> list[StoredMessage]:
        def read(conn: sqlite3.Connection) -> list[StoredMessage]:
            rows = conn.execute(
                f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE {KEY}"
                " AND seq IN (SELECT value FROM json_each(?))",
                (*_ids(key), orjson.dumps(list(seqs)).decode()),
            ).fetchall()
            found = {row[0]: row for row in rows}
            return [_decode_message(found[seq]) for seq in seqs if seq in found]

        return await self._submit(read) if seqs else []

    async def get_range(self, key: SessionKey, from_seq: int, to_seq: int) -> list[StoredMessage]:
        rows = await self._execute(
            f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE {KEY} AND superseded = 0"
            " AND seq >= ? AND seq <= ? ORDER BY seq",
            (*_ids(key), from_seq, to_seq),
        )
        return [_decode_message(row) for row in rows]

    async def find_tool_result(self, key: SessionKey, tool_call_id: str) -> StoredMessage | None:
        rows = await self._execute(
            f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE {KEY} AND tool_call_id = ?"
            " ORDER BY superseded, seq DESC LIMIT 1",
            (*_ids(key), tool_call_id),
        )
        return _decode_message(rows[0]) if rows else None

    async def set_calibration(self, key: SessionKey, value: float) -> None:
        def update(conn: sqlite3.Connection) -> None:
            with _transaction(conn):
                meta = _read_meta(conn, _ids(key))
                if meta is not None:
                    meta.calibration = float(value)
                    _write_meta(conn, _ids(key), meta)

        await self._submit(update)

    async def list_agents(self) -> list[AgentInfo]:
        rows = await self._execute(
            "SELECT agent, COUNT(*), MAX(updated_at) FROM sessions"
            " GROUP BY agent ORDER BY MAX(updated_at) DESC"
        )
        return [AgentInfo(*row) for row in rows]

    async def list_sessions(self, agent: str, *, limit: int = 200) -> list[SessionInfo]:
        rows = await self._execute(
            "SELECT namespace, agent, session, message_count, updated_at FROM sessions"
            " WHERE agent = ? ORDER BY updated_at DESC LIMIT ?",
            (agent, max(limit, 0)),
        )
        return [SessionInfo(*row) for row in rows]

    async def delete_session(self, key: SessionKey) -> bool:
        def delete(conn: sqlite3.Connection) -> bool:
            with _transaction(conn):
                existed = conn.execute(f"DELETE FROM sessions WHERE {KEY}", _ids(key)).rowcount
                for table in ("messages", "summaries", "locks"):
                    conn.execute(f"DELETE FROM {table} WHERE {KEY}", _ids(key))
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

    async def put_part(self, digest: str, data: bytes, media_type: str) -> None:
        await self._execute(
            "INSERT OR IGNORE INTO parts (digest, media_type, data) VALUES (?, ?, ?)",
            (digest, media_type, data),
        )

    async def get_part(self, digest: str) -> tuple[bytes, str] | None:
        rows = await self._execute("SELECT data, media_type FROM parts WHERE digest = ?", (digest,))
        return (bytes(rows[0][0]), rows[0][1]) if rows else None

    def _connect(self) -> None:
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        # autocommit mode: transactions are opened explicitly by _transaction()
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode = WAL")
        # WAL + NORMAL: a commit is in the WAL (the OS page cache) when append_turn
        # returns, so an acknowledged turn survives kill -9 of the proxy; only an OS
        # crash or power loss can drop the last commits, and the file stays consistent.
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute("PRAGMA busy_timeout = 5000")
        conn.executescript(SCHEMA)
        self._conn = conn

    def _disconnect(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            raise StoreUnavailable(f"sqlite database {self.path} is not open")
        return self._conn

    async def _execute(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        """One statement, one (implicit) transaction."""
        return await self._submit(lambda conn: conn.execute(sql, params).fetchall())

    async def _submit(self, job: Callable[..., T], *args: Any) -> T:
        """Run ``job(connection, *args)`` on the store's thread."""
        return await self._on_thread(lambda: job(self._connection(), *args))

    async def _on_thread(self, call: Callable[[], T]) -> T:
        """The one seam where sqlite3 failures become ``StoreUnavailable``."""
        if self._executor is None:
            raise StoreUnavailable(f"sqlite database {self.path} is not open")
        try:
            return await asyncio.wrap_future(self._executor.submit(call))
        except sqlite3.OperationalError as exc:
            raise StoreUnavailable(f"sqlite database {self.path}: {exc}") from exc


@contextmanager
def _transaction(conn: sqlite3.Connection) -> Iterator[None]:
    # IMMEDIATE takes the write lock up front: another process on the same file waits
    # (busy_timeout) instead of failing halfway through an upgrade from read to write
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def _ids(key: SessionKey) -> tuple[str, str, str]:
    return key.namespace, key.agent, key.session


def _read_meta(conn: sqlite3.Connection, ids: tuple[str, str, str]) -> SessionMeta | None:
    row = conn.execute(f"SELECT meta FROM sessions WHERE {KEY}", ids).fetchone()
    return SessionMeta.from_dict(orjson.loads(row[0])) if row else None


def _load(
    conn: sqlite3.Connection, ids: tuple[str, str, str], spec: LoadSpec, probe: list[str]
) -> SessionSnapshot:
    conn.execute("BEGIN")  # one snapshot for the whole read
    try:
        config = conn.execute("SELECT config FROM agent_configs WHERE agent = ?", (ids[1],))
        config_row = config.fetchone()
        agent_config = orjson.loads(config_row[0]) if config_row else None
        meta = _read_meta(conn, ids)
        if meta is None:
            return SessionSnapshot(SessionMeta(), [], [], agent_config=agent_config)
        low = {"all": 0, "boundary": meta.boundary_seq + 1, "turn": meta.last_user_seq}
        rows = conn.execute(
            f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE {KEY} AND superseded = 0"
            " AND seq >= ? ORDER BY seq DESC LIMIT ?",
            (*ids, low[spec.since], max(spec.limit, 0)),
        ).fetchall()
        summaries = conn.execute(
            f"SELECT data FROM summaries WHERE {KEY} ORDER BY id", ids
        ).fetchall()
        matched, matched_seq = _match_probe(conn, ids, probe)
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
    )


def _match_probe(
    conn: sqlite3.Connection, ids: tuple[str, str, str], probe: list[str]
) -> tuple[int, int]:
    """Length of the longest probe prefix ending at an active chain, and that chain's seq.

    Chains are cumulative, so that prefix ends at the last probe hash found. A resent
    history usually matches within its last few hashes: search backwards in growing chunks.
    """
    end, size = len(probe), 8
    while end > 0:
        start = max(0, end - size)
        chunk = orjson.dumps(probe[start:end]).decode()
        found = conn.execute(MATCH_PROBE, (chunk, *ids)).fetchone()
        if found:
            return start + found[0], found[1]
        end, size = start, size * 8
    return 0, 0


def _append(
    conn: sqlite3.Connection, ids: tuple[str, str, str], write: TurnWrite, now: float
) -> AppendResult:
    with _transaction(conn):
        meta = _read_meta(conn, ids) or SessionMeta(created_at=now)
        superseded = 0
        if write.supersede_after is not None:
            superseded = _supersede(conn, ids, meta, write.supersede_after, write.supersede_until)
        rows = []
        chain = meta.head_chain
        for seq, message in enumerate(write.messages, start=meta.head_seq + 1):
            chain = chain_hash(chain, message.fingerprint)
            tool_call_id = message.tool_call_id if message.role == "tool" else None
            if message.role == "user":
                meta.last_user_seq = seq
            rows.append(
                (*ids, seq, message.role, chain, tool_call_id,
                 message.compressed_content or None, _encode_message(message, now))
            )  # fmt: skip
        conn.executemany(INSERT_MESSAGE, rows)
        if write.compressed:
            conn.executemany(
                f"UPDATE messages SET compressed = ? WHERE {KEY} AND seq = ?",
                [(stub or None, *ids, seq) for seq, stub in write.compressed.items()],
            )
        first = meta.head_seq + 1
        meta.head_seq += len(rows)
        meta.active_count += len(rows)
        meta.head_chain = chain
        meta.updated_at = now
        for name in ("system_prompt", "system_tokens", "model", "calibration"):
            value = getattr(write, name)
            if value is not None:
                setattr(meta, name, value)
        conn.execute(UPSERT_SESSION, (*ids, _encode_meta(meta), now, meta.active_count))
    return AppendResult(
        seqs=list(range(first, first + len(rows))), superseded=superseded, meta=meta
    )


def _supersede(
    conn: sqlite3.Connection,
    ids: tuple[str, str, str],
    meta: SessionMeta,
    after: int,
    until: int | None,
) -> int:
    superseded = conn.execute(
        f"UPDATE messages SET superseded = 1 WHERE {KEY} AND superseded = 0"
        " AND seq > ? AND seq <= ?",
        (*ids, after, meta.head_seq if until is None else until),
    ).rowcount
    if superseded:
        meta.active_count -= superseded
        # new messages chain from the last message still active
        last = conn.execute(
            f"SELECT chain FROM messages WHERE {KEY} AND superseded = 0 ORDER BY seq DESC LIMIT 1",
            ids,
        ).fetchone()
        meta.head_chain = last[0] if last else ""
        user = conn.execute(
            f"SELECT seq FROM messages WHERE {KEY} AND superseded = 0 AND role = 'user'"
            " ORDER BY seq DESC LIMIT 1",
            ids,
        ).fetchone()
        meta.last_user_seq = user[0] if user else 0
    return superseded


def _add_summary(
    conn: sqlite3.Connection,
    ids: tuple[str, str, str],
    summary: SummaryRecord,
    expect_boundary: int | None,
) -> SummaryRecord | None:
    with _transaction(conn):
        meta = _read_meta(conn, ids)
        if meta is None or expect_boundary not in (None, meta.boundary_seq):
            return None
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
            _write_meta(conn, ids, meta)
    return record


def _acquire_lock(
    conn: sqlite3.Connection, ids: tuple[str, str, str], name: str, ttl: float
) -> str | None:
    now = time.time()
    with _transaction(conn):
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


def _write_meta(conn: sqlite3.Connection, ids: tuple[str, str, str], meta: SessionMeta) -> None:
    conn.execute(f"UPDATE sessions SET meta = ? WHERE {KEY}", (_encode_meta(meta), *ids))


def _encode_meta(meta: SessionMeta) -> str:
    return orjson.dumps({name: getattr(meta, name) for name in META_FIELDS}).decode()


def _encode_message(message: StoredMessage, now: float) -> str:
    """The message JSON; seq, chain and compressed_content live in their own columns."""
    body: dict[str, Any] = {
        "role": message.role,
        "content": message.content,
        "tokens": message.tokens,
        "fingerprint": message.fingerprint,
        "created_at": message.created_at or now,
    }
    if message.tool_calls is not None:
        body["tool_calls"] = message.tool_calls
    if message.tool_call_id is not None:
        body["tool_call_id"] = message.tool_call_id
    if message.name is not None:
        body["name"] = message.name
    if message.meta:
        body["meta"] = message.meta
    return orjson.dumps(body).decode()


def _decode_message(row: Row) -> StoredMessage:
    seq, chain, compressed, data = row
    message = StoredMessage.from_dict(orjson.loads(data))
    message.seq, message.chain, message.compressed_content = seq, chain, compressed
    return message
