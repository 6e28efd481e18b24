"""The app side of ``bench/cold_turn.py``: one checkout's app in this process, cold turns
on the sessions the parent names, each turn's CPU split by step.

The app (``create_app`` with its lifespan) runs as ``memory-proxy serve`` tunes it (the
GC; the session cache bench/run.py gives its servers), driven through
``httpx.ASGITransport`` against the benchmark's upstream. CPU per turn is this process's
``time.process_time`` (the store's thread included, the client's own share too), split
by step: every step of ``proxy/turn/pipeline.py``, the store calls under the session
cache, SQLite's jobs on the store's thread and the upstream call are wrapped in timers.
The upstream request bodies are kept and hashed after the timed turns.

    python bench/cold_turn_app.py --url URL --upstream URL --agents DIR [--impl DIR]

reads ``untimed SESSION``, ``turn SESSION`` and ``done`` lines on stdin and answers each
with a JSON line (see ``serve_turns``).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import functools
import hashlib
import json
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

# the steps of proxy/turn/pipeline.py a turn is split into, as the module names them
STEPS = ("identify_turn", "incoming", "load", "sync", "select", "render", "finish")
STORE_CALLS = ("load", "get_range", "append_turn")
# the session cache bench/run.py runs its servers with (MEMORY_PROXY_SESSION_CACHE_MB)
CACHE_MB = 256
# SQLite's jobs for those calls, timed on the store's thread (thread_time)
STORE_JOBS = {"load": "sqlite.load", "get_range": "sqlite.get_range", "append": "sqlite.append"}


def import_path(impl: str | None) -> None:
    """bench/ and the repository on ``sys.path``, ``impl`` (another checkout) first."""
    for path in (str(HERE), str(ROOT)):
        if path not in sys.path:
            sys.path.insert(0, path)
    if impl:
        sys.path.insert(0, str(Path(impl).resolve()))


class Clock:
    """CPU time (every thread of this process) spent inside the wrapped calls, by name."""

    def __init__(self) -> None:
        self.spent: collections.defaultdict[str, float] = collections.defaultdict(float)
        self.calls: collections.Counter[str] = collections.Counter()

    def wrap_async(self, name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        async def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.process_time()
            try:
                return await function(*args, **kwargs)
            finally:
                self.spent[name] += time.process_time() - started
                self.calls[name] += 1

        return timed

    def wrap(self, name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.process_time()
            try:
                return function(*args, **kwargs)
            finally:
                self.spent[name] += time.process_time() - started
                self.calls[name] += 1

        return timed


class TimedStore:
    """The raw store under the session cache: its turn calls timed (one round trip each)."""

    def __init__(self, inner: Any, clock: Clock) -> None:
        self._inner = inner
        self._clock = clock

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._inner, name)
        if name in STORE_CALLS:
            return self._clock.wrap_async(f"store.{name}", target)
        return target


@contextlib.contextmanager
def timed_steps(clock: Clock) -> Iterator[None]:
    """Every step of the pipeline timed while inside (the names ``serve`` calls)."""
    from proxy.turn import pipeline

    saved = {name: getattr(pipeline, name) for name in STEPS if hasattr(pipeline, name)}
    for name, function in saved.items():
        wrap = clock.wrap_async if asyncio.iscoroutinefunction(function) else clock.wrap
        setattr(pipeline, name, wrap(name, function))
    try:
        yield
    finally:
        for name, function in saved.items():
            setattr(pipeline, name, function)


@contextlib.contextmanager
def timed_store_jobs(clock: Clock) -> Iterator[None]:
    """The CPU of SQLite's turn jobs on the store's thread alone (nothing for Redis): what
    the store calls cost besides the hop to the thread and back."""
    from storage import sqlite_turns

    saved = {name: getattr(sqlite_turns, name) for name in STORE_JOBS}

    def timed(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def job(*args: Any) -> Any:
            started = time.thread_time()
            try:
                return function(*args)
            finally:
                clock.spent[STORE_JOBS[name]] += time.thread_time() - started

        return job

    for name, function in saved.items():
        setattr(sqlite_turns, name, timed(name, function))
    try:
        yield
    finally:
        for name, function in saved.items():
            setattr(sqlite_turns, name, function)


@contextlib.contextmanager
def profiled_store_jobs(profiler: Any) -> Iterator[None]:
    """SQLite's turn jobs (on the store's thread, which the loop's profiler does not see)
    run under ``profiler`` while inside."""
    if profiler is None:
        yield
        return
    from storage import sqlite_turns

    saved = {name: getattr(sqlite_turns, name) for name in STORE_JOBS}
    for name, function in saved.items():
        setattr(sqlite_turns, name, functools.partial(profiler.runcall, function))
    try:
        yield
    finally:
        for name, function in saved.items():
            setattr(sqlite_turns, name, function)


def request_body() -> bytes:
    import orjson
    import populate

    return orjson.dumps({"model": populate.MODEL,
                         "messages": [{"role": "user", "content": "What should we check first?"}]})


def turn_path(session: str) -> str:
    import populate

    return f"/agents/{populate.DEFAULT_AGENT}/sessions/{session}/v1/chat/completions"


def _digest(bodies: list[dict[str, Any]]) -> str:
    import orjson

    digest = hashlib.sha256()
    for body in bodies:
        digest.update(orjson.dumps(body, option=orjson.OPT_SORT_KEYS))
    return digest.hexdigest()[:16]


async def serve_turns(url: str, upstream: str, agents: Path, profile: bool) -> None:
    """The app in this process, turns on the sessions the parent names on stdin:
    ``untimed SESSION`` (the process's first turn), ``turn SESSION`` (answers its CPU, its
    steps, its store calls and the messages it sent as a JSON line), ``done`` (answers the
    bodies' digest and the profiles, and ends)."""
    import httpx
    import populate

    from proxy.http.app import create_app
    from proxy.settings import Settings
    from storage.registry import open_store

    clock = Clock()
    # as `memory-proxy serve` runs (start-up frozen out of the GC's sight, fewer young
    # collections; the turns' own collections are part of their cost), with the session
    # cache bench/run.py gives it (no session is evicted over the run)
    settings = Settings(store_url=url, upstream_url=upstream, agents_dir=agents,
                        log_level="warning", tune_gc=True, session_cache_mb=CACHE_MB)
    app = create_app(settings, store=TimedStore(open_store(url), clock))
    services = app.state.services
    bodies: list[dict[str, Any]] = []
    chat = services.upstream.chat

    async def recorded_chat(request: Any) -> Any:
        bodies.append(request.body)  # hashed after the timed turns
        return await chat(request)

    services.upstream.chat = clock.wrap_async("upstream.chat", recorded_chat)
    body = request_body()
    headers = {"Authorization": f"Bearer {populate.API_KEY}",
               "Content-Type": "application/json"}
    loop_profiler = store_profiler = None
    if profile:
        import cProfile

        loop_profiler, store_profiler = cProfile.Profile(), cProfile.Profile()
    turns = 0
    async with app.router.lifespan_context(app), httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://proxy", headers=headers,
        timeout=60,
    ) as client:

        async def turn(session: str) -> None:
            response = await client.post(turn_path(session), content=body)
            if response.status_code != 200:
                raise RuntimeError(f"turn failed: {response.status_code} {response.text[:300]}")
            await services.drain()

        with timed_steps(clock), timed_store_jobs(clock), \
                profiled_store_jobs(store_profiler):
            for line in sys.stdin:
                command, _, session = line.strip().partition(" ")
                if command == "done":
                    break
                if command == "untimed":
                    await turn(session)
                    bodies.clear()
                    print("{}", flush=True)
                    continue
                clock.spent.clear()
                clock.calls.clear()
                if loop_profiler is not None:
                    loop_profiler.enable()
                started = time.process_time()
                await turn(session)
                cpu = time.process_time() - started
                if loop_profiler is not None:
                    loop_profiler.disable()
                turns += 1
                print(json.dumps({
                    "cpu_ms": cpu * 1e3,
                    "steps_ms": {k: v * 1e3 for k, v in clock.spent.items()},
                    "store_calls": sum(clock.calls[f"store.{c}"] for c in STORE_CALLS),
                    "sent": len(bodies[-1]["messages"]),
                }), flush=True)
    out: dict[str, Any] = {"bodies": _digest(bodies)}
    if loop_profiler is not None and store_profiler is not None:
        out["profile"] = _top(loop_profiler, turns)
        out["store_profile"] = _top(store_profiler, turns, 25)
    print(json.dumps(out), flush=True)


def _top(profiler: Any, turns: int, count: int = 50) -> list[tuple[str, float, float, float]]:
    """cProfile's heaviest functions: name, calls, own and cumulative ms per turn."""
    import pstats

    stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    rows = []
    for (path, line, name), (_, calls, own, cumulative, _) in stats.items():
        where = f"{Path(path).parent.name}/{Path(path).name}:{line}({name})"
        rows.append((where, calls / max(turns, 1), own / max(turns, 1) * 1e3,
                     cumulative / max(turns, 1) * 1e3))
    rows.sort(key=lambda row: row[2], reverse=True)
    return rows[:count]


def child(args: argparse.Namespace) -> None:
    import_path(args.impl)
    import proxy

    print(json.dumps({"proxy": str(Path(proxy.__file__).resolve().parent.parent)}), flush=True)
    if args.loop == "uvloop":
        import uvloop

        uvloop.install()
    asyncio.run(serve_turns(args.url, args.upstream, Path(args.agents), args.profile))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--impl", help="a directory holding the checkout to run")
    parser.add_argument("--url", required=True)
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--agents", required=True)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--loop", choices=["asyncio", "uvloop"], default="uvloop")
    child(parser.parse_args())


if __name__ == "__main__":
    main()
