"""Rebuild the assistant message to persist from a streamed (or whole) completion.

An upstream 200 is a chat completion only when it carries a reply: ``completion_of`` and
``add_stream_event`` turn junk, an error object and a reply-less completion into
``UpstreamReplyError`` (502 for the client, nothing stored).
"""

from __future__ import annotations

from typing import Any

import orjson

from proxy.errors import UpstreamReplyError
from proxy.upstreams.base import SSEEvent

__all__ = ["NOT_A_COMPLETION", "ReplyAccumulator", "add_stream_event", "completion_of"]

NOT_A_COMPLETION = "upstream sent a reply that is not a chat completion"


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError("a text delta that is not a string")
    return value


class _ToolCall:
    __slots__ = ("arguments", "id", "name", "namespace", "type")

    def __init__(self, call_id: str | None, call_type: str | None) -> None:
        self.id = call_id
        self.type = call_type or "function"
        self.name: str | None = None
        self.arguments: list[str] = []
        # a Responses API function's namespace (a translated Responses stream)
        self.namespace: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {"id": self.id, "type": self.type,
               "function": {"name": self.name or "", "arguments": "".join(self.arguments)}}
        if self.namespace:
            out["namespace"] = self.namespace
        return out


class ReplyAccumulator:
    """Feed it ``chat.completion.chunk`` dicts (``add_chunk``), raw SSE events
    (``add_event``) or one whole ``chat.completion`` (``add_response``); then read
    ``message()``, ``usage``, ``finish_reason``, ``complete``, ``id``, ``model``.

    Only choice 0 is kept: with ``n > 1`` the first choice is the one stored. Tool calls
    are assembled by ``index`` (id and type from the first fragment, the name from the
    first fragment that has one, arguments concatenated). Provider extras such as
    ``reasoning_content`` are not kept. A ``native`` delta (a list of native parts, from a
    translated Responses stream) is kept before the text in the message's content. A
    mid-stream ``{"error": ...}`` lands in ``error``.
    """

    __slots__ = ("_content", "_message", "_native", "_refusal", "_tool_calls", "error",
                 "finish_reason", "id", "model", "usage")

    def __init__(self) -> None:
        self.id: str | None = None
        self.model: str | None = None
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None
        self.error: Any = None
        self._content: list[str] = []
        self._refusal: list[str] = []
        self._tool_calls: dict[int, _ToolCall] = {}
        self._native: list[dict[str, Any]] = []
        self._message: dict[str, Any] | None = None  # set by add_response

    @property
    def complete(self) -> bool:
        """True once a finish_reason was seen (the reply was not cut short)."""
        return self.finish_reason is not None

    @property
    def prompt_tokens(self) -> int | None:
        return self.usage.get("prompt_tokens") if self.usage else None

    @property
    def completion_tokens(self) -> int | None:
        return self.usage.get("completion_tokens") if self.usage else None

    def add_event(self, event: SSEEvent) -> None:
        """Parse and add one SSE event; ``[DONE]``, comments and non-JSON are skipped."""
        data = event.data
        if data[:1] == b"{":
            try:
                chunk = orjson.loads(data)
            except orjson.JSONDecodeError:
                return
            self.add_chunk(chunk)

    def add_chunk(self, chunk: dict[str, Any]) -> None:
        if self.id is None:
            self.id = chunk.get("id")
            self.model = chunk.get("model")
        usage = chunk.get("usage")
        if usage:
            self.usage = usage
        choices = chunk.get("choices")
        if not choices:
            if "error" in chunk:
                self.error = chunk["error"]
            return
        for choice in choices:
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta")
            if delta:
                content = delta.get("content")
                if content:
                    self._content.append(_text(content))
                calls = delta.get("tool_calls")
                if calls:
                    self._add_tool_deltas(calls)
                refusal = delta.get("refusal")
                if refusal:
                    self._refusal.append(_text(refusal))
                native = delta.get("native")
                if native:
                    self._native.extend(native)
            finish_reason = choice.get("finish_reason")
            if finish_reason:
                self.finish_reason = finish_reason

    def _add_tool_deltas(self, deltas: list[dict[str, Any]]) -> None:
        calls = self._tool_calls
        for delta in deltas:
            index = delta.get("index")
            if index is None:
                index = self._index_without_index(delta)
            call = calls.get(index)
            if call is None:
                call = calls[index] = _ToolCall(delta.get("id"), delta.get("type"))
                call.namespace = delta.get("namespace")
            elif call.id is None and delta.get("id"):
                call.id = delta["id"]
            function = delta.get("function")
            if function:
                name = function.get("name")
                if name and call.name is None:
                    call.name = name
                arguments = function.get("arguments")
                if arguments:
                    call.arguments.append(_text(arguments))

    def _index_without_index(self, delta: dict[str, Any]) -> int:
        """A few providers omit ``index``: a new id starts a new call, else it continues
        the last one."""
        calls = self._tool_calls
        call_id = delta.get("id")
        if call_id:
            for index, call in calls.items():
                if call.id == call_id:
                    return index
            return max(calls, default=-1) + 1
        return max(calls, default=0)

    def add_response(self, response: dict[str, Any]) -> None:
        """A whole non-streaming ``chat.completion``."""
        self.id = response.get("id")
        self.model = response.get("model")
        self.usage = response.get("usage") or self.usage
        for choice in response.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue
            self.finish_reason = choice.get("finish_reason")
            message = choice.get("message") or {}
            out: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
            if message.get("tool_calls"):
                out["tool_calls"] = message["tool_calls"]
            if message.get("refusal"):
                out["refusal"] = message["refusal"]
            self._message = out
            break

    def message(self) -> dict[str, Any] | None:
        """The OpenAI-shaped assistant message, or None when nothing was received.

        ``content`` is None when it is empty and tool calls exist; a complete but empty
        reply gives ``content == ""``.
        """
        if self._message is not None:
            return self._message
        content = "".join(self._content)
        if not (content or self._tool_calls or self._refusal or self._native or self.complete):
            return None
        message: dict[str, Any] = {"role": "assistant",
                                   "content": content if content or not self._tool_calls
                                   else None}
        if self._native:
            text = [{"type": "text", "text": content}] if content else []
            message["content"] = [*self._native, *text]
        if self._tool_calls:
            message["tool_calls"] = [self._tool_calls[i].to_dict()
                                     for i in sorted(self._tool_calls)]
        if self._refusal:
            message["refusal"] = "".join(self._refusal)
        return message


def completion_of(body: bytes) -> dict[str, Any]:
    """The chat completion in an upstream's 200 body: a JSON object whose choice 0 holds a
    message. Anything else raises ``UpstreamReplyError``."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise UpstreamReplyError(f"{NOT_A_COMPLETION} (not JSON)") from None
    if not isinstance(data, dict):
        raise UpstreamReplyError(f"{NOT_A_COMPLETION} (not a JSON object)")
    if data.get("error"):
        raise UpstreamReplyError(f"{NOT_A_COMPLETION}: it answered 200 with an error")
    choices = data.get("choices")
    first = next(
        (c for c in choices if isinstance(c, dict) and c.get("index", 0) == 0), None
    ) if isinstance(choices, list) else None
    if first is None or not isinstance(first.get("message"), dict):
        raise UpstreamReplyError(f"{NOT_A_COMPLETION} (no choice with a message)")
    return data


def add_stream_event(accumulator: ReplyAccumulator, data: bytes) -> dict[str, Any]:
    """Parse one event's data (not ``[DONE]``, not empty) into ``accumulator`` and return
    the chunk. Junk, an error event or a chunk of the wrong shape raise
    ``UpstreamReplyError``."""
    try:
        chunk = orjson.loads(data)
    except orjson.JSONDecodeError:
        chunk = None
    if not isinstance(chunk, dict):
        raise UpstreamReplyError(f"{NOT_A_COMPLETION} (a stream event that is not JSON)")
    if chunk.get("error"):
        raise UpstreamReplyError(f"{NOT_A_COMPLETION}: it sent an error event in its stream")
    try:
        accumulator.add_chunk(chunk)
    except (AttributeError, TypeError):
        raise UpstreamReplyError(f"{NOT_A_COMPLETION} (a malformed chunk)") from None
    return chunk
