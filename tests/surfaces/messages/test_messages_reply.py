"""Messages replies read into the stored record, and chat completions translated to them."""

from __future__ import annotations

import orjson
import pytest

from proxy.errors import UpstreamReplyError
from proxy.surfaces.chat_reply import ReplyAccumulator
from proxy.surfaces.messages_reply import MessageAccumulator, message_of, store_usage
from proxy.surfaces.messages_request import parse_request
from proxy.surfaces.messages_translate import (
    ChunkTranslator,
    chat_request,
    message_from_completion,
    normalized_reply,
)
from proxy.testing.fake_messages import _MessageReply, thinking
from proxy.testing.fake_upstream import Reply, _Reply
from proxy.turn.history_sync import fingerprint
from proxy.upstreams.sse import parse_sse
from strategies import native

REQUEST = {"model": "claude-sonnet-4-5", "max_tokens": 100, "stream": True,
           "messages": [{"role": "user", "content": "list files"}]}


def streamed(reply: Reply) -> MessageAccumulator:
    accumulator = MessageAccumulator()
    for event in parse_sse(b"".join(_MessageReply(reply, REQUEST, 50).chunks(False))):
        accumulator.add_data(event.data)
    return accumulator


def test_a_streamed_reply_is_stored_as_the_client_will_resend_it():
    reply = thinking(Reply.tool_calls([{"id": "call_1", "name": "Bash",
                                        "arguments": {"command": "ls -la"}}],
                                      content="Let me look."), "I should run ls.")
    accumulator = streamed(reply)
    assert accumulator.complete and accumulator.stop_reason == "tool_use"
    message = accumulator.message()
    assert [b["type"] for b in message["content"]] == ["thinking", "text", "tool_use"]
    assert message["content"][2]["input"] == {"command": "ls -la"}
    record = accumulator.record()
    # the client's next request carries this message back: it must match the record
    resent = parse_request({**REQUEST, "messages": [
        {"role": "user", "content": "list files"},
        {"role": "assistant", "content": message["content"]},
        {"role": "user", "content": "thanks"},
    ]}).conversation[1]
    assert fingerprint(resent) == fingerprint(record)
    assert native.items(record["content"], "messages") == [message["content"][0]]


def test_the_signature_is_assembled_byte_exact():
    accumulator = streamed(thinking(Reply.text("hi"), "deep thought", signature="Eq+/=="))
    assert accumulator.message()["content"][0] == {
        "type": "thinking", "thinking": "deep thought", "signature": "Eq+/=="}


def test_usage_keeps_anthropics_fields_and_adds_the_totals():
    usage = store_usage({"input_tokens": 10, "cache_read_input_tokens": 900,
                         "cache_creation_input_tokens": 90, "output_tokens": 7})
    assert usage["prompt_tokens"] == 1000 and usage["completion_tokens"] == 7
    assert usage["cache_read_input_tokens"] == 900


def test_a_stream_of_junk_is_the_upstreams_failure():
    with pytest.raises(UpstreamReplyError):
        MessageAccumulator().add_data(b"not json")


def test_a_200_that_is_not_a_message_is_refused():
    with pytest.raises(UpstreamReplyError):
        message_of(b'{"choices": []}')
    assert message_of(_MessageReply(Reply.text("x"), REQUEST, 5).completion())["type"] == \
        "message"


def test_a_request_becomes_a_chat_completion_request():
    body = {**REQUEST, "stop_sequences": ["END"], "metadata": {"user_id": "u1"},
            "tools": [{"name": "Bash", "description": "run", "input_schema": {"type": "object"}},
                      {"type": "web_search_20250305", "name": "web_search"}],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
            "thinking": {"type": "enabled", "budget_tokens": 1000}}
    messages = [{"role": "system", "content": [{"type": "text", "text": "S",
                                                "cache_control": {"type": "ephemeral"}}]},
                {"role": "user", "content": "q"}]
    out = chat_request(body, messages)
    assert out["messages"][0]["content"] == [{"type": "text", "text": "S"}]
    assert out["tools"] == [{"type": "function", "function": {
        "name": "Bash", "parameters": {"type": "object"}, "description": "run"}}]
    assert out["tool_choice"] == "required" and out["parallel_tool_calls"] is False
    assert out["stop"] == ["END"] and out["user"] == "u1" and out["max_tokens"] == 100
    assert out["stream_options"] == {"include_usage": True}
    assert "thinking" not in out
    assert messages[0]["content"][0]["cache_control"]  # the caller's list is untouched


def test_a_completion_becomes_a_message():
    completion = orjson.loads(_Reply(Reply.tool_calls(
        [{"id": "call_9", "name": "Bash", "arguments": {"command": "ls"}}], content="Sure."),
        {"model": "gpt-4o"}, 40).completion())
    message = message_from_completion(completion, "claude-sonnet-4-5")
    assert message["stop_reason"] == "tool_use"
    assert message["content"] == [
        {"type": "text", "text": "Sure."},
        {"type": "tool_use", "id": "call_9", "name": "Bash", "input": {"command": "ls"}}]
    assert message["usage"]["input_tokens"] == 40


def test_chunks_become_anthropics_event_sequence():
    chunks = _Reply(Reply.tool_calls([{"id": "call_9", "name": "Bash",
                                       "arguments": {"command": "ls -la /tmp"}}],
                                     content="Running it."), {"model": "gpt-4o"}, 40
                    ).chunks(True)
    translator = ChunkTranslator("claude-sonnet-4-5")
    chat = ReplyAccumulator()
    out: list[bytes] = []
    for event in parse_sse(b"".join(chunks)):
        if event.done:
            break
        chunk = orjson.loads(event.data)
        chat.add_chunk(chunk)
        out += translator.feed(chunk)
    out += translator.finish()
    events = [orjson.loads(e.data) for e in parse_sse(b"".join(out))]
    kinds = [e["type"] for e in events]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    assert kinds.count("content_block_start") == 2 == kinds.count("content_block_stop")
    accumulator = MessageAccumulator()
    for event in events:
        accumulator.add_event(event)
    message = accumulator.message()
    assert message["content"][0] == {"type": "text", "text": "Running it."}
    assert message["content"][1]["input"] == {"command": "ls -la /tmp"}
    assert message["stop_reason"] == "tool_use"
    assert message["usage"]["input_tokens"] == 40
    # what is stored from the chat reply matches what the client will resend
    assert fingerprint(normalized_reply(chat.message())) == fingerprint(accumulator.record())
