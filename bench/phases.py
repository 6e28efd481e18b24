"""The measurements of one run, each a function of the targets it drives.

Targets: A the fake upstream itself, B the pass-through floor, C memory-proxy on SQLite,
C' memory-proxy on Redis, D LiteLLM's proxy. Phases interleave the targets (round by
round) so that background load on the machine hits them alike.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import load
import native
import sampling
from load import LoadResult, SessionPool, median
from servers import OUT, PYTHON, ROOT, Server, http_status


@dataclass
class Target:
    key: str  # "A", "B", "C", "C'", "D"
    label: str
    base_url: str
    server: Server  # the process whose CPU and memory are charged to this target
    pool: SessionPool | None = None  # memory-proxy: the sessions its turns go to
    headers: dict[str, str] = field(default_factory=dict)  # sent with every wrk request

    def cpu(self) -> float:
        return self.server.cpu_seconds()

    def waited(self) -> float:
        return self.server.runqueue_seconds()


@dataclass
class Measured:
    """One target's numbers in one phase; ``cpu_ms`` is server CPU per request, ``wait_ms``
    the time its threads were runnable but had no CPU (other load on the machine)."""

    key: str
    rounds: list[LoadResult] = field(default_factory=list)
    cpu_ms: list[float] = field(default_factory=list)
    wait_ms: list[float] = field(default_factory=list)

    def add(self, result: LoadResult, cpu_seconds: float, waited: float = 0.0) -> None:
        self.rounds.append(result)
        if result.requests:
            self.cpu_ms.append(cpu_seconds / result.requests * 1000)
            self.wait_ms.append(waited / result.requests * 1000)

    def p50(self) -> float:
        return median([r.p50 for r in self.rounds])

    def p99(self) -> float:
        return median([r.p99 for r in self.rounds])

    def rps(self) -> float:
        return median([r.rps for r in self.rounds])

    def errors(self) -> int:
        return sum(r.errors for r in self.rounds)

    def requests(self) -> int:
        return sum(r.requests for r in self.rounds)

    def cpu_per_request_ms(self) -> float:
        return median(self.cpu_ms)

    def wait_per_request_ms(self) -> float:
        return median(self.wait_ms)

    def ttfb_ms(self, pct: int) -> float:
        samples = [t for r in self.rounds for t in r.ttfb]
        return load.percentile(samples, pct) * 1000 if samples else 0.0

    def latency_ms(self, pct: int) -> float:
        samples = [t for r in self.rounds for t in r.latencies]
        return load.percentile(samples, pct) * 1000 if samples else 0.0


def charged(target: Target, run: Callable[[], LoadResult]) -> tuple[LoadResult, float, float]:
    """Run the load; also the server's CPU seconds and run-queue wait during it."""
    cpu, waited = target.cpu(), target.waited()
    result = run()
    return result, target.cpu() - cpu, target.waited() - waited


def wrk_run(target: Target, concurrency: int, seconds: float, env_cpus: str | None) -> LoadResult:
    return load.wrk(target.base_url, concurrency=concurrency, seconds=seconds, pool=target.pool,
                    cpus=env_cpus, script_dir=OUT / "wrk" / target.key.replace("'", "2"),
                    headers=target.headers)


def warm_up(targets: list[Target], env_cpus: str | None) -> None:
    """Open pools, load tokenizers and caches before anything is measured."""
    for target in targets:
        wrk_run(target, 4, 1, env_cpus)


def latency_rounds(
    targets: list[Target], rounds: int, seconds: float, env_cpus: str | None
) -> dict[str, Measured]:
    """Concurrency 1, wrk, the targets in a rotated order each round."""
    out = {t.key: Measured(t.key) for t in targets}
    for index in range(rounds):
        order = targets[index % len(targets):] + targets[: index % len(targets)]
        for target in order:
            out[target.key].add(*charged(target, partial(wrk_run, target, 1, seconds, env_cpus)))
    return out


def added_p50(measured: dict[str, Measured], key: str, pct: str = "p50") -> float:
    """Median over rounds of (target - A) in the same round."""
    base = measured["A"].rounds
    mine = measured[key].rounds
    return median([getattr(m, pct) - getattr(a, pct) for m, a in zip(mine, base, strict=False)])


def throughput(
    targets: list[Target], concurrencies: tuple[int, ...], seconds: float, env_cpus: str | None,
    rounds: int = 1, between: Callable[[], object] | None = None,
) -> dict[int, dict[str, Measured]]:
    """Each concurrency in ``rounds`` rounds, the targets in a rotated order each round (a
    moment of background load hits one round of each, not one target's only cell);
    ``between`` runs after each round."""
    out: dict[int, dict[str, Measured]] = {}
    for concurrency in concurrencies:
        out[concurrency] = {t.key: Measured(t.key) for t in targets}
        for index in range(rounds):
            order = targets[index % len(targets):] + targets[: index % len(targets)]
            for target in order:
                out[concurrency][target.key].add(*charged(
                    target, partial(wrk_run, target, concurrency, seconds, env_cpus)
                ))
            if between is not None:
                between()
    return out


def max_rps(by_concurrency: dict[int, dict[str, Measured]], key: str) -> tuple[float, int]:
    """Best requests/s over the concurrencies that had no error, and that concurrency."""
    best, at = 0.0, 0
    for concurrency, measured in by_concurrency.items():
        m = measured.get(key)
        if m is not None and m.errors() == 0 and m.rps() > best:
            best, at = m.rps(), concurrency
    return best, at


async def closed_rounds(
    targets: list[Target], requests: int, rounds: int, *, stream: bool = False,
    pools: Mapping[str, SessionPool | None] | None = None,
    resend: dict[str, load.Resender] | None = None,
) -> dict[str, Measured]:
    """The aiohttp client at concurrency 1, ``requests`` per target split into rounds
    (full-history clients for the targets ``resend`` names)."""
    out = {t.key: Measured(t.key) for t in targets}
    per_round = max(1, requests // rounds)
    for index in range(rounds):
        for target in targets:
            pool = pools.get(target.key, target.pool) if pools is not None else target.pool
            cpu, waited = target.cpu(), target.waited()
            result = await load.closed_loop(target.base_url, requests=per_round, pool=pool,
                                            stream=stream, warmup=1 if index == 0 else 0,
                                            resend=(resend or {}).get(target.key))
            out[target.key].add(result, target.cpu() - cpu, target.waited() - waited)
    return out


async def cold_turns(target: Target, pool: load.SessionPool,
                     resend: load.Resender | None = None) -> Measured:
    """The first turn on each session of ``pool`` (the proxy reads it from its store), one
    at a time; ``cpu_ms`` holds each turn's server CPU, so the per-turn figure is their
    median."""
    result, per_turn = await load.one_turn_each(target.base_url, pool, target.cpu,
                                                resend=resend)
    out = Measured(target.key)
    out.rounds.append(result)
    out.cpu_ms = [seconds * 1000 for seconds in per_turn]
    return out


async def chunk_timing(a: Target, c: Target, session_path: str) -> dict[str, Any]:
    """One slow stream (a chunk every 20 ms) straight and through memory-proxy."""
    straight = await load.chunk_arrivals(a.base_url, "/v1/chat/completions")
    proxied = await load.chunk_arrivals(c.base_url, session_path)
    return {"A": straight, "C": proxied}


def profile_under_load(
    target: Target, seconds: float, concurrency: int, env_cpus: str | None, name: str,
    *, gil: bool = False,
) -> tuple[sampling.Profile | str, LoadResult]:
    raw = OUT / "profiles" / f"{name}.txt"
    raw.unlink(missing_ok=True)
    spy = sampling.start(target.server.pid, seconds, raw, gil=gil)
    time.sleep(0.3)  # let py-spy attach before the load starts
    result = wrk_run(target, concurrency, seconds, env_cpus)
    return sampling.finish(spy, raw), result


def native_split(
    target: Target, seconds: float, concurrency: int, env_cpus: str | None, name: str,
) -> tuple[dict[str, float] | str, LoadResult]:
    """``perf`` on the server under wrk: its CPU by shared object (bench/native.py)."""
    data = OUT / "profiles" / f"{name}.perf.data"
    data.unlink(missing_ok=True)
    perf = native.start(target.server.pid, seconds, data)
    time.sleep(0.3)
    result = wrk_run(target, concurrency, seconds, env_cpus)
    return native.finish(perf, data), result


def time_to_ready(make: Callable[[], Server], repeats: int) -> dict[str, float]:
    """Spawn to ``/ready`` (median of ``repeats``), and the first turn after ready."""
    ready, first = [], []
    for _ in range(repeats):
        server = make()
        server.start()
        try:
            assert server.ready_seconds is not None
            ready.append(server.ready_seconds)
            started = time.perf_counter()
            result = asyncio.run(load.closed_loop(
                server.url, requests=1,
                pool=SessionPool("bench", f"ready-{time.monotonic_ns()}", 1),
            ))
            if result.errors == 0:
                first.append(time.perf_counter() - started)
            rss = server.rss_mb()
        finally:
            server.stop()
    return {"ready_s": median(ready), "first_turn_s": median(first), "idle_rss_mb": rss}


TOKENIZER_RSS = """
import sys
def rss():
    return int(next(l for l in open("/proc/self/status") if l.startswith("VmRSS")).split()[1])
import proxy.http.app
from strategies.tokens import CL100K, O200K, get_encoding
before = rss(); get_encoding(O200K); middle = rss(); get_encoding(CL100K)
print(before / 1024, (middle - before) / 1024, (rss() - middle) / 1024)
"""


def tokenizer_memory() -> dict[str, float]:
    """RSS of the app's imports, and what each tiktoken encoding adds once loaded."""
    done = subprocess.run([PYTHON, "-c", TOKENIZER_RSS], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    imports, o200k, cl100k = (float(x) for x in done.stdout.split())
    return {"imports_mb": imports, "o200k_mb": o200k, "cl100k_mb": cl100k}


def wait_ready(server: Server) -> bool:
    return http_status(server.port, server.ready_path) == 200


def store_file(name: str) -> tuple[str, Path]:
    path = OUT / "data" / f"{name}.db"
    path.parent.mkdir(parents=True, exist_ok=True)
    for suffix in ("", "-wal", "-shm"):
        Path(str(path) + suffix).unlink(missing_ok=True)
    return f"sqlite:///{path}", path


def session_cache_counts(base_url: str) -> dict[str, float]:
    """The proxy's session cache counters from its /metrics (loopback, no token needed)."""
    import urllib.request

    with urllib.request.urlopen(base_url + "/metrics", timeout=5) as response:
        text = response.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("memory_proxy_session_cache_"):
            name, _, value = line.partition(" ")
            out[name.removeprefix("memory_proxy_session_cache_")] = float(value)
    return out
