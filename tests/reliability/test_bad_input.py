"""Bad input, case by case: an OpenAI-shaped 4xx naming the problem, never a 500, nothing
sent upstream, nothing stored. (``test_request_fuzz.py`` tries thousands more.)"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from e2e import CLIENT_KEY, RunningProxy
from reliability_support import is_openai_error

from proxy.testing.fake_upstream import FakeUpstream

LIMIT = 16 * 1024


def deep(levels: int) -> bytes:
    return (b'{"model":"m","messages":[{"role":"user","content":"x"}],"tools":'
            + b"[" * levels + b"]" * levels + b"}")


def message(**fields: object) -> bytes:
    import orjson

    return orjson.dumps({"model": "m", "messages": [fields]})


CASES = [
    pytest.param(deep(300), 400, "invalid_json", id="nested-300-levels"),
    pytest.param(deep(2000), 400, "invalid_json", id="nested-2000-levels"),
    # (an integer past 64 bits but within a double's range reads as a float and goes on:
    # the upstream judges it)
    pytest.param(b'{"model":"m","messages":[{"role":"user","content":"x"}],"n":1'
                 + b"0" * 400 + b"}", 400, "invalid_json", id="integer-beyond-a-double"),
    pytest.param(b'{"model":"m","messages":[{"role":"user","content":"x"}],"top_p":1e999}',
                 400, "invalid_json", id="float-overflow"),
    pytest.param(b'{"model":"m","messages":[{"role":"user","content":"\\udc00"}]}', 400,
                 "invalid_json", id="lone-surrogate"),
    pytest.param(b'{"model":"m","messages":[{"role":"user","content":"\xff"}]}', 400,
                 "invalid_json", id="invalid-utf8"),
    pytest.param(message(role="user", content=[{"type": "text", "text": 7}]), 400, None,
                 id="text-part-not-a-string"),
    pytest.param(message(role="user", content=[{"type": ["image_url"]}]), 400, None,
                 id="part-type-not-a-string"),
    pytest.param(message(role="user", content="x", name={"n": 1}), 400, None,
                 id="name-not-a-string"),
    pytest.param(message(role="assistant", content=None,
                         tool_calls=[{"id": "c", "type": "function", "function": "f()"}]),
                 400, None, id="tool-call-function-not-an-object"),
    pytest.param(message(role="assistant", content=None, tool_calls=[
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}]),
                 400, None, id="tool-call-arguments-not-a-string"),
    pytest.param(message(role="tool", tool_call_id="never-called", content="42"), 400,
                 "orphan_tool_result", id="tool-result-without-its-call"),
    pytest.param(message(role="moderator", content="x"), 400, None, id="unknown-role"),
    pytest.param(b'{"model":"m","messages":{"role":"user"}}', 400, None,
                 id="messages-not-an-array"),
    pytest.param(b'{"model":"m","stream":1,"messages":[{"role":"user","content":"x"}]}',
                 400, None, id="stream-not-a-boolean"),
]


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    """Refused input never reaches a store: the embedded one is enough to check that."""
    return f"sqlite:///{tmp_path}/memory.db"


@pytest.fixture
def small(make_proxy: Callable[..., RunningProxy]) -> Iterator[RunningProxy]:
    yield make_proxy(max_body_bytes=LIMIT)


@pytest.mark.parametrize("payload, status, code", CASES)
def test_bad_input_is_a_4xx_that_stores_nothing(
    small: RunningProxy, fake: FakeUpstream, payload: bytes, status: int, code: str | None
) -> None:
    for stream_header in ({}, {"X-Memory-History": "full"}):
        response = httpx.post(
            f"{small.url('helper', 'bad')}/chat/completions", content=payload,
            headers={"Authorization": f"Bearer {CLIENT_KEY}",
                     "Content-Type": "application/json", **stream_header})
        assert response.status_code == status, response.text
        assert is_openai_error(response.json())
        if code:
            assert response.json()["error"]["code"] == code
    assert fake.chat_requests == []
    assert small.stored("helper", "bad") == []


def test_a_body_over_the_limit_is_a_413_even_without_a_content_length(
    small: RunningProxy, fake: FakeUpstream
) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"model":"m","messages":[{"role":"user","content":"'
        for _ in range(64):
            yield b"x" * 1024
        yield b'"}]}'

    for body in (chunks(), b"{" + b" " * (LIMIT + 1) + b"}"):
        response = httpx.post(f"{small.url('helper', 'big')}/chat/completions", content=body,
                              headers={"Authorization": f"Bearer {CLIENT_KEY}"})
        assert response.status_code == 413
        assert response.json()["error"]["code"] == "request_too_large"
    assert fake.chat_requests == [] and small.stored("helper", "big") == []
