"""Paging a session's history until the window's budget is full (``LoadSpec.fill_ratio``).

``Store.load`` reads one page: the newest ``limit`` active messages. For a paged spec
(summarizing_window's ``maxHistoryFetch`` is its "page size when loading history") the
proxy then reads the pages before it with ``Store.get_range`` while the messages after
the latest summary hold less than ``fill_ratio`` x the context window (calibrated), and
cuts a page that holds more than that at its start (never below one page): what a turn
loads and selects from follows the window's budget, not the length of the history.

Sizes are the messages as stored: a message with a compression stub counts as its stub.
The system prompt is not subtracted from the budget: a page a little larger than the
window can hold is trimmed by the strategy, one too small would leave it part empty.
"""

from __future__ import annotations

from collections.abc import Sequence

from proxy.services import Services
from strategies.base import CountTokens
from strategies.compression import stub_tokens
from strategies.records import LoadSpec, SessionKey, SessionSnapshot, StoredMessage
from strategies.summarizing_window import latest_summary


def held_tokens(message: StoredMessage, count_tokens: CountTokens) -> int:
    """A message's size in the window as stored (its stub, when it has one)."""
    stub = message.compressed_content
    return message.tokens if stub is None else stub_tokens(message, stub, count_tokens)


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
    """Grow (or cut) ``snapshot.messages`` to the window's budget, in place, and hand the
    new page to the session cache. Nothing for a spec that is not paged."""
    messages = snapshot.messages
    if spec.fill_ratio is None or spec.since != "all" or not messages or spec.limit <= 0:
        return
    summary = latest_summary(snapshot.summaries)
    floor = summary.to_seq if summary is not None else 0
    target = page_target(spec, context_window, snapshot.meta.calibration)
    # messages a summary covers are not sent: they hold nothing and go first in a cut
    sizes = [held_tokens(m, count_tokens) if m.seq > floor else 0 for m in messages]
    held = sum(sizes)
    older: list[StoredMessage] = []
    first = messages[0].seq
    missing = snapshot.meta.active_count - len(messages)
    while held < target and missing > 0 and first > floor + 1:
        low = max(floor + 1, first - spec.limit)
        page = await services.store.get_range(key, low, first - 1)
        first = low
        missing -= len(page)
        older[:0] = page
        held += sum(held_tokens(m, count_tokens) for m in page)
    if older:
        snapshot.messages = [*older, *messages]
    else:
        cut = _trimmed(messages, sizes, held, target, spec.limit)
        if not cut:
            return
        snapshot.messages = messages[cut:]
    services.sessions.repaged(key, spec, snapshot)
