"""The summarizer call and how a summary is placed back into a window.

Summaries are model output that gets re-injected into later requests, so their text is
sanitized (``sanitize_summary``) and always labelled as derived when rendered.
"""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Sequence
from typing import Any

from strategies.base import CountTokens, Placement, SummarizePlan
from strategies.compression import content_text, head_within
from strategies.records import StoredMessage, SummaryRecord

# the largest share of the summarizer's input one transcript item may take
ITEM_TOKEN_CAP = 2000
# per-item caps tried, in order, when the transcript must fit max_input_tokens
_ITEM_CAP_STEPS = (2000, 1000, 500, 250, 120)

SUMMARY_SYSTEM_PROMPT = """\
You write the working memory of an AI agent whose conversation no longer fits its context \
window. Your summary replaces the transcript below: the agent will continue the work from \
your summary alone, so anything you leave out is lost to it.

Write a self-contained summary in plain prose and short lists. Preserve, in this order of \
priority:
1. The user's instructions and goals — quote them verbatim where they are short, including \
constraints, preferences and corrections the user gave.
2. Decisions made and why they were made (and alternatives that were rejected).
3. Facts and identifiers exactly as written: file paths, URLs, IDs, names, numbers, \
versions, commands, code symbols.
4. Errors encountered and how they were fixed (or that they are still open).
5. Pending tasks and next steps, including anything promised to the user.
6. The current state: what was being worked on at the end of the transcript.

If a previous summary is given, build on it: your summary must include all of its \
still-relevant content, updated by the new transcript, as one coherent summary. Do not \
invent anything. Do not address the user and do not continue the conversation: output \
the summary only."""

_PLACEMENT_HINTS = {
    "SYSTEM_PROMPT": "It will be appended to the agent's system prompt under "
    '"Earlier conversation".',
    "USER_MESSAGE": "It will be given to the agent as the opening message of a continued session.",
}

_USER_MESSAGE_LEAD = (
    "This session is being continued from a previous conversation that ran out of context. "
    "The conversation is summarized below:"
)

_KEPT_CONTROLS = frozenset("\n\t")


def sanitize_summary(text: str) -> str:
    """Strip invisible and control characters from model-written summary text.

    Removes Unicode category Cc except newline and tab, and Cf (zero-width characters,
    bidi overrides, tag characters); line and paragraph separators become newlines.
    """
    # summaries are rendered into every request: when nothing but newlines and tabs is
    # unprintable (no Cc, Cf, Zl or Zp anywhere), only the strip applies
    if text.replace("\n", "").replace("\t", "").isprintable():
        return text.strip()
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = text.replace("\u2028", "\n").replace("\u2029", "\n")
    return "".join(
        ch for ch in text if ch in _KEPT_CONTROLS or unicodedata.category(ch) not in ("Cc", "Cf")
    ).strip()


def _label(summary: SummaryRecord) -> str:
    return (
        f"(derived summary of messages {summary.from_seq}-{summary.to_seq}, "
        "written by memory-proxy)"
    )


def render_summary(summary: SummaryRecord, placement: Placement) -> dict[str, Any] | str:
    """A summary as it joins the request: SYSTEM_PROMPT -> text to append to the system
    prompt under "Earlier conversation"; USER_MESSAGE -> a synthetic user message."""
    text = sanitize_summary(summary.text)
    if placement == "USER_MESSAGE":
        return {"role": "user", "content": f"{_USER_MESSAGE_LEAD}\n{_label(summary)}\n{text}"}
    return f"\n\n## Earlier conversation\n{_label(summary)}\n{text}"


def is_summary_message(message: Any) -> bool:
    """Whether a rendered message is a summary placed as USER_MESSAGE (``render_summary``)."""
    if not isinstance(message, dict) or message.get("role") != "user":
        return False
    content = message.get("content")
    return isinstance(content, str) and content.startswith(_USER_MESSAGE_LEAD)


def _call_text(call: Any) -> str:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict):
        return "(malformed tool call)"
    arguments = function.get("arguments")
    if arguments is not None and not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    return f"{function.get('name') or '?'}({arguments or ''})"


def _cap(text: str, cap: int, count: CountTokens) -> str:
    tokens = count(text)
    if tokens <= cap:
        return text
    kept = head_within(text, cap, count)
    return f"{kept}\n[… {tokens - count(kept)} more tokens of this message omitted]"


def render_transcript_item(message: StoredMessage, cap: int, count: CountTokens) -> str:
    """One message of the transcript: a role label, its text (capped at ``cap`` tokens),
    tool calls as ``name(args)``. Tool results use the original content, not a stub."""
    text = _cap(content_text(message.content), cap, count)
    if message.role == "tool":
        label = f"TOOL RESULT ({message.name or 'tool'}, {message.tool_call_id or '?'})"
    elif message.role == "assistant":
        label = "ASSISTANT"
    elif message.role == "user":
        label = "USER"
    else:
        label = str(message.role).upper()
    lines = [f"[{message.seq}] {label}: {text}".rstrip()]
    for call in message.tool_calls or ():
        call_id = call.get("id", "?") if isinstance(call, dict) else "?"
        lines.append(f"  -> tool call {_cap(_call_text(call), cap, count)} [id {call_id}]")
    return "\n".join(lines)


def build_transcript(
    messages: Sequence[StoredMessage],
    count: CountTokens,
    *,
    budget: int | None = None,
) -> str:
    """The compact transcript of ``messages``; with ``budget``, the items are capped
    lower (down to 120 tokens each) until it fits, if it can. Nothing is left out: a
    transcript that cannot fit one call is split by ``chunk_end`` first."""
    caps = _ITEM_CAP_STEPS if budget is not None else (ITEM_TOKEN_CAP,)
    parts: list[str] = []
    for cap in caps:
        parts = [render_transcript_item(m, cap, count) for m in messages]
        if budget is None or sum(count(p) for p in parts) <= budget:
            break
    return "\n\n".join(parts)


def chunk_end(
    messages: Sequence[StoredMessage], start: int, budget: int, count: CountTokens
) -> int:
    """Where the next summarizer call's share of ``messages`` from ``start`` ends: as many
    messages as fit ``budget`` (transcript tokens) at the full item cap, at least one."""
    total = 0
    end = start
    while end < len(messages):
        total += count(render_transcript_item(messages[end], ITEM_TOKEN_CAP, count))
        if total > budget and end > start:
            break
        end += 1
    return end


def _default_count(text: str) -> int:
    return max(1, len(text) // 4) if text else 0


SUMMARY_INSTRUCTION_LEAD = "[memory-proxy] Pause the task."


def is_summarizer_request(body: Any) -> bool:
    """Whether a chat request body is a summarizer call: the classic one (its own system
    prompt) or one on the session's cached prefix (the summary instruction last)."""
    messages = body.get("messages") if isinstance(body, dict) else None
    if not isinstance(messages, list) or not messages:
        return False
    first, last = messages[0], messages[-1]
    return (isinstance(first, dict) and str(first.get("content", "")).startswith(
        SUMMARY_SYSTEM_PROMPT[:80]
    )) or (isinstance(last, dict) and str(last.get("content", "")).startswith(
        SUMMARY_INSTRUCTION_LEAD
    ))


def summary_instruction(plan: SummarizePlan, placement_hint: Placement | None = None) -> str:
    """The summarizer's instruction as the last message of the conversation itself (the
    session's own request, whose prefix the provider has cached): the same rules as
    ``SUMMARY_SYSTEM_PROMPT``, about the conversation above instead of a transcript."""
    rules = SUMMARY_SYSTEM_PROMPT[SUMMARY_SYSTEM_PROMPT.index("Write a self-contained") :]
    text = (
        f"{SUMMARY_INSTRUCTION_LEAD} This conversation no longer fits the context "
        f"window: write the working memory of the conversation above (messages "
        f"{plan.from_seq}-{plan.to_seq}). Your summary replaces it: the agent will continue "
        "the work from your summary alone, so anything you leave out is lost to it. Do not "
        "call any tool.\n\n" + rules
    )
    if placement_hint in _PLACEMENT_HINTS:
        text += "\n\n" + _PLACEMENT_HINTS[placement_hint]
    return text


def _prompt_parts(
    plan: SummarizePlan, placement_hint: Placement | None
) -> tuple[str, list[str], str]:
    """The system prompt, the sections before the transcript and the closing line."""
    system = SUMMARY_SYSTEM_PROMPT
    if placement_hint in _PLACEMENT_HINTS:
        system += "\n\n" + _PLACEMENT_HINTS[placement_hint]
    sections: list[str] = []
    if plan.previous is not None:
        previous = sanitize_summary(plan.previous.text)
        sections.append(
            f"## Previous summary (messages {plan.previous.from_seq}-{plan.previous.to_seq})\n"
            f"{previous}"
        )
    closing = (
        "Write the updated summary now, covering the previous summary and the new transcript."
        if plan.previous is not None
        else "Write the summary now."
    )
    return system, sections, closing


def _heading(plan: SummarizePlan) -> str:
    messages = plan.messages
    low, high = (messages[0].seq, messages[-1].seq) if messages else (plan.from_seq, plan.to_seq)
    return f"## Transcript (messages {low}-{high})"


def transcript_budget(
    plan: SummarizePlan,
    *,
    placement_hint: Placement | None = None,
    count_tokens: CountTokens | None = None,
    max_input_tokens: int,
) -> int:
    """The tokens the transcript may take in ``plan``'s call within ``max_input_tokens``:
    what the prompt, the previous summary, the headings and the chat format leave."""
    count = count_tokens or _default_count
    system, sections, closing = _prompt_parts(plan, placement_hint)
    fixed = count(system) + sum(count(s) for s in sections) + count(_heading(plan) + closing)
    # a margin for the chat format's per-message overhead (and the heading's seq digits)
    return max_input_tokens - fixed - 16


def build_summary_messages(
    plan: SummarizePlan,
    *,
    placement_hint: Placement | None = None,
    count_tokens: CountTokens | None = None,
    max_input_tokens: int | None = None,
) -> list[dict[str, Any]]:
    """The OpenAI messages for the summarizer call of ``plan``.

    A system prompt naming what to preserve, then one user message with the previous
    summary (when ``plan.previous``, to build upon) and the transcript of
    ``plan.messages``. Each transcript item is capped (~2,000 tokens) so the call fits;
    with ``max_input_tokens`` the items are capped lower when the whole would not fit
    (a plan too long for one call is summarized in chunks: ``chunk_end``).
    """
    count = count_tokens or _default_count
    system, sections, closing = _prompt_parts(plan, placement_hint)
    budget = None
    if max_input_tokens is not None:
        budget = transcript_budget(
            plan, placement_hint=placement_hint, count_tokens=count,
            max_input_tokens=max_input_tokens,
        )
    transcript = build_transcript(plan.messages, count, budget=budget)
    sections.append(f"{_heading(plan)}\n{transcript}")
    sections.append(closing)
    return [
        {"role": "system", "content": system},
        {"role": "user", "content": "\n\n".join(sections)},
    ]
