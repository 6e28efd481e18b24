"""Prometheus counters, kept in-process (text exposition at ``GET /metrics``)."""

from __future__ import annotations

from collections import Counter

from starlette.requests import Request
from starlette.responses import PlainTextResponse

COUNTERS: Counter[tuple[str, tuple[tuple[str, str], ...]]] = Counter()
HELP = {
    "memory_proxy_turns_total": "Chat turns stored, by strategy.",
    "memory_proxy_window_tokens_total": "Estimated tokens sent upstream in windows.",
    "memory_proxy_context_modified_total": (
        "Turns whose window was trimmed, compressed or summarized."
    ),
    "memory_proxy_summaries_total": "Summaries and compactions written, by kind.",
    "memory_proxy_errors_total": "Errors answered, by type.",
}


def inc(name: str, value: float = 1, **labels: str) -> None:
    COUNTERS[(name, tuple(sorted(labels.items())))] += value  # type: ignore[assignment]


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


async def metrics_endpoint(request: Request) -> PlainTextResponse:
    return PlainTextResponse(render(), media_type="text/plain; version=0.0.4")
