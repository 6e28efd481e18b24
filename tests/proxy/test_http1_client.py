"""The HTTP/1.1 upstream client against tiny scripted asyncio servers on loopback: pooling,
the keep-alive race, body framings and encodings, flow control, timeouts, TLS."""

from __future__ import annotations

import asyncio
import gzip
import socket
import ssl
import zlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from http1_support import (
    Handler,
    Reader,
    TinyServer,
    Writer,
    chunked,
    drop,
    hang,
    make_certificates,
    redirect,
    respond,
    send_raw,
)

from proxy.errors import UpstreamConnectError, UpstreamStatusError, UpstreamTimeout
from proxy.upstream.base import UpstreamRequest
from proxy.upstream.http1 import ConnectionClosed, HTTP1Client, IncompleteResponse, Target
from proxy.upstream.http1_connection import HIGH_WATER
from proxy.upstream.openai_http import OpenAIUpstream


@pytest.fixture
async def client() -> AsyncIterator[HTTP1Client]:
    http = HTTP1Client()
    yield http
    await http.close()


async def get(client: HTTP1Client, server: TinyServer, **kwargs: Any) -> bytes:
    response = await client.request("GET", server.target(), {}, **kwargs)
    return await response.read()


async def until(condition: Callable[[], bool], within: float = 5.0) -> None:
    for _ in range(int(within / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"still false after {within} s")


# ---- the pool ----


async def test_sequential_requests_reuse_one_kept_alive_connection(
    client: HTTP1Client,
) -> None:
    async with TinyServer() as server:
        bodies = [await get(client, server) for _ in range(3)]

        assert bodies == [b"ok"] * 3
        assert server.connections == 1
        assert client.open_connections == 1


async def test_concurrent_requests_each_get_a_connection_and_later_ones_reuse_them(
    client: HTTP1Client,
) -> None:
    async def slow_ok(reader: Reader, writer: Writer) -> bool:
        await asyncio.sleep(0.05)
        return await respond(b"ok")(reader, writer)

    async with TinyServer(default=slow_ok) as server:
        await asyncio.gather(*(get(client, server) for _ in range(4)))
        await asyncio.gather(*(get(client, server) for _ in range(4)))

        assert server.connections == 4
        assert len(server.requests) == 8


async def test_a_connection_the_server_closed_while_idle_is_never_reused(
    client: HTTP1Client,
) -> None:
    async with TinyServer(respond(b"first", close=True)) as server:
        assert await get(client, server) == b"first"
        await until(lambda: client.open_connections == 0)  # the client saw the FIN

        assert await get(client, server) == b"ok"
        assert server.connections == 2
        assert [r.connection for r in server.requests] == [1, 2]  # nothing sent on the dead one


async def test_a_kept_alive_connection_closed_as_the_request_went_out_is_retried_once_fresh(
    client: HTTP1Client,
) -> None:
    # the server keeps the connection after the first answer, then drops it on the
    # next request without answering: the keep-alive race, seen from the client
    async with TinyServer(respond(b"first"), drop) as server:
        assert await get(client, server) == b"first"
        response = await client.request("POST", server.target(), {}, b'{"n": 2}')

        assert await response.read() == b"ok"
        assert server.connections == 2
        assert [(r.connection, r.body) for r in server.requests] == [
            (1, b""), (1, b'{"n": 2}'), (2, b'{"n": 2}')]


async def test_a_fresh_connection_closed_before_any_answer_is_not_retried(
    client: HTTP1Client,
) -> None:
    async with TinyServer(drop, drop) as server:
        with pytest.raises(ConnectionClosed):
            await get(client, server)

        assert server.connections == 1


async def test_a_reused_connection_cut_after_part_of_the_answer_is_not_retried(
    client: HTTP1Client,
) -> None:
    async with TinyServer(respond(b"first"), send_raw(b"HTTP/1.1 200 OK\r\n", close=True)
                          ) as server:
        await get(client, server)
        with pytest.raises(IncompleteResponse):
            await get(client, server)

        assert server.connections == 1


@pytest.mark.parametrize("answer", [
    pytest.param(respond(b"bye", headers=("Connection: close",)), id="connection-close"),
    pytest.param(respond(b"bye", version="1.0"), id="http-1.0"),
])
async def test_a_response_that_ends_the_connection_is_not_pooled(
    client: HTTP1Client, answer: Handler,
) -> None:
    # the server leaves the socket open: only the response says not to reuse it
    async with TinyServer(answer) as server:
        assert await get(client, server) == b"bye"
        assert await get(client, server) == b"ok"

        assert server.connections == 2


async def test_idle_connections_expire_after_the_keepalive_time() -> None:
    client = HTTP1Client(keepalive=0.1)
    try:
        async with TinyServer() as server:
            await get(client, server)
            await until(lambda: server.disconnects == 1)  # closed by the client's sweep
            await get(client, server)

            assert server.connections == 2
    finally:
        await client.close()


async def test_closing_the_client_closes_idle_and_busy_connections() -> None:
    client = HTTP1Client()
    async with TinyServer(respond(b"one"), hang) as server:
        await get(client, server)
        busy = asyncio.ensure_future(get(client, server))
        await until(lambda: len(server.requests) == 2)
        await client.close()

        with pytest.raises(ConnectionAbortedError):
            await busy  # not retried elsewhere
        await until(lambda: server.disconnects == 1)
        assert server.connections == 1
        assert client.open_connections == 0


# ---- bodies ----


GZIPPED = gzip.compress(b"hello " * 1000)


@pytest.mark.parametrize("answer", [
    pytest.param(chunked(b"hello " * 400, b"hello " * 600), id="chunked"),
    pytest.param(chunked(GZIPPED[:100], GZIPPED[100:], headers=("Content-Encoding: gzip",)),
                 id="chunked-gzip"),
    pytest.param(b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n%s"
                 % (len(GZIPPED), GZIPPED), id="content-length-gzip"),
    pytest.param(chunked(zlib.compress(b"hello " * 1000), headers=("Content-Encoding: deflate",)),
                 id="deflate"),
    pytest.param(chunked(zlib.compress(b"hello " * 1000)[2:-4],
                         headers=("Content-Encoding: deflate",)), id="raw-deflate"),
])
async def test_bodies_are_read_whole_and_decoded(client: HTTP1Client, answer: bytes) -> None:
    async with TinyServer(send_raw(answer)) as server:
        response = await client.request("GET", server.target(), {})

        assert await response.read() == b"hello " * 1000
        assert await get(client, server) == b"ok"  # the connection was reused
        assert server.connections == 1


async def test_a_body_without_length_is_read_until_the_server_closes(
    client: HTTP1Client,
) -> None:
    answer = b"HTTP/1.1 200 OK\r\nX-Kind: eof\r\n\r\npart one, "
    async with TinyServer(send_raw(answer, then_wait=0.05, close=True)) as server:
        response = await client.request("GET", server.target(), {})

        assert response.status == 200 and response.headers["x-kind"] == "eof"
        assert await response.read() == b"part one, "
        assert await get(client, server) == b"ok"
        assert server.connections == 2


async def test_headers_are_lower_cased_and_the_status_is_kept(client: HTTP1Client) -> None:
    answer = b"HTTP/1.1 418 I'm a teapot\r\nX-Request-ID: abc\r\nContent-Length: 0\r\n\r\n"
    async with TinyServer(send_raw(answer)) as server:
        response = await client.request("GET", server.target(), {})
        await response.read()

    assert response.status == 418
    assert response.headers == {"x-request-id": "abc", "content-length": "0"}


@pytest.mark.parametrize("answer", [
    pytest.param(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + b"x" * 50, id="length"),
    pytest.param(chunked(b"x" * 50)[:-5], id="chunked"),
    pytest.param(b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n%s"
                 % (len(GZIPPED), GZIPPED[:50]), id="gzip"),
])
async def test_a_body_cut_mid_way_raises_incomplete_response(
    client: HTTP1Client, answer: bytes,
) -> None:
    async with TinyServer(send_raw(answer, close=True)) as server:
        response = await client.request("GET", server.target(), {})

        with pytest.raises(IncompleteResponse):
            await response.read()
        assert client.open_connections <= 1
        await until(lambda: client.open_connections == 0)


async def test_a_malformed_response_raises_a_connection_error(client: HTTP1Client) -> None:
    async with TinyServer(send_raw(b"SMTP ready\r\n\r\n")) as server:
        with pytest.raises(ConnectionError):
            await get(client, server)


async def test_a_header_value_with_a_line_break_is_refused(client: HTTP1Client) -> None:
    async with TinyServer() as server:
        with pytest.raises(ValueError, match="line break"):
            await client.request("GET", server.target(), {"x-evil": "a\r\nhost: b"})

        assert server.requests == []


async def test_a_request_carries_host_and_content_length(client: HTTP1Client) -> None:
    async with TinyServer() as server:
        response = await client.request(
            "POST", server.target("/v1/chat?x=1"), {"authorization": "Bearer k"}, b"{}")
        await response.read()

    head = server.requests[0].head.decode()
    assert head.startswith("POST /v1/chat?x=1 HTTP/1.1\r\n")
    assert f"host: 127.0.0.1:{server.port}\r\n" in head
    assert "content-length: 2\r\n" in head and "authorization: Bearer k\r\n" in head


# ---- streams and flow control ----


async def test_a_large_stream_read_slowly_pauses_the_socket_instead_of_buffering(
    client: HTTP1Client,
) -> None:
    total = 32 * 1024 * 1024
    written = [0]

    async def big_stream(reader: Reader, writer: Writer) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        piece = b"%x\r\n%s\r\n" % (65536, b"d" * 65536)
        for _ in range(total // 65536):
            writer.write(piece)
            await writer.drain()
            written[0] += 65536
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True

    async with TinyServer(big_stream) as server:
        response = await client.request("GET", server.target(), {})
        await asyncio.sleep(0.3)
        stalled_at = written[0]
        await asyncio.sleep(0.3)

        assert written[0] == stalled_at < total  # the server is blocked on a full socket
        assert response._conn is not None
        assert response._conn.buffered <= HIGH_WATER + 256 * 1024
        received = 0
        while chunk := await response.next_chunk(read_timeout=5):
            received += len(chunk)
        assert received == total
        assert await get(client, server) == b"ok"
        assert server.connections == 1


async def test_closing_a_stream_before_its_end_disconnects_from_the_server(
    client: HTTP1Client,
) -> None:
    async def endless(reader: Reader, writer: Writer) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        while not reader.at_eof():
            writer.write(b"6\r\ndata: \r\n")
            await writer.drain()
            await asyncio.sleep(0.01)
        return False

    async with TinyServer(endless) as server:
        response = await client.request("GET", server.target(), {})
        assert (await response.next_chunk()).startswith(b"data: ")
        response.close()

        await until(lambda: client.open_connections == 0)
        await until(lambda: not server._tasks)  # the server's writes failed: it stopped


# ---- timeouts and cancellation ----


async def test_no_headers_before_the_header_timeout_raises_and_drops_the_connection(
    client: HTTP1Client,
) -> None:
    async with TinyServer(hang) as server:
        with pytest.raises(TimeoutError):
            await get(client, server, header_timeout=0.1)

        await until(lambda: server.disconnects == 1)
        assert client.open_connections == 0


async def test_a_body_slower_than_the_deadline_raises_timeout(client: HTTP1Client) -> None:
    partial = send_raw(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", then_wait=5)
    async with TinyServer(partial) as server:
        deadline = asyncio.get_running_loop().time() + 0.2
        response = await client.request("GET", server.target(), {}, deadline=deadline)

        with pytest.raises(TimeoutError):
            await response.read(deadline)


async def test_a_stream_silent_longer_than_the_read_timeout_raises_timeout(
    client: HTTP1Client,
) -> None:
    async with TinyServer(send_raw(chunked(b"first")[:-5], then_wait=5)) as server:
        response = await client.request("GET", server.target(), {})

        assert await response.next_chunk(read_timeout=1) == b"first"
        with pytest.raises(TimeoutError):
            await response.next_chunk(read_timeout=0.1)
        await until(lambda: client.open_connections == 0)


async def test_a_slow_connect_raises_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    loop = asyncio.get_running_loop()

    async def never_connects(*args: Any, **kwargs: Any) -> Any:
        await asyncio.sleep(10)

    monkeypatch.setattr(loop, "create_connection", never_connects)
    client = HTTP1Client(connect_timeout=0.1)
    with pytest.raises(TimeoutError):
        await client.request("GET", Target.parse("http://127.0.0.1:9/"), {})
    await client.close()


async def test_cancelling_a_pending_request_closes_its_connection(client: HTTP1Client) -> None:
    async with TinyServer(hang) as server:
        pending = asyncio.ensure_future(get(client, server))
        await until(lambda: len(server.requests) == 1)
        pending.cancel()

        with pytest.raises(asyncio.CancelledError):
            await pending
        await until(lambda: server.disconnects == 1)
        assert client.open_connections == 0


# ---- errors through OpenAIUpstream ----


async def test_an_unknown_host_raises_upstream_connect_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_such_host(*args: Any, **kwargs: Any) -> Any:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", no_such_host)
    async with OpenAIUpstream("http://upstream.invalid/v1") as upstream:
        with pytest.raises(UpstreamConnectError, match="upstream unreachable"):
            await upstream.chat(UpstreamRequest({"model": "m", "messages": []}))


async def test_a_url_that_is_not_http_raises_upstream_connect_error_per_call() -> None:
    async with OpenAIUpstream("ftp://example/v1") as upstream:
        with pytest.raises(UpstreamConnectError):
            await upstream.models({})


async def test_a_stream_that_times_out_raises_upstream_timeout() -> None:
    async with TinyServer(send_raw(chunked(b"data: {}\n\n")[:-5], then_wait=5)) as server, \
            OpenAIUpstream(server.url + "/v1", timeout=0.2) as upstream:
        stream = await upstream.chat_stream(UpstreamRequest({"model": "m", "messages": []}))
        try:
            with pytest.raises(UpstreamTimeout):
                async for _ in stream:
                    pass
        finally:
            await stream.aclose()


async def test_requests_ask_for_an_unencoded_body_and_name_the_proxy() -> None:
    async with TinyServer() as server, OpenAIUpstream(server.url + "/v1") as upstream:
        await upstream.models({"Accept-Encoding": "br", "X-Other": "kept"})

    head = server.requests[0].head.decode().lower()
    assert "accept-encoding: identity\r\n" in head and "accept-encoding: br" not in head
    assert "user-agent: memory-proxy\r\n" in head and "x-other: kept\r\n" in head


async def test_a_307_redirect_is_followed_with_the_same_body() -> None:
    async with TinyServer(redirect(307, "/v2/chat/completions")) as server, \
            OpenAIUpstream(server.url + "/v1") as upstream:
        response = await upstream.chat(UpstreamRequest({"model": "m", "messages": []}))

    assert response.body == b"ok"
    assert [r.head.split(b" ")[1] for r in server.requests] == [
        b"/v1/chat/completions", b"/v2/chat/completions"]
    assert server.requests[0].body == server.requests[1].body != b""


async def test_a_redirect_to_another_origin_drops_the_credentials() -> None:
    async with TinyServer() as other:
        moved = redirect(302, other.url + "/v1/models")
        async with TinyServer(moved) as first, \
                OpenAIUpstream(first.url + "/v1", api_key="sk-secret") as upstream:
            response = await upstream.models({})

    assert response.body == b"ok"
    assert b"authorization: Bearer sk-secret" in first.requests[0].head
    assert b"authorization" not in other.requests[0].head.lower()


async def test_a_302_answer_to_a_post_is_passed_through_as_an_error_status() -> None:
    async with TinyServer(redirect(302, "/elsewhere")) as server, \
            OpenAIUpstream(server.url + "/v1") as upstream:
        with pytest.raises(UpstreamStatusError) as raised:
            await upstream.chat(UpstreamRequest({"model": "m", "messages": []}))

    assert raised.value.status_code == 302
    assert len(server.requests) == 1


# ---- TLS ----


@pytest.fixture
def certificates(tmp_path: Path) -> tuple[Path, ssl.SSLContext]:
    ca, cert, key = make_certificates(tmp_path)
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_context.load_cert_chain(cert, key)
    return ca, server_context


async def test_https_requests_verify_the_server_and_reuse_the_connection(
    certificates: tuple[Path, ssl.SSLContext],
) -> None:
    ca, server_context = certificates
    client = HTTP1Client(ssl_context=ssl.create_default_context(cafile=str(ca)))
    try:
        async with TinyServer(tls=server_context) as server:
            bodies = [await get(client, server) for _ in range(3)]

            assert bodies == [b"ok"] * 3
            assert server.connections == 1
    finally:
        await client.close()


async def test_openai_upstream_uses_the_default_trust_store_for_https(
    certificates: tuple[Path, ssl.SSLContext], monkeypatch: pytest.MonkeyPatch,
) -> None:
    ca, server_context = certificates
    async with TinyServer(tls=server_context) as server:
        async with OpenAIUpstream(server.url + "/v1") as upstream:
            with pytest.raises(UpstreamConnectError) as untrusted:
                await upstream.models({})
        monkeypatch.setenv("SSL_CERT_FILE", str(ca))  # read by ssl.create_default_context()
        async with OpenAIUpstream(server.url + "/v1") as upstream:
            response = await upstream.models({})

    assert isinstance(untrusted.value.__cause__, ssl.SSLCertVerificationError)
    assert response.status_code == 200 and response.body == b"ok"
