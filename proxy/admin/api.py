"""The JSON twin of every admin page, under ``/admin/api/``.

``POST /admin/api/agents/{agent}/sessions/{session}/compact`` lives in
``proxy/background/compact.py``.
Writes take a JSON body (``Content-Type: application/json``): a browser cannot send one
cross-site without a CORS preflight, which the proxy never grants; every write passes the
cross-site check of ``proxy/admin/security.py`` (``CrossSiteWrites``) first.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import Response

from proxy.admin import agents_view
from proxy.admin.auth import require_admin
from proxy.admin.inspect import inspect_session, requested_session
from proxy.admin.security import check_loopback_host
from proxy.admin.transcript import transcript_response
from proxy.errors import RENDERED, BadRequest, UnsupportedMediaType
from proxy.http.requests import parse_json_object, read_body
from proxy.http.responses import json_response, proxy_error_handler
from proxy.services import Services

BODY_LIMIT = 1024 * 1024
Endpoint = Callable[[Request], Awaitable[Response]]


def admin_api(handler: Endpoint) -> Endpoint:
    """Require the admin token; errors are answered here so they carry the admin headers."""

    @functools.wraps(handler)
    async def endpoint(request: Request) -> Response:
        services: Services = request.app.state.services
        try:
            require_admin(request, services.settings, services.admin_failures)
            check_loopback_host(request, services.settings)
            return await handler(request)
        except RENDERED as exc:
            return await proxy_error_handler(request, exc)

    return endpoint


async def read_json_body(request: Request) -> dict[str, object]:
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type != "application/json":
        raise UnsupportedMediaType("send the definition as JSON (Content-Type: application/json)")
    return parse_json_object(await read_body(request, BODY_LIMIT))


@admin_api
async def agents(request: Request) -> Response:
    return json_response(await agents_view.list_agents(request.app.state.services))


@admin_api
async def agent(request: Request) -> Response:
    """GET: detail; PUT/POST: save a partial definition; DELETE: drop the admin override."""
    services: Services = request.app.state.services
    name = request.path_params["agent"]
    if request.method in ("PUT", "POST"):
        changes = await read_json_body(request)
        if changes.pop("name", name) != name:
            raise BadRequest("name cannot be changed here; it is the agent's id", param="name")
        await agents_view.save_agent(services, name, changes)
    elif request.method == "DELETE":
        await agents_view.reset_agent(services, name)
    return json_response(await agents_view.agent_detail(services, name))


@admin_api
async def session(request: Request) -> Response:
    services: Services = request.app.state.services
    key = await requested_session(services, request)
    return json_response(await inspect_session(services, key))


@admin_api
async def transcript(request: Request) -> Response:
    """A page of the transcript, or the JSON lines export (``?format=jsonl``)."""
    return await transcript_response(request.app.state.services, request)
