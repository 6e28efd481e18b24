"""The window sent upstream is always valid: tool units, repair and the invariant checker.

Strict providers reject a conversation where a tool result has no call, a call has no
result, a system message sits in the middle, or the first message after the system block
is not a user message. Strategies cut histories at unit boundaries (``trim_to_units``) and
pass their candidate window through ``make_valid``; tests check the rendered result with
``check_openai_messages``.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Sequence
from typing import Any, cast

from strategies.base import WindowContext, WindowItem
from strategies.records import StoredMessage, SummaryRecord

_SYSTEM_ROLES = frozenset({"system", "developer"})
_ROLES = _SYSTEM_ROLES | {"user", "assistant", "tool"}


def call_ids(message: StoredMessage) -> list[str]:
    """The ids of an assistant message's tool calls, in order (calls without an id skipped)."""
    return [c["id"] for c in message.tool_calls or () if isinstance(c, dict) and c.get("id")]


def tool_units(messages: Sequence[StoredMessage]) -> list[tuple[int, int]]:
    """Partition ``messages`` into atomic units ``[start, end)``.

    An assistant message with tool calls and the tool messages right after it that answer
    its calls form one unit; every other message (including an orphan tool result) is a
    unit of its own.
    """
    n = len(messages)
    if not any([m.tool_calls for m in messages]):  # most windows: no unit of several
        return list(zip(range(n), range(1, n + 1), strict=True))
    calls = [i for i, m in enumerate(messages) if m.tool_calls and m.role == "assistant"]
    if not calls:
        return list(zip(range(n), range(1, n + 1), strict=True))
    units: list[tuple[int, int]] = []
    i = 0
    for call in calls:  # a unit ends at the first non-tool message, so call >= i
        units.extend((k, k + 1) for k in range(i, call))
        ids = set(call_ids(messages[call]))
        end = call + 1
        while end < n and messages[end].role == "tool" and messages[end].tool_call_id in ids:
            end += 1
        units.append((call, end))
        i = end
    units.extend((k, k + 1) for k in range(i, n))
    return units


def trim_to_units(
    messages: Sequence[StoredMessage],
    keep_from: int,
    units: Sequence[tuple[int, int]] | None = None,
) -> int:
    """Move a desired window start forward to the first unit boundary at or after it whose
    unit does not start with a tool result; ``len(messages)`` when there is none.
    ``units`` is ``tool_units(messages)`` when the caller has it already."""
    keep_from = max(0, keep_from)
    if units is None:
        units = tool_units(messages)
    # units are ordered by start: skip straight to the first starting at keep_from or later
    for index in range(bisect.bisect_left(units, (keep_from,)), len(units)):
        start = units[index][0]
        if messages[start].role != "tool":
            return start
    return len(messages)


def _has_text(item: WindowItem) -> bool:
    content = item.text if item.text is not None else item.message.content
    return bool(content)


def as_items(messages: Sequence[StoredMessage]) -> list[WindowItem]:
    """Stored messages as window items, verbatim (content as stored, tokens as counted)."""
    return [WindowItem(m, m.tokens) for m in messages]


def estimate_window_tokens(
    ctx: WindowContext, items: Sequence[WindowItem], summaries: Sequence[SummaryRecord] = ()
) -> int:
    """Estimated size of everything sent: system prompt, summaries and items."""
    return ctx.system_tokens + sum([s.tokens for s in summaries]) + sum([i.tokens for i in items])


def _close_unit(kept: list[WindowItem | None], head: int, answered: set[str]) -> bool:
    """Drop the unanswered calls of the unit headed by ``kept[head]``; True when the head
    itself went (no call and no text left)."""
    item = kept[head]
    assert item is not None
    calls = item.message.tool_calls or []
    remaining = [c for c in calls if isinstance(c, dict) and c.get("id") in answered]
    if len(remaining) == len(calls):
        return False
    if not remaining and not _has_text(item):
        kept[head] = None
        return True
    message = dataclasses.replace(item.message, tool_calls=remaining or None)
    kept[head] = dataclasses.replace(item, message=message)
    return False


def make_valid(items: list[WindowItem]) -> tuple[list[WindowItem], int]:
    """Repair a candidate window so strict providers accept it; returns (items, dropped).

    Tool results that do not answer a call of the assistant message right before them
    (orphans, duplicates) are dropped; an assistant message's unanswered calls are removed
    from what is sent (a shallow copy; the message is dropped when no call and no text
    remain); then leading items are dropped until the first is a user message. Order is
    preserved and the function is idempotent. The returned list is always a new one.
    """
    kept: list[WindowItem | None] = []
    append = kept.append
    head: int | None = None  # index in ``kept`` of the open unit's assistant message
    open_calls: set[str] = set()
    answered: set[str] = set()
    whole = -1  # len(answered) at which the open unit is complete (-1: check it)
    removed = False
    # a plain message costs two attribute reads and an append: units are the rare case
    for item in items:
        message = item.message
        if message.role == "tool":
            if head is not None:
                call_id = message.tool_call_id
                if call_id is not None and call_id in open_calls and call_id not in answered:
                    answered.add(call_id)
                    append(item)
            continue
        if head is not None:
            if len(answered) != whole:
                removed = _close_unit(kept, head, answered) or removed
            head = None
        if message.tool_calls and message.role == "assistant":
            ids = call_ids(message)
            head, open_calls, answered = len(kept), set(ids), set()
            # every call a dict with its own id, all answered: the unit needs no repair
            whole = len(open_calls) if len(ids) == len(message.tool_calls) else -1
        append(item)
    if head is not None and len(answered) != whole:
        removed = _close_unit(kept, head, answered) or removed

    valid = (
        [item for item in kept if item is not None]
        if removed
        else cast("list[WindowItem]", kept)  # no None was put in
    )
    if valid and valid[0].message.role == "user":
        return valid, len(items) - len(valid)
    first_user = next((k for k, i in enumerate(valid) if i.message.role == "user"), len(valid))
    valid = valid[first_user:]
    return valid, len(items) - len(valid)


def opening_with_a_user(items: list[WindowItem]) -> list[WindowItem]:
    """``make_valid`` of items without tool calls or tool results (no unit to repair):
    ``items`` from the first user message on (``items`` itself when it opens with one)."""
    if items and items[0].message.role == "user":
        return items
    first = next((k for k, item in enumerate(items) if item.message.role == "user"), len(items))
    return items[first:]


def check_openai_messages(messages: list[dict[str, Any]]) -> list[str]:
    """Violations of the validity invariants in a rendered OpenAI ``messages`` list.

    One leading system block (system/developer only at the front), the first non-system
    message is a user message, every tool message answers a call of the assistant message
    heading its unit, every call is answered before the next non-tool message, no call is
    answered twice. An empty list means the window is valid.
    """
    problems: list[str] = []
    start = 0
    while start < len(messages) and messages[start].get("role") in _SYSTEM_ROLES:
        start += 1
    if start == len(messages):
        problems.append("no message after the system block")
    elif messages[start].get("role") != "user":
        problems.append(
            f"message {start}: first non-system message has role {messages[start].get('role')!r}"
            ", not 'user'"
        )

    head: int | None = None
    calls: list[str] = []
    answered: set[str] = set()

    def close_unit() -> None:
        for call_id in calls:
            if call_id not in answered:
                problems.append(f"message {head}: tool call {call_id!r} is not answered")

    for index in range(start, len(messages)):
        message = messages[index]
        role = message.get("role")
        if role not in _ROLES:
            problems.append(f"message {index}: unknown role {role!r}")
        if role in _SYSTEM_ROLES:
            problems.append(f"message {index}: {role} message outside the leading system block")
        if role == "tool":
            call_id = message.get("tool_call_id")
            if head is None:
                problems.append(
                    f"message {index}: tool result {call_id!r} does not follow an assistant "
                    "message with tool calls"
                )
            elif call_id not in calls:
                problems.append(
                    f"message {index}: tool result {call_id!r} answers no call of message {head}"
                )
            elif call_id in answered:
                problems.append(f"message {index}: tool call {call_id!r} answered twice")
            else:
                answered.add(call_id)
            continue
        close_unit()
        head, calls, answered = None, [], set()
        tool_calls = message.get("tool_calls")
        if tool_calls is None:
            continue
        if role != "assistant":
            problems.append(f"message {index}: {role} message carries tool_calls")
            continue
        if not tool_calls:
            problems.append(f"message {index}: empty tool_calls list")
            continue
        head = index
        for call in tool_calls:
            call_id = call.get("id") if isinstance(call, dict) else None
            if not call_id:
                problems.append(f"message {index}: tool call without an id")
            elif call_id in calls:
                problems.append(f"message {index}: duplicate tool call id {call_id!r}")
            else:
                calls.append(call_id)
    close_unit()
    for index in range(start):
        if messages[index].get("tool_calls"):
            problems.append(f"message {index}: system message carries tool_calls")
    return problems
