"""full: every loaded message goes to the model verbatim. No summaries, no compression."""

from __future__ import annotations

from typing import Any

from strategies.base import CompactPlan, SummarizePlan, Window, WindowContext
from strategies.config import FullConfig
from strategies.records import LoadSpec
from strategies.validity import as_items, estimate_window_tokens, make_valid


class FullStrategy:
    """Loads up to ``maxHistoryFetch`` messages and sends them all.

    Only ``make_valid`` may leave messages out: a page cut by ``maxHistoryFetch`` can begin
    inside a tool unit or turn, and such leading messages are dropped (counted as trimmed).
    """

    kind = "full"

    def load_spec(self, config: FullConfig) -> LoadSpec:
        return LoadSpec(limit=config.maxHistoryFetch, since="all")

    def select(self, ctx: WindowContext) -> Window:
        items, dropped = make_valid(as_items(ctx.messages))
        notes = [f"{dropped} loaded messages dropped to keep the window valid"] if dropped else []
        return Window(
            items=items, trimmed=dropped, tokens=estimate_window_tokens(ctx, items), notes=notes
        )

    def plans_after_turn(self, config: Any) -> bool:
        return False

    def after_turn(self, ctx: WindowContext, window_tokens: int) -> SummarizePlan | None:
        return None

    def compress(self, ctx: WindowContext) -> CompactPlan:
        return CompactPlan(
            noop=True, message="full never compresses: every loaded message goes to the model"
        )
