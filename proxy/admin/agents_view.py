"""What the admin shows about agents and how an edit is saved; pages and JSON twins share it.

An agent is known from its file (``AgentRegistry.names()``) or from traffic
(``store.list_agents()``). Its effective definition is the admin-saved override in the
store when there is one, else the file, else the defaults: exactly what a turn runs with.
"""

from __future__ import annotations

from typing import Any

from proxy.agents import AgentDefinitionError, ResolvedAgent, parse_definition
from proxy.errors import BadRequest, InvalidMemoryConfig
from proxy.services import Services
from strategies.records import AgentInfo

SESSION_LIMIT = 200


async def resolve_fresh(
    services: Services, agent: str
) -> tuple[ResolvedAgent, dict[str, Any] | None]:
    """The agent as the next turn will run it, reading the override from the store (another
    replica may have saved it); the per-process cache is refreshed on the way."""
    override = await services.store.get_agent_config(agent)
    services.overrides[agent] = override
    return services.agents.resolve(agent, override), override


def effective_window(resolved: ResolvedAgent, services: Services) -> int:
    return resolved.context_window(
        resolved.definition.llm.model or "", services.settings.default_context_window
    )


async def list_agents(services: Services) -> dict[str, Any]:
    """Every agent from files and traffic with its active memory kind and session count."""
    traffic: list[AgentInfo] = await services.store.list_agents()
    seen = {info.agent: info for info in traffic}
    rows = []
    for name in sorted(set(services.agents.names()) | set(seen)):
        resolved, _ = await resolve_fresh(services, name)
        info = seen.get(name)
        rows.append({
            "agent": name,
            "kind": resolved.config.kind,
            "configured": resolved.configured,
            "source": resolved.source,
            "description": resolved.definition.description,
            "in_files": name in services.agents.files,
            "session_count": info.session_count if info else 0,
            "updated_at": info.updated_at if info else None,
        })
    return {"agents": rows, "file_errors": dict(services.agents.errors)}


def definition_dict(resolved: ResolvedAgent) -> dict[str, Any]:
    data = resolved.definition.model_dump(mode="json", exclude_none=True)
    data["llm"] = {k: v for k, v in data.get("llm", {}).items() if v is not None}
    return data


async def agent_detail(services: Services, agent: str) -> dict[str, Any]:
    """The agent's active kind, effective config and definition, and its sessions."""
    resolved, override = await resolve_fresh(services, agent)
    sessions = await services.store.list_sessions(agent, limit=SESSION_LIMIT)
    return {
        "agent": agent,
        "kind": resolved.config.kind,
        "configured": resolved.configured,
        "source": resolved.source,
        "config": resolved.config.to_dict(),
        "definition": definition_dict(resolved),
        "context_window": effective_window(resolved, services),
        "override": override,
        "file": services.agents.files.get(agent),
        "sessions": [s.to_dict() for s in sessions],
    }


def _base_definition(services: Services, agent: str, override: dict[str, Any] | None
                     ) -> dict[str, Any]:
    if override is not None:
        return dict(override)
    return dict(services.agents.files.get(agent) or {})


def merge_changes(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """Apply a partial definition: keys present replace, ``llm`` merges field by field,
    and a null removes (so ``"memoryConfig": null`` means the defaults)."""
    merged = dict(base)
    for name, value in changes.items():
        if value is None:
            merged.pop(name, None)
            continue
        if name == "llm" and isinstance(value, dict):
            current = merged.get("llm")
            combined = {**(current if isinstance(current, dict) else {}), **value}
            value = {k: v for k, v in combined.items() if v is not None}
        merged[name] = value
    return merged


async def save_agent(services: Services, agent: str, changes: dict[str, Any]) -> ResolvedAgent:
    """Validate the edited definition and store it whole as the agent's override.

    It wins over the file from the next turn on, on every replica (a turn re-reads the
    override with its one load). Errors name the field: ``InvalidMemoryConfig`` for
    ``memoryConfig``, ``BadRequest`` for the rest of the definition.
    """
    _, override = await resolve_fresh(services, agent)
    definition = merge_changes(_base_definition(services, agent, override), changes)
    definition["name"] = agent
    try:
        parse_definition(definition)
    except AgentDefinitionError as exc:
        field = exc.field or "definition"
        if field.startswith("memoryConfig"):
            raise InvalidMemoryConfig(str(exc), param=field) from None
        raise BadRequest(str(exc), param=field, code="invalid_agent_definition") from None
    await services.store.set_agent_config(agent, definition)
    services.overrides[agent] = definition
    return services.agents.resolve(agent, definition)


async def reset_agent(services: Services, agent: str) -> ResolvedAgent:
    """Drop the admin override: the file (or the defaults) applies again from the next turn."""
    await services.store.set_agent_config(agent, None)
    services.overrides[agent] = None
    return services.agents.resolve(agent, None)
