"""Streams both ways between Responses API events and chat completion chunks.

``EventWriter`` renders the turn's chat chunks as the Responses event sequence the client
reads (``response.created``, ``response.in_progress``, ``response.output_item.added``,
``response.content_part.added``, ``response.output_text.delta``,
``response.function_call_arguments.delta``, the ``….done`` events, and
``response.completed`` or ``response.failed``), each with its ``sequence_number``.

``ChunkReader`` reads a Responses upstream's events as chat chunks: text and function
call deltas as they come, reasoning and built-in call items (whole, at their
``output_item.done``) as a ``native`` delta of native parts, usage and the finish at
``response.completed``.
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from proxy.surfaces.responses_items import is_native
from proxy.surfaces.responses_reply import (
    chat_usage,
    envelope,
    finish_reason,
    reply_message,
    responses_usage,
)

__all__ = ["ChunkReader", "EventWriter", "sse"]


def sse(event: dict[str, Any]) -> bytes:
    return b"event: " + event["type"].encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"


class EventWriter:
    """Chat chunks in, Responses SSE bytes out (one ``feed`` per upstream read)."""

    def __init__(self, request: dict[str, Any], response_id: str, model: str) -> None:
        self.request = request
        self.response_id = response_id
        self.model = model
        self.created_at = int(time.time())
        self.sequence = 0
        self.output: list[dict[str, Any]] = []
        self.usage: dict[str, Any] | None = None
        self.finish: str | None = None
        self._prefix = response_id.removeprefix("resp_")[-24:]
        self._text: dict[str, Any] | None = None  # the open message item
        self._text_parts: list[str] = []
        self._calls: dict[int, dict[str, Any]] = {}  # chat index -> open function_call item
        self._started = False

    def _event(self, kind: str, **fields: Any) -> bytes:
        event = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return sse(event)

    def _envelope(self, status: str) -> dict[str, Any]:
        return envelope(self.request, self.response_id, self.model, self.created_at, status)

    def start(self) -> bytes:
        if self._started:
            return b""
        self._started = True
        return self._event("response.created", response=self._envelope("in_progress")) + (
            self._event("response.in_progress", response=self._envelope("in_progress"))
        )

    def _add(self, item: dict[str, Any]) -> tuple[int, bytes]:
        index = len(self.output)
        self.output.append(item)
        return index, self._event("response.output_item.added", output_index=index, item=item)

    def _close_text(self) -> bytes:
        item = self._text
        if item is None:
            return b""
        self._text = None
        index = self.output.index(item)
        text = "".join(self._text_parts)
        self._text_parts = []
        part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
        item["content"] = [part]
        item["status"] = "completed"
        return b"".join((
            self._event("response.output_text.done", item_id=item["id"], output_index=index,
                        content_index=0, text=text, logprobs=[]),
            self._event("response.content_part.done", item_id=item["id"], output_index=index,
                        content_index=0, part=part),
            self._event("response.output_item.done", output_index=index, item=item),
        ))

    def _close_calls(self) -> bytes:
        out = []
        for item in self._calls.values():
            index = self.output.index(item)
            item["status"] = "completed"
            out.append(self._event("response.function_call_arguments.done", item_id=item["id"],
                                   output_index=index, arguments=item["arguments"]))
            out.append(self._event("response.output_item.done", output_index=index, item=item))
        self._calls.clear()
        return b"".join(out)

    def _text_delta(self, text: str) -> bytes:
        out = []
        if self._text is None:
            out.append(self._close_calls())
            item = {"type": "message", "id": f"msg_{self._prefix}_{len(self.output)}",
                    "status": "in_progress", "role": "assistant", "content": []}
            index, added = self._add(item)
            self._text = item
            out.append(added)
            out.append(self._event(
                "response.content_part.added", item_id=item["id"], output_index=index,
                content_index=0,
                part={"type": "output_text", "text": "", "annotations": [], "logprobs": []},
            ))
        self._text_parts.append(text)
        item = self._text
        out.append(self._event("response.output_text.delta", item_id=item["id"],
                               output_index=self.output.index(item), content_index=0,
                               delta=text, logprobs=[]))
        return b"".join(out)

    def _call_delta(self, delta: dict[str, Any]) -> bytes:
        out = []
        index = delta.get("index", 0)
        item = self._calls.get(index)
        function = delta.get("function") or {}
        if item is None:
            out.append(self._close_text())
            item = {"type": "function_call", "id": f"fc_{self._prefix}_{len(self.output)}",
                    "call_id": delta.get("id") or "", "name": function.get("name") or "",
                    "arguments": "", "status": "in_progress"}
            if delta.get("namespace"):
                item["namespace"] = delta["namespace"]
            self._calls[index] = item
            out.append(self._add(item)[1])
        arguments = function.get("arguments")
        if arguments:
            item["arguments"] += arguments
            out.append(self._event(
                "response.function_call_arguments.delta", item_id=item["id"],
                output_index=self.output.index(item), delta=arguments,
            ))
        return b"".join(out)

    def feed(self, chunk: dict[str, Any]) -> bytes:
        """One chat chunk's events."""
        out = [self.start()]
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        if chunk.get("model"):
            self.model = chunk["model"]
        for choice in chunk.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            for part in delta.get("native") or ():
                if is_native(part) and isinstance(part.get("item"), dict):
                    out.append(self._close_text() + self._close_calls())
                    index, added = self._add(part["item"])
                    out.append(added)
                    out.append(self._event("response.output_item.done", output_index=index,
                                           item=part["item"]))
            for text in (delta.get("content"), delta.get("refusal")):
                if isinstance(text, str) and text:
                    out.append(self._text_delta(text))
            for call in delta.get("tool_calls") or ():
                out.append(self._call_delta(call))
            if choice.get("finish_reason"):
                self.finish = choice["finish_reason"]
        return b"".join(out)

    def complete(self) -> bytes:
        """The closing events: open items done, then ``response.completed``."""
        out = [self.start(), self._close_text(), self._close_calls()]
        status = "incomplete" if self.finish == "length" else "completed"
        response = self._envelope(status)
        if self.finish == "length":
            response["incomplete_details"] = {"reason": "max_output_tokens"}
        response["output"] = self.output
        response["usage"] = responses_usage(self.usage)
        kind = "response.incomplete" if status == "incomplete" else "response.completed"
        out.append(self._event(kind, response=response))
        return b"".join(out)

    def fail(self, code: str | None, message: str) -> bytes:
        """The stream's end when the turn failed: ``response.failed`` with the error
        (after ``response.created`` if nothing was sent yet). It changes nothing here: an
        event made ahead, for a failure nobody caught, leaves the stream as it was."""
        response = self._envelope("failed")
        response["output"] = self.output
        response["error"] = {"code": code or "server_error", "message": message}
        sequence = self.sequence
        out = []
        if not self._started:
            for kind in ("response.created", "response.in_progress"):
                out.append(sse({"type": kind, "sequence_number": sequence,
                                "response": self._envelope("in_progress")}))
                sequence += 1
        out.append(sse({"type": "response.failed", "sequence_number": sequence,
                        "response": response}))
        return b"".join(out)


class ChunkReader:
    """Responses events in (parsed JSON objects), chat chunks out."""

    def __init__(self) -> None:
        self.id: str | None = None
        self.model: str | None = None
        self.created = int(time.time())
        self._calls: dict[str, int] = {}  # function_call item id -> chat tool call index
        self._arguments: dict[str, int] = {}  # item id -> characters of arguments sent
        self._started = False

    def _chunk(self, delta: dict[str, Any] | None, finish: str | None = None,
               usage: dict[str, Any] | None = None) -> dict[str, Any]:
        chunk: dict[str, Any] = {
            "id": self.id, "object": "chat.completion.chunk", "created": self.created,
            "model": self.model,
            "choices": [] if delta is None else [
                {"index": 0, "delta": delta, "finish_reason": finish}
            ],
        }
        if usage is not None:
            chunk["usage"] = usage
        return chunk

    def read(self, event: dict[str, Any]) -> list[dict[str, Any]]:
        kind = event.get("type")
        out: list[dict[str, Any]] = []
        if not self._started and isinstance(event.get("response"), dict):
            response = event["response"]
            self.id, self.model = response.get("id"), response.get("model")
        if not self._started:
            self._started = True
            out.append(self._chunk({"role": "assistant", "content": ""}))
        if kind == "response.output_text.delta":
            out.append(self._chunk({"content": event.get("delta") or ""}))
        elif kind == "response.refusal.delta":
            out.append(self._chunk({"refusal": event.get("delta") or ""}))
        elif kind == "response.output_item.added":
            item = event.get("item") or {}
            if item.get("type") == "function_call":
                index = self._calls[item.get("id") or ""] = len(self._calls)
                self._arguments[item.get("id") or ""] = len(item.get("arguments") or "")
                call = {"index": index, "id": item.get("call_id"), "type": "function",
                        "function": {"name": item.get("name", ""),
                                     "arguments": item.get("arguments") or ""}}
                if item.get("namespace"):
                    call["namespace"] = item["namespace"]
                out.append(self._chunk({"tool_calls": [call]}))
        elif kind == "response.function_call_arguments.delta":
            item_id = event.get("item_id") or ""
            if item_id in self._calls and event.get("delta"):
                self._arguments[item_id] += len(event["delta"])
                out.append(self._chunk({"tool_calls": [{
                    "index": self._calls[item_id], "function": {"arguments": event["delta"]}}]}))
        elif kind == "response.output_item.done":
            item = event.get("item") or {}
            item_kind = item.get("type")
            if item_kind == "function_call":
                item_id = item.get("id") or ""
                rest = (item.get("arguments") or "")[self._arguments.get(item_id, 0):]
                if item_id not in self._calls:  # announced only now
                    out.extend(self.read({"type": "response.output_item.added", "item": item}))
                elif rest:
                    out.append(self._chunk({"tool_calls": [{
                        "index": self._calls[item_id], "function": {"arguments": rest}}]}))
            elif item_kind != "message":
                out.append(self._chunk({"native": [
                    {"type": "native", "api": "responses", "item": item}]}))
        elif kind in ("response.completed", "response.incomplete"):
            response = event.get("response") or {}
            message = reply_message(response.get("output") or [])
            if self._calls:
                message.setdefault("tool_calls", [{}])
            out.append(self._chunk({}, finish_reason(response, message)))
            usage = chat_usage(response.get("usage"))
            if usage is not None:
                out.append(self._chunk(None, usage=usage))
        elif kind in ("response.failed", "error"):
            response = event.get("response") or {}
            error = response.get("error") or event
            out.append({"error": {"message": error.get("message") or "upstream response failed",
                                  "code": error.get("code")}})
        return out
