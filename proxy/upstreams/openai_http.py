"""The direct path to any OpenAI-compatible upstream, on aiohttp.

What users of an HTTP proxy expect comes with the library: ``HTTP(S)_PROXY`` and
``NO_PROXY`` (``trust_env``), a connection limit, keep-alive pooling, TLS settings (a CA
bundle, a client certificate), redirects (credentials dropped on another origin), and
``gzip``/``deflate`` bodies decoded. Requests ask for ``Accept-Encoding: identity``:
replies are small JSON or SSE that the proxy parses anyway, so compression would only add
CPU at both ends, and a compressing front may buffer an SSE stream into bigger, later
chunks.
"""

from __future__ import annotations

import asyncio
import os
import ssl
import urllib.request
from collections import deque
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any
from urllib.parse import urljoin, urlsplit

import aiohttp
import orjson

from proxy.errors import (
    UpstreamConnectError,
    UpstreamError,
    UpstreamStatusError,
    UpstreamTimeout,
)
from proxy.upstreams.base import SSEEvent, UpstreamRequest, UpstreamResponse
from proxy.upstreams.sse import SSEParser

if TYPE_CHECKING:
    from proxy.settings import Settings

__all__ = ["OpenAIStream", "OpenAIUpstream", "TLSSettings", "upstream_error"]

# set by the client library itself or meaningless once the body is re-serialized
_DROPPED_HEADERS = frozenset(
    {"host", "content-length", "content-type", "content-encoding", "accept-encoding",
     "connection", "keep-alive", "transfer-encoding", "te", "upgrade", "proxy-connection",
     "expect"}
)
_BASE_HEADERS = {"accept": "*/*", "accept-encoding": "identity", "user-agent": "memory-proxy"}
_JSON_HEADERS = {**_BASE_HEADERS, "content-type": "application/json"}
# after [DONE], how long aclose() waits for the end of the body to keep the connection
_DRAIN_SECONDS = 1.0
_KEEPALIVE_SECONDS = 60.0
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_MAX_REDIRECTS = 10


def _is_https(url: str) -> bool:
    return url[:8].lower() == "https://"


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    return parts.scheme, parts.hostname or "", parts.port


@dataclass(frozen=True, slots=True)
class TLSSettings:
    """How the upstream's certificate is checked and what the proxy presents: a CA bundle
    instead of the system's trust store, a client certificate (and its key), or no check
    at all (``verify=False``: only for a test upstream)."""

    ca_bundle: str | None = None
    client_cert: str | None = None
    client_key: str | None = None
    verify: bool = True

    @classmethod
    def from_settings(cls, settings: Settings) -> TLSSettings:
        """The ``MEMORY_PROXY_UPSTREAM_*`` TLS settings, shared by every upstream client."""
        return cls(
            ca_bundle=settings.upstream_ca_bundle,
            client_cert=settings.upstream_client_cert,
            client_key=settings.upstream_client_key,
            verify=settings.upstream_tls_verify,
        )

    def context(self) -> ssl.SSLContext | bool:
        if not self.verify:
            return False
        context = ssl.create_default_context(cafile=self.ca_bundle)
        if self.client_cert:
            context.load_cert_chain(self.client_cert, self.client_key)
        return context


def upstream_error(exc: BaseException, url: str) -> UpstreamError:
    """The one seam where the HTTP client's failures become ``proxy.errors``."""
    if isinstance(exc, TimeoutError):
        return UpstreamTimeout(f"upstream timed out: {url}")
    if isinstance(exc, aiohttp.ClientPayloadError | aiohttp.ServerDisconnectedError):
        return UpstreamConnectError(f"upstream connection cut mid-response: {url}")
    if isinstance(exc, aiohttp.InvalidURL):
        return UpstreamConnectError(f"upstream unreachable: {url}: not an http(s) URL")
    return UpstreamConnectError(f"upstream unreachable: {url}: {exc}")


def _headers_of(response: aiohttp.ClientResponse) -> dict[str, str]:
    """Response headers, lower-cased; a repeated header's values joined as HTTP allows."""
    out: dict[str, str] = {}
    for name, value in response.headers.items():
        key = name.lower()
        out[key] = f"{out[key]}, {value}" if key in out else value
    return out


class OpenAIStream:
    """A streaming completion: iterate for ``SSEEvent``s, ``aclose()`` when done.

    Each read of the upstream is parsed whole; ``ready()`` hands over the rest of what one
    read brought. ``aclose()`` before ``[DONE]`` aborts the connection, so the upstream
    sees the disconnect and stops generating (and billing); after ``[DONE]`` it returns
    the connection to the pool.
    """

    def __init__(
        self, response: aiohttp.ClientResponse, url: str, read_timeout: float | None,
        first_byte_timeout: float | None,
    ) -> None:
        self.status_code = response.status
        self.headers = _headers_of(response)
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
                async with asyncio.timeout(self._next_timeout):
                    chunk = await self._response.content.readany()
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise upstream_error(exc, self._url) from exc
            self._next_timeout = self._read_timeout
            if chunk:
                events = self._parser.feed(chunk)
                if events and self._ends(events[-1]):
                    self._saw_done = True
                pending.extend(events)
            else:
                self._eof = True
                pending.extend(self._parser.flush())
        return pending.popleft()

    @staticmethod
    def _ends(event: SSEEvent) -> bool:
        """The stream's last event (the body ends after it)."""
        return event.data == b"[DONE]"

    def ready(self) -> list[SSEEvent]:
        """The events already received and not iterated yet, taken without waiting."""
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
                async with asyncio.timeout(_DRAIN_SECONDS):
                    await response.read()
            except (aiohttp.ClientError, TimeoutError):
                pass
        if response.content.at_eof():
            response.release()
        else:
            response.close()  # aborts: the upstream sees the client go
        self._eof = True
        self._pending.clear()


def _min(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    return a if b is None else min(a, b)


def environment_has_settings() -> bool:
    """Whether aiohttp's ``trust_env`` has anything to take from this process's
    environment: a proxy variable (``HTTP_PROXY``, ``HTTPS_PROXY``, ``ALL_PROXY``, ...) or a
    netrc file (``NETRC``, ``~/.netrc``). aiohttp reads them again for every request, on a
    thread of its executor; where none is set that is a thread hop and a walk over the
    environment per call for nothing, so the session does not ask."""
    if urllib.request.getproxies():
        return True
    netrc = os.environ.get("NETRC") or os.path.join(os.path.expanduser("~"), ".netrc")
    return os.path.exists(netrc)


class OpenAIUpstream:
    """``POST {base_url}/chat/completions`` and ``GET {base_url}/models``.

    ``timeout`` bounds a whole non-streaming call and the silence between two reads of a
    stream; ``first_byte_timeout`` (optional) bounds the wait for the response headers and,
    for a stream, for its first bytes. When ``api_key`` is set it replaces the client's
    ``Authorization``; otherwise the request's headers are forwarded as given.
    ``max_connections`` bounds the pool; ``trust_env`` takes ``HTTP(S)_PROXY`` and
    ``NO_PROXY`` (and a netrc file) from the environment as it is when the client starts.

    The TLS context (``tls``: the trust store or a CA bundle, a client certificate) is
    built at start for an ``https`` base URL, else on the first request to an ``https``
    URL (a redirect): a plain-HTTP upstream never reads the trust store or the certificate
    files (building the context takes about 20 ms). Only the upstream's own URL needs it:
    aiohttp takes no ``https`` proxy from the environment, and the tunnel through a plain
    one carries the upstream's TLS.
    """

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout: float = 600,
        connect_timeout: float = 10,
        first_byte_timeout: float | None = None,
        max_connections: int = 100,
        tls: TLSSettings | None = None,
        trust_env: bool = True,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.first_byte_timeout = first_byte_timeout
        self._chat_url = f"{self.base_url}/chat/completions"
        self._models_url = f"{self.base_url}/models"
        self._timeout = timeout
        self._connect_timeout = connect_timeout
        self._max_connections = max_connections
        self._tls = tls or TLSSettings()
        self._trust_env = trust_env
        self._authorization = None if api_key is None else f"Bearer {api_key}"
        self._session: aiohttp.ClientSession | None = None
        self._ssl: ssl.SSLContext | bool | None = None  # built when first needed

    async def start(self) -> None:
        if self._session is None:
            if self._ssl is None and _is_https(self.base_url):
                self._ssl = self._tls.context()
            connector = aiohttp.TCPConnector(
                limit=self._max_connections, keepalive_timeout=_KEEPALIVE_SECONDS
            )
            # no cookie jar: the session is shared by every client of the proxy, and a
            # cookie one answer sets (a provider's edge sets them) must not go out with
            # another tenant's requests; a client's own Cookie header is forwarded as sent
            self._session = aiohttp.ClientSession(
                connector=connector, cookie_jar=aiohttp.DummyCookieJar(),
                trust_env=self._trust_env and environment_has_settings(),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=self._connect_timeout),
                skip_auto_headers=("User-Agent", "Accept-Encoding", "Accept"),
            )

    def _ssl_for(self, url: str) -> ssl.SSLContext | bool:
        """The TLS context for a request to ``url``; ``True`` (aiohttp's default, unused by
        a plain-HTTP connection) while no request has needed ours."""
        context = self._ssl
        if context is None:
            if not _is_https(url):
                return True
            context = self._ssl = self._tls.context()
        return context

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
        self, method: str, url: str, headers: dict[str, str], body: bytes | None,
        header_timeout: float | None,
    ) -> aiohttp.ClientResponse:
        """Send the request and wait for the response headers (``header_timeout``)."""
        if self._session is None:
            await self.start()
        assert self._session is not None
        session = self._session
        try:
            async with asyncio.timeout(header_timeout):
                for _ in range(_MAX_REDIRECTS):
                    response = await session.request(
                        method, url, data=body, headers=headers, allow_redirects=False,
                        ssl=self._ssl_for(url),
                    )
                    location = response.headers.get("location")
                    # a 301/302/303 answer to a POST is passed back as it is (following it
                    # would turn the call into a GET); other redirects keep the request
                    if response.status not in _REDIRECTS or location is None or (
                        body is not None and response.status < 307
                    ):
                        return response
                    await response.read()
                    response.release()
                    moved = urljoin(url, location)
                    if _origin(moved) != _origin(url):  # credentials stay with their origin
                        headers = {k: v for k, v in headers.items() if k != "authorization"}
                    url = moved
                return response
        except (aiohttp.ClientError, TimeoutError, ValueError, OSError) as exc:
            raise upstream_error(exc, url) from exc

    async def _read(self, response: aiohttp.ClientResponse, url: str, seconds: float) -> bytes:
        try:
            async with asyncio.timeout(seconds):
                return await response.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise upstream_error(exc, url) from exc
        finally:
            response.release()

    async def _post(
        self, request: UpstreamRequest, body: dict[str, Any], header_timeout: float | None,
        deadline: float, url: str | None = None,
    ) -> aiohttp.ClientResponse:
        """Send the request (to the chat URL, or ``url``) and wait for the response
        headers; raises an error status."""
        url = url or self._chat_url
        response = await self._request(
            "POST", url, self._headers(request.headers, True), orjson.dumps(body),
            header_timeout,
        )
        if response.status >= 300:
            error_body = await self._read(response, url, self._remaining(deadline))
            raise UpstreamStatusError(
                f"upstream answered {response.status}",
                status_code=response.status,
                body=error_body,
                content_type=response.headers.get("content-type", ""),
                secrets=request.secrets(self.api_key),
            )
        return response

    @staticmethod
    def _remaining(deadline: float) -> float:
        return max(0.0, deadline - asyncio.get_running_loop().time())

    async def chat(self, request: UpstreamRequest) -> UpstreamResponse:
        body = request.body
        if body.get("stream"):
            body = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
        deadline = asyncio.get_running_loop().time() + self._timeout
        response = await self._post(
            request, body, _min(self._timeout, self.first_byte_timeout), deadline
        )
        data = await self._read(response, self._chat_url, self._remaining(deadline))
        return UpstreamResponse(response.status, data, _headers_of(response))

    async def chat_stream(self, request: UpstreamRequest) -> OpenAIStream:
        body = request.body
        if body.get("stream") is not True:
            body = {**body, "stream": True}
        header_timeout = _min(self._timeout, self.first_byte_timeout)
        deadline = asyncio.get_running_loop().time() + self._timeout
        response = await self._post(request, body, header_timeout, deadline)
        return OpenAIStream(response, self._chat_url, self._timeout, self.first_byte_timeout)

    async def post(self, path: str, request: UpstreamRequest) -> UpstreamResponse:
        """``POST {base_url}{path}`` with the request's body, the whole reply (another API
        of the same upstream: the Responses API's ``/responses``)."""
        url = self.base_url + path
        deadline = asyncio.get_running_loop().time() + self._timeout
        response = await self._post(
            request, request.body, _min(self._timeout, self.first_byte_timeout), deadline, url
        )
        data = await self._read(response, url, self._remaining(deadline))
        return UpstreamResponse(response.status, data, _headers_of(response))

    async def post_stream(self, path: str, request: UpstreamRequest) -> OpenAIStream:
        """``POST {base_url}{path}`` answered with server-sent events."""
        url = self.base_url + path
        header_timeout = _min(self._timeout, self.first_byte_timeout)
        deadline = asyncio.get_running_loop().time() + self._timeout
        response = await self._post(request, request.body, header_timeout, deadline, url)
        return OpenAIStream(response, url, self._timeout, self.first_byte_timeout)

    async def models(self, headers: dict[str, str]) -> UpstreamResponse:
        url = self._models_url
        response = await self._request(
            "GET", url, self._headers(headers, False), None, self._timeout
        )
        data = await self._read(response, url, self._timeout)
        return UpstreamResponse(response.status, data, _headers_of(response))
