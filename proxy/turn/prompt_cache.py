"""How warm the provider's prompt cache ran: cached tokens read from the upstream's usage,
the window each reply answered, and where the proxy itself changed the prefix.

Both ride on the reply's record (its ``meta``), written in the turn's one append:

- ``meta["window"]``: the window the reply answered: ``start`` (seq of its first message;
  summarizing_window's stable prefix reads it back, strategies/summarizing_window.py),
  ``end`` (its last), ``tokens`` (estimated), ``summary`` (id of the summary sent, 0),
  ``marked`` (the newest seq sent as a compression or eviction stub, 0), ``system`` (a
  hash of the system prompt and tools) and ``changes``: where and why this window's prefix
  differs from the one before (``prefix_changes``).
- ``meta["cache"]``: ``prompt``, ``cached`` and ``written`` tokens as the upstream reported
  them (``cache_usage``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from strategies.base import Window
from strategies.records import StoredMessage
from strategies.summarizing_window import CACHE_META, WINDOW_META

__all__ = [
    "CACHE_META", "WINDOW_META", "cache_usage", "change_header", "changed_index",
    "prefix_changes", "previous_window", "session_view", "system_hash", "window_meta",
]
REASONS = ("client", "summary", "trim", "compression", "eviction")


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def cache_usage(usage: Mapping[str, Any] | None) -> dict[str, int] | None:
    """``{"prompt", "cached", "written"}`` from a usage object: OpenAI's
    ``prompt_tokens_details.cached_tokens``, Anthropic's ``cache_read_input_tokens`` and
    ``cache_creation_input_tokens`` (litellm passes both through), Gemini's
    ``cachedContentTokenCount`` (top level or under ``usageMetadata``). None without usage."""
    if not isinstance(usage, Mapping):
        return None
    details = usage.get("prompt_tokens_details")
    gemini = usage.get("usageMetadata")
    cached = max(
        _int(details.get("cached_tokens")) if isinstance(details, Mapping) else 0,
        _int(usage.get("cache_read_input_tokens")),
        _int(usage.get("cachedContentTokenCount")),
        _int(gemini.get("cachedContentTokenCount")) if isinstance(gemini, Mapping) else 0,
    )
    prompt = _int(usage.get("prompt_tokens")) or _int(usage.get("input_tokens"))
    return {
        "prompt": prompt,
        "cached": cached,
        "written": _int(usage.get("cache_creation_input_tokens")),
    }


def system_hash(system: Sequence[Mapping[str, Any]] | None, tools: Any) -> str:
    """A short hash of what precedes the conversation: the system prompt and the tools."""
    raw = orjson.dumps([list(system or ()), tools or []], option=orjson.OPT_SORT_KEYS)
    return hashlib.blake2b(raw, digest_size=8).hexdigest()


def previous_window(messages: Sequence[StoredMessage]) -> dict[str, Any] | None:
    """The window meta of the session's latest reply (None when it has none)."""
    for message in reversed(messages):
        if message.role == "assistant":
            window = message.meta.get(WINDOW_META) if message.meta else None
            return window if isinstance(window, dict) else None
    return None


def window_meta(window: Window, system: str) -> dict[str, Any]:
    items = window.items
    marked = [
        i.message.seq
        for i in items
        if i.marker is not None and i.marker in ("compressed", "evicted")
    ]
    return {
        "start": items[0].message.seq if items else 0,
        "end": items[-1].message.seq if items else 0,
        "tokens": window.tokens,
        "summary": window.summaries[-1].id if window.summaries else 0,
        "marked": max(marked, default=0),
        "system": system,
    }


def prefix_changes(
    previous: Mapping[str, Any] | None,
    current: Mapping[str, Any],
    window: Window,
    *,
    rewound_after: int | None = None,
    earlier: bool = False,
) -> list[dict[str, Any]]:
    """Where and why the prefix sent now differs from the previous request's, earliest
    first: ``{"reason", "seq"}`` with reason ``client`` (the system prompt or tools
    changed, seq 0; or the client rewound its history, seq the first message dropped),
    ``summary`` (another summary is sent), ``trim`` (the window starts elsewhere: seq the
    new start), ``compression`` / ``eviction`` (a message the previous request sent whole
    goes as a stub now: seq the oldest). Empty when the new request extends the last one
    (the cache can serve its whole prefix) or the session has no earlier request
    (``earlier`` false). When the previous reply is not among the loaded messages (a
    compaction's boundary passed it) the window restarted: from its summary, or trimmed."""
    if previous is None:
        if not earlier:
            return []
        if current["summary"]:
            return [{"reason": "summary", "seq": 0}]
        return [{"reason": "trim", "seq": current["start"]}]
    changes: list[dict[str, Any]] = []
    if previous.get("system") != current["system"]:
        changes.append({"reason": "client", "seq": 0})
    if rewound_after is not None:
        changes.append({"reason": "client", "seq": rewound_after + 1})
    if previous.get("summary") != current["summary"]:
        changes.append({"reason": "summary", "seq": 0})
    if previous.get("start") != current["start"]:
        changes.append({"reason": "trim", "seq": current["start"]})
    end, marked = _int(previous.get("end")), _int(previous.get("marked"))
    for marker, reason in (("compressed", "compression"), ("evicted", "eviction")):
        seqs = [
            i.message.seq
            for i in window.items
            if i.marker == marker and marked < i.message.seq <= end
        ]
        if seqs:
            changes.append({"reason": reason, "seq": min(seqs)})
    return changes


def changed_index(
    window: Window, rendered: Sequence[Any], changes: Sequence[Mapping[str, Any]]
) -> int | None:
    """Index in ``rendered`` (the messages sent) of the first message a compression or an
    eviction changed since the previous request; None when there is none (a change of the
    system prompt, the summary or the start changes everything after the system block)."""
    seqs = [c["seq"] for c in changes if c["reason"] in ("compression", "eviction")]
    if not seqs or len(changes) != len(seqs):
        return None
    first = min(seqs)
    cut = len(rendered) - len(window.items)
    return next(
        (cut + i for i, item in enumerate(window.items) if item.message.seq >= first), None
    )


def change_header(changes: Sequence[Mapping[str, Any]]) -> str:
    """``X-Memory-Prefix-Change``: ``none``, or ``reason@seq`` items joined by commas."""
    return ",".join(f"{c['reason']}@{c['seq']}" for c in changes) or "none"


def session_view(messages: Sequence[StoredMessage]) -> dict[str, Any]:
    """Per reply of the loaded messages: its seq, the window it answered (tokens, start,
    prefix changes) and the upstream's cache numbers; with totals over them."""
    turns: list[dict[str, Any]] = []
    totals = {"prompt": 0, "cached": 0, "written": 0, "prefix_changes": 0}
    for message in messages:
        meta = message.meta if message.role == "assistant" else None
        window = meta.get(WINDOW_META) if meta else None
        cache = meta.get(CACHE_META) if meta else None
        if not isinstance(window, dict) and not isinstance(cache, dict):
            continue
        window = window if isinstance(window, dict) else {}
        cache = cache if isinstance(cache, dict) else {}
        entry: dict[str, Any] = {
            "seq": message.seq,
            "window_tokens": _int(window.get("tokens")),
            "window_start": _int(window.get("start")),
            "prompt_tokens": _int(cache.get("prompt")),
            "cached_tokens": _int(cache.get("cached")),
            "cache_write_tokens": _int(cache.get("written")),
            "prefix_changes": list(window.get("changes") or ()),
        }
        turns.append(entry)
        totals["prompt"] += entry["prompt_tokens"]
        totals["cached"] += entry["cached_tokens"]
        totals["written"] += entry["cache_write_tokens"]
        totals["prefix_changes"] += bool(entry["prefix_changes"])
    return {
        "turns": turns,
        "totals": {
            "requests": len(turns),
            "prompt_tokens": totals["prompt"],
            "cached_tokens": totals["cached"],
            "cache_write_tokens": totals["written"],
            "cached_share": round(totals["cached"] / totals["prompt"], 4)
            if totals["prompt"]
            else 0.0,
            "requests_with_prefix_change": totals["prefix_changes"],
        },
    }
