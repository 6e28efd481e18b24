"""The embedded store keeps media parts per session. A database written when parts were
shared by digest is migrated when opened: each part is copied to the sessions whose
messages refer to it, and the parts no message refers to are dropped."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from storage.sqlite import SqliteStore
from strategies.records import SessionKey, StoredMessage, TurnWrite

ONE = SessionKey("ns-1", "agent", "photos")
TWO = SessionKey("ns-2", "agent", "photos")
SHARED, OWN, ORPHAN = "sha256:" + "a" * 64, "sha256:" + "b" * 64, "sha256:" + "c" * 64


def with_parts(text: str, *digests: str) -> StoredMessage:
    parts = [{"kind": "image", "digest": d, "media_type": "image/png"} for d in digests]
    return StoredMessage(role="user", content=text, tokens=3, fingerprint=f"fp-{text}",
                         meta={"parts": parts})


def to_shared_parts(path: Path) -> None:
    """Rewrite a closed database into the shape written when parts were shared."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.executescript(
            "BEGIN; DROP TABLE session_parts;"
            " CREATE TABLE parts (digest TEXT PRIMARY KEY, media_type TEXT NOT NULL,"
            " data BLOB NOT NULL);"
            f" INSERT INTO parts VALUES ('{SHARED}', 'image/png', x'01'),"
            f" ('{OWN}', 'image/png', x'02'), ('{ORPHAN}', 'image/png', x'03'); COMMIT;"
        )
    finally:
        conn.close()


def tables(path: Path) -> set[str]:
    conn = sqlite3.connect(path)
    try:
        return {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
    finally:
        conn.close()


async def test_shared_parts_move_to_the_sessions_that_refer_to_them(tmp_path: Path) -> None:
    path = tmp_path / "memory.db"
    store = SqliteStore(f"sqlite:///{path}")
    await store.open()
    await store.append_turn(ONE, TurnWrite(messages=[with_parts("both", SHARED, OWN)]))
    await store.append_turn(TWO, TurnWrite(messages=[with_parts("one", SHARED)]))
    await store.close()
    to_shared_parts(path)

    store = SqliteStore(f"sqlite:///{path}")
    await store.open()
    try:
        everything = [SHARED, OWN, ORPHAN]
        assert await store.get_parts(ONE, everything) == {
            SHARED: (b"\x01", "image/png"), OWN: (b"\x02", "image/png")}
        assert await store.get_parts(TWO, everything) == {SHARED: (b"\x01", "image/png")}
    finally:
        await store.close()
    assert "parts" not in tables(path)
