"""Stored message decoding shared by the backends: the hot loop of every load."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from strategies.records import StoredMessage

__all__ = ["message_from_body"]


def message_from_body(
    body: dict[str, Any], seq: int, chain: str, compressed: str | None
) -> StoredMessage:
    """A StoredMessage from its stored JSON object (as written by the backends) plus the
    fields the backend keeps beside it. Positional arguments: a third cheaper than
    keywords, and a turn may decode 500 messages."""
    get = body.get
    return StoredMessage(
        body["role"], get("content"), get("tokens", 0), get("fingerprint", ""),
        get("tool_calls"), get("tool_call_id"), get("name"), compressed, get("meta") or {},
        seq, chain, get("created_at", 0.0),
    )  # fmt: skip


if tuple(f.name for f in fields(StoredMessage) if f.init) != (
    "role", "content", "tokens", "fingerprint", "tool_calls", "tool_call_id", "name",
    "compressed_content", "meta", "seq", "chain", "created_at",
):  # fmt: skip
    raise ImportError("StoredMessage fields changed: update storage/codec.py message_from_body")
