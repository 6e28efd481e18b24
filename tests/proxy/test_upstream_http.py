"""The direct upstream's HTTP behaviour against tiny scripted servers on loopback: what an
HTTP proxy's users expect (environment proxies, a connection limit, TLS settings,
redirects), encodings, disconnects and timeouts."""

from __future__ import annotations

import asyncio
import gzip
import os
import socket
import ssl
from pathlib import Path
from typing import Any

import pytest
from tiny_server import (
    Reader,
    TinyServer,
    Writer,
    chunked,
    hang,
    make_certificates,
    redirect,
    respond,
    send_raw,
)

from proxy.errors import UpstreamConnectError, UpstreamStatusError, UpstreamTimeout
from proxy.upstreams.base import UpstreamRequest
from proxy.upstreams.openai_http import OpenAIUpstream, TLSSettings

CHAT = UpstreamRequest({"model": "m", "messages": []}, {"Authorization": "Bearer sk-client"})


async def test_sequential_calls_reuse_one_kept_alive_connection() -> None:
    async with TinyServer() as server, OpenAIUpstream(server.url + "/v1") as upstream:
        for _ in range(3):
            assert (await upstream.chat(CHAT)).body == b"ok"
    assert server.connections == 1


async def test_the_connection_limit_bounds_concurrent_calls() -> None:
    async def slow_ok(reader: Reader, writer: Writer) -> bool:
        await asyncio.sleep(0.1)
        return await respond(b"ok")(reader, writer)

    async with TinyServer(default=slow_ok) as server, \
            OpenAIUpstream(server.url + "/v1", max_connections=1) as upstream:
        answers = await asyncio.gather(*(upstream.chat(CHAT) for _ in range(4)))
    assert [a.body for a in answers] == [b"ok"] * 4
    assert server.connections == 1


async def test_http_proxy_from_the_environment_is_used_and_no_proxy_is_honoured(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with TinyServer() as proxy_server:
        monkeypatch.setenv("HTTP_PROXY", proxy_server.url)
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        async with OpenAIUpstream("http://upstream.example:8080/v1") as upstream:
            assert (await upstream.chat(CHAT)).body == b"ok"
        # the request went to the proxy, for the upstream's absolute URL
        assert proxy_server.requests[0].head.startswith(
            b"POST http://upstream.example:8080/v1/chat/completions HTTP/1.1")
        async with TinyServer() as direct:
            monkeypatch.setenv("NO_PROXY", "127.0.0.1")
            async with OpenAIUpstream(direct.url + "/v1") as upstream:
                await upstream.chat(CHAT)
            assert len(direct.requests) == 1 and len(proxy_server.requests) == 1


async def test_requests_ask_for_an_unencoded_body_and_name_the_proxy() -> None:
    async with TinyServer() as server, OpenAIUpstream(server.url + "/v1") as upstream:
        await upstream.models({"Accept-Encoding": "br", "X-Other": "kept"})
    head = server.requests[0].head.decode().lower()
    assert "accept-encoding: identity\r\n" in head and "accept-encoding: br" not in head
    assert "user-agent: memory-proxy\r\n" in head and "x-other: kept\r\n" in head


async def test_a_gzip_body_sent_regardless_is_decoded() -> None:
    body = gzip.compress(b'{"ok": true}')
    async with TinyServer(respond(body, headers=("Content-Encoding: gzip",))) as server, \
            OpenAIUpstream(server.url + "/v1") as upstream:
        assert (await upstream.chat(CHAT)).body == b'{"ok": true}'


async def test_repeated_response_headers_are_kept() -> None:
    answer = respond(b"ok", headers=("X-Trace: a", "X-Trace: b"))
    async with TinyServer(answer) as server, OpenAIUpstream(server.url + "/v1") as upstream:
        response = await upstream.chat(CHAT)
    assert response.headers["x-trace"] == "a, b"


async def test_a_307_redirect_is_followed_with_the_same_body() -> None:
    async with TinyServer(redirect(307, "/v2/chat/completions")) as server, \
            OpenAIUpstream(server.url + "/v1") as upstream:
        response = await upstream.chat(CHAT)
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
            await upstream.chat(CHAT)
    assert raised.value.status_code == 302
    assert len(server.requests) == 1


async def test_closing_a_stream_before_its_end_disconnects_from_the_server() -> None:
    gone = asyncio.Event()

    async def endless(reader: Reader, writer: Writer) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n")
        try:
            while not reader.at_eof():
                writer.write(b'10\r\ndata: {"n": 1}\n\n\r\n')
                await writer.drain()
                await asyncio.sleep(0.01)
        except ConnectionError:
            pass
        gone.set()
        return False

    async with TinyServer(endless) as server, OpenAIUpstream(server.url + "/v1") as upstream:
        stream = await upstream.chat_stream(CHAT)
        assert (await stream.__anext__()).data == b'{"n": 1}'
        await stream.aclose()
        await asyncio.wait_for(gone.wait(), 5)  # the server saw the client go


async def test_a_stream_read_to_its_end_keeps_the_connection() -> None:
    events = chunked(b"data: {}\n\n", b"data: [DONE]\n\n",
                     headers=("Content-Type: text/event-stream",))
    async with TinyServer(default=send_raw(events)) as server, \
            OpenAIUpstream(server.url + "/v1") as upstream:
        for _ in range(2):
            stream = await upstream.chat_stream(CHAT)
            assert [e.data async for e in stream] == [b"{}", b"[DONE]"]
            await stream.aclose()
    assert server.connections == 1


async def test_no_headers_before_the_first_byte_timeout_raises_upstream_timeout() -> None:
    async with TinyServer(hang) as server, \
            OpenAIUpstream(server.url + "/v1", first_byte_timeout=0.2) as upstream:
        with pytest.raises(UpstreamTimeout):
            await upstream.chat(CHAT)


async def test_a_stream_silent_longer_than_the_timeout_raises_upstream_timeout() -> None:
    async with TinyServer(send_raw(chunked(b"data: {}\n\n")[:-5], then_wait=5)) as server, \
            OpenAIUpstream(server.url + "/v1", timeout=0.2) as upstream:
        stream = await upstream.chat_stream(CHAT)
        try:
            with pytest.raises(UpstreamTimeout):
                async for _ in stream:
                    pass
        finally:
            await stream.aclose()


async def test_a_body_cut_mid_way_raises_upstream_connect_error() -> None:
    cut = b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial"
    async with TinyServer(send_raw(cut, close=True)) as server, \
            OpenAIUpstream(server.url + "/v1") as upstream:
        with pytest.raises(UpstreamConnectError):
            await upstream.chat(CHAT)


async def test_an_unknown_host_raises_upstream_connect_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_such_host(*args: Any, **kwargs: Any) -> Any:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", no_such_host)
    async with OpenAIUpstream("http://upstream.invalid/v1", trust_env=False) as upstream:
        with pytest.raises(UpstreamConnectError, match="upstream unreachable"):
            await upstream.chat(CHAT)


async def test_a_url_that_is_not_http_raises_upstream_connect_error_per_call() -> None:
    async with OpenAIUpstream("ftp://example/v1") as upstream:
        with pytest.raises(UpstreamConnectError):
            await upstream.models({})


# ---- TLS ----


@pytest.fixture
def certificates(tmp_path: Path) -> tuple[Path, Path, Path]:
    return make_certificates(tmp_path)


def server_tls(cert: Path, key: Path, *, client_ca: Path | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    if client_ca is not None:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(client_ca)
    return context


async def test_https_is_verified_against_the_trust_store_or_the_configured_ca_bundle(
    certificates: tuple[Path, Path, Path],
) -> None:
    ca, cert, key = certificates
    async with TinyServer(tls=server_tls(cert, key)) as server:
        async with OpenAIUpstream(server.url + "/v1") as upstream:
            with pytest.raises(UpstreamConnectError):
                await upstream.models({})
        async with OpenAIUpstream(server.url + "/v1",
                                  tls=TLSSettings(ca_bundle=str(ca))) as upstream:
            answers = [await upstream.models({}) for _ in range(3)]
    assert [a.body for a in answers] == [b"ok"] * 3
    assert server.connections == 1  # one kept-alive connection (the refused one never opened)


async def test_a_client_certificate_is_presented_when_configured(
    certificates: tuple[Path, Path, Path],
) -> None:
    ca, cert, key = certificates
    async with TinyServer(tls=server_tls(cert, key, client_ca=ca)) as server:
        async with OpenAIUpstream(server.url + "/v1",
                                  tls=TLSSettings(ca_bundle=str(ca))) as upstream:
            with pytest.raises(UpstreamConnectError):
                await upstream.models({})
        tls = TLSSettings(ca_bundle=str(ca), client_cert=str(cert), client_key=str(key))
        async with OpenAIUpstream(server.url + "/v1", tls=tls) as upstream:
            response = await upstream.models({})
    assert response.body == b"ok"


async def test_the_tls_and_pool_settings_reach_the_direct_upstream(
    certificates: tuple[Path, Path, Path],
) -> None:
    from proxy.http.app import build_upstream
    from proxy.settings import Settings

    ca, cert, key = certificates
    async with TinyServer(tls=server_tls(cert, key, client_ca=ca)) as server:
        upstream = build_upstream(Settings(
            upstream_url=server.url + "/v1", upstream_ca_bundle=str(ca),
            upstream_client_cert=str(cert), upstream_client_key=str(key),
            upstream_max_connections=1,
        ))
        await upstream.start()
        try:
            answers = await asyncio.gather(*(upstream.chat(CHAT) for _ in range(3)))
        finally:
            await upstream.close()
    assert [a.body for a in answers] == [b"ok"] * 3
    assert server.connections == 1


async def test_a_plain_http_upstream_starts_and_answers_without_opening_the_tls_files(
    tmp_path: Path,
) -> None:
    # the TLS files are read when a TLS context is built (about 20 ms with the trust
    # store): files that do not exist show that an http:// upstream never builds one
    from proxy.http.app import build_upstream
    from proxy.settings import Settings
    from proxy.upstreams.anthropic_http import AnthropicUpstream

    async with TinyServer() as server:
        settings = Settings(
            upstream_url=server.url + "/v1", anthropic_url=server.url,
            upstream_ca_bundle=str(tmp_path / "absent-ca.pem"),
            upstream_client_cert=str(tmp_path / "absent-cert.pem"),
        )
        direct = build_upstream(settings)
        messages = AnthropicUpstream(settings.anthropic_url,
                                     tls=TLSSettings.from_settings(settings))
        await direct.start()
        await messages.start()
        try:
            answers = [await direct.chat(CHAT), await messages.messages(CHAT)]
        finally:
            await direct.close()
            await messages.close()
    assert [a.body for a in answers] == [b"ok", b"ok"]
    assert [r.head.split(b" ")[1] for r in server.requests] == [
        b"/v1/chat/completions", b"/v1/messages"]


async def test_a_redirect_from_a_plain_http_upstream_to_https_uses_the_tls_settings(
    certificates: tuple[Path, Path, Path],
) -> None:
    ca, cert, key = certificates
    async with TinyServer(tls=server_tls(cert, key)) as secure:
        moved = redirect(302, secure.url + "/v1/models")
        async with TinyServer(moved, moved) as plain:
            async with OpenAIUpstream(plain.url + "/v1") as upstream:
                with pytest.raises(UpstreamConnectError):  # the trust store knows no such CA
                    await upstream.models({})
            async with OpenAIUpstream(plain.url + "/v1",
                                      tls=TLSSettings(ca_bundle=str(ca))) as upstream:
                response = await upstream.models({})
    assert response.body == b"ok"
    assert len(plain.requests) == 2 and len(secure.requests) == 1


def test_the_environment_is_trusted_only_when_it_sets_a_proxy_or_a_netrc_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # aiohttp reads them again for every request (on a thread): only asked when set
    from proxy.upstreams.openai_http import environment_has_settings

    for name in list(os.environ):
        if name.lower().endswith("_proxy"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("NETRC", str(tmp_path / "absent"))
    assert not environment_has_settings()
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:3128")
    assert environment_has_settings()
    monkeypatch.delenv("HTTPS_PROXY")
    (tmp_path / "netrc").write_text("machine upstream.example login u password p\n")
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    assert environment_has_settings()
