"""The load step: the agent's config, its strategy and the session as stored.

One store round trip (``Store.load``) in the usual turn; a paged spec may read the pages
before it (proxy/turn/paging.py). Also the strategy's view of a stored session without a
request (``stored_context``: /memory, Compact).
"""

from __future__ import annotations

import asyncio
import contextlib

from proxy.agents import ResolvedAgent
from proxy.http import limits
from proxy.services import Services
from proxy.turn import history_sync, paging
from proxy.turn.state import Turn
from proxy.turn.sync import Incoming
from strategies.base import Strategy, WindowContext
from strategies.records import LoadSpec, SessionKey, SessionSnapshot, StoredMessage
from strategies.registry import get_strategy
from strategies.tokens import cached_counter


def resolve_agent(services: Services, agent_name: str) -> ResolvedAgent:
    return services.agents.resolve(agent_name, services.overrides.get(agent_name))


def current_turn_start(messages: list[StoredMessage]) -> int:
    for index in range(len(messages) - 1, -1, -1):
        if messages[index].role == "user":
            return index
    return 0


async def load(services: Services, turn: Turn, history: Incoming) -> None:
    """Wait for a compaction of the session under way here, then load it (a full-history
    client's conversation is matched against the stored log)."""
    await wait_for_compaction(services, turn.key)
    turn.agent, turn.strategy, turn.spec, turn.snapshot = await load_snapshot(
        services, turn.key, turn.agent, history.resent, turn.model
    )
    if not turn.snapshot.exists:
        await limits.check_new_session(services.settings, services.store, turn.key.namespace)


async def wait_for_compaction(services: Services, key: SessionKey) -> None:
    """A turn that arrives while this process compacts its session waits (bounded),
    then goes ahead with whatever is stored: the strategy keeps the window safe."""
    event = services.compactions.get(key)
    if event is not None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), services.settings.compaction_wait_seconds)


async def load_snapshot(
    services: Services,
    key: SessionKey,
    agent: ResolvedAgent,
    resent: history_sync.Fingerprints | None,
    model: str | None = None,
) -> tuple[ResolvedAgent, Strategy, LoadSpec, SessionSnapshot]:
    """Load with the config known for the agent; reload once if the stored override
    changed the strategy's load spec (an admin edit seen for the first time here). A
    paged spec's page is then filled to the window's budget for ``model`` (the session's
    stored model when None)."""
    strategy = get_strategy(agent.config.kind)
    spec = strategy.load_spec(agent.config)
    snapshot = await load_session(services, key, spec, resent)
    if snapshot.agent_config != services.overrides.get(key.agent):
        services.overrides[key.agent] = snapshot.agent_config
        agent = services.agents.resolve(key.agent, snapshot.agent_config)
        strategy = get_strategy(agent.config.kind)
        new_spec = strategy.load_spec(agent.config)
        if new_spec != spec:
            snapshot = await load_session(services, key, new_spec, resent)
        spec = new_spec
    await paging.fill_for(services, key, agent, spec, snapshot, model)
    return agent, strategy, spec, snapshot


async def load_session(
    services: Services, key: SessionKey, spec: LoadSpec, resent: history_sync.Fingerprints | None
) -> SessionSnapshot:
    """``Store.load``: the page, and where a resent history (a full-history client's,
    ``resent``) meets the stored log (``probe``: the chains of every message). The store
    is the process's ``CachedStore`` (storage/cached.py): an unchanged session's page comes
    from memory."""
    probe = resent.probe() if resent is not None else []
    return await services.store.load(key, spec, probe=probe)


def stored_context(
    services: Services,
    agent: ResolvedAgent,
    snapshot: SessionSnapshot,
    model: str,
    *,
    extra_system_tokens: int = 0,
) -> WindowContext:
    """The strategy's view of a session as stored (no request): /memory and Compact."""
    meta = snapshot.meta
    return WindowContext(
        config=agent.config,
        context_window=agent.context_window(model, services.settings.default_context_window),
        messages=snapshot.messages,
        summaries=snapshot.summaries,
        system_tokens=meta.system_tokens + extra_system_tokens,
        current_turn_start=current_turn_start(snapshot.messages),
        count_tokens=cached_counter(model),
        calibration=meta.calibration or 1.0,
    )
