"""Built-in tools the proxy answers itself: ``fetch_tool_result`` and ``search_history``.

When an agent lists one of them in its tools (``{"name": "search_history"}``), ``offer``
adds its definition to every outgoing request of that agent (after the client's own
tools). When the model calls it, the proxy answers from the session's store and calls the
model again, so the client only sees the final answer:

- non-streaming: ``complete`` runs the hidden rounds and returns one completion;
- streaming: ``proxy.tools.stream.FetchStream`` wraps the upstream stream and runs the
  same rounds inside it.

Rules (docs/ARCHITECTURE.md, "Built-in tools"):

- The hidden exchange is never stored: the stored reply is what the client received, so
  a full-history client's next request still matches the log.
- A reply that mixes built-in calls with the client's own tool calls: the built-in calls
  are dropped and the client's calls go through unchanged (renumbered from 0). The model
  sees its client calls answered next turn and may ask again.
- At most ``MAX_ROUNDS`` hidden rounds; the request after the last one no longer lets the
  model call the built-in tools. A built-in call that still comes back is dropped.
- Usage reported to the client is the sum of every round; the session's calibration uses
  the first round's prompt (the window the strategy measured).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.agents import ResolvedAgent
from proxy.services import Services
from proxy.surfaces.tool_calls import tool_name
from proxy.tools import fetch_tool, history_tool
from proxy.upstreams.base import Upstream, UpstreamRequest, UpstreamResponse
from storage.base import Store, StoreUnavailable
from strategies.base import Window
from strategies.records import SessionKey

__all__ = ["MAX_ROUNDS", "TOOLS", "Offered", "complete", "offer"]

logger = logging.getLogger("memory_proxy.builtin_tools")

MAX_ROUNDS = 3
USAGE_FIELDS = ("prompt_tokens", "completion_tokens", "total_tokens")


@dataclass(frozen=True, slots=True)
class Offered:
    """The built-in tools offered with one request, and what answering them needs: the
    session, and the seqs its window sends whole (search_history looks elsewhere)."""

    names: tuple[str, ...]
    key: SessionKey
    in_window: frozenset[int] = frozenset()

    def answers(self, name: Any) -> bool:
        return name in self.names


Answer = Callable[[Store, "Offered", dict[str, Any]], Awaitable[str]]


@dataclass(frozen=True, slots=True)
class BuiltinTool:
    definition: dict[str, Any]
    answer: Answer
    unavailable: str  # the answer when the store cannot be reached

    @property
    def name(self) -> str:
        return str(self.definition["function"]["name"])


TOOLS: dict[str, BuiltinTool] = {
    tool.name: tool
    for tool in (
        BuiltinTool(fetch_tool.TOOL_DEFINITION, fetch_tool.answer,
                    "The memory store is unavailable; the result cannot be fetched now."),
        BuiltinTool(history_tool.TOOL_DEFINITION, history_tool.answer,
                    "The memory store is unavailable; the history cannot be searched now."),
    )
}  # fmt: skip


def offer(
    body: dict[str, Any], agent: ResolvedAgent, key: SessionKey, window: Window | None = None
) -> Offered | None:
    """Add the definitions of the built-in tools the agent enables to the outgoing
    ``body``; the tools the proxy then answers, or None.

    A client that declares a tool of a built-in's name keeps it (that one is neither
    added nor intercepted); requests with legacy ``functions`` or ``n > 1`` are left
    alone."""
    wanted = [name for name in TOOLS if agent.has_tool(name)]
    if not wanted or "functions" in body:
        return None
    n = body.get("n")
    if isinstance(n, int) and n > 1:
        return None
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        return None
    declared = {tool_name(t) for t in tools or ()}
    names = tuple(name for name in wanted if name not in declared)
    if not names:
        return None
    body["tools"] = [*(tools or ()), *(TOOLS[name].definition for name in names)]
    in_window = frozenset(
        item.message.seq for item in (window.items if window else ()) if item.marker is None
    )
    return Offered(names, key, in_window)


def without_offer(body: dict[str, Any], offered: Offered) -> dict[str, Any]:
    """The request after the last hidden round: the model can no longer call the
    built-in tools. The client's own tools stay callable; with none, the definitions stay
    (strict providers want the tools of the calls in the history) and ``tool_choice``
    becomes ``none``."""
    out = dict(body)
    tools = [t for t in body.get("tools") or () if not offered.answers(tool_name(t))]
    if tools:
        out["tools"] = tools
    else:
        out["tools"] = [TOOLS[name].definition for name in offered.names]
        out["tool_choice"] = "none"
    return out


async def answer(store: Store, offered: Offered, call: dict[str, Any]) -> dict[str, Any]:
    """The tool message answering one built-in call."""
    tool = TOOLS[str(tool_name(call))]
    try:
        text = await tool.answer(store, offered, call)
    except StoreUnavailable:
        text = tool.unavailable
    return {"role": "tool", "tool_call_id": call.get("id"), "content": text}


async def answer_all(
    store: Store, offered: Offered, calls: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    return list(await asyncio.gather(*(answer(store, offered, c) for c in calls)))


def hidden_call(content: Any, calls: list[dict[str, Any]]) -> dict[str, Any]:
    return {"role": "assistant", "content": content or None, "tool_calls": calls}


def add_usage(total: dict[str, Any] | None, usage: Any) -> dict[str, Any] | None:
    if not isinstance(usage, dict):
        return total
    if total is None:
        return dict(usage)
    out = dict(total)
    for name in USAGE_FIELDS:
        if isinstance(usage.get(name), int):
            out[name] = int(out.get(name) or 0) + usage[name]
    return out


def memory_usage(first: Any) -> dict[str, Any]:
    """Usage for the stored turn after hidden rounds: only the first round's prompt (the
    window the strategy measured) calibrates the session; the reply is counted locally."""
    prompt = first.get("prompt_tokens") if isinstance(first, dict) else None
    return {"prompt_tokens": prompt if isinstance(prompt, int) else None}


def next_body(
    body: dict[str, Any], messages: list[dict[str, Any]], rounds: int, offered: Offered
) -> dict[str, Any]:
    out = {**body, "messages": messages}
    return without_offer(out, offered) if rounds >= MAX_ROUNDS else out


async def complete(
    services: Services, offered: Offered, request: UpstreamRequest, response: UpstreamResponse,
    upstream: Upstream | None = None,
) -> tuple[UpstreamResponse, dict[str, Any] | None]:
    """Answer the model's built-in calls until it replies for the client.

    Returns the completion for the client and, when hidden rounds ran, the usage to store
    (``memory_usage``); None means the reply's own usage applies.
    """
    messages = list(request.body.get("messages") or ())
    first_usage: Any = None
    total: dict[str, Any] | None = None
    rounds = 0
    while True:
        try:
            data = orjson.loads(response.body)
            choice = data["choices"][0]
            message = choice["message"]
            calls = message.get("tool_calls") or []
        except (orjson.JSONDecodeError, KeyError, IndexError, TypeError, AttributeError):
            return response, None
        usage = data.get("usage")
        if rounds == 0:
            first_usage = usage
        total = add_usage(total, usage)
        builtin = [c for c in calls if offered.answers(tool_name(c))]
        if not builtin and rounds == 0:
            return response, None
        if not builtin or len(builtin) < len(calls) or rounds >= MAX_ROUNDS:
            break
        messages += [hidden_call(message.get("content"), builtin)]
        messages += await answer_all(services.store, offered, builtin)
        rounds += 1
        body = next_body(request.body, messages, rounds, offered)
        response = await (upstream or services.upstream).chat(
            UpstreamRequest(body, request.headers)
        )
    if builtin:
        drop_builtin_calls(choice, message, offered)
    if rounds:
        logger.info("%s: %d hidden built-in tool round(s)", offered.key.session, rounds)
        if total is not None and "usage" in data:
            data["usage"] = total
    stored = memory_usage(first_usage) if rounds else None
    return UpstreamResponse(response.status_code, orjson.dumps(data), response.headers), stored


def drop_builtin_calls(choice: dict[str, Any], message: dict[str, Any], offered: Offered) -> None:
    remaining = [c for c in message.get("tool_calls") or () if not offered.answers(tool_name(c))]
    if remaining:
        message["tool_calls"] = remaining
        return
    message.pop("tool_calls", None)
    if message.get("content") is None:
        message["content"] = ""
    if choice.get("finish_reason") == "tool_calls":
        choice["finish_reason"] = "stop"
