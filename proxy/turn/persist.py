"""After the reply: the turn's new messages and the reply stored in one atomic write, with
the session's token-estimate calibration and the prompt-cache figures on the reply."""

from __future__ import annotations

import time
from typing import Any

from proxy.services import Services
from proxy.turn import history_sync, parts, prompt_cache
from proxy.turn.state import Turn
from strategies.records import AppendResult, StoredMessage, TurnWrite
from strategies.tokens import count_message

CALIBRATION_BOUNDS = (0.5, 3.0)
CALIBRATION_WEIGHT = 0.3
# a prompt at least this large (estimated) corrects an underestimate at once
CALIBRATION_TRUSTED_TOKENS = 500


def calibrated(previous: float, estimate: int, reported: int | None) -> float | None:
    """The session's estimate factor after the upstream reported a real prompt size.

    An estimate of a sizable prompt found too low is corrected at once (an underestimate
    is what overflows the real window); otherwise the ratio is blended in by
    ``CALIBRATION_WEIGHT``: a small prompt's ratio says more about the provider's fixed
    tokens per request than about its tokenizer."""
    if not reported or estimate <= 0:
        return None
    low, high = CALIBRATION_BOUNDS
    ratio = min(high, max(low, reported / estimate))
    previous = previous or 1.0
    if ratio > previous and estimate >= CALIBRATION_TRUSTED_TOKENS:
        return round(ratio, 4)
    return round((1 - CALIBRATION_WEIGHT) * previous + CALIBRATION_WEIGHT * ratio, 4)


def reply_meta(turn: Turn, usage: dict[str, Any] | None = None) -> dict[str, Any]:
    assert turn.sync is not None
    meta: dict[str, Any] = {"model": turn.model} if turn.model else {}
    if turn.sync.idempotency_key:
        meta["idempotency_key"] = turn.sync.idempotency_key
    if turn.window_meta:
        meta[prompt_cache.WINDOW_META] = turn.window_meta
    cache = prompt_cache.cache_usage(usage)
    if cache is not None:
        meta[prompt_cache.CACHE_META] = cache
    for name, extra in turn.request.reply_meta.items():
        # a callable is given the reply's usage (the Responses surface keeps it its way)
        meta[name] = extra(usage) if callable(extra) else extra
    return meta


async def persist_turn(
    services: Services,
    turn: Turn,
    reply: dict[str, Any] | None,
    *,
    usage: dict[str, Any] | None,
) -> AppendResult:
    """Store the turn's new messages and the reply in one atomic write."""
    assert turn.window is not None and turn.sync is not None and turn.snapshot is not None
    assert turn.spec is not None
    records = list(turn.new_messages)
    stubs = dict(turn.window.new_stubs)
    for record in records:
        # a stub decided for a message of this turn rides on its record: the seq it was
        # decided under is provisional (another turn may have appended first)
        record.compressed_content = stubs.pop(record.seq, record.compressed_content)
        record.seq = 0
    if reply is not None:
        completion = (usage or {}).get("completion_tokens")
        if isinstance(completion, int) and completion > 0 and not reply.get("tool_calls"):
            tokens = completion + 3  # the upstream's own count: no need to tokenize
        else:
            tokens = count_message(reply, turn.model)
        records.append(
            StoredMessage(
                role="assistant",
                content=reply.get("content"),
                tokens=tokens,
                fingerprint=history_sync.fingerprint(reply),
                tool_calls=reply.get("tool_calls") or None,
                created_at=time.time(),
                meta=reply_meta(turn, usage),
            )
        )
    prompt_tokens = (usage or {}).get("prompt_tokens")
    write = TurnWrite(
        messages=records,
        supersede_after=turn.sync.keep_through if turn.sync.rewind else None,
        supersede_until=turn.sync.supersede_until if turn.sync.rewind else None,
        system_prompt=turn.system_prompt if turn.system_changed else None,
        system_tokens=turn.system_tokens if turn.system_changed else None,
        model=turn.model or None,
        calibration=calibrated(
            turn.snapshot.meta.calibration,
            turn.window.tokens,
            prompt_tokens if isinstance(prompt_tokens, int) else None,
        ),
        compressed=stubs or None,
        response_id=turn.request.response_id if reply is not None else None,
    )
    await parts.store_parts(services, turn.key, turn.blobs)
    result = await services.store.append_turn(turn.key, write)
    for record, seq in zip(records, result.seqs, strict=False):
        record.seq = seq
    turn.appended = records
    return result
