"""``POST /v1/messages`` and ``/v1/messages/count_tokens``: Anthropic's Messages API over the
same sessions and turn as chat completions.

A request is read into chat-form records (proxy/surfaces/messages_request.py), goes
through the turn (identify, load, sync, select, render: proxy/turn/turns.py), and is sent

- to a Messages upstream (``MEMORY_PROXY_ANTHROPIC_URL``) as Messages, the window rendered
  for Anthropic (proxy/surfaces/messages_render.py), when the agent's ``llm.api`` is
  ``messages``, or, with no ``llm.api``, when the model is a Claude model without a
  provider prefix (``claude-…``);
- otherwise to the chat completions upstream (OpenAI-compatible, or litellm for
  ``provider/model`` ids), translated, its reply translated back
  (proxy/surfaces/messages_translate.py).

The reply (whole or streamed, proxy/surfaces/messages_stream.py) is stored as a record like
any other; errors take Anthropic's shape (``{"type": "error", "error": {...}}``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import orjson

from proxy import metrics
from proxy.agents import DEFAULT_AGENT
from proxy.background.after_turn import schedule_after_turn
from proxy.errors import ProxyError
from proxy.http import limits
from proxy.http.asgi import BodyReply, ChatCall, Receive, Scope, Send, StreamReply
from proxy.http.disconnect import unless_disconnected
from proxy.http.requests import parse_json_object
from proxy.services import Services
from proxy.surfaces import messages_tools
from proxy.surfaces.chat import SSE_HEADERS, forwarded_headers, upstream_body
from proxy.surfaces.chat_reply import completion_of
from proxy.surfaces.messages_chat import messages_upstream
from proxy.surfaces.messages_render import render_window
from proxy.surfaces.messages_reply import message_of, record_of, store_usage
from proxy.surfaces.messages_request import MessagesRequest, parse_request
from proxy.surfaces.messages_stream import (
    SERVER_ERROR,
    Store,
    error_body,
    error_event,
    relay_native,
    relay_translated,
)
from proxy.surfaces.messages_translate import (
    chat_request,
    message_from_completion,
    normalized_reply,
)
from proxy.tools import builtin as builtin_tools
from proxy.tools.stream import FetchStream
from proxy.turn import cache_hints, prompt_cache, sync_plan
from proxy.turn.history_sync import fingerprint
from proxy.turn.identity import OWN_SESSION_HEADERS, Identity, client_key, identify
from proxy.turn.persist import persist_turn
from proxy.turn.turns import Turn, prepare_turn, resolve_agent
from proxy.upstreams.base import UpstreamRequest
from strategies import native

logger = logging.getLogger("memory_proxy.messages")

CLAUDE_CODE_SESSION = "x-claude-code-session-id"


def uses_messages_api(api: str | None, model: str) -> bool:
    """Whether a Messages request goes to the Messages upstream (else: translated to chat
    completions). ``api``: the agent's ``llm.api``."""
    if api is not None:
        return api == "messages"
    return "/" not in model and model.lower().startswith("claude")


class MessagesApp:
    """``POST .../v1/messages`` (``count_only``: ``.../count_tokens``) as plain ASGI."""

    def __init__(self, *, count_only: bool = False) -> None:
        self.count_only = count_only

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        services: Services = scope["app"].state.services
        call = ChatCall.from_scope(scope, receive)
        query = bytes(scope.get("query_string") or b"").decode("latin-1")
        services.chats_under_way += 1
        try:
            try:
                handler = count_tokens if self.count_only else create_message
                reply = await handler(services, call, query)
            except ProxyError as exc:
                metrics.inc("memory_proxy_errors_total", type=exc.error_type)
                await BodyReply(exc.status_code, error_body(exc), exc.headers).send(send, receive)
                return
            except Exception:
                logger.exception("unexpected error on POST %s", scope.get("path"))
                await BodyReply(500, SERVER_ERROR).send(send, receive)
                return
            await reply.send(send, receive)
        finally:
            services.chats_under_way -= 1


messages_app = MessagesApp()
count_tokens_app = MessagesApp(count_only=True)


async def _read(services: Services, call: ChatCall, *, count_only: bool
                ) -> tuple[MessagesRequest, dict[str, str]]:
    body = parse_json_object(await call.body(services.settings.max_body_bytes))
    request = parse_request(body, count_only=count_only)
    headers = forwarded_headers(call.headers)
    limits.check_identifiers(body)
    limits.check_limits(services.settings, [*request.system, *request.conversation], headers)
    return request, headers


def claude_code_conversation(
    identity: Identity, headers: Mapping[str, str], conversation: list[dict[str, Any]]
) -> Identity:
    """A session keyed by Claude Code's ``X-Claude-Code-Session-Id`` is one conversation of
    that Claude Code session: it sends its sub-agents', title and quota calls under the same
    id, each a conversation of its own that it resends whole. They are told apart by their
    first user message (``<id>.<8 hex>``), so none rewinds another's log or reads its
    memory."""
    if identity.source != "header" or any(headers.get(h) for h in OWN_SESSION_HEADERS) or (
        not headers.get(CLAUDE_CODE_SESSION)
    ):
        return identity
    first = next((m for m in conversation if m.get("role") == "user"), None)
    if first is None:
        return identity
    suffix = fingerprint(first)[:8]
    return replace(identity, session=f"{identity.session[:119]}.{suffix}")


def _route(services: Services, call: ChatCall, request: MessagesRequest
           ) -> tuple[Identity | None, bool]:
    """The request's identity (None with ``X-Memory: off``) and whether it goes to the
    Messages upstream."""
    identity = None
    if call.headers.get("x-memory", "").lower() != "off":
        identity = identify(
            path_params=call.path_params,
            headers=call.headers,
            body=request.body,
            api_key=client_key(call.headers),
            system=request.system,
            conversation=request.conversation,
            user_as_session=lambda name: resolve_agent(services, name).definition.userAsSession,
        )
        identity = claude_code_conversation(identity, call.headers, request.conversation)
        agent = identity.agent
    else:
        agent = call.path_params.get("agent") or call.headers.get("x-agent-id") or DEFAULT_AGENT
    api = resolve_agent(services, agent).definition.llm.api
    return identity, uses_messages_api(api, request.model)


async def _turn(services: Services, call: ChatCall, request: MessagesRequest,
                identity: Identity | None, api: str) -> Turn | None:
    if identity is None:
        return None
    return await prepare_turn(
        services,
        identity=identity,
        body=request.body,
        system=request.system,
        conversation=request.conversation,
        history_header=call.headers.get("x-memory-history"),
        retry=sync_plan.RetryHint.from_headers(call.headers),
        api=api,
    )


def _native_body(services: Services, request: MessagesRequest, turn: Turn) -> dict[str, Any]:
    """The request as it goes to the Messages upstream: the window rendered for it."""
    window = turn.window
    offset = len(turn.messages) - len(window.items)
    fingerprints: list[str | None] = [None] * offset + [i.message.fingerprint
                                                        for i in window.items]
    changed = prompt_cache.changed_index(window, turn.messages,
                                         turn.window_meta.get("changes", ()))
    rendered = render_window(
        turn.messages,
        tools_declared=request.tools is not None,
        fingerprints=fingerprints,
        marks=request.marks,
        client_marks=request.client_marks,
        changed_at=changed,
        breakpoints=cache_hints.wants_breakpoints(request.model,
                                                  services.settings.cache_breakpoints),
    )
    out = upstream_body(request.body, rendered.messages)
    if rendered.system:
        out["system"] = rendered.system
    else:
        out.pop("system", None)
    return out


def _translated_body(services: Services, request: MessagesRequest, turn: Turn | None
                     ) -> dict[str, Any]:
    messages = turn.messages if turn is not None else [
        {**m, "content": native.for_api(m.get("content"), "chat")}
        for m in [*request.system, *request.conversation]
    ]
    out = chat_request(request.body, messages)
    if turn is not None:
        changed = prompt_cache.changed_index(turn.window, turn.messages,
                                             turn.window_meta.get("changes", ()))
        cache_hints.for_session(out, turn.key, services.settings, changed)
    return out


async def create_message(services: Services, call: ChatCall, query: str
                         ) -> BodyReply | StreamReply:
    request, headers = await _read(services, call, count_only=False)
    identity, native_api = _route(services, call, request)
    turn = await _turn(services, call, request, identity, "messages" if native_api else "chat")
    store: Store | None = None
    if turn is not None:
        prepared = turn

        async def store(reply: dict[str, Any], usage: dict[str, Any] | None) -> None:
            await _finish(services, prepared, reply, usage, headers, messages_api=native_api)

    if native_api:
        return await _native(services, call, request, turn, headers, query, store)
    return await _translated(services, call, request, turn, headers, store)


async def _native(
    services: Services, call: ChatCall, request: MessagesRequest, turn: Turn | None,
    headers: dict[str, str], query: str, store: Store | None,
) -> BodyReply | StreamReply:
    """The turn on the Messages upstream."""
    upstream = messages_upstream(services)
    offered = None
    if turn is not None:
        body = _native_body(services, request, turn)
        offered = messages_tools.offer(body, turn.agent, turn.key, turn.window)
        turn.tools = body.get("tools")  # the summarizer may send them again
    else:
        body = upstream_body(request.body, None)
    outgoing = UpstreamRequest(body, headers)
    reply_headers = turn.headers if turn is not None else {}
    if not request.stream:
        response = await unless_disconnected(call.receive, upstream.messages(outgoing, query))
        if store is None:
            return BodyReply(response.status_code, response.body, {})
        usage = None
        if offered is not None:
            response, usage = await unless_disconnected(call.receive, messages_tools.complete(
                services, upstream, offered, outgoing, response, query))
        message = message_of(response.body)
        await store(record_of(message), store_usage(usage or message.get("usage")))
        return BodyReply(response.status_code, response.body,
                         _with_cache(reply_headers, message.get("usage")))
    stream: Any = await unless_disconnected(call.receive,
                                            upstream.messages_stream(outgoing, query))
    if offered is not None:
        stream = messages_tools.RoundsStream(services, upstream, offered, outgoing, stream,
                                             query)
    return _stream_reply(relay_native(stream, store), reply_headers)


async def _translated(
    services: Services, call: ChatCall, request: MessagesRequest, turn: Turn | None,
    headers: dict[str, str], store: Store | None,
) -> BodyReply | StreamReply:
    """The turn on the chat completions upstream, translated both ways."""
    body = _translated_body(services, request, turn)
    offered = None
    if turn is not None:
        offered = builtin_tools.offer(body, turn.agent, turn.key, turn.window)
        turn.tools = body.get("tools")
    outgoing = UpstreamRequest(body, headers)
    reply_headers = turn.headers if turn is not None else {}
    if not request.stream:
        response = await unless_disconnected(call.receive, services.upstream.chat(outgoing))
        usage = None
        if offered is not None:
            response, usage = await unless_disconnected(call.receive, builtin_tools.complete(
                services, offered, outgoing, response))
        completion = completion_of(response.body)
        message = message_from_completion(completion, request.model)
        if store is not None:
            choice = completion["choices"][0]
            await store(normalized_reply({"role": "assistant", **choice["message"]}) or {},
                        usage or completion.get("usage"))
        return BodyReply(200, orjson.dumps(message),
                         _with_cache(reply_headers, completion.get("usage")))
    stream: Any = await unless_disconnected(call.receive, services.upstream.chat_stream(outgoing))
    if offered is not None:
        stream = FetchStream(services, offered, outgoing, stream)
    return _stream_reply(relay_translated(stream, request.model, store), reply_headers)


def _stream_reply(chunks: Any, headers: dict[str, str]) -> StreamReply:
    return StreamReply(chunks, {**SSE_HEADERS, **headers},
                       error_event=error_event(SERVER_ERROR))


def _with_cache(headers: dict[str, str], usage: Any) -> dict[str, str]:
    cache = prompt_cache.cache_usage(store_usage(usage) if isinstance(usage, dict) and
                                     "input_tokens" in usage else usage)
    if cache is None:
        return headers
    return {**headers, "x-memory-cached-tokens": str(cache["cached"])}


async def _finish(services: Services, turn: Turn, reply: dict[str, Any],
                  usage: dict[str, Any] | None, headers: dict[str, str], *,
                  messages_api: bool) -> None:
    stored = {"role": "assistant", "content": reply.get("content")}
    if reply.get("tool_calls"):
        stored["tool_calls"] = reply["tool_calls"]
    result = await persist_turn(services, turn, stored, usage=usage)
    kind = turn.agent.config.kind
    metrics.count_turn(kind, turn.window.tokens, turn.modified)
    metrics.count_cache(kind, prompt_cache.cache_usage(usage),
                        turn.window_meta.get("changes", ()))
    schedule_after_turn(services, turn, result, headers, messages_api=messages_api)


async def count_tokens(services: Services, call: ChatCall, query: str) -> BodyReply:
    """The input tokens of the request as the proxy would send it: the Messages upstream
    counts the rendered window; a translated upstream's is the proxy's own estimate."""
    request, headers = await _read(services, call, count_only=True)
    identity, native_api = _route(services, call, request)
    turn = await _turn(services, call, request, identity, "messages" if native_api else "chat")
    if native_api:
        body = _native_body(services, request, turn) if turn is not None \
            else upstream_body(request.body, None)
        response = await messages_upstream(services).count_tokens(
            UpstreamRequest(body, headers), query)
        return BodyReply(response.status_code, response.body,
                         turn.headers if turn is not None else {})
    if turn is None:
        from strategies.tokens import count_message

        tokens = sum(count_message(m, request.model)
                     for m in [*request.system, *request.conversation])
        return BodyReply(200, orjson.dumps({"input_tokens": tokens}))
    estimate = turn.system_tokens + turn.extra_tokens + turn.window.tokens
    tokens = round(estimate * (turn.snapshot.meta.calibration or 1.0))
    return BodyReply(200, orjson.dumps({"input_tokens": tokens}), turn.headers)
