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
import itertools
import logging
import re
import socket
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Protocol

import orjson
import uvicorn

__all__ = [
    "FakeUpstream", "RecordedRequest", "Reply", "count_tokens_roughly", "default_usage",
    "echo_reply",
    "error_json", "instant_reply",
]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

_call_ids = itertools.count(1)
_response_ids = itertools.count(1)
_WORDS = re.compile(r"\s*\S+\s*")
_JSON = [(b"content-type", b"application/json")]
_SSE = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]


class _Cut(Exception):
    """Raised inside the app to drop the connection mid-response (``Reply.stream_cut``)."""


class _QuietCut(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], _Cut))


logging.getLogger("uvicorn.error").addFilter(_QuietCut())


def error_json(status: int, message: str) -> bytes:
    """An OpenAI-shaped error body, its type the one OpenAI gives ``status``."""
    kind = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
            404: "not_found_error", 429: "rate_limit_error"}.get(status, "api_error")
    return orjson.dumps({"error": {"message": message, "type": kind, "param": None,
                                   "code": None}})


def _normalize_tool_call(call: dict[str, Any]) -> dict[str, Any]:
    function = call.get("function", call)
    arguments = function.get("arguments", "{}")
    if not isinstance(arguments, str):
        arguments = orjson.dumps(arguments).decode()
    return {
        "id": call.get("id") or f"call_fake_{next(_call_ids)}",
        "type": "function",
        "function": {"name": function["name"], "arguments": arguments},
    }


@dataclass(frozen=True, slots=True)
class Reply:
    """One scripted answer. Build it with the class methods, not the constructor."""

    content: str | None = "ok"
    calls: tuple[dict[str, Any], ...] = ()  # tool calls, OpenAI-shaped
    status: int = 200
    raw_body: bytes | None = None  # answered as it is, whatever the request (``Reply.raw``)
    content_type: str = "application/json"
    finish_reason: str | None = None
    usage: dict[str, int] | None = None
    first_token_delay: float = 0.0
    delay_between_chunks: float = 0.0
    cut_after_chunks: int | None = None
    linger: float = 0.0  # seconds a stream stays open after `data: [DONE]`
    until: threading.Event | None = None  # the reply waits for this event (``Reply.text``)

    @property
    def held(self) -> bool:
        return self.until is not None and not self.until.is_set()

    @classmethod
    def text(
        cls, text: str, *, delay_between_chunks: float = 0.0, first_token_delay: float = 0.0,
        finish_reason: str = "stop", usage: dict[str, int] | None = None, linger: float = 0.0,
        until: threading.Event | None = None,
    ) -> Reply:
        """Assistant text; streamed one word per chunk. With ``until``, the reply waits
        until the test sets that event (a stream sends its headers and role event first, a
        completion its headers): a reply "still being written" for as long as the test
        needs, with no fixed delay (``FakeUpstream.release`` frees all)."""
        return cls(content=text, finish_reason=finish_reason, usage=usage,
                   first_token_delay=first_token_delay,
                   delay_between_chunks=delay_between_chunks, linger=linger, until=until)

    @classmethod
    def tool_calls(
        cls, calls: Sequence[dict[str, Any]], *, content: str | None = None,
        delay_between_chunks: float = 0.0, first_token_delay: float = 0.0,
    ) -> Reply:
        """Parallel tool calls, each ``{"name", "arguments" (dict or JSON text), "id"?}`` or
        OpenAI's ``{"id", "type", "function": {...}}``; ids default to unique ``call_fake_N``."""
        return cls(content=content, calls=tuple(_normalize_tool_call(c) for c in calls),
                   finish_reason="tool_calls", first_token_delay=first_token_delay,
                   delay_between_chunks=delay_between_chunks)

    @classmethod
    def error(
        cls, status: int, body: dict[str, Any] | str | bytes | None = None, *,
        content_type: str = "application/json",
    ) -> Reply:
        """An error status; ``body`` defaults to an OpenAI-shaped error."""
        if body is None:
            raw = error_json(status, f"fake upstream error {status}")
        else:
            raw = body if isinstance(body, bytes) else (
                body.encode() if isinstance(body, str) else orjson.dumps(body))
        return cls.raw(raw, status=status, content_type=content_type)

    @classmethod
    def raw(
        cls, body: bytes | str, *, status: int = 200, content_type: str = "application/json"
    ) -> Reply:
        """These bytes as the response body, streaming request or not: a 200 that is not a
        chat completion, a hand-written SSE stream (``content_type="text/event-stream"``)."""
        raw = body.encode() if isinstance(body, str) else body
        return cls(content=None, status=status, raw_body=raw, content_type=content_type)

    @classmethod
    def stream_cut(cls, after_chunks: int = 2, text: str = "this reply is cut short") -> Reply:
        """Drop the connection after ``after_chunks`` SSE events (the role chunk counts);
        a non-streaming request gets half of its body, then the cut."""
        return cls(content=text, finish_reason="stop", cut_after_chunks=after_chunks)

    @classmethod
    def slow_first_token(cls, delay: float = 2.0, text: str = "ok") -> Reply:
        """Headers at once, then ``delay`` seconds before the first token (or before the
        whole body of a non-streaming reply)."""
        return cls.text(text, first_token_delay=delay)


@dataclass(slots=True)
class RecordedRequest:
    """A request as the fake received it (header names lower-cased)."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any  # parsed JSON, or None
    raw: bytes = b""
    client: tuple[str, int] | None = None  # the peer address: tells connections apart
    received_at: float = field(default_factory=time.monotonic)
    query: str = ""  # the query string, as sent


def count_tokens_roughly(body: dict[str, Any]) -> int:
    """Default prompt-token estimate: about one token per four bytes of the messages' JSON."""
    return max(1, len(orjson.dumps(body.get("messages", []))) // 4)


def _last_user_text(body: dict[str, Any]) -> str:
    for message in reversed(body.get("messages") or []):
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, str):
                return content
            if isinstance(content, list):
                return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
            return ""
    return ""


def echo_reply(body: dict[str, Any]) -> Reply:
    """The default reply: ``"ok"``, or ``"ok: "`` and the first 24 words of the last user
    message — deterministic, instant."""
    words = _last_user_text(body).split()
    return Reply.text("ok: " + " ".join(words[:24]) if words else "ok")


def default_usage(reply: Reply, prompt_tokens: int) -> dict[str, Any]:
    """The usage a reply reports unless scripted: ``prompt_tokens`` as counted for the
    request, a quarter of the reply's characters as its completion tokens."""
    completion = max(1, (len(reply.content or "") + sum(
        len(c["function"]["name"]) + len(c["function"]["arguments"]) for c in reply.calls
    )) // 4)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion,
            "total_tokens": prompt_tokens + completion}


class Rendered(Protocol):
    """A reply rendered for one request, in some API's shape."""

    reply: Reply

    def completion(self) -> bytes: ...

    def chunks(self, include_usage: bool) -> list[bytes]: ...


class _Reply:
    """A ``Reply`` rendered for one request: the bodies to send, built once."""

    def __init__(self, reply: Reply, body: dict[str, Any], prompt_tokens: int) -> None:
        self.reply = reply
        self.model = str(body.get("model") or "fake-model")
        self.id = f"chatcmpl-fake-{next(_response_ids)}"
        self.created = int(time.time())
        self.usage = reply.usage or default_usage(reply, prompt_tokens)
        self.finish_reason = reply.finish_reason or ("tool_calls" if reply.calls else "stop")

    def completion(self) -> bytes:
        message: dict[str, Any] = {"role": "assistant", "content": self.reply.content,
                                   "refusal": None}
        if self.reply.calls:
            message["tool_calls"] = list(self.reply.calls)
        return orjson.dumps({
            "id": self.id, "object": "chat.completion", "created": self.created,
            "model": self.model, "system_fingerprint": "fp_fake",
            "choices": [{"index": 0, "message": message, "logprobs": None,
                         "finish_reason": self.finish_reason}],
            "usage": self.usage,
        })

    def chunks(self, include_usage: bool) -> list[bytes]:
        """The SSE events of the stream, ``data: [DONE]`` included."""
        head = {"id": self.id, "object": "chat.completion.chunk", "created": self.created,
                "model": self.model, "system_fingerprint": "fp_fake"}
        if include_usage:
            head["usage"] = None

        def event(delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            return b"data: " + orjson.dumps({**head, "choices": [choice]}) + b"\n\n"

        content = self.reply.content
        out = [event({"role": "assistant", "content": "" if content is not None else None,
                      "refusal": None})]
        if content:
            out.extend(event({"content": piece}) for piece in _WORDS.findall(content))
        for index, call in enumerate(self.reply.calls):
            function = call["function"]
            out.append(event({"tool_calls": [{
                "index": index, "id": call["id"], "type": "function",
                "function": {"name": function["name"], "arguments": ""}}]}))
            arguments = function["arguments"]
            out.extend(
                event({"tool_calls": [{"index": index,
                                       "function": {"arguments": arguments[i : i + 8]}}]})
                for i in range(0, len(arguments), 8)
            )
        out.append(event({}, self.finish_reason))
        if include_usage:
            usage_chunk = {**head, "choices": [], "usage": self.usage}
            out.append(b"data: " + orjson.dumps(usage_chunk) + b"\n\n")
        out.append(b"data: [DONE]\n\n")
        return out


def instant_reply(reply: Reply, body: dict[str, Any], prompt_tokens: int) -> tuple[bool, bytes]:
    """``reply`` (no delays, no cut) to the chat completion request ``body``, all at once:
    whether it is a stream, and the bytes of the response body (the completion JSON, or
    every SSE event of the stream, ``data: [DONE]`` included)."""
    rendered = _Reply(reply, body, prompt_tokens)
    if body.get("stream") is True:
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        return True, b"".join(rendered.chunks(include_usage))
    return False, rendered.completion()


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
    def running(cls, **kwargs: Any) -> FakeUpstream:
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
        rendered = _Reply(reply, body, self.count_tokens(body))
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

    def __enter__(self) -> FakeUpstream:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    async def __aenter__(self) -> FakeUpstream:
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
