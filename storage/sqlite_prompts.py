"""The SQLite store's system prompts: one row per session, written when the prompt changes.

A session's meta row is rewritten by every append; a system prompt is often kilobytes
and rarely changes. Kept inside the meta JSON it would be encoded, written (in overflow
pages) and decoded again on every turn. So the meta records only the prompt's
``revision``: the session version at which it was stored, unique across a session's
lifetime (versions start from the creation time). The prompt text lives in its own table
and, decoded, in a small LRU keyed by session and revision, so a turn whose prompt did not
change neither writes nor decodes it. A revision never names two different prompts, so a
cached one is never stale: a prompt changed by another process comes with a new revision.
"""

from __future__ import annotations

import sqlite3
from collections import OrderedDict
from typing import Any

import orjson

SCHEMA = """
CREATE TABLE IF NOT EXISTS system_prompts (
    namespace TEXT NOT NULL, agent TEXT NOT NULL, session TEXT NOT NULL,
    revision INTEGER NOT NULL, data TEXT NOT NULL,
    PRIMARY KEY (namespace, agent, session)
);
"""
KEY = "namespace = ? AND agent = ? AND session = ?"
READ = f"SELECT revision, data FROM system_prompts WHERE {KEY}"
WRITE = (
    "INSERT OR REPLACE INTO system_prompts (namespace, agent, session, revision, data)"
    " VALUES (?, ?, ?, ?, ?)"
)
DELETE = f"DELETE FROM system_prompts WHERE {KEY}"

Ids = tuple[str, str, str]  # a session: namespace, agent, session
Prompt = list[dict[str, Any]]


class SystemPrompts:
    """Decoded prompts by (session, revision), least recently used out past ``max_bytes``
    of prompt JSON. Shared by the jobs of one store, which never run two at a time."""

    def __init__(self, max_bytes: int = 4 << 20) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple[Ids, int], tuple[Prompt, int]] = OrderedDict()
        self._size = 0

    def cached(self, ids: Ids, revision: int) -> Prompt | None:
        entry = self._entries.get((ids, revision))
        if entry is None:
            return None
        self._entries.move_to_end((ids, revision))
        return entry[0]

    def read(self, conn: sqlite3.Connection, ids: Ids, revision: int) -> Prompt | None:
        """The prompt stored at ``revision``: cached, or read by the caller's transaction
        (None if the row is gone or newer)."""
        prompt = self.cached(ids, revision)
        if prompt is not None:
            return prompt
        row = conn.execute(READ, ids).fetchone()
        if row is None or row[0] != revision:
            return None
        prompt = orjson.loads(row[1])
        self._remember(ids, revision, prompt, len(row[1]))
        return prompt

    def write(self, conn: sqlite3.Connection, ids: Ids, revision: int, prompt: Prompt) -> int:
        """Store ``prompt`` as the session's, at ``revision``, within the caller's
        transaction; returns its size for ``committed``, which caches it once the
        transaction is: a rolled back write is never served."""
        text = orjson.dumps(prompt).decode()
        conn.execute(WRITE, (*ids, revision, text))
        return len(text)

    def committed(self, ids: Ids, revision: int, prompt: Prompt, size: int) -> None:
        self._remember(ids, revision, prompt, size)

    def forget(self, sessions: set[Ids]) -> None:
        """Drop these sessions' prompts: a rolled back transaction may have read back one
        it wrote itself."""
        for entry in [entry for entry in self._entries if entry[0] in sessions]:
            self._size -= self._entries.pop(entry)[1]

    def _remember(self, ids: Ids, revision: int, prompt: Prompt, size: int) -> None:
        if size > self.max_bytes:
            return
        old = self._entries.pop((ids, revision), None)
        if old is not None:
            self._size -= old[1]
        self._entries[(ids, revision)] = (prompt, size)
        self._size += size
        while self._size > self.max_bytes:
            _, (_, dropped) = self._entries.popitem(last=False)
            self._size -= dropped
