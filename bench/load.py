"""Load generators: ``wrk`` for throughput and latency percentiles, a closed-loop aiohttp
client for exact request counts and for streams (time to first byte, chunk arrival).

Both send the same delta-client turn (one new user message); the closed loop can also act
as full-history clients (``Resender``), which resend the whole conversation every turn. For
memory-proxy the path names the agent and the session
(``/agents/A/sessions/S/v1/chat/completions``), sessions taken round robin from a pool; the
other targets get ``/v1/chat/completions``.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import statistics
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from populate import API_KEY, MODEL

WRK = shutil.which("wrk")
HEADERS = {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"}


def turn_body(stream: bool = False, text: str = "What should we check first?") -> bytes:
    body: dict[str, object] = {"model": MODEL, "messages": [{"role": "user", "content": text}]}
    if stream:
        body["stream"] = True
    return json.dumps(body).encode()


@dataclass
class SessionPool:
    """Sessions ``{prefix}-0`` .. ``{prefix}-{count - 1}`` handed out round robin; ``used``
    carries over between runs so a later run continues where the previous one stopped
    instead of reusing the first sessions."""

    agent: str
    prefix: str
    count: int
    used: int = 0

    def path(self, index: int) -> str:
        session = f"{self.prefix}-{index % self.count}"
        return f"/agents/{self.agent}/sessions/{session}/v1/chat/completions"

    def next_path(self) -> str:
        path = self.path(self.used)
        self.used += 1
        return path

    def sessions(self) -> list[str]:
        return [f"{self.prefix}-{i}" for i in range(self.count)]

    def turns_per_session(self) -> float:
        return self.used / self.count


@dataclass
class LoadResult:
    requests: int = 0
    errors: int = 0
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)  # seconds
    ttfb: list[float] = field(default_factory=list)
    p50: float = 0.0  # milliseconds
    p99: float = 0.0

    @property
    def rps(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0

    def finish(self) -> LoadResult:
        if self.latencies:
            self.p50 = percentile(self.latencies, 50) * 1000
            self.p99 = percentile(self.latencies, 99) * 1000
        return self


def percentile(values: Sequence[float], pct: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return 0.0
    rank = max(0, min(len(ordered) - 1, round(pct / 100 * len(ordered) + 0.5) - 1))
    return ordered[rank]


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else 0.0


# ---- wrk ----

WRK_SCRIPT = """
local pool = {pool}
local start = {start}
local agent = "{agent}"
local prefix = "{prefix}"
local body = [[{body}]]
local counter = 0
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer {key}"

request = function()
  local path = "/v1/chat/completions"
  if pool > 0 then
    path = "/agents/" .. agent .. "/sessions/" .. prefix .. "-" .. ((start + counter) % pool)
      .. "/v1/chat/completions"
  end
  counter = counter + 1
  return wrk.format(nil, path, nil, body)
end

done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "WRKJSON {{\\"requests\\":%d,\\"duration_us\\":%d,\\"errors\\":%d,\\"status_errors\\":%d,"
    .. "\\"p50_us\\":%d,\\"p99_us\\":%d,\\"max_us\\":%d}}\\n",
    summary.requests, summary.duration, e.connect + e.read + e.write + e.timeout, e.status,
    latency:percentile(50), latency:percentile(99), latency.max))
end
"""


def wrk(
    base_url: str,
    *,
    concurrency: int,
    seconds: float,
    pool: SessionPool | None = None,
    cpus: str | None = None,
    script_dir: Path,
    headers: dict[str, str] | None = None,
) -> LoadResult:
    """Run wrk (one thread) against ``base_url`` and return requests/s and percentiles;
    ``headers`` are sent besides the script's own."""
    if WRK is None:
        raise RuntimeError("wrk is not installed")
    script_dir.mkdir(parents=True, exist_ok=True)
    script = script_dir / "turn.lua"
    script.write_text(WRK_SCRIPT.format(
        pool=pool.count if pool else 0, start=pool.used if pool else 0,
        agent=pool.agent if pool else "", prefix=pool.prefix if pool else "",
        body=turn_body().decode(),
        key=API_KEY,
    ) + "".join(f'wrk.headers["{name}"] = "{value}"\n' for name, value in (headers or {}).items()))
    argv = [WRK, "-t1", f"-c{concurrency}", f"-d{max(1, round(seconds))}s", "--timeout", "10s",
            "-s", str(script), base_url]
    if cpus is not None:
        argv = ["taskset", "-c", cpus, *argv]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 60)
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("WRKJSON ")), None)
    if line is None:
        raise RuntimeError(f"wrk failed: {done.stdout}\n{done.stderr}")
    data = json.loads(line.removeprefix("WRKJSON "))
    if pool is not None:
        pool.used += data["requests"]
    return LoadResult(
        requests=data["requests"], errors=data["errors"] + data["status_errors"],
        seconds=data["duration_us"] / 1e6, p50=data["p50_us"] / 1000, p99=data["p99_us"] / 1000,
    )


# ---- the aiohttp closed loop ----


class Resender:
    """Full-history clients, one per session: each holds its conversation (at first
    ``history``, the messages stored for it) and resends all of it with every new
    question, then appends the question and the reply it got. With ``grow=False`` every
    request resends ``history`` and one question (for a target that stores nothing)."""

    def __init__(self, history: list[dict[str, str]], *, grow: bool = True) -> None:
        self.history = history
        self.grow = grow
        self.conversations: dict[str, list[dict[str, str]]] = {}
        self.asked = 0

    def body(self, path: str) -> tuple[bytes, dict[str, str]]:
        conversation = self.conversations.setdefault(path, list(self.history))
        self.asked += 1
        question = {"role": "user", "content": f"And what about point {self.asked}?"}
        body = {"model": MODEL, "messages": [*conversation, question]}
        return json.dumps(body).encode(), question

    def answered(self, path: str, question: dict[str, str], reply: bytes) -> None:
        if self.grow:
            content = json.loads(reply)["choices"][0]["message"]["content"]
            self.conversations[path] += [question, {"role": "assistant", "content": content}]


async def closed_loop(
    base_url: str,
    *,
    requests: int,
    concurrency: int = 1,
    pool: SessionPool | None = None,
    stream: bool = False,
    warmup: int = 0,
    resend: Resender | None = None,
) -> LoadResult:
    """``requests`` turns from ``concurrency`` workers, each waiting for its reply before
    sending the next. For streams, ``ttfb`` holds the time to the first body bytes. With
    ``resend``, full-history turns (not streamed)."""
    body = turn_body(stream=stream)
    result = LoadResult()
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    async with aiohttp.ClientSession(connector=connector) as session:
        next_index = 0

        def next_path() -> str:
            return pool.next_path() if pool else "/v1/chat/completions"

        async def one(record: bool) -> None:
            path = next_path()
            data, question = resend.body(path) if resend is not None else (body, None)
            started = time.perf_counter()
            try:
                async with session.post(base_url + path, data=data, headers=HEADERS) as resp:
                    if stream:
                        await resp.content.readany()
                        first = time.perf_counter()
                        while await resp.content.readany():
                            pass
                    else:
                        reply = await resp.read()
                    ok = resp.status == 200
                if ok and resend is not None and question is not None:
                    resend.answered(path, question, reply)
            except aiohttp.ClientError:
                ok = False
            elapsed = time.perf_counter() - started
            if not record:
                return
            result.requests += 1
            if not ok:
                result.errors += 1
                return
            result.latencies.append(elapsed)
            if stream:
                result.ttfb.append(first - started)

        for _ in range(warmup):
            await one(False)

        async def worker() -> None:
            nonlocal next_index
            while next_index < requests:
                next_index += 1
                await one(True)

        began = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        result.seconds = time.perf_counter() - began
    return result.finish()


async def one_turn_each(
    base_url: str, pool: SessionPool, cpu: Callable[[], float], *,
    resend: Resender | None = None,
) -> tuple[LoadResult, list[float]]:
    """One turn on every session of ``pool``, in order, back to back, and the server's CPU
    for each (``cpu``: its CPU seconds so far), read around the request. What a turn leaves
    running lands in the next one's, as in ``closed_loop``: a pause after each turn would
    make the next one dearer on a VM (an idle vCPU's caches go cold: a cold turn on 1
    stored message measured 0.8 ms back to back, 2.1 ms 20 ms apart). The connection is
    opened with a ``GET /health`` first, outside every turn."""
    body = turn_body()
    result = LoadResult()
    per_turn: list[float] = []
    async with aiohttp.ClientSession() as session:
        async with session.get(base_url + "/health") as resp:
            await resp.read()
        for index in range(pool.count):
            path = pool.path(index)
            data, question = resend.body(path) if resend is not None else (body, None)
            before = cpu()
            started = time.perf_counter()
            async with session.post(base_url + path, data=data, headers=HEADERS) as resp:
                reply = await resp.read()
                ok = resp.status == 200
            elapsed = time.perf_counter() - started
            per_turn.append(cpu() - before)
            result.requests += 1
            if not ok:
                result.errors += 1
                continue
            result.latencies.append(elapsed)
            if resend is not None and question is not None:
                resend.answered(path, question, reply)
    pool.used = pool.count
    return result.finish(), per_turn


async def chunk_arrivals(base_url: str, path: str) -> list[float]:
    """Arrival times (seconds after the request) of each piece of one streamed reply."""
    body = turn_body(stream=True)
    times: list[float] = []
    async with aiohttp.ClientSession() as session:
        started = time.perf_counter()
        async with session.post(base_url + path, data=body, headers=HEADERS) as resp:
            async for _ in resp.content.iter_any():
                times.append(time.perf_counter() - started)
    return times
