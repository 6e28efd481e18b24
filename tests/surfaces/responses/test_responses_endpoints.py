"""The Responses endpoints' edges through HTTP: bad input answered 4xx in OpenAI's error
shape, upstream errors passed through with their status, a failing stream ending in
``response.failed``, ``input_tokens``, ``X-Memory: off``, and one session shared with chat
completions."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from e2e import ADMIN_TOKEN, CLIENT_KEY

from proxy.testing.fake_upstream import FakeUpstream, Reply

MODEL = "gpt-4o"


def post(proxy: Any, path: str, body: Any, **headers: str) -> httpx.Response:
    return httpx.post(
        f"{proxy.base}{path}", content=body if isinstance(body, bytes) else json.dumps(body),
        headers={"authorization": f"Bearer {CLIENT_KEY}", "content-type": "application/json",
                 **headers},
        timeout=20,
    )


def sse_events(response: httpx.Response) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in response.text.splitlines()
            if line.startswith("data: ")]


@pytest.mark.parametrize("body, param", [
    pytest.param(b"not json", None, id="not-json"),
    pytest.param({"model": MODEL}, "input", id="no-input"),
    pytest.param({"model": MODEL, "input": 3}, "input", id="input-not-items"),
    pytest.param({"model": MODEL, "input": [{"type": "message", "role": "robot",
                                            "content": "x"}]}, "input[0].role", id="role"),
    pytest.param({"model": MODEL, "input": [{"type": "function_call_output", "output": "x"}]},
                 "input[0]", id="output-without-call-id"),
    pytest.param({"model": MODEL, "input": "hi", "stream": "yes"}, "stream", id="stream"),
    pytest.param({"model": MODEL, "input": "hi", "max_output_tokens": 0},
                 "max_output_tokens", id="max-output-tokens"),
    pytest.param({"model": MODEL, "input": "hi", "previous_response_id": "resp_nope"},
                 "previous_response_id", id="unknown-previous"),
    pytest.param({"model": MODEL, "input": [{"type": "item_reference", "id": "msg_1"}]},
                 "input[0]", id="item-reference"),
    pytest.param({"model": MODEL, "input": "", "tools": [None]}, "tools[0]", id="null-tool"),
    pytest.param({"model": MODEL, "input": [{"type": "computer_call_output", "call_id": []}]},
                 "input[0].call_id", id="built-in-output-call-id"),
    pytest.param({"model": MODEL, "input": "hi", "tools": [{"name": "f"}]}, "tools[0]",
                 id="tool-without-type"),
])
def test_bad_requests_are_answered_400_in_openais_shape(proxy, fake, body, param):
    response = post(proxy, "/v1/responses", body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert not [r for r in fake.requests if r.method == "POST"]


def test_unknown_response_ids_are_404_in_openais_shape(proxy, fake):
    for method, path in [("GET", "/v1/responses/resp_nope"),
                         ("DELETE", "/v1/responses/resp_nope"),
                         ("GET", "/v1/responses/resp_nope/input_items")]:
        response = httpx.request(method, f"{proxy.base}{path}",
                                 headers={"authorization": f"Bearer {CLIENT_KEY}"})
        assert response.status_code == 404
        assert response.json()["error"]["code"] == "response_not_found"


def test_an_upstream_error_passes_through_with_its_status_and_nothing_is_stored(proxy, fake):
    fake.queue(Reply.error(429))
    response = post(proxy, "/agents/a/sessions/err/v1/responses", {"model": MODEL, "input": "hi"})
    assert response.status_code == 429
    assert "error" in response.json()
    assert proxy.stored("a", "err") == []


def test_a_stream_that_fails_ends_with_response_failed_and_stores_nothing(proxy, fake):
    fake.queue(Reply.stream_cut(after_chunks=4))
    response = post(proxy, "/agents/a/sessions/cut/v1/responses",
                    {"model": MODEL, "input": "hi", "stream": True})
    events = sse_events(response)
    assert events[0]["type"] == "response.created"
    assert events[-1]["type"] == "response.failed"
    assert events[-1]["response"]["error"]["message"]
    assert proxy.stored("a", "cut") == []


def test_input_tokens_counts_the_window_the_proxy_would_send(proxy, fake):
    client = proxy.client("a", "count")
    first = client.responses.create(model=MODEL, input="The code is CODE-7. " * 50)
    alone = post(proxy, "/v1/responses/input_tokens", {"model": MODEL, "input": "Which code?"},
                 **{"x-memory": "off"}).json()
    chained = post(proxy, "/v1/responses/input_tokens",
                   {"model": MODEL, "input": "Which code?", "previous_response_id": first.id})
    assert chained.status_code == 200
    assert alone["object"] == "response.input_tokens"
    assert chained.json()["input_tokens"] > alone["input_tokens"] + 200
    assert len(proxy.stored("a", "count")) == 2  # counting stored nothing


def test_memory_off_passes_the_request_through_unstored(proxy, fake):
    client = proxy.client("a", "off", default_headers={"x-memory": "off"})
    reply = client.responses.create(model=MODEL, input="Hello there")
    assert reply.output_text == "ok: Hello there"
    assert proxy.stored("a", "off") == []


def test_chat_completions_and_responses_continue_one_session(proxy, fake: FakeUpstream):
    chat = proxy.client("shared", "s1")
    chat.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "The code is CODE-9."}]
    )
    reply = chat.responses.create(model=MODEL, input="Which code?")
    body = [r for r in fake.requests if r.method == "POST"][-1].body
    assert "The code is CODE-9." in json.dumps(body)
    reply = chat.responses.create(model=MODEL, input="And again?", previous_response_id=reply.id)
    chat.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Last."}])
    body = [r for r in fake.requests if r.method == "POST"][-1].body
    assert "And again?" in json.dumps(body["messages"])
    users = [m.content for m in proxy.stored("shared", "s1") if m.role == "user"]
    assert users == ["The code is CODE-9.", "Which code?", "And again?", "Last."]
    memory = httpx.get(f"{proxy.base}/memory/shared/s1",
                       headers={"authorization": f"Bearer {ADMIN_TOKEN}"}).json()
    shown = json.dumps(memory)
    assert "Which code?" in shown and "Last." in shown
    transcript = httpx.get(f"{proxy.base}/memory/shared/s1/transcript",
                           headers={"authorization": f"Bearer {ADMIN_TOKEN}"})
    assert transcript.status_code == 200 and "And again?" in transcript.text
