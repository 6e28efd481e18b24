"""The built-in ``search_history`` tool: the model looks up what left its window.

Offered when an agent lists ``{"name": "search_history"}`` in its tools; answered by the
proxy in hidden rounds like ``fetch_tool_result`` (``proxy/tools/builtin.py``). Two
uses, one tool:

- ``{"query": "words"}``: the session's stored messages that the window does not send
  whole (trimmed, summarized, compacted, evicted, compressed, truncated) and that hold
  any of the words, best first (``Store.search_messages``), at most ``MAX_MATCHES``, each
  as ``[seq N, role] excerpt``;
- ``{"seq": N}``: one stored message of the session in full (its original, never a stub).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from proxy.surfaces.tool_calls import arguments_of
from storage.base import Store
from storage.search import WORD, query_words, searchable_text
from strategies.compression import content_text
from strategies.records import StoredMessage

if TYPE_CHECKING:
    from proxy.tools.builtin import Offered

__all__ = ["HISTORY_TOOL", "TOOL_DEFINITION", "answer"]

HISTORY_TOOL = "search_history"
MAX_MATCHES = 5
EXCERPT_CHARS = 240
# an excerpt starts this many characters before the first word it matched
EXCERPT_LEAD = 60
TOOL_DEFINITION: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": HISTORY_TOOL,
        "description": (
            "Search the earlier messages of this conversation that are no longer in your "
            "context (dropped, summarized or shortened to save space) for words. Returns the "
            "best matches as short excerpts with their seq and role. Pass seq instead of "
            "query to read one message in full."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "Words to look for."},
                "seq": {
                    "type": "integer",
                    "description": "The seq of one message to read in full.",
                },
            },
            "additionalProperties": False,
        },
    },
}
USAGE = f'{HISTORY_TOOL} needs {{"query": "<words>"}} or {{"seq": <seq of a match>}}.'


def excerpt(text: str, words: list[str]) -> str:
    """About ``EXCERPT_CHARS`` of ``text`` around the first of ``words`` it holds, on
    one line, with an ellipsis where it was cut."""
    wanted = set(words)
    start = 0
    for match in WORD.finditer(text):
        if match.group().casefold() in wanted:
            start = max(0, match.start() - EXCERPT_LEAD)
            break
    piece = " ".join(text[start : start + EXCERPT_CHARS].split())
    cut_end = start + EXCERPT_CHARS < len(text)
    return ("…" if start else "") + piece + ("…" if cut_end else "")


def whole(message: StoredMessage) -> str:
    head = f"[seq {message.seq}, {message.role}"
    if message.tool_call_id:
        head += f", answers {message.tool_call_id}"
    lines = [head + "]", content_text(message.content)]
    for call in message.tool_calls or ():
        function = call.get("function") or {}
        lines.append(f"[calls {function.get('name')}({function.get('arguments') or ''})]")
    return "\n".join(line for line in lines if line)


def requested_seq(value: Any) -> int | None:
    if isinstance(value, str) and re.fullmatch(r"\s*\d+\s*", value):
        value = int(value)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


async def answer(store: Store, offered: Offered, call: dict[str, Any]) -> str:
    arguments = arguments_of(call)
    seq = requested_seq(arguments.get("seq"))
    if seq is not None:
        found = await store.get_messages(offered.key, [seq]) if seq > 0 else []
        if not found:
            return f"No message with seq {seq} is stored in this session."
        return whole(found[0])
    query = arguments.get("query")
    words = query_words(query) if isinstance(query, str) else []
    if not words:
        return USAGE
    matches = await store.search_messages(
        offered.key, words, exclude=sorted(offered.in_window), limit=MAX_MATCHES
    )
    if not matches:
        return f'No earlier message outside your context matches "{query}".'
    lines = [f'{len(matches)} earlier message(s) outside your context match "{query}", '
             "best first:"]  # fmt: skip
    lines += [f"[seq {m.seq}, {m.role}] {excerpt(searchable_text(m), words)}" for m in matches]
    lines.append(f'Call {HISTORY_TOOL} with {{"seq": <seq>}} to read one in full.')
    return "\n".join(lines)
