"""Anthropic's Python SDK through the proxy's Messages API, offline against the fake
Messages upstream: replies whole and streamed, a multi-turn tool-using session with
thinking, images, token counting, errors in Anthropic's shape."""

from __future__ import annotations

import base64
from typing import Any

import anthropic
import httpx
import orjson
import pytest
from e2e import CLIENT_KEY, write_agent
from media_samples import png

from proxy.testing.fake_messages import anthropic_error, thinking
from proxy.testing.fake_upstream import Reply
from strategies import native

MODEL = "claude-sonnet-4-5"
TOOLS = [{"name": "read_file", "description": "Read a file",
          "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}]


def client(proxy, agent: str = "coder", session: str = "s1", **headers: str
           ) -> anthropic.Anthropic:
    base = f"{proxy.base}/agents/{agent}/sessions/{session}" if session else proxy.base
    made = anthropic.Anthropic(base_url=base, api_key=CLIENT_KEY, max_retries=0, timeout=20,
                               default_headers=headers or None)
    proxy.clients.append(made)
    return made


def texts(request: Any) -> str:
    return orjson.dumps([request.body.get("system"), request.body["messages"]]).decode()


def test_a_reply_comes_back_and_the_turn_is_stored(proxy, fake):
    reply = client(proxy).messages.create(
        model=MODEL, max_tokens=100, system="Be brief.",
        messages=[{"role": "user", "content": "hello there"}])
    assert reply.content[0].text == "ok: hello there"
    (sent,) = fake.message_requests
    # the SDK's credentials and version, forwarded as it sent them
    assert CLIENT_KEY in (sent.headers.get("x-api-key") or sent.headers["authorization"])
    assert sent.headers["anthropic-version"]
    assert sent.body["system"][0]["text"] == "Be brief."
    stored = proxy.stored("coder", "s1")
    assert [(m.role, m.content) for m in stored] == [("user", "hello there"),
                                                     ("assistant", "ok: hello there")]


def test_the_response_carries_the_memory_headers(proxy):
    raw = client(proxy).messages.with_raw_response.create(
        model=MODEL, max_tokens=100, messages=[{"role": "user", "content": "hi"}])
    assert raw.headers["x-memory-session"] == "s1"
    assert raw.headers["x-memory-strategy"]


def test_a_streamed_reply_is_relayed_and_stored(proxy, fake):
    fake.queue(thinking(Reply.text("streamed answer here"), "considering"))
    with client(proxy).messages.stream(
        model=MODEL, max_tokens=100, messages=[{"role": "user", "content": "stream please"}]
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "streamed answer here"
    assert final.content[0].type == "thinking"
    stored = proxy.stored("coder", "s1")
    assert stored[-1].role == "assistant"
    assert native.items(stored[-1].content, "messages") == [
        final.content[0].model_dump(exclude_none=True)]


def test_a_tool_using_session_keeps_its_memory_and_its_thinking(proxy, fake):
    api = client(proxy)
    fake.queue(thinking(Reply.tool_calls([{"id": "call_1", "name": "read_file",
                                           "arguments": {"path": "notes.txt"}}]),
                        "I need the notes", signature="sig-one"),
               Reply.text("The notes say BLUE-42."),
               Reply.text("You asked about the notes."))
    history: list[dict[str, Any]] = [{"role": "user", "content": "Remember CODE-X1. Read notes."}]
    first = api.messages.create(model=MODEL, max_tokens=200, tools=TOOLS, messages=history)
    assert first.stop_reason == "tool_use"
    call = next(b for b in first.content if b.type == "tool_use")
    history += [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                      "content": "BLUE-42"}]},
    ]
    second = api.messages.create(model=MODEL, max_tokens=200, tools=TOOLS, messages=history)
    history += [{"role": "assistant", "content": [b.model_dump() for b in second.content]},
                {"role": "user", "content": "What did I ask?"}]
    api.messages.create(model=MODEL, max_tokens=200, tools=TOOLS, messages=history)

    last = fake.message_requests[-1].body["messages"]
    assert "CODE-X1" in orjson.dumps(last).decode()
    thought = last[1]["content"][0]
    assert thought == {"type": "thinking", "thinking": "I need the notes",
                       "signature": "sig-one"}
    assert last[2]["content"][0]["type"] == "tool_result"
    stored = proxy.stored("coder", "s1")
    assert [m.role for m in stored] == ["user", "assistant", "tool", "assistant", "user",
                                        "assistant"]
    assert len({m.fingerprint for m in stored}) == len(stored)


def test_a_delta_client_gets_the_history_from_memory(proxy, fake):
    api = client(proxy)
    api.messages.create(model=MODEL, max_tokens=50,
                        messages=[{"role": "user", "content": "My name is Ada."}])
    api.messages.create(model=MODEL, max_tokens=50,
                        messages=[{"role": "user", "content": "What is my name?"}])
    assert "My name is Ada." in texts(fake.message_requests[-1])


def test_an_image_and_an_image_in_a_tool_result_reach_a_model_that_reads_images(
    messages_proxy, fake, agents_dir
):
    write_agent(agents_dir, "viewer", llm={"model": MODEL, "capabilities": ["image"]})
    proxy = messages_proxy()
    data = base64.b64encode(png(8, 6)).decode()
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": data}}
    fake.queue(Reply.tool_calls([{"id": "call_s", "name": "read_file", "arguments": {}}]))
    api = client(proxy, agent="viewer")
    first = api.messages.create(model=MODEL, max_tokens=50, tools=TOOLS, messages=[
        {"role": "user", "content": [image, {"type": "text", "text": "what is this?"}]}])
    call = first.content[0]
    api.messages.create(model=MODEL, max_tokens=50, tools=TOOLS, messages=[
        {"role": "user", "content": [image, {"type": "text", "text": "what is this?"}]},
        {"role": "assistant", "content": [call.model_dump()]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                      "content": [image]}]},
    ])
    first_sent, second_sent = fake.message_requests
    assert first_sent.body["messages"][0]["content"][-2]["source"]["data"] == data
    result = second_sent.body["messages"][-1]["content"][0]
    assert result["type"] == "tool_result"
    assert result["content"][0]["type"] == "image"
    assert result["content"][0]["source"]["data"] == data


def test_count_tokens_counts_the_window_the_proxy_would_send(proxy, fake):
    counted = client(proxy).messages.count_tokens(
        model=MODEL, messages=[{"role": "user", "content": "how many tokens?"}])
    assert counted.input_tokens > 0
    assert fake.requests[-1].path == "/v1/messages/count_tokens"
    assert proxy.stored("coder", "s1") == []  # counting stores nothing


def test_an_upstream_overload_is_anthropics_529(proxy, fake):
    fake.queue(Reply.error(529, anthropic_error(529, "Overloaded")))
    with pytest.raises(anthropic.APIStatusError) as caught:
        client(proxy).messages.create(model=MODEL, max_tokens=10,
                                      messages=[{"role": "user", "content": "x"}])
    assert caught.value.status_code == 529
    assert caught.value.body["error"]["type"] == "overloaded_error"
    assert proxy.stored("coder", "s1") == []


@pytest.mark.parametrize(
    ("body", "status", "kind"),
    [
        pytest.param({"model": MODEL, "messages": [{"role": "user", "content": "x"}]}, 400,
                     "invalid_request_error", id="no-max-tokens"),
        pytest.param({"model": MODEL, "max_tokens": 5, "messages": "x"}, 400,
                     "invalid_request_error", id="messages-not-a-list"),
    ],
)
def test_bad_requests_are_refused_in_anthropics_shape(proxy, body, status, kind):
    response = httpx.post(f"{proxy.base}/v1/messages", json=body,
                          headers={"x-api-key": CLIENT_KEY})
    assert response.status_code == status
    assert response.json()["type"] == "error"
    assert response.json()["error"]["type"] == kind


def test_a_stream_cut_by_the_upstream_ends_with_an_error_event(proxy, fake):
    fake.queue(Reply.stream_cut(after_chunks=3))
    response = httpx.post(f"{proxy.base}/v1/messages", headers={"x-api-key": CLIENT_KEY},
                          json={"model": MODEL, "max_tokens": 10, "stream": True,
                                "messages": [{"role": "user", "content": "x"}]})
    assert response.text.rstrip().split("\n\n")[-1].startswith("event: error")


def test_the_base_url_answers_head(proxy):
    assert httpx.head(proxy.base + "/").status_code == 200
    assert httpx.head(f"{proxy.base}/agents/a/sessions/b").status_code == 200


def test_a_model_of_another_provider_is_served_through_chat_completions(proxy, fake):
    api = client(proxy, session="translated")
    fake.queue(Reply.tool_calls([{"id": "call_t", "name": "read_file",
                                  "arguments": {"path": "a"}}], content="Reading."))
    reply = api.messages.create(model="gpt-4o", max_tokens=50, tools=TOOLS,
                                messages=[{"role": "user", "content": "read a"}])
    assert [b.type for b in reply.content] == ["text", "tool_use"]
    assert reply.content[1].input == {"path": "a"}
    (sent,) = fake.chat_requests
    assert sent.body["tools"][0]["function"]["name"] == "read_file"
    with api.messages.stream(model="gpt-4o", max_tokens=50, tools=TOOLS, messages=[
        {"role": "user", "content": "read a"},
        {"role": "assistant", "content": [b.model_dump() for b in reply.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_t",
                                      "content": "file a"}]},
    ]) as stream:
        assert "".join(stream.text_stream).startswith("ok")
    assert [m.role for m in proxy.stored("coder", "translated")] == [
        "user", "assistant", "tool", "assistant"]


def test_memory_off_is_a_plain_pass_through(proxy, fake):
    api = client(proxy, session="plain", **{"X-Memory": "off"})
    body = [{"role": "user", "content": [{"type": "text", "text": "as sent",
                                          "cache_control": {"type": "ephemeral"}}]}]
    api.messages.create(model=MODEL, max_tokens=10, messages=body)
    assert fake.message_requests[-1].body["messages"] == body
    assert proxy.stored("coder", "plain") == []


def test_an_error_event_inside_the_upstreams_stream_ends_the_stream_and_stores_nothing(
    proxy, fake
):
    events = (
        b'event: message_start\ndata: {"type":"message_start","message":{"id":"msg_1",'
        b'"type":"message","role":"assistant","model":"m","content":[],"stop_reason":null,'
        b'"usage":{"input_tokens":5,"output_tokens":1}}}\n\n'
        b'event: error\ndata: {"type":"error","error":{"type":"overloaded_error",'
        b'"message":"Overloaded"}}\n\n'
    )
    fake.queue(Reply.raw(events, content_type="text/event-stream"))
    with pytest.raises(anthropic.APIStatusError) as caught, client(proxy).messages.stream(
        model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "x"}]
    ) as stream:
        list(stream.text_stream)
    assert "Overloaded" in str(caught.value)
    assert proxy.stored("coder", "s1") == []


def test_a_translated_stream_cut_by_the_upstream_ends_with_an_error_event(proxy, fake):
    fake.queue(Reply.stream_cut(after_chunks=3))
    response = httpx.post(f"{proxy.base}/agents/a/sessions/cut/v1/messages",
                          headers={"x-api-key": CLIENT_KEY},
                          json={"model": "gpt-4o", "max_tokens": 10, "stream": True,
                                "messages": [{"role": "user", "content": "x"}]})
    last = response.text.rstrip().split("\n\n")[-1]
    assert last.startswith("event: error")
    assert "message_stop" not in response.text
    assert proxy.stored("a", "cut") == []


def test_claude_codes_side_calls_under_its_session_id_are_conversations_of_their_own(
    proxy, fake
):
    """Claude Code sends title, quota and sub-agent calls under its session id: each keeps
    its own log, none reads or rewinds the main conversation's."""
    api = anthropic.Anthropic(base_url=proxy.base, api_key=CLIENT_KEY, max_retries=0,
                              default_headers={"X-Claude-Code-Session-Id": "cc-1"})
    proxy.clients.append(api)
    main = {"model": MODEL, "max_tokens": 10, "system": "You are Claude Code.", "tools": TOOLS}
    history: list[dict[str, Any]] = [{"role": "user", "content": "first question"}]
    reply = api.messages.create(**main, messages=history)
    history += [{"role": "assistant", "content": [b.model_dump() for b in reply.content]},
                {"role": "user", "content": "second question"}]
    api.messages.create(model="claude-haiku-4-5", max_tokens=10, system="Write a title.",
                        messages=[{"role": "user", "content": "title for: first question"}])
    side = fake.message_requests[-1].body
    assert [m["role"] for m in side["messages"]] == ["user"]
    api.messages.create(**main, messages=history)
    sessions = {s.session for s in proxy.call(proxy.services.store.list_sessions("default"))}
    assert len(sessions) == 2 and all(s.startswith("cc-1.") for s in sessions)
    logs = [[m.content for m in proxy.stored("default", s)] for s in sorted(sessions)]
    assert sorted(len(log) for log in logs) == [2, 4]


def test_memory_off_through_chat_completions_is_translated_both_ways(proxy, fake):
    api = client(proxy, session="plain", **{"X-Memory": "off"})
    with api.messages.stream(model="gpt-4o", max_tokens=10,
                             messages=[{"role": "user", "content": "hello you"}]) as stream:
        assert "".join(stream.text_stream) == "ok: hello you"
    assert fake.chat_requests[-1].body["messages"] == [{"role": "user", "content": "hello you"}]
    assert proxy.stored("coder", "plain") == []


def test_count_tokens_through_chat_completions_is_the_proxys_estimate(proxy, fake):
    counted = client(proxy, session="estimate").messages.count_tokens(
        model="gpt-4o", messages=[{"role": "user", "content": "how many tokens are these?"}])
    assert 5 < counted.input_tokens < 50
    assert not fake.requests


@pytest.mark.parametrize(
    ("api", "model", "path"),
    [
        pytest.param("chat", MODEL, "/v1/chat/completions", id="claude-model-sent-to-chat"),
        pytest.param("messages", "my-gateway-model", "/v1/messages",
                     id="other-model-sent-to-messages"),
    ],
)
def test_an_agents_llm_api_picks_the_upstream(messages_proxy, fake, agents_dir, api, model,
                                              path):
    write_agent(agents_dir, "routed", llm={"api": api})
    proxy = messages_proxy()
    client(proxy, agent="routed").messages.create(
        model=model, max_tokens=10, messages=[{"role": "user", "content": "route me"}])
    assert [r.path for r in fake.requests if r.method == "POST"] == [path]


def test_an_overlong_tool_use_id_is_refused_naming_it(proxy):
    response = httpx.post(f"{proxy.base}/v1/messages", headers={"x-api-key": CLIENT_KEY}, json={
        "model": MODEL, "max_tokens": 5, "tools": TOOLS, "messages": [
            {"role": "user", "content": "x"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t" * 300,
                                               "name": "read_file", "input": {}}]},
            {"role": "user", "content": "y"}]})
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"
    assert "tool_calls[0].id" in response.json()["error"]["message"]


def test_a_pass_through_stream_ends_with_the_upstreams_error_event(proxy, fake):
    fake.queue(Reply.raw(
        b'event: error\ndata: {"type":"error","error":{"type":"overloaded_error",'
        b'"message":"Overloaded"}}\n\n', content_type="text/event-stream"))
    response = httpx.post(f"{proxy.base}/v1/messages",
                          headers={"x-api-key": CLIENT_KEY, "x-memory": "off"},
                          json={"model": MODEL, "max_tokens": 10, "stream": True,
                                "messages": [{"role": "user", "content": "x"}]})
    assert response.text.rstrip().split("\n\n")[-1].startswith("event: error")
    assert "message_stop" not in response.text
