"""Native parts (strategies/native.py): kept byte-exact with their message, out of
fingerprints, counted, and sent only to their own API."""

from __future__ import annotations

import copy

import orjson
import pytest
from helpers import context

from proxy.turn.history_sync import fingerprint
from strategies import native
from strategies.base import Window, WindowItem
from strategies.compression import compression_stub, content_text
from strategies.config import parse_memory_config
from strategies.mapper import MappingContext, MessageToLlmMessageMapper
from strategies.records import StoredMessage
from strategies.registry import get_strategy
from strategies.summary_prompt import render_transcript_item
from strategies.tokens import cached_counter, count_message, count_text
from strategies.truncation import truncate_item

THINKING = {
    "type": "thinking",
    "thinking": "The user wants the weather; I should call the tool.",
    "signature": "EqQBCkgIARABGAIiQL+/ûnicode\u00e9/sig==",
}
REDACTED = {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5L8rLVyIw"}
REASONING = {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAAAB"}
CALL = {"id": "toolu_1", "type": "function",
        "function": {"name": "weather", "arguments": '{"city": "Paris"}'}}


def thinking_reply(text: str = "Let me check.") -> StoredMessage:
    return StoredMessage(
        role="assistant",
        content=[
            native.part("messages", THINKING),
            native.part("messages", REDACTED),
            {"type": "text", "text": text},
        ],
        tool_calls=[CALL],
        seq=2,
    )


def render(items: list[WindowItem], api: str) -> list[dict]:
    return MessageToLlmMessageMapper().map(Window(items=items), None, MappingContext(api=api))


def test_a_native_part_holds_the_item_itself():
    part = native.part("messages", THINKING)
    assert part == {"type": "native", "api": "messages", "item": THINKING}
    assert part["item"] is THINKING
    assert native.is_native(part) and not native.is_native({"type": "text", "text": "x"})


@pytest.mark.parametrize(
    ("api", "kept"),
    [
        pytest.param("messages", [THINKING, REDACTED], id="messages-keeps-its-own"),
        pytest.param("responses", [REASONING], id="responses-keeps-its-own"),
        pytest.param("chat", [], id="chat-keeps-none"),
        pytest.param(None, [], id="no-api-keeps-none"),
    ],
)
def test_for_api_keeps_only_that_apis_native_parts(api, kept):
    content = [
        native.part("messages", THINKING),
        native.part("responses", REASONING),
        native.part("messages", REDACTED),
        {"type": "text", "text": "answer"},
    ]
    sent = native.for_api(content, api)
    items = [p["item"] for p in sent if native.is_native(p)] if isinstance(sent, list) else []
    assert items == kept
    if not kept:
        assert sent == "answer"  # only plain text left: one string, as chat expects


def test_for_api_returns_content_without_natives_unchanged():
    content = [{"type": "text", "text": "a", "cache_control": {"type": "ephemeral"}}]
    assert native.for_api(content, "chat") is content
    assert native.for_api("plain", "messages") == "plain"


def test_content_of_native_parts_only_becomes_empty_for_other_apis():
    content = [native.part("messages", THINKING)]
    assert native.for_api(content, "chat") == ""
    assert native.for_api(content, "messages") is content


def test_the_fingerprint_ignores_native_parts():
    with_natives = {
        "role": "assistant",
        "content": [native.part("messages", THINKING), {"type": "text", "text": "Let me check."}],
        "tool_calls": [CALL],
    }
    plain = {"role": "assistant", "content": "Let me check.", "tool_calls": [CALL]}
    assert fingerprint(with_natives) == fingerprint(plain)
    other_signature = copy.deepcopy(with_natives)
    other_signature["content"][0]["item"]["signature"] = "different"
    assert fingerprint(other_signature) == fingerprint(plain)
    assert fingerprint({**plain, "content": "Something else."}) != fingerprint(plain)


def test_a_message_of_only_native_parts_matches_an_empty_one():
    only = {"role": "assistant", "content": [native.part("messages", REDACTED)],
            "tool_calls": [CALL]}
    assert fingerprint(only) == fingerprint({"role": "assistant", "content": None,
                                             "tool_calls": [CALL]})


def test_native_parts_are_counted_in_tokens():
    message = thinking_reply()
    bare = StoredMessage(role="assistant", content="Let me check.", tool_calls=[CALL])
    extra = count_message(message, "claude-sonnet-4") - count_message(bare, "claude-sonnet-4")
    thinking_tokens = count_text(THINKING["thinking"], "claude-sonnet-4")
    # the thinking text as text, signatures and redacted data by their size
    assert extra >= thinking_tokens + len(REDACTED["data"]) // 4
    assert extra <= thinking_tokens + len(THINKING["signature"]) + len(REDACTED["data"])


def test_server_tool_blocks_are_counted_by_their_json():
    block = {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1",
             "content": [{"type": "web_search_result", "title": "Paris weather " * 20}]}
    tokens = native.count(native.part("messages", block), lambda text: len(text) // 4)
    assert tokens >= len("Paris weather " * 20) // 4


def test_stubs_and_summaries_are_made_of_text_never_of_native_parts():
    message = thinking_reply("The weather tool says sunny.")
    assert content_text(message.content) == "The weather tool says sunny."
    stub = compression_stub(content_text(message.content), 100)
    assert THINKING["thinking"] not in stub and THINKING["signature"] not in stub
    line = render_transcript_item(message, 1000, lambda text: len(text) // 4)
    assert THINKING["thinking"] not in line and REDACTED["data"] not in line


def test_the_messages_api_receives_the_item_byte_exact():
    message = thinking_reply()
    sent = render([WindowItem(message=message, tokens=50)], "messages")
    assert orjson.dumps(sent[0]["content"][0]["item"]) == orjson.dumps(THINKING)
    assert sent[0]["content"][:2] == message.content[:2]
    assert sent[0]["tool_calls"] == [CALL]


def test_the_chat_api_receives_no_native_parts():
    sent = render([WindowItem(message=thinking_reply(), tokens=50)], "chat")
    assert sent == [{"role": "assistant", "content": "Let me check.", "tool_calls": [CALL]}]


def test_a_reply_of_only_thinking_and_tool_calls_has_no_content_in_chat():
    message = StoredMessage(role="assistant", content=[native.part("messages", THINKING)],
                            tool_calls=[CALL], seq=2)
    sent = render([WindowItem(message=message, tokens=50)], "chat")
    assert sent == [{"role": "assistant", "content": None, "tool_calls": [CALL]}]


@pytest.mark.parametrize("marker", ["truncated", "compressed", "evicted"])
def test_a_shrunk_message_keeps_its_native_parts_first(marker):
    message = thinking_reply("x" * 400)
    item = WindowItem(message=message, tokens=20, text="x" * 40 + "\n[… cut]", marker=marker)
    sent = render([item], "messages")[0]["content"]
    assert [p["item"] for p in sent[:2]] == [THINKING, REDACTED]
    assert sent[2:] == [{"type": "text", "text": "x" * 40 + "\n[… cut]"}]
    assert message.content[2]["text"] == "x" * 400  # the record is unchanged
    assert render([item], "chat")[0]["content"] == "x" * 40 + "\n[… cut]"


def test_the_message_cap_cuts_the_text_and_counts_the_native_parts_it_cannot_cut():
    message = thinking_reply("word " * 2000)
    message.tokens = count_message(message, "gpt-4o")
    count = cached_counter("gpt-4o")
    natives_cost = message.tokens - count_message(
        StoredMessage(role="assistant", content="word " * 2000, tool_calls=[CALL]), "gpt-4o"
    )
    cut = truncate_item(WindowItem(message=message, tokens=message.tokens),
                        natives_cost + 300, count)
    assert cut.marker == "truncated"
    assert cut.tokens <= natives_cost + 300
    assert cut.tokens > natives_cost  # the thinking stays in the size of what is sent
    sent = render([cut], "messages")[0]["content"]
    assert sent[0]["item"] is THINKING


@pytest.mark.parametrize("kind", ["summarizing_window", "auto_compact", "windowed", "full"])
def test_every_strategy_sends_a_thinking_turn_with_its_native_parts(kind):
    question = StoredMessage(role="user", content="Weather in Paris?", seq=1, tokens=10)
    reply = thinking_reply()
    reply.tokens = count_message(reply, "gpt-4o")
    result = StoredMessage(role="tool", content="sunny", tool_call_id="toolu_1", seq=3, tokens=6)
    config = parse_memory_config({"kind": kind})
    window = get_strategy(kind).select(
        context([question, reply, result], config, context_window=8000)
    )
    sent = render(window.items, "messages")
    assert sent[1]["content"][:2] == reply.content[:2]


def test_a_native_part_is_named_in_views():
    assert native.describe(native.part("messages", THINKING)) == (
        f"[messages thinking: {len(THINKING['thinking'])} chars, signed]"
    )
    assert native.describe(native.part("messages", REDACTED)) == (
        "[messages redacted_thinking: opaque]"
    )
