"""``POST /v1/chat/completions``: the memory turn around one upstream call."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping
from typing import Any

from proxy import metrics
from proxy.background.after_turn import schedule_after_turn
from proxy.errors import BadRequest, ProxyError, UpstreamError, UpstreamReplyError
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
from proxy.http.disconnect import unless_disconnected
from proxy.http.requests import parse_json_object
from proxy.services import Services
from proxy.surfaces.chat_reply import (
    NOT_A_COMPLETION,
    ReplyAccumulator,
    add_stream_event,
    completion_of,
)
from proxy.tools import builtin as builtin_tools
from proxy.tools.stream import FetchStream
from proxy.turn import cache_hints, history_sync, prompt_cache, sync_plan
from proxy.turn.identity import client_key, identify
from proxy.turn.persist import persist_turn
from proxy.turn.turns import Turn, prepare_turn, resolve_agent
from proxy.upstreams.base import UpstreamRequest, UpstreamStream

logger = logging.getLogger("memory_proxy.chat")

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
SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}
LARGE_BODY = 1 << 20


def forwarded_headers(headers: Mapping[str, str]) -> dict[str, str]:
    return {name: headers[name] for name in FORWARDED_HEADERS if name in headers}


def upstream_body(body: dict[str, Any], messages: list[dict[str, Any]] | None) -> dict[str, Any]:
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


def error_event(exc: ProxyError) -> bytes:
    return b"data: " + exc.body() + b"\n\n"


CHAT_SUFFIX = "/v1/chat/completions"


def chat_path_params(path: str) -> dict[str, str] | None:
    """The path parameters of a chat completion path, None for any other path (the same
    paths, and the same ``[^/]+`` parameters, as the routes in proxy/http/app.py)."""
    if path == CHAT_SUFFIX or path == "/chat/completions":
        return {}
    if path.startswith("/agents/") and path.endswith(CHAT_SUFFIX):
        parts = path[len("/agents/") : -len(CHAT_SUFFIX)].split("/")
        if len(parts) == 1 and parts[0]:
            return {"agent": parts[0]}
        if len(parts) == 3 and parts[0] and parts[1] == "sessions" and parts[2]:
            return {"agent": parts[0], "session": parts[2]}
    return None


class ChatApp:
    """``POST .../chat/completions`` as a plain ASGI app (see proxy/http/asgi.py). An instance,
    not a function, so that a Starlette ``Route`` also runs it as ASGI."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        services: Services = scope["app"].state.services
        services.chats_under_way += 1
        try:
            try:
                reply = await chat_completions(services, ChatCall.from_scope(scope, receive))
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


chat_app = ChatApp()


async def chat_completions(services: Services, call: ChatCall) -> BodyReply | StreamReply:
    raw = await call.body(services.settings.max_body_bytes)
    if len(raw) >= LARGE_BODY:
        # joining a large body's pieces and reading it each hold the loop: other requests
        # are served in between
        await asyncio.sleep(0)
    body = parse_json_object(raw)
    messages = history_sync.validate_messages(body.get("messages"))
    if "stream" in body and not isinstance(body["stream"], bool):
        raise BadRequest("'stream' must be a boolean", param="stream")
    streaming = body.get("stream") is True
    request_headers = call.headers
    headers = forwarded_headers(request_headers)
    limits.check_identifiers(body)
    limits.check_limits(services.settings, messages, headers)

    if request_headers.get("x-memory", "").lower() == "off":
        return await forward(
            services, UpstreamRequest(upstream_body(body, None), headers), streaming, None,
            receive=call.receive,
        )

    system, conversation = history_sync.split_system(messages)
    identity = identify(
        path_params=call.path_params,
        headers=request_headers,
        body=body,
        api_key=client_key(request_headers),
        system=system,
        conversation=conversation,
        user_as_session=lambda agent: resolve_agent(services, agent).definition.userAsSession,
    )
    turn = await prepare_turn(
        services,
        identity=identity,
        body=body,
        system=system,
        conversation=conversation,
        history_header=request_headers.get("x-memory-history"),
        retry=sync_plan.RetryHint.from_headers(request_headers),
    )
    out = upstream_body(body, turn.messages)
    changes = turn.window_meta.get("changes", ())
    cache_hints.for_session(
        out,
        turn.key,
        services.settings,
        prompt_cache.changed_index(turn.window, turn.messages, changes),
    )
    offered = builtin_tools.offer(out, turn.agent, turn.key, turn.window)
    turn.tools = out.get("tools")
    client_wants_usage = False
    if streaming:
        options = out.get("stream_options")
        client_wants_usage = isinstance(options, dict) and bool(options.get("include_usage"))
        # usage calibrates the token estimate; it is stripped again if the client did not ask
        asked = options if isinstance(options, dict) else {}
        out["stream_options"] = {**asked, "include_usage": True}
    return await forward(
        services, UpstreamRequest(out, headers), streaming, turn,
        client_wants_usage=client_wants_usage, offered=offered, receive=call.receive,
    )


async def forward(
    services: Services,
    upstream_request: UpstreamRequest,
    streaming: bool,
    turn: Turn | None,
    *,
    client_wants_usage: bool = True,
    offered: builtin_tools.Offered | None = None,
    receive: Receive | None = None,
) -> BodyReply | StreamReply:
    """With ``receive``, a client that disconnects while the upstream is still thinking
    cancels the call (nothing is stored)."""
    if not streaming:
        response = await unless_disconnected(receive, services.upstream.chat(upstream_request))
        if turn is None:  # a plain pass-through: the upstream's body as it came
            media_type = response.headers.get("content-type") or "application/json"
            return BodyReply(response.status_code, response.body, {}, media_type.encode())
        usage = None
        if offered is not None:
            response, usage = await unless_disconnected(
                receive, builtin_tools.complete(services, offered, upstream_request, response)
            )
        accumulator = ReplyAccumulator()
        # a 200 that is not a completion is the upstream's error, and nothing is stored
        accumulator.add_response(completion_of(response.body))
        await finish_turn(services, turn, accumulator, upstream_request.headers, usage=usage)
        headers = turn.headers
        cache = prompt_cache.cache_usage(usage or accumulator.usage)
        if cache is not None:
            # a complete reply's usage is known before its headers go out (a stream's
            # arrives last: its turn's numbers are in /memory)
            headers["x-memory-cached-tokens"] = str(cache["cached"])
        return BodyReply(response.status_code, response.body, headers)

    stream = await unless_disconnected(receive, services.upstream.chat_stream(upstream_request))
    if offered is not None and turn is not None:
        stream = FetchStream(services, offered, upstream_request, stream)
    return StreamReply(
        relay(services, stream, turn, client_wants_usage, upstream_request.headers),
        {**SSE_HEADERS, **(turn.headers if turn is not None else {})},
    )


async def relay(
    services: Services,
    stream: UpstreamStream,
    turn: Turn | None,
    client_wants_usage: bool,
    headers: dict[str, str],
) -> AsyncIterator[bytes]:
    """Forward events as they arrive (those that arrived together, in one write); store the
    reply before the closing ``[DONE]`` so a client that saw ``[DONE]`` can count on the
    turn being stored."""
    accumulator = ReplyAccumulator()
    ready = getattr(stream, "ready", None)
    try:
        try:
            async for first in stream:
                out: list[bytes] = []
                done = False
                try:
                    for event in (first, *ready()) if ready is not None else (first,):
                        data = event.data
                        if data[:1] == b"{":  # a chunk (the usual event): never [DONE]
                            if turn is not None:
                                chunk = add_stream_event(accumulator, data)
                                if (
                                    not client_wants_usage
                                    and chunk.get("usage")
                                    and not chunk.get("choices")
                                ):
                                    continue
                        elif event.done:
                            done = True
                            break
                        elif data and turn is not None:
                            add_stream_event(accumulator, data)  # junk: raises
                        elif not event.raw.endswith(b"\n"):
                            continue  # an unterminated tail (not SSE): not an event
                        out.append(event.raw)
                except Exception:
                    if out:  # what came before the event that failed still goes out
                        yield b"".join(out)
                    raise
                if out:
                    yield out[0] if len(out) == 1 else b"".join(out)
                if done:
                    break
            else:
                if turn is not None and not accumulator.complete:
                    if accumulator.message() is None:
                        raise UpstreamReplyError(f"{NOT_A_COMPLETION} (a stream without a reply)")
                    raise UpstreamCut("upstream stream ended before the reply was complete")
            if turn is not None:
                if accumulator.message() is None:
                    raise UpstreamReplyError(f"{NOT_A_COMPLETION} (a stream without a reply)")
                # after hidden built-in rounds the stored usage is the first round's prompt
                usage = stream.memory_usage if isinstance(stream, FetchStream) else None
                await finish_turn(services, turn, accumulator, headers, usage=usage)
        except ProxyError as exc:
            logger.warning("stream ended with an error: %s", exc.message)
            yield error_event(exc)
            return
        yield DONE
    finally:
        await stream.aclose()


class UpstreamCut(UpstreamError):
    code = "upstream_stream_cut"


async def finish_turn(
    services: Services,
    turn: Turn,
    accumulator: ReplyAccumulator,
    headers: dict[str, str],
    *,
    usage: dict[str, Any] | None = None,
) -> None:
    reply = accumulator.message()
    usage = usage or accumulator.usage
    result = await persist_turn(services, turn, reply, usage=usage)
    kind = turn.agent.config.kind
    metrics.count_turn(kind, turn.window.tokens, turn.modified)
    metrics.count_cache(
        kind, prompt_cache.cache_usage(usage), turn.window_meta.get("changes", ())
    )
    schedule_after_turn(services, turn, result, headers)
