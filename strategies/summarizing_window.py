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

import bisect
from collections.abc import Sequence
from itertools import accumulate
from typing import Any

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
    exceeds,
    render_stored,
)
from strategies.config import SummarizingWindowConfig
from strategies.records import LoadSpec, StoredMessage, SummaryRecord
from strategies.summary_prompt import render_summary
from strategies.truncation import message_cap, truncate_item
from strategies.validity import make_valid, opening_with_a_user, tool_units, trim_to_units

# the share of the window budget the kept tail may use after an automatic summary
TAIL_SHARE = 0.5
MIN_SUMMARIZED = 2
# the reply record's meta key describing the window it answered (proxy/turn/prompt_cache.py
# writes it); its "start" is the seq that window started at
WINDOW_META = "window"


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
    units: Sequence[tuple[int, int]] | None = None,
) -> int:
    """Where the window starts so that ``fixed`` plus the kept items stay within
    ``ratio * context_window`` (calibrated): whole units, newest first, stopping at the
    first that does not fit. Units of the current turn (from ``turn_start``) are always
    kept. ``items[i]`` is ``messages[i]`` as rendered; ``units`` is
    ``tool_units(messages)`` when the caller has it already."""
    return fit_sizes(
        [item.tokens for item in items],
        tool_units(messages) if units is None else units,
        turn_start,
        fixed=fixed,
        limit=round(ratio * context_window, 6),
        calibration=calibration,
    )


def fit_sizes(
    sizes: Sequence[int],
    units: Sequence[tuple[int, int]] | None,
    turn_start: int,
    *,
    fixed: int,
    limit: float,
    calibration: float,
) -> int:
    """``fit_tail`` over the items' sizes, against a precomputed (rounded) token limit:
    the same comparison as ``exceeds``, without a call per unit. ``units`` None: every
    message is a unit of its own."""
    if units is None or len(units) == len(sizes):
        if calibration >= 0 and min(sizes, default=0) >= 0:
            return _fit_singles(
                sizes, turn_start, fixed=fixed, limit=limit, calibration=calibration
            )
        units = [(i, i + 1) for i in range(len(sizes))]
    total = fixed
    keep_from = len(sizes)
    for start, end in reversed(units):
        size = sizes[start] if end - start == 1 else sum(sizes[start:end])
        if end <= turn_start and (total + size) * calibration > limit:
            break
        total += size
        keep_from = start
    return keep_from


def _fit_singles(
    sizes: Sequence[int], turn_start: int, *, fixed: int, limit: float, calibration: float
) -> int:
    """``fit_sizes`` when every unit is one message (no tool calls: most windows): the
    running totals of the older messages, newest first, added up in C, and the first that
    no longer fits found by bisection (they only grow: no size is negative, the
    calibration is not)."""
    current = min(max(turn_start, 0), len(sizes))  # the current turn's: always kept
    totals = list(accumulate(reversed(sizes[:current]), initial=fixed + sum(sizes[current:])))
    over = bisect.bisect_left(totals, True, lo=1, key=lambda total: total * calibration > limit)
    return current - over + 1


def window_anchor(messages: Sequence[StoredMessage]) -> int | None:
    """The seq the session's previous window started at: the window ``start`` the proxy
    stored on the latest assistant message (the reply to that window's request). None when
    that message carries none (a client's own message)."""
    for message in reversed(messages):
        if message.role == "assistant":
            window = message.meta.get(WINDOW_META) if message.meta else None
            value = window.get("start") if isinstance(window, dict) else None
            return value if isinstance(value, int) and not isinstance(value, bool) else None
    return None


# the reply's prompt-cache reading (proxy/turn/prompt_cache.py writes it on the reply's
# record): ``{"prompt", "cached", "written"}`` tokens
CACHE_META = "cache"
# how many of the latest replies ``stablePrefix: "auto"`` looks at for a cache reading
CACHE_EVIDENCE_REPLIES = 8


def upstream_caches(messages: Sequence[StoredMessage]) -> bool:
    """True when one of the latest replies (``CACHE_EVIDENCE_REPLIES``) reports cached or
    written prompt-cache tokens: the upstream keeps a prompt cache for this session."""
    seen = 0
    for message in reversed(messages):
        if message.role != "assistant":
            continue
        cache = message.meta.get(CACHE_META) if message.meta else None
        if cache.__class__ is dict and (_positive(cache.get("cached")) or _positive(
            cache.get("written")
        )):
            return True
        seen += 1
        if seen >= CACHE_EVIDENCE_REPLIES:
            return False
    return False


def _positive(value: Any) -> bool:
    return value.__class__ is int and value > 0


def stable_prefix(config: SummarizingWindowConfig, messages: Sequence[StoredMessage]) -> bool:
    """Whether this turn's window keeps a stable prefix: ``stablePrefix`` true or false as
    set; ``"auto"`` (the default) once the upstream has reported prompt caching on this
    session, since a stable prefix only pays where a cache reads it."""
    if config.stablePrefix == "auto":
        return upstream_caches(messages)
    return bool(config.stablePrefix)


def held_start(
    messages: Sequence[StoredMessage], live: Sequence[StoredMessage], turn: int
) -> int:
    """Index in ``live`` the window may not start before: where the previous window
    started (``window_anchor``), never inside the current turn (from ``turn``)."""
    anchor = window_anchor(messages)
    if anchor is None:
        return 0
    return min(bisect.bisect_left(live, anchor, key=lambda m: m.seq), turn)


class SummarizingWindowStrategy:
    """The system default: budget trimming, tool-result compression, opt-in summaries."""

    kind = "summarizing_window"

    def load_spec(self, config: SummarizingWindowConfig) -> LoadSpec:
        """maxHistoryFetch is the page size when loading history: pages are read until
        the window's budget is full (or the history ends), so pressure and the
        autoSummarize trigger are measured on what the budget could hold."""
        return LoadSpec(
            limit=config.maxHistoryFetch, since="all", fill_ratio=config.maxConversationRatio
        )

    def select(self, ctx: WindowContext) -> Window:
        """The window for this turn. Pressure (compression rule 3) is measured on the live
        window as it would be sent before compression and before trimming: the system
        prompt, the summary and every unsummarized loaded message as rendered (stored stubs,
        the message cap), calibrated. Trimming comes after, since compression may make more
        history fit."""
        config: SummarizingWindowConfig = ctx.config  # type: ignore[assignment]
        context_window, calibration = ctx.context_window, ctx.calibration
        stable = stable_prefix(config, ctx.messages)
        summary, fixed, start, sizes, shaped = self._live(ctx)
        live = ctx.messages[start:]
        turn = min(max(ctx.current_turn_start - start, 0), len(live))
        notes: list[str] = []
        if start:
            notes.append(f"{start} messages covered by the summary are not sent")

        live_total = fixed + sum(sizes)
        pressure = exceeds(
            live_total, config.compressWhenWindowAboveRatio, context_window, calibration
        )
        limit = round(config.maxConversationRatio * context_window, 6)
        # stablePrefix: the window starts no earlier than the last one did (``held``) and
        # changes only when it reaches the budget; compression joins that change
        held = held_start(ctx.messages, live, turn) if stable else 0
        overflow = not stable or (fixed + sum(sizes[held:])) * calibration > limit
        stubs: dict[int, str] = {}
        if pressure and overflow and config.compressToolResults:
            stubs = choose_compressions(
                ctx.messages,
                config,
                context_window,
                under_pressure=True,
                calibration=calibration,
                # the seqs from live[held] on (seqs ascend: a range holds the same ones)
                eligible=range(live[held].seq, live[-1].seq + 1) if held < len(live) else (),
                count_tokens=ctx.count_tokens,
            )
        if stubs:
            for index, message in enumerate(live):
                if message.seq in stubs:
                    item = compressed_item(message, stubs[message.seq], ctx.count_tokens)
                    shaped[index] = item
                    sizes[index] = item.tokens
            notes.append(f"{len(stubs)} tool results compressed")
            live_total = fixed + sum(sizes)

        fits = bool(
            live
            and not held
            and not (stable and overflow)  # then trimmed to the target
            and not live_total * calibration > limit
            and calibration >= 0
            and min(sizes) >= 0
            and live[0].role != "tool"
        )
        # no tool calls and no tool results (most windows): every message is a unit of its
        # own, and nothing needs repair but the window's start
        plain = not any([m.tool_calls for m in live]) and "tool" not in [m.role for m in live]
        if fits:
            # everything fits: every partial tail fits too, so fit_tail keeps it all and the
            # first unit is a boundary trim_to_units accepts
            keep_from = 0
        else:
            units = None if plain else tool_units(live)
            if overflow:
                # the spec trims just below the budget; a stable prefix trims further, to
                # trimTargetShare of it, so that the next turns fit without a change
                target = limit * config.trimTargetShare if stable else limit
                keep_from = fit_sizes(
                    sizes, units, turn, fixed=fixed, limit=target, calibration=calibration
                )
            else:
                keep_from = 0
            keep_from = min(max(keep_from, held), turn)
            if units is not None:  # a plain window's every message starts a unit
                keep_from = trim_to_units(live, keep_from, units)
        # window items are built for the kept messages only
        items = [WindowItem(m, m.tokens) for m in (live[keep_from:] if keep_from else live)]
        for index, item in shaped.items():
            if index >= keep_from:
                items[index - keep_from] = item
        kept = opening_with_a_user(items) if plain else make_valid(items)[0]
        dropped = len(live) - len(kept)
        if dropped:
            notes.append(f"{dropped} older messages trimmed to fit maxConversationRatio")
        truncated = sum(1 for i in kept if i.marker == "truncated") if shaped else 0
        if truncated:
            notes.append(f"{truncated} messages truncated to maxMessageRatio")
        total = fixed + sum([i.tokens for i in kept])
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

    def _live(
        self, ctx: WindowContext
    ) -> tuple[SummaryRecord | None, int, int, list[int], dict[int, WindowItem]]:
        """The live window before compression and trimming: the latest summary, the size of
        the system prompt and that summary, the index of the first loaded message the
        summary does not cover, the size of every message from there as rendered (stored
        stubs, the message cap) and, by index from there, the items rendered with other
        text than their content (most messages go verbatim: no item is built for them)."""
        config: SummarizingWindowConfig = ctx.config  # type: ignore[assignment]
        count_tokens = ctx.count_tokens
        summary = latest_summary(ctx.summaries)
        fixed = ctx.system_tokens + summary_tokens(summary, config.summaryPlacement, count_tokens)
        start = live_start(ctx.messages, summary)
        live = ctx.messages[start:]
        cap, cut = message_cap(config, ctx.context_window, ctx.calibration)
        sizes = [m.tokens for m in live]
        stored_stubs = [m.compressed_content for m in live]
        shaped: dict[int, WindowItem] = {}
        if (sizes and max(sizes) > cap) or stored_stubs.count(None) != len(stored_stubs):
            for index, message in enumerate(live):
                stub = stored_stubs[index]
                if stub is not None:
                    item = compressed_item(message, stub, count_tokens)
                elif message.tokens > cap:
                    item = truncate_item(WindowItem(message, message.tokens), cut, count_tokens)
                else:
                    continue
                shaped[index] = item
                sizes[index] = item.tokens
        return summary, fixed, start, sizes, shaped

    def live_tokens(self, ctx: WindowContext) -> int:
        """The live window before trimming, as an estimate (uncalibrated)."""
        _summary, fixed, _start, sizes, _shaped = self._live(ctx)
        return fixed + sum(sizes)

    def plans_after_turn(self, config: Any) -> bool:
        return bool(config.autoSummarize)

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
            count_tokens=ctx.count_tokens,
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
    stored message after ``previous`` up to ``to_seq`` (proxy/background/summarizer.py), since a
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
