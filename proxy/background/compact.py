"""The Compact action: run the strategy's ``compress()`` for one session now."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from proxy.admin.auth import require_admin
from proxy.admin.inspect import inspect_session, requested_session
from proxy.background.summarizer import SummarizerBusy, SummarizerError, run_plan
from proxy.errors import CompactConflict
from proxy.http.responses import json_response
from proxy.services import Services
from proxy.turn.load import load_snapshot, resolve_agent, stored_context
from strategies.records import SessionKey


async def compact(services: Services, key: SessionKey) -> dict[str, object]:
    """Plan with the strategy, persist stubs, run each summary; return what changed and the
    refreshed working memory."""
    agent = resolve_agent(services, key.agent)
    agent, strategy, _spec, snapshot = await load_snapshot(services, key, agent, None)
    meta = snapshot.meta
    model = meta.model or agent.definition.llm.model or ""
    context = stored_context(services, agent, snapshot, model)
    context_window = context.context_window
    plan = strategy.compress(context)
    result: dict[str, object] = {
        "strategy": agent.config.kind,
        "noop": plan.noop,
        "message": plan.message,
        "compressed": len(plan.new_stubs),
        "summaries": [],
    }
    if plan.noop:
        return result
    if plan.new_stubs:
        await services.store.set_compressed(key, dict(plan.new_stubs))
    headers = services.credentials.get(key) or {}
    written = []
    for summarize in plan.summarize:
        if not headers and not services.settings.upstream_key():
            raise CompactConflict(
                "no upstream credentials for this session in this process: send a turn "
                "first or set MEMORY_PROXY_UPSTREAM_API_KEY"
            )
        try:
            record = await run_plan(
                services, key, agent, model, summarize,
                headers=headers,
                context_window=context_window,
                expect_boundary=meta.boundary_seq if summarize.kind == "compaction" else None,
            )
        except SummarizerBusy as exc:
            raise CompactConflict(str(exc)) from exc
        except SummarizerError as exc:
            raise CompactConflict(f"summarizer failed: {exc}") from exc
        if record is not None:
            written.append({"kind": record.kind, "from_seq": record.from_seq,
                            "to_seq": record.to_seq, "tokens": record.tokens})
    result["summaries"] = written
    return result


async def compact_session(request: Request) -> Response:
    services: Services = request.app.state.services
    require_admin(request, services.settings, services.admin_failures)
    key = await requested_session(services, request)
    result = await compact(services, key)
    result["memory"] = await inspect_session(services, key)
    return json_response(result)
