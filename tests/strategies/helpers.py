"""Builders for hand-built histories, shared by the strategy tests.

``user``, ``assistant`` and ``tool`` return StoredMessages with ``seq`` assigned (ascending
across calls) and ``tokens`` set; ``history`` renumbers a list from 1. ``context`` builds a
WindowContext whose current turn starts at the latest user message, and ``render`` turns a
Window into the OpenAI messages list the checker reads.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from typing import Any

from strategies.base import Window, WindowContext, WindowItem
from strategies.config import MemoryConfig, SummarizingWindowConfig
from strategies.records import StoredMessage

_seqs = itertools.count(1)


def _tokens(text: str) -> int:
    return 4 + len(text) // 4


def call(call_id: str, name: str = "lookup", arguments: str = "{}") -> dict[str, Any]:
    """One OpenAI tool call."""
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def user(text: str = "hello", *, tokens: int | None = None) -> StoredMessage:
    return StoredMessage(
        role="user",
        content=text,
        tokens=_tokens(text) if tokens is None else tokens,
        seq=next(_seqs),
    )


def assistant(
    text: str | None = "ok",
    *,
    tool_calls: Iterable[str | dict[str, Any]] | None = None,
    tokens: int | None = None,
) -> StoredMessage:
    """An assistant reply; ``tool_calls`` takes call ids (or whole call dicts)."""
    calls = [call(c) if isinstance(c, str) else c for c in tool_calls or ()]
    return StoredMessage(
        role="assistant",
        content=text,
        tool_calls=calls or None,
        tokens=_tokens(text or "") + 10 * len(calls) if tokens is None else tokens,
        seq=next(_seqs),
    )


# a tool message's tokens besides its content: 3 per message and its role (one token); the
# size rules compare a result's own tokens (strategies.compression.result_tokens)
FRAMING = 4


def tool(call_id: str, text: str = "result", *, tokens: int | None = None) -> StoredMessage:
    return StoredMessage(
        role="tool",
        content=text,
        tool_call_id=call_id,
        tokens=_tokens(text) if tokens is None else tokens,
        seq=next(_seqs),
    )


def history(*messages: StoredMessage) -> list[StoredMessage]:
    """The messages as one log: seqs renumbered 1..n in the given order."""
    for seq, message in enumerate(messages, start=1):
        message.seq = seq
    return list(messages)


def turn_start(messages: Sequence[StoredMessage]) -> int:
    """Index of the latest user message (0 when there is none), as the proxy computes it."""
    return next((i for i in range(len(messages) - 1, -1, -1) if messages[i].role == "user"), 0)


def spec_config(**fields: Any) -> SummarizingWindowConfig:
    """summarizing_window under the spec's per-request policy (``stablePrefix`` off): the
    window refitted at every request, compression at every request under pressure."""
    return SummarizingWindowConfig(**{"stablePrefix": False, **fields})


def context(
    messages: list[StoredMessage],
    config: MemoryConfig | None = None,
    *,
    context_window: int = 128_000,
    system_tokens: int = 0,
    **fields: Any,
) -> WindowContext:
    """A WindowContext over ``messages`` with the current turn at the latest user message;
    summarizing_window under the spec's policy unless ``config`` says otherwise."""
    fields.setdefault("current_turn_start", turn_start(messages))
    return WindowContext(
        config=config or spec_config(),
        context_window=context_window,
        messages=messages,
        system_tokens=system_tokens,
        **fields,
    )


def render_item(item: WindowItem) -> dict[str, Any]:
    message = item.message
    rendered: dict[str, Any] = {
        "role": message.role,
        "content": item.text if item.text is not None else message.content,
    }
    if message.tool_calls:
        rendered["tool_calls"] = message.tool_calls
    if message.role == "tool":
        rendered["tool_call_id"] = message.tool_call_id
    return rendered


def render(window: Window, system: str | None = "You are helpful.") -> list[dict[str, Any]]:
    """A minimal stand-in for the mapper: the system prompt, then each item."""
    head = [{"role": "system", "content": system}] if system is not None else []
    return head + [render_item(item) for item in window.items]


def seqs(window: Window) -> list[int]:
    return [item.message.seq for item in window.items]
