"""The direct path to any OpenAI-compatible upstream, over one pooled aiohttp session.

aiohttp rather than httpx: httpx 0.28's connection pool degrades under concurrency, and this
client sits on the hot path of every request.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import Any

import aiohttp
import orjson

from proxy.errors import UpstreamConnectError, UpstreamStatusError, UpstreamTimeout
from proxy.sse import SSEParser
from proxy.upstream.base import SSEEvent, UpstreamRequest, UpstreamResponse

__all__ = ["AiohttpStream", "OpenAIUpstream", "translate_errors"]

# set by aiohttp itself or meaningless once the body is re-serialized
_DROPPED_HEADERS = frozenset(
    {"host", "content-length", "content-type", "content-encoding", "accept-encoding",
     "connection", "keep-alive", "transfer-encoding", "te", "upgrade", "proxy-connection",
     "expect"}
)


@contextmanager
def translate_errors(url: str) -> Iterator[None]:
    """The one seam where aiohttp and asyncio exceptions become ``proxy.errors``."""
    try:
        yield
    except TimeoutError as exc:  # includes aiohttp's ServerTimeoutError
        raise UpstreamTimeout(f"upstream timed out: {url}") from exc
    except aiohttp.ClientPayloadError as exc:
        raise UpstreamConnectError(f"upstream connection cut mid-response: {url}") from exc
    except aiohttp.ClientError as exc:
        raise UpstreamConnectError(f"upstream unreachable: {url}: {exc}") from exc


def _lower_headers(headers: Any) -> dict[str, str]:
    return {k.lower(): v for k, v in headers.items()}


class AiohttpStream:
    """A streaming completion: iterate for ``SSEEvent``s, ``aclose()`` when done.

    ``aclose()`` before ``[DONE]`` aborts the connection, so the upstream sees the
    disconnect and stops generating (and billing); after ``[DONE]`` it returns the
    connection to the pool.
    """

    def __init__(
        self, response: aiohttp.ClientResponse, url: str, first_byte_timeout: float | None
    ) -> None:
        self.status_code = response.status
        self.headers = _lower_headers(response.headers)
        self._response = response
        self._url = url
        self._first_byte_timeout = first_byte_timeout
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
            content = self._response.content
            with translate_errors(self._url):
                if self._first_byte_timeout is not None:
                    async with asyncio.timeout(self._first_byte_timeout):
                        chunk = await content.readany()
                    self._first_byte_timeout = None
                else:
                    chunk = await content.readany()
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
            # the reader stopped at [DONE]: read the (already sent) end of the body so the
            # connection goes back to the pool instead of being closed
            try:
                async with asyncio.timeout(1.0):
                    while await response.content.readany():
                        pass
                self._eof = True
            except (TimeoutError, aiohttp.ClientError):
                pass
        if self._eof:
            response.release()
        else:
            response.close()  # abort: the upstream must see the client go away
        self._eof = True
        self._pending.clear()


class OpenAIUpstream:
    """``POST {base_url}/chat/completions`` and ``GET {base_url}/models`` over aiohttp.

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
        self._timeout = aiohttp.ClientTimeout(total=timeout, sock_connect=connect_timeout)
        self._stream_timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=connect_timeout, sock_read=timeout
        )
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60, ttl_dns_cache=300)
            self._session = aiohttp.ClientSession(
                connector=connector, cookie_jar=aiohttp.DummyCookieJar()
            )

    async def close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    async def __aenter__(self) -> OpenAIUpstream:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def _headers(self, headers: dict[str, str], json_body: bool) -> dict[str, str]:
        out = {k: v for k, v in headers.items() if k.lower() not in _DROPPED_HEADERS}
        if self.api_key is not None:
            for key in [k for k in out if k.lower() == "authorization"]:
                del out[key]
            out["Authorization"] = f"Bearer {self.api_key}"
        if json_body:
            out["Content-Type"] = "application/json"
        return out

    async def _post(
        self, request: UpstreamRequest, body: dict[str, Any], limits: aiohttp.ClientTimeout
    ) -> aiohttp.ClientResponse:
        """Send the request and wait for the response headers; raises an error status."""
        if self._session is None:
            await self.start()
        assert self._session is not None
        url = self._chat_url
        with translate_errors(url):
            pending = self._session.post(
                url, data=orjson.dumps(body), headers=self._headers(request.headers, True),
                timeout=limits,
            )
            if self.first_byte_timeout is not None:
                async with asyncio.timeout(self.first_byte_timeout):
                    response = await pending
            else:
                response = await pending
            if response.status >= 300:
                try:
                    error_body = await response.read()
                finally:
                    response.release()
                raise UpstreamStatusError(
                    f"upstream answered {response.status}",
                    status_code=response.status,
                    body=error_body,
                    content_type=response.headers.get("Content-Type", ""),
                )
        return response

    async def chat(self, request: UpstreamRequest) -> UpstreamResponse:
        body = request.body
        if body.get("stream"):
            body = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
        response = await self._post(request, body, self._timeout)
        try:
            with translate_errors(self._chat_url):
                data = await response.read()
        except BaseException:
            response.close()
            raise
        return UpstreamResponse(response.status, data, _lower_headers(response.headers))

    async def chat_stream(self, request: UpstreamRequest) -> AiohttpStream:
        body = request.body
        if body.get("stream") is not True:
            body = {**body, "stream": True}
        response = await self._post(request, body, self._stream_timeout)
        return AiohttpStream(response, self._chat_url, self.first_byte_timeout)

    async def models(self, headers: dict[str, str]) -> UpstreamResponse:
        if self._session is None:
            await self.start()
        assert self._session is not None
        with translate_errors(self._models_url):
            async with self._session.get(
                self._models_url, headers=self._headers(headers, False), timeout=self._timeout
            ) as response:
                data = await response.read()
        return UpstreamResponse(response.status, data, _lower_headers(response.headers))
