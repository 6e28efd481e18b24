"""``POST /v1/responses``: the OpenAI Responses API, a second surface over the sessions
chat completions use.

The request is read into chat-format messages (``responses_request``), the turn runs as
a chat turn does (load, sync, select, render; the upstream call with the built-in tool
rounds; the reply stored in one append; compaction after it), and the reply is rendered
back as a response object or the Responses event stream:

- ``previous_response_id`` names a response the proxy stored: the turn continues that
  response's session, from that response (a delta client; a response before the
  session's head forks there, see ``prepare_turn(branch_at=...)``).
- Without it, the session is identified as for chat completions (path, headers,
  ``metadata.session_id``, ``conversation``, ``prompt_cache_key``, fingerprint), and a
  client that resends its whole input (Codex, ``store: false``) is synced as a
  full-history client.
- The upstream is called with the Responses API when the agent's ``llm.api`` or
  ``MEMORY_PROXY_RESPONSES_API`` says so (``auto``: until it answers 404/405 there),
  with chat completions otherwise and for litellm's provider models.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from proxy.errors import BadRequest, ProxyError
from proxy.http import limits
from proxy.http.asgi import (
    BodyReply,
    ChatCall,
    Receive,
    Scope,
    Send,
    StreamReply,
    send_error,
    send_server_error,
)
from proxy.http.requests import parse_json_object
from proxy.http.responses import json_response
from proxy.services import Services
from proxy.surfaces.chat import forward, forwarded_headers, upstream_body
from proxy.surfaces.responses_chain import branch_point
from proxy.surfaces.responses_reply import response_object, responses_usage
from proxy.surfaces.responses_request import OPTIONS_KEY, ResponsesRequest, chat_body
from proxy.surfaces.responses_state import (
    RESPONSE_META,
    find,
    new_response_id,
)
from proxy.surfaces.responses_stream import EventWriter, sse
from proxy.tools import builtin as builtin_tools
from proxy.turn import cache_hints, prompt_cache, sync_plan
from proxy.turn.identity import Identity, _checked, client_key, identify, namespace_for
from proxy.turn.turns import Turn, prepare_turn, resolve_agent, tools_tokens
from proxy.upstreams.base import Upstream, UpstreamRequest
from proxy.upstreams.openai_http import OpenAIUpstream
from proxy.upstreams.responses_http import ResponsesUpstream, chat_request
from proxy.upstreams.sse import SSEParser
from strategies.records import ResponseRef, SessionKey
from strategies.tokens import count_message

__all__ = ["ResponsesApp", "input_tokens", "pick_upstream", "responses_app"]

logger = logging.getLogger("memory_proxy.responses")
SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}
# what the reply's record keeps of the response (GET /v1/responses/{id})
KEPT = ("instructions", "max_output_tokens", "metadata", "parallel_tool_calls",
        "previous_response_id", "reasoning", "store", "temperature", "text", "tool_choice",
        "top_p", "truncation", "user", "prompt_cache_key")


def pick_upstream(services: Services, api: str | None, model: str) -> Upstream:
    """The upstream a Responses turn calls: the Responses API adapter over the direct
    upstream, or the services' chat upstream (litellm's provider models, a ``chat``
    choice, an upstream that is not the direct OpenAI-compatible one)."""
    choice = api if api in ("chat", "responses") else services.settings.responses_api
    if choice == "chat":
        return services.upstream
    upstream = services.upstream
    uses_litellm = getattr(upstream, "uses_litellm", None)
    if uses_litellm is not None and uses_litellm(model):
        return upstream
    direct = getattr(upstream, "direct", upstream)
    if not isinstance(direct, OpenAIUpstream):
        return upstream
    adapters = services.responses_upstreams
    adapter = adapters.get(choice)
    if adapter is None:
        adapter = adapters[choice] = ResponsesUpstream(direct, detect=choice == "auto")
    return adapter if not adapter.chat_only else upstream


async def session_identity(
    services: Services, call: ChatCall, request: ResponsesRequest
) -> tuple[Identity, ResponseRef | None]:
    """The turn's session: the one ``previous_response_id`` names (and where in it the
    turn continues), else as for chat completions, with ``conversation`` as the session."""
    body = request.body
    if request.previous_response_id:
        try:
            key, ref = await find(services, call.headers, request.previous_response_id)
        except ProxyError as exc:
            if exc.status_code != 404:
                raise
            raise BadRequest(
                f"Previous response with id '{request.previous_response_id[:200]}' not found.",
                param="previous_response_id", code="previous_response_not_found",
            ) from None
        return Identity(key.namespace, key.agent, key.session, "header"), ref
    identity = identify(
        path_params=call.path_params,
        headers=call.headers,
        body=body,
        api_key=client_key(call.headers),
        system=request.system,
        conversation=request.conversation,
        user_as_session=lambda agent: resolve_agent(services, agent).definition.userAsSession,
    )
    conversation = request.session_name
    if conversation and identity.source not in ("path", "header", "metadata"):
        identity = Identity(
            namespace_for(client_key(call.headers)), identity.agent,
            _checked(conversation, "conversation"), "metadata",
        )
    return identity, None


def reply_extra(request: ResponsesRequest, created_at: int, model: str) -> dict[str, Any]:
    """What the reply's record keeps of the response (given the reply's usage)."""
    kept = {k: request.body[k] for k in KEPT if request.body.get(k) is not None}
    kept["created_at"] = created_at
    kept["model"] = model

    def with_usage(usage: dict[str, Any] | None) -> dict[str, Any]:
        return {**kept, "usage": responses_usage(usage)}

    return {RESPONSE_META: with_usage}


async def create_response(services: Services, call: ChatCall) -> BodyReply | StreamReply:
    raw = await call.body(services.settings.max_body_bytes)
    body = parse_json_object(raw)
    request = ResponsesRequest.parse(body)
    limits.check_identifiers(body)
    headers = forwarded_headers(call.headers)
    limits.check_limits(services.settings, [*request.system, *request.conversation], headers)
    out = chat_body(request)
    memory = call.headers.get("x-memory", "").lower() != "off"
    if not memory and request.previous_response_id:
        raise BadRequest("'previous_response_id' needs memory (X-Memory: off was sent)",
                         param="previous_response_id")
    identity, ref = (
        await session_identity(services, call, request) if memory else (None, None)
    )
    agent = resolve_agent(services, identity.agent if identity else "default")
    model = str(body.get("model") or agent.definition.llm.model or "")
    upstream = pick_upstream(services, agent.definition.llm.api, model)
    response_id = new_response_id(
        identity.agent if identity else "default", identity.session if identity else "off"
    )
    created_at = int(time.time())
    turn: Turn | None = None
    offered = None
    if identity is None:
        out = upstream_body(out, [*request.system, *request.conversation])
    else:
        history = "delta" if ref is not None else call.headers.get("x-memory-history")
        branch_at, replay = (None, []) if ref is None else await branch_point(
            services, SessionKey(identity.namespace, identity.agent, identity.session), ref
        )
        turn = await prepare_turn(
            services,
            identity=identity,
            # the tools as the client sent them share the context window (built-in and
            # namespaced ones too, which the chat body leaves out)
            body={**out, "tools": body.get("tools")},
            system=request.system,
            conversation=[*replay, *request.conversation],
            history_header=history,
            retry=sync_plan.RetryHint.from_headers(call.headers),
            branch_at=branch_at,
            api="responses" if isinstance(upstream, ResponsesUpstream) else "chat",
        )
        turn.response_id = response_id if request.store else None
        turn.reply_extra = reply_extra(request, created_at, model)
        out = upstream_body(out, turn.messages)
        cache_hints.for_session(
            out, turn.key, services.settings,
            prompt_cache.changed_index(
                turn.window, turn.messages, turn.window_meta.get("changes", ())
            ),
        )
        offered = builtin_tools.offer(out, turn.agent, turn.key, turn.window)
        turn.tools = out.get("tools")
    if isinstance(upstream, ResponsesUpstream):
        out[OPTIONS_KEY] = request.options()
    else:  # native parts are for a Responses upstream only
        out = chat_request(UpstreamRequest(out)).body
    if request.stream:
        out["stream_options"] = {"include_usage": True}
    reply = await forward(
        services, UpstreamRequest(out, headers), request.stream, turn,
        offered=offered, receive=call.receive, upstream=upstream,
    )
    if isinstance(reply, StreamReply):
        writer = EventWriter(body, response_id, model)
        return StreamReply(
            events(writer, reply.chunks), {**SSE_HEADERS, **reply.headers},
            error_event=sse({"type": "error", "code": "server_error",
                             "message": "internal error in memory-proxy", "param": None,
                             "sequence_number": 0}),
        )
    completion = orjson.loads(reply.body) if reply.status < 300 else None
    if not isinstance(completion, dict):
        return reply
    return BodyReply(
        reply.status,
        orjson.dumps(response_object(body, response_id, completion, created_at=created_at)),
        reply.headers,
    )


async def events(writer: EventWriter, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """The turn's chat stream (already relayed: the reply is stored before its
    ``[DONE]``) as Responses events, one write per write of the relay."""
    parser = SSEParser()
    yield writer.start()
    try:
        async for data in chunks:
            out = []
            for event in parser.feed(data):
                payload = event.data
                if payload.strip() == b"[DONE]":
                    out.append(writer.complete())
                    continue
                if payload[:1] != b"{":
                    continue
                try:
                    chunk = orjson.loads(payload)
                except orjson.JSONDecodeError:
                    continue
                error = chunk.get("error") if isinstance(chunk, dict) else None
                if isinstance(error, dict):
                    out.append(writer.fail(error.get("code"), str(error.get("message", ""))))
                    continue
                if isinstance(chunk, dict):
                    out.append(writer.feed(chunk))
            if out:
                yield b"".join(out)
            if writer.ended:
                break
        if not writer.ended:
            yield writer.fail("upstream_stream_cut", "the stream ended before the reply")
    finally:
        aclose = getattr(chunks, "aclose", None)
        if aclose is not None:
            await aclose()


async def input_tokens(request: Request) -> Response:
    """``POST /v1/responses/input_tokens``: the tokens the request's input would take as
    the proxy sends it (the session's window, the system prompt and the tools), nothing
    stored and no upstream call."""
    services: Services = request.app.state.services
    call = ChatCall(
        {k.lower(): v for k, v in request.headers.items()}, dict(request.path_params),
        request.receive,
    )
    body = parse_json_object(await call.body(services.settings.max_body_bytes))
    parsed = ResponsesRequest.parse(body)
    limits.check_identifiers(body)
    out = chat_body(parsed)
    model = str(body.get("model") or "")
    if call.headers.get("x-memory", "").lower() == "off":
        messages = [*parsed.system, *parsed.conversation]
        extra = tools_tokens(body, model)
    else:
        identity, ref = await session_identity(services, call, parsed)
        history = "delta" if ref is not None else call.headers.get("x-memory-history")
        branch_at, replay = (None, []) if ref is None else await branch_point(
            services, SessionKey(identity.namespace, identity.agent, identity.session), ref
        )
        turn = await prepare_turn(
            services, identity=identity, body={**out, "tools": body.get("tools")},
            system=parsed.system,
            conversation=[*replay, *parsed.conversation], history_header=history,
            branch_at=branch_at,
        )
        messages, extra, model = turn.messages, turn.extra_tokens, turn.model
    counted = sum(count_message(m, model) for m in messages) + extra
    return json_response({"object": "response.input_tokens", "input_tokens": counted})


class ResponsesApp:
    """``POST .../responses`` as a plain ASGI app, as ``proxy.chat.ChatApp``."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        services: Services = scope["app"].state.services
        services.chats_under_way += 1
        try:
            try:
                reply = await create_response(
                    services, ChatCall.from_scope(scope, receive)
                )
            except ProxyError as exc:
                await send_error(send, exc)
                return
            except Exception:
                logger.exception("unexpected error on POST %s", scope.get("path"))
                await send_server_error(send)
                return
            await reply.send(send, receive)
        finally:
            services.chats_under_way -= 1


responses_app = ResponsesApp()
