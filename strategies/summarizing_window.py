"""summarizing_window: a sliding live window with three independent mechanisms.

1. Tool-result compression (``strategies/compression.py``), decided first at every turn:
   it may make more history fit.
2. Budget trimming: the window may use ``maxConversationRatio * context_window`` tokens.
   The budget holds everything sent — the system prompt and the summary count against it
   too, so the rest of the context window stays free for the response. Whole tool units
   are kept from the newest back while they fit; the current turn is always kept; a
   single message above ``maxMessageRatio * context_window`` is truncated in the window.
3. Summaries (opt-in ``autoSummarize``, and the Compact action): the oldest unsummarized
   range is summarized into a record that builds on the previous one, so only the latest
   summary is sent and no range is summarized twice.

Token accounting: ``Window.tokens`` and ``WindowItem.tokens`` are raw local estimates;
calibration (``ctx.calibration``) is applied in every decision against the context window.
"""

from __future__ import annotations

from collections.abc import Sequence

from strategies.base import (
    CompactPlan,
    CountTokens,
    Placement,
    SummarizePlan,
    Window,
    WindowContext,
    WindowItem,
)
from strategies.compression import (
    choose_compressions,
    compressed_item,
    content_text,
    exceeds,
    head_within,
    render_stored,
)
from strategies.config import SummarizingWindowConfig
from strategies.records import LoadSpec, StoredMessage, SummaryRecord
from strategies.summary_prompt import render_summary
from strategies.validity import make_valid, tool_units, trim_to_units

# the share of the window budget the kept tail may use after an automatic summary
TAIL_SHARE = 0.5
# truncation lengths move in steps of 1/50 of the cap (see message_cap)
STEADY_GRID = 50
MIN_SUMMARIZED = 2


def latest_summary(
    summaries: Sequence[SummaryRecord], kind: str = "summary"
) -> SummaryRecord | None:
    """The record of ``kind`` that reaches furthest (each builds on the one before)."""
    records = [s for s in summaries if s.kind == kind]
    return max(records, key=lambda s: (s.to_seq, s.id)) if records else None


def summary_tokens(
    summary: SummaryRecord | None, placement: Placement, count_tokens: CountTokens
) -> int:
    """The size of a summary as it is rendered into the request."""
    if summary is None:
        return 0
    rendered = render_summary(summary, placement)
    return count_tokens(rendered if isinstance(rendered, str) else rendered["content"])


def live_start(messages: Sequence[StoredMessage], summary: SummaryRecord | None) -> int:
    """Index of the first message a summary (covering everything up to its ``to_seq``)
    does not cover."""
    if summary is None:
        return 0
    return next((i for i, m in enumerate(messages) if m.seq > summary.to_seq), len(messages))


def fit_tail(
    messages: Sequence[StoredMessage],
    items: Sequence[WindowItem],
    turn_start: int,
    *,
    fixed: int,
    ratio: float,
    context_window: int,
    calibration: float,
) -> int:
    """Where the window starts so that ``fixed`` plus the kept items stay within
    ``ratio * context_window`` (calibrated): whole units, newest first, stopping at the
    first that does not fit. Units of the current turn (from ``turn_start``) are always
    kept. ``items[i]`` is ``messages[i]`` as rendered."""
    total = fixed
    keep_from = len(messages)
    for start, end in reversed(tool_units(messages)):
        size = sum(item.tokens for item in items[start:end])
        if end <= turn_start and exceeds(total + size, ratio, context_window, calibration):
            break
        total += size
        keep_from = start
    return keep_from


def message_cap(
    config: SummarizingWindowConfig, context_window: int, calibration: float
) -> tuple[int, int]:
    """maxMessageRatio of the context window in estimated tokens, and the size a message
    above it is cut to: the cap rounded down to a grid of 1/50 of the uncalibrated cap.

    The cap moves with the calibration factor, which changes a little with every
    response; on the grid the cut text mostly stays the same from one turn to the next,
    so the counter's memory serves it instead of tokenizing the message again."""
    raw = round(config.maxMessageRatio * context_window, 6)
    cap = int(raw / calibration)
    return cap, cap - cap % max(1, int(raw) // STEADY_GRID)


def truncate_item(item: WindowItem, limit: int, count_tokens: CountTokens) -> WindowItem:
    """``item`` with its text cut so the whole message is at most ``limit`` tokens, with a
    visible marker line. Tool calls are untouched; an item whose text cannot shrink it
    enough (the size is in its tool calls) is returned as is."""
    text = content_text(item.message.content)
    text_tokens = count_tokens(text)
    overhead = max(0, item.tokens - text_tokens)
    marker = f"\n[… truncated by memory-proxy: {text_tokens} of {text_tokens} tokens shown]"
    room = limit - overhead - count_tokens(marker)
    if room <= 0 or text_tokens <= room:
        return item
    kept = head_within(text, room, count_tokens)
    shown = count_tokens(kept)
    new_text = f"{kept}\n[… truncated by memory-proxy: {shown} of {text_tokens} tokens shown]"
    return WindowItem(
        message=item.message,
        tokens=overhead + count_tokens(new_text),
        text=new_text,
        marker="truncated",
    )


class SummarizingWindowStrategy:
    """The system default: budget trimming, tool-result compression, opt-in summaries."""

    kind = "summarizing_window"

    def load_spec(self, config: SummarizingWindowConfig) -> LoadSpec:
        return LoadSpec(limit=config.maxHistoryFetch, since="all")

    def select(self, ctx: WindowContext) -> Window:
        """The window for this turn. Pressure (compression rule 3) is measured on the live
        window as it would be sent before compression and before trimming: the system
        prompt, the summary and every unsummarized loaded message as rendered (stored stubs,
        the message cap), calibrated. Trimming comes after, since compression may make more
        history fit."""
        config: SummarizingWindowConfig = ctx.config  # type: ignore[assignment]
        context_window, calibration = ctx.context_window, ctx.calibration
        summary, fixed, start, items = self._live(ctx)
        live = ctx.messages[start:]
        turn = min(max(ctx.current_turn_start - start, 0), len(live))
        notes: list[str] = []
        if start:
            notes.append(f"{start} messages covered by the summary are not sent")

        pressure = exceeds(
            fixed + sum(i.tokens for i in items),
            config.compressWhenWindowAboveRatio,
            context_window,
            calibration,
        )
        stubs = choose_compressions(
            ctx.messages,
            config,
            context_window,
            under_pressure=pressure,
            calibration=calibration,
            eligible=frozenset(m.seq for m in live),
        )
        for index, message in enumerate(live):
            if message.seq in stubs:
                items[index] = compressed_item(message, stubs[message.seq], ctx.count_tokens)
        if stubs:
            notes.append(f"{len(stubs)} tool results compressed")

        keep_from = fit_tail(
            live,
            items,
            turn,
            fixed=fixed,
            ratio=config.maxConversationRatio,
            context_window=context_window,
            calibration=calibration,
        )
        keep_from = trim_to_units(live, min(keep_from, turn))
        kept, _ = make_valid(items[keep_from:])
        dropped = len(live) - len(kept)
        if dropped:
            notes.append(f"{dropped} older messages trimmed to fit maxConversationRatio")
        truncated = sum(1 for i in kept if i.marker == "truncated")
        if truncated:
            notes.append(f"{truncated} messages truncated to maxMessageRatio")
        total = fixed + sum(i.tokens for i in kept)
        if exceeds(total, config.maxConversationRatio, context_window, calibration):
            notes.append("the current turn alone exceeds maxConversationRatio")
        return Window(
            items=kept,
            summaries=[summary] if summary else [],
            summary_placement=config.summaryPlacement,
            trimmed=len(ctx.messages) - len(kept),
            new_stubs=stubs,
            tokens=total,
            notes=notes,
        )

    def _render(
        self, message: StoredMessage, cap: tuple[int, int], count_tokens: CountTokens
    ) -> WindowItem:
        item = render_stored(message, count_tokens)
        if item.marker is None and item.tokens > cap[0]:
            return truncate_item(item, cap[1], count_tokens)
        return item

    def _live(self, ctx: WindowContext) -> tuple[SummaryRecord | None, int, int, list[WindowItem]]:
        """The live window before compression and trimming: the latest summary, the size of
        the system prompt and that summary, the index of the first loaded message the
        summary does not cover, and every message from there as rendered (stored stubs,
        the message cap)."""
        config: SummarizingWindowConfig = ctx.config  # type: ignore[assignment]
        summary = latest_summary(ctx.summaries)
        fixed = ctx.system_tokens + summary_tokens(
            summary, config.summaryPlacement, ctx.count_tokens
        )
        start = live_start(ctx.messages, summary)
        cap = message_cap(config, ctx.context_window, ctx.calibration)
        items = [self._render(m, cap, ctx.count_tokens) for m in ctx.messages[start:]]
        return summary, fixed, start, items

    def live_tokens(self, ctx: WindowContext) -> int:
        """The live window before trimming, as an estimate (uncalibrated)."""
        _summary, fixed, _start, items = self._live(ctx)
        return fixed + sum(item.tokens for item in items)

    def after_turn(self, ctx: WindowContext, window_tokens: int) -> SummarizePlan | None:
        """Summarize the oldest unsummarized range when ``autoSummarize`` is on and the
        live window is strictly above ``autoSummarizeRatio``. The live window is the
        measured one (``window_tokens``, calibrated) or, when larger, the unsummarized
        conversation before trimming (``live_tokens``, calibrated): trimming must not hide
        growth from the trigger, or a maxConversationRatio at or below autoSummarizeRatio
        would never let it fire while older messages fall off unsummarized. The kept tail
        is the newest whole turns within half of the window budget (at least the current
        turn)."""
        config: SummarizingWindowConfig = ctx.config  # type: ignore[assignment]
        if not config.autoSummarize:
            return None
        live = max(window_tokens, self.live_tokens(ctx) * ctx.calibration)
        if not exceeds(live, config.autoSummarizeRatio, ctx.context_window):
            return None
        tail = round(config.maxConversationRatio * ctx.context_window * TAIL_SHARE, 6)
        return plan_summary(ctx, tail_budget=tail, reason="autoSummarize")

    def compress(self, ctx: WindowContext) -> CompactPlan:
        """The Compact action: "summarizes unsummarized ranges and compresses large tool
        results". Read as an explicit request, it is unconditional: everything older than
        the current turn not yet summarized is summarized, whatever autoSummarize says, and
        the pressure rule is waived — a result is compressed when it is read, not among the
        newest three and above the size threshold (compressToolResults false still turns
        compression off). Only results that stay live after the summary get stubs."""
        config: SummarizingWindowConfig = ctx.config  # type: ignore[assignment]
        plan = plan_summary(ctx, tail_budget=None, reason="Compact")
        previous = latest_summary(ctx.summaries)
        covered = plan.to_seq if plan else previous.to_seq if previous else 0
        stubs = choose_compressions(
            ctx.messages,
            config,
            ctx.context_window,
            under_pressure=True,
            calibration=ctx.calibration,
            eligible=frozenset(m.seq for m in ctx.messages if m.seq > covered),
        )
        if plan is None and not stubs:
            return CompactPlan(
                noop=True,
                message="nothing to compress: no unsummarized range before the current turn "
                "and no large tool result to compress",
            )
        return CompactPlan(summarize=[plan] if plan else [], new_stubs=stubs)


def plan_summary(
    ctx: WindowContext, *, tail_budget: float | None, reason: str
) -> SummarizePlan | None:
    """A summary of the oldest unsummarized messages, up to a turn boundary before the
    current turn; the kept tail fits ``tail_budget`` (calibrated) when one is given.

    The plan builds on the latest summary (``previous``) and covers the union
    (``from_seq = previous.from_seq``), so the new record supersedes it. None when fewer
    than two messages are eligible: a plan always advances the summarized frontier.
    ``messages`` are the loaded ones only: before running a plan the proxy re-reads every
    stored message after ``previous`` up to ``to_seq`` (proxy/summarizer.py), since a
    page shorter than the history may have left some out.
    """
    messages = ctx.messages
    previous = latest_summary(ctx.summaries)
    start = live_start(messages, previous)
    turn = min(max(ctx.current_turn_start, 0), len(messages))
    cut = turn
    if tail_budget is not None:
        tail = sum(render_stored(m, ctx.count_tokens).tokens for m in messages[turn:])
        # newest first: the oldest turn boundary whose tail still fits wins
        for index in range(turn - 1, start, -1):
            tail += render_stored(messages[index], ctx.count_tokens).tokens
            if tail * ctx.calibration > tail_budget:
                break
            if messages[index].role == "user":
                cut = index
    if cut - start < MIN_SUMMARIZED:
        return None
    return SummarizePlan(
        kind="summary",
        from_seq=previous.from_seq if previous else messages[start].seq,
        to_seq=messages[cut - 1].seq,
        messages=list(messages[start:cut]),
        previous=previous,
        reason=reason,
    )
