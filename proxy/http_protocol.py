"""The HTTP/1.1 protocol ``memory-proxy serve`` runs uvicorn with: uvicorn's httptools
protocol, with a leaner request cycle.

Every model call passes through it, so what it does per request is kept to what HTTP
needs. uvicorn's own protocol keeps the connection's life: its transport, flow control,
pipelining queue, graceful shutdown, upgrade refusal and malformed-request answers are
inherited unchanged. Per request it differs in:

- **No event per request.** A request's body is handed over through a flag and, only when
  the app waits for more, a future (uvicorn creates an ``asyncio.Event`` per request).
- **One keep-alive timer per connection, not per response.** A response that completes
  moves the connection's idle deadline; the timer, armed once, re-arms itself to the
  deadline when it fires early and closes the connection once it has passed (uvicorn
  schedules a timer after every response and cancels it on the next request's data).
- **A body in one piece is passed on as is**, without a copy into a ``bytearray``.
- **Headers the server adds itself** (uvicorn's ``date`` and ``server``, from
  ``default_headers``) are written without checking them again; the app's are checked as
  uvicorn checks them.

The behaviour seen on the wire is uvicorn's: the same status lines, ``Content-Length`` or
chunked framing, ``Connection: close`` handling, ``Expect: 100-continue``, HEAD, 500 for an
app that fails before it answers, ``http.disconnect`` once the client is gone.
"""

from __future__ import annotations

import asyncio
import contextvars
import urllib.parse
from typing import Any

import httptools
from uvicorn.protocols.http.flow_control import HIGH_WATER_LIMIT, service_unavailable
from uvicorn.protocols.http.httptools_impl import (
    HEADER_RE,
    HEADER_VALUE_RE,
    STATUS_LINE,
    HttpToolsProtocol,
)
from uvicorn.protocols.utils import get_client_addr, get_path_with_query_string

__all__ = ["ProxyHttpProtocol"]


class ProxyHttpProtocol(HttpToolsProtocol):
    """uvicorn's ``HttpToolsProtocol`` with ``RequestCycle`` in place of its cycle (see
    the module's docstring). Pass the class as uvicorn's ``http``."""

    cycle: RequestCycle  # type: ignore[assignment]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.idle_deadline: float | None = None  # when an idle connection is closed

    # -- the connection's life

    def connection_lost(self, exc: Exception | None) -> None:
        self.connections.discard(self)
        cycle = self.cycle
        if cycle is not None:
            if not cycle.response_complete:
                cycle.disconnected = True
            cycle.wake()
        if self.flow is not None:
            self.flow.resume_writing()
        if exc is None:
            self.transport.close()
            self._unset_keepalive_if_required()
        self.parser = None  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.idle_deadline = None  # busy: the armed timer, if any, finds no deadline
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            msg = "Invalid HTTP request received."
            self.logger.warning(msg)
            self.send_400_response(msg)
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()

    def _unset_keepalive_if_required(self) -> None:
        self.idle_deadline = None
        super()._unset_keepalive_if_required()

    def _arm_keep_alive(self) -> None:
        self.idle_deadline = self.loop.time() + self.timeout_keep_alive
        if self.timeout_keep_alive_task is None:
            self.timeout_keep_alive_task = self.loop.call_at(
                self.idle_deadline, self._keep_alive_expired
            )

    def _keep_alive_expired(self) -> None:
        self.timeout_keep_alive_task = None
        deadline = self.idle_deadline
        if deadline is None or self.transport.is_closing():
            return  # busy again, or closed: the next response arms it
        if self.loop.time() < deadline:
            self.timeout_keep_alive_task = self.loop.call_at(deadline, self._keep_alive_expired)
            return
        self.transport.close()

    # -- parser callbacks

    def on_headers_complete(self) -> None:
        parser = self.parser
        http_version = parser.get_http_version()
        scope = self.scope
        scope["method"] = parser.get_method().decode("ascii")
        if http_version != "1.1":
            scope["http_version"] = http_version
        if parser.should_upgrade() and self._should_upgrade():
            return
        parsed_url = httptools.parse_url(self.url)
        raw_path = parsed_url.path
        path = raw_path.decode("ascii")
        if "%" in path:
            path = urllib.parse.unquote(path)
        if self.root_path:
            scope["path"] = self.root_path + path
            scope["raw_path"] = self.root_path.encode("ascii") + raw_path
        else:
            scope["path"] = path
            scope["raw_path"] = raw_path
        scope["query_string"] = parsed_url.query or b""

        if self.limit_concurrency is not None and (
            len(self.connections) >= self.limit_concurrency
            or len(self.tasks) >= self.limit_concurrency
        ):
            app = service_unavailable
            self.logger.warning("Exceeded concurrency limit.")
        else:
            app = self.app

        existing = self.cycle
        self.cycle = RequestCycle(
            self, scope, http_version != "1.0" and parser.should_keep_alive()
        )
        if existing is None or existing.response_complete:
            self._start_asgi_task(self.cycle, app)  # type: ignore[arg-type]
        else:  # a pipelined request waits for the one before it
            self.flow.pause_reading()
            self.pipeline.appendleft((self.cycle, app))  # type: ignore[arg-type]

    def _start_asgi_task(self, cycle: RequestCycle, app: Any) -> None:  # type: ignore[override]
        if self.config.reset_contextvars:
            task = self.loop.create_task(cycle.run_asgi(app), context=contextvars.Context())
        else:
            task = self.loop.create_task(cycle.run_asgi(app))
        task.add_done_callback(self.tasks.discard)
        self.tasks.add(task)

    def on_body(self, body: bytes) -> None:
        if self._upgrading() or self.cycle.response_complete:
            return
        cycle = self.cycle
        cycle.add_body(body)
        if cycle.body_size > HIGH_WATER_LIMIT:
            self.flow.pause_reading()
        cycle.wake()

    def on_message_complete(self) -> None:
        if self._upgrading() or self.cycle.response_complete:
            return
        cycle = self.cycle
        cycle.more_body = False
        cycle.wake()

    def _upgrading(self) -> bool:
        return bool(self.parser.should_upgrade()) and self._should_upgrade()

    def on_response_complete(self) -> None:
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self.flow.resume_reading()
        if self.pipeline:
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)  # type: ignore[arg-type]
        else:
            self._arm_keep_alive()


class RequestCycle:
    """One request and its response (uvicorn's ``RequestResponseCycle``, leaner)."""

    __slots__ = (
        "body_size",
        "chunked_encoding",
        "chunks",
        "disconnected",
        "expected_content_length",
        "flow",
        "keep_alive",
        "more_body",
        "on_response",
        "protocol",
        "ready",
        "response_complete",
        "response_started",
        "scope",
        "transport",
        "waiter",
        "waiting_for_100_continue",
    )  # fmt: skip

    def __init__(self, protocol: ProxyHttpProtocol, scope: Any, keep_alive: bool) -> None:
        self.protocol = protocol
        self.scope = scope
        self.transport = protocol.transport
        self.flow = protocol.flow
        self.keep_alive = keep_alive
        self.disconnected = False
        self.waiting_for_100_continue = protocol.expect_100_continue
        # the request body not yet received by the app
        self.chunks: list[bytes] = []
        self.body_size = 0
        self.more_body = True
        # something happened the app's next receive() reports: body, its end, a disconnect
        self.ready = False
        self.waiter: asyncio.Future[None] | None = None
        self.response_started = False
        self.response_complete = False
        self.chunked_encoding: bool | None = None
        self.expected_content_length = 0
        self.on_response = protocol.on_response_complete

    def add_body(self, body: bytes) -> None:
        self.chunks.append(body)
        self.body_size += len(body)

    def wake(self) -> None:
        self.ready = True
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def run_asgi(self, app: Any) -> None:
        logger = self.protocol.logger
        try:
            result = await app(self.scope, self.receive, self.send)
        except BaseException as exc:
            logger.error("Exception in ASGI application\n", exc_info=exc)
            if not self.response_started:
                await self.send_500_response()
            else:
                self.transport.close()
        else:
            if result is not None:
                logger.error("ASGI callable should return None, but returned '%s'.", result)
                self.transport.close()
            elif not self.response_started and not self.disconnected:
                logger.error("ASGI callable returned without starting response.")
                await self.send_500_response()
            elif not self.response_complete and not self.disconnected:
                logger.error("ASGI callable returned without completing response.")
                self.transport.close()
        finally:
            self.on_response = _nothing

    async def send_500_response(self) -> None:
        await self.send({
            "type": "http.response.start",
            "status": 500,
            "headers": [
                (b"content-type", b"text/plain; charset=utf-8"),
                (b"content-length", b"21"),
                (b"connection", b"close"),
            ],
        })  # fmt: skip
        await self.send(
            {"type": "http.response.body", "body": b"Internal Server Error", "more_body": False}
        )

    async def send(self, message: Any) -> None:
        if self.flow.write_paused and not self.disconnected:
            await self.flow.drain()
        if self.disconnected:
            return
        if not self.response_started:
            if message["type"] != "http.response.start":
                raise RuntimeError(
                    f"Expected ASGI message 'http.response.start', but got '{message['type']}'."
                )
            self.response_started = True
            self.waiting_for_100_continue = False
            self.transport.write(self._head(message["status"], message.get("headers", ())))
        elif not self.response_complete:
            if message["type"] != "http.response.body":
                raise RuntimeError(
                    f"Expected ASGI message 'http.response.body', but got '{message['type']}'."
                )
            body = message.get("body", b"")
            more_body = message.get("more_body", False)
            if self.scope["method"] == "HEAD":
                self.expected_content_length = 0
            elif self.chunked_encoding:
                if body:
                    chunk = b"%x\r\n%b\r\n" % (len(body), body)
                    self.transport.write(chunk if more_body else chunk + b"0\r\n\r\n")
                elif not more_body:
                    self.transport.write(b"0\r\n\r\n")
            else:
                if len(body) > self.expected_content_length:
                    raise RuntimeError("Response content longer than Content-Length")
                self.expected_content_length -= len(body)
                self.transport.write(body)
            if not more_body:
                if self.expected_content_length != 0:
                    raise RuntimeError("Response content shorter than Content-Length")
                self.response_complete = True
                self.wake()
                if not self.keep_alive:
                    self.transport.close()
                self.on_response()
        else:
            raise RuntimeError(
                f"Unexpected ASGI message '{message['type']}' sent, after response already"
                " completed."
            )

    def _head(self, status: int, headers: Any) -> bytes:
        """The status line and headers, as uvicorn writes them."""
        protocol = self.protocol
        if protocol.access_log:
            scope = self.scope
            protocol.access_logger.info(
                '%s - "%s %s HTTP/%s" %d', get_client_addr(scope), scope["method"],
                get_path_with_query_string(scope), scope["http_version"], status,
            )  # fmt: skip
        content = [STATUS_LINE[status]]
        for name, value in protocol.server_state.default_headers:
            content += (name, b": ", value, b"\r\n")
        has_connection_close = False
        for name, value in headers:
            if HEADER_RE.search(name):
                raise RuntimeError("Invalid HTTP header name.")
            if HEADER_VALUE_RE.search(value):
                raise RuntimeError("Invalid HTTP header value.")
            name = name.lower()
            if name == b"content-length" and self.chunked_encoding is None:
                self.expected_content_length = int(value.decode())
                self.chunked_encoding = False
            elif name == b"transfer-encoding" and value.lower() == b"chunked":
                self.expected_content_length = 0
                self.chunked_encoding = True
            elif name == b"connection":
                if b"close" in [token.lower().strip() for token in value.split(b",")]:
                    self.keep_alive = False
                    has_connection_close = True
            content += (name, b": ", value, b"\r\n")
        if not self.keep_alive and not has_connection_close:
            content.append(b"connection: close\r\n")
        if (
            self.chunked_encoding is None
            and self.scope["method"] != "HEAD"
            and status not in (204, 304)
        ):
            self.chunked_encoding = True
            content.append(b"transfer-encoding: chunked\r\n")
        content.append(b"\r\n")
        return b"".join(content)

    async def receive(self) -> Any:
        if self.waiting_for_100_continue and not self.transport.is_closing():
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            self.waiting_for_100_continue = False
        if not self.disconnected and not self.response_complete:
            self.flow.resume_reading()
            if not self.ready:
                self.waiter = self.protocol.loop.create_future()
                try:
                    await self.waiter
                finally:
                    self.waiter = None
            self.ready = False
        if self.disconnected or self.response_complete:
            return {"type": "http.disconnect"}
        chunks = self.chunks
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        self.chunks = []
        self.body_size = 0
        return {"type": "http.request", "body": body, "more_body": self.more_body}


def _nothing() -> None:
    pass
