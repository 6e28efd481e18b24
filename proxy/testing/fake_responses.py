"""A fake OpenAI Responses API upstream on loopback: ``FakeUpstream`` with
``POST /v1/responses`` too.

    with FakeResponsesUpstream.running(reasoning=True) as fake:
        fake.queue(Reply.tool_calls([{"name": "get_weather", "arguments": {"city": "Oslo"}}]))
        ...
        fake.responses_requests[-1].body["input"]

The same ``Reply`` script answers both APIs (chat completions stay served as before).
A Responses reply holds, in order, a reasoning item when ``reasoning`` is on (an opaque
``encrypted_content`` the next request must send back unchanged), the text as a message
item and each tool call as a ``function_call`` item; streamed as OpenAI streams it, one
word per ``response.output_text.delta``. ``chat_only=True`` answers ``/responses`` with
404, as a chat-completions-only server does.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

import orjson

from proxy.testing.fake_replies import WORDS
from proxy.testing.fake_upstream import (
    _JSON,
    _SSE,
    FakeUpstream,
    Receive,
    Reply,
    Send,
    _respond,
    count_tokens_roughly,
    error_json,
)

__all__ = ["FakeResponsesUpstream", "Reply", "echo_input", "input_tokens"]

_ids = itertools.count(1)


def input_tokens(body: dict[str, Any]) -> int:
    """About one token per four bytes of the input's and instructions' JSON."""
    if "input" not in body:
        return count_tokens_roughly(body)
    size = len(orjson.dumps(body.get("input"))) + len(str(body.get("instructions") or ""))
    return max(1, size // 4)


def _last_user_text(body: dict[str, Any]) -> str:
    items = body.get("input")
    if isinstance(items, str):
        return items
    for item in reversed(items or []):
        if isinstance(item, dict) and item.get("role") == "user":
            content = item.get("content")
            if isinstance(content, str):
                return content
            return " ".join(
                p.get("text", "") for p in content or () if isinstance(p, dict)
            )
    return ""


def echo_input(body: dict[str, Any]) -> Reply:
    words = _last_user_text(body).split()
    return Reply.text("ok: " + " ".join(words[:24]) if words else "ok")


class _ResponsesReply:
    """A ``Reply`` rendered as a Responses API response for one request."""

    def __init__(self, reply: Reply, body: dict[str, Any], prompt_tokens: int,
                 reasoning: bool) -> None:
        self.reply = reply
        self.number = next(_ids)
        self.id = f"resp_fake_{self.number}"
        self.model = str(body.get("model") or "fake-model")
        self.created = int(time.time())
        completion = len(reply.content or "") + sum(
            len(c["function"]["name"]) + len(c["function"]["arguments"]) for c in reply.calls
        )
        output_tokens = max(1, completion // 4)
        usage = reply.usage or {}
        self.usage = {
            "input_tokens": usage.get("prompt_tokens", prompt_tokens),
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": usage.get("completion_tokens", output_tokens),
            "output_tokens_details": {"reasoning_tokens": 8 if reasoning else 0},
            "total_tokens": prompt_tokens + output_tokens,
        }
        self.output: list[dict[str, Any]] = []
        if reasoning:
            self.output.append({
                "type": "reasoning", "id": f"rs_fake_{self.number}", "summary": [],
                "encrypted_content": f"gAAA-opaque-{self.number}-=="})
        if reply.content:
            self.output.append({
                "type": "message", "id": f"msg_fake_{self.number}", "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": reply.content, "annotations": []}],
            })
        for index, call in enumerate(reply.calls):
            function = call["function"]
            self.output.append({
                "type": "function_call", "id": f"fc_fake_{self.number}_{index}",
                "call_id": call["id"], "name": function["name"],
                "arguments": function["arguments"], "status": "completed",
            })
        length = reply.finish_reason == "length"
        self.status = "incomplete" if length else "completed"
        self.body = body

    def response(self, status: str | None = None, output: bool = True) -> dict[str, Any]:
        return {
            "id": self.id, "object": "response", "created_at": self.created,
            "status": status or self.status, "model": self.model,
            "output": self.output if output else [], "usage": self.usage if output else None,
            "incomplete_details": {"reason": "max_output_tokens"}
            if self.status == "incomplete" else None,
            "error": None,
        }

    def completion(self) -> bytes:
        return orjson.dumps(self.response())

    def chunks(self, include_usage: bool) -> list[bytes]:
        sequence = itertools.count()
        out: list[bytes] = []

        def event(kind: str, **fields: Any) -> None:
            data = {"type": kind, "sequence_number": next(sequence), **fields}
            out.append(b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n")

        event("response.created", response=self.response("in_progress", output=False))
        event("response.in_progress", response=self.response("in_progress", output=False))
        for index, item in enumerate(self.output):
            kind = item["type"]
            if kind == "message":
                event("response.output_item.added", output_index=index,
                      item={**item, "status": "in_progress", "content": []})
                part = {"type": "output_text", "text": "", "annotations": []}
                event("response.content_part.added", item_id=item["id"], output_index=index,
                      content_index=0, part=part)
                text = item["content"][0]["text"]
                for piece in WORDS.findall(text):
                    event("response.output_text.delta", item_id=item["id"],
                          output_index=index, content_index=0, delta=piece)
                event("response.output_text.done", item_id=item["id"], output_index=index,
                      content_index=0, text=text)
                event("response.content_part.done", item_id=item["id"], output_index=index,
                      content_index=0, part={**part, "text": text})
            elif kind == "function_call":
                event("response.output_item.added", output_index=index,
                      item={**item, "arguments": "", "status": "in_progress"})
                arguments = item["arguments"]
                for i in range(0, len(arguments), 8):
                    event("response.function_call_arguments.delta", item_id=item["id"],
                          output_index=index, delta=arguments[i : i + 8])
                event("response.function_call_arguments.done", item_id=item["id"],
                      output_index=index, arguments=arguments)
            else:
                event("response.output_item.added", output_index=index,
                      item={**item, "encrypted_content": None})
            event("response.output_item.done", output_index=index, item=item)
        kind = "response.incomplete" if self.status == "incomplete" else "response.completed"
        event(kind, response=self.response())
        return out


class FakeResponsesUpstream(FakeUpstream):
    """``FakeUpstream`` that also serves ``POST …/responses`` (see the module docstring)."""

    def __init__(self, *, reasoning: bool = False, chat_only: bool = False,
                 **kwargs: Any) -> None:
        kwargs.setdefault("count_tokens", input_tokens)
        super().__init__(**kwargs)
        self.reasoning = reasoning
        self.chat_only = chat_only
        self.default_input_reply = echo_input

    @property
    def responses_requests(self) -> list[Any]:
        return [r for r in self.requests if r.path.endswith("/responses")]

    async def _route(
        self, method: str, path: str, body: Any, receive: Receive, send: Send
    ) -> None:
        if not (method == "POST" and path.endswith("/responses")):
            await super()._route(method, path, body, receive, send)
            return
        if self.chat_only:
            await _respond(send, 404, _JSON, error_json(404, f"no route {method} {path}"))
            return
        if not isinstance(body, dict):
            await _respond(send, 400, _JSON, error_json(400, "body is not a JSON object"))
            return
        with self._lock:
            reply = self._script.popleft() if self._script else None
        if reply is None:
            reply = self.default_input_reply(body)
        if reply.raw_body is not None:
            headers = [(b"content-type", reply.content_type.encode())]
            await _respond(send, reply.status, headers, reply.raw_body)
            return
        rendered = _ResponsesReply(reply, body, self.count_tokens(body), self.reasoning)
        stream = body.get("stream") is True
        if not (reply.first_token_delay > 0 or reply.delay_between_chunks > 0
                or reply.cut_after_chunks is not None):
            data = b"".join(rendered.chunks(True)) if stream else rendered.completion()
            await _respond(send, 200, _SSE if stream else _JSON, data)
            return
        await self._play(rendered, stream, True, receive, send)
