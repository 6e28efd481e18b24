"""A fake Anthropic Messages API on loopback, for tests: the recording fake upstream
(proxy/testing/fake_upstream.py: server, script, pacing, cuts, disconnects) answering
``POST /v1/messages`` (JSON and Anthropic's stream events) and
``POST /v1/messages/count_tokens``.

    with FakeMessages() as fake:
        fake.queue(thinking(Reply.tool_calls([{"name": "ls", "arguments": {}}]), "I'll look"))
        client = anthropic.Anthropic(base_url=proxy_url, api_key="sk-ant-test")
        fake.message_requests[-1].body["messages"]

The scripted ``Reply``s are the chat fake's: text becomes a ``text`` block, tool calls
``tool_use`` blocks (their arguments the ``input``), ``thinking(reply, text)`` puts a
signed thinking block first. ``Reply.error(status, anthropic_error(status, "..."))``
answers in Anthropic's error shape. A reply's ``usage`` (Anthropic's fields) replaces the
default one.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import re
from dataclasses import dataclass, fields
from typing import Any

import orjson

from proxy.testing.fake_upstream import (
    _JSON,
    _SSE,
    FakeUpstream,
    Receive,
    RecordedRequest,
    Reply,
    Send,
    _respond,
)

__all__ = ["FakeMessages", "Thought", "anthropic_error", "thinking"]

_ids = itertools.count(1)
_WORDS = re.compile(r"\s*\S+\s*")
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
               403: "permission_error", 404: "not_found_error", 413: "request_too_large",
               429: "rate_limit_error", 500: "api_error", 529: "overloaded_error"}


def anthropic_error(status: int, message: str) -> bytes:
    """An error body in Anthropic's shape, its type the one Anthropic gives ``status``."""
    return orjson.dumps({"type": "error", "error": {
        "type": ERROR_TYPES.get(status, "api_error"), "message": message}})


@dataclass(frozen=True, slots=True)
class Thought(Reply):
    """A reply that opens with a thinking block (and its signature)."""

    thinking: str = ""
    signature: str = ""


def thinking(reply: Reply, text: str, *, signature: str | None = None) -> Thought:
    """``reply`` with a thinking block first; the signature defaults to a hash of it."""
    values = {f.name: getattr(reply, f.name) for f in fields(Reply)}
    sig = signature or base64.b64encode(hashlib.sha256(text.encode()).digest()).decode()
    return Thought(**values, thinking=text, signature=sig)


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(b.get("text") or "") for b in content
                        if isinstance(b, dict) and b.get("type") == "text")
    return ""


def echo_message(body: dict[str, Any]) -> Reply:
    """``"ok"``, or ``"ok: "`` and the first 24 words of the last user text."""
    for message in reversed(body.get("messages") or []):
        if isinstance(message, dict) and message.get("role") == "user":
            words = _text_of(message.get("content")).split()
            if words:
                return Reply.text("ok: " + " ".join(words[:24]))
    return Reply.text("ok")


def count_input_tokens(body: dict[str, Any]) -> int:
    """About one token per four bytes of the system, messages and tools."""
    size = len(orjson.dumps([body.get("system"), body.get("messages"), body.get("tools")]))
    return max(1, size // 4)


def _event(kind: str, data: dict[str, Any]) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps({"type": kind, **data}) + (
        b"\n\n")


class _MessageReply:
    """A ``Reply`` rendered as a Messages API answer to one request."""

    def __init__(self, reply: Reply, body: dict[str, Any], input_tokens: int) -> None:
        self.reply = reply
        self.model = str(body.get("model") or "claude-fake")
        self.id = f"msg_fake{next(_ids):06d}"
        self.blocks: list[dict[str, Any]] = []
        if isinstance(reply, Thought) and reply.thinking:
            self.blocks.append({"type": "thinking", "thinking": reply.thinking,
                                "signature": reply.signature})
        if reply.content:
            self.blocks.append({"type": "text", "text": reply.content})
        for call in reply.calls:
            function = call["function"]
            self.blocks.append({"type": "tool_use", "id": call["id"].replace("call_", "toolu_"),
                                "name": function["name"],
                                "input": orjson.loads(function["arguments"] or "{}")})
        output = max(1, len(orjson.dumps(self.blocks)) // 4)
        self.usage = dict(reply.usage) if reply.usage else {
            "input_tokens": input_tokens, "output_tokens": output,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
        self.stop_reason = "tool_use" if reply.calls else (
            "max_tokens" if reply.finish_reason == "length" else "end_turn")

    def completion(self) -> bytes:
        return orjson.dumps({
            "id": self.id, "type": "message", "role": "assistant", "model": self.model,
            "content": self.blocks, "stop_reason": self.stop_reason, "stop_sequence": None,
            "usage": self.usage})

    def chunks(self, include_usage: bool) -> list[bytes]:
        start_usage = {**self.usage, "output_tokens": 1}
        out = [_event("message_start", {"message": {
            "id": self.id, "type": "message", "role": "assistant", "model": self.model,
            "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": start_usage}})]
        for index, block in enumerate(self.blocks):
            kind = block["type"]
            if kind == "thinking":
                out.append(_event("content_block_start", {"index": index, "content_block": {
                    "type": "thinking", "thinking": "", "signature": ""}}))
                out.extend(_event("content_block_delta", {"index": index, "delta": {
                    "type": "thinking_delta", "thinking": piece}})
                    for piece in _WORDS.findall(block["thinking"]))
                out.append(_event("content_block_delta", {"index": index, "delta": {
                    "type": "signature_delta", "signature": block["signature"]}}))
            elif kind == "text":
                out.append(_event("content_block_start", {"index": index, "content_block": {
                    "type": "text", "text": ""}}))
                if index == 0:
                    out.append(_event("ping", {}))
                out.extend(_event("content_block_delta", {"index": index, "delta": {
                    "type": "text_delta", "text": piece}})
                    for piece in _WORDS.findall(block["text"]))
            else:
                out.append(_event("content_block_start", {"index": index, "content_block": {
                    **block, "input": {}}}))
                raw = orjson.dumps(block["input"]).decode()
                out.extend(_event("content_block_delta", {"index": index, "delta": {
                    "type": "input_json_delta", "partial_json": raw[i : i + 8]}})
                    for i in range(0, len(raw), 8))
            out.append(_event("content_block_stop", {"index": index}))
        out.append(_event("message_delta", {
            "delta": {"stop_reason": self.stop_reason, "stop_sequence": None},
            "usage": {"output_tokens": self.usage.get("output_tokens", 1)}}))
        out.append(_event("message_stop", {}))
        return out


class FakeMessages(FakeUpstream):
    """The fake upstream serving Anthropic's Messages API (and everything it served)."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("default_reply", echo_message)
        kwargs.setdefault("count_tokens", count_input_tokens)
        super().__init__(**kwargs)

    @classmethod
    def running(cls, **kwargs: Any) -> FakeMessages:
        return cls(**kwargs)

    @property
    def base_url(self) -> str:
        """The Anthropic base URL, ``http://127.0.0.1:PORT`` (clients add ``/v1/...``)."""
        return f"http://{self.host}:{self.port}"

    @property
    def message_requests(self) -> list[RecordedRequest]:
        return [r for r in self.requests
                if r.method == "POST" and r.path.rstrip("/").endswith("/messages")]

    async def _route(
        self, method: str, path: str, body: Any, receive: Receive, send: Send
    ) -> None:
        path = path.rstrip("/")
        if method != "POST" or not path.endswith(("/messages", "/messages/count_tokens")):
            await super()._route(method, path, body, receive, send)
            return
        if not isinstance(body, dict):
            await _respond(send, 400, _JSON, anthropic_error(400, "body is not JSON"))
            return
        if path.endswith("/count_tokens"):
            tokens = orjson.dumps({"input_tokens": self.count_tokens(body)})
            await _respond(send, 200, _JSON, tokens)
            return
        reply = self._next_reply(body)
        if reply.raw_body is not None:
            headers = [(b"content-type", reply.content_type.encode())]
            await _respond(send, reply.status, headers, reply.raw_body)
            return
        rendered = _MessageReply(reply, body, self.count_tokens(body))
        stream = body.get("stream") is True
        if not (reply.first_token_delay > 0 or reply.delay_between_chunks > 0
                or reply.linger > 0 or reply.cut_after_chunks is not None):
            data = b"".join(rendered.chunks(True)) if stream else rendered.completion()
            await _respond(send, 200, _SSE if stream else _JSON, data)
            return
        await self._play(rendered, stream, True, receive, send)
