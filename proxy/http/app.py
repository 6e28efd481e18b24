"""The app factory: ``create_app(settings, *, store=None, upstream=None) -> Starlette``."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from collections.abc import AsyncIterator
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from proxy import model_info
from proxy.admin.auth import FailedAttempts
from proxy.admin.memory_api import list_sessions, session_memory
from proxy.admin.security import CrossSiteWrites
from proxy.admin.session_admin import PATH as SESSION_PATH
from proxy.admin.session_admin import delete_session
from proxy.admin.transcript import session_transcript
from proxy.agents import AgentRegistry
from proxy.background.compact import compact_session
from proxy.background.summarizer import CallBudget
from proxy.http.responses import EXCEPTION_HANDLERS, json_response
from proxy.metrics import metrics_endpoint
from proxy.services import Services
from proxy.settings import Settings
from proxy.surfaces.base import Surface
from proxy.surfaces.chat import chat_surface, forwarded_headers
from proxy.surfaces.messages import count_tokens, messages_surface
from proxy.turn.pipeline import serve
from proxy.upstreams.base import Upstream, header_secrets
from storage.base import Store
from storage.cached import CachedStore
from storage.parts import load_part_reader
from storage.redact import mask_body
from storage.registry import open_store
from strategies.mapper import load_mapper

logger = logging.getLogger("memory_proxy")


def preload_tokenizers(settings: Settings) -> None:
    """Read the model map and the default tokenizer before serving (off the event loop):
    the first turn should not pay for loading a BPE file."""
    from strategies.tokens import encoding_for_model, get_encoding

    model_info.preload()
    get_encoding(encoding_for_model(settings.default_model))


# gen0 collections every 7,000 net allocations instead of 700; gen2 after 100 gen1 runs
GC_THRESHOLDS = (7000, 20, 100)


def tune_gc() -> None:
    """For a serving process: the objects of start-up (modules, tokenizers, settings) go to
    the permanent generation, so a full collection no longer walks them, and collections
    run less often. Measured on a turn loop over 3,000 cached sessions: GC time 42 -> 10 us
    per turn, longest pause 102 -> 40 ms. Not for a process that builds many apps (tests):
    frozen objects are only freed by reference counting."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def build_upstream(settings: Settings) -> Upstream:
    from proxy.upstreams.litellm_upstream import LitellmUpstream
    from proxy.upstreams.openai_http import OpenAIUpstream, TLSSettings
    from proxy.upstreams.router import RoutedUpstream

    direct = OpenAIUpstream(
        settings.upstream_url,
        api_key=settings.upstream_key(),
        timeout=settings.upstream_timeout,
        max_connections=settings.upstream_max_connections,
        tls=TLSSettings.from_settings(settings),
    )
    return RoutedUpstream(
        direct,
        lambda: LitellmUpstream(api_key=settings.upstream_key()),
        prefixes=None if settings.litellm_routing else frozenset(),
    )


async def base_url_check(request: Request) -> Response:
    """``HEAD`` on a base URL (Claude Code checks it is reachable before its first call)."""
    return Response(status_code=200)


async def health(request: Request) -> Response:
    return json_response({"status": "ok"})


async def ready(request: Request) -> Response:
    services: Services = request.app.state.services
    try:
        reachable = await asyncio.wait_for(services.store.ping(), timeout=2.0)
    except (TimeoutError, Exception):  # any failure means not ready; the reason is logged
        logger.warning("readiness check: store did not answer", exc_info=True)
        reachable = False
    if reachable:
        return json_response({"status": "ready", "store": "ok"})
    return json_response(
        {"status": "unavailable", "store": "unreachable"},
        status_code=503,
        headers={"Retry-After": "1"},
    )


async def models(request: Request) -> Response:
    services: Services = request.app.state.services
    headers = forwarded_headers(request.headers)
    response = await services.upstream.models(headers)
    body = response.body
    if response.status_code >= 400:  # an error may echo the key it was sent
        secrets = header_secrets(headers, services.settings.upstream_key())
        body = mask_body(body, secrets)
    return Response(
        body,
        status_code=response.status_code,
        media_type=response.headers.get("content-type", "application/json"),
    )


def surface_endpoint(surface: Surface) -> Any:
    """The Starlette endpoint of an API surface: its requests run the turn pipeline."""

    async def endpoint(request: Request) -> Response:
        return await serve(surface, request)

    endpoint.__name__ = f"{surface.name}_endpoint"
    return endpoint


def routes() -> list[BaseRoute]:
    chat_paths = [
        "/v1/chat/completions",
        "/chat/completions",
        "/agents/{agent}/v1/chat/completions",
        "/agents/{agent}/sessions/{session}/v1/chat/completions",
    ]
    model_paths = [
        "/v1/models",
        "/agents/{agent}/v1/models",
        "/agents/{agent}/sessions/{session}/v1/models",
    ]
    bases = ["", "/agents/{agent}", "/agents/{agent}/sessions/{session}"]
    chat = surface_endpoint(chat_surface)
    messages = surface_endpoint(messages_surface)
    found: list[BaseRoute] = [Route(p, chat, methods=["POST"]) for p in chat_paths]
    found += responses_routes()
    found += [Route(p, models, methods=["GET"]) for p in model_paths]
    # the Messages API (proxy/surfaces/messages.py); Anthropic's clients check their base
    # URL with a HEAD first
    found += [Route(b + "/v1/messages", messages, methods=["POST"]) for b in bases]
    found += [Route(b + "/v1/messages/count_tokens", count_tokens, methods=["POST"])
              for b in bases]
    found += [Route(b or "/", base_url_check, methods=["HEAD"]) for b in bases]
    found += [
        Route("/health", health, methods=["GET"]),
        Route("/ready", ready, methods=["GET"]),
        Route("/metrics", metrics_endpoint, methods=["GET"]),
        Route("/memory/{agent}", list_sessions, methods=["GET"]),
        Route("/memory/{agent}/{session}", session_memory, methods=["GET"]),
        Route("/memory/{agent}/{session}/transcript", session_transcript, methods=["GET"]),
        # before the /admin mount, which would take every /admin path
        Route(SESSION_PATH, delete_session, methods=["DELETE"]),
        Route(
            "/admin/api/agents/{agent}/sessions/{session}/compact",
            compact_session,
            methods=["POST"],
        ),
    ]
    with contextlib.suppress(ImportError):
        from proxy.admin.routes import admin_routes

        found += [Route("/admin", admin_root, methods=["GET"]), *admin_routes()]
    return found


def responses_routes() -> list[BaseRoute]:
    """The Responses API (proxy/surfaces/responses.py), in the path forms of chat."""
    from proxy.surfaces.responses import input_tokens, responses_endpoint
    from proxy.surfaces.responses_state import (
        delete_response,
        get_response,
        list_input_items,
    )

    found: list[BaseRoute] = [Route("/responses", responses_endpoint, methods=["POST"])]
    for prefix in ("/v1", "/agents/{agent}/v1", "/agents/{agent}/sessions/{session}/v1"):
        base = f"{prefix}/responses"
        found += [
            Route(base, responses_endpoint, methods=["POST"]),
            Route(f"{base}/input_tokens", input_tokens, methods=["POST"]),
            Route(f"{base}/{{response_id}}", get_response, methods=["GET"]),
            Route(f"{base}/{{response_id}}", delete_response, methods=["DELETE"]),
            Route(f"{base}/{{response_id}}/input_items", list_input_items, methods=["GET"]),
        ]
    return found


class WithoutTrailingSlash:
    """An API path ending in "/" (``/v1/chat/completions/``) is served as the path without
    it, never redirected (Starlette's redirect would build its Location from the client's
    Host header). The admin's paths keep their own slashes."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path = scope["path"]
            root = scope.get("root_path", "")
            if len(path) > 1 and path[-1] == "/" and not path[len(root) :].startswith("/admin"):
                scope = {**scope, "path": path.rstrip("/") or "/"}
        await self.app(scope, receive, send)


async def admin_root(request: Request) -> Response:
    return RedirectResponse("/admin/", status_code=307)  # a relative Location


def create_app(
    settings: Settings | None = None,
    *,
    store: Store | None = None,
    upstream: Upstream | None = None,
) -> Starlette:
    settings = settings or Settings()
    # sessions kept decoded between turns, served while the store's version is unchanged
    store = CachedStore(
        store or open_store(settings.store_url), int(settings.session_cache_mb * 1024 * 1024)
    )
    services = Services(
        settings=settings,
        store=store,
        upstream=upstream or build_upstream(settings),
        agents=AgentRegistry(settings.agents_dir),
        mapper=load_mapper(settings.mapper),
        part_reader=load_part_reader(settings.part_reader, store),
        summarizer_budget=CallBudget(settings.summarizer_calls_per_hour),
        admin_failures=FailedAttempts(settings.admin_auth_failures_per_minute),
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        services.agents.load()
        await asyncio.to_thread(preload_tokenizers, settings)
        await services.store.open()
        await services.upstream.start()
        if settings.tune_gc:
            tune_gc()
        services.started = True
        try:
            yield
        finally:
            await services.drain()
            await services.upstream.close()
            if services.messages_upstream is not None:
                await services.messages_upstream.close()
            await services.store.close()

    app = Starlette(
        routes=routes(), lifespan=lifespan, exception_handlers=dict(EXCEPTION_HANDLERS),
        middleware=[Middleware(WithoutTrailingSlash), Middleware(CrossSiteWrites)],
    )
    app.router.redirect_slashes = False  # see WithoutTrailingSlash
    app.state.services = services
    return app
