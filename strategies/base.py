"""The Strategy port: data in, decisions out. No I/O.

A turn goes: ``load_spec`` (what the proxy loads) -> ``select`` (the window to send)
-> after the response, ``after_turn`` (what to summarize or compact, if anything).
The Compact action calls ``compress``. The proxy performs every store and model call
the decisions ask for.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from strategies.config import MemoryConfig
from strategies.records import LoadSpec, StoredMessage, SummaryRecord

Marker = Literal["compressed", "truncated", "evicted"]
Placement = Literal["SYSTEM_PROMPT", "USER_MESSAGE"]
CountTokens = Callable[[str], int]


def rough_tokens(text: str) -> int:
    """A tokenizer-free estimate: the counter of a context built without one."""
    return max(1, len(text) // 4)


@dataclass(slots=True)
class WindowContext:
    """What a strategy sees of a session for one decision.

    ``messages`` are the loaded active messages, ascending; the current turn is
    ``messages[current_turn_start:]`` (it starts at the latest user message; 0 when the
    log has none). ``system_tokens`` is the system prompt's size. ``count_tokens`` is a
    pure tokenizer for text the strategy produces (stubs, truncations); stored messages
    carry their own ``tokens``. ``calibration`` scales estimates to the upstream's real
    counts (real / estimated).
    """

    config: MemoryConfig
    context_window: int
    messages: list[StoredMessage]
    summaries: list[SummaryRecord] = field(default_factory=list)
    system_tokens: int = 0
    current_turn_start: int = 0
    count_tokens: CountTokens = rough_tokens
    calibration: float = 1.0


@dataclass(slots=True)
class WindowItem:
    """A stored message as it goes into the window: ``text`` replaces its content when a
    strategy shrank it (``marker`` says how); ``tokens`` is its size as sent."""

    message: StoredMessage
    tokens: int
    text: str | None = None
    marker: Marker | None = None


@dataclass(slots=True)
class Window:
    """A strategy's decision for one request."""

    items: list[WindowItem]
    summaries: list[SummaryRecord] = field(default_factory=list)
    summary_placement: Placement = "SYSTEM_PROMPT"
    # loaded or stored messages left out of the window (trimmed, fallen off, compacted)
    trimmed: int = 0
    # compression stubs to persist losslessly (seq -> stub) before the window is sent
    new_stubs: dict[int, str] = field(default_factory=dict)
    # estimated tokens of everything sent: system prompt, summaries, items
    tokens: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def modified(self) -> bool:
        """True when anything was trimmed, compressed, truncated, evicted or summarized."""
        return bool(self.trimmed or self.summaries or any(i.marker for i in self.items))


@dataclass(slots=True)
class SummarizePlan:
    """Summarize ``messages`` (stored seqs ``from_seq..to_seq``) into one record of
    ``kind``; ``previous`` is the summary it builds on (its text goes into the prompt)."""

    kind: Literal["summary", "compaction"]
    from_seq: int
    to_seq: int
    messages: list[StoredMessage]
    previous: SummaryRecord | None = None
    reason: str = ""


@dataclass(slots=True)
class CompactPlan:
    """What the Compact action does for a strategy: summaries to write and stubs to persist.
    An empty plan (``noop``) means the strategy never compresses."""

    summarize: list[SummarizePlan] = field(default_factory=list)
    new_stubs: dict[int, str] = field(default_factory=dict)
    noop: bool = False
    message: str = ""


class Strategy(Protocol):
    kind: str

    def load_spec(self, config: Any) -> LoadSpec:
        """What to load for a turn (bounded: cost follows the window, not the history)."""

    def select(self, ctx: WindowContext) -> Window:
        """Choose and shape the window. Must return a valid window (see validity.py)."""

    def plans_after_turn(self, config: Any) -> bool:
        """Whether ``after_turn`` can return a plan under ``config`` at all: when it cannot,
        the caller skips building its context after every turn."""

    def after_turn(self, ctx: WindowContext, window_tokens: int) -> SummarizePlan | None:
        """After a response: the summarization or compaction to run now, if any.
        ``window_tokens`` is the live window's measured size (calibrated)."""

    def compress(self, ctx: WindowContext) -> CompactPlan:
        """The Compact action's plan."""
