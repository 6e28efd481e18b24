"""The admin HTML pages: agents, agent detail, the edit form, the session working memory
and its transcript.

Every page reads the same data as its JSON twin (``proxy/admin/api.py``). Form posts
carry the CSRF token; a page without a valid admin token answers 401 with the login form.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qsl

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from proxy.admin import agents_view
from proxy.admin.auth import admitted, client_address, require_admin, token_matches
from proxy.admin.forms import AgentForm, FormError, input_for
from proxy.admin.inspect import find_session, inspect_session
from proxy.admin.rendering import agent_url, render
from proxy.admin.security import (
    CSRF_FIELD,
    check_loopback_host,
    clear_admin_cookie,
    set_admin_cookie,
    verify_csrf,
)
from proxy.admin.transcript import page_params, transcript_view
from proxy.background.compact import compact
from proxy.errors import (
    RENDERED,
    BadRequest,
    ProxyError,
    TooManyAttempts,
    Unauthorized,
    proxy_error,
)
from proxy.http.requests import read_body
from proxy.metrics import inc
from proxy.services import Services

FORM_LIMIT = 256 * 1024
Page = Callable[[Request], Awaitable[Response]]


def services_of(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


def safe_next(target: str | None) -> str:
    """Only a local admin path may be the target after login (no open redirect)."""
    if (
        not target
        or not target.startswith("/admin")
        or target.startswith("//")
        or "\\" in target
        or any(ord(c) < 32 for c in target)
    ):
        return "/admin/"
    return target


def login_page(request: Request, *, status_code: int, error: str | None = None,
               next_url: str | None = None) -> Response:
    if next_url is None:
        next_url = request.url.path
        if request.url.query:
            next_url += "?" + request.url.query
        if request.method != "GET":
            next_url = "/admin/"
    return render(request, "login.html", {"error": error, "next": safe_next(next_url)},
                  status_code=status_code)


def error_page(request: Request, exc: ProxyError) -> Response:
    inc("memory_proxy_errors_total", type=exc.error_type)
    page = render(request, "error.html", {"error": exc}, status_code=exc.status_code)
    page.headers.update(exc.headers)  # a 429's Retry-After
    return page


def admin_page(handler: Page) -> Page:
    """Require the admin token, and turn errors into pages (401: the login form)."""

    @functools.wraps(handler)
    async def endpoint(request: Request) -> Response:
        services = services_of(request)
        settings = services.settings
        try:
            require_admin(request, settings, services.admin_failures)
            check_loopback_host(request, settings)
            return await handler(request)
        except Unauthorized:
            return login_page(request, status_code=401)
        except RENDERED as exc:
            return error_page(request, proxy_error(exc))

    return endpoint


async def read_form(request: Request) -> dict[str, str]:
    """An urlencoded form, size-limited, with its CSRF token verified."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    form: dict[str, str] = {}
    if content_type == "application/x-www-form-urlencoded":
        raw = await read_body(request, FORM_LIMIT)
        form = dict(parse_qsl(raw.decode("utf-8", "replace"), keep_blank_values=True))
    # any other body carries no token and fails the check below
    verify_csrf(request, services_of(request).settings, form.get(CSRF_FIELD))
    return form


def see_other(url: str) -> RedirectResponse:
    return RedirectResponse(url, status_code=303)


async def login(request: Request) -> Response:
    services = services_of(request)
    settings, failures = services.settings, services.admin_failures
    secret = settings.admin_secret()
    try:
        if secret is None or (request.method == "GET" and admitted(request, settings, failures)):
            return see_other(safe_next(request.query_params.get("next")))
        if request.method == "GET":
            return login_page(request, status_code=200,
                              next_url=request.query_params.get("next") or "/admin/")
        form = await read_form(request)
        failures.check(client_address(request))
    except TooManyAttempts as exc:
        page = login_page(request, status_code=429, error=exc.message)
        page.headers.update(exc.headers)
        return page
    except ProxyError as exc:
        return error_page(request, exc)
    target = safe_next(form.get("next"))
    if not token_matches(secret, form.get("token", "").strip()):
        failures.record(client_address(request))
        return login_page(request, status_code=401, next_url=target,
                          error="That admin token is not valid.")
    response = see_other(target)
    set_admin_cookie(response, request, secret)
    return response


async def logout(request: Request) -> Response:
    try:
        await read_form(request)
    except ProxyError as exc:
        return error_page(request, exc)
    response = see_other("/admin/login")
    clear_admin_cookie(response, request)
    return response


@admin_page
async def agents_page(request: Request) -> Response:
    data = await agents_view.list_agents(services_of(request))
    return render(request, "agents.html", {"nav": "agents", **data})


@admin_page
async def agent_page(request: Request) -> Response:
    agent = request.path_params["agent"]
    detail = await agents_view.agent_detail(services_of(request), agent)
    flash = {"saved": "Saved. The new definition applies from the next turn.",
             "reset": "The admin override was removed: the file definition applies again."}
    notice = next((text for key, text in flash.items() if key in request.query_params), None)
    return render(request, "agent.html", {"nav": "agents", "notice": notice, **detail})


async def _edit_form(request: Request, form: AgentForm, *, status_code: int = 200,
                     error: str | None = None, field: str | None = None) -> Response:
    agent = request.path_params["agent"]
    resolved, override = await agents_view.resolve_fresh(services_of(request), agent)
    context: dict[str, Any] = {
        "nav": "agents",
        "agent": agent,
        "kind": resolved.config.kind,
        "source": resolved.source,
        "has_override": override is not None,
        "effective_window": agents_view.effective_window(resolved, services_of(request)),
        "form": form,
        "error": error,
        "error_field": field,
        "error_input": input_for(field),
    }
    return render(request, "edit.html", context, status_code=status_code)


@admin_page
async def edit_page(request: Request) -> Response:
    agent = request.path_params["agent"]
    if request.method == "GET":
        resolved, _ = await agents_view.resolve_fresh(services_of(request), agent)
        return await _edit_form(request, AgentForm.prefilled(resolved))
    submitted = AgentForm.submitted(await read_form(request))
    try:
        resolved, _ = await agents_view.resolve_fresh(services_of(request), agent)
        changes = submitted.changes(resolved.definition.tools)
        await agents_view.save_agent(services_of(request), agent, changes)
    except FormError as exc:
        return await _edit_form(request, submitted, status_code=400, error=str(exc),
                                field=exc.field)
    except BadRequest as exc:
        return await _edit_form(request, submitted, status_code=400, error=exc.message,
                                field=exc.param)
    return see_other(agent_url(agent) + "?saved=1")


@admin_page
async def reset_page(request: Request) -> Response:
    await read_form(request)
    agent = request.path_params["agent"]
    await agents_view.reset_agent(services_of(request), agent)
    return see_other(agent_url(agent) + "?reset=1")


@admin_page
async def session_page(request: Request) -> Response:
    services = services_of(request)
    agent, session = request.path_params["agent"], request.path_params["session"]
    compacting = request.method == "POST"
    if compacting:
        await read_form(request)
    key = await find_session(services, agent, session, request.query_params.get("namespace"))
    context: dict[str, Any] = {"nav": "agents", "compact_result": None, "compact_error": None,
                               "before": None}
    status_code = 200
    if compacting:
        context["before"] = (await inspect_session(services, key))["totals"]
        try:
            context["compact_result"] = await compact(services, key)
        except RENDERED as exc:
            error = proxy_error(exc)
            context["compact_error"] = error.message
            status_code = error.status_code
    view = await inspect_session(services, key)
    return render(request, "session.html", {**context, "view": view}, status_code=status_code)


@admin_page
async def transcript_page(request: Request) -> Response:
    services = services_of(request)
    agent, session = request.path_params["agent"], request.path_params["session"]
    after, limit = page_params(request)
    key = await find_session(services, agent, session, request.query_params.get("namespace"))
    view = await transcript_view(services, key, after, limit)
    here = agent_url(agent, "sessions", session, "transcript", namespace=key.namespace)
    joiner = "&" if "?" in here else "?"
    # compaction points: a divider after the message that ends each summary's range
    points: dict[int, list[dict[str, Any]]] = {}
    for summary in view["summaries"]:
        points.setdefault(summary["to_seq"], []).append(summary)
    return render(request, "transcript.html", {
        "nav": "agents", "view": view, "points": points,
        "first_url": here if after else None,
        "next_url": f"{here}{joiner}after={view['next_after']}" if view["next_after"] else None,
    })
