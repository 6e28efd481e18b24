"""The forward step: the upstream request for the rendered window, and the call.

For a chat upstream the body gets the proxy's prompt-cache hints, the agent's built-in
tools (proxy/tools/builtin.py, answered here in hidden rounds) and, when streaming, the
usage chunk (it calibrates the token estimate). A client that disconnects while the
upstream is still thinking cancels the call: nothing is stored.
"""

from __future__ import annotations

from typing import Any

from starlette.types import Receive

from proxy.http.disconnect import unless_disconnected
from proxy.services import Services
from proxy.tools import builtin as builtin_tools
from proxy.tools.stream import FetchStream
from proxy.turn import cache_hints, prompt_cache
from proxy.turn.state import Turn
from proxy.upstreams.base import Upstream, UpstreamRequest, UpstreamResponse, UpstreamStream


def chat_request(
    services: Services, turn: Turn, body: dict[str, Any]
) -> tuple[UpstreamRequest, builtin_tools.Offered | None]:
    """The chat completion call for ``body`` (the surface's rendering of the window)."""
    assert turn.window is not None
    changes = turn.window_meta.get("changes", ())
    cache_hints.for_session(
        body,
        turn.key,
        services.settings,
        prompt_cache.changed_index(turn.window, turn.messages, changes),
    )
    offered = builtin_tools.offer(body, turn.agent, turn.key, turn.window)
    turn.tools = body.get("tools")
    if turn.request.stream:
        options = body.get("stream_options")
        asked = options if isinstance(options, dict) else {}
        body["stream_options"] = {**asked, "include_usage": True}
    return UpstreamRequest(body, turn.request.forwarded), offered


async def call(
    services: Services,
    request: UpstreamRequest,
    offered: builtin_tools.Offered | None,
    receive: Receive | None,
    upstream: Upstream | None = None,
) -> tuple[UpstreamResponse, dict[str, Any] | None]:
    """A whole reply, after any hidden built-in tool rounds; the usage to store when
    those ran (None: the reply's own). ``upstream``: the surface's choice (None: the
    services' upstream)."""
    upstream = upstream or services.upstream
    response = await unless_disconnected(receive, upstream.chat(request))
    if offered is None:
        return response, None
    return await unless_disconnected(
        receive, builtin_tools.complete(services, offered, request, response, upstream)
    )


async def open_stream(
    services: Services,
    request: UpstreamRequest,
    offered: builtin_tools.Offered | None,
    receive: Receive | None,
    upstream: Upstream | None = None,
) -> UpstreamStream:
    upstream = upstream or services.upstream
    stream = await unless_disconnected(receive, upstream.chat_stream(request))
    if offered is not None:
        stream = FetchStream(services, offered, request, stream, upstream)
    return stream


def stream_usage(stream: UpstreamStream) -> dict[str, Any] | None:
    """After hidden built-in rounds the stored usage is the first round's prompt."""
    return stream.memory_usage if isinstance(stream, FetchStream) else None
