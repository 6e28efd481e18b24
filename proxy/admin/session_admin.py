"""``DELETE /admin/api/agents/{agent}/sessions/{session}``: forget a session entirely.

Every record of the session goes in one store operation (messages, superseded ones
included, summaries, locks, index entries); the upstream headers this process keeps in
memory for its background summaries go too. Media parts are content-addressed and may be
shared with other sessions, so they stay (see docs/RELIABILITY.md).

When two API keys used the same session id, ``?namespace=`` (shown by ``/memory/{agent}``)
says which one; without it such a delete is refused rather than guessed.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from proxy.admin.auth import require_admin
from proxy.errors import AmbiguousSession, NotFound
from proxy.http.responses import json_response
from proxy.services import Services
from strategies.records import SessionKey

PATH = "/admin/api/agents/{agent}/sessions/{session}"


async def session_key(services: Services, agent: str, session: str, namespace: str | None
                      ) -> SessionKey:
    if namespace:
        return SessionKey(namespace, agent, session)
    namespaces = [s.namespace for s in await services.store.find_sessions(agent, session)]
    if not namespaces:
        raise NotFound(f"no session {session!r} for agent {agent!r}", code="session_not_found")
    if len(namespaces) > 1:
        raise AmbiguousSession(
            f"{len(namespaces)} API keys use session {session!r}: pass ?namespace= "
            f"(one of {', '.join(sorted(namespaces))})",
            param="namespace",
        )
    return SessionKey(namespaces[0], agent, session)


async def delete_session(request: Request) -> Response:
    services: Services = request.app.state.services
    require_admin(request, services.settings, services.admin_failures)
    params = request.path_params
    key = await session_key(
        services, params["agent"], params["session"], request.query_params.get("namespace")
    )
    existed = await services.store.delete_session(key)
    services.credentials.pop(key, None)
    if not existed:
        raise NotFound(
            f"no session {key.session!r} for agent {key.agent!r}", code="session_not_found"
        )
    return json_response(
        {"deleted": True, "agent": key.agent, "session": key.session, "namespace": key.namespace}
    )
