"""summarizing_window after a turn: when auto-summarize fires and what its plan covers,
and the Compact button (``compress``)."""

from __future__ import annotations

import pytest
from helpers import assistant, context, history, tool, user
from test_summarizing_window import STRATEGY, config, summary, tool_session, turns

from strategies.summary_prompt import render_summary

# --- after_turn ------------------------------------------------------------------------------


def auto(**fields):
    return config(autoSummarize=True, **fields)


@pytest.mark.parametrize(
    ("window_tokens", "planned"),
    [
        pytest.param(750, False, id="exactly-at-autoSummarizeRatio"),
        pytest.param(751, True, id="one-token-above"),
    ],
)
def test_auto_summarize_fires_only_above_its_ratio(window_tokens, planned):
    # the loaded conversation is small (100 tokens): the measured window decides
    ctx = context(turns(5, size=10), auto(), context_window=1000)
    assert (STRATEGY.after_turn(ctx, window_tokens) is not None) is planned


@pytest.mark.parametrize(
    ("system_tokens", "planned"),
    [
        pytest.param(0, False, id="live-exactly-at-autoSummarizeRatio"),
        pytest.param(1, True, id="live-one-token-above"),
    ],
)
def test_the_trigger_measures_the_live_conversation_before_trimming(system_tokens, planned):
    # 750 tokens of unsummarized messages; the window sent was trimmed to far less
    ctx = context(turns(5, size=75), auto(), context_window=1000, system_tokens=system_tokens)
    assert STRATEGY.live_tokens(ctx) == 750 + system_tokens
    assert (STRATEGY.after_turn(ctx, 400) is not None) is planned


def test_auto_summarize_fires_when_the_budget_is_below_its_ratio():
    # maxConversationRatio 0.6 trims every window to 600: the live conversation (1,000)
    # still triggers, so older turns are summarized instead of silently falling off
    cfg = auto(maxConversationRatio=0.6)
    ctx = context(turns(5), cfg, context_window=1000)
    window = STRATEGY.select(ctx)
    assert window.trimmed and window.tokens <= 600
    plan = STRATEGY.after_turn(ctx, window.tokens)
    assert plan is not None and plan.from_seq == 1


def test_the_live_measure_is_calibrated_and_skips_what_the_summary_covers():
    ctx = context(turns(5, size=70), auto(), context_window=1000)
    assert STRATEGY.after_turn(ctx, 0) is None  # 700
    assert STRATEGY.after_turn(context(turns(5, size=70), auto(), context_window=1000,
                                       calibration=1.1), 0) is not None  # 770
    record = summary(1, 4, "s")
    covered = context(turns(5, size=70), auto(), context_window=1000, summaries=[record])
    rendered = covered.count_tokens(render_summary(record, "SYSTEM_PROMPT"))
    assert STRATEGY.live_tokens(covered) == 6 * 70 + rendered


def test_the_live_measure_uses_stored_stubs_and_the_message_cap():
    messages = history(user("q", tokens=10), assistant(None, tool_calls=["a"], tokens=10),
                       tool("a", "A" * 40, tokens=600), assistant("x" * 4000, tokens=1010),
                       user("q2", tokens=10))
    messages[2].compressed_content = "stub"
    ctx = context(messages, auto(), context_window=1000)
    # the stub (3 + role + text by the default counter) and the answer cut to the cap
    assert STRATEGY.live_tokens(ctx) <= 10 + 10 + 5 + 200 + 10


def test_auto_summarize_is_opt_in():
    ctx = context(turns(5), context_window=1000)
    assert STRATEGY.after_turn(ctx, 1000) is None


def test_the_plan_keeps_the_newest_half_of_the_budget_and_never_the_current_turn():
    ctx = context(turns(5), auto(), context_window=1000)
    plan = STRATEGY.after_turn(ctx, 900)
    # tail budget 400: the current turn (200) and the one before it (200) stay live
    assert (plan.kind, plan.from_seq, plan.to_seq, plan.previous) == ("summary", 1, 6, None)
    assert [m.seq for m in plan.messages] == [1, 2, 3, 4, 5, 6]


def test_a_huge_current_turn_keeps_only_itself_live():
    messages = turns(3)
    messages[-1].tokens = 5000
    plan = STRATEGY.after_turn(context(messages, auto(), context_window=1000), 5400)
    assert (plan.from_seq, plan.to_seq) == (1, 4)


def test_the_cut_lands_on_a_turn_boundary_never_inside_a_tool_unit():
    messages = history(
        user("q1", tokens=100),
        assistant(None, tool_calls=["a"], tokens=100),
        tool("a", tokens=100),
        assistant("a1", tokens=100),
        user("q2", tokens=100),
        assistant(None, tool_calls=["b"], tokens=100),
        tool("b", tokens=100),
        assistant("a2", tokens=100),
        user("q3", tokens=100),
    )
    # budget 1,000, tail 500: the turn of q2 (400) and the current turn (100) stay live
    plan = STRATEGY.after_turn(context(messages, auto(), context_window=1250), 1000)
    assert plan.to_seq == 4
    assert messages[plan.to_seq].role == "user"  # the next message starts a turn


def test_a_range_is_never_summarized_twice():
    messages = turns(6)
    first = summary(1, 4, id=1)
    ctx = context(messages, auto(), context_window=1000, summaries=[first])
    plan = STRATEGY.after_turn(ctx, 900)
    assert plan.previous is first
    assert plan.from_seq == first.from_seq
    assert plan.messages[0].seq == 5
    assert plan.to_seq > first.to_seq


def test_nothing_new_to_summarize_plans_nothing():
    ctx = context(turns(3), auto(), context_window=1000, summaries=[summary(1, 4)])
    assert STRATEGY.after_turn(ctx, 1000) is None


def test_fewer_than_two_messages_plan_nothing():
    messages = history(assistant("stray", tokens=100), user("q", tokens=900))
    assert STRATEGY.after_turn(context(messages, auto(), context_window=1000), 1000) is None


# --- compress (the Compact button) ---------------------------------------------------------


def test_compact_summarizes_everything_before_the_current_turn_even_without_auto_summarize():
    plan = STRATEGY.compress(context(turns(3)))
    assert not plan.noop
    [summary_plan] = plan.summarize
    assert (summary_plan.kind, summary_plan.from_seq, summary_plan.to_seq) == ("summary", 1, 4)


def test_compact_compresses_large_results_without_pressure():
    # the current turn is tool_session's first: its results are not summarized away
    messages = history(user("old"), assistant("answer"), *tool_session()[:-1])
    plan = STRATEGY.compress(context(messages, context_window=10_000))
    assert set(plan.new_stubs) == {5}
    assert plan.summarize[0].to_seq == 2


def test_compact_builds_on_the_latest_summary():
    first = summary(1, 2)
    plan = STRATEGY.compress(context(turns(4), summaries=[first]))
    [summary_plan] = plan.summarize
    assert (summary_plan.previous, summary_plan.from_seq, summary_plan.to_seq) == (first, 1, 6)


def test_compact_with_nothing_to_do_is_a_noop_with_a_message():
    plan = STRATEGY.compress(context(turns(1)))
    assert plan.noop
    assert plan.message
