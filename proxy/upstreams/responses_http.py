"""A Responses API upstream (OpenAI's ``POST {base}/responses``) behind the chat-shaped
``Upstream`` port, so the turn (built-in tool rounds, relay, persist) runs unchanged.

The window goes out as Responses input items (native parts as their items: reasoning
with its ``encrypted_content``, built-in calls), with the client's Responses options
(``OPTIONS_KEY``); the reply comes back as a chat completion or chat chunks
(``proxy/surfaces/responses_reply.py``, ``responses_stream.py``), per upstream read.

An upstream that answers ``/responses`` with 404 or 405 speaks chat completions only: it
is remembered (per process) and this call and the next go to ``/chat/completions`` with
the window translated.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import orjson

from proxy.errors import UpstreamStatusError
from proxy.surfaces.responses_items import to_items
from proxy.surfaces.responses_reply import completion_from_response
from proxy.surfaces.responses_request import (
    OPTIONS_KEY,
    responses_tool_choice,
    responses_tools,
)
from proxy.surfaces.responses_stream import ChunkReader
from proxy.upstreams.base import SSEEvent, UpstreamRequest, UpstreamResponse, UpstreamStream
from proxy.upstreams.openai_http import OpenAIUpstream
from strategies import native

__all__ = ["ResponsesUpstream", "chat_request", "responses_body"]

logger = logging.getLogger("memory_proxy.upstream")
CHAT_ONLY_STATUSES = (404, 405)
# the chat options a Responses body spells another way (or not at all)
CHAT_ONLY = ("messages", "stream_options", "tools", "tool_choice", "max_tokens",
             "response_format", "reasoning_effort", "logprobs", OPTIONS_KEY)


def responses_body(body: dict[str, Any], stream: bool) -> dict[str, Any]:
    """A chat-shaped turn body (window in ``messages``) as a Responses request."""
    options = dict(body.get(OPTIONS_KEY) or {})
    out = {**options, **{k: v for k, v in body.items() if k not in CHAT_ONLY}}
    out["input"] = to_items(body.get("messages") or [])
    out["stream"] = stream
    # the client's built-in tools as it sent them; function tools (and the proxy's own
    # built-in tools) from the turn's chat tools
    native_tools = [t for t in options.get("tools") or () if t.get("type") != "function"]
    tools = native_tools + responses_tools(body.get("tools"))
    if tools:
        out["tools"] = tools
    else:
        out.pop("tools", None)
    if "tool_choice" in body:
        out["tool_choice"] = responses_tool_choice(body["tool_choice"])
    return out


def chat_request(request: UpstreamRequest) -> UpstreamRequest:
    """The same turn for a chat completions upstream: native parts and Responses options
    left out."""
    body = {k: v for k, v in request.body.items() if k != OPTIONS_KEY}
    messages = []
    for message in body.get("messages") or ():
        if any("namespace" in call for call in message.get("tool_calls") or ()):
            # a namespaced tool's call (Responses only): the chat model sees the function
            message = {**message, "tool_calls": [
                {k: v for k, v in call.items() if k != "namespace"}
                for call in message["tool_calls"]]}
        content = message.get("content")
        stripped = native.for_api(content, "chat")
        if stripped is not content:
            if stripped == "" and message.get("role") == "user":
                continue  # a built-in call's output alone: nothing a chat model reads
            message = {**message, "content": stripped}
        messages.append(message)
    body["messages"] = messages
    return UpstreamRequest(body, request.headers)


def _json(body: bytes) -> Any:
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return None


def _about_the_call(exc: UpstreamStatusError) -> bool:
    """A 404 that answers the call, not the path: an OpenAI-shaped error naming a model or
    a parameter (``model_not_found``: the Responses API is there, the model is not)."""
    error = _json(exc.raw_body)
    error = error.get("error") if isinstance(error, dict) else None
    if not isinstance(error, dict):
        return False
    code, param = str(error.get("code") or ""), error.get("param")
    return "model" in code or bool(param) or "previous_response" in code


class _TranslatedStream:
    """A Responses event stream read as chat chunk events (``UpstreamStream``)."""

    def __init__(self, stream: UpstreamStream) -> None:
        self.status_code = stream.status_code
        self.headers = stream.headers
        self._stream = stream
        self._reader = ChunkReader()
        self._done = False
        self._events: AsyncIterator[SSEEvent] | None = None

    def _translate(self, event: SSEEvent) -> list[SSEEvent]:
        data = event.data
        if data[:1] != b"{":
            return []
        try:
            parsed = orjson.loads(data)
        except orjson.JSONDecodeError:
            return [event]  # junk: the relay says so
        if not isinstance(parsed, dict):
            return [event]
        out = []
        for chunk in self._reader.read(parsed):
            raw = orjson.dumps(chunk)
            out.append(SSEEvent(raw=b"data: " + raw + b"\n\n", data=raw))
        if parsed.get("type") in ("response.completed", "response.incomplete"):
            self._done = True
            out.append(SSEEvent(raw=b"data: [DONE]\n\n", data=b"[DONE]"))
        return out

    def __aiter__(self) -> AsyncIterator[SSEEvent]:
        if self._events is None:
            self._events = self._run()
        return self._events

    async def _run(self) -> AsyncIterator[SSEEvent]:
        pending: list[SSEEvent] = []
        async for event in self._stream:
            pending.extend(self._translate(event))
            while pending:
                yield pending.pop(0)
            if self._done:
                return

    def ready(self) -> list[SSEEvent]:
        ready = getattr(self._stream, "ready", None)
        if ready is None or self._done:
            return []
        out: list[SSEEvent] = []
        for event in ready():
            out.extend(self._translate(event))
        return out

    async def aclose(self) -> None:
        await self._stream.aclose()


class ResponsesUpstream:
    """``chat``/``chat_stream`` answered by ``direct``'s Responses API, or by its chat
    completions once it said it has no Responses API (404/405)."""

    def __init__(self, direct: OpenAIUpstream, *, detect: bool = True) -> None:
        self.direct = direct
        self.detect = detect
        self.chat_only = False

    async def start(self) -> None:
        await self.direct.start()

    async def close(self) -> None:
        await self.direct.close()

    async def models(self, headers: dict[str, str]) -> UpstreamResponse:
        return await self.direct.models(headers)

    def _no_responses_api(self, exc: UpstreamStatusError) -> bool:
        if self.detect and exc.status_code in CHAT_ONLY_STATUSES and not _about_the_call(exc):
            logger.info("%s has no Responses API (%d): chat completions from now on",
                        self.direct.base_url, exc.status_code)
            self.chat_only = True
            return True
        return False

    async def chat(self, request: UpstreamRequest) -> UpstreamResponse:
        if not self.chat_only:
            body = responses_body(request.body, stream=False)
            try:
                response = await self.direct.post(
                    "/responses", UpstreamRequest(body, request.headers)
                )
            except UpstreamStatusError as exc:
                if not self._no_responses_api(exc):
                    raise
            else:
                completion = completion_from_response(_json(response.body))
                return UpstreamResponse(
                    response.status_code, orjson.dumps(completion), response.headers
                )
        return await self.direct.chat(chat_request(request))

    async def chat_stream(self, request: UpstreamRequest) -> UpstreamStream:
        if not self.chat_only:
            body = responses_body(request.body, stream=True)
            try:
                stream = await self.direct.post_stream(
                    "/responses", UpstreamRequest(body, request.headers)
                )
            except UpstreamStatusError as exc:
                if not self._no_responses_api(exc):
                    raise
            else:
                return _TranslatedStream(stream)
        return await self.direct.chat_stream(chat_request(request))
