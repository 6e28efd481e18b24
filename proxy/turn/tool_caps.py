"""Tool result caps, applied at persist time before a result reaches the store.

A tool reference in the agent definition may set ``maxResultChars``; every tool result is
also held to ``TOOL_RESULT_CAP`` characters. A result over its limit is cut with a visible
note (real loss, by design: the cut part is never stored). The tool is named by the
assistant call the result answers (``tool_call_id``), found in the loaded conversation or
in the request. The message's fingerprint is taken from the result as the client sent it,
so a full-history client that resends the uncut result still matches the stored message.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from proxy.agents import ResolvedAgent
from strategies.records import StoredMessage

TOOL_RESULT_CAP = 100_000


def tool_call_names(
    stored: Sequence[StoredMessage], conversation: Sequence[Mapping[str, Any]]
) -> dict[str, str]:
    """tool_call_id -> tool name, from the assistant calls loaded and in the request."""
    names: dict[str, str] = {}
    calls = [c for m in stored for c in (m.tool_calls or ())]
    calls += [c for m in conversation for c in (m.get("tool_calls") or ())]
    for call in calls:
        function = call.get("function") if isinstance(call, Mapping) else None
        if isinstance(function, Mapping) and isinstance(call.get("id"), str):
            names[call["id"]] = str(function.get("name") or "")
    return names


def result_limit(agent: ResolvedAgent, tool: str | None) -> int:
    """The characters a tool's result keeps: its ``maxResultChars``, never above the cap."""
    ref = agent.tool(tool) if tool else None
    if ref is not None and ref.maxResultChars:
        return min(ref.maxResultChars, TOOL_RESULT_CAP)
    return TOOL_RESULT_CAP


def truncation_note(tool: str | None, limit: int, total: int) -> str:
    return (f"[truncated: the {tool or 'tool'} result was cut to {limit:,} of {total:,} "
            f"characters; the rest was not kept]")


def cap_tool_result(
    message: Mapping[str, Any], limit: int, tool: str | None
) -> Mapping[str, Any]:
    """The tool message with its text cut to ``limit`` characters (a copy), or itself."""
    content = message.get("content")
    if isinstance(content, str):
        if len(content) <= limit:
            return message
        note = truncation_note(tool, limit, len(content))
        return {**message, "content": content[:limit] + "\n" + note}
    if not isinstance(content, list):
        return message
    texts = [p for p in content if isinstance(p, Mapping) and p.get("type") == "text"]
    total = sum(len(str(p.get("text") or "")) for p in texts)
    if total <= limit:
        return message
    left = limit
    cut: list[Any] = []
    for part in content:
        if isinstance(part, Mapping) and part.get("type") == "text":
            if left <= 0:
                continue
            text = str(part.get("text") or "")[:left]
            left -= len(text)
            part = {**part, "text": text}
        cut.append(part)
    cut.append({"type": "text", "text": truncation_note(tool, limit, total)})
    return {**message, "content": cut}


def capped_messages(
    conversation: Sequence[Mapping[str, Any]],
    indexes: Sequence[int],
    agent: ResolvedAgent,
    stored: Sequence[StoredMessage],
) -> list[Mapping[str, Any]]:
    """The request's new messages (``indexes``) with tool results capped."""
    names: dict[str, str] | None = None
    out: list[Mapping[str, Any]] = []
    for index in indexes:
        message = conversation[index]
        if message.get("role") == "tool":
            if names is None:
                names = tool_call_names(stored, conversation)
            tool = names.get(str(message.get("tool_call_id")))
            message = cap_tool_result(message, result_limit(agent, tool), tool)
        out.append(message)
    return out
