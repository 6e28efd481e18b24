"""A turn's load of a session another worker grew since this one held it, in process.

Two workers (or replicas) serving one session alternate: each turn finds the session one
turn (two messages) past the version its cache holds. Before the cache could catch up,
such a load read the whole page again; now it passes the cached head (``known_head``)
and reads only the messages after it. This times both loads on each backend, side by
side in one process: CPU microseconds per load (``time.process_time``; Redis's own CPU is
not counted), for sessions of 20 and 100 stored messages.

    python bench/catch_up.py
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

import _paths  # noqa: F401  (the repository root on sys.path)

HERE = Path(__file__).resolve().parent


async def measure(url: str, stored: int, sessions: int, rounds: int) -> dict[str, float]:
    from populate import history

    from storage.registry import open_store
    from strategies.records import LoadSpec, SessionKey, TurnWrite

    store = open_store(url)
    await store.open()
    spec = LoadSpec()
    keys = [SessionKey("ns-bench", "bench", f"catch-up-{stored}-{i}") for i in range(sessions)]
    messages = history(stored + 2 * rounds)
    for key in keys:
        for start in range(0, stored, 2):
            await store.append_turn(key, TurnWrite(messages=messages[start : start + 2]))
    cpu = {"whole": 0.0, "caught_up": 0.0}
    for round_ in range(rounds):
        held = {}
        for key in keys:
            meta = (await store.load(key, spec)).meta
            held[key] = (meta.version, meta.head_seq)
        turn = messages[stored + 2 * round_ : stored + 2 * round_ + 2]
        for key in keys:  # the other worker's turn
            await store.append_turn(key, TurnWrite(messages=list(turn)))
        for mode in cpu:
            began = time.process_time()
            for key in keys:
                version, head = held[key]
                if mode == "whole":
                    snapshot = await store.load(key, spec, known_version=version)
                    assert not snapshot.grown
                else:
                    snapshot = await store.load(
                        key, spec, known_version=version, known_head=head
                    )
                    assert snapshot.grown and len(snapshot.messages) == 2
            cpu[mode] += time.process_time() - began
    await store.close()
    return {mode: 1e6 * seconds / (sessions * rounds) for mode, seconds in cpu.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    sys.path.insert(0, str(HERE.parent / "tests"))
    from redis_server import RedisServer

    redis = RedisServer().start()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            print("backend  stored  read whole  caught up  (CPU us per load)")
            for stored in (20, 100):
                for backend, url in (("sqlite", f"sqlite:///{tmp}/catch-up.db"),
                                     ("redis", redis.url)):  # fmt: skip
                    result = asyncio.run(measure(url, stored, args.sessions, args.rounds))
                    print(f"{backend:7s}  {stored:6d}  {result['whole']:10.0f}"
                          f"  {result['caught_up']:9.0f}")  # fmt: skip
    finally:
        redis.stop()


if __name__ == "__main__":
    main()
