"""One turn's memory work before the upstream call: load, sync, select, render.

Everything here is one store round trip (``Store.load``) plus pure work; the turn's
writes happen in ``proxy.turn.persist.persist_turn`` after the reply, as one atomic
``append_turn``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from proxy.agents import ResolvedAgent
from proxy.errors import StoreUnavailableError
from proxy.http import limits, requests
from proxy.services import Services
from proxy.turn import history_sync, paging, parts, prompt_cache, sync_plan, tool_caps
from proxy.turn.identity import Identity
from storage.base import StoreUnavailable
from strategies import media
from strategies.base import Strategy, Window, WindowContext
from strategies.key_cache import MAX_KEY_CHARS
from strategies.mapper import MappingContext
from strategies.records import (
    LoadSpec,
    SessionKey,
    SessionSnapshot,
    StoredMessage,
)
from strategies.registry import get_strategy
from strategies.tokens import cached_counter, count_message, count_text

# a stored message this large, loaded by a process that never counted it, is cut (counted
# again) by the strategy on a thread
LARGE_TOKENS = 64_000
# bound on the messages of one turn loaded to keep it whole (a runaway tool loop)
TURN_LOAD_LIMIT = 2000


@dataclass(slots=True)
class Turn:
    """A prepared turn: what was loaded, what is new, the window and the messages to send."""

    identity: Identity
    key: SessionKey
    agent: ResolvedAgent
    strategy: Strategy
    # the strategy's load spec under the agent's config (the session cache's slot)
    spec: LoadSpec
    model: str
    context_window: int
    snapshot: SessionSnapshot
    sync: sync_plan.SyncPlan
    system_prompt: list[dict[str, Any]] | None
    system_tokens: int
    system_changed: bool
    new_messages: list[StoredMessage]
    context: WindowContext
    window: Window
    messages: list[dict[str, Any]]
    extra_tokens: int = 0
    # window.modified, computed once (it looks at every item)
    modified: bool = False
    # the current turn's media blocks were settled on the window's items (settle_window)
    settled: bool = False
    # the records written by persist_turn, with their assigned seqs
    appended: list[StoredMessage] = field(default_factory=list)
    # the bytes of the new records' media parts, stored with the turn
    blobs: dict[str, parts.PartBlob] = field(default_factory=dict)
    # the window as stored on the reply's record (proxy/turn/prompt_cache.py), with where and
    # why its prefix differs from the previous request's
    window_meta: dict[str, Any] = field(default_factory=dict)
    # the tool definitions as sent upstream (the summarizer may send them again)
    tools: Any = None
    started: float = field(default_factory=time.monotonic)

    @property
    def headers(self) -> dict[str, str]:
        return {
            "x-memory-agent": self.identity.agent,
            "x-memory-session": self.identity.session,
            "x-memory-strategy": self.agent.config.kind,
            "x-memory-window-tokens": str(self.window.tokens),
            "x-memory-context-modified": "true" if self.modified else "false",
            "x-memory-prefix-change": prompt_cache.change_header(
                self.window_meta.get("changes", ())
            ),
        }


def current_turn_start(messages: list[StoredMessage]) -> int:
    for index in range(len(messages) - 1, -1, -1):
        if messages[index].role == "user":
            return index
    return 0


def new_record(
    message: Mapping[str, Any],
    fp: str,
    model: str,
    now: float,
    blobs: dict[str, parts.PartBlob] | None = None,
) -> StoredMessage:
    """The record to store; media parts become references (their bytes go to ``blobs``)
    and ``tokens`` is the message's size with media as placeholders (see strategies/media)."""
    role = message["role"]
    content, meta = parts.extract_parts(message, blobs if blobs is not None else {})
    record = StoredMessage(
        role=role,
        content=content,
        fingerprint=fp,
        tool_calls=message.get("tool_calls") or None,
        tool_call_id=message.get("tool_call_id"),
        name=message.get("name"),
        created_at=now,
        meta=meta,
    )
    record.tokens = media.stored_tokens(record, model)
    return record


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
    """``Store.load`` through the process's session cache: when the session is unchanged
    since this process last held it, only its head is read; when it only grew (turns
    served by another worker or replica), only the messages appended since.

    A resent history (a full-history client's, ``resent``) is matched against the stored
    log: by the store, with the chains of every message (``probe``), or here, against a
    cached page that holds every active message, mostly without fingerprinting what the
    client resends unchanged."""
    cache = services.sessions
    store = services.store
    try:
        known = cache.known(key, spec)
        if resent is not None and known is not None and cache.holds_all(key, spec):
            snapshot = await store.load(
                key, spec, known_version=known.version, known_head=known.head_seq
            )
            if cache.fill(key, spec, snapshot, known) and (
                len(snapshot.messages) == snapshot.meta.active_count
            ):
                snapshot.matched, snapshot.matched_seq = history_sync.match_page(
                    resent, snapshot.messages
                )
                return snapshot
            known = None  # grown past the page meanwhile (rare): the store matches
        probe = resent.probe() if resent is not None else []
        version, head = (known.version, known.head_seq) if known else (None, None)
        snapshot = await store.load(key, spec, probe=probe, known_version=version, known_head=head)
        if not cache.fill(key, spec, snapshot, known):
            snapshot = await store.load(key, spec, probe=probe)
            cache.fill(key, spec, snapshot)
    except StoreUnavailable as exc:
        raise StoreUnavailableError(f"memory store unavailable: {exc}") from exc
    return snapshot


async def read_before(
    services: Services, key: SessionKey, snapshot: SessionSnapshot, count: int
) -> list[StoredMessage]:
    """The active messages just before the loaded page, enough to find where a request of
    ``count`` messages meets the stored log (``sync_plan.needs_earlier``)."""
    first = snapshot.messages[0].seq if snapshot.messages else snapshot.meta.head_seq + 1
    if first <= 1:
        return []
    low = max(1, first - sync_plan.earlier_span(count))
    try:
        return await services.store.get_range(key, low, first - 1)
    except StoreUnavailable as exc:
        raise StoreUnavailableError(f"memory store unavailable: {exc}") from exc


async def wait_for_compaction(services: Services, key: SessionKey) -> None:
    """A turn that arrives while this process compacts its session waits (bounded),
    then goes ahead with whatever is stored: the strategy keeps the window safe."""
    event = services.compactions.get(key)
    if event is not None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), services.settings.compaction_wait_seconds)


def resolve_agent(services: Services, agent_name: str) -> ResolvedAgent:
    return services.agents.resolve(agent_name, services.overrides.get(agent_name))


async def prepare_turn(
    services: Services,
    *,
    identity: Identity,
    body: dict[str, Any],
    system: list[dict[str, Any]],
    conversation: list[dict[str, Any]],
    history_header: str | None,
    retry: sync_plan.RetryHint | None = None,
    api: str = "chat",
) -> Turn:
    """``api``: the API the window is rendered for (``MappingContext.api``)."""
    key = SessionKey(identity.namespace, identity.agent, identity.session)
    await wait_for_compaction(services, key)
    agent = resolve_agent(services, identity.agent)
    model = str(body.get("model") or agent.definition.llm.model or "")
    mode = sync_plan.detect_mode(
        conversation,
        agent_mode=agent.definition.historyMode,
        header=history_header,
        fingerprinted=identity.source == "fingerprint",
    )
    resends = mode != "delta"
    fingerprints = history_sync.Fingerprints(
        conversation, history_sync.RESENT if resends else None
    )
    # a session this process did not hold has not had its texts counted here
    held = services.sessions.known(key, get_strategy(agent.config.kind).load_spec(agent.config))
    agent, strategy, spec, snapshot = await load_snapshot(
        services, key, agent, fingerprints if resends else None, model
    )
    if not snapshot.exists:
        await limits.check_new_session(services.settings, services.store, key.namespace)

    sync = sync_plan.plan_sync(mode, fingerprints, snapshot, retry)
    if sync_plan.needs_earlier(fingerprints, snapshot, sync):
        earlier = await read_before(services, key, snapshot, len(conversation))
        sync = sync_plan.plan_sync(
            mode, fingerprints, snapshot, retry, [*earlier, *snapshot.messages]
        )
    stored = snapshot.messages
    if sync.rewind:
        stored = [m for m in stored if m.seq <= sync.keep_through]
        if sync.keep_through and (not stored or stored[-1].seq < sync.keep_through):
            # rewound to before the loaded page: fetch the kept tail (rare)
            earlier = await services.store.get_range(
                key, max(1, sync.keep_through - 2 * spec.limit), sync.keep_through
            )
            stored = earlier[-spec.limit :]
    if not sync.new or conversation[sync.new[0]].get("role") != "user":
        stored = await with_current_turn(services, key, snapshot, stored)
    if any(conversation[i].get("role") == "tool" for i in sync.new):
        known_calls = {c["id"] for m in stored for c in (m.tool_calls or ())}
        sync_plan.check_tool_results(conversation, sync.new, known_calls)

    now = time.time()
    blobs: dict[str, parts.PartBlob] = {}
    # a large input (a long text to tokenize, media to decode and hash) is read on a
    # thread: the event loop serves every other request meanwhile
    heavy = requests.is_large([conversation[i] for i in sync.new]) or (
        held is None and any(m.tokens >= LARGE_TOKENS for m in stored)
    )

    def records() -> list[StoredMessage]:
        incoming = tool_caps.capped_messages(conversation, sync.new, agent, stored)
        return [
            new_record(message, fingerprints[i], model, now, blobs)
            for i, message in zip(sync.new, incoming, strict=True)
        ]

    new_messages = await asyncio.to_thread(records) if heavy else records()
    provisional = (snapshot.meta.head_seq or 0) + 1
    for offset, message in enumerate(new_messages):
        message.seq = provisional + offset

    meta = snapshot.meta
    if system:
        system_prompt: list[dict[str, Any]] | None = system
        system_changed = system != meta.system_prompt
        system_tokens = (
            sum(count_message(m, model) for m in system) if system_changed else meta.system_tokens
        )
    else:
        system_prompt, system_changed, system_tokens = meta.system_prompt, False, meta.system_tokens

    extra_tokens = tools_tokens(body, model)
    messages = [*stored, *new_messages]
    context_window = agent.context_window(model, services.settings.default_context_window)
    start = current_turn_start(messages)
    mapping = MappingContext(
        model=model,
        capabilities=agent.capabilities(model),
        current_turn_seq=messages[start].seq if messages else 0,
        api=api,
    )
    # media blocks of the current turn: new parts stored, shown ones loaded, their extra
    # tokens budgeted before the strategy selects
    await parts.load_media(services, key, messages[start:], mapping, blobs)
    media_tokens = media.current_turn_deltas(messages[start:], mapping, model)
    context = WindowContext(
        config=agent.config,
        context_window=context_window,
        messages=messages,
        summaries=snapshot.summaries,
        system_tokens=system_tokens + extra_tokens + sum(media_tokens.values()),
        current_turn_start=start,
        count_tokens=cached_counter(model),
        calibration=meta.calibration or 1.0,
        # this process's own decision for its last turn on the session, if it has it and
        # the session only grew since: the strategy may extend that window (its checks
        # say whether it can)
        previous=services.sessions.decision(key, spec, meta.version),
    )
    # pure, and cheap once the input is counted; the first cut of a large text (a list of
    # parts, counted joined) may still tokenize it
    window = await asyncio.to_thread(strategy.select, context) if heavy else strategy.select(
        context
    )
    context.previous = None  # used: a kept context must not hold every turn before it
    media.settle_window(window, media_tokens)
    # stored messages the page did not load are left out too (fallen off, compacted)
    window.trimmed += max(0, meta.active_count - len(snapshot.messages))
    rendered = services.mapper.map(window, system_prompt, mapping)
    window_meta = prompt_cache.window_meta(
        window, prompt_cache.system_hash(system_prompt, body.get("tools"))
    )
    window_meta["changes"] = prompt_cache.prefix_changes(
        prompt_cache.previous_window(messages),
        window_meta,
        window,
        rewound_after=sync.keep_through if sync.rewind else None,
        earlier=bool(meta.head_seq),
    )
    return Turn(
        identity=identity,
        key=key,
        agent=agent,
        strategy=strategy,
        spec=spec,
        model=model,
        context_window=context_window,
        snapshot=snapshot,
        sync=sync,
        system_prompt=system_prompt,
        system_tokens=system_tokens,
        system_changed=system_changed,
        new_messages=new_messages,
        context=context,
        window=window,
        messages=rendered,
        extra_tokens=extra_tokens,
        modified=window.modified,
        settled=bool(media_tokens),
        blobs=blobs,
        window_meta=window_meta,
    )


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


async def with_current_turn(
    services: Services, key: SessionKey, snapshot: SessionSnapshot, stored: list[StoredMessage]
) -> list[StoredMessage]:
    """The current turn is always sent whole: when a small page (windowed, full's
    maxHistoryFetch) stopped inside a long tool loop, load the turn from its user message."""
    start = snapshot.meta.last_user_seq
    if not start or (stored and stored[0].seq <= start):
        return stored
    try:
        turn = await services.store.load(key, LoadSpec(limit=TURN_LOAD_LIMIT, since="turn"))
    except StoreUnavailable as exc:
        raise StoreUnavailableError(f"memory store unavailable: {exc}") from exc
    first = stored[0].seq if stored else None
    return [m for m in turn.messages if first is None or m.seq < first] + stored


# tool definitions' tokens by (hash of their JSON, model): at most TOOLS_CACHE_SIZE keys
# of a hash and a model id of at most MAX_KEY_CHARS characters
TOOLS_CACHE_SIZE = 1024
_tools_cache: dict[tuple[int, str], int] = {}


def tools_tokens(body: dict[str, Any], model: str) -> int:
    """Tokens of the request's tool definitions (they share the context window); cached,
    since agents send the same tools every turn."""
    tools = body.get("tools")
    if not tools:
        return 0
    try:
        # orjson, not repr(): 25 against 210 microseconds for 30 tool definitions
        raw = orjson.dumps(tools)
    except orjson.JSONEncodeError:
        return 0
    if len(model) > MAX_KEY_CHARS:  # not remembered: the cache's keys stay small
        return count_text(raw.decode(), model)
    key = (hash(raw), model)
    cached = _tools_cache.get(key)
    if cached is None:
        cached = count_text(raw.decode(), model)
        if len(_tools_cache) >= TOOLS_CACHE_SIZE:
            _tools_cache.clear()
        _tools_cache[key] = cached
    return cached
