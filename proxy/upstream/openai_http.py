"""The direct path to any OpenAI-compatible upstream, over the pooled HTTP/1.1 client of
``proxy.upstream.http1``.

Why a hand-rolled client: this call sits on the hot path of every turn, and aiohttp's
``ClientSession`` cost about 0.27 ms of CPU per proxied request on the 2-core benchmark
machine (~17% of a turn). ``http1`` (asyncio protocols, ``httptools``' C parser, timers
instead of tasks) does the same calls for about a third of the CPU: with
``bench/upstream_client.py`` on uvloop, 0.23 -> 0.07 ms per call at concurrency 32,
0.35 -> 0.16 ms sequentially, 0.53 -> 0.25 ms per stream (the driver's ~0.01 ms included).
(httpx was ruled out earlier: its 0.28 connection pool degrades under concurrency.)

Requests ask for ``Accept-Encoding: identity``: replies are small JSON or SSE that the
proxy parses anyway, so compression would only add CPU at both ends, and a compressing
front (nginx, a CDN) may buffer an SSE stream into bigger, later chunks. A ``gzip`` or
``deflate`` body sent regardless is decoded.
"""

from __future__ import annotations

import asyncio
from collections import deque
from types import TracebackType
from typing import Any
from urllib.parse import urljoin

import orjson

from proxy.errors import (
    UpstreamConnectError,
    UpstreamError,
    UpstreamStatusError,
    UpstreamTimeout,
)
from proxy.sse import SSEParser
from proxy.upstream.base import SSEEvent, UpstreamRequest, UpstreamResponse
from proxy.upstream.http1 import HTTP1Client, IncompleteResponse, Response, Target

__all__ = ["OpenAIStream", "OpenAIUpstream", "upstream_error"]

# set by the client itself or meaningless once the body is re-serialized
_DROPPED_HEADERS = frozenset(
    {"host", "content-length", "content-type", "content-encoding", "accept-encoding",
     "connection", "keep-alive", "transfer-encoding", "te", "upgrade", "proxy-connection",
     "expect"}
)
_BASE_HEADERS = {"accept": "*/*", "accept-encoding": "identity", "user-agent": "memory-proxy"}
_JSON_HEADERS = {**_BASE_HEADERS, "content-type": "application/json"}
# after [DONE], how long aclose() waits for the end of the body to keep the connection
_DRAIN_SECONDS = 1.0
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_MAX_REDIRECTS = 10


def upstream_error(exc: OSError, url: str) -> UpstreamError:
    """The one seam where the HTTP client's failures become ``proxy.errors``."""
    if isinstance(exc, TimeoutError):
        return UpstreamTimeout(f"upstream timed out: {url}")
    if isinstance(exc, IncompleteResponse):
        return UpstreamConnectError(f"upstream connection cut mid-response: {url}")
    return UpstreamConnectError(f"upstream unreachable: {url}: {exc}")


class OpenAIStream:
    """A streaming completion: iterate for ``SSEEvent``s, ``aclose()`` when done.

    ``aclose()`` before ``[DONE]`` aborts the connection, so the upstream sees the
    disconnect and stops generating (and billing); after ``[DONE]`` it returns the
    connection to the pool.
    """

    def __init__(
        self, response: Response, url: str, read_timeout: float | None,
        first_byte_timeout: float | None,
    ) -> None:
        self.status_code = response.status
        self.headers = response.headers
        self._response = response
        self._url = url
        self._read_timeout = read_timeout
        self._next_timeout = _min(read_timeout, first_byte_timeout)
        self._parser = SSEParser()
        self._pending: deque[SSEEvent] = deque()
        self._eof = False
        self._saw_done = False

    def __aiter__(self) -> OpenAIStream:
        return self

    async def __anext__(self) -> SSEEvent:
        pending = self._pending
        while not pending:
            if self._eof:
                raise StopAsyncIteration
            try:
                chunk = await self._response.next_chunk(self._next_timeout)
            except OSError as exc:
                raise upstream_error(exc, self._url) from exc
            self._next_timeout = self._read_timeout
            if chunk:
                events = self._parser.feed(chunk)
                if events and events[-1].data == b"[DONE]":
                    self._saw_done = True
                pending.extend(events)
            else:
                self._eof = True
                pending.extend(self._parser.flush())
        return pending.popleft()

    def ready(self) -> list[SSEEvent]:
        """The events already received and not iterated yet, taken without waiting: the
        rest of what one read of the upstream brought."""
        pending = self._pending
        if not pending:
            return []
        events = list(pending)
        pending.clear()
        return events

    async def aclose(self) -> None:
        response = self._response
        if not self._eof and self._saw_done:
            # the reader stopped at [DONE]: read the (already sent) end of the body so the
            # connection goes back to the pool instead of being closed
            try:
                await response.read(asyncio.get_running_loop().time() + _DRAIN_SECONDS)
            except OSError:
                pass
        response.close()  # aborts unless the body was read to its end
        self._eof = True
        self._pending.clear()


def _deadline(deadline: float | None, timeout: float) -> float:
    return asyncio.get_running_loop().time() + timeout if deadline is None else deadline


def _min(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    return a if b is None else min(a, b)


class OpenAIUpstream:
    """``POST {base_url}/chat/completions`` and ``GET {base_url}/models`` over ``http1``.

    ``timeout`` bounds a whole non-streaming call and the silence between two reads of a
    stream; ``first_byte_timeout`` (optional) bounds the wait for the response headers and,
    for a stream, for its first bytes. When ``api_key`` is set it replaces the client's
    ``Authorization``; otherwise the request's headers are forwarded as given.
    """

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout: float = 600,
        connect_timeout: float = 10,
        first_byte_timeout: float | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.first_byte_timeout = first_byte_timeout
        self._chat_url = f"{self.base_url}/chat/completions"
        self._models_url = f"{self.base_url}/models"
        self._timeout = timeout
        self._connect_timeout = connect_timeout
        self._authorization = None if api_key is None else f"Bearer {api_key}"
        self._chat_target: Target | None = None
        self._models_target: Target | None = None
        self._bad_url: ValueError | None = None
        try:
            self._chat_target = Target.parse(self._chat_url)
            self._models_target = Target.parse(self._models_url)
        except ValueError as exc:  # reported per call, as an unreachable upstream
            self._bad_url = exc
        self._client: HTTP1Client | None = None

    async def start(self) -> None:
        if self._client is None:
            self._client = HTTP1Client(keepalive=60, connect_timeout=self._connect_timeout)

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.close()

    async def __aenter__(self) -> OpenAIUpstream:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def _headers(self, headers: dict[str, str], json_body: bool) -> dict[str, str]:
        out = dict(_JSON_HEADERS if json_body else _BASE_HEADERS)
        replace_auth = self._authorization is not None
        for name, value in headers.items():
            key = name.lower()
            if key in _DROPPED_HEADERS or (replace_auth and key == "authorization"):
                continue
            out[key] = value
        if self._authorization is not None:
            out["authorization"] = self._authorization
        return out

    async def _request(
        self, method: str, target: Target | None, url: str, headers: dict[str, str],
        body: bytes | None, deadline: float | None, header_timeout: float | None,
    ) -> Response:
        if self._client is None:
            await self.start()
        assert self._client is not None
        if target is None:
            raise UpstreamConnectError(f"upstream unreachable: {url}: {self._bad_url}")
        try:
            for _ in range(_MAX_REDIRECTS):
                response = await self._client.request(
                    method, target, headers, body, deadline=deadline,
                    header_timeout=header_timeout,
                )
                status = response.status
                if status not in _REDIRECTS or (body is not None and status < 307):
                    return response
                location = response.headers.get("location")
                if location is None:
                    return response
                # a redirect that keeps the request as it is: follow it, as aiohttp did
                await response.read(_deadline(deadline, self._timeout))
                url = urljoin(url, location)
                try:
                    moved = Target.parse(url)
                except ValueError:
                    raise UpstreamConnectError(f"upstream redirected to {url}") from None
                if moved.origin != target.origin:  # credentials stay with their origin
                    headers = {k: v for k, v in headers.items() if k != "authorization"}
                target = moved
        except OSError as exc:
            raise upstream_error(exc, url) from exc
        return response

    async def _post(
        self, request: UpstreamRequest, body: dict[str, Any], deadline: float | None,
        header_timeout: float | None,
    ) -> Response:
        """Send the request and wait for the response headers; raises an error status."""
        url = self._chat_url
        response = await self._request(
            "POST", self._chat_target, url, self._headers(request.headers, True),
            orjson.dumps(body), deadline, header_timeout,
        )
        if response.status >= 300:
            try:
                error_body = await response.read(_deadline(deadline, self._timeout))
            except OSError as exc:
                raise upstream_error(exc, url) from exc
            raise UpstreamStatusError(
                f"upstream answered {response.status}",
                status_code=response.status,
                body=error_body,
                content_type=response.headers.get("content-type", ""),
                secrets=request.secrets(self.api_key),
            )
        return response

    async def chat(self, request: UpstreamRequest) -> UpstreamResponse:
        body = request.body
        if body.get("stream"):
            body = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
        deadline = asyncio.get_running_loop().time() + self._timeout
        response = await self._post(request, body, deadline, self.first_byte_timeout)
        try:
            data = await response.read(deadline)
        except OSError as exc:
            raise upstream_error(exc, self._chat_url) from exc
        return UpstreamResponse(response.status, data, response.headers)

    async def chat_stream(self, request: UpstreamRequest) -> OpenAIStream:
        body = request.body
        if body.get("stream") is not True:
            body = {**body, "stream": True}
        header_timeout = _min(self._timeout, self.first_byte_timeout)
        response = await self._post(request, body, None, header_timeout)
        return OpenAIStream(response, self._chat_url, self._timeout, self.first_byte_timeout)

    async def models(self, headers: dict[str, str]) -> UpstreamResponse:
        url = self._models_url
        deadline = asyncio.get_running_loop().time() + self._timeout
        response = await self._request(
            "GET", self._models_target, url, self._headers(headers, False), None, deadline, None
        )
        try:
            data = await response.read(deadline)
        except OSError as exc:
            raise upstream_error(exc, url) from exc
        return UpstreamResponse(response.status, data, response.headers)
