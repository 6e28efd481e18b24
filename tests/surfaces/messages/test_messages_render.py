"""The window rendered for Anthropic's Messages API: valid for its rules, native blocks
byte-exact, the client's cache marks kept, the proxy's placed when it set none."""

from __future__ import annotations

import itertools
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.surfaces.messages_render import NO_RESULT, check_messages, render_window
from proxy.surfaces.messages_request import parse_request
from proxy.turn.history_sync import fingerprint
from strategies import native
from strategies.base import WindowContext
from strategies.config import parse_memory_config
from strategies.mapper import MappingContext, MessageToLlmMessageMapper
from strategies.records import StoredMessage
from strategies.registry import get_strategy

THINKING = {"type": "thinking", "thinking": "Let me check.", "signature": "EqQBCkgIsig=="}
SYSTEM = {"role": "system", "content": "You are helpful."}


def calls(*ids: str) -> dict[str, Any]:
    return {"role": "assistant", "content": [native.part("messages", THINKING)],
            "tool_calls": [{"id": i, "type": "function",
                            "function": {"name": "ls", "arguments": '{"path":"."}'}}
                           for i in ids]}


def result(call_id: str, text: str = "a.py") -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def render(messages, **options):
    options.setdefault("tools_declared", True)
    return render_window(messages, **options)


def test_tool_results_join_the_next_user_message_first():
    out = render([SYSTEM, {"role": "user", "content": "q"}, calls("a", "b"), result("b"),
                  result("a"), {"role": "user", "content": "next"}], breakpoints=False)
    assert out.system == [{"type": "text", "text": "You are helpful."}]
    assert [m["role"] for m in out.messages] == ["user", "assistant", "user"]
    assert [b["type"] for b in out.messages[2]["content"]] == ["tool_result", "tool_result",
                                                               "text"]
    assert check_messages(out.messages, tools_declared=True) == []


def test_the_thinking_block_goes_back_byte_exact_before_the_tool_use():
    out = render([{"role": "user", "content": "q"}, calls("a"), result("a")], breakpoints=False)
    assistant = out.messages[1]["content"]
    assert orjson.dumps(assistant[0]) == orjson.dumps(THINKING)
    assert assistant[1] == {"type": "tool_use", "id": "a", "name": "ls", "input": {"path": "."}}


def test_a_call_without_a_result_gets_one_saying_none_was_kept():
    out = render([{"role": "user", "content": "q"}, calls("a", "b"), result("a"),
                  {"role": "user", "content": "go on"}], breakpoints=False)
    results = [b for b in out.messages[2]["content"] if b["type"] == "tool_result"]
    assert [(b["tool_use_id"], b.get("is_error")) for b in results] == [("a", None),
                                                                         ("b", True)]
    assert results[1]["content"] == NO_RESULT
    assert check_messages(out.messages, tools_declared=True) == []


def test_an_orphan_result_is_sent_as_text():
    out = render([{"role": "user", "content": "q"}, result("zzz", "old output")],
                 breakpoints=False)
    assert out.messages == [{"role": "user", "content": [
        {"type": "text", "text": "q"},
        {"type": "text", "text": "[result of tool call zzz]\nold output"}]}]


def test_without_tools_declared_tool_traffic_is_text():
    out = render([{"role": "user", "content": "q"}, calls("a"), result("a")],
                 tools_declared=False, breakpoints=False)
    assert check_messages(out.messages, tools_declared=False) == []
    assert "[called tool ls" in out.messages[1]["content"][1]["text"]


def test_a_window_that_opens_with_the_assistant_gets_a_user_message_first():
    out = render([{"role": "assistant", "content": "earlier answer"},
                  {"role": "user", "content": "q"}], breakpoints=False)
    assert out.messages[0]["role"] == "user"
    assert check_messages(out.messages, tools_declared=True) == []


def test_the_proxy_places_its_breakpoints_when_the_client_set_none():
    out = render([SYSTEM, {"role": "user", "content": "q"}, calls("a"), result("a")])
    assert out.system[-1]["cache_control"] == {"type": "ephemeral"}
    assert "cache_control" in out.messages[-1]["content"][-1]
    assert "cache_control" not in out.messages[1]["content"][0]  # never on thinking


def test_the_clients_marks_go_back_where_their_blocks_are_and_the_proxy_adds_none():
    parsed = parse_request({"model": "claude-sonnet-4-5", "max_tokens": 10, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "first",
                                      "cache_control": {"type": "ephemeral"}}]},
        {"role": "assistant", "content": "answer"},
        {"role": "user", "content": "second"},
    ]})
    conversation = parsed.conversation
    out = render(conversation, fingerprints=[fingerprint(m) for m in conversation],
                 marks=parsed.marks, client_marks=parsed.client_marks)
    assert out.messages[0]["content"] == [{"type": "text", "text": "first",
                                           "cache_control": {"type": "ephemeral"}}]
    assert all("cache_control" not in b for m in out.messages[1:] for b in m["content"])


def test_media_parts_become_image_and_document_blocks():
    out = render([{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
        {"type": "file", "file": {"file_data": "data:application/pdf;base64,JVBERi0=",
                                  "filename": "a.pdf"}},
        {"type": "text", "text": "what is this?"},
    ]}], breakpoints=False)
    image, document, _text = out.messages[0]["content"]
    assert image == {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                 "data": "AAAA"}}
    assert document == {"type": "document", "title": "a.pdf", "source": {
        "type": "base64", "media_type": "application/pdf", "data": "JVBERi0="}}


# --- properties over random histories, for every strategy ---------------------------------

_sizes = st.integers(min_value=1, max_value=2500)


@st.composite
def histories(draw: st.DrawFn) -> list[StoredMessage]:
    """Sessions of tool-using turns whose assistant messages carry signed thinking; older
    turns may be broken (a result missing, an orphan result, a system note)."""
    ids = itertools.count(1)
    out: list[StoredMessage] = []

    def add(role: str, content: Any = None, **fields: Any) -> None:
        out.append(StoredMessage(role=role, content=content, tokens=draw(_sizes), **fields))

    turns = draw(st.integers(1, 6))
    for turn in range(turns):
        current = turn == turns - 1
        add("user", f"question {turn}")
        for _ in range(draw(st.integers(0, 3))):
            call_ids = [f"toolu_{next(ids)}" for _ in range(draw(st.integers(1, 3)))]
            thought = {"type": "thinking", "thinking": f"t{turn}", "signature": f"sig{turn}"}
            add("assistant", [native.part("messages", thought),
                              {"type": "text", "text": draw(st.sampled_from(["", "Looking."]))}],
                tool_calls=[{"id": c, "type": "function",
                             "function": {"name": "ls", "arguments": "{}"}} for c in call_ids])
            for call_id in call_ids:
                if current or draw(st.integers(0, 5)):
                    add("tool", f"result {call_id}", tool_call_id=call_id)
            if not current and not draw(st.integers(0, 8)):
                add("tool", "orphan", tool_call_id=f"toolu_gone_{next(ids)}")
            if not current and not draw(st.integers(0, 8)):
                add("system", "a note")
        if not current or draw(st.booleans()):
            if not current:
                add("assistant", "answer")
    for seq, message in enumerate(out, start=1):
        message.seq = seq
        message.fingerprint = f"fp{seq}"
    return out


KINDS = ("full", "windowed", "none", "summarizing_window", "auto_compact")


@pytest.mark.parametrize("kind", KINDS)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(messages=histories(), tools=st.booleans(), window=st.sampled_from([2000, 8000, 60000]))
def test_every_strategy_renders_a_window_the_messages_api_accepts(kind, messages, tools, window):
    start = max(i for i, m in enumerate(messages) if m.role == "user")
    config = parse_memory_config({"kind": kind, **({"windowSize": 7} if kind == "windowed"
                                                   else {})})
    chosen = get_strategy(kind).select(WindowContext(
        config=config, context_window=window, messages=messages, current_turn_start=start))
    mapped = MessageToLlmMessageMapper().map(
        chosen, [SYSTEM], MappingContext(api="messages", current_turn_seq=messages[start].seq))
    out = render_window(mapped, tools_declared=tools)
    assert check_messages(out.messages, tools_declared=tools) == []
    # the current turn's thinking blocks go unmodified, in order
    sent = [b for m in out.messages for b in m["content"] if b["type"] == "thinking"]
    current = [p["item"] for m in messages[start:] for p in native.natives(m.content)]
    assert sent[len(sent) - len(current):] == current


def test_a_clients_mark_goes_back_once_when_two_messages_are_the_same():
    parsed = parse_request({"model": "claude-sonnet-4-5", "max_tokens": 10, "messages": [
        {"role": "user", "content": "continue"},
        {"role": "assistant", "content": "one"},
        {"role": "user", "content": [{"type": "text", "text": "continue",
                                      "cache_control": {"type": "ephemeral"}}]},
    ]})
    conversation = parsed.conversation
    out = render(conversation, fingerprints=[fingerprint(m) for m in conversation],
                 marks=parsed.marks, client_marks=True)
    marked = [i for i, m in enumerate(out.messages) for b in m["content"] if "cache_control" in b]
    assert marked == [2]


# --- a request read into records and rendered back is the request ------------------------

_text = st.text(alphabet="abc xyz.\n", min_size=1, max_size=20).filter(str.strip)


@st.composite
def conversations(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Valid Messages conversations: thinking, text and tool use, results (text, blocks,
    errors) first in the next user message."""
    ids = itertools.count(1)
    out: list[dict[str, Any]] = [{"role": "user", "content": draw(_text)}]
    for _ in range(draw(st.integers(0, 4))):
        blocks: list[dict[str, Any]] = []
        calls: list[str] = []
        # thinking first when there is any, then text, tool uses and (interleaved
        # thinking) more thinking, in any order
        kinds = draw(st.lists(st.sampled_from(["thinking", "text", "tool_use"]),
                              min_size=1, max_size=4))
        for kind in sorted(kinds, key=lambda k: k != "thinking") if kinds[0] == "thinking" \
                else [k for k in kinds if k != "thinking"] or ["text"]:
            if kind == "thinking":
                blocks.append({"type": "thinking", "thinking": draw(_text),
                               "signature": draw(st.text(min_size=1, max_size=12))})
            elif kind == "text":
                blocks.append({"type": "text", "text": draw(_text)})
            else:
                calls.append(f"toolu_{next(ids)}")
                blocks.append({"type": "tool_use", "id": calls[-1], "name": "ls",
                               "input": {"path": draw(_text), "n": draw(st.integers(-5, 5))}})
        if draw(st.booleans()) and calls:
            # thinking between tool uses (interleaved thinking)
            blocks.insert(len(blocks) - 1, {"type": "thinking", "thinking": draw(_text),
                                            "signature": "s2"})
        out.append({"role": "assistant", "content": blocks})
        following: list[dict[str, Any]] = []
        for call in calls:
            result: dict[str, Any] = {"type": "tool_result", "tool_use_id": call,
                                      "content": draw(st.sampled_from(
                                          [draw(_text), [{"type": "text", "text": draw(_text)}]]))}
            if draw(st.booleans()):
                result["is_error"] = True
            following.append(result)
        if draw(st.booleans()) or not following:
            following.append({"type": "text", "text": draw(_text)})
        out.append({"role": "user", "content": following})
    return out


def _blocks(message: dict[str, Any]) -> list[dict[str, Any]]:
    content = message["content"]
    blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
    out = []
    for block in blocks:
        if block["type"] == "tool_result" and isinstance(block.get("content"), str):
            block = {**block, "content": [{"type": "text", "text": block["content"]}]}
        out.append(block)
    return out


@settings(max_examples=200, deadline=None)
@given(conversation=conversations())
def test_a_conversation_read_into_records_renders_back_as_it_was(conversation):
    parsed = parse_request({"model": "claude-sonnet-4-5", "max_tokens": 10, "tools": [{}],
                            "messages": conversation})
    out = render(parsed.conversation, breakpoints=False)
    assert [m["role"] for m in out.messages] == [m["role"] for m in conversation]
    assert [_blocks(m) for m in out.messages] == [_blocks(m) for m in conversation]
