"""One HTTP/1.1 client connection: an asyncio ``Protocol`` driving ``httptools``' response
parser, holding at most one response in flight (no pipelining).

The connection keeps the state of its current response (status, lower-cased headers, body
chunks not read yet, complete or failed) and wakes the one coroutine waiting on it whenever
the parser made progress. ``proxy.upstream.http1`` builds requests, pools connections and
hands responses out; nothing here is public API.
"""

from __future__ import annotations

import asyncio
import zlib
from typing import TYPE_CHECKING, Any

import httptools

if TYPE_CHECKING:
    from proxy.upstream.http1 import HTTP1Client

__all__ = ["ConnectionClosed", "HTTPConnection", "IncompleteResponse", "ProtocolError"]

# unread body bytes above which the socket stops being read (a slow consumer of a stream)
HIGH_WATER = 256 * 1024


class ConnectionClosed(ConnectionError):
    """The server closed the connection before sending any byte of the response."""


class IncompleteResponse(ConnectionError):
    """The connection ended before the whole response arrived (a body cut short)."""


class ProtocolError(ConnectionError):
    """The server sent bytes that are not a valid HTTP/1.x response."""


def _expire(waiter: asyncio.Future[bool]) -> None:
    if not waiter.done():
        waiter.set_result(False)


def _decoder(encoding: str) -> Any:
    """A streaming decoder for a ``Content-Encoding``, or None to pass the body as is."""
    encoding = encoding.strip().lower()
    if encoding in ("gzip", "x-gzip"):
        return zlib.decompressobj(16 + zlib.MAX_WBITS)
    if encoding == "deflate":
        return _Deflate()
    return None


class _Deflate:
    """``deflate`` as servers send it: zlib-wrapped as the RFC says, or raw (a common
    mistake that clients accept), told apart by the first bytes."""

    __slots__ = ("_inner",)

    def __init__(self) -> None:
        self._inner: Any = None

    def decompress(self, data: bytes) -> bytes:
        if self._inner is None:
            wrapped = len(data) >= 2 and data[0] & 0x0F == 8 and (data[0] << 8 | data[1]) % 31 == 0
            self._inner = zlib.decompressobj(zlib.MAX_WBITS if wrapped else -zlib.MAX_WBITS)
        return bytes(self._inner.decompress(data))

    def flush(self) -> bytes:
        return bytes(self._inner.flush()) if self._inner is not None else b""


class HTTPConnection(asyncio.Protocol):
    """A keep-alive connection to one origin and the response it is currently reading."""

    __slots__ = (
        "active",
        "buffered",
        "chunks",
        "client",
        "closed",
        "complete",
        "decoder",
        "error",
        "headers",
        "headers_done",
        "idle_since",
        "keep_alive",
        "loop",
        "lost",
        "lost_waiter",
        "origin",
        "parser",
        "paused",
        "received",
        "reused",
        "status",
        "transport",
        "until_close",
        "waiter",
    )

    def __init__(
        self, loop: asyncio.AbstractEventLoop, client: HTTP1Client, origin: tuple[str, str, int]
    ) -> None:
        self.loop = loop
        self.client = client
        self.origin = origin
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False  # the peer ended the connection (or it was aborted): never reuse
        self.lost = False  # connection_lost ran: the socket is closed
        self.lost_waiter: asyncio.Future[None] | None = None
        self.reused = False  # served a response before the current one
        self.idle_since = 0.0
        self.waiter: asyncio.Future[bool] | None = None
        self._reset()

    def _reset(self) -> None:
        self.active = False
        self.status = 0
        self.headers: dict[str, str] = {}
        self.headers_done = False
        self.complete = False
        self.keep_alive = False
        self.until_close = False
        self.received = False
        self.chunks: list[bytes] = []
        self.buffered = 0
        self.paused = False
        self.decoder: Any = None
        self.error: ConnectionError | None = None

    # ---- used by the client ----

    def begin(self, request: bytes) -> None:
        """Send a request; the connection reads its response from now on."""
        self._reset()
        self.active = True
        assert self.transport is not None
        self.transport.write(request)

    async def wait(self, deadline: float | None) -> None:
        """Until the response made progress or the connection ended; ``TimeoutError`` at
        ``deadline`` (loop time)."""
        loop = self.loop
        waiter: asyncio.Future[bool] = loop.create_future()
        self.waiter = waiter
        timer = None if deadline is None else loop.call_at(deadline, _expire, waiter)
        try:
            progressed = await waiter
        finally:
            self.waiter = None
            if timer is not None:
                timer.cancel()
        if not progressed:
            raise TimeoutError("no answer from the server in time")

    def take(self) -> bytes:
        """The body bytes received and not read yet (reading resumes if it was paused)."""
        chunks = self.chunks
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        self.chunks = []
        self.buffered = 0
        if self.paused:
            self.paused = False
            if not self.lost and self.transport is not None:
                self.transport.resume_reading()
        return data

    def reusable(self) -> bool:
        """The response was read to its end and both sides keep the connection open."""
        return self.complete and self.keep_alive and not self.closed and not self.chunks

    def abort(self) -> None:
        """Drop the connection now: the server sees the disconnect."""
        self.closed = True
        if self.active and not self.complete and self.error is None:
            self.error = ConnectionAbortedError("the connection was closed by this side")
        if self.transport is not None and not self.lost:
            self.transport.abort()

    def close_idle(self) -> None:
        """Close an idle connection politely (a FIN after anything still buffered)."""
        self.closed = True
        if self.transport is not None and not self.lost:
            self.transport.close()

    def closed_waiter(self) -> asyncio.Future[None] | None:
        """A future done once the socket is closed (None if it already is)."""
        if self.lost:
            return None
        if self.lost_waiter is None:
            self.lost_waiter = self.loop.create_future()
        return self.lost_waiter

    # ---- asyncio.Protocol ----

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.client._opened(self)

    def data_received(self, data: bytes) -> None:
        if not self.active or self.complete:
            # bytes nobody asked for: whatever the server meant, the connection is unusable
            self.abort()
            return
        self.received = True
        try:
            self.parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
            if self.error is None:
                self.error = ProtocolError(f"invalid HTTP response: {exc!r}")
                self.error.__cause__ = exc.__context__ or exc
            self.abort()
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(True)

    def eof_received(self) -> bool:
        self._ended(None)
        return False  # let the transport close itself

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self._ended(exc)
        self.client._lost(self)
        if self.lost_waiter is not None and not self.lost_waiter.done():
            self.lost_waiter.set_result(None)

    def pause_writing(self) -> None:
        pass  # request bodies are written at once; the transport buffers them

    def resume_writing(self) -> None:
        pass

    def _ended(self, exc: Exception | None) -> None:
        """The peer closed (or the connection broke): settle the response in flight."""
        self.closed = True
        if self.active and not self.complete and self.error is None:
            if self.headers_done and self.until_close and exc is None:
                self._finish_body()
                self.keep_alive = False
            else:
                if not self.received:
                    error: ConnectionError = ConnectionClosed(
                        "the server closed the connection before responding")
                else:
                    error = IncompleteResponse("the server closed the connection mid-response")
                error.__cause__ = exc
                self.error = error
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(True)

    # ---- httptools callbacks ----

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        self.status = status
        if status < 200:
            return  # informational (100 Continue...): the real response follows
        headers = self.headers
        self.headers_done = True
        self.until_close = (
            "content-length" not in headers
            and "chunked" not in headers.get("transfer-encoding", "").lower()
            and status not in (204, 304)
        )
        encoding = headers.get("content-encoding")
        if encoding is not None:
            self.decoder = _decoder(encoding)

    def on_body(self, body: bytes) -> None:
        if self.decoder is not None:
            body = self.decoder.decompress(body)
            if not body:
                return
        self.chunks.append(body)
        self.buffered += len(body)
        if self.buffered > HIGH_WATER and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()

    def on_message_complete(self) -> None:
        if self.status < 200:
            self.headers = {}
            return
        self._finish_body()
        self.keep_alive = self.parser.should_keep_alive()

    def _finish_body(self) -> None:
        if self.decoder is not None:
            tail = self.decoder.flush()
            if tail:
                self.chunks.append(tail)
                self.buffered += len(tail)
        self.complete = True
