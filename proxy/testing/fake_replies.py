"""The fake upstream's replies: a scripted ``Reply``, the request it answered
(``RecordedRequest``), the default echo, and their chat-completion bodies and SSE chunks as
rendered for one request (shared by the chat, Messages and Responses fakes)."""

from __future__ import annotations

import itertools
import re
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

__all__ = [
    "WORDS", "RecordedRequest", "Rendered", "RenderedReply", "Reply", "count_tokens_roughly",
    "default_usage", "echo_reply", "error_json", "instant_reply", "last_user_text",
]

_call_ids = itertools.count(1)
_response_ids = itertools.count(1)
# a text's words with their spaces: the pieces a fake streams
WORDS = re.compile(r"\s*\S+\s*")


def error_json(status: int, message: str) -> bytes:
    """An OpenAI-shaped error body, its type the one OpenAI gives ``status``."""
    kind = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
            404: "not_found_error", 429: "rate_limit_error"}.get(status, "api_error")
    return orjson.dumps({"error": {"message": message, "type": kind, "param": None,
                                   "code": None}})


def _normalize_tool_call(call: dict[str, Any]) -> dict[str, Any]:
    function = call.get("function", call)
    arguments = function.get("arguments", "{}")
    if not isinstance(arguments, str):
        arguments = orjson.dumps(arguments).decode()
    return {
        "id": call.get("id") or f"call_fake_{next(_call_ids)}",
        "type": "function",
        "function": {"name": function["name"], "arguments": arguments},
    }


@dataclass(frozen=True, slots=True)
class Reply:
    """One scripted answer. Build it with the class methods, not the constructor."""

    content: str | None = "ok"
    calls: tuple[dict[str, Any], ...] = ()  # tool calls, OpenAI-shaped
    status: int = 200
    raw_body: bytes | None = None  # answered as it is, whatever the request (``Reply.raw``)
    content_type: str = "application/json"
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    first_token_delay: float = 0.0
    delay_between_chunks: float = 0.0
    cut_after_chunks: int | None = None
    linger: float = 0.0  # seconds a stream stays open after `data: [DONE]`
    until: threading.Event | None = None  # the reply waits for this event (``Reply.text``)

    @property
    def held(self) -> bool:
        return self.until is not None and not self.until.is_set()

    @classmethod
    def text(
        cls, text: str, *, delay_between_chunks: float = 0.0, first_token_delay: float = 0.0,
        finish_reason: str = "stop", usage: dict[str, Any] | None = None, linger: float = 0.0,
        until: threading.Event | None = None,
    ) -> Reply:
        """Assistant text; streamed one word per chunk. With ``until``, the reply waits
        until the test sets that event (a stream sends its headers and role event first, a
        completion its headers): a reply "still being written" for as long as the test
        needs, with no fixed delay (``FakeUpstream.release`` frees all)."""
        return cls(content=text, finish_reason=finish_reason, usage=usage,
                   first_token_delay=first_token_delay,
                   delay_between_chunks=delay_between_chunks, linger=linger, until=until)

    @classmethod
    def tool_calls(
        cls, calls: Sequence[dict[str, Any]], *, content: str | None = None,
        delay_between_chunks: float = 0.0, first_token_delay: float = 0.0,
    ) -> Reply:
        """Parallel tool calls, each ``{"name", "arguments" (dict or JSON text), "id"?}`` or
        OpenAI's ``{"id", "type", "function": {...}}``; ids default to unique ``call_fake_N``."""
        return cls(content=content, calls=tuple(_normalize_tool_call(c) for c in calls),
                   finish_reason="tool_calls", first_token_delay=first_token_delay,
                   delay_between_chunks=delay_between_chunks)

    @classmethod
    def error(
        cls, status: int, body: dict[str, Any] | str | bytes | None = None, *,
        content_type: str = "application/json",
    ) -> Reply:
        """An error status; ``body`` defaults to an OpenAI-shaped error."""
        if body is None:
            raw = error_json(status, f"fake upstream error {status}")
        else:
            raw = body if isinstance(body, bytes) else (
                body.encode() if isinstance(body, str) else orjson.dumps(body))
        return cls.raw(raw, status=status, content_type=content_type)

    @classmethod
    def raw(
        cls, body: bytes | str, *, status: int = 200, content_type: str = "application/json"
    ) -> Reply:
        """These bytes as the response body, streaming request or not: a 200 that is not a
        chat completion, a hand-written SSE stream (``content_type="text/event-stream"``)."""
        raw = body.encode() if isinstance(body, str) else body
        return cls(content=None, status=status, raw_body=raw, content_type=content_type)

    @classmethod
    def stream_cut(cls, after_chunks: int = 2, text: str = "this reply is cut short") -> Reply:
        """Drop the connection after ``after_chunks`` SSE events (the role chunk counts);
        a non-streaming request gets half of its body, then the cut."""
        return cls(content=text, finish_reason="stop", cut_after_chunks=after_chunks)

    @classmethod
    def slow_first_token(cls, delay: float = 2.0, text: str = "ok") -> Reply:
        """Headers at once, then ``delay`` seconds before the first token (or before the
        whole body of a non-streaming reply)."""
        return cls.text(text, first_token_delay=delay)


@dataclass(slots=True)
class RecordedRequest:
    """A request as the fake received it (header names lower-cased)."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any  # parsed JSON, or None
    raw: bytes = b""
    client: tuple[str, int] | None = None  # the peer address: tells connections apart
    received_at: float = field(default_factory=time.monotonic)
    query: str = ""  # the query string, as sent


def count_tokens_roughly(body: dict[str, Any]) -> int:
    """Default prompt-token estimate: about one token per four bytes of the messages' JSON."""
    return max(1, len(orjson.dumps(body.get("messages", []))) // 4)


def last_user_text(body: dict[str, Any]) -> str:
    for message in reversed(body.get("messages") or []):
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, str):
                return content
            if isinstance(content, list):
                return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
            return ""
    return ""


def echo_reply(body: dict[str, Any]) -> Reply:
    """The default reply: ``"ok"``, or ``"ok: "`` and the first 24 words of the last user
    message — deterministic, instant."""
    words = last_user_text(body).split()
    return Reply.text("ok: " + " ".join(words[:24]) if words else "ok")


def default_usage(reply: Reply, prompt_tokens: int) -> dict[str, Any]:
    """The usage a reply reports unless scripted: ``prompt_tokens`` as counted for the
    request, a quarter of the reply's characters as its completion tokens."""
    completion = max(1, (len(reply.content or "") + sum(
        len(c["function"]["name"]) + len(c["function"]["arguments"]) for c in reply.calls
    )) // 4)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion,
            "total_tokens": prompt_tokens + completion}


class Rendered(Protocol):
    """A reply rendered for one request, in some API's shape."""

    reply: Reply

    def completion(self) -> bytes: ...

    def chunks(self, include_usage: bool) -> list[bytes]: ...


class RenderedReply:
    """A ``Reply`` rendered for one request: the bodies to send, built once."""

    def __init__(self, reply: Reply, body: dict[str, Any], prompt_tokens: int) -> None:
        self.reply = reply
        self.model = str(body.get("model") or "fake-model")
        self.id = f"chatcmpl-fake-{next(_response_ids)}"
        self.created = int(time.time())
        self.usage = reply.usage or default_usage(reply, prompt_tokens)
        self.finish_reason = reply.finish_reason or ("tool_calls" if reply.calls else "stop")

    def completion(self) -> bytes:
        message: dict[str, Any] = {"role": "assistant", "content": self.reply.content,
                                   "refusal": None}
        if self.reply.calls:
            message["tool_calls"] = list(self.reply.calls)
        return orjson.dumps({
            "id": self.id, "object": "chat.completion", "created": self.created,
            "model": self.model, "system_fingerprint": "fp_fake",
            "choices": [{"index": 0, "message": message, "logprobs": None,
                         "finish_reason": self.finish_reason}],
            "usage": self.usage,
        })

    def chunks(self, include_usage: bool) -> list[bytes]:
        """The SSE events of the stream, ``data: [DONE]`` included."""
        head = {"id": self.id, "object": "chat.completion.chunk", "created": self.created,
                "model": self.model, "system_fingerprint": "fp_fake"}
        if include_usage:
            head["usage"] = None

        def event(delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            return b"data: " + orjson.dumps({**head, "choices": [choice]}) + b"\n\n"

        content = self.reply.content
        out = [event({"role": "assistant", "content": "" if content is not None else None,
                      "refusal": None})]
        if content:
            out.extend(event({"content": piece}) for piece in WORDS.findall(content))
        for index, call in enumerate(self.reply.calls):
            function = call["function"]
            out.append(event({"tool_calls": [{
                "index": index, "id": call["id"], "type": "function",
                "function": {"name": function["name"], "arguments": ""}}]}))
            arguments = function["arguments"]
            out.extend(
                event({"tool_calls": [{"index": index,
                                       "function": {"arguments": arguments[i : i + 8]}}]})
                for i in range(0, len(arguments), 8)
            )
        out.append(event({}, self.finish_reason))
        if include_usage:
            usage_chunk = {**head, "choices": [], "usage": self.usage}
            out.append(b"data: " + orjson.dumps(usage_chunk) + b"\n\n")
        out.append(b"data: [DONE]\n\n")
        return out


def instant_reply(reply: Reply, body: dict[str, Any], prompt_tokens: int) -> tuple[bool, bytes]:
    """``reply`` (no delays, no cut) to the chat completion request ``body``, all at once:
    whether it is a stream, and the bytes of the response body (the completion JSON, or
    every SSE event of the stream, ``data: [DONE]`` included)."""
    rendered = RenderedReply(reply, body, prompt_tokens)
    if body.get("stream") is True:
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        return True, b"".join(rendered.chunks(include_usage))
    return False, rendered.completion()
