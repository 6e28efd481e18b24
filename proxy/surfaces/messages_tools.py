"""The built-in tools (``fetch_tool_result``, ``search_history``) on a Messages upstream.

The rules are chat completions' (proxy/tools/builtin.py, docs/ARCHITECTURE.md "Built-in
tools"), in the Messages API's shapes: ``offer`` adds the tools' definitions (name,
description, ``input_schema``) after the client's; when a reply's ``tool_use`` blocks all
call built-in tools, the proxy answers them from the session's store (``tool_result``
blocks) and calls the model again, the reply with its thinking sent back as it came. At
most ``MAX_ROUNDS`` hidden rounds; built-in calls mixed with the client's, or left after
the last round, are dropped. The hidden exchange is never stored: the stored reply is what
the client received.

- ``complete``: a whole reply.
- ``RoundsStream``: a streamed one. The client sees one message: the first round's
  ``message_start``, every round's blocks but the built-in calls (renumbered from 0), the
  last round's ``message_delta`` and ``message_stop``.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import orjson

from proxy.agents import ResolvedAgent
from proxy.services import Services
from proxy.surfaces.messages_reply import MessageAccumulator, message_of
from proxy.surfaces.messages_request import arguments_of
from proxy.tools.builtin import MAX_ROUNDS, TOOLS, Offered, answer_all
from proxy.upstreams.anthropic_http import AnthropicUpstream
from proxy.upstreams.base import SSEEvent, UpstreamRequest, UpstreamResponse
from strategies.base import Window
from strategies.records import SessionKey

logger = logging.getLogger("memory_proxy.builtin_tools")


def definition(name: str) -> dict[str, Any]:
    function = TOOLS[name].definition["function"]
    return {"name": function["name"], "description": function["description"],
            "input_schema": function["parameters"]}


def offer(body: dict[str, Any], agent: ResolvedAgent, key: SessionKey, window: Window
          ) -> Offered | None:
    """Add the built-in tools the agent enables to ``body`` (those the client does not
    declare itself); the tools the proxy answers, or None."""
    wanted = [name for name in TOOLS if agent.has_tool(name)]
    tools = body.get("tools")
    if not wanted or (tools is not None and not isinstance(tools, list)):
        return None
    declared = {t.get("name") for t in tools or () if isinstance(t, dict)}
    names = tuple(name for name in wanted if name not in declared)
    if not names:
        return None
    body["tools"] = [*(tools or ()), *(definition(name) for name in names)]
    in_window = frozenset(i.message.seq for i in window.items if i.marker is None)
    return Offered(names, key, in_window)


def _builtin(block: Any, offered: Offered) -> bool:
    return isinstance(block, dict) and block.get("type") == "tool_use" and offered.answers(
        block.get("name"))


async def _answers(services: Services, offered: Offered, blocks: list[dict[str, Any]]
                   ) -> dict[str, Any]:
    calls = [{"id": b.get("id"), "type": "function", "function": {
        "name": b.get("name"), "arguments": arguments_of(b.get("input"))}} for b in blocks]
    answered = await answer_all(services.store, offered, calls)
    return {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": a["tool_call_id"], "content": a["content"]}
        for a in answered]}


def _next_body(body: dict[str, Any], messages: list[dict[str, Any]], rounds: int,
               offered: Offered) -> dict[str, Any]:
    out = {**body, "messages": messages}
    if rounds >= MAX_ROUNDS:
        tools = [t for t in body.get("tools") or () if not offered.answers(t.get("name"))]
        if tools:
            out["tools"] = tools
        else:
            out["tool_choice"] = {"type": "none"}
    return out


def _first_usage(message: dict[str, Any]) -> dict[str, Any]:
    """The usage stored after hidden rounds: the first round's prompt (the window the
    strategy measured) calibrates the session."""
    return {k: v for k, v in (message.get("usage") or {}).items() if k != "output_tokens"}


async def complete(
    services: Services, upstream: AnthropicUpstream, offered: Offered,
    request: UpstreamRequest, response: UpstreamResponse, query: str,
) -> tuple[UpstreamResponse, dict[str, Any] | None]:
    """The reply for the client after the hidden rounds, and the usage to store (None:
    the reply's own)."""
    messages = list(request.body.get("messages") or ())
    message = message_of(response.body)
    first = message
    rounds = 0
    while True:
        blocks = message.get("content") or []
        builtin = [b for b in blocks if _builtin(b, offered)]
        calls = [b for b in blocks if isinstance(b, dict) and b.get("type") == "tool_use"]
        if not builtin and rounds == 0:
            return response, None
        if not builtin or len(builtin) < len(calls) or rounds >= MAX_ROUNDS:
            break
        messages += [{"role": "assistant", "content": blocks},
                     await _answers(services, offered, builtin)]
        rounds += 1
        body = _next_body(request.body, messages, rounds, offered)
        response = await upstream.messages(UpstreamRequest(body, request.headers), query)
        message = message_of(response.body)
    if builtin:
        message["content"] = [b for b in message.get("content") or ()
                              if not _builtin(b, offered)]
        if len(builtin) == len(calls) and message.get("stop_reason") == "tool_use":
            message["stop_reason"] = "end_turn"
    logger.info("%s: %d hidden built-in tool round(s)", offered.key.session, rounds)
    stored = _first_usage(first) if rounds else None
    return UpstreamResponse(response.status_code, orjson.dumps(message),
                            response.headers), stored


def _event(data: dict[str, Any]) -> SSEEvent:
    payload = orjson.dumps(data)
    return SSEEvent(b"event: " + str(data["type"]).encode() + b"\ndata: " + payload + b"\n\n",
                    payload)


class RoundsStream:
    """A Messages stream whose built-in calls the proxy answers in hidden rounds (an
    ``UpstreamStream``: iterate for events)."""

    def __init__(self, services: Services, upstream: AnthropicUpstream, offered: Offered,
                 request: UpstreamRequest, stream: Any, query: str) -> None:
        self.services, self.upstream, self.offered = services, upstream, offered
        self.request, self.query = request, query
        self._stream = stream
        self.status_code = stream.status_code
        self.headers = stream.headers

    def __aiter__(self) -> AsyncIterator[SSEEvent]:
        return self._events()

    async def _events(self) -> AsyncIterator[SSEEvent]:
        messages = list(self.request.body.get("messages") or ())
        rounds, next_index = 0, 0
        while True:
            accumulator = MessageAccumulator()
            shown: dict[int, int] = {}  # this round's block index -> the client's
            hidden: set[int] = set()
            client_calls = 0
            ending: list[dict[str, Any]] = []
            async for event in self._stream:
                if not event.data:
                    if rounds == 0:
                        yield event
                    continue
                data = accumulator.add_data(event.data)
                kind = data["type"]
                if kind == "message_start":
                    if rounds == 0:
                        yield event
                elif kind.startswith("content_block_"):
                    index = int(data["index"])
                    if kind == "content_block_start":
                        block = data.get("content_block") or {}
                        if _builtin(block, self.offered):
                            hidden.add(index)
                            continue
                        client_calls += block.get("type") == "tool_use"
                        shown[index] = next_index
                        next_index += 1
                    if index in hidden:
                        continue
                    yield _event({**data, "index": shown[index]}) if shown[index] != index \
                        else event
                elif kind in ("message_delta", "message_stop"):
                    ending.append(data)
                else:  # ping, error
                    yield event
                    if kind == "error":
                        return
            await self._stream.aclose()
            message = accumulator.message()
            if hidden and not client_calls and rounds < MAX_ROUNDS and accumulator.complete \
                    and message is not None:
                blocks = message["content"]
                messages += [{"role": "assistant", "content": blocks}, await _answers(
                    self.services, self.offered, [b for b in blocks if _builtin(b, self.offered)])]
                rounds += 1
                body = _next_body(self.request.body, messages, rounds, self.offered)
                self._stream = await self.upstream.messages_stream(
                    UpstreamRequest(body, self.request.headers), self.query)
                continue
            for data in ending:
                if data["type"] == "message_delta" and hidden and not client_calls:
                    delta = data.get("delta") or {}
                    if delta.get("stop_reason") == "tool_use":
                        data = {**data, "delta": {**delta, "stop_reason": "end_turn"}}
                yield _event(data)
            if rounds:
                logger.info("%s: %d hidden built-in tool round(s)", self.offered.key.session,
                            rounds)
            return

    async def aclose(self) -> None:
        await self._stream.aclose()
