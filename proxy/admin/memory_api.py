"""``/memory``: the working memory as the model receives it (admin token required)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from proxy.admin.auth import require_admin
from proxy.admin.inspect import inspect_session, requested_session
from proxy.http.responses import json_response
from proxy.services import Services


async def list_sessions(request: Request) -> Response:
    services: Services = request.app.state.services
    require_admin(request, services.settings, services.admin_failures)
    agent = request.path_params["agent"]
    sessions = await services.store.list_sessions(agent)
    resolved = services.agents.resolve(agent, services.overrides.get(agent))
    return json_response({
        "agent": agent,
        "strategy": resolved.config.kind,
        "sessions": [s.to_dict() for s in sessions],
    })


async def session_memory(request: Request) -> Response:
    services: Services = request.app.state.services
    require_admin(request, services.settings, services.admin_failures)
    key = await requested_session(services, request)
    view = await inspect_session(services, key)
    headers = {
        "x-memory-agent": key.agent,
        "x-memory-session": key.session,
        "x-memory-strategy": view["strategy"],
        "x-memory-window-tokens": str(view["totals"]["window_tokens"]),
        "x-memory-context-modified": "true" if view["totals"]["context_modified"] else "false",
    }
    return json_response(view, headers=headers)

