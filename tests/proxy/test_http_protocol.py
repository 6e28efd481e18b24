"""The proxy's HTTP/1.1 protocol (proxy/http_protocol.py) on real loopback sockets: what
a client sees on the wire is what uvicorn's own protocol gives it, request after request on
one connection."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from servers import ThreadedServer

from proxy.http_protocol import ProxyHttpProtocol


class App:
    """Echoes the request (method, path, body) unless the path asks for something else;
    records what ``receive`` returned after the body (a disconnect) per path."""

    def __init__(self) -> None:
        self.after_body: dict[str, Any] = {}
        self.started = threading.Event()

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        path = scope["path"]
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        if path == "/fail":
            raise RuntimeError("the app failed")
        if path == "/watch":  # waits for the client to go away
            self.started.set()
            self.after_body[path] = await receive()
            return
        if path == "/slow":
            self.started.set()
            await asyncio.sleep(0.5)
        if path == "/stream":
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/event-stream")]})
            for part in (b"data: one\n\n", b"data: two\n\n"):
                await send({"type": "http.response.body", "body": part, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return
        reply = b"%s %s %d %s" % (scope["method"].encode(), path.encode(), len(body), body[:20])
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/plain"),
                                (b"content-length", str(len(reply)).encode())]})
        await send({"type": "http.response.body", "body": reply})


@pytest.fixture
def app() -> App:
    return App()


@pytest.fixture
def server(app: App) -> Iterator[ThreadedServer]:
    running = ThreadedServer(app, timeout_keep_alive=1).start()
    try:
        yield running
    finally:
        running.stop()


def connect(server: ThreadedServer) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    return sock


def read_response(sock: socket.socket, buffered: bytearray) -> tuple[bytes, dict, bytes]:
    """One response from ``sock`` (``buffered``: bytes read past the previous one)."""
    while b"\r\n\r\n" not in buffered:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed before a response: {bytes(buffered)!r}")
        buffered += chunk
    head, _, rest = bytes(buffered).partition(b"\r\n\r\n")
    status, *lines = head.split(b"\r\n")
    headers = {k.lower(): v for k, v in (line.split(b": ", 1) for line in lines)}
    del buffered[:]
    buffered += rest
    if b"content-length" in headers:
        size = int(headers[b"content-length"])
        while len(buffered) < size:
            buffered += sock.recv(65536)
        body = bytes(buffered[:size])
        del buffered[:size]
        return status, headers, body
    if headers.get(b"transfer-encoding") == b"chunked":
        body = b""
        while True:
            while b"\r\n" not in buffered:
                buffered += sock.recv(65536)
            size_line, _, _ = bytes(buffered).partition(b"\r\n")
            size = int(size_line, 16)
            while len(buffered) < len(size_line) + 2 + size + 2:
                buffered += sock.recv(65536)
            body += bytes(buffered[len(size_line) + 2 : len(size_line) + 2 + size])
            del buffered[: len(size_line) + 2 + size + 2]
            if size == 0:
                return status, headers, body
    return status, headers, b""


def request(path: str, body: bytes = b"", *, method: str = "POST", extra: str = "") -> bytes:
    return (
        f"{method} {path} HTTP/1.1\r\nHost: test\r\nContent-Length: {len(body)}\r\n{extra}\r\n"
    ).encode() + body


def closed(sock: socket.socket, within: float = 3.0) -> bool:
    sock.settimeout(within)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False


def test_the_served_protocol_is_the_proxys(server: ThreadedServer) -> None:
    assert server.server.config.http is ProxyHttpProtocol
    with connect(server) as sock:
        sock.sendall(request("/x"))
        status, headers, _ = read_response(sock, bytearray())
    assert status == b"HTTP/1.1 200 OK"
    assert b"date" in headers and headers[b"server"] == b"uvicorn"


def test_requests_follow_each_other_on_one_connection(server: ThreadedServer) -> None:
    buffered = bytearray()
    with connect(server) as sock:
        for n in range(5):
            body = f"request {n}".encode()
            sock.sendall(request(f"/r{n}", body))
            status, headers, reply = read_response(sock, buffered)
            assert status == b"HTTP/1.1 200 OK"
            assert reply == b"POST /r%d %d %s" % (n, len(body), body)
            assert b"connection" not in headers


def test_pipelined_requests_are_answered_in_order(server: ThreadedServer) -> None:
    buffered = bytearray()
    with connect(server) as sock:
        sock.sendall(request("/slow", b"first") + request("/second", b"2nd") + request("/third"))
        replies = [read_response(sock, buffered)[2] for _ in range(3)]
    assert replies == [b"POST /slow 5 first", b"POST /second 3 2nd", b"POST /third 0 "]


def test_a_body_sent_in_chunks_arrives_whole(server: ThreadedServer) -> None:
    parts = [b"a" * 70_000, b"b" * 70_000, b"tail"]  # past the high-water mark: reads pause
    with connect(server) as sock:
        sock.sendall(b"POST /chunks HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n")
        for part in parts:
            sock.sendall(b"%x\r\n%b\r\n" % (len(part), part))
            time.sleep(0.02)
        sock.sendall(b"0\r\n\r\n")
        _, _, reply = read_response(sock, bytearray())
    assert reply == b"POST /chunks 140004 " + b"a" * 20


def test_a_large_body_in_one_request(server: ThreadedServer) -> None:
    body = bytes(range(256)) * 8192  # 2 MB
    with connect(server) as sock:
        sock.sendall(request("/big", body))
        _, _, reply = read_response(sock, bytearray())
    assert reply == b"POST /big %d %s" % (len(body), body[:20])


def test_expect_100_continue_is_answered_when_the_app_reads(server: ThreadedServer) -> None:
    with connect(server) as sock:
        sock.sendall(b"POST /expect HTTP/1.1\r\nHost: t\r\nContent-Length: 4\r\n"
                     b"Expect: 100-continue\r\n\r\n")
        assert sock.recv(64) == b"HTTP/1.1 100 Continue\r\n\r\n"
        sock.sendall(b"body")
        _, _, reply = read_response(sock, bytearray())
    assert reply == b"POST /expect 4 body"


def test_a_streamed_response_is_chunked_and_ends(server: ThreadedServer) -> None:
    buffered = bytearray()
    with connect(server) as sock:
        sock.sendall(request("/stream"))
        _, headers, body = read_response(sock, buffered)
        assert headers[b"transfer-encoding"] == b"chunked"
        assert body == b"data: one\n\ndata: two\n\n"
        sock.sendall(request("/after"))  # the connection is still usable
        assert read_response(sock, buffered)[2] == b"POST /after 0 "


def test_head_has_no_body(server: ThreadedServer) -> None:
    with connect(server) as sock:
        sock.sendall(request("/h", method="HEAD"))
        head = b""
        while not head.endswith(b"\r\n\r\n"):
            head += sock.recv(1)
        assert head.startswith(b"HTTP/1.1 200 OK") and b"content-length: 10" in head
        # no body follows the head: the next response comes straight after it
        sock.sendall(request("/next"))
        assert read_response(sock, bytearray())[2] == b"POST /next 0 "


def test_connection_close_and_http_1_0_close_after_the_response(server: ThreadedServer) -> None:
    with connect(server) as sock:
        sock.sendall(request("/c", extra="Connection: close\r\n"))
        _, headers, reply = read_response(sock, bytearray())
        assert reply == b"POST /c 0 " and headers[b"connection"] == b"close"
        assert closed(sock)
    with connect(server) as sock:
        sock.sendall(b"GET /old HTTP/1.0\r\nHost: t\r\n\r\n")
        _, headers, reply = read_response(sock, bytearray())
        assert reply == b"GET /old 0 " and headers[b"connection"] == b"close"
        assert closed(sock)


def test_the_app_hears_of_a_client_that_went_away(server: ThreadedServer, app: App) -> None:
    sock = connect(server)
    sock.sendall(request("/watch"))
    assert app.started.wait(5)
    sock.close()
    deadline = time.monotonic() + 5
    while "/watch" not in app.after_body and time.monotonic() < deadline:
        time.sleep(0.01)
    assert app.after_body["/watch"] == {"type": "http.disconnect"}


def test_an_idle_connection_is_closed_after_the_keep_alive_timeout(server: ThreadedServer) -> None:
    buffered = bytearray()
    with connect(server) as sock:
        # busy for longer than the timeout (1 s): never closed while requests come
        start = time.monotonic()
        while time.monotonic() - start < 1.6:
            sock.sendall(request("/busy"))
            assert read_response(sock, buffered)[2] == b"POST /busy 0 "
            last = time.monotonic()
            time.sleep(0.2)
        # idle: closed once the timeout passed since the last response
        assert closed(sock, within=3)
        assert 0.9 <= time.monotonic() - last <= 2.5


def test_a_connection_idle_past_the_timeout_between_requests_is_closed(
    server: ThreadedServer,
) -> None:
    with connect(server) as sock:
        sock.sendall(request("/one"))
        read_response(sock, bytearray())
        time.sleep(1.5)
        assert closed(sock, within=0.5)


def test_an_app_that_fails_before_answering_gets_a_500(server: ThreadedServer) -> None:
    with connect(server) as sock:
        sock.sendall(request("/fail"))
        status, _, body = read_response(sock, bytearray())
        assert status == b"HTTP/1.1 500 Internal Server Error"
        assert body == b"Internal Server Error"
        assert closed(sock)


def test_a_malformed_request_gets_a_400(server: ThreadedServer) -> None:
    with connect(server) as sock:
        sock.sendall(b"NOT HTTP AT ALL\r\n\r\n")
        status, _, _ = read_response(sock, bytearray())
        assert status == b"HTTP/1.1 400 Bad Request"


def test_shutdown_lets_a_request_under_way_finish(app: App) -> None:
    running = ThreadedServer(app, timeout_keep_alive=1).start()
    with connect(running) as sock:
        sock.sendall(request("/slow", b"x"))
        assert app.started.wait(5)
        stopper = threading.Thread(target=running.stop)
        stopper.start()
        _, headers, reply = read_response(sock, bytearray())
        stopper.join(15)
    assert reply == b"POST /slow 1 x"
    assert headers[b"connection"] == b"close"
