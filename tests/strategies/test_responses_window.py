"""The window's validity rules in their Responses form, for every strategy that selects
from random histories: rendered for the Responses API (proxy/surfaces/responses_items.py),
every ``function_call`` is answered by its ``function_call_output`` before the next
message, no output answers a call not sent, and every reasoning item is sent directly
before the call or message it preceded."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from helpers import context
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_validity import KINDS, cases

from proxy.surfaces.responses_items import to_items
from strategies import native
from strategies.mapper import MappingContext, MessageToLlmMessageMapper
from strategies.records import StoredMessage


def with_reasoning(messages: list[StoredMessage], flags: list[bool]) -> list[StoredMessage]:
    """Each assistant message given a reasoning item before its text (by ``flags``)."""
    out = []
    for index, message in enumerate(messages):
        if message.role == "assistant" and flags[index % len(flags)]:
            item = {"type": "reasoning", "id": f"rs_{message.seq}", "summary": [],
                    "encrypted_content": f"opaque-{message.seq}"}
            text = [{"type": "text", "text": message.content}] if message.content else []
            message = replace(message, content=[native.part("responses", item), *text])
        out.append(message)
    return out


def responses_problems(items: list[dict[str, Any]]) -> list[str]:
    problems = []
    open_calls: set[str] = set()
    for index, item in enumerate(items):
        kind = item.get("type")
        if kind == "function_call":
            open_calls.add(item["call_id"])
        elif kind == "function_call_output":
            if item["call_id"] not in open_calls:
                problems.append(f"{index}: output for a call not sent or answered")
            open_calls.discard(item["call_id"])
        elif kind == "message" and open_calls:
            problems.append(f"{index}: a message before the calls {sorted(open_calls)} end")
        if kind == "reasoning":
            following = items[index + 1] if index + 1 < len(items) else {}
            if following.get("type") not in ("function_call", "message") or (
                following.get("type") == "message" and following.get("role") != "assistant"
            ):
                problems.append(f"{index}: reasoning not followed by its call or message")
    if open_calls:
        problems.append(f"unanswered calls {sorted(open_calls)}")
    return problems


_settings = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("kind", KINDS)
@_settings
@given(data=st.data(), flags=st.lists(st.booleans(), min_size=1, max_size=5))
def test_windows_render_valid_responses_input(kind, data, flags):
    strategy, config, _messages, loaded = data.draw(cases(kind))
    loaded = with_reasoning(loaded, flags)
    window = strategy.select(context(loaded, config, system_tokens=10))
    rendered = MessageToLlmMessageMapper().map(
        window, [{"role": "system", "content": "Be terse."}], MappingContext(api="responses"))
    items = to_items(rendered)
    assert responses_problems(items) == []
    # reasoning is sent with its reply only, and always with a reply that has text
    sent = {i["encrypted_content"] for i in items if i.get("type") == "reasoning"}
    kept = [i.message for i in window.items if native.has_native(i.message.content)]
    assert sent <= {f"opaque-{m.seq}" for m in kept}
    assert {f"opaque-{m.seq}" for m in kept if native.without(m.content)} <= sent
