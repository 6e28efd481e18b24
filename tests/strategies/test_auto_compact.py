"""auto_compact: verbatim history, eviction at render time, the safety trim, compaction."""

from __future__ import annotations

import pytest
from helpers import FRAMING, assistant, context, history, render, seqs, tool, user

from strategies.auto_compact import AutoCompactStrategy
from strategies.base import Window
from strategies.config import AutoCompactConfig, ToolResultEviction
from strategies.records import LoadSpec, SummaryRecord
from strategies.summary_prompt import render_summary
from strategies.tokens import count_message, make_counter
from strategies.validity import check_openai_messages

STRATEGY = AutoCompactStrategy()
DEFAULT = AutoCompactConfig()


def evicting(after_turns: int = 1, above: int = 500, **fields) -> AutoCompactConfig:
    rule = ToolResultEviction(afterTurns=after_turns, aboveTokens=above)
    return AutoCompactConfig(toolResultEviction=rule, **fields)


def compaction(from_seq: int, to_seq: int, text: str = "compacted", id: int = 1):
    return SummaryRecord(kind="compaction", text=text, from_seq=from_seq, to_seq=to_seq, id=id)


def three_turns(size: int = 500):
    """Three turns, each with one ``size``-token tool result."""
    return history(
        user("q1", tokens=10),
        assistant(None, tool_calls=["t1"], tokens=10),
        tool("t1", "one", tokens=size),
        assistant("a1", tokens=10),
        user("q2", tokens=10),
        assistant(None, tool_calls=["t2"], tokens=10),
        tool("t2", "two", tokens=size),
        assistant("a2", tokens=10),
        user("q3", tokens=10),
        assistant(None, tool_calls=["t3"], tokens=10),
        tool("t3", "three", tokens=size),
        assistant("a3", tokens=10),
    )


def with_summary(window: Window) -> list[dict]:
    """The rendered list with the window's summary placed, as the mapper does."""
    messages = render(window)
    if window.summaries:
        placed = render_summary(window.summaries[-1], window.summary_placement)
        if isinstance(placed, str):
            messages[0] = {"role": "system", "content": messages[0]["content"] + placed}
        else:
            messages.insert(1, placed)
    return messages


def evicted(window: Window) -> list[int]:
    return [i.message.seq for i in window.items if i.marker == "evicted"]


def test_load_spec_reads_only_after_the_compaction_boundary():
    spec = STRATEGY.load_spec(DEFAULT)
    assert spec.since == "boundary"
    assert spec.limit >= 1000
    assert isinstance(spec, LoadSpec)


def test_live_messages_go_through_verbatim():
    messages = three_turns(size=5000)
    window = STRATEGY.select(context(messages, DEFAULT, system_tokens=30))
    assert seqs(window) == list(range(1, 13))
    assert all(i.text is None and i.marker is None for i in window.items)
    assert (window.trimmed, window.new_stubs, window.summaries) == (0, {}, [])
    assert window.tokens == 30 + sum(m.tokens for m in messages)


@pytest.mark.parametrize("placement", ["USER_MESSAGE", "SYSTEM_PROMPT"])
def test_the_latest_compaction_is_placed_per_config(placement):
    records = [compaction(1, 4, "old", id=1), compaction(1, 8, "new", id=2)]
    messages = three_turns()
    config = AutoCompactConfig(summaryPlacement=placement)
    window = STRATEGY.select(context(messages[8:], config, summaries=records))
    assert window.summaries == [records[1]]
    assert window.summary_placement == placement
    assert seqs(window) == [9, 10, 11, 12]
    assert check_openai_messages(with_summary(window)) == []


def test_messages_up_to_the_boundary_are_never_sent_even_when_loaded():
    window = STRATEGY.select(context(three_turns(), DEFAULT, summaries=[compaction(1, 8)]))
    assert seqs(window) == [9, 10, 11, 12]
    assert window.trimmed == 8


# --- eviction ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("after_turns", "expected"),
    [
        pytest.param(1, [3, 7], id="afterTurns-1-everything-before-the-current-turn"),
        pytest.param(2, [3], id="afterTurns-2-before-the-previous-turn"),
        pytest.param(3, [], id="afterTurns-3-nothing-that-old"),
    ],
)
def test_eviction_follows_the_user_turn_boundary(after_turns, expected):
    window = STRATEGY.select(context(three_turns(500 + FRAMING), evicting(after_turns)))
    assert evicted(window) == expected


@pytest.mark.parametrize(
    ("size", "expected"),
    [
        pytest.param(500, [3, 7], id="exactly-aboveTokens-is-evicted"),
        pytest.param(499, [], id="one-below-is-kept"),
    ],
)
def test_eviction_needs_at_least_above_tokens(size, expected):
    # the size is the result's own: the message around it weighs FRAMING more
    window = STRATEGY.select(context(three_turns(size + FRAMING), evicting(above=500)))
    assert evicted(window) == expected


def test_eviction_has_no_newest_three_protection():
    # t1 and t2 are two of the three newest results and still go
    assert evicted(STRATEGY.select(context(three_turns(500 + FRAMING), evicting()))) == [3, 7]


def test_an_evicted_result_is_a_pointer_stub_and_nothing_is_written():
    messages = three_turns(500 + FRAMING)
    window = STRATEGY.select(context(messages, evicting()))
    item = window.items[2]
    assert 'tool_call_id="t1"' in item.text
    assert "fetch_tool_result" in item.text
    assert item.tokens < 500
    assert window.new_stubs == {}
    assert messages[2].content == "one"
    assert messages[2].compressed_content is None
    assert check_openai_messages(render(window)) == []


def test_an_evicted_item_counts_the_message_it_is_sent_as():
    counter = make_counter("gpt-4o")
    window = STRATEGY.select(
        context(three_turns(500 + FRAMING), evicting(), count_tokens=counter))
    item = window.items[2]
    sent = {"role": "tool", "tool_call_id": "t1", "content": item.text}
    # the stub and the message's framing, as the upstream counts it (not the stub alone)
    assert item.tokens == count_message(sent, "gpt-4o") == counter(item.text) + FRAMING
    assert window.tokens == sum(i.tokens for i in window.items)


def test_no_eviction_rule_means_no_eviction():
    assert evicted(STRATEGY.select(context(three_turns(), DEFAULT))) == []


# --- safety trim ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("system_tokens", "first_seq"),
    [
        pytest.param(0, 1, id="exactly-the-context-window-is-sent-whole"),
        pytest.param(1, 5, id="one-token-over-trims-the-oldest-turn"),
    ],
)
def test_a_window_over_the_context_window_is_trimmed_to_fit(system_tokens, first_seq):
    messages = three_turns()  # 1,590 tokens
    window = STRATEGY.select(
        context(messages, DEFAULT, context_window=1590, system_tokens=system_tokens)
    )
    assert seqs(window)[0] == first_seq
    assert check_openai_messages(render(window)) == []
    assert window.tokens <= 1590
    assert bool(window.notes) is bool(system_tokens)


def test_the_safety_trim_always_keeps_the_current_turn():
    window = STRATEGY.select(context(three_turns(), DEFAULT, context_window=100))
    assert seqs(window) == [9, 10, 11, 12]
    assert window.trimmed == 8


# --- a live window that opens mid-turn -----------------------------------------------------


def mid_turn():
    """After a compaction that stopped before a call still waiting for its result."""
    messages = history(
        user("q1", tokens=10),
        assistant("a1", tokens=10),
        assistant(None, tool_calls=["t9"], tokens=10),
        tool("t9", "fetched", tokens=10),
    )
    return messages[2:], [compaction(1, 2)]


@pytest.mark.parametrize("placement", ["USER_MESSAGE", "SYSTEM_PROMPT"])
def test_a_call_waiting_for_its_result_survives_the_compaction(placement):
    live, records = mid_turn()
    config = AutoCompactConfig(summaryPlacement=placement)
    window = STRATEGY.select(context(live, config, summaries=records, current_turn_start=0))
    assert seqs(window) == [3, 4]
    assert window.summary_placement == "USER_MESSAGE"
    assert check_openai_messages(with_summary(window)) == []


# --- after_turn and compress ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("window_tokens", "planned"),
    [
        pytest.param(500, False, id="well-below-compactAtRatio"),
        pytest.param(799, False, id="one-token-below"),
        pytest.param(800, False, id="exactly-at-compactAtRatio"),
        pytest.param(801, True, id="one-token-above"),
    ],
)
def test_compaction_fires_only_above_its_ratio(window_tokens, planned):
    ctx = context(three_turns(), DEFAULT, context_window=1000)
    assert (STRATEGY.after_turn(ctx, window_tokens) is not None) is planned


def test_a_compaction_covers_the_whole_live_conversation():
    messages = three_turns()
    plan = STRATEGY.after_turn(context(messages, DEFAULT, context_window=1000), 900)
    assert (plan.kind, plan.from_seq, plan.to_seq, plan.previous) == ("compaction", 1, 12, None)
    assert plan.messages == messages


def test_a_compaction_builds_on_the_previous_one():
    previous = compaction(1, 8)
    ctx = context(three_turns()[8:], DEFAULT, context_window=1000, summaries=[previous])
    plan = STRATEGY.after_turn(ctx, 900)
    assert (plan.from_seq, plan.to_seq, plan.previous) == (9, 12, previous)


def test_the_trigger_takes_the_measured_window_as_already_calibrated():
    # the proxy passes a calibrated measurement; the strategy compares it as given
    ctx = context(three_turns(), DEFAULT, context_window=1000, calibration=2.0)
    assert STRATEGY.after_turn(ctx, 700) is None
    assert STRATEGY.after_turn(ctx, 801) is not None


@pytest.mark.parametrize(
    ("summary_tokens", "planned"),
    [
        pytest.param(60, True, id="live-part-outweighs-the-summary"),
        pytest.param(540, False, id="live-part-no-bigger-than-the-summary"),
    ],
)
def test_a_compaction_that_cannot_shrink_the_window_is_not_repeated(summary_tokens, planned):
    # a huge system prompt keeps every window over the ratio: compacting the one small turn
    # after the last compaction into a summary of the same size would loop on every turn
    previous = SummaryRecord(kind="compaction", text="s", from_seq=1, to_seq=8, id=1,
                             tokens=summary_tokens)
    live = three_turns()[8:]  # 540 tokens
    ctx = context(live, DEFAULT, context_window=1000, summaries=[previous], system_tokens=900)
    assert (STRATEGY.after_turn(ctx, 1500) is not None) is planned


def test_the_compact_action_always_compacts_even_a_small_live_part():
    previous = SummaryRecord(kind="compaction", text="s", from_seq=1, to_seq=8, id=1,
                             tokens=5000)
    plan = STRATEGY.compress(context(three_turns()[8:], DEFAULT, summaries=[previous]))
    assert [(p.from_seq, p.to_seq) for p in plan.summarize] == [(9, 12)]


def test_a_call_still_waiting_for_its_results_stays_live():
    messages = history(
        user("q1"), assistant("a1"), user("q2"), assistant(None, tool_calls=["x", "y"])
    )
    plan = STRATEGY.after_turn(context(messages, DEFAULT, context_window=1000), 900)
    assert plan.to_seq == 3


def test_nothing_live_plans_no_compaction():
    ctx = context([], DEFAULT, context_window=1000, summaries=[compaction(1, 8)])
    assert STRATEGY.after_turn(ctx, 5000) is None


def test_compact_runs_a_full_compaction():
    plan = STRATEGY.compress(context(three_turns(size=10), DEFAULT))
    [compact] = plan.summarize
    assert (compact.kind, compact.from_seq, compact.to_seq) == ("compaction", 1, 12)
    assert not plan.noop


def test_compact_with_nothing_live_is_a_noop_with_a_message():
    plan = STRATEGY.compress(context([], DEFAULT, summaries=[compaction(1, 8)]))
    assert plan.noop
    assert plan.summarize == []
    assert plan.message
