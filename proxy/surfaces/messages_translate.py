"""A Messages request served by a chat completions upstream, and its reply back (pure).

- ``chat_request(body, messages)``: the request's fields as chat completions takes them
  (``tools`` as functions, ``tool_choice``, ``stop_sequences`` as ``stop``,
  ``metadata.user_id`` as ``user``); ``messages`` is the window rendered for chat (native
  parts left out). What chat has no field for (``thinking``, ``top_k``, server tools) is
  dropped.
- ``message_from_completion``: a ``chat.completion`` as an Anthropic message.
- ``ChunkTranslator``: ``chat.completion.chunk``s as Anthropic's stream events, block by
  block, ending with ``message_delta`` and ``message_stop``.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Mapping
from typing import Any

import orjson

from proxy.surfaces.messages_request import arguments_of

STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use",
                "function_call": "tool_use", "content_filter": "refusal"}
_ids = itertools.count(1)
# part fields only Anthropic reads
_ANTHROPIC_FIELDS = ("cache_control", "anthropic")


def message_id() -> str:
    return f"msg_mp{int(time.time() * 1000):x}{next(_ids):06d}"


def chat_request(body: Mapping[str, Any], messages: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"model": body.get("model"), "messages": _plain(messages)}
    if isinstance(body.get("max_tokens"), int):
        out["max_tokens"] = body["max_tokens"]
    for name in ("temperature", "top_p"):
        if name in body:
            out[name] = body[name]
    if body.get("stop_sequences"):
        out["stop"] = body["stop_sequences"]
    metadata = body.get("metadata")
    if isinstance(metadata, Mapping) and isinstance(metadata.get("user_id"), str):
        out["user"] = metadata["user_id"]
    tools = [_function(t) for t in body.get("tools") or () if isinstance(t, Mapping)]
    tools = [t for t in tools if t is not None]
    if tools:
        out["tools"] = tools
        choice = body.get("tool_choice")
        if isinstance(choice, Mapping):
            kind = choice.get("type")
            if kind == "any":
                out["tool_choice"] = "required"
            elif kind == "tool" and isinstance(choice.get("name"), str):
                out["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
            elif kind in ("auto", "none"):
                out["tool_choice"] = kind
            if choice.get("disable_parallel_tool_use") is True:
                out["parallel_tool_calls"] = False
    if body.get("stream") is True:
        out["stream"] = True
        out["stream_options"] = {"include_usage": True}
    return out


def _function(tool: Mapping[str, Any]) -> dict[str, Any] | None:
    """A custom tool as a function; server tools (typed, no input schema) have none."""
    if "input_schema" not in tool or tool.get("type") not in (None, "custom"):
        return None
    function: dict[str, Any] = {"name": tool.get("name"), "parameters": tool["input_schema"]}
    if tool.get("description"):
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def _plain(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages without the fields only Anthropic reads (copies where they change)."""
    out = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list) and any(
            isinstance(p, Mapping) and any(k in p for k in _ANTHROPIC_FIELDS) for p in content
        ):
            parts = [
                {k: v for k, v in p.items() if k not in _ANTHROPIC_FIELDS}
                if isinstance(p, Mapping) else p
                for p in content
            ]
            message = {**message, "content": parts}
        calls = message.get("tool_calls")
        if calls and any("cache_control" in c for c in calls):
            message = {**message, "tool_calls": [
                {k: v for k, v in c.items() if k != "cache_control"} for c in calls]}
        out.append(message)
    return out


def usage_from_chat(usage: Mapping[str, Any] | None) -> dict[str, Any]:
    usage = usage or {}
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, Mapping) else None
    cached = cached if isinstance(cached, int) else 0
    prompt = usage.get("prompt_tokens")
    prompt = prompt if isinstance(prompt, int) else 0
    return {
        "input_tokens": max(0, prompt - cached),
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
        "output_tokens": usage.get("completion_tokens") or 0,
    }


def _tool_use(call: Mapping[str, Any]) -> dict[str, Any]:
    function = call.get("function") or {}
    arguments = function.get("arguments")
    try:
        value = orjson.loads(arguments) if isinstance(arguments, str) and arguments else {}
    except orjson.JSONDecodeError:
        value = {"arguments": arguments}
    return {"type": "tool_use", "id": call.get("id") or f"toolu_mp{next(_ids):06d}",
            "name": function.get("name") or "", "input": value}


def message_from_completion(completion: Mapping[str, Any], model: str) -> dict[str, Any]:
    choice = (completion.get("choices") or [{}])[0]
    reply = choice.get("message") or {}
    content: list[dict[str, Any]] = []
    text = reply.get("content")
    if isinstance(text, list):
        text = "".join(str(p.get("text") or "") for p in text if isinstance(p, Mapping))
    if text:
        content.append({"type": "text", "text": text})
    content.extend(_tool_use(c) for c in reply.get("tool_calls") or ())
    reason = choice.get("finish_reason")
    return {
        "id": message_id(), "type": "message", "role": "assistant", "model": model,
        "content": content,
        "stop_reason": "tool_use" if reply.get("tool_calls") else STOP_REASONS.get(
            reason or "stop", "end_turn"),
        "stop_sequence": None,
        "usage": usage_from_chat(completion.get("usage")),
    }


def event(kind: str, data: Mapping[str, Any]) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps({"type": kind, **data}) + (
        b"\n\n")


class ChunkTranslator:
    """Chat completion chunks in, Anthropic stream events out (``feed`` per chunk, then
    ``finish`` at the stream's end). The tool calls' arguments are forwarded as
    ``input_json_delta``s as they come."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.id = message_id()
        self.started = False
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None
        self._index = -1
        self._open: str | None = None  # "text" or "tool:<chat index>"
        self._calls: dict[int, int] = {}  # chat tool call index -> block index

    def _start(self) -> list[bytes]:
        if self.started:
            return []
        self.started = True
        return [event("message_start", {"message": {
            "id": self.id, "type": "message", "role": "assistant", "model": self.model,
            "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0}}})]

    def _close(self) -> list[bytes]:
        if self._open is None:
            return []
        self._open = None
        return [event("content_block_stop", {"index": self._index})]

    def feed(self, chunk: Mapping[str, Any]) -> list[bytes]:
        out = self._start()
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            text = delta.get("content")
            if text:
                if self._open != "text":
                    out += self._close()
                    self._index += 1
                    self._open = "text"
                    out.append(event("content_block_start", {
                        "index": self._index, "content_block": {"type": "text", "text": ""}}))
                out.append(event("content_block_delta", {
                    "index": self._index, "delta": {"type": "text_delta", "text": text}}))
            for call in delta.get("tool_calls") or ():
                out += self._tool_delta(call)
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
        return out

    def _tool_delta(self, call: Mapping[str, Any]) -> list[bytes]:
        out: list[bytes] = []
        position = call.get("index", 0)
        function = call.get("function") or {}
        if position not in self._calls:
            out += self._close()
            self._index += 1
            self._calls[position] = self._index
            self._open = f"tool:{position}"
            out.append(event("content_block_start", {"index": self._index, "content_block": {
                "type": "tool_use", "id": call.get("id") or f"toolu_mp{next(_ids):06d}",
                "name": function.get("name") or "", "input": {}}}))
        arguments = function.get("arguments")
        if arguments and self._open == f"tool:{position}":
            out.append(event("content_block_delta", {"index": self._calls[position], "delta": {
                "type": "input_json_delta", "partial_json": arguments}}))
        return out

    def finish(self) -> list[bytes]:
        """The closing events (after the upstream's last chunk)."""
        out = self._start() + self._close()
        reason = "tool_use" if self._calls else STOP_REASONS.get(
            self.finish_reason or "stop", "end_turn")
        usage = usage_from_chat(self.usage)
        out.append(event("message_delta", {
            "delta": {"stop_reason": reason, "stop_sequence": None}, "usage": usage}))
        out.append(event("message_stop", {}))
        return out


def normalized_reply(reply: dict[str, Any] | None) -> dict[str, Any] | None:
    """A chat reply as the Messages surface stores it: tool call arguments in the form a
    client's resent ``tool_use`` input is stored in (messages_request.arguments_of)."""
    if not reply or not reply.get("tool_calls"):
        return reply
    calls = []
    for call in reply["tool_calls"]:
        value = _tool_use(call)
        calls.append({"id": value["id"], "type": "function", "function": {
            "name": value["name"], "arguments": arguments_of(value["input"])}})
    return {**reply, "tool_calls": calls}
