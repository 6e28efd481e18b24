"""windowed: the last ``windowSize`` stored messages; older ones simply fall off.

With ``windowStep`` above 1 (an extension) the window starts on a step boundary of the
seqs, so its start, and the provider's cached prefix, hold for ``windowStep`` messages.

No summaries, no compression. The cut moves forward to a tool-unit boundary, so the window
never starts with a tool result or splits a call from its results, and the current turn is
always sent whole, even when it alone is longer than ``windowSize``.

The load is ``LoadSpec(limit=windowSize, since="all")``; the proxy must make sure the loaded
page also holds the whole current turn (from the latest user message on), or the window
cannot start with a user message and is left empty of that turn.
"""

from __future__ import annotations

from typing import Any

from strategies.base import CompactPlan, SummarizePlan, Window, WindowContext
from strategies.config import WindowedConfig
from strategies.records import LoadSpec
from strategies.validity import (
    as_items,
    estimate_window_tokens,
    make_valid,
    trim_to_units,
)


class WindowedStrategy:
    kind = "windowed"

    def load_spec(self, config: WindowedConfig) -> LoadSpec:
        return LoadSpec(limit=config.windowSize, since="all")

    def select(self, ctx: WindowContext) -> Window:
        messages = ctx.messages
        if not isinstance(ctx.config, WindowedConfig):
            raise TypeError(f"windowed needs a WindowedConfig, got {type(ctx.config).__name__}")
        size, step = ctx.config.windowSize, ctx.config.windowStep
        turn_start = min(max(ctx.current_turn_start, 0), len(messages))
        start = max(len(messages) - size, 0)
        if step > 1:
            # the first of the last windowSize messages on a step boundary: the start is
            # the same from one request to the next until the window is full again
            start = next(
                (i for i in range(start, len(messages)) if (messages[i].seq - 1) % step == 0),
                len(messages),
            )
        start = min(start, turn_start)
        start = trim_to_units(messages, start)
        items, _ = make_valid(as_items(messages[start:]))
        trimmed = len(messages) - len(items)
        notes = [f"{trimmed} older loaded messages fell off the window"] if trimmed else []
        return Window(
            items=items, trimmed=trimmed, tokens=estimate_window_tokens(ctx, items), notes=notes
        )

    def plans_after_turn(self, config: Any) -> bool:
        return False

    def after_turn(self, ctx: WindowContext, window_tokens: int) -> SummarizePlan | None:
        return None

    def compress(self, ctx: WindowContext) -> CompactPlan:
        return CompactPlan(
            noop=True, message="windowed never compresses: older messages simply fall off"
        )
