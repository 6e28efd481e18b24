"""The admin routes: the UI under ``/admin/`` and its JSON twin under ``/admin/api/``.

Pages: agents, agent detail (active memory kind, sessions), the edit form with the
Memory (JSON) field, and the session working memory with the Compact button.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Mount, Route, Router
from starlette.staticfiles import StaticFiles
from starlette.types import Receive, Scope, Send

from proxy.admin import api, pages
from proxy.admin.rendering import HERE
from proxy.admin.security import SecurityHeaders
from proxy.errors import NotFound
from proxy.http.responses import proxy_error_handler

__all__ = ["admin_routes"]


async def not_found(scope: Scope, receive: Receive, send: Send) -> None:
    request = Request(scope, receive)
    error = NotFound(f"no admin page at {request.url.path}", code="not_found")
    response: Response
    if "/admin/api/" in request.url.path:
        response = await proxy_error_handler(request, error)
    else:
        response = pages.error_page(request, error)
    await response(scope, receive, send)


def admin_routes() -> list[BaseRoute]:
    """One mount: every admin response passes through ``SecurityHeaders``."""
    session_path = "/agents/{agent}/sessions/{session}"
    router = Router(
        routes=[
            Route("/", pages.agents_page, methods=["GET"]),
            Route("/login", pages.login, methods=["GET", "POST"]),
            Route("/logout", pages.logout, methods=["POST"]),
            Route("/agents/{agent}", pages.agent_page, methods=["GET"]),
            Route("/agents/{agent}/edit", pages.edit_page, methods=["GET", "POST"]),
            Route("/agents/{agent}/reset", pages.reset_page, methods=["POST"]),
            Route(session_path, pages.session_page, methods=["GET"]),
            Route(session_path + "/compact", pages.session_page, methods=["POST"]),
            Route(session_path + "/transcript", pages.transcript_page, methods=["GET"]),
            Route("/api/agents", api.agents, methods=["GET"]),
            Route("/api/agents/{agent}", api.agent, methods=["GET", "PUT", "POST", "DELETE"]),
            Route("/api" + session_path, api.session, methods=["GET"]),
            Route("/api" + session_path + "/transcript", api.transcript, methods=["GET"]),
            Mount("/static", app=StaticFiles(directory=HERE / "static"), name="admin-static"),
        ],
        default=not_found,
    )
    return [Mount("/admin", app=SecurityHeaders(router), name="admin")]
