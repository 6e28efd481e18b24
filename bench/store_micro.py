"""The store's share of a turn: ``Store.load`` then ``Store.append_turn``, in process.

Every proxied turn makes these two store calls (``load_session`` and ``persist_turn``),
plus a range read when a paged window needs older messages. Two scenarios:

*warm*: a pool of sessions of ``--stored`` messages (100), each turn loads the session
the way the proxy does for a session it served before, then appends a user message and a
reply (with the model and calibration every turn writes). This checkout's proxy loads
through the session cache (``storage/cached.py``: the store answers with the head while
the version is unchanged); a baseline without it (an earlier commit) goes through its
own ``proxy/session_cache.py`` as its proxy did (``load(known_version=..., known_head=...)``,
``fill``, ``after_append``).

*cold*: one session of ``--cold-stored`` messages (10,000), each turn loads its page of
500 (``LoadSpec(limit=500)``, no cache: another process served it last) and appends.

Numbers are CPU microseconds per turn: ``time.process_time`` of this process and, for
Redis, the redis-server's CPU (from ``/proc/PID/task/*/schedstat``), best of several
repeats; and the store calls (round trips) per turn.

    python bench/store_micro.py                     # this checkout, both backends
    python bench/store_micro.py --baseline DIR      # side by side with DIR/storage
    python bench/store_micro.py --backend sqlite --cpu 1 --turns 20000 --baseline DIR
                                                    # stalls: the process on one CPU

Each turn's wall time is recorded too: the tail (p99, p99.9, max, turns over 2 ms) shows
the stalls the store's background work causes (SQLite's checkpoints), most visible with
``--cpu``, which pins the process (and so the store's thread) to one CPU as the benchmark
pins the server.

``--baseline`` runs each measurement in child processes, alternating: one with ``DIR``
ahead of the repository on ``sys.path`` (another copy of the ``storage`` package, e.g.
one exported from an earlier commit) and one without. One redis-server (started here, on
loopback) serves every run.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from servers import schedstat  # stdlib only: it does not touch sys.path

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent / "tests"
MODEL = "gpt-4o-mini"


def _import_path(impl: str | None) -> None:
    import _paths  # noqa: F401  (the repository root on sys.path)

    if impl:
        sys.path.insert(0, str(Path(impl).resolve()))


def _server_cpu_ns(pid: int | None) -> int:
    """CPU time of every thread of ``pid`` in nanoseconds (0 without a pid)."""
    return 0 if pid is None else schedstat(pid)[0]


class Counting:
    """A store whose calls are counted (each is one round trip)."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.calls = 0

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.store, name)
        if name in ("open", "close"):
            return method

        async def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return await method(*args, **kwargs)

        return counted


def _loader(store: Any) -> Any:
    """How this checkout's proxy loads a session it served before, as ``load(key, spec)``:
    through the session cache, or (a baseline without storage/cached.py) with the version
    its own cache held."""
    try:
        from storage.cached import CachedStore
    except ImportError:
        return None
    return CachedStore(store, 256 << 20)


async def _measure(
    url: str, server_pid: int | None, turns: int, sessions: int, prompt_chars: int = 0,
    stored_count: int = 100,
) -> dict[str, Any]:
    from populate import history

    from storage.registry import open_store
    from strategies.records import LoadSpec, SessionKey, StoredMessage, TurnWrite

    counting = Counting(open_store(url))
    await counting.open()
    store: Any = counting
    cached = _loader(store)
    old_cache: Any = None
    if cached is None:
        from proxy.session_cache import SessionCache  # the baseline's

        old_cache = SessionCache(256 << 20)
    spec = LoadSpec(limit=500, since="all")
    run = os.urandom(4).hex()
    keys = [SessionKey("ns-bench", "bench", f"s-{run}-{i}") for i in range(sessions)]
    versions: dict[SessionKey, int] = {}
    stored = history(stored_count)
    # the proxy writes the system prompt with the first turn and again only when it changes
    prompt = [{"role": "system", "content": ("You are a careful analyst. " * 400)[:prompt_chars]}]
    for key in keys:
        for start in range(0, len(stored), 4):
            write = TurnWrite(messages=stored[start : start + 4])
            if start == 0 and prompt_chars:
                write.system_prompt, write.system_tokens = prompt, prompt_chars // 4
            result = await store.append_turn(key, write)
        versions[key] = result.meta.version
    fresh = history(2 * (turns + 200), start=stored_count)

    def new(message: StoredMessage, **meta: str) -> StoredMessage:
        return StoredMessage(role=message.role, content=message.content, tokens=message.tokens,
                             fingerprint=message.fingerprint, created_at=time.time(), meta=meta)

    async def turn(index: int) -> None:
        key = keys[index % sessions]
        messages = [new(fresh[2 * index]), new(fresh[2 * index + 1], model=MODEL)]
        write = TurnWrite(messages=messages, model=MODEL, calibration=1.05)
        if cached is not None:
            snapshot = await cached.load(key, spec, probe=[])
            if len(snapshot.messages) < stored_count:
                raise AssertionError("the load did not return the session's page")
            await cached.append_turn(key, write)
            return
        # the baseline's proxy: its session cache's known version and head, its fill and
        # its after_append (proxy/turns.py load_session, proxy/persist.py)
        known = old_cache.known(key, spec)
        snapshot = await store.load(
            key, spec, probe=[], known_version=known.version if known else None,
            known_head=known.head_seq if known else None,
        )
        if not old_cache.fill(key, spec, snapshot, known) or len(snapshot.messages) < stored_count:
            raise AssertionError("the load did not return the session's page")
        result = await store.append_turn(key, write)
        for record, seq in zip(write.messages, result.seqs, strict=True):
            record.seq = seq
        old_cache.after_append(key, spec, snapshot, write.messages, write.compressed,
                               result.meta.version, result.meta.head_chain)

    for index in range(200):  # warm: script cache, statement cache, pages, the cache
        await turn(index)
    gc.collect()
    server_before, cpu_before, wall_before = (
        _server_cpu_ns(server_pid), time.process_time(), time.perf_counter()
    )
    sys_before = resource.getrusage(resource.RUSAGE_SELF).ru_stime
    calls_before = counting.calls
    durations = []
    for index in range(200, 200 + turns):
        began = time.perf_counter()
        await turn(index)
        durations.append(time.perf_counter() - began)
    cpu = time.process_time() - cpu_before
    system = resource.getrusage(resource.RUSAGE_SELF).ru_stime - sys_before
    wall = time.perf_counter() - wall_before
    server = (_server_cpu_ns(server_pid) - server_before) / 1e9
    calls = counting.calls - calls_before
    await counting.close()
    return {
        "client_us": cpu / turns * 1e6,
        "client_sys_us": system / turns * 1e6,
        "server_us": server / turns * 1e6 if server_pid else None,
        "wall_us": wall / turns * 1e6,
        "calls": calls / turns,
        **_tail(durations),
    }


async def _measure_cold(
    url: str, server_pid: int | None, turns: int, stored_count: int
) -> dict[str, Any]:
    """Turns on one session of ``stored_count`` messages, each loaded cold (no cache)."""
    from populate import history

    from storage.registry import open_store
    from strategies.records import LoadSpec, SessionKey, StoredMessage, TurnWrite

    counting = Counting(open_store(url))
    await counting.open()
    store: Any = counting
    key = SessionKey("ns-bench", "bench", f"cold-{os.urandom(4).hex()}")
    stored = history(stored_count)
    for start in range(0, stored_count, 500):
        await store.append_turn(key, TurnWrite(messages=stored[start : start + 500]))
    fresh = history(2 * (turns + 20), start=stored_count)
    spec = LoadSpec(limit=500, since="all")

    async def turn(index: int) -> float:
        began = time.perf_counter()
        snapshot = await store.load(key, spec, probe=[])
        loaded = time.perf_counter() - began
        if len(snapshot.messages) != 500:
            raise AssertionError("the page was not read")
        messages = [
            StoredMessage(role=m.role, content=m.content, tokens=m.tokens,
                          fingerprint=m.fingerprint, created_at=time.time())
            for m in fresh[2 * index : 2 * index + 2]
        ]  # fmt: skip
        await store.append_turn(key, TurnWrite(messages=messages, model=MODEL))
        return loaded

    for index in range(20):
        await turn(index)
    gc.collect()
    server_before, cpu_before = _server_cpu_ns(server_pid), time.process_time()
    calls_before = counting.calls
    durations, loads = [], []
    for index in range(20, 20 + turns):
        began = time.perf_counter()
        loads.append(await turn(index))
        durations.append(time.perf_counter() - began)
    cpu = time.process_time() - cpu_before
    server = (_server_cpu_ns(server_pid) - server_before) / 1e9
    calls = counting.calls - calls_before
    await counting.close()
    return {
        "client_us": cpu / turns * 1e6,
        "client_sys_us": 0.0,
        "server_us": server / turns * 1e6 if server_pid else None,
        "wall_us": statistics.median(durations) * 1e6,
        "load_wall_us": statistics.median(loads) * 1e6,
        "calls": calls / turns,
        **_tail(durations),
    }


def _tail(durations: list[float]) -> dict[str, float]:
    """Percentiles of the turns' wall times in microseconds, and the turns over 2 ms."""
    ordered = sorted(durations)
    last = len(ordered) - 1
    return {
        "p50_us": ordered[last // 2] * 1e6,
        "p99_us": ordered[round(last * 0.99)] * 1e6,
        "p999_us": ordered[round(last * 0.999)] * 1e6,
        "max_us": ordered[-1] * 1e6,
        "over_2ms": sum(1 for d in ordered if d > 0.002),
    }


def child(args: argparse.Namespace) -> None:
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})  # threads started from now on inherit it
    _import_path(args.impl)
    sys.path.insert(0, str(HERE))
    import storage

    if args.loop == "uvloop":
        import uvloop

        uvloop.install()
    with tempfile.TemporaryDirectory(prefix="store-micro-") as tmp:
        url = args.url or f"sqlite:///{tmp}/store.db"
        if args.scenario == "cold":
            out = asyncio.run(
                _measure_cold(url, args.server_pid, args.cold_turns, args.cold_stored)
            )
        else:
            out = asyncio.run(_measure(
                url, args.server_pid, args.turns, args.sessions, args.system_prompt_chars,
                args.stored,
            ))  # fmt: skip
    out["storage"] = str(Path(storage.__file__).resolve().parent)
    print(json.dumps(out))


def _run_child(
    impl: str | None,
    url: str | None,
    server_pid: int | None,
    args: argparse.Namespace,
    scenario: str,
) -> dict[str, Any]:
    command = [sys.executable, __file__, "--child", "--turns", str(args.turns),
               "--sessions", str(args.sessions), "--loop", args.loop,
               "--system-prompt-chars", str(args.system_prompt_chars),
               "--scenario", scenario, "--stored", str(args.stored),
               "--cold-stored", str(args.cold_stored),
               "--cold-turns", str(args.cold_turns)]  # fmt: skip
    if args.cpu is not None:
        command += ["--cpu", str(args.cpu)]
    if impl:
        command += ["--impl", impl]
    if url:
        command += ["--url", url]
    if server_pid:
        command += ["--server-pid", str(server_pid)]
    done = subprocess.run(command, check=True, capture_output=True, text=True)
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=3000)
    parser.add_argument("--sessions", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--system-prompt-chars", type=int, default=0,
        help="give every session a stored system prompt of this many characters",
    )
    parser.add_argument("--backend", choices=["sqlite", "redis", "both"], default="both")
    parser.add_argument("--scenario", choices=["warm", "cold", "both"], default="both")
    parser.add_argument("--stored", type=int, default=100,
                        help="messages of each session of the warm scenario")
    parser.add_argument("--cold-stored", type=int, default=10_000,
                        help="messages of the session of the cold scenario")
    parser.add_argument("--cold-turns", type=int, default=200)
    parser.add_argument(
        "--loop", choices=["asyncio", "uvloop"], default="uvloop",
        help="event loop (memory-proxy serve runs on uvloop when it is installed)",
    )
    parser.add_argument("--baseline", help="a directory holding another storage/ package")
    parser.add_argument("--cpu", type=int, help="pin each measured process to this CPU")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--impl", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--server-pid", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return

    sys.path.insert(0, str(TESTS))
    from redis_server import RedisServer, flush_redis

    backends = ["sqlite", "redis"] if args.backend == "both" else [args.backend]
    impls: list[tuple[str, str | None]] = [("current", None)]
    if args.baseline:
        impls.insert(0, ("baseline", args.baseline))
    scenarios = ["warm", "cold"] if args.scenario == "both" else [args.scenario]
    server = RedisServer().start() if "redis" in backends else None
    best: dict[tuple[str, str, str], dict[str, Any]] = {}
    totals: dict[tuple[str, str, str], list[float]] = {}
    runs: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    try:
        for _ in range(args.repeats):
            for scenario in scenarios:
                for backend in backends:
                    for name, impl in impls:
                        url = pid = None
                        if backend == "redis" and server is not None and server.process:
                            url, pid = server.url, server.process.pid
                            flush_redis(url)
                        out = _run_child(impl, url, pid, args, scenario)
                        total = out["client_us"] + (out["server_us"] or 0.0)
                        slot = (scenario, backend, name)
                        totals.setdefault(slot, []).append(total)
                        runs.setdefault(slot, []).append(out)
                        if slot not in best or total < best[slot]["total_us"]:
                            best[slot] = out | {"total_us": total}
    finally:
        if server is not None:
            server.close()

    for scenario in scenarios:
        if scenario == "warm":
            print(f"\nWARM: CPU us per turn (cached load + append of 2 messages), {args.turns}"
                  f" turns, {args.sessions} sessions of {args.stored}+ messages, {args.loop},"
                  f" best of {args.repeats}, system prompt {args.system_prompt_chars} chars")
        else:
            print(f"\nCOLD: CPU us per turn (uncached load of a 500-message page + append), "
                  f"{args.cold_turns} turns on a session of {args.cold_stored:,}+ messages, "
                  f"{args.loop}, best of {args.repeats}")
        print("best run: client CPU, redis-server CPU, their total, wall time (cold: median"
              " turn, and its load), store calls per turn; the median total over the repeats")
        print(f"{'backend':8} {'impl':9} {'client':>8} {'server':>8} {'total':>8} "
              f"{'wall':>8} {'load':>8} {'calls':>6} {'median':>8}")
        for (kind, backend, name), out in best.items():
            if kind != scenario:
                continue
            server_us = out["server_us"]
            load = out.get("load_wall_us")
            print(f"{backend:8} {name:9} {out['client_us']:8.1f} "
                  f"{'-' if server_us is None else f'{server_us:.1f}':>8} "
                  f"{out['total_us']:8.1f} {out['wall_us']:8.1f} "
                  f"{'-' if load is None else f'{load:.1f}':>8} {out['calls']:6.2f} "
                  f"{statistics.median(totals[(kind, backend, name)]):8.1f}")  # fmt: skip
        print(f"wall time per turn{f' on CPU {args.cpu}' if args.cpu is not None else ''}, "
              "medians over the repeats (us), and the turns over 2 ms in all of them")
        print(f"{'backend':8} {'impl':9} {'p50':>8} {'p99':>8} {'p99.9':>8} {'max':>9} "
              f"{'>2ms':>6}")
        for (kind, backend, name), outs in runs.items():
            if kind != scenario:
                continue

            def median(field: str, outs: list[dict[str, Any]] = outs) -> float:
                return statistics.median(out[field] for out in outs)

            print(f"{backend:8} {name:9} {median('p50_us'):8.1f} {median('p99_us'):8.1f} "
                  f"{median('p999_us'):8.1f} {median('max_us'):9.1f} "
                  f"{sum(out['over_2ms'] for out in outs):6d}")  # fmt: skip
        if args.baseline:
            for backend in backends:
                old = best[(scenario, backend, "baseline")]
                new = best[(scenario, backend, "current")]
                print(f"{scenario} {backend}: client {new['client_us'] / old['client_us']:.2f}x,"
                      f" total {new['total_us'] / old['total_us']:.2f}x of the baseline")


if __name__ == "__main__":
    main()
