"""The built-in ``fetch_tool_result`` tool: the way back to an evicted tool result.

When an agent lists ``{"name": "fetch_tool_result"}`` in its tools, ``offer`` adds the
tool's definition to every outgoing request of that agent (after the client's own tools).
When the model calls it, the proxy answers from the session's store with the original
content (never a stub) and calls the model again, so the client only sees the final answer:

- non-streaming: ``complete`` runs the hidden rounds and returns one completion;
- streaming: ``proxy.fetch_stream.FetchStream`` wraps the upstream stream and runs the
  same rounds inside it.

Rules (docs/ARCHITECTURE.md, "fetch_tool_result"):

- The hidden exchange is never stored: the stored reply is what the client received, so
  a full-history client's next request still matches the log.
- A reply that mixes fetch calls with the client's own tool calls: the fetch calls are
  dropped and the client's calls go through unchanged (renumbered from 0). The model sees
  its client calls answered next turn and may ask for the fetch again.
- At most ``MAX_ROUNDS`` hidden rounds; the request after the last one no longer lets the
  model call the tool. A fetch call that still comes back is dropped.
- Usage reported to the client is the sum of every round; the session's calibration uses
  the first round's prompt (the window the strategy measured).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import orjson

from proxy.agents import ResolvedAgent
from proxy.services import Services
from proxy.upstream.base import UpstreamRequest, UpstreamResponse
from storage.base import Store, StoreUnavailable
from strategies.compression import FETCH_TOOL, content_text
from strategies.records import SessionKey

__all__ = ["FETCH_TOOL", "MAX_ROUNDS", "TOOL_DEFINITION", "complete", "offer"]

logger = logging.getLogger("memory_proxy.fetch_tool")

MAX_ROUNDS = 3
USAGE_FIELDS = ("prompt_tokens", "completion_tokens", "total_tokens")
TOOL_DEFINITION: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": FETCH_TOOL,
        "description": (
            "Reload the full output of an earlier tool call whose result was evicted from "
            "the conversation to save space. Pass the tool_call_id named in the eviction note."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "tool_call_id": {
                    "type": "string",
                    "description": "The id of the tool call whose result to reload.",
                }
            },
            "required": ["tool_call_id"],
            "additionalProperties": False,
        },
    },
}


def tool_name(tool: Any) -> str | None:
    function = tool.get("function") if isinstance(tool, dict) else None
    return function.get("name") if isinstance(function, dict) else None


def is_fetch(call: Any) -> bool:
    return tool_name(call) == FETCH_TOOL


def offer(body: dict[str, Any], agent: ResolvedAgent) -> bool:
    """Add the tool's definition to the outgoing ``body`` when the agent enables it.

    True when the proxy then answers the tool's calls. A client that declares a tool of
    that name keeps it (nothing is added or intercepted); requests with legacy
    ``functions`` or ``n > 1`` are left alone.
    """
    if not agent.has_tool(FETCH_TOOL) or "functions" in body:
        return False
    n = body.get("n")
    if isinstance(n, int) and n > 1:
        return False
    tools = body.get("tools")
    if tools is None:
        body["tools"] = [TOOL_DEFINITION]
        return True
    if not isinstance(tools, list) or any(tool_name(t) == FETCH_TOOL for t in tools):
        return False
    body["tools"] = [*tools, TOOL_DEFINITION]
    return True


def without_offer(body: dict[str, Any]) -> dict[str, Any]:
    """The request after the last hidden round: the model can no longer call the tool.
    The client's own tools stay callable; with none, the definition stays (strict providers
    want the tools of the calls in the history) and ``tool_choice`` becomes ``none``."""
    out = dict(body)
    tools = [t for t in body.get("tools") or () if not is_fetch(t)]
    if tools:
        out["tools"] = tools
    else:
        out["tools"] = [TOOL_DEFINITION]
        out["tool_choice"] = "none"
    return out


def requested_id(call: dict[str, Any]) -> str | None:
    arguments = (call.get("function") or {}).get("arguments")
    try:
        parsed = orjson.loads(arguments) if isinstance(arguments, str | bytes) else arguments
    except orjson.JSONDecodeError:
        return None
    wanted = parsed.get("tool_call_id") if isinstance(parsed, dict) else None
    return wanted.strip() if isinstance(wanted, str) and wanted.strip() else None


async def answer(store: Store, key: SessionKey, call: dict[str, Any]) -> dict[str, Any]:
    """The tool message answering one fetch call: the stored original, or why not."""
    wanted = requested_id(call)
    if wanted is None:
        text = (
            f'{FETCH_TOOL} needs {{"tool_call_id": "<id>"}}: the id named in the note of '
            "the evicted result."
        )
    else:
        try:
            found = await store.find_tool_result(key, wanted)
        except StoreUnavailable:
            found, text = None, "The memory store is unavailable; the result cannot be fetched now."
        else:
            text = f'No tool result with tool_call_id="{wanted}" is stored in this session.'
        if found is not None:
            text = content_text(found.content)
    return {"role": "tool", "tool_call_id": call.get("id"), "content": text}


async def answer_all(
    store: Store, key: SessionKey, calls: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    return list(await asyncio.gather(*(answer(store, key, c) for c in calls)))


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


def next_body(body: dict[str, Any], messages: list[dict[str, Any]], rounds: int) -> dict[str, Any]:
    out = {**body, "messages": messages}
    return without_offer(out) if rounds >= MAX_ROUNDS else out


async def complete(
    services: Services, key: SessionKey, request: UpstreamRequest, response: UpstreamResponse
) -> tuple[UpstreamResponse, dict[str, Any] | None]:
    """Answer the model's fetch calls until it replies for the client.

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
        fetches = [c for c in calls if is_fetch(c)]
        if not fetches and rounds == 0:
            return response, None
        if not fetches or len(fetches) < len(calls) or rounds >= MAX_ROUNDS:
            break
        messages += [hidden_call(message.get("content"), fetches)]
        messages += await answer_all(services.store, key, fetches)
        rounds += 1
        body = next_body(request.body, messages, rounds)
        response = await services.upstream.chat(UpstreamRequest(body, request.headers))
    if fetches:
        drop_fetch_calls(choice, message)
    if rounds:
        logger.info("%s: %d hidden %s round(s)", key.session, rounds, FETCH_TOOL)
        if total is not None and "usage" in data:
            data["usage"] = total
    stored = memory_usage(first_usage) if rounds else None
    return UpstreamResponse(response.status_code, orjson.dumps(data), response.headers), stored


def drop_fetch_calls(choice: dict[str, Any], message: dict[str, Any]) -> None:
    remaining = [c for c in message.get("tool_calls") or () if not is_fetch(c)]
    if remaining:
        message["tool_calls"] = remaining
        return
    message.pop("tool_calls", None)
    if message.get("content") is None:
        message["content"] = ""
    if choice.get("finish_reason") == "tool_calls":
        choice["finish_reason"] = "stop"
