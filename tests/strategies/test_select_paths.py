"""The per-turn shortcuts give what the general code gives.

``SummarizingWindowStrategy.select`` skips ``fit_tail`` and ``trim_to_units`` when the whole
live window fits, builds window items only for the messages it keeps and remembers cut
texts; the default mapper renders plain items inline instead of through ``map_item``.
Each test compares a shortcut with the general code (``reference_select`` composes the
documented mechanisms one by one) on contexts on both sides of it: at the budget edge,
with compression, with tool units across the trim point, with summaries placed both ways.
The validity rules' shortcuts are compared in test_validity_paths.py.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from helpers import (
    assistant,
    call,
    context,
    history,
    seqs,
    spec_config,
    tool,
    turn_start,
    user,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from soak import examples
from test_validity import histories

from strategies.base import Window, WindowContext, WindowItem
from strategies.compression import (
    choose_compressions,
    compressed_item,
    exceeds,
    render_stored,
)
from strategies.config import SummarizingWindowConfig
from strategies.mapper import MappingContext, MessageToLlmMessageMapper
from strategies.records import StoredMessage, SummaryRecord
from strategies.summarizing_window import (
    SummarizingWindowStrategy,
    fit_tail,
    latest_summary,
    live_start,
    summary_tokens,
)
from strategies.truncation import CutMemory, cut_text, message_cap, truncate_item
from strategies.validity import (
    make_valid,
    trim_to_units,
)

STRATEGY = SummarizingWindowStrategy()


def reference_live(
    ctx: WindowContext,
) -> tuple[SummaryRecord | None, int, int, list[WindowItem]]:
    """The summary, the fixed size, the live start and every live message rendered."""
    config: SummarizingWindowConfig = ctx.config  # type: ignore[assignment]
    count = ctx.count_tokens
    summary = latest_summary(ctx.summaries)
    fixed = ctx.system_tokens + summary_tokens(summary, config.summaryPlacement, count)
    start = live_start(ctx.messages, summary)
    cap, cut = message_cap(config, ctx.context_window, ctx.calibration)
    items = []
    for message in ctx.messages[start:]:
        item = render_stored(message, count)
        items.append(truncate_item(item, cut, count) if not item.marker and item.tokens > cap
                     else item)
    return summary, fixed, start, items


def reference_select(ctx: WindowContext) -> Window:
    """summarizing_window's window, one mechanism after the other, every item rendered."""
    config: SummarizingWindowConfig = ctx.config  # type: ignore[assignment]
    count, window, calibration = ctx.count_tokens, ctx.context_window, ctx.calibration
    summary, fixed, start, items = reference_live(ctx)
    live = ctx.messages[start:]
    notes = [f"{start} messages covered by the summary are not sent"] if start else []
    pressure = exceeds(fixed + sum(i.tokens for i in items), config.compressWhenWindowAboveRatio,
                       window, calibration)
    stubs = choose_compressions(ctx.messages, config, window, under_pressure=pressure,
                                calibration=calibration, eligible=frozenset(m.seq for m in live))
    for index, message in enumerate(live):
        if message.seq in stubs:
            items[index] = compressed_item(message, stubs[message.seq], count)
    if stubs:
        notes.append(f"{len(stubs)} tool results compressed")
    turn = min(max(ctx.current_turn_start - start, 0), len(live))
    keep_from = fit_tail(live, items, turn, fixed=fixed, ratio=config.maxConversationRatio,
                         context_window=window, calibration=calibration)
    kept, _ = make_valid(items[trim_to_units(live, min(keep_from, turn)):])
    if len(live) - len(kept):
        notes.append(f"{len(live) - len(kept)} older messages trimmed to fit maxConversationRatio")
    truncated = sum(1 for i in kept if i.marker == "truncated")
    if truncated:
        notes.append(f"{truncated} messages truncated to maxMessageRatio")
    total = fixed + sum(i.tokens for i in kept)
    if exceeds(total, config.maxConversationRatio, window, calibration):
        notes.append("the current turn alone exceeds maxConversationRatio")
    return Window(items=kept, summaries=[summary] if summary else [],
                  summary_placement=config.summaryPlacement, trimmed=len(ctx.messages) - len(kept),
                  new_stubs=stubs, tokens=total, notes=notes)


def assert_same_window(ctx: WindowContext) -> Window:
    window = STRATEGY.select(ctx)
    expected = reference_select(ctx)
    assert window == expected
    assert list(window.new_stubs.items()) == list(expected.new_stubs.items())
    _summary, fixed, _start, items = reference_live(ctx)
    assert STRATEGY.live_tokens(ctx) == fixed + sum(i.tokens for i in items)
    return window


def size(messages: list[StoredMessage]) -> int:
    return sum(m.tokens for m in messages)


def turns(count: int, tokens: int = 100) -> list[StoredMessage]:
    messages = []
    for n in range(1, count + 1):
        messages += [user(f"q{n}", tokens=tokens), assistant(f"a{n}", tokens=tokens)]
    return history(*messages, user("now", tokens=tokens))


# --- summarizing_window: the everything-fits shortcut and the general trim ---------------------


@pytest.mark.parametrize(
    ("over", "sent"),
    [
        pytest.param(0, [1, 2, 3, 4, 5], id="exactly-at-the-budget-everything-is-kept"),
        pytest.param(1, [3, 4, 5], id="one-token-over-the-oldest-turn-falls-off"),
    ],
)
def test_the_window_at_the_budget_edge_matches_the_general_trim(over, sent):
    messages = turns(2)  # 500 tokens; system 100; budget 0.5 * 1200 = 600
    ctx = context(messages, context_window=1200, system_tokens=100 + over,
                  config=spec_config(maxConversationRatio=0.5))
    assert seqs(assert_same_window(ctx)) == sent


@pytest.mark.parametrize("calibration", [1.0, 1.07, 0.5, 2.9])
def test_a_calibrated_budget_edge_matches_the_general_trim(calibration):
    messages = turns(6, tokens=37)
    limit = (size(messages) + 20) * calibration
    for delta in range(-3, 4):
        ctx = context(messages, context_window=round(limit) + delta, system_tokens=20,
                      calibration=calibration,
                      config=spec_config(maxConversationRatio=1.0))
        assert_same_window(ctx)


def test_a_page_starting_with_a_tool_result_loses_it_even_when_everything_fits():
    messages = history(tool("lost", tokens=10), assistant("a0", tokens=10), user("q", tokens=10),
                       assistant("a", tokens=10), user("now", tokens=10))
    window = assert_same_window(context(messages))
    assert seqs(window) == [3, 4, 5]


def test_a_negative_size_takes_the_general_trim_even_when_the_total_fits():
    # never stored, but a hand-built context may carry one: the total (100) fits the
    # budget while the newest two messages alone (200) do not
    messages = history(user("q", tokens=-100), assistant("a", tokens=100), user("now", tokens=100))
    ctx = context(messages, context_window=150,
                  config=spec_config(maxConversationRatio=1.0, maxMessageRatio=1.0))
    assert seqs(assert_same_window(ctx)) == [3]


@pytest.mark.parametrize("budget", [370, 390, 410, 430, 480, 560])
def test_a_tool_unit_across_the_trim_point_goes_whole_or_not_at_all(budget):
    messages = history(
        user("q1", tokens=40),
        assistant(None, tool_calls=["a", "b"], tokens=30),
        tool("a", tokens=60),
        tool("b", tokens=60),
        assistant("done", tokens=40),
        user("q2", tokens=40),
        assistant(None, tool_calls=["c"], tokens=30),
        tool("c", tokens=60),
        assistant("done", tokens=40),
        user("now", tokens=40),
    )
    ctx = context(messages, context_window=budget,
                  config=spec_config(maxConversationRatio=1.0, maxMessageRatio=1.0))
    sent = seqs(assert_same_window(ctx))
    for unit in ([2, 3, 4], [7, 8]):
        assert set(unit) <= set(sent) or not set(unit) & set(sent)


@pytest.mark.parametrize("placement", ["SYSTEM_PROMPT", "USER_MESSAGE"])
@pytest.mark.parametrize("window_size", [100_000, 900, 700])
def test_summaries_in_either_placement_match_the_general_path(placement, window_size):
    messages = turns(4)
    record = SummaryRecord(kind="summary", text="The user\u200b asked for\tq1 and q2.\n",
                           from_seq=1, to_seq=4, id=3)
    ctx = context(messages, summaries=[record], context_window=window_size,
                  config=spec_config(summaryPlacement=placement))
    window = assert_same_window(ctx)
    assert window.summaries == [record]
    assert seqs(window)[0] > 4


def test_compression_under_pressure_then_trimming_matches_the_general_path():
    messages = history(
        user("q1", tokens=20),
        *[m for k in "abcde" for m in (assistant(None, tool_calls=[k], tokens=20),
                                       tool(k, "R" * 4000, tokens=900))],
        assistant("done", tokens=20),
        user("now", tokens=20),
    )
    messages[2].compressed_content = "an earlier stub"  # stored by a previous turn
    # about 3,770 tokens live: under pressure below 7,540, over the budget below 4,710
    for window_size, stubbed, trimmed in ((3000, True, True), (5000, True, False),
                                          (8000, False, False)):
        ctx = context(messages, context_window=window_size,
                      config=spec_config(minToolResultCompressTokens=100,
                                                     maxMessageRatio=1.0))
        window = assert_same_window(ctx)
        assert (bool(window.new_stubs), window.trimmed > 0) == (stubbed, trimmed)


def test_a_message_above_the_cap_is_cut_the_same_way_every_turn():
    messages = history(user("x " * 3000, tokens=1504), assistant("ok", tokens=5),
                       user("now", tokens=5))
    ctx = context(messages, context_window=4000)
    first, second = assert_same_window(ctx), assert_same_window(ctx)
    assert first == second
    assert first.items[0].marker == "truncated"


class _Unhashable:
    """A counter that cannot key a cache."""

    __hash__ = None  # type: ignore[assignment]

    def __call__(self, text: str) -> int:
        return max(1, len(text) // 4)


_COUNT = WindowContext.__dataclass_fields__["count_tokens"].default


def test_a_cut_with_an_unhashable_counter_is_the_same_cut():
    message = StoredMessage(role="user", content="y " * 2000, tokens=1004, seq=1)
    item = WindowItem(message, message.tokens)
    assert truncate_item(item, 300, _Unhashable()) == truncate_item(item, 300, _COUNT)


def test_remembered_cuts_are_the_computed_ones_and_bounded_by_characters():
    memory = CutMemory(max_chars=10_000)
    texts = [f"{n} " + "word " * 800 for n in range(4)]  # about 4,000 characters each
    for text in texts + texts[::-1]:
        for limit in (100, 5000):
            assert memory.cut(text, 1000, limit, _COUNT) == cut_text(text, 1000, limit, _COUNT)
    assert memory.chars <= 10_000
    assert 0 < len(memory) < 2 * len(texts)
    memory.cut("z" * 20_000, 5000, 100, _COUNT)  # larger than the whole memory: not kept
    assert memory.chars <= 10_000


_settings = settings(max_examples=examples(250), deadline=None,
                     suppress_health_check=[HealthCheck.too_slow])


@_settings
@given(
    messages=histories(),
    stubbed=st.sets(st.integers(0, 60), max_size=4),
    edge=st.integers(-3, 3),
    budget=st.sampled_from([0.3, 0.8, 1.0]),
    calibration=st.sampled_from([0.8, 1.0, 1.07, 1.5]),
    pressure=st.sampled_from([0.1, 0.5, 0.95]),
    summarized=st.integers(0, 6),
    placement=st.sampled_from(["SYSTEM_PROMPT", "USER_MESSAGE"]),
)
def test_select_matches_the_general_path_on_random_sessions_near_the_budget(
    messages, stubbed, edge, budget, calibration, pressure, summarized, placement
):
    for index in stubbed:
        if index < len(messages) and messages[index].role == "tool":
            messages[index].compressed_content = f"stub {index}"
    turn = turn_start(messages)
    records = []
    if 0 < summarized <= turn:
        records = [SummaryRecord(kind="summary", text="earlier", from_seq=1,
                                 to_seq=messages[summarized - 1].seq)]
    cfg = spec_config(
        maxConversationRatio=budget, compressWhenWindowAboveRatio=pressure,
        minToolResultCompressTokens=100, summaryPlacement=placement,
    )
    # a context window whose budget sits a few tokens around the whole window's size
    whole = STRATEGY.live_tokens(context(messages, cfg, system_tokens=50, summaries=records,
                                         calibration=calibration))
    window_size = max(1, round(whole * calibration / budget) + edge)
    ctx = context(messages, cfg, context_window=window_size, system_tokens=50,
                  calibration=calibration, summaries=records)
    assert_same_window(ctx)


class _PerItem(MessageToLlmMessageMapper):
    """The default mapper forced through ``map_item`` for every item."""

    def map_item(self, item: WindowItem, context: MappingContext) -> dict[str, Any]:
        return super().map_item(item, context)


def _mapped_items() -> list[WindowItem]:
    ids = itertools.count(1)

    def item(message: StoredMessage, **fields: Any) -> WindowItem:
        message.seq = next(ids)
        return WindowItem(message, message.tokens, **fields)

    image = {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}
    pdf = {"name": "a.pdf", "media_type": "application/pdf"}
    return [
        item(user("hello")),
        item(StoredMessage(role="user", content="named", name="bob")),
        item(assistant("", tool_calls=[call("a")])),
        item(assistant(None, tool_calls=[call("b")])),
        item(StoredMessage(role="assistant", content="calls and text", tool_calls=[call("c")],
                           name="helper")),
        item(StoredMessage(role="tool", content="result", tool_call_id="a", name="lookup")),
        item(tool("b", "big result"), text="a stub", marker="compressed"),
        item(StoredMessage(role="system", content="mid-conversation note")),
        item(StoredMessage(role="developer", content=[{"type": "text", "text": "dev"}])),
        item(StoredMessage(role="user", content=[{"type": "text", "text": "a"}, image])),
        item(StoredMessage(role="user", content=[image]), text="shortened", marker="truncated"),
        item(StoredMessage(role="user", content="see file", meta={"attachments": [pdf]})),
        item(StoredMessage(role="user", content=None)),
        item(StoredMessage(role="assistant", content=[{"type": "text", "text": "parts"}])),
    ]


@pytest.mark.parametrize(
    "system", [None, [{"role": "system", "content": "You help."}]], ids=["no-system", "system"]
)
@pytest.mark.parametrize("placement", ["SYSTEM_PROMPT", "USER_MESSAGE"])
def test_the_inline_mapper_renders_every_kind_of_item_as_map_item_does(system, placement):
    record = SummaryRecord(kind="summary", text="earlier", from_seq=1, to_seq=1)
    window = Window(items=_mapped_items(), summaries=[record], summary_placement=placement)
    mapping = MappingContext(model="gpt-4o-mini", capabilities=frozenset({"image"}),
                             current_turn_seq=10)
    assert MessageToLlmMessageMapper().map(window, system, mapping) == _PerItem().map(
        window, system, mapping
    )


@_settings
@given(histories())
def test_the_inline_mapper_matches_map_item_on_random_windows(messages):
    window = STRATEGY.select(context(messages))
    mapping = MappingContext(model="gpt-4o-mini")
    assert MessageToLlmMessageMapper().map(window, None, mapping) == _PerItem().map(
        window, None, mapping
    )


def test_a_record_shrunk_by_the_strategy_is_rendered_from_the_item_text():
    mapper, mapping = MessageToLlmMessageMapper(), MappingContext()
    record = user("before")
    assert mapper.map(Window(items=[WindowItem(record, 1)]), None, mapping) == [
        {"role": "user", "content": "before"}
    ]
    shrunk = WindowItem(record, 1, text="bef…", marker="truncated")
    assert mapper.map(Window(items=[shrunk]), None, mapping) == [
        {"role": "user", "content": "bef…"}
    ]
