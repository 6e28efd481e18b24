"""What every part of bench/RESULTS.md shares: its cells and tables, and the name of the
throughput phase's extra row."""

from __future__ import annotations

from typing import Any

# the throughput phase's extra row: C's own server with ``x-memory: off`` on every request
HTTP_ONLY = "C-off"


def ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} ms"


def verdict(ok: bool | None) -> str:
    return {True: "met", False: "**not met**", None: "n/a"}[ok]


def table(head: list[str], rows: list[list[Any]]) -> list[str]:
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return [*out, ""]
