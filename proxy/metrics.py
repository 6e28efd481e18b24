"""Prometheus counters, kept in-process (text exposition at ``GET /metrics``)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import PlainTextResponse

from storage.cached import CachedStore

Key = tuple[str, tuple[tuple[str, str], ...]]  # a counter's name and labels
COUNTERS: Counter[Key] = Counter()
HELP = {
    "memory_proxy_turns_total": "Chat turns stored, by strategy.",
    "memory_proxy_window_tokens_total": "Estimated tokens sent upstream in windows.",
    "memory_proxy_context_modified_total": (
        "Turns whose window was trimmed, compressed or summarized."
    ),
    "memory_proxy_summaries_total": "Summaries and compactions written, by kind.",
    "memory_proxy_errors_total": "Errors answered, by type.",
    "memory_proxy_prompt_tokens_total": "Prompt tokens the upstream reported, by strategy.",
    "memory_proxy_cached_tokens_total": (
        "Prompt tokens the upstream served from its prompt cache, by strategy."
    ),
    "memory_proxy_cache_write_tokens_total": (
        "Prompt tokens the upstream wrote to its prompt cache (Anthropic), by strategy."
    ),
    "memory_proxy_prefix_changes_total": (
        "Requests whose prefix the proxy changed against the one before, by strategy and "
        "reason (client, summary, trim, compression, eviction)."
    ),
}


def inc(name: str, value: float = 1, **labels: str) -> None:
    COUNTERS[(name, tuple(sorted(labels.items())))] += value  # type: ignore[assignment]


_TURN_KEYS: dict[str, tuple[Key, Key, Key]] = {}


def count_turn(strategy: str, window_tokens: int, modified: bool) -> None:
    """A stored turn's counters (every turn: their keys are built once per strategy)."""
    keys = _TURN_KEYS.get(strategy)
    if keys is None:
        labels = (("strategy", strategy),)
        keys = _TURN_KEYS[strategy] = (
            ("memory_proxy_turns_total", labels),
            ("memory_proxy_window_tokens_total", labels),
            ("memory_proxy_context_modified_total", labels),
        )
    COUNTERS[keys[0]] += 1
    COUNTERS[keys[1]] += window_tokens
    if modified:
        COUNTERS[keys[2]] += 1


def count_cache(
    strategy: str, cache: Mapping[str, int] | None, changes: Iterable[Mapping[str, Any]]
) -> None:
    """A turn's prompt-cache counters: the upstream's usage and the prefix changes."""
    if cache is not None:
        inc("memory_proxy_prompt_tokens_total", cache["prompt"], strategy=strategy)
        inc("memory_proxy_cached_tokens_total", cache["cached"], strategy=strategy)
        inc("memory_proxy_cache_write_tokens_total", cache["written"], strategy=strategy)
    for reason in {str(c["reason"]) for c in changes}:
        inc("memory_proxy_prefix_changes_total", strategy=strategy, reason=reason)


def render() -> str:
    lines: list[str] = []
    seen: set[str] = set()
    for (name, labels), value in sorted(COUNTERS.items()):
        if name not in seen:
            seen.add(name)
            lines.append(f"# HELP {name} {HELP.get(name, name)}")
            lines.append(f"# TYPE {name} counter")
        label_text = ",".join(f'{k}="{v}"' for k, v in labels)
        lines.append(f"{name}{{{label_text}}} {value}" if label_text else f"{name} {value}")
    return "\n".join(lines) + "\n"


def render_session_cache(sessions: object) -> str:
    """The session cache's counters, when the store is behind one (storage/cached.py)."""
    if not isinstance(sessions, CachedStore):
        return ""
    return "".join(
        f"# HELP {name} {text}\n# TYPE {name} {kind}\n{name} {value}\n"
        for name, kind, text, value in (
            ("memory_proxy_session_cache_hits_total", "counter",
             "Turns whose session was unchanged since this process last held it.",
             sessions.hits),
            ("memory_proxy_session_cache_misses_total", "counter",
             "Turns that read their session from the store.", sessions.misses),
            ("memory_proxy_session_cache_sessions", "gauge",
             "Sessions held decoded by this process.", len(sessions)),
            ("memory_proxy_session_cache_bytes", "gauge",
             "Estimated memory of the sessions held.", sessions.size),
        )
    )  # fmt: skip


async def metrics_endpoint(request: Request) -> PlainTextResponse:
    text = render() + render_session_cache(request.app.state.services.store)
    return PlainTextResponse(text, media_type="text/plain; version=0.0.4")
