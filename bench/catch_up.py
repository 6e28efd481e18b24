"""Turns of a session another worker grew since this one held it, in process.

Two workers (or replicas) serving one session alternate: each turn finds the session one
turn (two messages) past the version its cache holds.

*The load.* Before the cache could catch up, such a load read the whole page again; now it
passes the cached head (``known_head``) and reads only the messages after it. This times
both loads on each backend, side by side in one process: CPU microseconds per load
(``time.process_time``; Redis's own CPU is not counted), for sessions of 20 and 100 stored
messages.

*The whole turn.* Two apps (``create_app``, requests through ``httpx.ASGITransport``)
share one Redis and a fake upstream; a session's turns all go to one app, or alternate
between the two. CPU microseconds per turn of each, in interleaved rounds, for sessions of
20 and 300 stored messages: what a turn that catches up costs beyond one that finds its
session as this worker left it (the strategy extends the window this worker chose for its
own last turn over the other's messages, instead of choosing anew).

    python bench/catch_up.py
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
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


async def measure_turns(
    redis_url: str, upstream: str, stored: int, sessions: int, rounds: int
) -> dict[str, float]:
    import httpx
    import orjson
    import populate

    from proxy.http.app import create_app
    from proxy.settings import Settings

    agents = populate.write_agents(HERE / "out" / "agents")
    ids = {mode: [f"turns-{mode}-{stored}-{i}" for i in range(sessions)] for mode in ("one", "two")}
    for names in ids.values():
        await populate.populate(redis_url, populate.DEFAULT_AGENT, names, stored)
    settings = Settings(store_url=redis_url, upstream_url=upstream, agents_dir=agents,
                        log_level="warning", session_cache_mb=1024)
    apps = [create_app(settings) for _ in range(2)]
    body = orjson.dumps({"model": populate.MODEL,
                         "messages": [{"role": "user", "content": "What should we check?"}]})
    headers = {"Authorization": f"Bearer {populate.API_KEY}"}
    async with apps[0].router.lifespan_context(apps[0]), \
            apps[1].router.lifespan_context(apps[1]):  # fmt: skip
        clients = [httpx.AsyncClient(transport=httpx.ASGITransport(app=app), headers=headers,
                                     base_url="http://proxy") for app in apps]

        async def turn(worker: int, session: str) -> None:
            path = f"/agents/{populate.DEFAULT_AGENT}/sessions/{session}/v1/chat/completions"
            response = await clients[worker].post(path, content=body)
            if response.status_code != 200:
                raise RuntimeError(f"turn failed: {response.status_code} {response.text}")
            await apps[worker].state.services.drain()

        for names in ids.values():  # both workers hold every session
            for session in names:
                await turn(0, session)
                await turn(1, session)
        cpu: dict[str, list[float]] = {"one": [], "two": []}
        for round_ in range(rounds):
            for mode in ("one", "two") if round_ % 2 == 0 else ("two", "one"):
                began = time.process_time()
                for session in ids[mode]:
                    await turn(0 if mode == "one" else round_ % 2, session)
                cpu[mode].append(1e6 * (time.process_time() - began) / sessions)
        for client in clients:
            await client.aclose()
    return {mode: statistics.median(values) for mode, values in cpu.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--turn-sessions", type=int, default=100)
    parser.add_argument("--turn-rounds", type=int, default=10)
    args = parser.parse_args()
    sys.path.insert(0, str(HERE.parent / "tests"))
    from redis_server import RedisServer

    from proxy.testing.fake_upstream import FakeUpstream

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
        print()
        print("stored  one worker  two alternating  ratio  (Redis; CPU us per whole turn)")
        with FakeUpstream.running() as fake:
            for stored in (20, 300):
                turns = asyncio.run(measure_turns(
                    redis.url, fake.url, stored, args.turn_sessions, args.turn_rounds))
                print(f"{stored:6d}  {turns['one']:10.0f}  {turns['two']:15.0f}"
                      f"  {turns['two'] / turns['one']:5.2f}")
    finally:
        redis.stop()


if __name__ == "__main__":
    main()
