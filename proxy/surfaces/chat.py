"""``POST .../chat/completions``: the OpenAI chat completions surface, an adapter on the
turn pipeline (proxy/turn/pipeline.py, the port in proxy/surfaces/base.py).

The request's messages are already chat messages: parsing validates them and splits the
system prompt off; rendering puts the window's messages in place of the client's. The
upstream's reply goes back byte for byte, stream events as they arrived (a usage-only
chunk the client did not ask for is dropped), closed by ``data: [DONE]``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from proxy.errors import BadRequest, ProxyError
from proxy.http import limits
from proxy.http.requests import parse_json_object, read_body
from proxy.services import Services
from proxy.turn import history_sync, sync_plan
from proxy.turn.state import Turn, TurnRequest
from proxy.upstreams.base import SSEEvent, UpstreamResponse

# headers a provider may need, forwarded as sent; everything else stays at the proxy
FORWARDED_HEADERS = (
    "authorization",
    "api-key",
    "x-api-key",
    "openai-organization",
    "openai-project",
    "openai-beta",
    "anthropic-version",
    "anthropic-beta",
)
OWN_METADATA = ("agent_id", "session_id")
DONE = b"data: [DONE]\n\n"
LARGE_BODY = 1 << 20


def forwarded_headers(headers: Mapping[str, str]) -> dict[str, str]:
    return {name: headers[name] for name in FORWARDED_HEADERS if name in headers}


def upstream_body(body: dict[str, Any], messages: list[dict[str, Any]] | None) -> dict[str, Any]:
    """``body`` with ``messages`` in place of the client's, without the proxy's own
    metadata keys."""
    out = dict(body)
    if messages is not None:
        out["messages"] = messages
    metadata = out.get("metadata")
    if isinstance(metadata, dict) and any(k in metadata for k in OWN_METADATA):
        rest = {k: v for k, v in metadata.items() if k not in OWN_METADATA}
        if rest:
            out["metadata"] = rest
        else:
            out.pop("metadata")
    return out


def wants_usage(body: Mapping[str, Any]) -> bool:
    options = body.get("stream_options")
    return isinstance(options, dict) and bool(options.get("include_usage"))


class ChatSurface:
    name = "chat"
    stream_media_type = "text/event-stream"

    async def parse(self, request: Request, services: Services) -> TurnRequest:
        raw = await read_body(request, services.settings.max_body_bytes)
        if len(raw) >= LARGE_BODY:
            # joining a large body's pieces and reading it each hold the loop: other
            # requests are served in between
            await asyncio.sleep(0)
        body = parse_json_object(raw)
        messages = history_sync.validate_messages(body.get("messages"))
        if "stream" in body and not isinstance(body["stream"], bool):
            raise BadRequest("'stream' must be a boolean", param="stream")
        headers = {k.lower(): v for k, v in reversed(request.headers.items())}
        forwarded = forwarded_headers(headers)
        limits.check_identifiers(body)
        limits.check_limits(services.settings, messages, forwarded)
        system, conversation = history_sync.split_system(messages)
        model = body.get("model")
        return TurnRequest(
            conversation=conversation,
            system=system,
            model=str(model) if model else None,
            stream=body.get("stream") is True,
            options=body,
            tools=body.get("tools"),
            forwarded=forwarded,
            headers=headers,
            path_params=dict(request.path_params),
            memory_off=headers.get("x-memory", "").lower() == "off",
            history_header=headers.get("x-memory-history"),
            retry=sync_plan.RetryHint.from_headers(headers),
        )

    def error_body(self, exc: ProxyError) -> bytes:
        return exc.body()

    def upstream_body(
        self, request: TurnRequest, messages: list[dict[str, Any]] | None, api: str,
        turn: Turn | None = None,
    ) -> dict[str, Any]:
        if api != "chat":
            raise NotImplementedError(f"the chat surface renders for a chat upstream, not {api}")
        return upstream_body(request.options, messages)

    def reply(
        self, turn: Turn | None, response: UpstreamResponse, headers: dict[str, str]
    ) -> Response:
        if turn is None:  # a plain pass-through: the upstream's body as it came
            media_type = response.headers.get("content-type") or "application/json"
            return Response(response.body, response.status_code, media_type=media_type)
        return Response(
            response.body, response.status_code, headers, media_type="application/json"
        )

    def stream_event(
        self, turn: Turn | None, chunk: dict[str, Any] | None, event: SSEEvent
    ) -> bytes | None:
        if (
            chunk is not None
            and turn is not None
            and chunk.get("usage")
            and not chunk.get("choices")
            and not wants_usage(turn.request.options)
        ):
            # usage calibrates the token estimate; the client did not ask for it
            return None
        return event.raw

    def stream_end(self, turn: Turn | None) -> bytes:
        return DONE

    def stream_error(self, exc: ProxyError) -> bytes:
        return b"data: " + exc.body() + b"\n\n"


chat_surface = ChatSurface()
