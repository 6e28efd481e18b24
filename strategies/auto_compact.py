"""auto_compact: live history verbatim until the window crosses compactAtRatio, then the
whole live conversation becomes one summary and the window restarts from it.

The load is the messages after the latest compaction boundary. The latest compaction
record is placed per ``summaryPlacement``. Optional ``toolResultEviction`` swaps bulky
older tool results for a pointer to ``fetch_tool_result`` at render time (nothing is
written). As a safety net, a window that would still exceed the context window (a failed
or skipped compaction) loses its oldest units so the upstream does not reject it.

Token accounting: ``Window.tokens`` and ``WindowItem.tokens`` are raw local estimates;
calibration (``ctx.calibration``) is applied in every decision against the context window.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from strategies.base import (
    CompactPlan,
    Placement,
    SummarizePlan,
    Window,
    WindowContext,
    WindowItem,
)
from strategies.compression import choose_evictions, eviction_stub, exceeds, stub_tokens
from strategies.config import AutoCompactConfig
from strategies.records import LoadSpec, StoredMessage, SummaryRecord
from strategies.summarizing_window import fit_tail, latest_summary, live_start, summary_tokens
from strategies.validity import as_items, make_valid, tool_units, trim_to_units

# how many messages after the boundary one turn may load: compaction keeps it far lower
LOAD_LIMIT = 5000


def complete_end(messages: Sequence[StoredMessage]) -> int:
    """End of the last complete unit: a trailing assistant message whose tool calls are
    not all answered yet stays live (its results arrive with the next request)."""
    units = tool_units(messages)
    if not units:
        return 0
    start, end = units[-1]
    head = messages[start]
    if head.role == "assistant" and head.tool_calls:
        asked = {c.get("id") for c in head.tool_calls if isinstance(c, dict)}
        answered = {m.tool_call_id for m in messages[start + 1 : end]}
        if not asked <= answered:
            return start
    return len(messages)


def _validate(
    items: list[WindowItem], summary: SummaryRecord | None, placement: Placement
) -> tuple[list[WindowItem], Placement]:
    """``make_valid`` that lets the live part open with an assistant unit behind the
    summary: after a compaction the live part may start with a call whose results the
    current request brings. The summary then goes as a user message (whatever the
    placement), so the first message after the system block is still a user message."""
    if summary is None:
        return make_valid(items)[0], placement
    # the synthetic summary message is a user message: validate as if it led the list
    lead = WindowItem(message=StoredMessage(role="user", content=summary.text), tokens=0)
    repaired = make_valid([lead, *items])[0][1:]
    if repaired and repaired[0].message.role == "user":
        return repaired, placement
    return repaired, "USER_MESSAGE"


class AutoCompactStrategy:
    """The Claude Code pattern: verbatim history, whole-conversation compaction."""

    kind = "auto_compact"

    def load_spec(self, config: AutoCompactConfig) -> LoadSpec:
        return LoadSpec(limit=LOAD_LIMIT, since="boundary")

    def select(self, ctx: WindowContext) -> Window:
        config: AutoCompactConfig = ctx.config  # type: ignore[assignment]
        context_window, calibration = ctx.context_window, ctx.calibration
        compaction = latest_summary(ctx.summaries, "compaction")
        start = live_start(ctx.messages, compaction)
        live = ctx.messages[start:]
        turn = min(max(ctx.current_turn_start - start, 0), len(live))
        notes: list[str] = []

        items = as_items(live)
        if config.toolResultEviction is not None:
            evicted = choose_evictions(
                live, config.toolResultEviction, turn, calibration=calibration,
                count_tokens=ctx.count_tokens,
            )
            for index in sorted(evicted):
                message = live[index]
                stub = eviction_stub(message.tool_call_id, message.tokens)
                # sent as a whole message: its framing counts as well as the stub
                tokens = stub_tokens(message, stub, ctx.count_tokens)
                items[index] = WindowItem(message=message, tokens=tokens, text=stub,
                                          marker="evicted")
            if evicted:
                notes.append(f"{len(evicted)} older tool results evicted (fetch_tool_result)")

        placement: Placement = config.summaryPlacement
        fixed = ctx.system_tokens + summary_tokens(compaction, placement, ctx.count_tokens)
        keep_from = 0
        if exceeds(fixed + sum([i.tokens for i in items]), 1.0, context_window, calibration):
            units = tool_units(live)
            keep_from = fit_tail(
                live,
                items,
                turn,
                fixed=fixed,
                ratio=1.0,
                context_window=context_window,
                calibration=calibration,
                units=units,
            )
            keep_from = trim_to_units(live, min(keep_from, turn), units)
            notes.append(
                f"safety trim: the oldest live messages before seq "
                f"{live[keep_from].seq if keep_from < len(live) else '-'} are left out to "
                "fit the context window (compaction has not caught up)"
            )
        kept, sent_placement = _validate(items[keep_from:], compaction, placement)
        if sent_placement != placement:
            notes.append("summary sent as a user message: the live part opens mid-turn")
            fixed = ctx.system_tokens + summary_tokens(compaction, sent_placement, ctx.count_tokens)
        total = fixed + sum([i.tokens for i in kept])
        if exceeds(total, 1.0, context_window, calibration):
            notes.append("the current turn alone exceeds the context window")
        return Window(
            items=kept,
            summaries=[compaction] if compaction else [],
            summary_placement=sent_placement,
            trimmed=len(ctx.messages) - len(kept),
            tokens=total,
            notes=notes,
        )

    def plans_after_turn(self, config: Any) -> bool:
        return True

    def after_turn(self, ctx: WindowContext, window_tokens: int) -> SummarizePlan | None:
        """A compaction of the whole live conversation once the measured window is strictly
        above ``compactAtRatio``. It always reaches the head (but for a call still waiting
        for its results), so the next window restarts from the summary. None when the live
        messages weigh no more than the summary they would fold into (it would not help)."""
        config: AutoCompactConfig = ctx.config  # type: ignore[assignment]
        if not exceeds(window_tokens, config.compactAtRatio, ctx.context_window):
            return None
        plan = plan_compaction(ctx, reason="compactAtRatio")
        if plan is not None and plan.previous is not None and (
            sum(m.tokens for m in plan.messages) <= plan.previous.tokens
        ):
            # no loop: when the system prompt and the summary alone keep the window over
            # the ratio, compacting less than the summary's size would not shrink it
            return None
        return plan

    def compress(self, ctx: WindowContext) -> CompactPlan:
        """The Compact action: a full compaction (one summary, the window restarts)."""
        plan = plan_compaction(ctx, reason="Compact")
        if plan is None:
            return CompactPlan(noop=True, message="nothing to compact: no live messages")
        return CompactPlan(summarize=[plan])


def plan_compaction(ctx: WindowContext, *, reason: str) -> SummarizePlan | None:
    """The whole live conversation as one compaction building on the previous one; None
    when nothing live is complete."""
    previous = latest_summary(ctx.summaries, "compaction")
    live = ctx.messages[live_start(ctx.messages, previous) :]
    end = complete_end(live)
    if end == 0:
        return None
    return SummarizePlan(
        kind="compaction",
        from_seq=live[0].seq,
        to_seq=live[end - 1].seq,
        messages=list(live[:end]),
        previous=previous,
        reason=reason,
    )
