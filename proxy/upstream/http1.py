"""A small HTTP/1.1 client on asyncio protocols and ``httptools``: just what the upstream
path needs, at a fraction of a general-purpose client's CPU per request.

    client = HTTP1Client()
    target = Target.parse("https://api.openai.com/v1/chat/completions")
    response = await client.request("POST", target, {"authorization": "..."}, body,
                                    deadline=loop.time() + 600)
    data = await response.read(deadline)         # or: while chunk := await response.next_chunk()
    await client.close()

- Keep-alive pool per origin (scheme, host, port), no limit on connections; an idle
  connection expires after ``keepalive`` seconds and one the peer closed is never reused. A
  request that fails on a reused connection before any response byte arrived (the server
  closed it as the request went out: the keep-alive race) is retried once on a new
  connection; nothing else is retried (a POST is not idempotent).
- Request bodies are bytes with a Content-Length. Responses: Content-Length, chunked or
  read-until-close bodies; ``gzip``/``deflate`` are decoded; header names are lower-cased.
- Timeouts are deadlines on the event loop's clock, armed as one timer per wait, not tasks.
- A response not read to its end is aborted when closed, so the server sees the disconnect
  (and stops generating); a finished one goes back to the pool unless the server said
  ``Connection: close`` or spoke HTTP/1.0.

Failures are ``OSError``s: ``TimeoutError`` for timeouts, ``ConnectionError`` subclasses
(``ConnectionClosed``, ``IncompleteResponse``, ``ProtocolError``) and the socket's own
errors (refused, reset, DNS, TLS) otherwise; callers translate them at one seam.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from proxy.upstream.http1_connection import (
    ConnectionClosed,
    HTTPConnection,
    IncompleteResponse,
    ProtocolError,
)

__all__ = [
    "ConnectionClosed",
    "HTTP1Client",
    "IncompleteResponse",
    "ProtocolError",
    "Response",
    "Target",
]

Origin = tuple[str, str, int]


@dataclass(frozen=True, slots=True)
class Target:
    """A parsed ``http(s)://`` URL: where to connect and what to put on the request line."""

    scheme: str
    host: str
    port: int
    path: str  # path and query, as sent on the request line
    host_header: str

    @property
    def origin(self) -> Origin:
        return (self.scheme, self.host, self.port)

    @property
    def tls(self) -> bool:
        return self.scheme == "https"

    @classmethod
    def parse(cls, url: str) -> Target:
        """``ValueError`` for anything but an absolute ``http``/``https`` URL."""
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        if scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        default_port = 443 if scheme == "https" else 80
        port = parts.port or default_port
        host = parts.hostname
        shown = f"[{host}]" if ":" in host else host
        host_header = shown if port == default_port else f"{shown}:{port}"
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        return cls(scheme, host, port, path, host_header)


def _request_bytes(
    method: str, target: Target, headers: Mapping[str, str], body: bytes | None
) -> bytes:
    lines = "".join([f"{name}: {value}\r\n" for name, value in headers.items()])
    if lines.count("\n") != len(headers) or lines.count("\r") != len(headers):
        raise ValueError("a request header contains a line break")
    length = "" if body is None else f"content-length: {len(body)}\r\n"
    head = f"{method} {target.path} HTTP/1.1\r\nhost: {target.host_header}\r\n{lines}{length}\r\n"
    try:
        raw = head.encode("latin-1")  # what the client sent arrives latin-1 decoded
    except UnicodeEncodeError:
        raw = head.encode()
    return raw + body if body else raw


class Response:
    """A response whose status and headers have arrived; the body is read from it.

    ``close()`` (also done by ``read()`` and by ``next_chunk()`` at the end of the body)
    returns the connection to the pool when the body was read to its end, and aborts it
    otherwise. Reading methods close the response when they raise or are cancelled.
    """

    __slots__ = ("_client", "_conn", "headers", "status")

    def __init__(self, conn: HTTPConnection, client: HTTP1Client) -> None:
        self.status = conn.status
        self.headers = conn.headers  # lower-cased names
        self._conn: HTTPConnection | None = conn
        self._client = client

    async def read(self, deadline: float | None = None) -> bytes:
        """The rest of the body (decoded); ``TimeoutError`` at ``deadline`` (loop time)."""
        conn = self._conn
        if conn is None:
            return b""
        parts = []
        try:
            while not conn.complete:
                if conn.chunks:
                    parts.append(conn.take())  # keeps a paused socket flowing
                if conn.error is not None:
                    raise conn.error
                await conn.wait(deadline)
        except BaseException:
            self.close()
            raise
        if conn.chunks:
            parts.append(conn.take())
        self.close()
        return parts[0] if len(parts) == 1 else b"".join(parts)

    async def next_chunk(self, read_timeout: float | None = None) -> bytes:
        """The body bytes that arrived since the last call, waiting up to ``read_timeout``
        seconds for some; ``b""`` once the body is complete."""
        conn = self._conn
        if conn is None:
            return b""
        try:
            while not conn.chunks:
                if conn.complete:
                    self.close()
                    return b""
                if conn.error is not None:
                    raise conn.error
                await conn.wait(None if read_timeout is None else conn.loop.time() + read_timeout)
        except BaseException:
            self.close()
            raise
        return conn.take()

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            self._client._release(conn)


class HTTP1Client:
    """Pooled HTTP/1.1 connections to any number of origins (see the module docstring).

    ``ssl_context`` defaults to ``ssl.create_default_context()``, made on the first
    ``https`` connection.
    """

    def __init__(
        self,
        *,
        keepalive: float = 60.0,
        connect_timeout: float | None = 10.0,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.keepalive = keepalive
        self.connect_timeout = connect_timeout
        self._ssl_context = ssl_context
        self._idle: dict[Origin, list[HTTPConnection]] = {}
        self._open: set[HTTPConnection] = set()
        self._sweeper: asyncio.TimerHandle | None = None

    @property
    def open_connections(self) -> int:
        return len(self._open)

    async def request(
        self,
        method: str,
        target: Target,
        headers: Mapping[str, str],
        body: bytes | None = None,
        *,
        deadline: float | None = None,
        header_timeout: float | None = None,
    ) -> Response:
        """Send a request and wait for the response's status and headers.

        ``deadline`` (loop time) bounds the call up to the headers (pass it on to
        ``Response.read``); ``header_timeout`` (seconds from now) bounds the wait for them.
        Connecting is bounded by ``connect_timeout`` as well.
        """
        loop = asyncio.get_running_loop()
        if header_timeout is not None:
            limit = loop.time() + header_timeout
            deadline = limit if deadline is None else min(deadline, limit)
        data = _request_bytes(method, target, headers, body)
        conn = self._checkout(target.origin, loop)
        if conn is not None:
            try:
                return await self._exchange(conn, data, deadline)
            except ConnectionClosed:
                pass  # the keep-alive race: closed by the server as the request went out
        conn = await self._connect(loop, target, deadline)
        return await self._exchange(conn, data, deadline)

    async def close(self) -> None:
        """Close every connection, idle or busy, and wait until their sockets are closed."""
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        self._idle.clear()
        waiters = []
        for conn in list(self._open):
            waiter = conn.closed_waiter()
            conn.abort()
            if waiter is not None:
                waiters.append(waiter)
        if waiters:
            await asyncio.wait(waiters, timeout=5)

    # ---- the pool ----

    def _checkout(
        self, origin: Origin, loop: asyncio.AbstractEventLoop
    ) -> HTTPConnection | None:
        idle = self._idle.get(origin)
        if not idle:
            return None
        expired_before = loop.time() - self.keepalive
        while idle:
            conn = idle.pop()  # the most recently used: the least likely to be stale
            transport = conn.transport
            if conn.closed or transport is None or transport.is_closing():
                continue
            if conn.idle_since <= expired_before:
                conn.close_idle()
                continue
            return conn
        return None

    async def _exchange(self, conn: HTTPConnection, data: bytes, deadline: float | None
                        ) -> Response:
        try:
            conn.begin(data)
            while not conn.headers_done:
                if conn.error is not None:
                    raise conn.error
                await conn.wait(deadline)
        except BaseException:
            conn.abort()
            raise
        return Response(conn, self)

    async def _connect(
        self, loop: asyncio.AbstractEventLoop, target: Target, deadline: float | None
    ) -> HTTPConnection:
        timeout = self.connect_timeout
        if deadline is not None:
            left = deadline - loop.time()
            timeout = left if timeout is None else min(timeout, left)
        tls = self._ssl() if target.tls else None
        conn = HTTPConnection(loop, self, target.origin)
        async with asyncio.timeout(timeout):
            await loop.create_connection(
                lambda: conn, target.host, target.port, ssl=tls,
                server_hostname=target.host if tls is not None else None,
            )
        return conn

    def _ssl(self) -> ssl.SSLContext:
        if self._ssl_context is None:
            self._ssl_context = ssl.create_default_context()
        return self._ssl_context

    def _release(self, conn: HTTPConnection) -> None:
        conn.active = False
        if not conn.reusable():
            conn.abort()
            return
        conn.reused = True
        loop = conn.loop
        conn.idle_since = now = loop.time()
        idle = self._idle.get(conn.origin)
        if idle is None:
            idle = self._idle[conn.origin] = []
        idle.append(conn)
        if self._sweeper is None:
            self._sweeper = loop.call_at(now + self.keepalive, self._sweep, loop)

    def _sweep(self, loop: asyncio.AbstractEventLoop) -> None:
        """Close the connections idle for ``keepalive`` seconds; come back for the rest."""
        self._sweeper = None
        expired_before = loop.time() - self.keepalive
        oldest: float | None = None
        for idle in self._idle.values():
            for conn in [c for c in idle if c.idle_since <= expired_before]:
                idle.remove(conn)
                conn.close_idle()
            if idle:
                first = min(c.idle_since for c in idle)
                oldest = first if oldest is None else min(oldest, first)
        if oldest is not None:
            self._sweeper = loop.call_at(oldest + self.keepalive, self._sweep, loop)

    # ---- called by connections ----

    def _opened(self, conn: HTTPConnection) -> None:
        self._open.add(conn)

    def _lost(self, conn: HTTPConnection) -> None:
        self._open.discard(conn)
        idle = self._idle.get(conn.origin)
        if idle and conn in idle:
            idle.remove(conn)
