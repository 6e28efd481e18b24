"""After a response: ask the strategy whether to summarize or compact, and do it in the
background. Nothing here can fail or delay the request that triggered it."""

from __future__ import annotations

import asyncio
import dataclasses
import logging

from proxy.background import summary_prefix
from proxy.background.summarizer import SummarizerBusy, SummarizerError, run_plan
from proxy.services import Services
from proxy.turn.load import current_turn_start
from proxy.turn.state import Turn
from storage.base import StoreUnavailable
from strategies.base import SummarizePlan
from strategies.records import AppendResult, with_stubs

logger = logging.getLogger("memory_proxy.after_turn")


def live_tokens(turn: Turn, calibration: float) -> int:
    """The live window after this turn: what was sent plus the reply, calibrated."""
    assert turn.window is not None
    reply = sum(r.tokens for r in turn.appended if r.role == "assistant")
    return round((turn.window.tokens + reply) * calibration)


def schedule_after_turn(
    services: Services, turn: Turn, result: AppendResult, headers: dict[str, str],
    *, messages_api: bool = False,
) -> SummarizePlan | None:
    """``messages_api``: the turn went to the Messages upstream (so do its summaries)."""
    services.remember_credentials(turn.key, headers, messages_api=messages_api)
    assert turn.strategy is not None and turn.window is not None
    assert turn.context is not None and turn.snapshot is not None
    if not turn.strategy.plans_after_turn(turn.agent.config):
        return None
    stubs = turn.window.new_stubs
    # the session as stored now: with this turn's messages and its compression stubs. The
    # loaded messages come first in the context, in seq order, and every appended seq is
    # above them (the store appends at its head)
    loaded = turn.context.messages[: len(turn.context.messages) - len(turn.new_messages)]
    messages = [*with_stubs(loaded, stubs), *turn.appended]
    calibration = result.meta.calibration or turn.context.calibration
    context = dataclasses.replace(
        turn.context,
        messages=messages,
        current_turn_start=current_turn_start(messages),
        calibration=calibration,
    )
    plan = turn.strategy.after_turn(context, live_tokens(turn, calibration))
    if plan is None:
        return None
    event = None
    if plan.kind == "compaction" and turn.key not in services.compactions:
        # registered now, not when the task starts: a turn that arrives right after this
        # response finds it and waits (turns.wait_for_compaction)
        event = services.compactions[turn.key] = asyncio.Event()
    # the boundary this turn loaded: if another replica compacted since, the plan is stale
    boundary = turn.snapshot.meta.boundary_seq
    services.spawn(
        summarize_in_background(services, turn, plan, headers, boundary, event),
        name=f"after-turn:{turn.key.session}",
    )
    return plan


async def summarize_in_background(
    services: Services,
    turn: Turn,
    plan: SummarizePlan,
    headers: dict[str, str],
    boundary: int,
    event: asyncio.Event | None = None,
) -> None:
    try:
        await _summarize(services, turn, plan, headers, boundary)
    finally:
        if event is not None:
            if services.compactions.get(turn.key) is event:
                del services.compactions[turn.key]
            event.set()


async def _summarize(
    services: Services, turn: Turn, plan: SummarizePlan, headers: dict[str, str], boundary: int
) -> None:
    calibration = turn.context.calibration if turn.context is not None else 1.0
    try:
        record = await run_plan(
            services,
            turn.key,
            turn.agent,
            turn.model,
            plan,
            headers=headers,
            context_window=turn.context_window,
            expect_boundary=boundary if plan.kind == "compaction" else None,
            prefix=summary_prefix.from_turn(turn, calibration)
            if services.settings.summarizer_cached_prefix
            else None,
        )
    except SummarizerBusy:
        logger.info("%s: compaction already running elsewhere", turn.key.session)
        return
    except (SummarizerError, StoreUnavailable) as exc:
        # the next turn's window stays valid without it (the strategy trims safely)
        logger.warning("%s: %s %s failed: %s", turn.key.session, plan.kind, plan.reason, exc)
        return
    if record is None:
        logger.info("%s: boundary moved; %s skipped", turn.key.session, plan.kind)
    else:
        logger.info(
            "%s: %s of messages %d-%d stored (%d tokens)",
            turn.key.session, plan.kind, record.from_seq, record.to_seq, record.tokens,
        )
