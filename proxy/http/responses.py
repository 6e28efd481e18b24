"""JSON responses serialized with orjson, the SSE response, and the one exception
handler table: any ``ProxyError`` (and the store's errors, through
``errors.as_proxy_error``) is rendered in the shape of the API surface that was called
(``request.state.surface``, set by the turn pipeline; OpenAI's shape otherwise)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Mapping
from typing import Any

import orjson
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from proxy.errors import ProxyError, as_proxy_error
from proxy.http.disconnect import DisconnectWatch
from proxy.metrics import inc
from storage.base import StoreUnavailable

logger = logging.getLogger("memory_proxy")

HTTP_ERROR_TYPES = {404: "not_found_error", 405: "invalid_request_error"}
SERVER_ERROR = ProxyError("internal error in memory-proxy")


def json_response(
    data: Any, *, status_code: int = 200, headers: dict[str, str] | None = None
) -> Response:
    return Response(
        orjson.dumps(data), status_code=status_code, media_type="application/json", headers=headers
    )


def error_response(status: int, message: str, error_type: str, code: str | None = None) -> Response:
    body = {"error": {"message": message, "type": error_type, "param": None, "code": code}}
    return json_response(body, status_code=status)


def error_body(request: Request, exc: ProxyError) -> bytes:
    """``exc`` in the shape of the surface that was called."""
    surface = getattr(request.state, "surface", None)
    return surface.error_body(exc) if surface is not None else exc.body()


async def proxy_error_handler(request: Request, exc: Exception) -> Response:
    error = as_proxy_error(exc)
    assert error is not None
    inc("memory_proxy_errors_total", type=error.error_type)
    return Response(
        error_body(request, error),
        status_code=error.status_code,
        media_type="application/json",
        headers=error.headers,
    )


async def http_error_handler(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return error_response(
        exc.status_code,
        str(exc.detail),
        HTTP_ERROR_TYPES.get(exc.status_code, "invalid_request_error"),
    )


async def unexpected_error_handler(request: Request, exc: Exception) -> Response:
    logger.exception("unexpected error on %s %s", request.method, request.url.path)
    inc("memory_proxy_errors_total", type="server_error")
    return Response(
        error_body(request, SERVER_ERROR), status_code=500, media_type="application/json"
    )


# the one table: create_app installs it
EXCEPTION_HANDLERS: dict[Any, Any] = {
    ProxyError: proxy_error_handler,
    StoreUnavailable: proxy_error_handler,
    HTTPException: http_error_handler,
    Exception: unexpected_error_handler,
}


class SSEResponse(StreamingResponse):
    """A server-sent event stream: chunks are sent as they come. A client that goes away
    cancels the iteration (whose cleanup aborts the upstream call); a failure nobody
    caught ends the stream with ``error_event``."""

    media_type = "text/event-stream"

    def __init__(
        self,
        content: AsyncIterator[bytes],
        *,
        headers: Mapping[str, str] | None = None,
        error_event: bytes,
        media_type: str | None = None,
    ) -> None:
        sse_headers = {"cache-control": "no-cache", "x-accel-buffering": "no", **(headers or {})}
        super().__init__(content, headers=sse_headers, media_type=media_type)
        self.error_event = error_event

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        chunks = self.body_iterator
        await send(
            {"type": "http.response.start", "status": self.status_code,
             "headers": self.raw_headers}
        )
        watch = DisconnectWatch(receive)
        try:
            try:
                async for chunk in chunks:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            except asyncio.CancelledError:
                if watch.caused():
                    return  # the client went away: nothing left to send to
                raise
            except Exception:
                logger.exception("stream failed")
                await send(
                    {"type": "http.response.body", "body": self.error_event, "more_body": True}
                )
            await send({"type": "http.response.body", "body": b""})
        finally:
            watch.stop()
            aclose = getattr(chunks, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(Exception):
                    await aclose()
