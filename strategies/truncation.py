"""summarizing_window's message cap: a single message above ``maxMessageRatio`` of the
context window is cut in the window (never in the store), with a visible marker line.

The same message is cut again in every window it is part of, and finding the cut is a
binary search that hashes a dozen prefixes of the text even when the counter remembers
their sizes. The cut is a pure function of the text, the message's size, the limit and
the counter, and the limit stays on ``message_cap``'s grid from one turn to the next, so
recent cuts are remembered (``CutMemory``), bounded by the characters they hold.
"""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict

from strategies.base import CountTokens, WindowItem
from strategies.compression import content_text, head_within
from strategies.config import SummarizingWindowConfig

# truncation lengths move in steps of 1/50 of the cap (see message_cap)
STEADY_GRID = 50
# characters of texts and their cuts remembered, all sessions together
CUT_MEMORY_CHARS = 4_000_000

Cut = tuple[str, int] | None
_CutKey = tuple[str, int, int, CountTokens]


def message_cap(
    config: SummarizingWindowConfig, context_window: int, calibration: float
) -> tuple[int, int]:
    """maxMessageRatio of the context window in estimated tokens, and the size a message
    above it is cut to: the cap rounded down to a grid of 1/50 of the uncalibrated cap.

    The cap moves with the calibration factor, which changes a little with every
    response; on the grid the cut text mostly stays the same from one turn to the next,
    so the remembered cut (and the counter's memory) serves it instead of cutting the
    message again."""
    return _message_cap(config.maxMessageRatio, context_window, calibration)


@functools.lru_cache(maxsize=1024)
def _message_cap(ratio: float, context_window: int, calibration: float) -> tuple[int, int]:
    # remembered: a turn asks for its session's calibration and the one before (a round
    # to 6 digits alone costs more than the lookup)
    raw = round(ratio * context_window, 6)
    cap = int(raw / calibration)
    return cap, cap - cap % max(1, int(raw) // STEADY_GRID)


def truncate_item(item: WindowItem, limit: int, count_tokens: CountTokens) -> WindowItem:
    """``item`` with its text cut so the whole message is at most ``limit`` tokens, with a
    visible marker line. Tool calls are untouched; an item whose text cannot shrink it
    enough (the size is in its tool calls) is returned as is."""
    cut = CUTS.cut(content_text(item.message.content), item.tokens, limit, count_tokens)
    if cut is None:
        return item
    new_text, tokens = cut
    return WindowItem(message=item.message, tokens=tokens, text=new_text, marker="truncated")


def cut_text(text: str, tokens: int, limit: int, count_tokens: CountTokens) -> Cut:
    """The cut of a message of ``text`` and ``tokens`` to ``limit``: the new text and the
    message's size with it, or None when the text cannot shrink it enough."""
    text_tokens = count_tokens(text)
    overhead = max(0, tokens - text_tokens)
    marker = f"\n[… truncated by memory-proxy: {text_tokens} of {text_tokens} tokens shown]"
    room = limit - overhead - count_tokens(marker)
    if room <= 0 or text_tokens <= room:
        return None
    kept = head_within(text, room, count_tokens)
    shown = count_tokens(kept)
    new_text = f"{kept}\n[… truncated by memory-proxy: {shown} of {text_tokens} tokens shown]"
    return new_text, overhead + count_tokens(new_text)


class CutMemory:
    """Recent ``cut_text`` results, least recently used out first once the texts and cuts
    held pass ``max_chars``. Keyed by the arguments themselves (the text, not its hash),
    so a remembered cut is always the one ``cut_text`` would compute."""

    def __init__(self, max_chars: int = CUT_MEMORY_CHARS) -> None:
        self.max_chars = max_chars
        self._entries: OrderedDict[_CutKey, Cut] = OrderedDict()
        self._chars = 0
        self._lock = threading.Lock()

    def cut(self, text: str, tokens: int, limit: int, count_tokens: CountTokens) -> Cut:
        key = (text, tokens, limit, count_tokens)
        try:
            with self._lock:
                if key in self._entries:
                    self._entries.move_to_end(key)
                    return self._entries[key]
        except TypeError:  # an unhashable counter: nothing to remember the cut by
            return cut_text(text, tokens, limit, count_tokens)
        cut = cut_text(text, tokens, limit, count_tokens)
        size = _chars(key, cut)
        if size <= self.max_chars:
            with self._lock:
                if key not in self._entries:
                    self._entries[key] = cut
                    self._chars += size
                    while self._chars > self.max_chars:
                        old_key, old_cut = self._entries.popitem(last=False)
                        self._chars -= _chars(old_key, old_cut)
        return cut

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def chars(self) -> int:
        return self._chars


def _chars(key: _CutKey, cut: Cut) -> int:
    return len(key[0]) + (len(cut[0]) if cut is not None else 0)


CUTS = CutMemory()
