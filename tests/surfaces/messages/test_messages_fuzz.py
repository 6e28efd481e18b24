"""Bad input never breaks the Messages surface: hypothesis fuzzes ``POST /v1/messages``.
Every input gets a 200 or a 4xx in Anthropic's shape, never a 5xx. The app runs in
process (``httpx.ASGITransport``) against the fake Messages upstream on loopback."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.http.app import create_app
from proxy.settings import Settings
from proxy.testing.fake_messages import FakeMessages

scalars = (st.none() | st.booleans() | st.integers(-5, 2**40) | st.text(max_size=10))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=10)
block_types = st.sampled_from(["text", "image", "document", "tool_use", "tool_result",
                               "thinking", "redacted_thinking", "server_tool_use", "x"])
blocks = st.fixed_dictionaries({"type": block_types | values}, optional={
    "text": st.text(max_size=20) | values,
    "id": st.sampled_from(["toolu_1", "toolu_2", ""]) | values,
    "name": st.sampled_from(["ls", ""]) | values,
    "input": values,
    "tool_use_id": st.sampled_from(["toolu_1", "toolu_2"]) | values,
    "content": st.text(max_size=10) | st.lists(values, max_size=2) | values,
    "is_error": values,
    "thinking": st.text(max_size=10) | values,
    "signature": st.text(max_size=10) | values,
    "source": st.fixed_dictionaries({"type": st.sampled_from(["base64", "url", "text", "file"])
                                     | values}, optional={
        "data": st.sampled_from(["AAAA", "!!", ""]) | values,
        "media_type": st.sampled_from(["image/png", "application/pdf", "text/plain"]) | values,
        "url": st.sampled_from(["https://127.0.0.1:9/a.png", ""]) | values}) | values,
    "cache_control": st.just({"type": "ephemeral"}) | values,
})
messages = st.lists(st.fixed_dictionaries({
    "role": st.sampled_from(["user", "assistant", "system", "tool"]) | values,
    "content": st.text(max_size=20) | st.lists(blocks, max_size=3) | values,
}), max_size=5) | values
good_blocks = st.one_of(
    st.builds(lambda t: {"type": "text", "text": t}, st.text(min_size=1, max_size=20)),
    st.builds(lambda i: {"type": "tool_use", "id": i, "name": "ls", "input": {"p": 1}},
              st.sampled_from(["toolu_1", "toolu_2"])),
    st.builds(lambda i, c: {"type": "tool_result", "tool_use_id": i, "content": c},
              st.sampled_from(["toolu_1", "toolu_2", "toolu_9"]),
              st.text(max_size=10) | st.just([{"type": "text", "text": "r"}])),
    st.builds(lambda t: {"type": "thinking", "thinking": t, "signature": "sig"},
              st.text(max_size=10)),
    st.just({"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": "iVBORw0KGgo="}}),
    st.just({"type": "document", "source": {"type": "text", "media_type": "text/plain",
                                            "data": "notes"}}),
    blocks,
)
good_messages = st.lists(st.fixed_dictionaries({
    "role": st.sampled_from(["user", "assistant", "user", "system"]),
    "content": st.text(min_size=1, max_size=20) | st.lists(good_blocks, min_size=1, max_size=3),
}), min_size=1, max_size=6)
good_bodies = st.fixed_dictionaries({
    "model": st.sampled_from(["claude-sonnet-4-5", "gpt-4o"]),
    "max_tokens": st.just(50),
    "messages": good_messages,
}, optional={
    "system": st.text(max_size=10),
    "tools": st.just([{"name": "ls", "input_schema": {"type": "object"}}]),
    "stream": st.booleans(),
})
bodies = good_bodies | st.fixed_dictionaries({}, optional={
    "model": st.sampled_from(["claude-sonnet-4-5", "gpt-4o", ""]) | values,
    "max_tokens": st.sampled_from([1, 100]) | values,
    "messages": messages,
    "system": st.text(max_size=10) | st.lists(blocks, max_size=2) | values,
    "tools": st.lists(st.fixed_dictionaries({"name": st.text(max_size=5)}, optional={
        "input_schema": st.just({"type": "object"})}), max_size=2) | values,
    "stream": st.booleans() | values,
    "metadata": values,
}) | values


@pytest.fixture(scope="module")
def app_and_fake(tmp_path_factory: pytest.TempPathFactory):
    directory: Path = tmp_path_factory.mktemp("fuzz")
    with FakeMessages() as fake:
        app = create_app(Settings(store_url=f"sqlite:///{directory}/m.db", upstream_url=fake.url,
                                  anthropic_url=fake.base_url, agents_dir=directory))
        yield app, fake


def post(app: Any, body: Any) -> httpx.Response:
    async def run() -> httpx.Response:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://proxy") as client:
                return await client.post("/agents/fuzz/sessions/s/v1/messages",
                                         content=orjson.dumps(body),
                                         headers={"x-api-key": "sk-fuzz",
                                                  "content-type": "application/json"})
    return asyncio.run(run())


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(body=bodies)
def test_any_request_gets_a_reply_or_an_anthropic_shaped_4xx(app_and_fake, body):
    app, _ = app_and_fake
    response = post(app, body)
    assert response.status_code < 500, response.text
    if response.status_code >= 400:
        data = response.json()
        assert data["type"] == "error"
        assert isinstance(data["error"]["type"], str) and data["error"]["message"]
