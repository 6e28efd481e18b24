"""One turn, top to bottom: identify → load → sync → select → render → forward → relay →
persist → after-turn.

``serve`` runs a request of any API surface (proxy/surfaces/base.py): the surface parses
its request and renders the window and the reply; every step in between works on the
stored records (strategies/records.py) and lives in a module of its own concern under
proxy/turn/ (after-turn in proxy/background/). ``Turn`` (proxy/turn/state.py) carries
what each step produced to the next.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from proxy import metrics
from proxy.background.after_turn import schedule_after_turn
from proxy.http.responses import SERVER_ERROR, SSEResponse
from proxy.services import Services
from proxy.surfaces.base import Surface
from proxy.turn import prompt_cache
from proxy.turn.identity import identify_turn
from proxy.turn.load import load
from proxy.turn.persist import persist_turn
from proxy.turn.relay import relay
from proxy.turn.render import render
from proxy.turn.select import select
from proxy.turn.state import Turn, TurnRequest
from proxy.turn.sync import incoming, sync
from proxy.turn.upstream_api import UpstreamApi, upstream_api_of
from proxy.upstreams.base import UpstreamRequest


async def serve(surface: Surface, request: Request) -> Response:
    services: Services = request.app.state.services
    request.state.surface = surface  # errors take the surface's shape
    turn_request = await surface.parse(request, services)
    bind = getattr(surface, "bind", None)
    if bind is not None:  # a surface that keeps state for one request (a stream's)
        surface = request.state.surface = bind(turn_request)
    api = upstream_api_of(surface, turn_request)
    if turn_request.memory_off:
        return await pass_through(services, surface, turn_request, request, api)

    turn = identify_turn(services, turn_request)
    history = incoming(turn)
    await load(services, turn, history)
    await sync(services, turn, history)
    await select(services, turn)
    render(services, turn)
    body = surface.upstream_body(turn_request, turn.messages, api.name, turn)
    upstream_request, offered = api.request(services, turn, body)

    if not turn_request.stream:
        response, usage = await api.call(
            services, upstream_request, offered, request.receive, turn_request
        )
        reader = api.reader()
        reader.add_whole(response.body)
        reply = reader.reply()
        usage = usage or reader.usage
        await finish(services, turn, reply, usage, upstream_request)
        headers = turn.headers
        cache = prompt_cache.cache_usage(usage)
        if cache is not None:
            # a complete reply's usage is known before its headers go out (a stream's
            # arrives last: its turn's numbers are in /memory)
            headers["x-memory-cached-tokens"] = str(cache["cached"])
        return surface.reply(turn, response, headers)

    stream = await api.open_stream(
        services, upstream_request, offered, request.receive, turn_request
    )

    async def stored(reply: dict[str, Any], usage: dict[str, Any] | None) -> None:
        await finish(services, turn, reply, api.stream_usage(stream) or usage,
                     upstream_request)

    return SSEResponse(
        relay(surface, stream, turn, stored, api.reader()),
        headers=turn.headers,
        error_event=surface.stream_error(SERVER_ERROR),
        media_type=surface.stream_media_type,
    )


async def finish(
    services: Services,
    turn: Turn,
    reply: dict[str, Any] | None,
    usage: dict[str, Any] | None,
    upstream_request: UpstreamRequest,
) -> None:
    """Persist the turn, count it, and plan the work after it (summaries, compaction)."""
    result = await persist_turn(services, turn, reply, usage=usage)
    kind = turn.agent.config.kind
    assert turn.window is not None
    metrics.count_turn(kind, turn.window.tokens, turn.modified)
    metrics.count_cache(kind, prompt_cache.cache_usage(usage), turn.window_meta.get("changes", ()))
    schedule_after_turn(services, turn, result, upstream_request.headers,
                        messages_api=turn.request.api == "messages")


async def pass_through(
    services: Services, surface: Surface, turn_request: TurnRequest, request: Request,
    api: UpstreamApi,
) -> Response:
    """``X-Memory: off``: the request forwarded as it came; nothing loaded or stored."""
    body = surface.upstream_body(turn_request, None, api.name)
    upstream_request = UpstreamRequest(body, turn_request.forwarded)
    if not turn_request.stream:
        response, _ = await api.call(services, upstream_request, None, request.receive,
                                     turn_request)
        return surface.reply(None, response, {})
    stream = await api.open_stream(services, upstream_request, None, request.receive,
                                   turn_request)
    return SSEResponse(
        relay(surface, stream, None),
        error_event=surface.stream_error(SERVER_ERROR),
        media_type=surface.stream_media_type,
    )
