"""Strategy lookup by config ``kind``: import strings loaded on demand, one instance each."""

from __future__ import annotations

import functools
import importlib

from strategies.base import Strategy

STRATEGIES: dict[str, str] = {
    "summarizing_window": "strategies.summarizing_window:SummarizingWindowStrategy",
    "auto_compact": "strategies.auto_compact:AutoCompactStrategy",
    "windowed": "strategies.windowed:WindowedStrategy",
    "full": "strategies.full:FullStrategy",
    "none": "strategies.none:NoneStrategy",
}


class UnknownStrategyError(KeyError, ValueError):
    """No strategy of that kind; the message lists the known kinds."""

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0])


@functools.cache
def get_strategy(kind: str) -> Strategy:
    """The (stateless, shared) strategy for a memoryConfig ``kind``."""
    try:
        target = STRATEGIES[kind]
    except KeyError:
        raise UnknownStrategyError(
            f"unknown memory strategy kind {kind!r}: expected one of {', '.join(STRATEGIES)}"
        ) from None
    module_name, _, attr = target.partition(":")
    strategy: Strategy = getattr(importlib.import_module(module_name), attr)()
    return strategy
