"""Plain ASGI for the hot path: the chat completion route runs without Starlette's
request and response objects, routing and middleware (about a tenth of a turn's CPU).

``ChatCall`` is what the handler reads from the request; ``BodyReply`` and
``StreamReply`` are what it answers, each sent with raw ASGI messages. Errors take the
same OpenAI shape as everywhere else (``proxy.errors``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from proxy.errors import ProxyError
from proxy.http.disconnect import DisconnectWatch
from proxy.http.requests import receive_body
from proxy.metrics import inc

logger = logging.getLogger("memory_proxy")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

JSON = b"application/json"
SERVER_ERROR = (
    b'{"error":{"message":"internal error in memory-proxy","type":"server_error",'
    b'"param":null,"code":null}}'
)


def header_map(scope: Scope) -> dict[str, str]:
    """Request headers by lower-case name; the first of repeated headers wins (as
    Starlette's ``Headers``)."""
    return {
        name.decode("latin-1").lower(): value.decode("latin-1")
        for name, value in reversed(scope["headers"])
    }


@dataclass(slots=True)
class ChatCall:
    """One chat completion request as the handler sees it."""

    headers: dict[str, str]
    path_params: dict[str, str]
    receive: Receive

    @classmethod
    def from_scope(cls, scope: Scope, receive: Receive) -> ChatCall:
        return cls(header_map(scope), dict(scope.get("path_params") or {}), receive)

    async def body(self, limit: int) -> bytes:
        return await receive_body(self.receive, self.headers.get("content-length"), limit)


def _raw_headers(headers: dict[str, str], media_type: bytes) -> list[tuple[bytes, bytes]]:
    raw = [(b"content-type", media_type)]
    raw += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
    return raw


@dataclass(slots=True)
class BodyReply:
    """A whole response body."""

    status: int
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)
    media_type: bytes = JSON

    async def send(self, send: Send, receive: Receive) -> None:
        raw = _raw_headers(self.headers, self.media_type)
        raw.append((b"content-length", str(len(self.body)).encode()))
        await send({"type": "http.response.start", "status": self.status, "headers": raw})
        await send({"type": "http.response.body", "body": self.body})


@dataclass(slots=True)
class StreamReply:
    """A streamed response: ``chunks`` are sent as they come. A client that goes away
    cancels the iteration (whose cleanup aborts the upstream call)."""

    chunks: AsyncIterator[bytes]
    headers: dict[str, str] = field(default_factory=dict)
    media_type: bytes = b"text/event-stream"
    # sent in place of the rest of the stream when it fails unexpectedly
    error_event: bytes = b"data: " + SERVER_ERROR + b"\n\n"

    async def send(self, send: Send, receive: Receive) -> None:
        raw = _raw_headers(self.headers, self.media_type)
        await send({"type": "http.response.start", "status": 200, "headers": raw})
        watch = DisconnectWatch(receive)
        try:
            try:
                async for chunk in self.chunks:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            except asyncio.CancelledError:
                if watch.caused():
                    return  # the client went away: nothing left to send to
                raise
            except Exception:
                logger.exception("stream failed")
                await send({"type": "http.response.body", "body": self.error_event,
                            "more_body": True})  # fmt: skip
            await send({"type": "http.response.body", "body": b""})
        finally:
            watch.stop()
            aclose = getattr(self.chunks, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(Exception):
                    await aclose()


async def send_error(send: Send, exc: ProxyError) -> None:
    inc("memory_proxy_errors_total", type=exc.error_type)
    await BodyReply(exc.status_code, exc.body(), exc.headers).send(send, _never)


async def send_server_error(send: Send) -> None:
    inc("memory_proxy_errors_total", type="server_error")
    await BodyReply(500, SERVER_ERROR).send(send, _never)


async def _never() -> Message:
    raise RuntimeError("not used")
