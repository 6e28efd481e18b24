"""CPU per upstream call: the former aiohttp client against ``OpenAIUpstream`` (``http1``).

Starts the fake upstream (``python -m proxy.fake_upstream``) in its own process and, in
this one, drives the same calls through both clients in interleaved rounds: sequential
and concurrency-32 non-streaming calls, and sequential streamed calls read to ``[DONE]``
as the proxy's relay does. Reports this process's CPU time (``time.process_time``) per
call; the fake's CPU is not counted.

    python bench/upstream_client.py                      # N=5000, 1000 streams, uvloop
    python bench/upstream_client.py --loop asyncio --calls 2000 --streams 500

"(a) aiohttp" is the removed ``OpenAIUpstream`` (one ``aiohttp.ClientSession``, same
connector and timeouts, same header handling, SSE parsed the same way) reduced to the
calls measured here; "(b) http1" is ``proxy.upstream.openai_http.OpenAIUpstream``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import _paths  # noqa: F401  (puts the repository root on sys.path)
import aiohttp
import orjson
from servers import fake_upstream

from proxy.sse import SSEParser
from proxy.upstream.base import SSEEvent, UpstreamRequest, UpstreamResponse
from proxy.upstream.openai_http import OpenAIUpstream

_DROPPED_HEADERS = frozenset(
    {"host", "content-length", "content-type", "content-encoding", "accept-encoding",
     "connection", "keep-alive", "transfer-encoding", "te", "upgrade", "proxy-connection",
     "expect"}
)


class AiohttpUpstream:
    """The former ``OpenAIUpstream`` (aiohttp), as it was before ``http1``, for chat calls."""

    def __init__(self, base_url: str, *, timeout: float = 600, connect_timeout: float = 10,
                 first_byte_timeout: float | None = None) -> None:
        self._chat_url = f"{base_url.rstrip('/')}/chat/completions"
        self.first_byte_timeout = first_byte_timeout
        self._timeout = aiohttp.ClientTimeout(total=timeout, sock_connect=connect_timeout)
        self._stream_timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=connect_timeout, sock_read=timeout)
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60, ttl_dns_cache=300)
        self._session = aiohttp.ClientSession(connector=connector,
                                              cookie_jar=aiohttp.DummyCookieJar())

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    def _headers(self, headers: dict[str, str]) -> dict[str, str]:
        out = {k: v for k, v in headers.items() if k.lower() not in _DROPPED_HEADERS}
        out["Content-Type"] = "application/json"
        return out

    async def _post(self, request: UpstreamRequest, body: dict[str, Any],
                    limits: aiohttp.ClientTimeout) -> aiohttp.ClientResponse:
        assert self._session is not None
        pending = self._session.post(self._chat_url, data=orjson.dumps(body),
                                     headers=self._headers(request.headers), timeout=limits)
        if self.first_byte_timeout is not None:
            async with asyncio.timeout(self.first_byte_timeout):
                response = await pending
        else:
            response = await pending
        if response.status >= 300:
            raise RuntimeError(f"upstream answered {response.status}")
        return response

    async def chat(self, request: UpstreamRequest) -> UpstreamResponse:
        body = request.body
        if body.get("stream"):
            body = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
        response = await self._post(request, body, self._timeout)
        try:
            data = await response.read()
        except BaseException:
            response.close()
            raise
        headers = {k.lower(): v for k, v in response.headers.items()}
        return UpstreamResponse(response.status, data, headers)

    async def chat_stream(self, request: UpstreamRequest) -> AiohttpStream:
        body = request.body
        if body.get("stream") is not True:
            body = {**body, "stream": True}
        response = await self._post(request, body, self._stream_timeout)
        return AiohttpStream(response)


class AiohttpStream:
    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self.status_code = response.status
        self.headers = {k.lower(): v for k, v in response.headers.items()}
        self._response = response
        self._parser = SSEParser()
        self._pending: deque[SSEEvent] = deque()
        self._eof = False
        self._saw_done = False

    def __aiter__(self) -> AiohttpStream:
        return self

    async def __anext__(self) -> SSEEvent:
        pending = self._pending
        while not pending:
            if self._eof:
                raise StopAsyncIteration
            chunk = await self._response.content.readany()
            if chunk:
                events = self._parser.feed(chunk)
                if events and events[-1].data == b"[DONE]":
                    self._saw_done = True
                pending.extend(events)
            else:
                self._eof = True
                pending.extend(self._parser.flush())
        return pending.popleft()

    async def aclose(self) -> None:
        response = self._response
        if not self._eof and self._saw_done:
            async with asyncio.timeout(1.0):
                while await response.content.readany():
                    pass
            self._eof = True
        if self._eof:
            response.release()
        else:
            response.close()


class NullUpstream:
    """No HTTP at all: answers at once after one pass of the event loop, so its CPU per
    call is the benchmark driver's own share of the other two columns."""

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        pass

    async def chat(self, request: UpstreamRequest) -> UpstreamResponse:
        orjson.dumps(request.body)
        await asyncio.sleep(0)
        return UpstreamResponse(200, b"{}", {})

    async def chat_stream(self, request: UpstreamRequest) -> NullStream:
        orjson.dumps(request.body)
        await asyncio.sleep(0)
        return NullStream()


class NullStream:
    def __init__(self) -> None:
        self._events = deque([SSEEvent(b"data: [DONE]\n\n", b"[DONE]")])

    def __aiter__(self) -> NullStream:
        return self

    async def __anext__(self) -> SSEEvent:
        if not self._events:
            raise StopAsyncIteration
        return self._events.popleft()

    async def aclose(self) -> None:
        pass


def chat_request(stream: bool) -> UpstreamRequest:
    """A typical turn: a system prompt, some history, a question (about 2.5 KB of JSON)."""
    history = [
        {"role": "user" if i % 2 == 0 else "assistant",
         "content": f"message {i}: " + "lorem ipsum dolor sit amet " * 8}
        for i in range(8)
    ]
    body: dict[str, Any] = {
        "model": "fake-model", "stream": stream,
        "messages": [{"role": "system", "content": "You are a helpful assistant."}, *history,
                     {"role": "user", "content": "what did we say about lorem ipsum?"}],
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    return UpstreamRequest(body, {"authorization": "Bearer sk-bench"})


async def one_call(upstream: Any, stream: bool) -> None:
    request = chat_request(stream)
    if not stream:
        response = await upstream.chat(request)
        assert response.status_code == 200 and response.body
        return
    events = await upstream.chat_stream(request)
    try:
        async for event in events:
            if event.done:
                break
        else:
            raise RuntimeError("stream ended without [DONE]")
    finally:
        await events.aclose()


async def measure(upstream: Any, calls: int, concurrency: int, stream: bool
                  ) -> tuple[float, float]:
    """CPU seconds and wall seconds for ``calls`` calls from ``concurrency`` workers."""
    left = calls

    async def worker() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            await one_call(upstream, stream)

    cpu, wall = time.process_time(), time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.process_time() - cpu, time.perf_counter() - wall


Scenario = tuple[str, int, int, bool]  # name, calls, concurrency, stream


async def run(base_url: str, scenarios: list[Scenario], rounds: int) -> dict[str, Any]:
    clients: dict[str, Any] = {
        "aiohttp": AiohttpUpstream(base_url),
        "http1": OpenAIUpstream(base_url),
        "driver": NullUpstream(),
    }
    for client in clients.values():
        await client.start()
    try:
        for client in clients.values():  # warm up: connections, code paths (untimed)
            await measure(client, 200, 32, False)
            await measure(client, 50, 1, True)
        results: dict[str, Any] = {}
        for name, calls, concurrency, stream in scenarios:
            per_round = max(1, calls // rounds)
            samples: dict[str, list[tuple[float, float]]] = {k: [] for k in clients}
            for index in range(rounds):
                order = list(clients) if index % 2 == 0 else list(reversed(clients))
                for key in order:
                    cpu, wall = await measure(clients[key], per_round, concurrency, stream)
                    samples[key].append((cpu / per_round, wall / per_round))
            results[name] = {"calls": per_round * rounds, "rounds": rounds, "samples": samples}
        return results
    finally:
        for client in clients.values():
            await client.close()


def report(results: dict[str, Any]) -> str:
    lines = ["| scenario | (a) aiohttp CPU/call | (b) http1 CPU/call | saved per call "
             "| driver alone | (a) wall/call | (b) wall/call |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for name, result in results.items():
        samples = result["samples"]
        cpu = {k: statistics.median(c for c, _ in v) * 1e3 for k, v in samples.items()}
        wall = {k: statistics.median(w for _, w in v) * 1e3 for k, v in samples.items()}
        old, new, driver = cpu["aiohttp"], cpu["http1"], cpu["driver"]
        lines.append(
            f"| {name} ({result['calls']} calls, {result['rounds']} rounds) "
            f"| {old:.3f} ms | {new:.3f} ms | {old - new:.3f} ms "
            f"| {driver:.3f} ms | {wall['aiohttp']:.3f} ms | {wall['http1']:.3f} ms |"
        )
    lines += ["", "CPU is user + system time of this process; both clients' columns include "
              "the driver's own share (building the request, the loop), shown alone in "
              "'driver alone' (no HTTP: an answer after one pass of the event loop)."]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=5000, help="non-streaming calls per client")
    parser.add_argument("--streams", type=int, default=1000, help="streamed calls per client")
    parser.add_argument("--rounds", type=int, default=10, help="interleaved rounds")
    parser.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop",
                        help="event loop (uvicorn serves the proxy on uvloop)")
    parser.add_argument("--no-pin", action="store_true",
                        help="do not pin the fake to CPU 0 and this process to CPU 1")
    args = parser.parse_args()

    pin = not args.no_pin and (os.cpu_count() or 1) >= 2
    if pin:
        os.sched_setaffinity(0, {1})
    scenarios: list[Scenario] = [
        ("non-streaming, sequential", args.calls, 1, False),
        ("non-streaming, concurrency 32", args.calls, 32, False),
        ("streamed, sequential", args.streams, 1, True),
    ]
    run_loop: Callable[[Awaitable[Any]], Any] = asyncio.run
    if args.loop == "uvloop":
        import uvloop

        run_loop = uvloop.run
    with fake_upstream("0" if pin else None) as fake:
        results = run_loop(run(fake.url + "/v1", scenarios, args.rounds))
    print(f"python {sys.version.split()[0]}, loop {args.loop}, "
          f"{'fake on CPU 0, client on CPU 1' if pin else 'not pinned'}; "
          f"medians over rounds of this process's CPU time per call")
    print(report(results))


if __name__ == "__main__":
    main()
