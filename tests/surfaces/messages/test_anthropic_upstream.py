"""The Messages API client (proxy/upstreams/anthropic_http.py) against the fake Messages
upstream on loopback."""

from __future__ import annotations

import orjson
import pytest

from proxy.errors import UpstreamStatusError
from proxy.surfaces.messages_reply import MessageAccumulator
from proxy.testing.fake_messages import FakeMessages, anthropic_error, thinking
from proxy.testing.fake_upstream import Reply
from proxy.upstreams.anthropic_http import AnthropicUpstream
from proxy.upstreams.base import UpstreamRequest

BODY = {"model": "claude-sonnet-4-5", "max_tokens": 50,
        "messages": [{"role": "user", "content": "hello there"}]}


@pytest.fixture
def fake():
    with FakeMessages() as server:
        yield server


async def test_a_reply_comes_back_with_the_clients_headers_forwarded(fake):
    async with AnthropicUpstream(fake.base_url) as upstream:
        response = await upstream.messages(UpstreamRequest(BODY, {
            "x-api-key": "sk-ant-client", "anthropic-beta": "interleaved-thinking-2025-05-14"}),
            query="beta=true")
    assert orjson.loads(response.body)["content"] == [{"type": "text", "text": "ok: hello there"}]
    (seen,) = fake.message_requests
    assert seen.path == "/v1/messages"
    assert seen.headers["x-api-key"] == "sk-ant-client"
    assert seen.headers["anthropic-version"] == "2023-06-01"
    assert seen.headers["anthropic-beta"] == "interleaved-thinking-2025-05-14"


async def test_an_oauth_bearer_goes_as_sent(fake):
    async with AnthropicUpstream(fake.base_url + "/v1") as upstream:
        await upstream.messages(UpstreamRequest(BODY, {"authorization": "Bearer oat-token",
                                                       "anthropic-version": "2023-06-01"}))
    (seen,) = fake.message_requests
    assert seen.path == "/v1/messages"
    assert seen.headers["authorization"] == "Bearer oat-token"
    assert "x-api-key" not in seen.headers


async def test_a_configured_key_replaces_the_clients(fake):
    async with AnthropicUpstream(fake.base_url, api_key="sk-ant-proxy") as upstream:
        await upstream.messages(UpstreamRequest(BODY, {"x-api-key": "sk-ant-client",
                                                       "authorization": "Bearer other"}))
    (seen,) = fake.message_requests
    assert seen.headers["x-api-key"] == "sk-ant-proxy"
    assert "authorization" not in seen.headers


async def test_a_stream_is_read_event_by_event_to_message_stop(fake):
    fake.queue(thinking(Reply.text("streamed words here"), "hmm"))
    async with AnthropicUpstream(fake.base_url) as upstream:
        stream = await upstream.messages_stream(UpstreamRequest(BODY, {}))
        accumulator = MessageAccumulator()
        try:
            async for event in stream:
                if event.data:
                    accumulator.add_data(event.data)
        finally:
            await stream.aclose()
    assert accumulator.complete
    assert [b["type"] for b in accumulator.message()["content"]] == ["thinking", "text"]
    assert fake.message_requests[0].body["stream"] is True


async def test_an_error_status_raises_with_anthropics_body(fake):
    fake.queue(Reply.error(529, anthropic_error(529, "Overloaded")))
    async with AnthropicUpstream(fake.base_url) as upstream:
        with pytest.raises(UpstreamStatusError) as caught:
            await upstream.messages(UpstreamRequest(BODY, {"x-api-key": "sk-ant-secret-1"}))
    assert caught.value.status_code == 529
    assert orjson.loads(caught.value.body())["error"]["type"] == "overloaded_error"


async def test_count_tokens_is_answered(fake):
    async with AnthropicUpstream(fake.base_url) as upstream:
        response = await upstream.count_tokens(UpstreamRequest(
            {"model": BODY["model"], "messages": BODY["messages"]}, {}))
    assert orjson.loads(response.body)["input_tokens"] > 0
