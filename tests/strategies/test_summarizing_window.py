"""summarizing_window: compression at select, budget trimming, the message cap, summaries
(after a turn: test_summarizing_window_after_turn.py)."""

from __future__ import annotations

import pytest
from helpers import (
    assistant,
    context,
    history,
    render,
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

from strategies.base import Window
from strategies.compression import NEWEST_PROTECTED, STUB_HINT, compression_threshold
from strategies.config import SummarizingWindowConfig
from strategies.records import LoadSpec, SummaryRecord
from strategies.summarizing_window import SummarizingWindowStrategy
from strategies.summary_prompt import render_summary
from strategies.validity import check_openai_messages

STRATEGY = SummarizingWindowStrategy()


def config(**fields) -> SummarizingWindowConfig:
    """The spec's per-request policy unless ``stablePrefix`` is given (the stable-prefix
    tests below)."""
    return spec_config(**fields)


def summary(from_seq: int, to_seq: int, text: str = "earlier work", id: int = 1):
    return SummaryRecord(kind="summary", text=text, from_seq=from_seq, to_seq=to_seq, id=id)


def turns(count: int, size: int = 100):
    """``count`` turns of a user question and an assistant answer, ``size`` tokens each."""
    messages = []
    for n in range(1, count + 1):
        messages += [user(f"q{n}", tokens=size), assistant(f"a{n}", tokens=size)]
    return history(*messages)


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


def tool_session():
    """Turn one reads four results, ``a`` (600 tokens) the oldest; turn two just started.
    Every other message is 10 tokens: 700 tokens in all."""
    return history(
        user("q1", tokens=10),
        assistant(None, tool_calls=["a"], tokens=10),
        tool("a", "A" * 40, tokens=600),
        assistant(None, tool_calls=["b"], tokens=10),
        tool("b", tokens=10),
        assistant(None, tool_calls=["c"], tokens=10),
        tool("c", tokens=10),
        assistant(None, tool_calls=["d"], tokens=10),
        tool("d", tokens=10),
        assistant("done", tokens=10),
        user("q2", tokens=10),
    )


def test_load_spec_pages_by_max_history_fetch_until_the_budget_is_full():
    assert STRATEGY.load_spec(config(maxHistoryFetch=42, maxConversationRatio=0.6)) == LoadSpec(
        limit=42, since="all", fill_ratio=0.6)


def test_a_small_session_goes_through_untouched():
    messages = turns(3)
    window = STRATEGY.select(context(messages, system_tokens=50))
    assert seqs(window) == [1, 2, 3, 4, 5, 6]
    assert (window.trimmed, window.new_stubs, window.modified) == (0, {}, False)
    assert window.tokens == 650


# --- compression at select -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("system_tokens", "compressed"),
    [
        pytest.param(4300, False, id="exactly-at-compressWhenWindowAboveRatio"),
        pytest.param(4301, True, id="one-token-above"),
    ],
)
def test_compression_starts_only_above_the_pressure_ratio(system_tokens, compressed):
    ctx = context(tool_session(), context_window=10_000, system_tokens=system_tokens)
    window = STRATEGY.select(ctx)
    assert (3 in window.new_stubs) is compressed
    item = window.items[2]
    assert (item.marker == "compressed") is compressed
    if compressed:
        assert item.text == window.new_stubs[3]
        assert item.tokens < 600
        assert "call the tool again if you need the full output" in item.text


def test_pressure_is_measured_with_calibration():
    ctx = context(tool_session(), context_window=10_000, system_tokens=4300, calibration=1.01)
    assert 3 in STRATEGY.select(ctx).new_stubs


def test_compress_tool_results_false_sends_results_whole_under_pressure():
    ctx = context(
        tool_session(),
        config(compressToolResults=False),
        context_window=10_000,
        system_tokens=7000,
    )
    window = STRATEGY.select(ctx)
    assert window.new_stubs == {}
    assert not any(item.marker == "compressed" for item in window.items)


def test_a_compressed_message_is_rendered_from_its_stub_and_not_planned_again():
    messages = tool_session()
    messages[2].compressed_content = "stored stub"
    # 4,950 + 100 + the stub: under pressure, within the budget
    window = STRATEGY.select(context(messages, context_window=10_000, system_tokens=4950))
    assert window.new_stubs == {}
    item = window.items[2]
    assert (item.text, item.marker) == ("stored stub", "compressed")
    assert messages[2].content == "A" * 40


def test_compression_is_decided_before_trimming_so_more_history_fits():
    # 700 tokens of messages + 7,500 of system prompt: over the 8,000 budget uncompressed,
    # within it once result ``a`` is a stub
    ctx = context(tool_session(), context_window=10_000, system_tokens=7500)
    window = STRATEGY.select(ctx)
    assert 3 in window.new_stubs
    assert window.trimmed == 0
    assert seqs(window)[0] == 1


def test_results_covered_by_a_summary_get_no_stub():
    ctx = context(
        tool_session(), context_window=10_000, system_tokens=7000, summaries=[summary(1, 3)]
    )
    assert STRATEGY.select(ctx).new_stubs == {}


# --- budget trimming -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("system_tokens", "first_seq", "trimmed"),
    [
        pytest.param(0, 1, 0, id="exactly-at-maxConversationRatio-keeps-all"),
        pytest.param(1, 3, 2, id="one-token-above-trims-the-oldest-turn"),
    ],
)
def test_the_window_is_trimmed_only_above_the_budget(system_tokens, first_seq, trimmed):
    ctx = context(turns(4), context_window=1000, system_tokens=system_tokens)
    window = STRATEGY.select(ctx)
    assert seqs(window)[0] == first_seq
    assert window.trimmed == trimmed
    assert window.tokens <= 800


def test_the_budget_is_calibrated():
    # 800 tokens fit 800 raw; calibrated by 1.1 only the newest 700 (770) do
    assert seqs(STRATEGY.select(context(turns(4), context_window=1000)))[0] == 1
    window = STRATEGY.select(context(turns(4), context_window=1000, calibration=1.1))
    assert seqs(window)[0] == 3


def test_a_summary_counts_against_the_budget():
    messages = turns(5)
    text = "s" * 1200  # about 325 tokens rendered: 475 left, four messages
    ctx = context(messages, context_window=1000, summaries=[summary(1, 2, text)])
    window = STRATEGY.select(ctx)
    assert seqs(window) == [7, 8, 9, 10]
    assert window.tokens <= 800


def test_trimming_never_starts_with_a_tool_result_or_splits_a_unit():
    messages = history(
        user("q1", tokens=100),
        assistant(None, tool_calls=["a", "b"], tokens=100),
        tool("a", tokens=100),
        tool("b", tokens=100),
        assistant("a1", tokens=100),
        user("q2", tokens=100),
        assistant(None, tool_calls=["c"], tokens=100),
        tool("c", tokens=100),
    )
    for system_tokens in range(0, 800, 25):
        ctx = context(messages, context_window=1000, system_tokens=system_tokens)
        window = STRATEGY.select(ctx)
        assert check_openai_messages(render(window)) == [], system_tokens
        assert window.items[0].message.role == "user"
        assert seqs(window)[-3:] == [6, 7, 8]


def test_the_current_turn_is_always_kept_even_above_the_budget():
    messages = history(
        user("q1", tokens=100),
        assistant("a1", tokens=100),
        user("q2", tokens=100),
        assistant(None, tool_calls=["a"], tokens=100),
        tool("a", tokens=400),
        assistant(None, tool_calls=["b"], tokens=100),
        tool("b", tokens=400),
    )
    ctx = context(messages, config(maxMessageRatio=1.0), context_window=1000)
    window = STRATEGY.select(ctx)
    assert seqs(window) == [3, 4, 5, 6, 7]
    assert window.trimmed == 2
    assert any("current turn" in note for note in window.notes)


# --- the single-message cap ----------------------------------------------------------------


def test_a_message_above_max_message_ratio_is_truncated_with_a_visible_marker():
    messages = history(user("q1"), assistant("a1"), user("x" * 4000))
    window = STRATEGY.select(context(messages, context_window=1000))
    item = window.items[-1]
    assert item.marker == "truncated"
    assert item.tokens <= 200
    assert item.text.startswith("x" * 100)
    assert "[… truncated by memory-proxy:" in item.text
    assert "of 1000 tokens shown]" in item.text
    assert messages[-1].content == "x" * 4000


@pytest.mark.parametrize(
    ("tokens", "truncated"),
    [
        pytest.param(200, False, id="exactly-at-the-cap"),
        pytest.param(201, True, id="one-above-the-cap"),
    ],
)
def test_the_cap_applies_strictly_above_max_message_ratio(tokens, truncated):
    messages = history(user("y" * 2000, tokens=tokens))
    item = STRATEGY.select(context(messages, context_window=1000)).items[0]
    assert (item.marker == "truncated") is truncated


@pytest.mark.parametrize(
    ("calibration", "truncated"),
    [
        pytest.param(1.0, False, id="190-tokens-under-the-cap"),
        pytest.param(1.1, True, id="calibrated-209-above-the-cap"),
    ],
)
def test_the_cap_is_calibrated(calibration, truncated):
    messages = history(user("y" * 2000, tokens=190))
    window = STRATEGY.select(context(messages, context_window=1000, calibration=calibration))
    assert (window.items[0].marker == "truncated") is truncated


def test_a_truncation_stays_the_same_while_the_calibration_moves_a_little():
    messages = history(user("q1"), assistant("a1"), user("x " * 12_000))
    cut = {
        STRATEGY.select(context(messages, context_window=10_000, calibration=c)).items[-1].text
        for c in (1.01, 1.015, 1.02)
    }
    assert len(cut) == 1
    [text] = cut
    # within the cap of each (1,960 tokens at 1.02, by the default counter)
    assert len(text) // 4 <= 1960


def test_truncation_leaves_tool_calls_untouched():
    calls = [{"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    messages = history(user("q"), assistant("z" * 4000, tool_calls=calls, tokens=1010), tool("a"))
    window = STRATEGY.select(context(messages, context_window=1000))
    item = window.items[1]
    assert item.marker == "truncated"
    assert item.message.tool_calls == calls
    assert check_openai_messages(render(window)) == []


# --- summaries in the window ---------------------------------------------------------------


@pytest.mark.parametrize("placement", ["SYSTEM_PROMPT", "USER_MESSAGE"])
def test_the_latest_summary_replaces_the_messages_it_covers(placement):
    records = [summary(1, 2, "first", id=1), summary(1, 4, "second", id=2)]
    ctx = context(turns(4), config(summaryPlacement=placement), summaries=records)
    window = STRATEGY.select(ctx)
    assert seqs(window) == [5, 6, 7, 8]
    assert window.summaries == [records[1]]
    assert window.summary_placement == placement
    assert window.trimmed == 4
    assert window.modified
    rendered = with_summary(window)
    assert check_openai_messages(rendered) == []
    assert "second" in str(rendered)
    assert "first" not in str(rendered)


def test_window_tokens_count_the_system_prompt_the_summary_and_the_items():
    ctx = context(turns(3), summaries=[summary(1, 2)], system_tokens=40)
    window = STRATEGY.select(ctx)
    rendered = render_summary(window.summaries[0], "SYSTEM_PROMPT")
    assert window.tokens == 40 + ctx.count_tokens(rendered) + 400


# --- properties ------------------------------------------------------------------------------


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    messages=histories(),
    context_window=st.sampled_from([1000, 4000, 20_000]),
    calibration=st.sampled_from([0.8, 1.0, 1.5]),
    budget=st.sampled_from([0.5, 0.8, 1.0]),
    pressure=st.sampled_from([0.1, 0.5, 0.9]),
    summarized=st.integers(0, 6),
    placement=st.sampled_from(["SYSTEM_PROMPT", "USER_MESSAGE"]),
    stable=st.booleans(),
)
def test_every_window_is_valid_within_budget_and_compresses_only_by_the_rules(
    messages, context_window, calibration, budget, pressure, summarized, placement, stable
):
    # under either policy: the spec's refit, or the stable prefix (stablePrefix)
    cfg = config(maxConversationRatio=budget, compressWhenWindowAboveRatio=pressure,
                 minToolResultCompressTokens=100, summaryPlacement=placement,
                 stablePrefix=stable)
    turn = turn_start(messages)
    records = [summary(1, messages[summarized - 1].seq)] if 0 < summarized <= turn else []
    ctx = context(messages, cfg, context_window=context_window, system_tokens=50,
                  calibration=calibration, summaries=records)
    window = STRATEGY.select(ctx)

    assert check_openai_messages(with_summary(window)) == []
    sent = seqs(window)
    assert sent == sorted(set(sent))
    current = [m.seq for m in messages[turn:]]
    assert sent[-len(current):] == current, "the current turn is sent whole"
    assert not records or sent[0] > records[0].to_seq
    assert window.trimmed == len(messages) - len(window.items)

    # within the budget, unless the current turn alone is larger
    fixed = window.tokens - sum(i.tokens for i in window.items)
    if window.tokens * calibration > round(budget * context_window, 6):
        assert sent == current
        assert any("current turn" in note for note in window.notes)
    # a message above the cap is cut to it, when its text can shrink enough
    cap = round(cfg.maxMessageRatio * context_window, 6) / calibration
    for item in window.items:
        if item.marker == "truncated":
            assert item.tokens <= cap and item.message.tokens > cap
    assert fixed >= 50

    # every stub obeys the four rules
    results = [i for i, m in enumerate(messages) if m.role == "tool"]
    newest = {messages[i].seq for i in results[-NEWEST_PROTECTED:]}
    last_assistant = max((i for i, m in enumerate(messages) if m.role == "assistant"), default=-1)
    for seq, stub in window.new_stubs.items():
        index = next(i for i, m in enumerate(messages) if m.seq == seq)
        message = messages[index]
        assert message.role == "tool" and index < last_assistant and seq not in newest
        assert message.tokens * calibration > compression_threshold(cfg, context_window)
        assert STUB_HINT in stub
        assert not records or seq > records[0].to_seq
