"""What the memory-quality replay scores (bench/quality.py), per configuration (strategy x
context window): evidence recall in the window, exact (the evidence text verbatim in a
window message) and counting summary text (or in the summary sent); by distance (tokens
stored after the evidence when asked) and by question kind; what its verbatim budget allows
(the evidence within the newest messages the budget holds, a compressed result counting as
its stub); tokens sent per question; and the prompt cache hits of the replayed turns
(scored by the fake upstream, quality_upstream.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from quality_upstream import MODEL, CacheScore

from strategies.records import StoredMessage
from strategies.tokens import count_message

DISTANCES = ((2_000, "< 2k"), (8_000, "2k-8k"), (32_000, "8k-32k"), (math.inf, "32k+"))


@dataclass
class Score:
    """Per configuration: evidence counts by kind and distance, tokens per question."""

    evidence: int = 0
    exact: int = 0
    with_summary: int = 0
    allowed: int = 0
    by_kind: dict[str, list[int]] = field(default_factory=dict)  # kind -> [n, exact, summ]
    by_distance: dict[str, list[int]] = field(default_factory=dict)
    questions: int = 0
    window_tokens: int = 0
    over_window: int = 0
    checks: int = 0
    unchanged: int = 0
    cache: CacheScore = field(default_factory=CacheScore)

    def add(self, bucket: dict[str, list[int]], name: str, exact: bool, summary: bool) -> None:
        row = bucket.setdefault(name, [0, 0, 0])
        row[0] += 1
        row[1] += exact
        row[2] += summary

    def to_dict(self) -> dict[str, Any]:
        n = max(1, self.evidence)
        return {
            "evidence": self.evidence,
            "recall_exact": self.exact / n,
            "recall_with_summary": self.with_summary / n,
            "verbatim_budget_allows": self.allowed / n if self.allowed >= 0 else None,
            "by_kind": {k: {"n": v[0], "exact": v[1] / v[0], "with_summary": v[2] / v[0]}
                        for k, v in sorted(self.by_kind.items())},
            "by_distance": {k: {"n": v[0], "exact": v[1] / v[0], "with_summary": v[2] / v[0]}
                            for _, k in DISTANCES if (v := self.by_distance.get(k))},
            "questions": self.questions,
            "tokens_per_question": self.window_tokens / max(1, self.questions),
            "over_window": self.over_window,
            "store_checks": self.checks,
            "store_unchanged": self.unchanged,
            "cache": {"requests": self.cache.requests, "hits": self.cache.hits,
                      "prompt_tokens": self.cache.prompt_tokens,
                      "cached_tokens": self.cache.cached_tokens},
        }


def distance_name(tokens: int) -> str:
    return next(name for bound, name in DISTANCES if tokens < bound)


def allowed_index(budget: tuple[Any, ...] | None, stored: list[StoredMessage],
                  context_window: int, system_tokens: int) -> int | None:
    """The index of the oldest stored message the strategy's verbatim budget holds."""
    if budget is None:
        return None
    if budget[0] == "last":
        return max(0, len(stored) - budget[1])
    turn = max((i for i, m in enumerate(stored) if m.role == "user"), default=0)
    if budget[0] == "turn":
        return turn
    room = budget[1] * context_window - system_tokens
    index = len(stored)
    for i in range(len(stored) - 1, -1, -1):
        message = stored[i]
        size = message.tokens
        if message.compressed_content is not None:
            size = count_message({"role": message.role,
                                  "content": message.compressed_content}, MODEL)
        if i < turn and size > room:
            break
        room -= size
        index = i
    return index
