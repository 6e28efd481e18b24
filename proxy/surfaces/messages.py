"""``POST /v1/messages`` and ``/v1/messages/count_tokens``: Anthropic's Messages API, an
adapter on the turn pipeline (proxy/turn/pipeline.py, the port in proxy/surfaces/base.py).

A request is read into chat-form records (proxy/surfaces/messages_request.py) and sent

- to the Messages upstream (``MEMORY_PROXY_ANTHROPIC_URL``) as Messages, the window
  rendered for Anthropic (proxy/surfaces/messages_render.py), when the agent's
  ``llm.api`` is ``messages``, or, with no ``llm.api``, when the model is a Claude model
  without a provider prefix (``claude-…``);
- otherwise to the chat completions upstream (OpenAI-compatible, or litellm for
  ``provider/model`` ids), translated, its reply translated back
  (proxy/surfaces/messages_translate.py).

Errors take Anthropic's shape (``{"type": "error", "error": {...}}``); a stream ends with
``message_stop``, sent after the turn is stored, or an ``error`` event.
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from proxy.agents import DEFAULT_AGENT
from proxy.errors import ProxyError
from proxy.http import limits
from proxy.http.requests import parse_json_object, read_body
from proxy.services import Services
from proxy.surfaces.chat import forwarded_headers, upstream_body
from proxy.surfaces.chat_reply import completion_of
from proxy.surfaces.messages_api import MESSAGES, TRANSLATED
from proxy.surfaces.messages_chat import messages_upstream
from proxy.surfaces.messages_errors import error_body, error_event
from proxy.surfaces.messages_render import render_window
from proxy.surfaces.messages_request import MessagesRequest, parse_request
from proxy.surfaces.messages_translate import ChunkTranslator, chat_request, message_from_completion
from proxy.turn import cache_hints, prompt_cache, sync_plan
from proxy.turn.history_sync import fingerprint
from proxy.turn.identity import OWN_SESSION_HEADERS, identify_turn
from proxy.turn.load import load
from proxy.turn.render import render
from proxy.turn.select import select
from proxy.turn.state import Turn, TurnRequest
from proxy.turn.sync import incoming, sync
from proxy.turn.upstream_api import UpstreamApi
from proxy.upstreams.base import SSEEvent, UpstreamRequest, UpstreamResponse
from strategies import native
from strategies.tokens import count_message

CLAUDE_CODE_SESSION = "x-claude-code-session-id"
MESSAGE_STOP = b'event: message_stop\ndata: {"type":"message_stop"}\n\n'


def uses_messages_api(api: str | None, model: str) -> bool:
    """Whether a Messages request goes to the Messages upstream (else: translated to chat
    completions). ``api``: the agent's ``llm.api``."""
    if api is not None:
        return api == "messages"
    return "/" not in model and model.lower().startswith("claude")


def claude_code_conversation(headers: dict[str, str], conversation: list[dict[str, Any]]
                             ) -> None:
    """A session keyed by Claude Code's ``X-Claude-Code-Session-Id`` is one conversation of
    that Claude Code session: it sends its sub-agents', title and quota calls under the
    same id, each a conversation of its own that it resends whole. They are told apart by
    their first user message (``<id>.<8 hex>``), so none rewinds another's log or reads its
    memory. (Changes ``headers``, the identity hints, in place.)"""
    value = headers.get(CLAUDE_CODE_SESSION)
    if not value or any(headers.get(h) for h in OWN_SESSION_HEADERS):
        return
    first = next((m for m in conversation if m.get("role") == "user"), None)
    if first is not None:
        headers[CLAUDE_CODE_SESSION] = f"{value[:119]}.{fingerprint(first)[:8]}"


async def read_request(request: Request, services: Services, *, count_only: bool = False
                       ) -> TurnRequest:
    """An HTTP request of the Messages surface as the pipeline reads it."""
    body = parse_json_object(await read_body(request, services.settings.max_body_bytes))
    parsed = parse_request(body, count_only=count_only)
    headers = {k.lower(): v for k, v in reversed(request.headers.items())}
    forwarded = forwarded_headers(headers)
    limits.check_identifiers(body)
    for index, message in enumerate(parsed.conversation):
        if message["role"] != "user":
            limits.check_message_identifiers(message, f"messages.{index}")
    limits.check_limits(services.settings, [*parsed.system, *parsed.conversation], forwarded)
    if not request.path_params.get("session"):
        claude_code_conversation(headers, parsed.conversation)
    metadata = body.get("metadata") if isinstance(body.get("metadata"), dict) else {}
    agent = str(request.path_params.get("agent") or headers.get("x-agent-id")
                or (metadata or {}).get("agent_id") or DEFAULT_AGENT)
    api = services.agents.resolve(agent, services.overrides.get(agent)).definition.llm.api
    native_api = uses_messages_api(api, parsed.model)
    return TurnRequest(
        api="messages" if native_api else "chat",
        conversation=parsed.conversation,
        system=parsed.system,
        model=parsed.model,
        stream=parsed.stream,
        options=body,
        tools=parsed.tools,
        forwarded=forwarded,
        headers=headers,
        path_params=dict(request.path_params),
        memory_off=headers.get("x-memory", "").lower() == "off",
        history_header=headers.get("x-memory-history"),
        retry=sync_plan.RetryHint.from_headers(headers),
        extra={
            "parsed": parsed,
            "native": native_api,
            "query": str(request.url.query or ""),
            "breakpoints": cache_hints.wants_breakpoints(
                parsed.model, services.settings.cache_breakpoints),
        },
    )


def native_body(request: TurnRequest, messages: list[dict[str, Any]], turn: Turn
                ) -> dict[str, Any]:
    """The request for the Messages upstream: the window rendered for it, the client's
    cache marks where their blocks are, or the proxy's breakpoints."""
    parsed: MessagesRequest = request.extra["parsed"]
    window = turn.window
    assert window is not None
    offset = len(messages) - len(window.items)
    fingerprints: list[str | None] = [None] * offset + [
        i.message.fingerprint for i in window.items]
    changed = prompt_cache.changed_index(window, messages, turn.window_meta.get("changes", ()))
    rendered = render_window(
        messages,
        tools_declared=parsed.tools is not None,
        fingerprints=fingerprints,
        marks=parsed.marks,
        client_marks=parsed.client_marks,
        changed_at=changed,
        breakpoints=request.extra["breakpoints"],
    )
    out = upstream_body(request.options, rendered.messages)
    if rendered.system:
        out["system"] = rendered.system
    else:
        out.pop("system", None)
    return out


class MessagesSurface:
    name = "messages"
    stream_media_type = "text/event-stream"

    def __init__(self, request: TurnRequest | None = None) -> None:
        self.request = request
        self.translator: ChunkTranslator | None = None
        self.failed = False

    async def parse(self, request: Request, services: Services) -> TurnRequest:
        return await read_request(request, services)

    def bind(self, request: TurnRequest) -> MessagesSurface:
        """A copy for one request: a translated stream's state lives on it."""
        bound = MessagesSurface(request)
        if not request.extra["native"]:
            bound.translator = ChunkTranslator(str(request.model or ""))
        return bound

    def upstream_api(self, request: TurnRequest) -> UpstreamApi:
        return MESSAGES if request.extra["native"] else TRANSLATED

    def error_body(self, exc: ProxyError) -> bytes:
        return error_body(exc)

    def upstream_body(
        self, request: TurnRequest, messages: list[dict[str, Any]] | None, api: str,
        turn: Turn | None = None,
    ) -> dict[str, Any]:
        if api == "messages":
            if messages is None or turn is None:
                return upstream_body(request.options, None)
            return native_body(request, messages, turn)
        if messages is None:
            messages = [{**m, "content": native.for_api(m.get("content"), "chat")}
                        for m in [*request.system, *request.conversation]]
        return chat_request(request.options, messages)

    def reply(
        self, turn: Turn | None, response: UpstreamResponse, headers: dict[str, str]
    ) -> Response:
        assert self.request is not None
        if self.request.extra["native"]:
            return Response(response.body, response.status_code, headers,
                            media_type="application/json")
        message = message_from_completion(completion_of(response.body),
                                          str(self.request.model or ""))
        return Response(orjson.dumps(message), 200, headers, media_type="application/json")

    def stream_event(
        self, turn: Turn | None, chunk: dict[str, Any] | None, event: SSEEvent
    ) -> bytes | None:
        if self.translator is None:
            if event.data.startswith((b'{"type":"message_stop"', b'{"type": "message_stop"')):
                return None  # sent by stream_end, after the turn is stored
            if event.data.startswith((b'{"type":"error"', b'{"type": "error"')):
                self.failed = True  # the upstream's error event ends the stream
            return event.raw
        if chunk is None:
            if event.data[:1] != b"{":
                return None
            try:
                chunk = orjson.loads(event.data)
            except orjson.JSONDecodeError:
                return None
        assert chunk is not None
        return b"".join(self.translator.feed(chunk)) or None

    def stream_end(self, turn: Turn | None) -> bytes:
        if self.failed:
            return b""
        if self.translator is None:
            return MESSAGE_STOP
        return b"".join(self.translator.finish())

    def stream_error(self, exc: ProxyError) -> bytes:
        return error_event(error_body(exc))


messages_surface = MessagesSurface()


async def count_tokens(request: Request) -> Response:
    """``POST .../v1/messages/count_tokens``: the input tokens of the window the proxy
    would send for this request (nothing stored). The Messages upstream counts them; for
    a chat completions upstream they are the proxy's estimate."""
    services: Services = request.app.state.services
    request.state.surface = messages_surface
    turn_request = await read_request(request, services, count_only=True)
    surface = messages_surface.bind(turn_request)
    native_api = turn_request.extra["native"]
    if turn_request.memory_off:
        if native_api:
            return await _count_upstream(services, turn_request,
                                         surface.upstream_body(turn_request, None, "messages"))
        tokens = sum(count_message(m, str(turn_request.model)) for m in
                     [*turn_request.system, *turn_request.conversation])
        return Response(orjson.dumps({"input_tokens": tokens}), media_type="application/json")
    turn = identify_turn(services, turn_request)
    history = incoming(turn)
    await load(services, turn, history)
    await sync(services, turn, history)
    await select(services, turn)
    render(services, turn)
    if native_api:
        body = surface.upstream_body(turn_request, turn.messages, "messages", turn)
        return await _count_upstream(services, turn_request, body, turn.headers)
    assert turn.window is not None and turn.snapshot is not None
    estimate = turn.system_tokens + turn.extra_tokens + turn.window.tokens
    tokens = round(estimate * (turn.snapshot.meta.calibration or 1.0))
    return Response(orjson.dumps({"input_tokens": tokens}), headers=turn.headers,
                    media_type="application/json")


async def _count_upstream(services: Services, request: TurnRequest, body: dict[str, Any],
                          headers: dict[str, str] | None = None) -> Response:
    response = await messages_upstream(services).count_tokens(
        UpstreamRequest(body, request.forwarded), str(request.extra.get("query") or ""))
    return Response(response.body, response.status_code, headers,
                    media_type="application/json")
