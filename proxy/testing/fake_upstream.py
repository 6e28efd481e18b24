"""A real OpenAI-compatible HTTP server on loopback, for tests, ``memory-proxy demo`` and
benchmarks.

    with FakeUpstream.running() as fake:          # or: async with FakeUpstream.running()
        fake.queue(Reply.text("hi"), Reply.error(429))
        ...  # point a client at fake.url ("http://127.0.0.1:PORT/v1")
        fake.requests[-1].body["messages"]

It records every request, answers chat completions from a queue of scripted ``Reply``s
(then, when the queue is empty, from ``default_reply``: an instant deterministic echo of the
last user message with realistic usage), streams in OpenAI's chunk format, and counts
clients that went away mid-reply (``fake.disconnects``). The server runs in a background
thread with its own event loop, so its timing does not depend on the test's loop.

``python -m proxy.testing.fake_upstream --port 8100`` serves it standalone (benchmarks).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import socket
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from types import TracebackType
from typing import Any, Self

import orjson
import uvicorn

from proxy.testing.fake_replies import (
    RecordedRequest,
    Rendered,
    RenderedReply,
    Reply,
    count_tokens_roughly,
    default_usage,
    echo_reply,
    error_json,
    instant_reply,
)

__all__ = [
    "FakeUpstream", "RecordedRequest", "Reply", "count_tokens_roughly", "default_usage",
    "echo_reply",
    "error_json", "instant_reply",
]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

_JSON = [(b"content-type", b"application/json")]
_SSE = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]


class _Cut(Exception):
    """Raised inside the app to drop the connection mid-response (``Reply.stream_cut``)."""


class _QuietCut(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], _Cut))


logging.getLogger("uvicorn.error").addFilter(_QuietCut())


class FakeUpstream:
    """A recording, scriptable OpenAI-compatible server (pure ASGI), run on loopback.

    ``default_reply(body)`` answers when the queue is empty; ``count_tokens(body)`` gives
    the usage's ``prompt_tokens``; ``max_records`` bounds ``requests`` (long benchmark runs).
    The script, the records and the counters are guarded by a lock (two threads use them).
    """

    def __init__(
        self,
        *,
        models: Sequence[str] = ("fake-model",),
        default_reply: Callable[[dict[str, Any]], Reply] = echo_reply,
        count_tokens: Callable[[dict[str, Any]], int] = count_tokens_roughly,
        host: str = "127.0.0.1",
        port: int = 0,
        max_records: int | None = None,
    ) -> None:
        self.models_list = list(models)
        self.default_reply = default_reply
        self.count_tokens = count_tokens
        self._defaults = (default_reply, count_tokens)
        self.host = host
        self.port = port
        self.disconnected = threading.Event()  # set at every client disconnect mid-reply
        self._lock = threading.Lock()
        self._settled = threading.Condition(self._lock)  # notified when no request is in flight
        self._in_flight = 0
        self._requests: deque[RecordedRequest] = deque(maxlen=max_records)
        self._script: deque[Reply] = deque()
        self._gates: list[threading.Event] = []  # the ``until`` events of replies served
        self._disconnects = 0
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._models_body = orjson.dumps({"object": "list", "data": [
            {"id": m, "object": "model", "created": 0, "owned_by": "fake"} for m in models]})

    # ---- script and records (called from the test's thread) ----

    @classmethod
    def running(cls, **kwargs: Any) -> Self:
        """A fake that starts on ``with``/``async with`` and stops on exit."""
        return cls(**kwargs)

    def queue(self, *replies: Reply) -> None:
        """Answer the next chat completions with these replies, in order."""
        with self._lock:
            self._script.extend(replies)

    def release(self) -> None:
        """Set the ``until`` event of every reply served or queued: nothing stays held
        (a test that failed while a reply was held must not hang the proxy's shutdown)."""
        with self._lock:
            gates = [*self._gates, *(r.until for r in self._script if r.until is not None)]
            self._gates.clear()
        for gate in gates:
            gate.set()

    def reset(
        self,
        *,
        default_reply: Callable[[dict[str, Any]], Reply] | None = None,
        count_tokens: Callable[[dict[str, Any]], int] | None = None,
        timeout: float = 15.0,
    ) -> None:
        """Make a running fake as new, for the next test: wait (up to ``timeout``) for the
        replies still in flight, then forget the script, the recorded requests and the
        disconnects; ``default_reply`` and ``count_tokens`` go back to the constructor's
        unless given here."""
        self.release()
        with self._settled:
            self._settled.wait_for(lambda: self._in_flight == 0, timeout)
            self._script.clear()
            self._requests.clear()
            self._disconnects = 0
            self.default_reply = default_reply or self._defaults[0]
            self.count_tokens = count_tokens or self._defaults[1]
        self.disconnected.clear()

    @property
    def requests(self) -> list[RecordedRequest]:
        with self._lock:
            return list(self._requests)

    @property
    def chat_requests(self) -> list[RecordedRequest]:
        return [r for r in self.requests if r.path.endswith("/chat/completions")]

    @property
    def disconnects(self) -> int:
        with self._lock:
            return self._disconnects

    def wait_for_disconnect(self, timeout: float = 5.0) -> bool:
        return self.disconnected.wait(timeout)

    @property
    def url(self) -> str:
        """The OpenAI base URL, ``http://127.0.0.1:PORT/v1``."""
        return f"http://{self.host}:{self.port}/v1"

    # ---- ASGI ----

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        with self._lock:
            self._in_flight += 1
        try:
            await self._handle(scope, receive, send)
        finally:
            with self._settled:
                self._in_flight -= 1
                if not self._in_flight:
                    self._settled.notify_all()

    async def _handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        chunks = []
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        raw = b"".join(chunks)
        try:
            body = orjson.loads(raw) if raw else None
        except orjson.JSONDecodeError:
            body = None
        path, method = scope["path"], scope["method"]
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        with self._lock:
            self._requests.append(
                RecordedRequest(method, path, headers, body, raw, _client(scope),
                                query=scope.get("query_string", b"").decode("latin-1")))
        await self._route(method, path, body, receive, send)

    async def _route(
        self, method: str, path: str, body: Any, receive: Receive, send: Send
    ) -> None:
        """Answer one recorded request (a fake of another API adds its routes here)."""
        if method == "GET" and path.endswith("/models"):
            await _respond(send, 200, _JSON, self._models_body)
        elif method == "POST" and path.endswith("/chat/completions"):
            if isinstance(body, dict):
                await self._chat(body, receive, send)
            else:
                await _respond(send, 400, _JSON, error_json(400, "body is not a JSON object"))
        else:
            await _respond(send, 404, _JSON, error_json(404, f"no route {method} {path}"))

    def _next_reply(self, body: dict[str, Any]) -> Reply:
        with self._lock:
            if self._script:
                return self._script.popleft()
        return self.default_reply(body)

    async def _chat(self, body: dict[str, Any], receive: Receive, send: Send) -> None:
        reply = self._next_reply(body)
        if reply.raw_body is not None:
            headers = [(b"content-type", reply.content_type.encode())]
            await _respond(send, reply.status, headers, reply.raw_body)
            return
        if reply.until is not None:
            with self._lock:
                self._gates.append(reply.until)
        if not (reply.first_token_delay > 0 or reply.delay_between_chunks > 0
                or reply.linger > 0 or reply.cut_after_chunks is not None or reply.held):
            # instant: one write, no disconnect watcher (the benchmarks' common case)
            stream, data = instant_reply(reply, body, self.count_tokens(body))
            await _respond(send, 200, _SSE if stream else _JSON, data)
            return
        rendered = RenderedReply(reply, body, self.count_tokens(body))
        stream = body.get("stream") is True
        include_usage = stream and bool((body.get("stream_options") or {}).get("include_usage"))
        await self._play(rendered, stream, include_usage, receive, send)

    async def _play(
        self, rendered: Rendered, stream: bool, include_usage: bool, receive: Receive,
        send: Send,
    ) -> None:
        """Send a rendered reply with its delays and cut, counting a client gone meanwhile."""
        gone = asyncio.Event()
        watcher = asyncio.create_task(_watch_disconnect(receive, gone))
        try:
            if stream:
                await self._stream(rendered, include_usage, gone, send)
            else:
                await self._complete_slowly(rendered, gone, send)
        finally:
            watcher.cancel()
        if gone.is_set():
            with self._lock:
                self._disconnects += 1
            self.disconnected.set()

    async def _complete_slowly(self, rendered: Rendered, gone: asyncio.Event, send: Send) -> None:
        data = rendered.completion()
        reply = rendered.reply
        if await _hold_unless(gone, reply.until) or await _sleep_unless(
                gone, reply.first_token_delay):
            return
        if reply.cut_after_chunks is not None:
            await send({"type": "http.response.start", "status": 200,
                        "headers": [*_JSON, (b"content-length", str(len(data)).encode())]})
            await send({"type": "http.response.body", "body": data[: len(data) // 2],
                        "more_body": True})
            raise _Cut
        await _respond(send, 200, _JSON, data)

    async def _stream(
        self, rendered: Rendered, include_usage: bool, gone: asyncio.Event, send: Send
    ) -> None:
        reply = rendered.reply
        events = rendered.chunks(include_usage)
        await send({"type": "http.response.start", "status": 200, "headers": _SSE})
        if reply.cut_after_chunks is not None:
            events = events[: reply.cut_after_chunks]
        if reply.held and events:
            # the role event goes at once, as a model's first event does; the rest waits
            await send({"type": "http.response.body", "body": events[0], "more_body": True})
            events = events[1:]
        if await _hold_unless(gone, reply.until) or await _sleep_unless(
                gone, reply.first_token_delay):
            return
        if reply.delay_between_chunks <= 0:
            await send({"type": "http.response.body", "body": b"".join(events),
                        "more_body": True})
        else:
            for i, chunk in enumerate(events):
                if i and await _sleep_unless(gone, reply.delay_between_chunks):
                    return
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        if reply.cut_after_chunks is not None:
            await asyncio.sleep(0.01)  # let the transport flush what was sent before the cut
            raise _Cut
        if await _sleep_unless(gone, reply.linger):
            return
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    # ---- running it ----

    def start(self) -> None:
        """Serve in a background thread; returns once the server accepts connections."""
        if self._thread is not None:
            return
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(self, lifespan="off", log_config=None, access_log=False,
                                timeout_graceful_shutdown=1, timeout_keep_alive=30)
        self._server = server = uvicorn.Server(config)
        self._thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]},
                                        name=f"fake-upstream-{self.port}", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                sock.close()
                raise RuntimeError("fake upstream failed to start")
            time.sleep(0.005)

    def stop(self) -> None:
        server, thread = self._server, self._thread
        self._server = self._thread = None
        if server is not None and thread is not None:
            server.should_exit = True
            thread.join(10)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    async def __aenter__(self) -> Self:
        await asyncio.to_thread(self.start)
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await asyncio.to_thread(self.stop)


def _client(scope: Scope) -> tuple[str, int] | None:
    client = scope.get("client")
    return (client[0], client[1]) if client else None


async def _respond(send: Send, status: int, headers: list[tuple[bytes, bytes]],
                   body: bytes) -> None:
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _watch_disconnect(receive: Receive, gone: asyncio.Event) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    gone.set()


async def _hold_unless(gone: asyncio.Event, until: threading.Event | None) -> bool:
    """Wait until ``until`` is set; True (at once) if the client disconnects meanwhile."""
    while until is not None and not until.is_set():
        if gone.is_set():
            return True
        await asyncio.sleep(0.005)
    return gone.is_set()


async def _sleep_unless(gone: asyncio.Event, delay: float) -> bool:
    """Sleep ``delay`` seconds; True (at once) if the client disconnects meanwhile."""
    if delay <= 0:
        return gone.is_set()
    try:
        async with asyncio.timeout(delay):
            await gone.wait()
    except TimeoutError:
        return False
    return True


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Serve the fake OpenAI-compatible upstream.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8100)
    parser.add_argument("--first-token-delay", type=float, default=0.0,
                        help="seconds before the first token of every reply")
    parser.add_argument("--delay-between-chunks", type=float, default=0.0,
                        help="seconds between streamed chunks")
    parser.add_argument("--reply-words", type=int, default=0,
                        help="answer with this many words instead of the echo")
    args = parser.parse_args(argv)

    def reply(body: dict[str, Any]) -> Reply:
        text = " ".join(f"word{i}" for i in range(args.reply_words)) if args.reply_words \
            else echo_reply(body).content or "ok"
        return Reply.text(text, first_token_delay=args.first_token_delay,
                          delay_between_chunks=args.delay_between_chunks)

    fake = FakeUpstream(default_reply=reply, host=args.host, port=args.port, max_records=100)
    print(f"fake upstream on http://{args.host}:{args.port}/v1", flush=True)
    uvicorn.run(fake, host=args.host, port=args.port, lifespan="off", access_log=False,
                log_level="warning")


if __name__ == "__main__":
    main()
