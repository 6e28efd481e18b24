"""Running a strategy's SummarizePlan: summarizer calls (in chunks when the plan does not
fit one call's input), one summary record.

Called after a response (never on the request path) and by the Compact action. A
per-session lock shared through the store makes one replica do the work; the write is a
compare-and-set on the compaction boundary, so one overflow is compacted exactly once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections import OrderedDict, deque
from typing import Any

import orjson

from proxy import metrics
from proxy.agents import ResolvedAgent
from proxy.background.summary_prefix import CachedPrefix, prefix_body
from proxy.errors import ProxyError
from proxy.services import Services
from proxy.turn import cache_hints
from proxy.upstreams.base import UpstreamRequest
from storage.base import Store, StoreUnavailable
from strategies.base import SummarizePlan
from strategies.records import LoadSpec, SessionKey, SummaryRecord
from strategies.summarizing_window import latest_summary
from strategies.summary_prompt import (
    build_summary_messages,
    chunk_end,
    sanitize_summary,
    transcript_budget,
)
from strategies.tokens import count_text, make_counter

logger = logging.getLogger("memory_proxy.summarizer")

LOCK_NAME = "compact"
LOCK_TTL = 180.0
# the summarizer's own input is held to this share of the model's context window
INPUT_SHARE = 0.6
SUMMARY_MAX_TOKENS = 4096
# a summary joins every later request: it may take this share of a small context window
SUMMARY_WINDOW_SHARE = 0.15
SUMMARY_MIN_TOKENS = 256
# one summary reads at most this many stored messages; a longer unsummarized stretch is
# summarized over several turns, each record building on the one before
MAX_PLAN_MESSAGES = 1000


class SummarizerBusy(Exception):
    """Another worker holds the session's compaction lock."""


class SummarizerError(Exception):
    """The summarizer call failed or returned nothing usable."""


class CallBudget:
    """Summarizer calls allowed per session per hour (bounds cost and any runaway loop)."""

    def __init__(self, per_hour: int) -> None:
        self.per_hour = per_hour
        self.calls: OrderedDict[SessionKey, deque[float]] = OrderedDict()

    def take(self, key: SessionKey) -> bool:
        now = time.monotonic()
        window = self.calls.setdefault(key, deque())
        self.calls.move_to_end(key)
        while window and now - window[0] > 3600:
            window.popleft()
        if len(window) >= self.per_hour:
            return False
        window.append(now)
        if len(self.calls) > 10_000:
            self.calls.popitem(last=False)
        return True


def summary_text(body: bytes) -> str:
    try:
        data = orjson.loads(body)
        content = data["choices"][0]["message"]["content"]
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError) as exc:
        raise SummarizerError("summarizer reply has no message content") from exc
    if isinstance(content, list):
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    text = sanitize_summary(content or "").strip()
    if not text:
        raise SummarizerError("summarizer returned an empty summary")
    return text


def summary_max_tokens(context_window: int) -> int:
    """The summary's output cap: 4,096 tokens, less for a small context window."""
    share = int(context_window * SUMMARY_WINDOW_SHARE)
    return min(SUMMARY_MAX_TOKENS, max(SUMMARY_MIN_TOKENS, share))


async def current_summary_plan(
    store: Store, key: SessionKey, plan: SummarizePlan
) -> SummarizePlan | None:
    """A summary plan re-read under the lock, or None when nothing is left to summarize.

    It builds on the latest stored summary (another run may have written one since it was
    planned), so no range is summarized twice; and its messages are every active message
    after that summary up to ``plan.to_seq``, read from the store: a page shorter than
    the history (maxHistoryFetch) must not let a record cover messages the summarizer
    never saw. A stretch longer than MAX_PLAN_MESSAGES is cut before its last user
    message: the record ends on a turn boundary and the next plan goes on from there.
    """
    previous = plan.previous
    stored = latest_summary((await store.load(key, LoadSpec(limit=0))).summaries)
    if stored is not None and stored.to_seq > (previous.to_seq if previous else 0):
        previous = stored
    low = previous.to_seq + 1 if previous else 1
    if low > plan.to_seq:
        return None
    high = min(plan.to_seq, low + MAX_PLAN_MESSAGES - 1)
    messages = await store.get_range(key, low, high)
    if high < plan.to_seq:
        cut = max((i for i, m in enumerate(messages) if m.role == "user"), default=0)
        messages = messages[:cut] or messages
    if not messages:
        return None
    return dataclasses.replace(
        plan,
        previous=previous,
        messages=messages,
        from_seq=previous.from_seq if previous else messages[0].seq,
        to_seq=messages[-1].seq,
    )


async def current_plan(
    store: Store, key: SessionKey, plan: SummarizePlan, expect_boundary: int
) -> SummarizePlan | None:
    """The plan re-read under the lock: None when another worker compacted meanwhile (the
    boundary moved), so one overflow costs one summarizer call; else the plan with its
    messages as stored now (a turn that landed inside its range concurrently is covered)."""
    snapshot = await store.load(key, LoadSpec(limit=1, since="boundary"))
    if snapshot.meta.boundary_seq != expect_boundary:
        return None
    messages = await store.get_range(key, plan.from_seq, plan.to_seq)
    if not messages:
        return None
    return dataclasses.replace(plan, messages=messages)


async def summarize_on_prefix(
    services: Services,
    key: SessionKey,
    agent: ResolvedAgent,
    plan: SummarizePlan,
    summarizer_model: str,
    prefix: CachedPrefix,
    *,
    headers: dict[str, str],
    context_window: int,
) -> str | None:
    """The summary of ``plan`` from one call on the session's cached prefix
    (proxy/background/summary_prefix.py); None when the plan does not line up with it."""
    body = prefix_body(
        prefix, plan, model=summarizer_model,
        placement_hint=getattr(agent.config, "summaryPlacement", None),
        max_tokens=summary_max_tokens(context_window), context_window=context_window,
    )
    if body is None:
        return None
    if not services.summarizer_budget.take(key):
        raise SummarizerError("summarizer call budget for this session is spent for now")
    cache_hints.for_session(body, key, services.settings)
    try:
        response = await services.summary_upstream(key).chat(UpstreamRequest(body, headers))
    except ProxyError as exc:
        raise SummarizerError(f"summarizer call failed: {exc.message}") from exc
    return summary_text(response.body)


async def summarize_chunks(
    services: Services,
    key: SessionKey,
    agent: ResolvedAgent,
    plan: SummarizePlan,
    summarizer_model: str,
    *,
    headers: dict[str, str],
    context_window: int,
) -> tuple[str, SummarizePlan]:
    """The summary of every message of ``plan``, and the plan it covers.

    The summarizer's input is held to INPUT_SHARE of the context window, which a plan may
    not fit in (a compaction triggers above it): its messages are then summarized in
    chunks, each call building on the summary the one before wrote, so every message
    reaches a call whole (up to the per-item cap). Each call takes one from the session's
    call budget; when it runs out, or a call fails, after the first, the plan is cut to
    what the calls before read (the rest stays unsummarized, for a later run)."""
    count = make_counter(summarizer_model)
    max_input = int(context_window * INPUT_SHARE)
    placement = getattr(agent.config, "summaryPlacement", None)
    messages = plan.messages
    running, text, start = plan.previous, "", 0
    while start < len(messages):
        if not services.summarizer_budget.take(key):
            if not start:
                raise SummarizerError("summarizer call budget for this session is spent for now")
            logger.info("%s: call budget spent after %d of %d messages", key.session,
                        start, len(messages))
            break
        rest = dataclasses.replace(plan, previous=running, messages=messages[start:])
        budget = transcript_budget(
            rest, placement_hint=placement, count_tokens=count, max_input_tokens=max_input
        )
        end = chunk_end(messages, start, budget, count)
        chunk = dataclasses.replace(
            rest, messages=messages[start:end], to_seq=messages[end - 1].seq
        )
        body: dict[str, Any] = {
            "model": summarizer_model,
            "messages": build_summary_messages(
                chunk, placement_hint=placement, count_tokens=count, max_input_tokens=max_input
            ),
            "temperature": 0,
            "max_tokens": summary_max_tokens(context_window),
        }
        cache_hints.for_session(body, key, services.settings)
        try:
            try:
                response = await services.summary_upstream(key).chat(UpstreamRequest(body, headers))
            except ProxyError as exc:
                raise SummarizerError(f"summarizer call failed: {exc.message}") from exc
            text = summary_text(response.body)
        except SummarizerError as exc:
            if not start:
                raise
            # the calls before read their chunks: their summary is kept
            logger.warning("%s: chunk from message %d failed (%s); keeping what was read",
                           key.session, messages[start].seq, exc)
            break
        # what the next call builds on: the summary so far, from the plan's start
        running = SummaryRecord(
            kind=plan.kind, text=text, from_seq=plan.from_seq, to_seq=chunk.to_seq
        )
        start = end
    if start < len(messages):
        plan = dataclasses.replace(plan, messages=messages[:start], to_seq=messages[start - 1].seq)
    return text, plan


async def run_plan(
    services: Services,
    key: SessionKey,
    agent: ResolvedAgent,
    model: str,
    plan: SummarizePlan,
    *,
    headers: dict[str, str],
    context_window: int,
    expect_boundary: int | None,
    prefix: CachedPrefix | None = None,
) -> SummaryRecord | None:
    """Summarize ``plan`` and store the record. Returns None when another replica got
    there first (boundary moved, or a newer summary already covers the plan). With
    ``prefix`` (the turn's request) the call reuses the session's cached prefix when the
    plan lines up with it (proxy/background/summary_prefix.py)."""
    store = services.store
    token = await store.acquire_lock(key, LOCK_NAME, LOCK_TTL)
    if token is None:
        raise SummarizerBusy(f"{key.session}: a compaction is already running")
    # turns wait for a compaction, since their window restarts from it; a summary of
    # summarizing_window never holds a turn back (trimming keeps its window safe)
    events = services.compactions
    done = events.setdefault(key, asyncio.Event()) if plan.kind == "compaction" else None
    try:
        if expect_boundary is not None:
            current = await current_plan(store, key, plan, expect_boundary)
        elif plan.kind == "summary":
            current = await current_summary_plan(store, key, plan)
        else:
            current = plan
        if current is None:
            return None
        plan = current
        summarizer_model = agent.summarizer_model(model)
        text = await summarize_on_prefix(
            services, key, agent, plan, summarizer_model, prefix,
            headers=headers, context_window=context_window,
        ) if prefix is not None else None
        if text is None:
            text, plan = await summarize_chunks(
                services, key, agent, plan, summarizer_model,
                headers=headers, context_window=context_window,
            )
        record = SummaryRecord(
            kind=plan.kind,
            text=text,
            from_seq=plan.from_seq,
            to_seq=plan.to_seq,
            tokens=count_text(text, model),
            model=summarizer_model,
            created_at=time.time(),
        )
        written = await store.add_summary(key, record, expect_boundary=expect_boundary)
        if written is not None:
            metrics.inc("memory_proxy_summaries_total", kind=written.kind)
        return written
    finally:
        if done is not None:
            done.set()
            events.pop(key, None)
        try:
            await store.release_lock(key, LOCK_NAME, token)
        except StoreUnavailable:
            logger.warning("could not release the compaction lock of %s; it expires", key.session)
