"""The SQLite store's sessions as a whole: listing, deletion, agent configs, locks and
media parts. Each function runs on the store's thread, in one transaction."""

from __future__ import annotations

import sqlite3
import time
import uuid
from collections.abc import Sequence
from typing import Any

import orjson

from storage import sqlite_responses, sqlite_search
from storage.sqlite_prompts import Ids
from storage.sqlite_schema import KEY, SESSION, Snapshot, Transaction
from storage.sqlite_turns import read_session
from strategies.records import AgentInfo, SessionInfo

LISTED = "SELECT namespace, agent, session, message_count, updated_at FROM sessions"


def list_agents(conn: sqlite3.Connection) -> list[AgentInfo]:
    """Agents by their latest turn: sessions counted on the activity index alone, then the
    exact time read from each agent's latest minute (a few rows) instead of every row."""
    with Snapshot(conn):
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
    return sorted(agents, key=lambda agent: agent.updated_at, reverse=True)


def list_sessions(conn: sqlite3.Connection, agent: str, limit: int) -> list[SessionInfo]:
    rows = conn.execute(
        f"{LISTED} WHERE agent = ? ORDER BY active_at DESC, updated_at DESC LIMIT ?",
        (agent, max(limit, 0)),
    )
    return [SessionInfo(*row) for row in rows]


def find_sessions(conn: sqlite3.Connection, agent: str, session: str) -> list[SessionInfo]:
    rows = conn.execute(
        f"{LISTED} WHERE agent = ? AND session = ? ORDER BY active_at DESC, updated_at DESC",
        (agent, session),
    )
    return [SessionInfo(*row) for row in rows]


def count_sessions(conn: sqlite3.Connection, namespace: str) -> int:
    (count,) = conn.execute(
        "SELECT COUNT(*) FROM sessions WHERE namespace = ?", (namespace,)
    ).fetchone()
    return int(count)


def delete_session(conn: sqlite3.Connection, ids: Ids) -> bool:
    with Transaction(conn):
        # the messages first: they are found by the session's row
        stored = read_session(conn, ids)
        if stored is not None:
            sqlite_search.unindex(conn, stored[2])
        conn.execute(f"DELETE FROM messages WHERE {SESSION}", ids)
        conn.execute(f"DELETE FROM turn_writes WHERE {SESSION}", ids)
        sqlite_responses.delete_session(conn, ids)
        for table in ("summaries", "locks", "system_prompts", "session_parts"):
            conn.execute(f"DELETE FROM {table} WHERE {KEY}", ids)
        existed = conn.execute(f"DELETE FROM sessions WHERE {KEY}", ids).rowcount
    return existed > 0


def get_agent_config(conn: sqlite3.Connection, agent: str) -> dict[str, Any] | None:
    row = conn.execute("SELECT config FROM agent_configs WHERE agent = ?", (agent,)).fetchone()
    return orjson.loads(row[0]) if row else None


def set_agent_config(conn: sqlite3.Connection, agent: str, config: dict[str, Any] | None) -> None:
    if config is None:
        conn.execute("DELETE FROM agent_configs WHERE agent = ?", (agent,))
        return
    conn.execute(
        "INSERT OR REPLACE INTO agent_configs (agent, config, updated_at) VALUES (?, ?, ?)",
        (agent, orjson.dumps(config).decode(), time.time()),
    )


def acquire_lock(conn: sqlite3.Connection, ids: Ids, name: str, ttl: float) -> str | None:
    now = time.time()
    with Transaction(conn):
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


def release_lock(conn: sqlite3.Connection, ids: Ids, name: str, token: str) -> None:
    conn.execute(f"DELETE FROM locks WHERE {KEY} AND name = ? AND token = ?", (*ids, name, token))


def put_parts(conn: sqlite3.Connection, ids: Ids, parts: Sequence[tuple[str, bytes, str]]) -> None:
    with Transaction(conn):
        conn.executemany(
            "INSERT OR IGNORE INTO session_parts (namespace, agent, session, digest,"
            " media_type, data) VALUES (?, ?, ?, ?, ?, ?)",
            [(*ids, digest, media_type, data) for digest, data, media_type in parts],
        )


def get_parts(
    conn: sqlite3.Connection, ids: Ids, digests: Sequence[str]
) -> dict[str, tuple[bytes, str]]:
    rows = conn.execute(
        f"SELECT digest, data, media_type FROM session_parts WHERE {KEY} AND digest IN"
        " (SELECT value FROM json_each(?))",
        (*ids, orjson.dumps(list(digests)).decode()),
    )
    return {row[0]: (bytes(row[1]), row[2]) for row in rows}
