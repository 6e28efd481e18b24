"""Paging a session's history until the window's budget is full (``LoadSpec.fill_ratio``).

``Store.load`` reads one page: the newest ``limit`` active messages. For a paged spec
(summarizing_window's ``maxHistoryFetch`` is its "page size when loading history") the
proxy then reads the pages before it with ``Store.get_range`` while the messages after
the latest summary hold less than ``fill_ratio`` x the context window (calibrated): the
pages that many more tokens need at the mean size of the messages held, in one range read
(a second only when those were smaller than the mean) with the rest of the budget
(``RangeBudget``: the store returns, and decodes, only the newest messages of the range
that hold it), and cuts a page that holds more than that at its start (never below one
page): what a turn loads and selects from follows the window's budget, not the length of
the history.

Sizes are the messages as stored: a message with a compression stub counts as its stub.
The system prompt is not subtracted from the budget: a page a little larger than the
window can hold is trimmed by the strategy, one too small would leave it part empty.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

from proxy.agents import ResolvedAgent
from proxy.services import Services
from strategies.base import CountTokens
from strategies.compression import stub_tokens
from strategies.records import (
    LoadSpec,
    RangeBudget,
    SessionKey,
    SessionSnapshot,
    StoredMessage,
)
from strategies.summarizing_window import latest_summary
from strategies.tokens import cached_counter


def held_tokens(message: StoredMessage, count_tokens: CountTokens) -> int:
    """A message's size in the window as stored (its stub, when it has one)."""
    stub = message.compressed_content
    return message.tokens if stub is None else stub_tokens(message, stub, count_tokens)


def _sizes(messages: Sequence[StoredMessage], count_tokens: CountTokens, floor: int) -> list[int]:
    """``held_tokens`` of each message, 0 for one a summary covers (``seq <= floor``):
    most are their stored ``tokens``, without a call per message."""
    return [
        0 if m.seq <= floor else m.tokens if m.compressed_content is None
        else held_tokens(m, count_tokens)
        for m in messages
    ]


def page_target(spec: LoadSpec, context_window: int, calibration: float) -> float:
    """The raw (uncalibrated) tokens of history a paged spec's window could hold."""
    return (spec.fill_ratio or 0.0) * context_window / (calibration or 1.0)


def _trimmed(
    messages: Sequence[StoredMessage], sizes: Sequence[int], held: int, target: float, limit: int
) -> int:
    """How many messages to cut from the start of a page that holds more than ``target``:
    the oldest, while the rest still hold ``target`` and at least ``limit`` messages."""
    cut = 0
    while len(messages) - cut > limit and held - sizes[cut] >= target:
        held -= sizes[cut]
        cut += 1
    return cut


async def fill_page(
    services: Services,
    key: SessionKey,
    spec: LoadSpec,
    snapshot: SessionSnapshot,
    *,
    context_window: int,
    count_tokens: CountTokens,
) -> None:
    """Grow (or cut) ``snapshot.messages`` to the window's budget, in place. Nothing for
    a spec that is not paged."""
    messages = snapshot.messages
    if spec.fill_ratio is None or spec.since != "all" or not messages or spec.limit <= 0:
        return
    summary = latest_summary(snapshot.summaries)
    floor = summary.to_seq if summary is not None else 0
    target = page_target(spec, context_window, snapshot.meta.calibration)
    # messages a summary covers are not sent: they hold nothing and go first in a cut
    sizes = _sizes(messages, count_tokens, floor)
    held = sum(sizes)
    first = messages[0].seq
    missing = snapshot.meta.active_count - len(messages)
    grown = False
    stub_size = functools.partial(held_tokens, count_tokens=count_tokens)
    while held < target and missing > 0 and first > floor + 1:
        # the pages the rest of the budget needs at the mean size of what is held, in one
        # range read (a turn read cold stays within three round trips), of which the store
        # returns (and decodes) the newest that hold the rest of the budget
        live = (len(sizes) - sizes.count(0)) or 1
        need = (target - held) / max(1.0, held / live)
        pages = max(1, math.ceil(need * 1.2 / spec.limit))
        low = max(floor + 1, first - pages * spec.limit)
        page = await services.store.get_range(
            key, low, first - 1, budget=RangeBudget(target - held, stub_size)
        )
        first = low
        missing -= len(page)
        messages = [*page, *messages]
        page_sizes = _sizes(page, count_tokens, floor)
        sizes = [*page_sizes, *sizes]
        held += sum(page_sizes)
        grown = True
    cut = _trimmed(messages, sizes, held, target, spec.limit)
    if cut:
        snapshot.messages = messages[cut:]
    elif grown:
        snapshot.messages = messages  # a list of its own already


async def fill_for(
    services: Services,
    key: SessionKey,
    agent: ResolvedAgent,
    spec: LoadSpec,
    snapshot: SessionSnapshot,
    model: str | None,
) -> None:
    """``fill_page`` for a turn of ``agent`` on ``model`` (the session's stored model when
    None)."""
    if spec.fill_ratio is None or not snapshot.exists:
        return
    if model is None:
        model = snapshot.meta.model or agent.definition.llm.model or ""
    await fill_page(
        services, key, spec, snapshot,
        context_window=agent.context_window(model, services.settings.default_context_window),
        count_tokens=cached_counter(model),
    )
