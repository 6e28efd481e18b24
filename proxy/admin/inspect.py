"""The working memory of a session as the model receives it (``/memory``, admin)."""

from __future__ import annotations

from typing import Any

from starlette.requests import HTTPConnection

from proxy.agents import ResolvedAgent
from proxy.errors import NotFound
from proxy.services import Services
from proxy.turn import parts, prompt_cache
from proxy.turn.load import current_turn_start, load_snapshot, resolve_agent, stored_context
from strategies import media
from strategies.base import Window, WindowContext
from strategies.mapper import MappingContext
from strategies.records import SessionKey, SessionSnapshot
from strategies.tokens import count_message


async def find_session(
    services: Services, agent: str, session: str, namespace: str | None
) -> SessionKey:
    """Admin views address a session by agent and id; the namespace disambiguates when two
    API keys used the same session id."""
    if namespace:
        return SessionKey(namespace, agent, session)
    matches = await services.store.find_sessions(agent, session)
    if not matches:
        raise NotFound(f"no session {session!r} for agent {agent!r}", code="session_not_found")
    return SessionKey(matches[0].namespace, agent, session)


async def requested_session(services: Services, request: HTTPConnection) -> SessionKey:
    """The session an admin URL names: ``/…/{agent}/…/{session}`` and ``?namespace=``."""
    return await find_session(
        services,
        request.path_params["agent"],
        request.path_params["session"],
        request.query_params.get("namespace"),
    )


def text_of(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        lines = []
        for part in content:
            if not isinstance(part, dict):
                continue
            if part.get("type") == "text":
                lines.append(str(part.get("text", "")))
            else:
                # a media block: named on a line of its own
                lines.append(media.describe_sent_part(part))
        return "\n".join(lines)
    return str(content)


def window_view(
    agent: ResolvedAgent,
    snapshot: SessionSnapshot,
    context: WindowContext,
    window: Window,
    rendered: list[dict[str, Any]],
    model: str,
    mapping: MappingContext | None = None,
) -> dict[str, Any]:
    # the default mapper renders one message per window item, after the system block and
    # a USER_MESSAGE summary; a custom mapper that does otherwise shows its head as is
    cut = len(rendered) - len(window.items)
    head, tail = rendered[:cut], rendered[cut:]
    messages: list[dict[str, Any]] = [
        {
            "role": sent["role"],
            "kind": "system" if sent["role"] in ("system", "developer") else "summary",
            "text": text_of(sent.get("content")),
            "tokens": count_message(sent, model),
        }
        for sent in head
    ]
    for item, sent in zip(window.items, tail, strict=False):
        message = item.message
        entry: dict[str, Any] = {
            "seq": message.seq,
            "role": sent["role"],
            "text": text_of(sent.get("content")),
            "tokens": item.tokens,
            "marker": item.marker,
        }
        if sent.get("tool_calls"):
            entry["tool_calls"] = [
                {"id": c.get("id"), "name": (c.get("function") or {}).get("name"),
                 "arguments": (c.get("function") or {}).get("arguments")}
                for c in sent["tool_calls"]
            ]
        if message.tool_call_id:
            entry["tool_call_id"] = message.tool_call_id
        if item.marker in ("compressed", "evicted", "truncated"):
            entry["stored_tokens"] = message.tokens
        if message.meta.get("parts"):
            entry["parts"] = (
                media.part_views(message, mapping) if mapping else message.meta["parts"]
            )
        messages.append(entry)
    ratio = window.tokens * (context.calibration or 1.0) / context.context_window
    return {
        "agent": agent.name,
        "strategy": agent.config.kind,
        "config": agent.config.to_dict(),
        "configured": agent.configured,
        "config_source": agent.source,
        "model": model,
        "context_window": context.context_window,
        "calibration": context.calibration,
        "messages": messages,
        "summaries": [
            {"kind": s.kind, "from_seq": s.from_seq, "to_seq": s.to_seq, "tokens": s.tokens,
             "model": s.model, "text": s.text, "sent": s in window.summaries}
            for s in snapshot.summaries
        ],
        "totals": {
            "window_tokens": window.tokens,
            "live_ratio": round(ratio, 4),
            "messages_sent": len(window.items),
            "messages_loaded": len(context.messages),
            "messages_stored": snapshot.meta.active_count,
            "trimmed": window.trimmed,
            "compressed": sum(1 for i in window.items if i.marker == "compressed"),
            "evicted": sum(1 for i in window.items if i.marker == "evicted"),
            "truncated": sum(1 for i in window.items if i.marker == "truncated"),
            "context_modified": window.modified,
        },
        "notes": window.notes,
    }


async def inspect_session(services: Services, key: SessionKey) -> dict[str, Any]:
    agent = resolve_agent(services, key.agent)
    agent, strategy, _spec, snapshot = await load_snapshot(services, key, agent, None)
    if not snapshot.exists:
        raise NotFound(
            f"no session {key.session!r} for agent {key.agent!r}", code="session_not_found"
        )
    meta = snapshot.meta
    model = meta.model or agent.definition.llm.model or ""
    messages = snapshot.messages
    start = current_turn_start(messages)
    mapping = MappingContext(model=model, capabilities=agent.capabilities(model),
                             current_turn_seq=messages[start].seq if messages else 0)
    # the current turn's media as the model receives them: blocks loaded, tokens counted
    await parts.load_media(services, key, messages[start:], mapping)
    media_tokens = media.current_turn_deltas(messages[start:], mapping, model)
    context = stored_context(
        services, agent, snapshot, model, extra_system_tokens=sum(media_tokens.values())
    )
    window = strategy.select(context)
    media.settle_window(window, media_tokens)
    window.trimmed += max(0, meta.active_count - len(snapshot.messages))
    rendered = services.mapper.map(window, meta.system_prompt, mapping)
    view = window_view(agent, snapshot, context, window, rendered, model, mapping)
    view.update(namespace=key.namespace, session=key.session, head_seq=meta.head_seq,
                updated_at=meta.updated_at, cache=prompt_cache.session_view(messages))
    return view
