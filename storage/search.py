"""Words of stored messages, shared by the backends' ``Store.search_messages``.

SQLite indexes ``searchable_text`` in an FTS5 table and ranks with bm25; Redis scores
the newest messages of a session here (``score``). Both match the same words: runs of
letters and digits, case-folded.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Sequence

from strategies.compression import content_text
from strategies.records import StoredMessage

__all__ = ["query_words", "score", "searchable_text"]

# letters and digits (no underscore): the words of SQLite FTS5's unicode61 tokenizer
WORD = re.compile(r"[^\W_]+")
# a query is cut to this many distinct words (the model writes a few keywords)
MAX_QUERY_WORDS = 16


def searchable_text(message: StoredMessage) -> str:
    """The text a message is found by: its original content (never a stub) and, for an
    assistant's tool calls, their names and arguments."""
    text = content_text(message.content)
    for call in message.tool_calls or ():
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            text += f"\n{function.get('name') or ''} {function.get('arguments') or ''}"
    return text


def query_words(query: str) -> list[str]:
    """The distinct words of a query, case-folded, in order, at most ``MAX_QUERY_WORDS``."""
    out: list[str] = []
    for word in WORD.findall(query.casefold()):
        if word not in out:
            out.append(word)
    return out[:MAX_QUERY_WORDS]


def score(text: str, words: Sequence[str]) -> float:
    """How well ``text`` matches ``words`` (0: no word matches): each word found whole
    adds one, plus a little for repeats, less in long texts (a rough bm25). Repeats are
    counted as substrings: a plain count is a tenth of the time of a word-by-word scan."""
    if not words:
        return 0.0
    folded = text.casefold()
    # about six characters a word: the text's length in words without splitting it
    length = 1.0 + math.log1p(len(folded) // 600)
    total = 0.0
    for word in words:
        seen = folded.count(word)
        if seen and _whole(word).search(folded):
            total += 1.0 + math.log1p(seen) / length
    return total


@functools.lru_cache(maxsize=1024)
def _whole(word: str) -> re.Pattern[str]:
    """``word`` with no letter or digit either side."""
    return re.compile(rf"(?<![^\W_]){re.escape(word)}(?![^\W_])")
