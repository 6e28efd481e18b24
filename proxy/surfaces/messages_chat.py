"""Chat completion calls served by a Messages API upstream: what the proxy itself sends for
a session served through the Messages surface (the summarizer's calls), in chat form,
translated to a Messages request and its reply back to a ``chat.completion``."""

from __future__ import annotations

from typing import Any

import orjson

from proxy.services import Services
from proxy.surfaces.messages_render import render_window
from proxy.surfaces.messages_reply import message_of
from proxy.upstreams.anthropic_http import AnthropicUpstream
from proxy.upstreams.base import UpstreamRequest, UpstreamResponse

DEFAULT_MAX_TOKENS = 4096


def _tool(tool: Any) -> dict[str, Any] | None:
    if not isinstance(tool, dict):
        return None
    if "input_schema" in tool or tool.get("type") not in (None, "function"):
        return tool  # already the Messages API's (a custom tool, a server tool)
    function = tool.get("function")
    if not isinstance(function, dict):
        return None
    out = {"name": function.get("name"),
           "input_schema": function.get("parameters") or {"type": "object"}}
    if function.get("description"):
        out["description"] = function["description"]
    return out


def messages_body(body: dict[str, Any]) -> dict[str, Any]:
    """A chat completion request as a Messages request."""
    tools = [t for t in (_tool(t) for t in body.get("tools") or ()) if t is not None]
    rendered = render_window(body.get("messages") or [], tools_declared=bool(tools))
    out: dict[str, Any] = {
        "model": body.get("model"),
        "max_tokens": body.get("max_tokens") or body.get("max_completion_tokens")
        or DEFAULT_MAX_TOKENS,
        "messages": rendered.messages,
    }
    if rendered.system:
        out["system"] = rendered.system
    if tools:
        out["tools"] = tools
        choice = body.get("tool_choice")
        if choice == "none":
            out["tool_choice"] = {"type": "none"}
        elif choice == "required":
            out["tool_choice"] = {"type": "any"}
    if "temperature" in body:
        out["temperature"] = body["temperature"]
    return out


def completion_body(message: dict[str, Any]) -> bytes:
    text = "".join(str(b.get("text") or "") for b in message.get("content") or ()
                   if isinstance(b, dict) and b.get("type") == "text")
    usage = message.get("usage") or {}
    prompt = sum(usage.get(k) or 0 for k in ("input_tokens", "cache_read_input_tokens",
                                              "cache_creation_input_tokens"))
    return orjson.dumps({
        "id": message.get("id"), "object": "chat.completion", "model": message.get("model"),
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                     "finish_reason": "stop"}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": usage.get("output_tokens") or 0,
                  "cache_read_input_tokens": usage.get("cache_read_input_tokens") or 0},
    })


class MessagesAsChat:
    """The ``chat`` call of the Upstream port on a Messages upstream (not streamed)."""

    def __init__(self, upstream: AnthropicUpstream) -> None:
        self.upstream = upstream

    async def chat(self, request: UpstreamRequest) -> UpstreamResponse:
        response = await self.upstream.messages(
            UpstreamRequest(messages_body(request.body), request.headers))
        return UpstreamResponse(response.status_code,
                                completion_body(message_of(response.body)), response.headers)


def messages_upstream(services: Services) -> AnthropicUpstream:
    """The process's Messages upstream (``MEMORY_PROXY_ANTHROPIC_URL``), built on first use
    with the direct upstream's pool and TLS settings."""
    upstream = services.messages_upstream
    if upstream is None:
        from proxy.upstreams.openai_http import TLSSettings

        settings = services.settings
        upstream = services.messages_upstream = AnthropicUpstream(
            settings.anthropic_url,
            api_key=settings.anthropic_key(),
            timeout=settings.upstream_timeout,
            max_connections=settings.upstream_max_connections,
            tls=TLSSettings.from_settings(settings),
        )
    return upstream  # type: ignore[no-any-return]
