"""A cold turn on a long session, alone: the first delta turn on sessions of 10,000 stored
messages that the proxy's session cache does not hold, with the default strategy
(summarizing_window pages the history until its budget is full).

``bench/run.py`` measures this as one row of *Per-turn cost against stored history*; here
it is measured by itself, split by the turn's steps, and side by side with another
checkout. Two ways, each in fresh child processes:

*in process* (the default): the app (``create_app``, its lifespan) runs in the child and
is driven through ``httpx.ASGITransport`` against the benchmark's upstream
(``bench/instant_upstream.py``, a process of its own). CPU per cold turn is the child's
``time.process_time`` (the store's thread included, the client's own share too) and is
split by step: every step of ``proxy/turn/pipeline.py`` and the store calls under the
session cache are wrapped in a timer (CPU time, both threads, while the step ran).
``--profile`` adds cProfile's top functions of the event loop's thread.

*server* (``--server``): ``memory-proxy serve`` on its own CPU, the turns sent by this
process over HTTP; CPU per cold turn is the server's (``/proc/PID/task/*/schedstat``), as
``bench/run.py`` measures it.

Every child reads a copy of the same populated SQLite database (Redis: the sessions are
written again before each child), so each impl meets the same histories; the upstream
request bodies are hashed (after the timed turns) and compared across impls: the window
the proxy sends must be the same.

    python bench/cold_turn.py                          # this checkout, SQLite
    python bench/cold_turn.py --baseline DIR           # side by side with DIR's packages
    python bench/cold_turn.py --backend both --server --baseline DIR --repeats 5

``--baseline DIR``: a directory holding another copy of the ``proxy``, ``strategies`` and
``storage`` packages (a worktree of an earlier commit), put ahead of this repository on
the children's ``sys.path``. Runs alternate between the impls; the numbers printed are
medians over the repeats (the best repeat beside them).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import functools
import gc
import hashlib
import http.client
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
TESTS = ROOT / "tests"

# the steps of proxy/turn/pipeline.py a turn is split into, as the module names them
STEPS = ("identify_turn", "incoming", "load", "sync", "select", "render", "finish")
STORE_CALLS = ("load", "get_range", "append_turn")


def _import_path(impl: str | None) -> None:
    for path in (str(HERE), str(ROOT)):
        if path not in sys.path:
            sys.path.insert(0, path)
    if impl:
        sys.path.insert(0, str(Path(impl).resolve()))


# ----------------------------------------------------------------------------- children


class Clock:
    """CPU time (every thread of this process) spent inside the wrapped calls, by name."""

    def __init__(self) -> None:
        self.spent: collections.Counter[str] = collections.Counter()
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


async def _turn(client: Any, session: str, body: bytes) -> None:
    import populate

    response = await client.post(
        f"/agents/{populate.DEFAULT_AGENT}/sessions/{session}/v1/chat/completions", content=body
    )
    if response.status_code != 200:
        raise RuntimeError(f"turn failed: {response.status_code} {response.text[:300]}")


def request_body() -> bytes:
    import orjson
    import populate

    return orjson.dumps({"model": populate.MODEL,
                         "messages": [{"role": "user", "content": "What should we check first?"}]})


def _digest(bodies: list[dict[str, Any]]) -> str:
    import orjson

    digest = hashlib.sha256()
    for body in bodies:
        digest.update(orjson.dumps(body, option=orjson.OPT_SORT_KEYS))
    return digest.hexdigest()[:16]


async def measure_in_process(
    url: str, upstream: str, agents: Path, sessions: list[str], profile: bool
) -> dict[str, Any]:
    """Cold turns on ``sessions[1:]`` (the first one warms the process up, untimed)."""
    import httpx
    import populate

    from proxy.http.app import create_app
    from proxy.settings import Settings
    from storage.registry import open_store

    clock = Clock()
    settings = Settings(store_url=url, upstream_url=upstream, agents_dir=agents,
                        log_level="warning")
    app = create_app(settings, store=TimedStore(open_store(url), clock))
    services = app.state.services
    bodies: list[dict[str, Any]] = []
    chat = services.upstream.chat

    async def recorded_chat(request: Any) -> Any:
        bodies.append(request.body)  # hashed after the timed turns
        return await chat(request)

    services.upstream.chat = recorded_chat
    body = request_body()
    headers = {"Authorization": f"Bearer {populate.API_KEY}",
               "Content-Type": "application/json"}
    profiler = None
    async with app.router.lifespan_context(app), httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://proxy", headers=headers,
        timeout=60,
    ) as client:
        await _turn(client, sessions[0], body)
        await services.drain()
        bodies.clear()
        clock.spent.clear()
        clock.calls.clear()
        per_turn = []
        if profile:
            import cProfile

            profiler = cProfile.Profile()
            store_profiler = cProfile.Profile()
        with timed_steps(clock), timed_store_jobs(clock), \
                profiled_store_jobs(store_profiler if profile else None):
            for session in sessions[1:]:
                gc.collect()
                if profiler is not None:
                    profiler.enable()
                started = time.process_time()
                await _turn(client, session, body)
                await services.drain()
                per_turn.append(time.process_time() - started)
                if profiler is not None:
                    profiler.disable()
    turns = len(per_turn)
    steps = {name: clock.spent[name] / turns * 1e3 for name in (*STEPS, *(
        f"store.{call}" for call in STORE_CALLS), *STORE_JOBS.values())}
    out: dict[str, Any] = {
        "turns": turns,
        "cpu_ms": statistics.mean(per_turn) * 1e3,
        "cpu_p50_ms": statistics.median(per_turn) * 1e3,
        "steps_ms": steps,
        "store_calls": {f"store.{c}": clock.calls[f"store.{c}"] / turns for c in STORE_CALLS},
        "window_messages": statistics.mean(len(b["messages"]) for b in bodies),
        "bodies": _digest(bodies),
    }
    if profiler is not None:
        out["profile"] = _top(profiler, turns)
        out["store_profile"] = _top(store_profiler, turns, 25)
    return out


# SQLite's jobs for the store calls above, timed on the store's thread (thread_time)
STORE_JOBS = {"load": "sqlite.load", "get_range": "sqlite.get_range", "append": "sqlite.append"}


@contextlib.contextmanager
def timed_store_jobs(clock: Clock) -> Iterator[None]:
    """The CPU of SQLite's turn jobs on the store's thread alone (nothing for Redis): what
    the store calls cost besides the hop to the thread and back."""
    try:
        from storage import sqlite_turns
    except ImportError:
        yield
        return
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

    saved = {name: getattr(sqlite_turns, name) for name in ("load", "get_range", "append")}
    for name, function in saved.items():
        setattr(sqlite_turns, name, functools.partial(profiler.runcall, function))
    try:
        yield
    finally:
        for name, function in saved.items():
            setattr(sqlite_turns, name, function)


def _top(profiler: Any, turns: int, count: int = 70) -> list[tuple[str, float, float, float]]:
    """cProfile's heaviest functions: name, calls, own and cumulative ms per turn."""
    import pstats

    stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    rows = []
    for (path, line, name), (_, calls, own, cumulative, _) in stats.items():
        where = f"{Path(path).parent.name}/{Path(path).name}:{line}({name})"
        rows.append((where, calls / turns, own / turns * 1e3, cumulative / turns * 1e3))
    rows.sort(key=lambda row: row[2], reverse=True)
    return rows[:count]


def measure_server(
    impl: str | None, url: str, upstream: str, agents: Path, sessions: list[str],
    cpus: str | None,
) -> dict[str, Any]:
    """Cold turns through ``memory-proxy serve`` (``impl``'s packages first on its path)."""
    import populate
    import servers

    env = {"PYTHONPATH": os.pathsep.join([*([str(Path(impl).resolve())] if impl else []),
                                          str(ROOT)])}
    server = servers.memory_proxy("cold-turn", upstream, url, agents, cpus, env=env)
    body = request_body()
    headers = {"Authorization": f"Bearer {populate.API_KEY}",
               "Content-Type": "application/json"}
    with server:
        conn = http.client.HTTPConnection(servers.LOOPBACK, server.port, timeout=60)

        def turn(session: str) -> None:
            conn.request("POST", f"/agents/{populate.DEFAULT_AGENT}/sessions/{session}"
                         "/v1/chat/completions", body=body, headers=headers)
            response = conn.getresponse()
            data = response.read()
            if response.status != 200:
                raise RuntimeError(f"turn failed: {response.status} {data[:300]!r}")

        turn(sessions[0])
        time.sleep(0.2)
        per_turn, walls = [], []
        for session in sessions[1:]:
            cpu, began = server.cpu_seconds(), time.perf_counter()
            turn(session)
            walls.append(time.perf_counter() - began)
            time.sleep(0.05)  # anything the turn left running in the background finishes
            per_turn.append(server.cpu_seconds() - cpu)
        conn.close()
    return {"turns": len(per_turn), "cpu_ms": statistics.mean(per_turn) * 1e3,
            "cpu_p50_ms": statistics.median(per_turn) * 1e3,
            "wall_p50_ms": statistics.median(walls) * 1e3}


def child(args: argparse.Namespace) -> None:
    _import_path(args.impl)
    import proxy

    if args.loop == "uvloop":
        import uvloop

        uvloop.install()
    sessions = json.loads(args.sessions_json)
    if args.server:
        out = measure_server(args.impl, args.url, args.upstream, Path(args.agents), sessions,
                             args.cpus)
    else:
        if args.cpus:
            os.sched_setaffinity(0, {int(c) for c in args.cpus.split(",")})
        out = asyncio.run(measure_in_process(args.url, args.upstream, Path(args.agents),
                                             sessions, args.profile))
    out["proxy"] = str(Path(proxy.__file__).resolve().parent.parent)
    print(json.dumps(out))


# ------------------------------------------------------------------------------- parent


def populate_sessions(url: str, sessions: list[str], stored: int) -> None:
    _import_path(None)
    import populate

    asyncio.run(populate.populate(url, populate.DEFAULT_AGENT, sessions, stored))


def run_child(args: argparse.Namespace, impl: str | None, url: str, upstream: str,
              agents: Path, sessions: list[str]) -> dict[str, Any]:
    command = [sys.executable, __file__, "--child", "--url", url, "--upstream", upstream,
               "--agents", str(agents), "--sessions-json", json.dumps(sessions),
               "--loop", args.loop]
    if impl:
        command += ["--impl", impl]
    if args.server:
        command.append("--server")
    if args.profile:
        command.append("--profile")
    if args.cpus:
        command += ["--cpus", args.cpus]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"child failed:\n{done.stderr[-3000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def report(args: argparse.Namespace, results: dict[tuple[str, str], list[dict[str, Any]]],
           backends: list[str], impls: list[tuple[str, str | None]]) -> None:
    how = "server CPU (schedstat)" if args.server else "process CPU (in process, httpx client)"
    print(f"\nCOLD TURN: {args.stored:,} stored messages, default strategy, "
          f"{args.sessions} cold turns per run, {args.repeats} runs per impl; {how}")
    print(f"{'backend':8} {'impl':9} {'cpu/turn':>9} {'best':>7} {'p50 turn':>9} "
          f"{'window':>7} {'rt/turn':>7}  bodies")
    for backend in backends:
        for name, _ in impls:
            runs = results[(backend, name)]
            cpu = [r["cpu_ms"] for r in runs]
            trips = sum(runs[0].get("store_calls", {}).values())
            print(f"{backend:8} {name:9} {statistics.median(cpu):9.2f} {min(cpu):7.2f} "
                  f"{statistics.median(r['cpu_p50_ms'] for r in runs):9.2f} "
                  f"{runs[0].get('window_messages', 0):7.0f} {trips:7.2f}  "
                  f"{','.join(sorted({r.get('bodies', '-') for r in runs}))}")
        if len(impls) == 2:
            old = statistics.median(r["cpu_ms"] for r in results[(backend, impls[0][0])])
            new = statistics.median(r["cpu_ms"] for r in results[(backend, impls[1][0])])
            print(f"{backend}: current {new:.2f} ms vs baseline {old:.2f} ms "
                  f"({new / old:.2f}x)")
    if args.server:
        return
    print("\nCPU ms per cold turn by step (medians over the runs; store.* are inside load "
          "and finish)")
    columns = [(backend, name) for backend in backends for name, _ in impls]
    print(f"{'step':18}" + "".join(f"{f'{b}/{n}':>18}" for b, n in columns))
    steps = list(results[columns[0]][0]["steps_ms"])
    for step in steps:
        cells = [statistics.median(r["steps_ms"][step] for r in results[c]) for c in columns]
        print(f"{step:18}" + "".join(f"{cell:18.3f}" for cell in cells))
    rest = [statistics.median(r["cpu_ms"] - sum(r["steps_ms"][s] for s in STEPS)
                              for r in results[c]) for c in columns]
    print(f"{'(http, forward)':18}" + "".join(f"{cell:18.3f}" for cell in rest))
    for column in columns:
        for part in ("profile", "store_profile"):
            profile = results[column][0].get(part)
            if profile:
                print(f"\ncProfile ({'the store thread' if part != 'profile' else 'the loop'}"
                      f"), {column[0]}/{column[1]}, first run: own ms, cumulative ms, calls "
                      "per turn")
                for where, calls, own, cumulative in profile:
                    print(f"  {own:7.3f} {cumulative:7.3f} {calls:8.0f}  {where}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=["sqlite", "redis", "both"], default="sqlite")
    parser.add_argument("--sessions", type=int, default=20, help="cold turns per run")
    parser.add_argument("--stored", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--baseline", help="a directory holding another proxy/, strategies/"
                        " and storage/")
    parser.add_argument("--server", action="store_true",
                        help="measure memory-proxy serve's CPU instead of running in process")
    parser.add_argument("--profile", action="store_true", help="cProfile the timed turns")
    parser.add_argument("--cpus", help="pin the measured process to these CPUs (e.g. 1)")
    parser.add_argument("--loop", choices=["asyncio", "uvloop"], default="uvloop")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--impl", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--upstream", help=argparse.SUPPRESS)
    parser.add_argument("--agents", help=argparse.SUPPRESS)
    parser.add_argument("--sessions-json", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return

    _import_path(None)
    import populate
    import servers

    sys.path.append(str(TESTS))  # after bench/: tests/ has a servers module of its own
    from redis_server import RedisServer, flush_redis

    backends = ["sqlite", "redis"] if args.backend == "both" else [args.backend]
    impls: list[tuple[str, str | None]] = [("current", None)]
    if args.baseline:
        impls.insert(0, ("baseline", args.baseline))
    sessions = populate.session_ids(f"cold-{os.urandom(3).hex()}", args.sessions + 1)
    results: dict[tuple[str, str], list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="cold-turn-") as tmp, \
            servers.instant_upstream(None) as upstream:
        agents = populate.write_agents(Path(tmp) / "agents")
        redis = RedisServer().start() if "redis" in backends else None
        try:
            template = Path(tmp) / "template.db"
            if "sqlite" in backends:
                began = time.perf_counter()
                populate_sessions(f"sqlite:///{template}", sessions, args.stored)
                print(f"populated {len(sessions)} sessions of {args.stored:,} in "
                      f"{time.perf_counter() - began:.1f} s", file=sys.stderr)
            for repeat in range(args.repeats):
                for backend in backends:
                    for name, impl in impls:
                        if backend == "sqlite":
                            copy = Path(tmp) / "run.db"
                            for suffix in ("", "-wal", "-shm"):
                                Path(f"{copy}{suffix}").unlink(missing_ok=True)
                            for suffix in ("", "-wal"):
                                if Path(f"{template}{suffix}").exists():
                                    shutil.copyfile(f"{template}{suffix}", f"{copy}{suffix}")
                            url = f"sqlite:///{copy}"
                        else:
                            assert redis is not None
                            url = redis.url
                            flush_redis(url)
                            populate_sessions(url, sessions, args.stored)
                        out = run_child(args, impl, url, upstream.url, agents, sessions)
                        results.setdefault((backend, name), []).append(out)
                        print(f"run {repeat + 1} {backend} {name}: {out['cpu_ms']:.2f} ms "
                              f"({out['proxy']})", file=sys.stderr)
        finally:
            if redis is not None:
                redis.close()
    report(args, results, backends, impls)


if __name__ == "__main__":
    main()
