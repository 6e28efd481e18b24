"""A Messages API reply, whole or streamed, read into the record the proxy stores (pure).

``MessageAccumulator`` takes a streamed reply's events (``message_start``,
``content_block_start``, ``content_block_delta`` with ``text_delta``,
``input_json_delta``, ``thinking_delta``, ``signature_delta`` and ``citations_delta``,
``content_block_stop``, ``message_delta``, ``message_stop``, ``ping``, ``error``) or one
whole message (``add_message``) and gives back the message as the client received it
(``message()``), the record to store (``record()``: chat form, as
proxy/surfaces/messages_request.py reads a resent assistant message, so the client's next
request matches it) and the usage in the form the turn's write reads (``store_usage``).

A 200 that is not a message, or a stream that ends without ``message_stop``, is the
upstream's failure: ``UpstreamReplyError`` (nothing is stored).
"""

from __future__ import annotations

from typing import Any

import orjson

from proxy.errors import UpstreamReplyError
from proxy.surfaces.messages_request import assistant_message

NOT_A_MESSAGE = "upstream sent a reply that is not a Messages API message"


def record_of(message: dict[str, Any]) -> dict[str, Any]:
    """The stored form of an assistant message (its ``content`` blocks)."""
    content = message.get("content")
    blocks = [b for b in content if isinstance(b, dict) and isinstance(b.get("type"), str)] \
        if isinstance(content, list) else []
    return assistant_message(blocks)


def store_usage(usage: dict[str, Any] | None) -> dict[str, Any] | None:
    """Anthropic's usage with the chat form's totals added: ``prompt_tokens`` is every
    input token (cached, written to the cache, and not), ``completion_tokens`` the output."""
    if not isinstance(usage, dict):
        return None
    prompt = sum(
        usage[k] for k in ("input_tokens", "cache_read_input_tokens",
                           "cache_creation_input_tokens")
        if isinstance(usage.get(k), int)
    )
    out = dict(usage)
    out["prompt_tokens"] = prompt
    if isinstance(usage.get("output_tokens"), int):
        out["completion_tokens"] = usage["output_tokens"]
    return out


def message_of(body: bytes) -> dict[str, Any]:
    """The message in an upstream's 200 body; anything else raises ``UpstreamReplyError``."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise UpstreamReplyError(f"{NOT_A_MESSAGE} (not JSON)") from None
    if not isinstance(data, dict) or data.get("type") != "message" or not isinstance(
        data.get("content"), list
    ):
        raise UpstreamReplyError(f"{NOT_A_MESSAGE} (no message with content)")
    return data


class MessageAccumulator:
    """Feed it the events of a streamed reply (``add_event``, their JSON data) or a whole
    message (``add_message``)."""

    def __init__(self) -> None:
        self._message: dict[str, Any] | None = None
        self._blocks: dict[int, dict[str, Any]] = {}
        self._json: dict[int, list[str]] = {}
        self.usage: dict[str, Any] = {}
        self.stop_reason: str | None = None
        self.complete = False
        self.error: Any = None

    def add_message(self, message: dict[str, Any]) -> None:
        self._message = message
        self.usage = dict(message.get("usage") or {})
        self.stop_reason = message.get("stop_reason")
        self.complete = True

    def add_data(self, data: bytes) -> dict[str, Any]:
        """One event's data; junk raises ``UpstreamReplyError``."""
        try:
            event = orjson.loads(data)
        except orjson.JSONDecodeError:
            event = None
        if not isinstance(event, dict) or not isinstance(event.get("type"), str):
            raise UpstreamReplyError(f"{NOT_A_MESSAGE} (a stream event that is not JSON)")
        try:
            self.add_event(event)
        except (AttributeError, KeyError, TypeError):
            raise UpstreamReplyError(f"{NOT_A_MESSAGE} (a malformed event)") from None
        return event

    def add_event(self, event: dict[str, Any]) -> None:
        kind = event["type"]
        if kind == "message_start":
            message = dict(event["message"])
            message["content"] = []
            self._message = message
            self.usage = dict(message.get("usage") or {})
        elif kind == "content_block_start":
            index = int(event["index"])
            block = dict(event["content_block"])
            if block.get("type") in ("tool_use", "server_tool_use", "mcp_tool_use"):
                self._json[index] = []
            self._blocks[index] = block
        elif kind == "content_block_delta":
            self._delta(self._blocks[int(event["index"])], int(event["index"]), event["delta"])
        elif kind == "content_block_stop":
            index = int(event["index"])
            parts = self._json.pop(index, None)
            if parts is not None:
                raw = "".join(parts)
                try:
                    self._blocks[index]["input"] = orjson.loads(raw) if raw else (
                        self._blocks[index].get("input") or {})
                except orjson.JSONDecodeError:
                    raise UpstreamReplyError(f"{NOT_A_MESSAGE} (tool input is not JSON)"
                                             ) from None
        elif kind == "message_delta":
            delta = event.get("delta") or {}
            if delta.get("stop_reason"):
                self.stop_reason = delta["stop_reason"]
            usage = event.get("usage")
            if isinstance(usage, dict):
                self.usage.update({k: v for k, v in usage.items() if v is not None})
        elif kind == "message_stop":
            self.complete = True
        elif kind == "error":
            self.error = event.get("error")

    def _delta(self, block: dict[str, Any], index: int, delta: dict[str, Any]) -> None:
        kind = delta.get("type")
        if kind == "text_delta":
            block["text"] = block.get("text", "") + delta["text"]
        elif kind == "thinking_delta":
            block["thinking"] = block.get("thinking", "") + delta["thinking"]
        elif kind == "signature_delta":
            block["signature"] = block.get("signature", "") + delta["signature"]
        elif kind == "input_json_delta":
            self._json.setdefault(index, []).append(delta["partial_json"])
        elif kind == "citations_delta":
            block.setdefault("citations", []).append(delta["citation"])

    def message(self) -> dict[str, Any] | None:
        """The whole message as the client received it, or None before ``message_start``."""
        if self._message is None:
            return None
        if self._blocks or not self._message.get("content"):
            content = [self._blocks[i] for i in sorted(self._blocks)]
            return {**self._message, "content": content, "stop_reason": self.stop_reason,
                    "usage": self.usage}
        return self._message

    def record(self) -> dict[str, Any] | None:
        message = self.message()
        return record_of(message) if message is not None else None
