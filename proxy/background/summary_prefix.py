"""The summarizer call on the session's cached prefix.

When the range to summarize is exactly what the turn's request opened with (after its
system prompt and summary), the summarizer is sent that request again: the same tools,
system prompt and messages, byte for byte, the turn's reply, and the summary instruction
appended last (``tool_choice: none``). The provider serves the whole prefix from its
prompt cache; the classic call (a transcript in one user message, proxy/background/summarizer.py)
would pay for all of it again. auto_compact's compaction always lines up (its window is
everything since the last compaction); a summary of an older range that the window had
already trimmed does not, and takes the classic call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from strategies.base import Placement, SummarizePlan
from strategies.summary_prompt import summary_instruction

# room for the instruction (its tokens, about 400) and the chat format's overhead
INSTRUCTION_TOKENS = 600


@dataclass(slots=True)
class CachedPrefix:
    """A turn's request as sent and its reply: ``messages`` are the rendered system block,
    summary and items, then the reply; ``seqs`` the stored seq of each message after the
    first ``head`` (the items, then the reply); ``tokens`` their calibrated size."""

    model: str
    messages: list[dict[str, Any]]
    seqs: list[int]
    head: int
    tools: Any
    tokens: int


def prefix_body(
    prefix: CachedPrefix,
    plan: SummarizePlan,
    *,
    model: str,
    placement_hint: Placement | None,
    max_tokens: int,
    context_window: int,
) -> dict[str, Any] | None:
    """The summarizer request over ``prefix``, or None when it does not apply: another
    model summarizes, the plan's messages are not the prefix's first items, the cut would
    split a tool call from its results, or the call would not fit the context window."""
    seqs = [m.seq for m in plan.messages]
    count = len(seqs)
    if (
        model != prefix.model
        or not count
        or prefix.seqs[:count] != seqs
        or prefix.tokens + INSTRUCTION_TOKENS + max_tokens > context_window
    ):
        return None
    end = prefix.head + count
    messages = prefix.messages[:end]
    last = messages[-1]
    if (last.get("role") == "assistant" and last.get("tool_calls")) or (
        end < len(prefix.messages) and prefix.messages[end].get("role") == "tool"
    ):
        return None
    body: dict[str, Any] = {
        "model": model,
        "messages": [
            *messages,
            {"role": "user", "content": summary_instruction(plan, placement_hint)},
        ],
        "temperature": 0,
        "max_tokens": max_tokens,
    }
    if prefix.tools:
        body["tools"] = prefix.tools
        body["tool_choice"] = "none"
    return body


def from_turn(turn: Any, calibration: float) -> CachedPrefix | None:
    """The prefix of ``turn`` (a ``proxy.turn.state.Turn`` after its append): None when its
    reply was not stored."""
    reply = next((r for r in reversed(turn.appended) if r.role == "assistant"), None)
    if reply is None:
        return None
    rendered: dict[str, Any] = {"role": "assistant", "content": reply.content}
    if reply.tool_calls:
        rendered["tool_calls"] = reply.tool_calls
    items = turn.window.items
    return CachedPrefix(
        model=turn.model,
        messages=[*turn.messages, rendered],
        seqs=[*[i.message.seq for i in items], reply.seq],
        head=len(turn.messages) - len(items),
        tools=turn.tools,
        tokens=round((turn.window.tokens + reply.tokens) * calibration),
    )
