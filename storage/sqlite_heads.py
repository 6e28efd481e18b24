"""The SQLite store's session heads: each session's meta and number as the event loop's
connection last read or wrote them, and each agent's stored config.

A turn reads its session's meta twice, to load it and to append to it, and decodes it each
time. While nothing else has written to the database, what this connection last saw is
still what is stored, so both reads are answered from here. Anything else invalidates it
all, checked before every use:

- another connection committed (``PRAGMA data_version`` changed): another process, or
  the store's own thread;
- this connection made changes the heads were not told about (``total_changes`` moved):
  any write other than an append (compaction, summaries, the admin's edits, a rolled back
  append).

Bounded to ``MAX_SESSIONS`` sessions, the oldest written or read first out.
"""

from __future__ import annotations

import sqlite3
from dataclasses import fields
from operator import attrgetter
from typing import Any

from storage.sqlite_prompts import Ids
from strategies.records import SessionMeta

Decoded = tuple[SessionMeta, int]  # a meta as stored (prompt not read) and its prompt's revision
Stored = tuple[SessionMeta, int, int]  # the same, and the session's number (sessions.id)
MAX_SESSIONS = 4096
_NAMES = [field.name for field in fields(SessionMeta)]
_META_FIELDS = attrgetter(*_NAMES)
_PROMPT = _NAMES.index("system_prompt")
_UNKNOWN = object()


class Heads:
    """Owned by the store's loop connection, used by its jobs only (one at a time)."""

    def __init__(self, conn: sqlite3.Connection | None, max_sessions: int = MAX_SESSIONS) -> None:
        self.conn = conn  # None: no second connection can write (in memory), nothing kept
        self.max_sessions = max_sessions
        self._metas: dict[Ids, tuple[tuple[Any, ...], int, int]] = {}
        self._configs: dict[str, str | None] = {}
        self._data_version: int | None = None
        self._changes = -1

    def serves(self, conn: sqlite3.Connection) -> bool:
        """The heads answer for ``conn`` (the loop's, not the store thread's)."""
        return conn is self.conn

    def check(self, conn: sqlite3.Connection) -> None:
        """Forget everything if anything wrote since the heads were last brought up to
        date. A write transaction checks after taking the lock; a read, right before."""
        (data_version,) = conn.execute("PRAGMA data_version").fetchone()
        if data_version != self._data_version or conn.total_changes != self._changes:
            self._metas.clear()
            self._configs.clear()
            self._data_version = data_version
            self._changes = conn.total_changes

    def head(self, ids: Ids) -> tuple[str | None, Decoded] | None:
        """The agent's config JSON and the session's meta, if both are known (after
        ``check``). The meta is a new object, the caller's to change."""
        config = self._configs.get(ids[1], _UNKNOWN)
        entry = self._metas.get(ids)
        if entry is None or config is _UNKNOWN:
            return None
        return config, (SessionMeta(*entry[0]), entry[1])  # type: ignore[return-value]

    def meta(self, ids: Ids) -> Stored | None:
        """The session's meta, a new object, and its number (after ``check``)."""
        entry = self._metas.get(ids)
        return None if entry is None else (SessionMeta(*entry[0]), entry[1], entry[2])

    def read(
        self, ids: Ids, config: str | None, decoded: Decoded | None, sid: int | None
    ) -> None:
        """What a read found (after ``check``; ``decoded`` as ``_decode_meta`` returns it
        and the session's number, None for a session not stored)."""
        self._configs[ids[1]] = config
        if decoded is not None and sid is not None:
            self._keep(ids, decoded[0], decoded[1], sid)

    def wrote(
        self, conn: sqlite3.Connection, ids: Ids, meta: SessionMeta, revision: int, sid: int
    ) -> None:
        """An append wrote ``meta`` (its prompt, if any, stored at ``revision``) of session
        number ``sid``, in the transaction still open: the heads follow the connection's own
        changes."""
        self._keep(ids, meta, revision, sid)
        self._changes = conn.total_changes

    def forget(self, sessions: set[Ids]) -> None:
        """Sessions whose writes were rolled back."""
        for ids in sessions:
            self._metas.pop(ids, None)

    def _keep(self, ids: Ids, meta: SessionMeta, revision: int, sid: int) -> None:
        values = _META_FIELDS(meta)
        if revision:  # as stored: the prompt is in its own table
            values = (*values[:_PROMPT], None, *values[_PROMPT + 1 :])
        self._metas.pop(ids, None)  # to the end: the oldest go first
        self._metas[ids] = values, revision, sid
        if len(self._metas) > self.max_sessions:
            del self._metas[next(iter(self._metas))]
