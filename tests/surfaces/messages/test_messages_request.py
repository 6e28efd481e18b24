"""Reading a Messages API request into the records' chat form."""

from __future__ import annotations

import base64

import pytest

from proxy.errors import BadRequest
from proxy.surfaces.messages_request import parse_request
from proxy.turn.history_sync import fingerprint
from strategies import native

THINKING = {"type": "thinking", "thinking": "I should list the files.", "signature": "EqQBsig=="}
PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\x00" * 32).decode()


def body(messages, **fields):
    return {"model": "claude-sonnet-4-5", "max_tokens": 1024, "messages": messages, **fields}


def test_system_as_a_string_or_text_blocks_is_one_leading_system_message():
    assert parse_request(body([{"role": "user", "content": "hi"}], system="Be brief.")).system \
        == [{"role": "system", "content": "Be brief."}]
    blocks = [{"type": "text", "text": "A"}, {"type": "text", "text": "B",
                                              "cache_control": {"type": "ephemeral"}}]
    parsed = parse_request(body([{"role": "user", "content": "hi"}], system=blocks))
    assert parsed.system == [{"role": "system", "content": blocks}]
    assert parsed.client_marks


def test_tool_use_and_tool_result_become_tool_calls_and_tool_messages():
    parsed = parse_request(body([
        {"role": "user", "content": "list files"},
        {"role": "assistant", "content": [
            THINKING,
            {"type": "text", "text": "Let me look."},
            {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "ls"}},
        ]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "a.py"},
            {"type": "text", "text": "and then?"},
        ]},
    ]))
    assert parsed.conversation == [
        {"role": "user", "content": "list files"},
        {"role": "assistant",
         "content": [native.part("messages", THINKING), {"type": "text", "text": "Let me look."}],
         "tool_calls": [{"id": "toolu_1", "type": "function",
                         "function": {"name": "Bash", "arguments": '{"command":"ls"}'}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "a.py"},
        {"role": "user", "content": "and then?"},
    ]


def test_the_thinking_block_is_kept_as_the_same_object_byte_for_byte():
    parsed = parse_request(body([
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": [THINKING, {"type": "redacted_thinking", "data": "xyz"}]},
        {"role": "user", "content": "next"},
    ]))
    content = parsed.conversation[1]["content"]
    assert content[0]["item"] is THINKING
    assert content[1]["item"] == {"type": "redacted_thinking", "data": "xyz"}


def test_an_error_result_with_blocks_and_an_image_keeps_all_of_it():
    parsed = parse_request(body([
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "t1", "name": "shot", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "is_error": True,
                                      "content": [
            {"type": "text", "text": "failed"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": PNG}},
        ]}]},
    ]))
    result = parsed.conversation[2]
    assert result["role"] == "tool"
    assert result["content"][0] == native.part("messages", {"type": "tool_result",
                                                            "is_error": True})
    assert result["content"][1] == {"type": "text", "text": "failed"}
    assert result["content"][2] == {"type": "image_url",
                                    "image_url": {"url": f"data:image/png;base64,{PNG}"}}


def test_documents_become_file_parts_or_native_blocks():
    parsed = parse_request(body([{"role": "user", "content": [
        {"type": "document", "title": "notes.txt",
         "source": {"type": "text", "media_type": "text/plain", "data": "hello"}},
        {"type": "document", "source": {"type": "url", "url": "https://example.com/a.pdf"}},
        {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.png"}},
        {"type": "text", "text": "read these"},
    ]}]))
    parts = parsed.conversation[0]["content"]
    assert parts[0]["type"] == "file"
    assert parts[0]["file"]["filename"] == "notes.txt"
    assert parts[0]["anthropic"] == {"title": "notes.txt"}
    assert native.is_native(parts[1])
    assert parts[2] == {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}


def test_cache_marks_are_kept_aside_by_the_message_they_were_on():
    parsed = parse_request(body([
        {"role": "user", "content": [{"type": "text", "text": "hello",
                                      "cache_control": {"type": "ephemeral"}}]},
    ]))
    assert parsed.conversation == [{"role": "user", "content": "hello"}]
    (mark,) = parsed.marks
    assert mark.fingerprint == fingerprint(parsed.conversation[0])
    assert mark.from_end == -1 and mark.value == {"type": "ephemeral"}


def test_a_moved_cache_mark_leaves_the_message_the_same():
    marked = parse_request(body([{"role": "user", "content": [
        {"type": "text", "text": "hello", "cache_control": {"type": "ephemeral"}}]}]))
    plain = parse_request(body([{"role": "user", "content": [{"type": "text", "text": "hello"}]}]))
    assert fingerprint(marked.conversation[0]) == fingerprint(plain.conversation[0])


def test_a_system_role_message_inside_messages_is_accepted_as_a_system_record():
    parsed = parse_request(body([
        {"role": "user", "content": "hi"},
        {"role": "system", "content": [{"type": "text", "text": "# Environment"}]},
    ]))
    assert parsed.conversation[1] == {"role": "system", "content": "# Environment"}


def test_server_tool_blocks_pass_through_as_native_parts():
    search = {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search",
              "input": {"query": "weather"}}
    found = {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": []}
    parsed = parse_request(body([
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": [search, found, {"type": "text", "text": "Sunny."}]},
        {"role": "user", "content": "thanks"},
    ]))
    assert native.items(parsed.conversation[1]["content"], "messages") == [search, found]


@pytest.mark.parametrize(
    ("request_body", "param"),
    [
        pytest.param({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}, "model",
                     id="no-model"),
        pytest.param({"model": "m", "messages": [{"role": "user", "content": "x"}]},
                     "max_tokens", id="no-max-tokens"),
        pytest.param(body([]), "messages", id="no-messages"),
        pytest.param(body([{"role": "robot", "content": "x"}]), "messages.0.role", id="role"),
        pytest.param(body([{"role": "user", "content": 5}]), "messages.0.content",
                     id="content-type"),
        pytest.param(body([{"role": "user", "content": [{"text": "x"}]}]), "messages.0.content.0",
                     id="block-without-type"),
        pytest.param(body([{"role": "user", "content": [
            {"type": "tool_result", "content": "x"}]}]), "messages.0.content.0.tool_use_id",
            id="result-without-id"),
        pytest.param(body([{"role": "assistant", "content": [
            {"type": "tool_use", "name": "x", "input": {}}]}]), "messages.0.content.0",
            id="tool-use-without-id"),
        pytest.param(body([{"role": "user", "content": "x"}], stream="yes"), "stream",
                     id="stream-not-bool"),
        pytest.param(body([{"role": "user", "content": "x"}], system=5), "system", id="system"),
    ],
)
def test_bad_requests_name_the_field(request_body, param):
    with pytest.raises(BadRequest) as caught:
        parse_request(request_body)
    assert caught.value.param == param


def test_count_tokens_needs_no_max_tokens():
    parsed = parse_request({"model": "m", "messages": [{"role": "user", "content": "x"}]},
                           count_only=True)
    assert parsed.conversation == [{"role": "user", "content": "x"}]
