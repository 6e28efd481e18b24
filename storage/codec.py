"""Stored message encoding and decoding shared by the backends (decoding is the hot loop
of every load)."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import orjson

from strategies.records import StoredMessage

__all__ = ["encode_message", "message_from_body", "message_from_placed_body"]


# the fields ``encode_message`` writes for every message
ALWAYS_WRITTEN = ("role", "content", "tokens", "fingerprint", "created_at")


def encode_message(message: StoredMessage, now: float) -> bytes:
    """The message's stored JSON object: seq, chain and compressed_content are kept beside
    it by each backend."""
    body: dict[str, Any] = {
        "role": message.role,
        "content": message.content,
        "tokens": message.tokens,
        "fingerprint": message.fingerprint,
        "created_at": message.created_at or now,
    }
    if message.tool_calls is not None:
        body["tool_calls"] = message.tool_calls
    if message.tool_call_id is not None:
        body["tool_call_id"] = message.tool_call_id
    if message.name is not None:
        body["name"] = message.name
    if message.meta:
        body["meta"] = message.meta
    return orjson.dumps(body)


def message_from_body(
    body: dict[str, Any], seq: int, chain: str, compressed: str | None
) -> StoredMessage:
    """A StoredMessage from its stored JSON object (as written by the backends) plus the
    fields the backend keeps beside it. Positional arguments: a third cheaper than
    keywords, and a cold turn may decode 2,000 messages."""
    if len(body) == len(ALWAYS_WRITTEN):
        # what ``encode_message`` always writes and nothing else (no tool calls, name or
        # meta: most messages), read without a lookup per absent field; a body of other
        # keys (one written before) fails a read and takes the general path
        try:
            return StoredMessage(
                body["role"], body["content"], body["tokens"], body["fingerprint"], None,
                None, None, compressed, {}, seq, chain, body["created_at"],
            )  # fmt: skip
        except KeyError:
            pass
    get = body.get
    return StoredMessage(
        body["role"], get("content"), get("tokens", 0), get("fingerprint", ""),
        get("tool_calls"), get("tool_call_id"), get("name"), compressed, get("meta") or {},
        seq, chain, get("created_at", 0.0),
    )  # fmt: skip


def message_from_placed_body(body: dict[str, Any], compressed: str | None) -> StoredMessage:
    """``message_from_body`` for a stored object that holds its own ``seq`` and ``chain``
    (Redis writes them into it), the same way: read whole when it holds just those and the
    fields every message has."""
    if len(body) == len(ALWAYS_WRITTEN) + 2:
        try:
            return StoredMessage(
                body["role"], body["content"], body["tokens"], body["fingerprint"], None,
                None, None, compressed, {}, body["seq"], body["chain"], body["created_at"],
            )  # fmt: skip
        except KeyError:
            pass
    return message_from_body(body, body["seq"], body.get("chain", ""), compressed)


if tuple(f.name for f in fields(StoredMessage) if f.init) != (
    "role", "content", "tokens", "fingerprint", "tool_calls", "tool_call_id", "name",
    "compressed_content", "meta", "seq", "chain", "created_at",
):  # fmt: skip
    raise ImportError("StoredMessage fields changed: update storage/codec.py message_from_body")
