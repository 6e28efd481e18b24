"""The embedded SQLite store: the default, one proxy process, one database file.

One connection, used by one thread of the store's own: every public method is one job
sent to that thread and one transaction there, so the event loop never waits for SQLite
(a commit, a checkpoint, another process's lock) and jobs run in the order they were
sent. The database is in WAL mode, its log copied back by a thread and a connection of
their own (``storage/sqlite_checkpoint.py``): no turn waits for a checkpoint. The schema, its
migrations and the connection's settings are in ``storage/sqlite_schema.py``, a session's
log in ``sqlite_turns.py``, whole sessions (listing, deletion, agent configs, locks,
media parts) in ``sqlite_sessions.py``, the full-text index in ``sqlite_search.py`` and
system prompts in ``sqlite_prompts.py``.

One thread rather than aiosqlite (the same design: a thread per connection behind a
queue): aiosqlite hops to its thread and back for every statement and fetch, where a job
here is a whole call, a load or an append of several statements, in one hop. Measured on
a cached turn's load (three statements): 42-50 us of CPU through aiosqlite, 21 us as one
job here. The thread takes its jobs from a queue and sets each outcome on the caller's
loop (``call_soon_threadsafe``): a turn's two calls cost about 30 us of CPU less than
through a ``ThreadPoolExecutor`` and ``asyncio.wrap_future``.

One read runs on the event loop, on a connection of its own: whether a session the
session cache holds is still at the version it holds (``load`` with ``held_version`` and
no probe: most turns' load). It is a point read by primary key (and the system prompt's,
when not cached), on a connection that never waits for a lock: a read that would wait,
or fails, is sent to the thread. Inside a turn, the hop to the store's thread and back
costs 100-150 us of CPU on the benchmark's machine (two threads idling and waking),
the read about 10 us.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from storage import sqlite_responses
from storage import sqlite_sessions as sessions
from storage import sqlite_turns as turns
from storage.base import StoreUnavailable
from storage.sqlite_checkpoint import BACKSTOP_PAGES, Checkpointer
from storage.sqlite_prompts import Ids, SystemPrompts
from storage.sqlite_schema import connect, database_path
from strategies.records import (
    AgentInfo,
    AppendResult,
    LoadSpec,
    LogPage,
    RangeBudget,
    ResponseRef,
    SessionInfo,
    SessionKey,
    SessionSnapshot,
    StoredMessage,
    SummaryRecord,
    TurnWrite,
)

__all__ = ["SqliteStore", "database_path"]

T = TypeVar("T")


class SqliteStore:
    """Store backend on an SQLite file (``sqlite:///path/to/file.db``)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.path = database_path(url)
        self._jobs: queue.SimpleQueue[Job | None] | None = None  # the thread's, while open
        self._thread: threading.Thread | None = None
        self._conn: sqlite3.Connection | None = None  # used on the store's thread only
        self._checkpointer: Checkpointer | None = None
        # the event loop's own connection, for one read: a held session's version
        self._reader: sqlite3.Connection | None = None
        self._reader_prompts = SystemPrompts()
        # decoded system prompts by revision, used by the thread's jobs only
        self._prompts = SystemPrompts()

    async def open(self) -> None:
        jobs: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        checkpointer = Checkpointer(self.path) if self.path != ":memory:" else None
        after_job = checkpointer.after_job if checkpointer is not None else None
        thread = threading.Thread(
            target=_serve, args=(jobs, after_job), name="sqlite-store", daemon=True
        )
        thread.start()
        self._jobs, self._thread = jobs, thread
        try:
            self._conn = await self._send(lambda _: self._connect())
        except BaseException:
            self._stop()
            raise
        # a file (another connection to :memory: is another database): the log's
        # checkpointer and the loop's reader
        if checkpointer is not None:
            checkpointer.start(self._conn)
            self._checkpointer = checkpointer
            self._reader = _reader(self.path)

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if self._jobs is None:
            return
        reader, self._reader = self._reader, None
        if reader is not None:
            with contextlib.suppress(sqlite3.Error):  # made on another thread's loop
                reader.close()
        checkpointer, self._checkpointer = self._checkpointer, None
        if checkpointer is not None:  # first: the store's connection, closed last, cleans up
            await asyncio.to_thread(checkpointer.stop)
        if conn is not None:
            await self._send(lambda _: conn.close())
        self._stop()

    async def ping(self) -> bool:
        try:
            return await self._run(lambda conn: conn.execute("SELECT 1").fetchone() == (1,))
        except StoreUnavailable:
            return False

    async def load(
        self,
        key: SessionKey,
        spec: LoadSpec,
        *,
        probe: Sequence[str] = (),
        held_version: int | None = None,
    ) -> SessionSnapshot:
        if held_version is not None and not probe and self._reader is not None:
            # on the loop: a point read, where a job would cost a hop to the store's thread
            # and back (100-150 us of CPU a turn on the benchmark's machine)
            try:
                held = turns.load_held(
                    self._reader, _ids(key), held_version, self._reader_prompts
                )
            except sqlite3.Error:  # busy or unreadable here: the store's thread answers
                held = None
            if held is not None:
                return held
        return await self._run(turns.load, _ids(key), spec, probe, held_version, self._prompts)

    async def append_turn(self, key: SessionKey, write: TurnWrite) -> AppendResult:
        return await self._run(turns.append, _ids(key), write, time.time(), self._prompts)

    async def set_compressed(self, key: SessionKey, stubs: dict[int, str | None]) -> None:
        await self._run(turns.set_compressed, _ids(key), stubs)

    async def add_summary(
        self, key: SessionKey, summary: SummaryRecord, *, expect_boundary: int | None = None
    ) -> SummaryRecord | None:
        return await self._run(turns.add_summary, _ids(key), summary, expect_boundary)

    async def get_messages(self, key: SessionKey, seqs: Sequence[int]) -> list[StoredMessage]:
        return await self._run(turns.get_messages, _ids(key), seqs) if seqs else []

    async def get_range(
        self, key: SessionKey, from_seq: int, to_seq: int, *, budget: RangeBudget | None = None
    ) -> list[StoredMessage]:
        return await self._run(turns.get_range, _ids(key), from_seq, to_seq, budget)

    async def find_tool_result(self, key: SessionKey, tool_call_id: str) -> StoredMessage | None:
        return await self._run(turns.find_tool_result, _ids(key), tool_call_id)

    async def read_log(self, key: SessionKey, *, after: int = 0, limit: int = 100) -> LogPage:
        return await self._run(turns.read_log, _ids(key), after, limit)

    async def search_messages(
        self,
        key: SessionKey,
        words: Sequence[str],
        *,
        exclude: Sequence[int] = (),
        limit: int = 5,
    ) -> list[StoredMessage]:
        if not words or limit <= 0:
            return []
        return await self._run(turns.search, _ids(key), words, exclude, limit)

    async def find_response(self, key: SessionKey, response_id: str) -> ResponseRef | None:
        return await self._run(sqlite_responses.find, _ids(key), response_id)

    async def forget_response(self, key: SessionKey, response_id: str) -> bool:
        return await self._run(sqlite_responses.forget, _ids(key), response_id)

    async def set_calibration(self, key: SessionKey, value: float) -> None:
        await self._run(turns.set_calibration, _ids(key), value)

    async def list_agents(self) -> list[AgentInfo]:
        return await self._run(sessions.list_agents)

    async def list_sessions(self, agent: str, *, limit: int = 200) -> list[SessionInfo]:
        return await self._run(sessions.list_sessions, agent, limit)

    async def find_sessions(self, agent: str, session: str) -> list[SessionInfo]:
        return await self._run(sessions.find_sessions, agent, session)

    async def count_sessions(self, namespace: str) -> int:
        return await self._run(sessions.count_sessions, namespace)

    async def delete_session(self, key: SessionKey) -> bool:
        return await self._run(sessions.delete_session, _ids(key))

    async def get_agent_config(self, agent: str) -> dict[str, Any] | None:
        return await self._run(sessions.get_agent_config, agent)

    async def set_agent_config(self, agent: str, config: dict[str, Any] | None) -> None:
        await self._run(sessions.set_agent_config, agent, config)

    async def acquire_lock(self, key: SessionKey, name: str, ttl: float) -> str | None:
        return await self._run(sessions.acquire_lock, _ids(key), name, ttl)

    async def release_lock(self, key: SessionKey, name: str, token: str) -> None:
        await self._run(sessions.release_lock, _ids(key), name, token)

    async def put_part(self, key: SessionKey, digest: str, data: bytes, media_type: str) -> None:
        await self.put_parts(key, [(digest, data, media_type)])

    async def get_part(self, key: SessionKey, digest: str) -> tuple[bytes, str] | None:
        return (await self.get_parts(key, [digest])).get(digest)

    async def put_parts(self, key: SessionKey, parts: Sequence[tuple[str, bytes, str]]) -> None:
        if parts:
            await self._run(sessions.put_parts, _ids(key), parts)

    async def get_parts(
        self, key: SessionKey, digests: Sequence[str]
    ) -> dict[str, tuple[bytes, str]]:
        return await self._run(sessions.get_parts, _ids(key), digests) if digests else {}

    def _connect(self) -> sqlite3.Connection:
        """On the store's thread: its connection, the schema made and migrated."""
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        conn = connect(self.path)
        if self.path != ":memory:":
            # the checkpointer's thread copies the log back; this connection only past
            # the backstop (storage/sqlite_checkpoint.py)
            conn.execute(f"PRAGMA wal_autocheckpoint = {BACKSTOP_PAGES}")
        return conn

    async def _run(self, job: Callable[..., T], *args: Any) -> T:
        """``job(connection, *args)`` on the store's thread, after the jobs sent before."""
        conn = self._conn
        if conn is None:
            raise StoreUnavailable(f"sqlite database {self.path} is not open")
        return await self._send(lambda _: job(conn, *args))

    async def _send(self, call: Callable[[None], T]) -> T:
        """``call`` on the store's thread, its outcome back on the loop; sqlite3's
        operational errors (a lock held past the busy timeout, a full disk, an unreadable
        file) as ``StoreUnavailable``. A caller that gives up (cancelled) leaves a job
        already sent to run."""
        if self._jobs is None:
            raise StoreUnavailable(f"sqlite database {self.path} is not open")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._jobs.put((call, loop, future))
        try:
            return await future
        except sqlite3.OperationalError as exc:
            raise StoreUnavailable(f"sqlite database {self.path}: {exc}") from exc

    def _stop(self) -> None:
        if self._jobs is not None:
            self._jobs.put(None)
        if self._thread is not None:
            self._thread.join()
        self._jobs = self._thread = None


Job = tuple[Callable[[None], Any], asyncio.AbstractEventLoop, "asyncio.Future[Any]"]


def _serve(jobs: queue.SimpleQueue[Job | None], after_job: Callable[[], None] | None) -> None:
    """The store's thread: each job in the order sent, its outcome set on its loop (then
    the log's checkpointer asked whether it is due)."""
    while (item := jobs.get()) is not None:
        call, loop, future = item
        try:
            outcome, failed = call(None), False
        except BaseException as exc:  # handed to the caller, whatever it is
            outcome, failed = exc, True
        with contextlib.suppress(RuntimeError):  # the loop closed without closing the store
            loop.call_soon_threadsafe(_settle, future, outcome, failed)
        if after_job is not None:
            after_job()


def _settle(future: asyncio.Future[Any], outcome: Any, failed: bool) -> None:
    if future.cancelled():
        return
    if failed:
        future.set_exception(outcome)
    else:
        future.set_result(outcome)


def _reader(path: str) -> sqlite3.Connection | None:
    """The event loop's read-only connection: it never waits for a lock (a read that
    would is sent to the store's thread instead)."""
    try:
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("PRAGMA busy_timeout = 0")
        conn.execute("PRAGMA query_only = 1")
    except sqlite3.Error:
        return None
    return conn


def _ids(key: SessionKey) -> Ids:
    return key.namespace, key.agent, key.session
