"""none: stateless. Only the system prompt and the current turn reach the model."""

from __future__ import annotations

from typing import Any

from strategies.base import CompactPlan, SummarizePlan, Window, WindowContext
from strategies.config import NoneConfig
from strategies.records import LoadSpec
from strategies.validity import as_items, estimate_window_tokens, make_valid

# a turn's tool loop can be long; this bounds what one turn may load
TURN_LOAD_LIMIT = 500


class NoneStrategy:
    """Sends the current turn: the latest user message and everything after it (the
    assistant's tool calls and their results), nothing before."""

    kind = "none"

    def load_spec(self, config: NoneConfig) -> LoadSpec:
        return LoadSpec(limit=TURN_LOAD_LIMIT, since="turn")

    def select(self, ctx: WindowContext) -> Window:
        start = min(max(ctx.current_turn_start, 0), len(ctx.messages))
        items, _ = make_valid(as_items(ctx.messages[start:]))
        trimmed = len(ctx.messages) - len(items)
        return Window(items=items, trimmed=trimmed, tokens=estimate_window_tokens(ctx, items))

    def plans_after_turn(self, config: Any) -> bool:
        return False

    def after_turn(self, ctx: WindowContext, window_tokens: int) -> SummarizePlan | None:
        return None

    def compress(self, ctx: WindowContext) -> CompactPlan:
        return CompactPlan(
            noop=True, message="none never compresses: only the current turn goes to the model"
        )
