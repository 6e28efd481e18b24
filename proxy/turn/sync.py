"""The sync step: where the request meets the stored log (proxy/turn/sync_plan.py), the
stored records the turn keeps and the new ones it adds, and the system prompt.

Reads the store only when the request reaches before the loaded page (``read_before``),
rewinds before it, or continues a turn the page cut (``with_current_turn``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from proxy.http import requests
from proxy.services import Services
from proxy.turn import history_sync, parts, sync_plan, tool_caps
from proxy.turn.state import Turn
from strategies import media
from strategies.records import LoadSpec, SessionKey, SessionSnapshot, StoredMessage
from strategies.tokens import count_message

# a stored message this large, loaded by a process that never counted it, is cut (counted
# again) by the strategy on a thread
LARGE_TOKENS = 64_000
# bound on the messages of one turn loaded to keep it whole (a runaway tool loop)
TURN_LOAD_LIMIT = 2000


@dataclass(frozen=True, slots=True)
class Incoming:
    """The request's conversation, fingerprinted, and how the client sends it
    (``mode``: "delta" for the new messages only, else a resent history)."""

    mode: sync_plan.SyncMode
    fingerprints: history_sync.Fingerprints

    @property
    def resent(self) -> history_sync.Fingerprints | None:
        return self.fingerprints if self.mode != "delta" else None


def incoming(turn: Turn) -> Incoming:
    conversation = turn.request.conversation
    mode = sync_plan.detect_mode(
        conversation,
        agent_mode=turn.agent.definition.historyMode,
        header=turn.request.history_header,
        fingerprinted=turn.identity.source == "fingerprint",
    )
    resends = mode != "delta"
    return Incoming(
        mode,
        history_sync.Fingerprints(conversation, history_sync.RESENT if resends else None),
    )


async def sync(services: Services, turn: Turn, history: Incoming) -> None:
    """Plan the sync, keep the stored records it keeps and make the new ones."""
    assert turn.snapshot is not None and turn.spec is not None
    conversation = turn.request.conversation
    mode, fingerprints = history.mode, history.fingerprints
    snapshot = turn.snapshot
    plan = sync_plan.plan_sync(mode, fingerprints, snapshot, turn.request.retry)
    if sync_plan.needs_earlier(fingerprints, snapshot, plan):
        earlier = await read_before(services, turn.key, snapshot, len(conversation))
        plan = sync_plan.plan_sync(
            mode, fingerprints, snapshot, turn.request.retry, [*earlier, *snapshot.messages]
        )
    if turn.request.branch_at is not None and turn.request.branch_at < snapshot.meta.head_seq:
        plan = sync_plan.branch(
            plan, turn.request.branch_at, snapshot.meta.head_seq, len(conversation)
        )
    stored = snapshot.messages
    if plan.rewind:
        stored = [m for m in stored if m.seq <= plan.keep_through]
        if plan.keep_through and (not stored or stored[-1].seq < plan.keep_through):
            # rewound to before the loaded page: fetch the kept tail (rare)
            limit = turn.spec.limit
            earlier = await services.store.get_range(
                turn.key, max(1, plan.keep_through - 2 * limit), plan.keep_through
            )
            stored = earlier[-limit:]
    if not plan.new or conversation[plan.new[0]].get("role") != "user":
        stored = await with_current_turn(services, turn.key, snapshot, stored)
    if any(conversation[i].get("role") == "tool" for i in plan.new):
        known_calls = {c["id"] for m in stored for c in (m.tool_calls or ())}
        sync_plan.check_tool_results(conversation, plan.new, known_calls)
    turn.sync, turn.stored = plan, stored

    # a large input (a long text to tokenize, media to decode and hash) is read on a
    # thread: the event loop serves every other request meanwhile
    turn.heavy = requests.is_large([conversation[i] for i in plan.new]) or (
        max([m.tokens for m in stored], default=0) >= LARGE_TOKENS
    )
    now = time.time()

    def records() -> list[StoredMessage]:
        incoming = tool_caps.capped_messages(conversation, plan.new, turn.agent, stored)
        return [
            new_record(message, fingerprints[i], turn.model, now, turn.blobs)
            for i, message in zip(plan.new, incoming, strict=True)
        ]

    turn.new_messages = await asyncio.to_thread(records) if turn.heavy else records()
    provisional = (snapshot.meta.head_seq or 0) + 1
    for offset, message in enumerate(turn.new_messages):
        message.seq = provisional + offset
    sync_system(turn)


def sync_system(turn: Turn) -> None:
    """The request's system prompt, or the stored one when it sent none."""
    assert turn.snapshot is not None
    meta = turn.snapshot.meta
    system = turn.request.system
    if system:
        turn.system_prompt = system
        turn.system_changed = system != meta.system_prompt
        turn.system_tokens = (
            sum(count_message(m, turn.model) for m in system)
            if turn.system_changed
            else meta.system_tokens
        )
    else:
        turn.system_prompt, turn.system_changed = meta.system_prompt, False
        turn.system_tokens = meta.system_tokens


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


async def read_before(
    services: Services, key: SessionKey, snapshot: SessionSnapshot, count: int
) -> list[StoredMessage]:
    """The active messages just before the loaded page, enough to find where a request of
    ``count`` messages meets the stored log (``sync_plan.needs_earlier``)."""
    first = snapshot.messages[0].seq if snapshot.messages else snapshot.meta.head_seq + 1
    if first <= 1:
        return []
    low = max(1, first - sync_plan.earlier_span(count))
    return await services.store.get_range(key, low, first - 1)


async def with_current_turn(
    services: Services, key: SessionKey, snapshot: SessionSnapshot, stored: list[StoredMessage]
) -> list[StoredMessage]:
    """The current turn is always sent whole: when a small page (windowed, full's
    maxHistoryFetch) stopped inside a long tool loop, load the turn from its user message."""
    start = snapshot.meta.last_user_seq
    if not start or (stored and stored[0].seq <= start):
        return stored
    turn = await services.store.load(key, LoadSpec(limit=TURN_LOAD_LIMIT, since="turn"))
    first = stored[0].seq if stored else None
    return [m for m in turn.messages if first is None or m.seq < first] + stored
