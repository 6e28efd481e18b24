"""Chat completions end to end: the official openai client -> proxy -> recording fake."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from e2e import ADMIN_TOKEN, CLIENT_KEY

from proxy.testing.fake_upstream import FakeUpstream, Reply


def sent_messages(fake: FakeUpstream, index: int = -1) -> list[dict]:
    return fake.chat_requests[index].body["messages"]


def test_a_non_streaming_turn_is_answered_and_stored(proxy, fake):
    fake.queue(Reply.text("Hello there"))
    client = proxy.client("helper", "s1")
    reply = client.chat.completions.create(
        model="gpt-4o",
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}],
    )
    assert reply.choices[0].message.content == "Hello there"
    assert sent_messages(fake) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
    ]
    stored = proxy.stored("helper", "s1")
    assert [(m.role, m.content) for m in stored] == [("user", "hi"), ("assistant", "Hello there")]
    assert all(m.tokens > 0 for m in stored)
    assert proxy.snapshot("helper", "s1").meta.system_prompt == [
        {"role": "system", "content": "Be brief."}
    ]


def test_a_delta_client_gets_its_history_added(proxy, fake):
    client = proxy.client("helper", "s2")
    fake.queue(Reply.text("Noted: 4711."), Reply.text("It is 4711."))
    client.chat.completions.create(
        model="gpt-4o",
        messages=[
            {"role": "system", "content": "sys"},
            {"role": "user", "content": "My order is 4711."},
        ],
    )
    client.chat.completions.create(
        model="gpt-4o",
        messages=[
            {"role": "system", "content": "sys"},
            {"role": "user", "content": "What is my order?"},
        ],
    )
    assert sent_messages(fake) == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "My order is 4711."},
        {"role": "assistant", "content": "Noted: 4711."},
        {"role": "user", "content": "What is my order?"},
    ]
    assert len(proxy.stored("helper", "s2")) == 4


def test_a_delta_client_without_a_system_prompt_gets_the_stored_one(proxy, fake):
    client = proxy.client("helper", "s3")
    client.chat.completions.create(
        model="gpt-4o",
        messages=[
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "a"},
        ],
    )
    client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "b"}])
    assert sent_messages(fake)[0] == {"role": "system", "content": "You are terse."}


def test_a_full_history_client_never_creates_duplicates(proxy, fake):
    client = proxy.client("helper", "full")
    history = [{"role": "user", "content": "one"}]
    for n in range(4):
        fake.queue(Reply.text(f"answer {n}"))
        reply = client.chat.completions.create(model="gpt-4o", messages=history)
        history += [
            {"role": "assistant", "content": reply.choices[0].message.content},
            {"role": "user", "content": f"next {n}"},
        ]
    stored = proxy.stored("helper", "full")
    assert [m.content for m in stored] == [
        "one",
        "answer 0",
        "next 0",
        "answer 1",
        "next 1",
        "answer 2",
        "next 2",
        "answer 3",
    ]
    # what the model got on the last turn is exactly the client's history
    assert sent_messages(fake) == history[:-2]


def test_a_full_history_client_that_rewinds_supersedes_later_messages(proxy, fake):
    client = proxy.client("helper", "rewind")
    fake.queue(Reply.text("A1"), Reply.text("A2"), Reply.text("A2 again"))
    client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "Q1"}])
    h = [
        {"role": "user", "content": "Q1"},
        {"role": "assistant", "content": "A1"},
        {"role": "user", "content": "Q2"},
    ]
    client.chat.completions.create(model="gpt-4o", messages=h)
    # regenerate: the same history again -> A2 superseded, a new reply stored
    client.chat.completions.create(model="gpt-4o", messages=h)
    stored = proxy.stored("helper", "rewind")
    assert [m.content for m in stored] == ["Q1", "A1", "Q2", "A2 again"]
    # edit the second question: everything after the common prefix is superseded
    fake.queue(Reply.text("B2"))
    client.chat.completions.create(
        model="gpt-4o", messages=[*h[:2], {"role": "user", "content": "Q2 edited"}]
    )
    assert [m.content for m in proxy.stored("helper", "rewind")] == ["Q1", "A1", "Q2 edited", "B2"]
    assert sent_messages(fake) == [*h[:2], {"role": "user", "content": "Q2 edited"}]
    # a user-only request looks like a delta; a client editing its first message says so
    fake.queue(Reply.text("C1"))
    client.chat.completions.create(
        model="gpt-4o",
        messages=[{"role": "user", "content": "Q1 edited"}],
        extra_headers={"X-Memory-History": "full"},
    )
    assert [m.content for m in proxy.stored("helper", "rewind")] == ["Q1 edited", "C1"]
    assert sent_messages(fake) == [{"role": "user", "content": "Q1 edited"}]
    # superseded messages are kept
    key = proxy.key("helper", "rewind")
    kept = proxy.call(proxy.services.store.get_messages(key, list(range(1, 10))))
    assert [m.content for m in kept] == [
        "Q1",
        "A1",
        "Q2",
        "A2",
        "A2 again",
        "Q2 edited",
        "B2",
        "Q1 edited",
        "C1",
    ]


def test_the_history_header_overrides_auto_detection(proxy, fake):
    client = proxy.client("helper", "hdr")
    fake.queue(Reply.text("first"))
    client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "x"}])
    # a request holding an assistant message, declared a delta: appended as is
    client.chat.completions.create(
        model="gpt-4o",
        messages=[{"role": "assistant", "content": "note"}, {"role": "user", "content": "y"}],
        extra_headers={"X-Memory-History": "delta"},
    )
    assert [m.content for m in proxy.stored("helper", "hdr")][:4] == ["x", "first", "note", "y"]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_request_fields_pass_through_untouched(proxy, fake, stream):
    client = proxy.client("helper", f"fields-{stream}")
    tools = [
        {
            "type": "function",
            "function": {
                "name": "lookup",
                "description": "d",
                "parameters": {"type": "object", "properties": {}},
            },
        }
    ]
    kwargs = dict(
        model="gpt-4o",
        messages=[{"role": "user", "content": "hi"}],
        tools=tools,
        tool_choice="auto",
        response_format={"type": "json_object"},
        temperature=0.3,
        n=1,
        top_p=0.9,
        seed=7,
        max_tokens=50,
        user="u-1",
        stop=["END"],
    )
    if stream:
        kwargs["stream_options"] = {"include_usage": True}
        list(client.chat.completions.create(stream=True, **kwargs))
    else:
        client.chat.completions.create(**kwargs)
    body = fake.chat_requests[-1].body
    for field in (
        "tools",
        "tool_choice",
        "response_format",
        "temperature",
        "n",
        "top_p",
        "seed",
        "max_tokens",
        "user",
        "stop",
    ):
        assert body[field] == kwargs[field], field
    if stream:
        assert body["stream_options"] == {"include_usage": True}


def test_a_stream_is_relayed_and_the_reply_stored(proxy, fake):
    fake.queue(Reply.text("one two three four"))
    client = proxy.client("helper", "stream")
    chunks = list(
        client.chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": "count"}], stream=True
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "one two three four"
    # usage was asked of the upstream for calibration, but not shown to this client
    assert all(c.usage is None for c in chunks)
    assert fake.chat_requests[-1].body["stream_options"] == {"include_usage": True}
    assert [m.content for m in proxy.stored("helper", "stream")] == ["count", "one two three four"]


def test_streamed_tool_calls_are_accumulated_and_stored(proxy, fake):
    fake.queue(
        Reply.tool_calls(
            [
                {
                    "id": "call_a",
                    "name": "search",
                    "arguments": {"q": "weather in Paris", "limit": 3},
                },
                {"id": "call_b", "name": "clock", "arguments": {"tz": "Europe/Paris"}},
            ]
        )
    )
    client = proxy.client("helper", "tools")
    chunks = list(
        client.chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": "weather?"}], stream=True
        )
    )
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    reply = proxy.stored("helper", "tools")[-1]
    assert reply.role == "assistant"
    assert [(c["id"], c["function"]["name"]) for c in reply.tool_calls] == [
        ("call_a", "search"),
        ("call_b", "clock"),
    ]
    arguments = json.loads(reply.tool_calls[0]["function"]["arguments"])
    assert arguments == {"q": "weather in Paris", "limit": 3}
    # the client answers with tool results only (a delta): the window keeps call and results
    fake.queue(Reply.text("Sunny, 14:00."))
    client.chat.completions.create(
        model="gpt-4o",
        messages=[
            {"role": "tool", "tool_call_id": "call_a", "content": "sunny"},
            {"role": "tool", "tool_call_id": "call_b", "content": "14:00"},
        ],
    )
    sent = sent_messages(fake)
    assert [m["role"] for m in sent] == ["user", "assistant", "tool", "tool"]
    assert sent[1]["tool_calls"] == reply.tool_calls


def test_upstream_errors_pass_through_with_status_and_body(proxy, fake):
    body = {
        "error": {
            "message": "slow down",
            "type": "rate_limit_error",
            "param": None,
            "code": "rate_limit_exceeded",
        }
    }
    fake.queue(Reply.error(429, body), Reply.error(429, body))
    for stream in (False, True):
        response = httpx.post(
            f"{proxy.url('helper', 'err')}/chat/completions",
            json={
                "model": "gpt-4o",
                "stream": stream,
                "messages": [{"role": "user", "content": "hi"}],
            },
            headers={"Authorization": f"Bearer {CLIENT_KEY}"},
        )
        assert response.status_code == 429
        assert response.json() == body
    assert proxy.stored("helper", "err") == []


def test_a_stream_cut_mid_way_ends_with_an_error_event_and_stores_nothing(proxy, fake):
    fake.queue(Reply.stream_cut(after_chunks=3, text="a b c d e f g"))
    with httpx.stream(
        "POST",
        f"{proxy.url('helper', 'cut')}/chat/completions",
        json={"model": "gpt-4o", "stream": True, "messages": [{"role": "user", "content": "hi"}]},
        headers={"Authorization": f"Bearer {CLIENT_KEY}"},
    ) as response:
        events = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] != "data: [DONE]"
    assert '"error"' in events[-1]
    assert proxy.stored("helper", "cut") == []


def test_every_stream_ends_with_done(proxy, fake):
    with httpx.stream(
        "POST",
        f"{proxy.url('helper', 'done')}/chat/completions",
        json={"model": "gpt-4o", "stream": True, "messages": [{"role": "user", "content": "hi"}]},
        headers={"Authorization": f"Bearer {CLIENT_KEY}"},
    ) as response:
        events = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"


def test_a_client_that_disconnects_cancels_the_upstream_call(proxy, fake):
    fake.queue(Reply.text(" ".join(["word"] * 200), delay_between_chunks=0.05))
    with httpx.stream(
        "POST",
        f"{proxy.url('helper', 'gone')}/chat/completions",
        json={"model": "gpt-4o", "stream": True, "messages": [{"role": "user", "content": "talk"}]},
        headers={"Authorization": f"Bearer {CLIENT_KEY}"},
    ) as response:
        for line in response.iter_lines():
            if "word" in line:
                break
    assert fake.wait_for_disconnect(timeout=3.0)


def test_models_are_forwarded_and_health_and_ready_answer(proxy, fake):
    client = proxy.client()
    assert [m.id for m in client.models.list().data] == ["fake-model"]
    assert httpx.get(f"{proxy.base}/health").json() == {"status": "ok"}
    ready = httpx.get(f"{proxy.base}/ready")
    assert ready.status_code == 200 and ready.json()["store"] == "ok"


def test_the_client_key_is_forwarded_unless_an_upstream_key_is_set(make_proxy, fake):
    plain = make_proxy()
    plain.client("a", "b").chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": "hi"}]
    )
    assert fake.chat_requests[-1].headers["authorization"] == f"Bearer {CLIENT_KEY}"
    keyed = make_proxy(upstream_api_key="sk-upstream")
    keyed.client("a", "b").chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": "hi"}]
    )
    assert fake.chat_requests[-1].headers["authorization"] == "Bearer sk-upstream"


def test_response_headers_name_agent_session_and_strategy(proxy, fake):
    response = httpx.post(
        f"{proxy.url('helper', 'hdrs')}/chat/completions",
        json={"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]},
        headers={"Authorization": f"Bearer {CLIENT_KEY}"},
    )
    assert response.headers["x-memory-agent"] == "helper"
    assert response.headers["x-memory-session"] == "hdrs"
    assert response.headers["x-memory-strategy"] == "summarizing_window"
    assert int(response.headers["x-memory-window-tokens"]) > 0
    assert response.headers["x-memory-context-modified"] == "false"


@pytest.mark.parametrize(
    "payload, status",
    [
        pytest.param(b"{not json", 400, id="malformed-json"),
        pytest.param(b"[]", 400, id="not-an-object"),
        pytest.param(b'{"model":"m","messages":[]}', 400, id="empty-messages"),
        pytest.param(
            b'{"model":"m","messages":[{"role":"wizard","content":"x"}]}', 400, id="unknown-role"
        ),
        pytest.param(
            b'{"model":"m","messages":[{"role":"user","content":5}]}', 400, id="wrong-content-type"
        ),
        pytest.param(
            b'{"model":"m","messages":[{"role":"tool","content":"x"}]}', 400, id="tool-without-id"
        ),
        pytest.param(
            b'{"model":"m","messages":[{"role":"user","content":"x"},'
            b'{"role":"tool","tool_call_id":"nope","content":"x"}]}',
            400,
            id="orphan-tool-result",
        ),
        pytest.param(
            b'{"model":"m","stream":"yes","messages":[{"role":"user","content":"x"}]}',
            400,
            id="stream-not-bool",
        ),
    ],
)
def test_bad_input_gets_an_openai_shaped_4xx_and_stores_nothing(proxy, fake, payload, status):
    response = httpx.post(
        f"{proxy.url('helper', 'bad')}/chat/completions",
        content=payload,
        headers={"Authorization": f"Bearer {CLIENT_KEY}", "content-type": "application/json"},
    )
    assert response.status_code == status
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert fake.chat_requests == []
    assert proxy.stored("helper", "bad") == []


def test_a_body_over_the_limit_gets_a_413(make_proxy, fake):
    proxy = make_proxy(max_body_bytes=4096)
    response = httpx.post(
        f"{proxy.url('helper', 'big')}/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": "x" * 10_000}]},
    )
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "request_too_large"


def test_openai_sdk_errors_map_cleanly(proxy, fake):
    fake.queue(Reply.error(500))
    with pytest.raises(openai.InternalServerError):
        proxy.client("helper", "e500").chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": "hi"}]
        )


def test_memory_endpoints_need_the_admin_token(proxy, fake):
    proxy.client("helper", "mem").chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": "hi"}]
    )
    assert httpx.get(f"{proxy.base}/memory/helper/mem").status_code == 401
    assert (
        httpx.get(
            f"{proxy.base}/memory/helper/mem", headers={"Authorization": "Bearer wrong"}
        ).status_code
        == 401
    )
    auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    listing = httpx.get(f"{proxy.base}/memory/helper", headers=auth).json()
    assert [s["session"] for s in listing["sessions"]] == ["mem"]
    view = httpx.get(f"{proxy.base}/memory/helper/mem", headers=auth)
    data = view.json()
    assert data["strategy"] == "summarizing_window"
    assert data["config"]["maxConversationRatio"] == 0.8
    assert data["context_window"] == 128000
    stored = proxy.stored("helper", "mem")
    assert [(m["role"], m["text"]) for m in data["messages"]] == [
        ("user", "hi"),
        ("assistant", stored[1].content),
    ]
    assert all(m["tokens"] > 0 for m in data["messages"])
    assert data["totals"]["window_tokens"] == sum(m["tokens"] for m in data["messages"])
    assert view.headers["x-memory-strategy"] == "summarizing_window"


def test_metrics_count_turns_tokens_and_errors(proxy, fake):
    def value(text: str, line: str) -> float:
        for row in text.splitlines():
            if row.startswith(line):
                return float(row.rsplit(" ", 1)[1])
        return 0.0

    before = httpx.get(f"{proxy.base}/metrics").text
    proxy.client("helper", "metrics").chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": "hi"}]
    )
    httpx.post(f"{proxy.url('helper', 'metrics')}/chat/completions", content=b"{nope")
    after = httpx.get(f"{proxy.base}/metrics").text
    turns = 'memory_proxy_turns_total{strategy="summarizing_window"}'
    tokens = 'memory_proxy_window_tokens_total{strategy="summarizing_window"}'
    errors = 'memory_proxy_errors_total{type="invalid_request_error"}'
    assert value(after, turns) == value(before, turns) + 1
    assert value(after, tokens) > value(before, tokens)
    assert value(after, errors) == value(before, errors) + 1
    assert "# TYPE memory_proxy_turns_total counter" in after
