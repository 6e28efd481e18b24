"""Memory strategies: pure decisions over loaded session data (no I/O).

``get_strategy(kind)`` returns the strategy for a memoryConfig ``kind``; each one turns a
``WindowContext`` into a ``Window`` that ``validity.make_valid`` has made safe to send.
"""

from strategies.base import (
    CompactPlan,
    Strategy,
    SummarizePlan,
    Window,
    WindowContext,
    WindowItem,
)
from strategies.config import MemoryConfig, MemoryConfigError, parse_memory_config
from strategies.registry import UnknownStrategyError, get_strategy

__all__ = [
    "CompactPlan",
    "MemoryConfig",
    "MemoryConfigError",
    "Strategy",
    "SummarizePlan",
    "UnknownStrategyError",
    "Window",
    "WindowContext",
    "WindowItem",
    "get_strategy",
    "parse_memory_config",
]
