"""What ``Store.search_messages`` costs on a long session, in process, on each backend.

A session of ``--messages`` stored messages (user questions and replies of a few hundred
characters, one word in a hundred messages a rare one) is written in turns of two; then
the wall time of one search is taken: the first (SQLite: it indexes the whole session on
the store's thread first), then the median of ``--repeats`` more (SQLite: nothing new to
index; Redis: a scan of the newest ``SEARCH_SCAN`` messages each time), and of one more
after a turn was appended (SQLite: that turn indexed first).

    python bench/search_micro.py
    python bench/search_micro.py --messages 5000 --backend sqlite
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import _paths  # noqa: F401

from storage.base import Store
from storage.redis import RedisStore
from storage.sqlite import SqliteStore
from strategies.records import SessionKey, StoredMessage, TurnWrite

TESTS = Path(__file__).resolve().parent.parent / "tests"
KEY = SessionKey("ns", "agent", "long-session")
WORDS = "memory window token budget summary tool result compress evict search store".split()


def text(rng: random.Random, index: int) -> str:
    words = [rng.choice(WORDS) for _ in range(50)]
    if index % 100 == 7:
        words.append("pelican")
    return " ".join(words)


def message(role: str, body: str) -> StoredMessage:
    fingerprint = hashlib.sha1(f"{role}:{body}".encode()).hexdigest()
    return StoredMessage(role=role, content=body, tokens=len(body) // 4, fingerprint=fingerprint)  # type: ignore[arg-type]


async def timed(store: Store, words: list[str]) -> float:
    start = time.perf_counter()
    found = await store.search_messages(KEY, words, limit=5)
    assert found, "nothing found"
    return (time.perf_counter() - start) * 1000


async def measure(store: Store, messages: int, repeats: int) -> dict[str, float]:
    rng = random.Random(7)
    for i in range(0, messages, 2):
        await store.append_turn(KEY, TurnWrite([message("user", text(rng, i)),
                                                message("assistant", text(rng, i + 1))]))
    first = await timed(store, ["pelican"])
    again = [await timed(store, ["pelican", "budget"]) for _ in range(repeats)]
    await store.append_turn(KEY, TurnWrite([message("user", "one pelican more")]))
    after_append = await timed(store, ["pelican"])
    return {"first_ms": first, "median_ms": statistics.median(again),
            "after_append_ms": after_append}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--backend", choices=["sqlite", "redis", "both"], default="both")
    args = parser.parse_args()
    backends = ["sqlite", "redis"] if args.backend == "both" else [args.backend]
    print(f"search_messages on one session of {args.messages} messages (wall ms)")
    print(f"{'backend':8} {'first':>8} {'median':>8} {'after append':>13}")
    for backend in backends:
        with tempfile.TemporaryDirectory() as directory:
            if backend == "sqlite":
                store: Store = SqliteStore(f"sqlite:///{directory}/search.db")
                server = None
            else:
                sys.path.insert(0, str(TESTS))
                from redis_server import RedisServer

                server = RedisServer().start()
                store = RedisStore(server.url)
            await store.open()
            try:
                out = await measure(store, args.messages, args.repeats)
            finally:
                await store.close()
                if server is not None:
                    server.stop()
        print(f"{backend:8} {out['first_ms']:8.1f} {out['median_ms']:8.2f} "
              f"{out['after_append_ms']:13.2f}")


if __name__ == "__main__":
    asyncio.run(main())
