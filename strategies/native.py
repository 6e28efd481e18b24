"""Native parts: an API's own block kept verbatim inside a stored message's content (pure).

A stored message's content is OpenAI chat content. What one API carries that chat has no
form for is kept as a native part in the content list::

    {"type": "native", "api": "messages", "item": {"type": "thinking", "thinking": "…",
                                                   "signature": "…"}}

- ``api: "messages"``: Anthropic blocks (``thinking`` and ``redacted_thinking`` with their
  signatures, server-tool blocks such as ``server_tool_use`` and ``web_search_tool_result``);
- ``api: "responses"``: Responses API items (``reasoning`` with ``encrypted_content``,
  built-in tool call items).

The rules every module holds them to:

- **Byte-exact.** ``item`` is stored and sent as received; nothing rewrites it.
- **Never apart from their turn.** They live in their message's content, so a message is
  kept or dropped (trimmed, summarized) with them; a message the strategy shrank
  (truncated, compressed, evicted) is rendered with its native parts before the shrunk
  text (``with_text``); summaries and stubs are made of the text, never of them
  (``strategies.compression.content_text`` skips them).
- **Not part of a message's identity.** The fingerprints and chains history sync matches
  a resent history by leave them out (``without``): a client of another API, which never
  saw them, resends the same message.
- **Counted.** ``count`` gives their size to the token counter.
- **Sent only to their API.** ``for_api(content, api)`` removes other APIs' native parts
  when a window is rendered; the chat surface removes all of them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

NativeApi = Literal["messages", "responses"]
NATIVE = "native"
MESSAGES: NativeApi = "messages"
RESPONSES: NativeApi = "responses"
APIS: frozenset[str] = frozenset((MESSAGES, RESPONSES))

# item fields that hold opaque payloads (signatures, encrypted state): counted by size,
# never tokenized as text
_OPAQUE_FIELDS = ("signature", "data", "encrypted_content")
# characters per token of an opaque (base64) payload
_OPAQUE_CHARS_PER_TOKEN = 4


def part(api: NativeApi, item: Mapping[str, Any]) -> dict[str, Any]:
    """The native part holding ``item`` of ``api`` (the item itself, not a copy)."""
    return {"type": NATIVE, "api": api, "item": item}


def is_native(value: Any) -> bool:
    return isinstance(value, Mapping) and value.get("type") == NATIVE


def has_native(content: Any) -> bool:
    return isinstance(content, list) and any(is_native(p) for p in content)


def natives(content: Any, api: str | None = None) -> list[dict[str, Any]]:
    """The native parts of ``content`` (of ``api`` only, when given), in order."""
    if not isinstance(content, list):
        return []
    return [p for p in content if is_native(p) and (api is None or p.get("api") == api)]


def items(content: Any, api: str) -> list[dict[str, Any]]:
    """The items of ``content``'s native parts of ``api``, in order."""
    return [p["item"] for p in natives(content, api) if isinstance(p.get("item"), Mapping)]


def without(content: Any) -> Any:
    """``content`` without its native parts (itself when it holds none): what a message
    is without them. Content left empty is ``""``."""
    if not has_native(content):
        return content
    rest = [p for p in content if not is_native(p)]
    return rest if rest else ""


def for_api(content: Any, api: str | None) -> Any:
    """``content`` as sent to ``api``: native parts of other APIs removed (all of them for
    ``api`` None or ``"chat"``). Content left as plain text parts becomes one string;
    content with nothing to remove is returned as it is."""
    if not has_native(content):
        return content
    kept = [p for p in content if not is_native(p) or p.get("api") == api]
    if len(kept) == len(content):
        return content
    if not kept:
        return ""
    if all(_plain_text(p) for p in kept):
        return "\n".join(str(p["text"]) for p in kept)
    return kept


def plain_for_api(content: list[Any], api: str | None) -> Any:
    """``for_api(content, api)`` when ``content`` holds only text and native parts (the
    common list: a reply with its reasoning or thinking), in one pass; ``None`` when it
    holds anything else (media, other parts), which the caller renders in full."""
    other = 0
    for p in content:
        if type(p) is not dict:
            return None
        kind = p.get("type")
        if kind == NATIVE:
            if p.get("api") != api:
                other += 1
        elif kind != "text":
            return None
    if not other:
        return content
    kept = [p for p in content if p.get("type") != NATIVE or p.get("api") == api]
    if not kept:
        return ""
    if all(p.keys() == {"type", "text"} for p in kept):
        return "\n".join(str(p["text"]) for p in kept)
    return kept


def with_text(text: str, original: Any, rest: Sequence[Any] | None = None) -> Any:
    """The content of a message the strategy shrank to ``text``: the original's native
    parts first (a thinking block opens its message), then the text (or ``rest``, the
    shrunk content parts, when given). ``text`` alone when the original held none."""
    kept = natives(original)
    if not kept:
        return list(rest) if rest is not None else text
    tail = list(rest) if rest is not None else ([{"type": "text", "text": text}] if text else [])
    return [*kept, *tail]


def count(value: Mapping[str, Any], count_text: Callable[[str], int]) -> int:
    """Tokens of one native part: its text by ``count_text``, opaque payloads by size."""
    item = value.get("item")
    if not isinstance(item, Mapping):
        return 0
    opaque = sum(len(v) for k, v in item.items() if k in _OPAQUE_FIELDS and isinstance(v, str))
    tokens = -(-opaque // _OPAQUE_CHARS_PER_TOKEN)
    kind = item.get("type")
    if kind == "thinking":
        return tokens + count_text(str(item.get("thinking") or ""))
    if kind == "redacted_thinking":
        return tokens
    rest = {k: v for k, v in item.items() if k not in _OPAQUE_FIELDS}
    return tokens + count_text(json.dumps(rest, ensure_ascii=False, separators=(",", ":")))


def describe(value: Mapping[str, Any]) -> str:
    """One line naming a native part (working-memory and transcript views)."""
    item = value.get("item")
    item = item if isinstance(item, Mapping) else {}
    kind = str(item.get("type") or "item")
    details: list[str] = []
    if kind == "thinking":
        details.append(f"{len(str(item.get('thinking') or ''))} chars")
    if kind == "reasoning":
        summary = item.get("summary")
        if isinstance(summary, list) and summary:
            details.append(f"{len(summary)} summary parts")
    if item.get("name"):
        details.append(str(item["name"]))
    if any(isinstance(item.get(k), str) for k in _OPAQUE_FIELDS):
        details.append("signed" if kind == "thinking" else "opaque")
    shown = f"{value.get('api')} {kind}"
    return f"[{shown}: {', '.join(details)}]" if details else f"[{shown}]"


def _plain_text(value: Any) -> bool:
    return isinstance(value, Mapping) and value.keys() == {"type", "text"} and (
        value["type"] == "text"
    )
