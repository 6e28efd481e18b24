"""Upstream clients against the fake upstream over real loopback HTTP."""

from __future__ import annotations

import asyncio
import copy
import json
import socket
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from types import SimpleNamespace
from typing import Any

import pytest
from aiohttp import web

from proxy.errors import UpstreamConnectError, UpstreamStatusError, UpstreamTimeout
from proxy.surfaces.chat_reply import ReplyAccumulator
from proxy.testing.fake_upstream import FakeUpstream, Reply
from proxy.upstreams.base import SSEEvent, UpstreamRequest, UpstreamResponse
from proxy.upstreams.litellm_upstream import LitellmUpstream
from proxy.upstreams.openai_http import OpenAIUpstream
from proxy.upstreams.router import RoutedUpstream

MESSAGES = [{"role": "user", "content": "hi there"}]


def chat_request(stream: bool = False, **body: Any) -> UpstreamRequest:
    return UpstreamRequest(
        {"model": "fake-model", "messages": MESSAGES, "stream": stream, **body},
        {"Authorization": "Bearer sk-client"},
    )


@pytest.fixture(scope="module")
def server() -> Iterator[FakeUpstream]:
    with FakeUpstream.running() as fake:
        yield fake


@pytest.fixture
def fake(server: FakeUpstream) -> FakeUpstream:
    server.reset()
    return server


@pytest.fixture
async def upstream(fake: FakeUpstream) -> AsyncIterator[OpenAIUpstream]:
    async with OpenAIUpstream(fake.url) as client:
        yield client


async def collect(stream: Any) -> list[SSEEvent]:
    try:
        return [event async for event in stream]
    finally:
        await stream.aclose()


# ---- OpenAIUpstream ----


async def test_a_non_streaming_call_returns_the_upstream_json(
    fake: FakeUpstream, upstream: OpenAIUpstream
) -> None:
    response = await upstream.chat(chat_request())

    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    assert response.json()["choices"][0]["message"]["content"] == "ok: hi there"
    assert fake.requests[0].body["stream"] is False


async def test_a_stream_yields_sse_events_ending_with_done(
    fake: FakeUpstream, upstream: OpenAIUpstream
) -> None:
    fake.queue(Reply.text("alpha beta gamma"))

    stream = await upstream.chat_stream(chat_request(stream=True))
    events = await collect(stream)

    acc = ReplyAccumulator()
    for event in events:
        acc.add_event(event)
    assert stream.status_code == 200
    assert stream.headers["content-type"].startswith("text/event-stream")
    assert events[-1].done
    assert acc.message() == {"role": "assistant", "content": "alpha beta gamma"}


async def test_stream_events_arrive_as_soon_as_the_upstream_sends_them(
    fake: FakeUpstream, upstream: OpenAIUpstream
) -> None:
    rest_sent = threading.Event()
    fake.queue(Reply.text("one two three", until=rest_sent))  # the role event, then held

    stream = await upstream.chat_stream(chat_request(stream=True))
    try:
        first = await asyncio.wait_for(stream.__anext__(), 10)  # while the rest is held
        rest_sent.set()
        rest = [event async for event in stream]
    finally:
        await stream.aclose()

    assert json.loads(first.data)["choices"][0]["delta"]["role"] == "assistant"
    assert rest[-1].done


async def test_an_error_status_raises_with_the_upstream_status_and_body(
    fake: FakeUpstream, upstream: OpenAIUpstream
) -> None:
    body = b'{"error": {"message": "slow down", "type": "rate_limit_error"}}'
    fake.queue(Reply.error(429, body), Reply.error(503, "<html>down</html>",
                                                   content_type="text/html"))

    with pytest.raises(UpstreamStatusError) as json_error:
        await upstream.chat(chat_request())
    with pytest.raises(UpstreamStatusError) as html_error:
        await upstream.chat_stream(chat_request(stream=True))

    assert json_error.value.status_code == 429
    assert json_error.value.body() == body
    assert json_error.value.content_type.startswith("application/json")
    assert html_error.value.status_code == 503
    assert html_error.value.raw_body == b"<html>down</html>"


async def test_a_refused_connection_raises_upstream_connect_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, never listening: connections are refused
        # by name, as a provider is reached (a cookie jar keeps nothing an IP address sets)
        async with OpenAIUpstream(f"http://localhost:{port}/v1") as client:
            with pytest.raises(UpstreamConnectError) as raised:
                await client.chat(chat_request())

    assert raised.value.__cause__ is not None


async def test_a_stream_cut_mid_way_raises_upstream_connect_error_from_iteration(
    fake: FakeUpstream, upstream: OpenAIUpstream
) -> None:
    fake.queue(Reply.stream_cut(after_chunks=2))
    stream = await upstream.chat_stream(chat_request(stream=True))

    received = []
    with pytest.raises(UpstreamConnectError):
        try:
            async for event in stream:
                received.append(event)
        finally:
            await stream.aclose()

    assert len(received) == 2


async def test_a_non_streaming_body_cut_short_raises_upstream_connect_error(
    fake: FakeUpstream, upstream: OpenAIUpstream
) -> None:
    fake.queue(Reply.stream_cut())

    with pytest.raises(UpstreamConnectError):
        await upstream.chat(chat_request())


async def test_closing_a_stream_early_disconnects_from_the_upstream(
    fake: FakeUpstream, upstream: OpenAIUpstream
) -> None:
    fake.queue(Reply.text("a b c d e f g h i j", delay_between_chunks=0.1))
    stream = await upstream.chat_stream(chat_request(stream=True))

    await stream.__anext__()
    await stream.aclose()

    assert await asyncio.to_thread(fake.wait_for_disconnect, 5)
    assert fake.disconnects == 1


async def test_a_finished_stream_releases_its_connection_for_reuse(
    fake: FakeUpstream, upstream: OpenAIUpstream
) -> None:
    for _ in range(3):
        # the body ends a little after [DONE]: the rest is read, not the connection dropped
        fake.queue(Reply.text("a b", linger=0.1))
        stream = await upstream.chat_stream(chat_request(stream=True))
        async for event in stream:
            if event.done:
                break  # as the proxy does: stop reading at [DONE]
        await stream.aclose()

    assert fake.disconnects == 0
    assert len({r.client for r in fake.requests}) == 1  # one connection, reused


@asynccontextmanager
async def cookie_setting_upstream(seen: list[str | None]) -> AsyncIterator[str]:
    """An OpenAI-compatible upstream whose every answer sets a cookie, as providers' edges
    do (Cloudflare's ``__cf_bm`` on api.openai.com); ``seen`` gets each request's Cookie
    header. Its base URL is by name, as a provider is reached (a cookie jar keeps nothing
    an IP address sets)."""

    async def completions(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Cookie"))
        response = web.json_response({
            "id": "c", "object": "chat.completion", "created": 0, "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                         "finish_reason": "stop"}],
        })
        response.set_cookie("__cf_bm", "edge-cookie")
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", completions)
    runner = web.AppRunner(app)
    await runner.setup()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    await web.SockSite(runner, sock).start()
    try:
        yield f"http://localhost:{sock.getsockname()[1]}/v1"
    finally:
        await runner.cleanup()


async def test_a_cookie_one_answer_sets_is_never_sent_with_another_request() -> None:
    """One client's cookie must not ride along on every tenant's later requests."""
    seen: list[str | None] = []
    async with cookie_setting_upstream(seen) as base, OpenAIUpstream(base) as client:
        first = chat_request()
        first.headers["Cookie"] = "session=the-clients-own"
        await client.chat(first)
        await client.chat(chat_request())

    # a client's own Cookie header is forwarded as it came; the upstream's is not kept
    assert seen == ["session=the-clients-own", None]


async def test_a_cookie_one_answer_sets_is_never_sent_with_another_litellm_request() -> None:
    """The same through litellm's client for OpenAI-compatible providers (one per key,
    shared by every tenant the key serves)."""
    seen: list[str | None] = []
    async with cookie_setting_upstream(seen) as base:
        upstream = LitellmUpstream(api_key="sk-shared", api_base=base)
        await upstream.start()
        for _ in range(2):
            await upstream.chat(UpstreamRequest({"model": "openai/m", "messages": MESSAGES}))
        await upstream.close()

    assert seen == [None, None]


async def test_a_slow_first_byte_raises_upstream_timeout(fake: FakeUpstream) -> None:
    fake.queue(Reply.slow_first_token(delay=2.0), Reply.slow_first_token(delay=2.0))

    async with OpenAIUpstream(fake.url, first_byte_timeout=0.2) as client:
        with pytest.raises(UpstreamTimeout):
            await client.chat(chat_request())
        stream = await client.chat_stream(chat_request(stream=True))  # headers come at once
        with pytest.raises(UpstreamTimeout):
            await collect(stream)


async def test_a_whole_call_slower_than_the_timeout_raises_upstream_timeout(
    fake: FakeUpstream,
) -> None:
    fake.queue(Reply.slow_first_token(delay=2.0))

    async with OpenAIUpstream(fake.url, timeout=0.2) as client:
        with pytest.raises(UpstreamTimeout):
            await client.chat(chat_request())


async def test_the_client_authorization_is_forwarded_without_an_api_key(
    fake: FakeUpstream, upstream: OpenAIUpstream
) -> None:
    request = chat_request()
    request.headers["OpenAI-Organization"] = "org-1"

    await upstream.chat(request)

    headers = fake.requests[0].headers
    assert headers["authorization"] == "Bearer sk-client"
    assert headers["openai-organization"] == "org-1"


async def test_a_configured_api_key_replaces_the_client_authorization(
    fake: FakeUpstream,
) -> None:
    request = chat_request()
    request.headers["authorization"] = "Bearer sk-other"

    async with OpenAIUpstream(fake.url, api_key="sk-server") as client:
        await client.chat(request)
        await client.models({"Authorization": "Bearer sk-client"})

    assert [r.headers["authorization"] for r in fake.requests] == ["Bearer sk-server"] * 2


async def test_models_passes_the_upstream_answer_through(
    fake: FakeUpstream, upstream: OpenAIUpstream
) -> None:
    response = await upstream.models({"Authorization": "Bearer sk-client"})

    assert response.status_code == 200
    assert response.json()["data"][0]["id"] == "fake-model"
    assert fake.requests[0].path == "/v1/models"


# ---- RoutedUpstream ----


class StubUpstream:
    def __init__(self, name: str) -> None:
        self.name = name
        self.calls: list[str] = []
        self.started = self.closed = 0

    async def start(self) -> None:
        self.started += 1

    async def close(self) -> None:
        self.closed += 1

    async def chat(self, request: UpstreamRequest) -> UpstreamResponse:
        self.calls.append(request.model)
        return UpstreamResponse(200, self.name.encode())

    async def chat_stream(self, request: UpstreamRequest) -> Any:
        self.calls.append(request.model)
        return self.name

    async def models(self, headers: dict[str, str]) -> UpstreamResponse:
        return UpstreamResponse(200, self.name.encode())


@pytest.mark.parametrize(("model", "expected"), [
    pytest.param("gpt-4o", "direct", id="plain"),
    pytest.param("anthropic/claude-sonnet-4", "litellm", id="anthropic"),
    pytest.param("gemini/gemini-2.0-flash", "litellm", id="gemini"),
    pytest.param("bedrock/anthropic.claude-3", "litellm", id="bedrock"),
    pytest.param("openai/gpt-4o", "direct", id="openai-prefix"),
    pytest.param("meta-llama/Llama-3-8B", "direct", id="hf-style-id"),
])
async def test_models_with_a_litellm_provider_prefix_are_routed_to_litellm(
    model: str, expected: str
) -> None:
    direct, litellm = StubUpstream("direct"), StubUpstream("litellm")
    routed = RoutedUpstream(direct, lambda: litellm)
    await routed.start()

    response = await routed.chat(UpstreamRequest({"model": model}))
    stream = await routed.chat_stream(UpstreamRequest({"model": model}))
    await routed.close()

    assert response.body.decode() == expected and stream == expected
    assert (direct.started, direct.closed) == (1, 1)


async def test_the_litellm_upstream_is_built_and_started_only_when_first_needed() -> None:
    built: list[StubUpstream] = []

    def factory() -> StubUpstream:
        built.append(StubUpstream("litellm"))
        return built[-1]

    routed = RoutedUpstream(StubUpstream("direct"), factory)
    await routed.start()
    await routed.chat(UpstreamRequest({"model": "gpt-4o"}))
    assert built == []

    await asyncio.gather(*(routed.chat(UpstreamRequest({"model": "anthropic/claude"}))
                           for _ in range(3)))
    await routed.close()

    assert len(built) == 1
    assert (built[0].started, built[0].closed, len(built[0].calls)) == (1, 1, 3)


async def test_an_empty_prefix_set_sends_every_model_direct() -> None:
    direct, litellm = StubUpstream("direct"), StubUpstream("litellm")
    routed = RoutedUpstream(direct, lambda: litellm, prefixes=frozenset())

    await routed.chat(UpstreamRequest({"model": "anthropic/claude-3.5-sonnet"}))

    assert direct.calls == ["anthropic/claude-3.5-sonnet"] and litellm.calls == []


# ---- LitellmUpstream (real litellm, OpenAI-compatible path to the fake) ----


async def test_litellm_upstream_completes_and_streams_through_an_openai_compatible_base(
    fake: FakeUpstream,
) -> None:
    upstream = LitellmUpstream(api_key="sk-litellm", api_base=fake.url)
    await upstream.start()
    fake.queue(Reply.text("from litellm"),
               Reply.tool_calls([{"name": "lookup", "arguments": {"q": "abc def ghi"}}]),
               Reply.error(429))

    response = await upstream.chat(UpstreamRequest(
        {"model": "openai/fake-model", "messages": MESSAGES}))
    stream = await upstream.chat_stream(UpstreamRequest(
        {"model": "openai/fake-model", "messages": MESSAGES, "stream": True,
         "stream_options": {"include_usage": True}}))
    events = await collect(stream)
    with pytest.raises(UpstreamStatusError) as raised:
        await upstream.chat(UpstreamRequest({"model": "openai/fake-model", "messages": MESSAGES}))
    await upstream.close()

    assert response.status_code == 200
    assert response.json()["choices"][0]["message"]["content"] == "from litellm"
    acc = ReplyAccumulator()
    for event in events:
        acc.add_event(event)
    assert events[-1].done
    assert acc.message()["tool_calls"][0]["function"] == {  # type: ignore[index]
        "name": "lookup", "arguments": '{"q":"abc def ghi"}'}
    assert acc.finish_reason == "tool_calls" and acc.usage is not None
    assert raised.value.status_code == 429
    assert raised.value.to_dict() is not None
    assert b'"rate_limit_error"' in raised.value.body()
    assert [r.headers["authorization"] for r in fake.requests] == ["Bearer sk-litellm"] * 3
    assert fake.requests[0].body["model"] == "fake-model"


async def test_litellm_reshapes_only_its_own_copy_of_the_messages() -> None:
    """Some of litellm's provider transforms change the messages they are given in place.
    The messages the proxy sends are shared with later turns (the mapper keeps each
    record's rendering), so litellm gets a deep copy: the request is as it was."""
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "done"},
    ]
    before = copy.deepcopy(messages)
    seen: list[list[dict[str, Any]]] = []

    class Reshaping:
        """litellm's interface as the upstream uses it, changing what it is given."""

        async def acompletion(self, **kwargs: Any) -> Any:
            seen.append(kwargs["messages"])
            for message in kwargs["messages"]:
                message["role"] = "reshaped"
                message.pop("tool_calls", None)
                if isinstance(message["content"], list):
                    message["content"][0]["text"] = "reshaped"
            return SimpleNamespace(model_dump=lambda: {"choices": []})

    upstream = LitellmUpstream(api_key="sk-litellm", litellm=Reshaping())
    response = await upstream.chat(UpstreamRequest({"model": "openai/m", "messages": messages}))

    assert response.status_code == 200 and seen and seen[0][0]["role"] == "reshaped"
    assert messages == before


async def test_litellm_upstream_without_configured_models_answers_404() -> None:
    response = await LitellmUpstream().models({})

    assert response.status_code == 404
    assert response.json()["error"]["type"] == "not_found_error"


async def test_litellm_upstream_forwards_the_client_key_when_none_is_configured(
    fake: FakeUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    upstream = LitellmUpstream(api_base=fake.url)
    await upstream.start()

    await upstream.chat(UpstreamRequest({"model": "openai/fake-model", "messages": MESSAGES},
                                        {"Authorization": "Bearer sk-from-client"}))
    await upstream.close()

    assert fake.requests[0].headers["authorization"] == "Bearer sk-from-client"
