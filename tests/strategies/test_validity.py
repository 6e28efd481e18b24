"""Validity: tool units, repair, the invariant checker, and the invariants for every strategy."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from helpers import assistant, context, history, render, seqs, tool, turn_start, user
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from soak import examples

from strategies.base import Window, WindowItem
from strategies.config import FullConfig, NoneConfig, WindowedConfig
from strategies.full import FullStrategy
from strategies.none import NoneStrategy
from strategies.records import StoredMessage
from strategies.validity import (
    as_items,
    check_openai_messages,
    make_valid,
    tool_units,
    trim_to_units,
)
from strategies.windowed import WindowedStrategy

# --- tool_units and trim_to_units ---------------------------------------------------------


def test_a_call_and_its_results_form_one_unit_and_everything_else_its_own():
    messages = history(
        user(), assistant(None, tool_calls=["a", "b"]), tool("a"), tool("b"), assistant("done")
    )
    assert tool_units(messages) == [(0, 1), (1, 4), (4, 5)]


def test_a_result_after_an_interleaved_message_is_a_unit_of_its_own():
    messages = history(user(), assistant(None, tool_calls=["a"]), user("wait"), tool("a"))
    assert tool_units(messages) == [(0, 1), (1, 2), (2, 3), (3, 4)]


def test_a_result_for_another_call_ends_the_unit():
    messages = history(user(), assistant(None, tool_calls=["a"]), tool("a"), tool("zzz"))
    assert tool_units(messages) == [(0, 1), (1, 3), (3, 4)]


def test_units_cover_every_index_once():
    messages = history(tool("x"), user(), assistant(None, tool_calls=["a"]), tool("a"), tool("a"))
    units = tool_units(messages)
    assert [i for start, end in units for i in range(start, end)] == list(range(len(messages)))


_UNITS = history(
    user("q1"),  # 0
    assistant(None, tool_calls=["a", "b"]),  # 1
    tool("a"),  # 2
    tool("b"),  # 3
    assistant("a1"),  # 4
    tool("orphan"),  # 5
    user("q2"),  # 6
)


@pytest.mark.parametrize(
    ("keep_from", "expected"),
    [
        pytest.param(0, 0, id="at-the-start"),
        pytest.param(-3, 0, id="negative-clamped"),
        pytest.param(1, 1, id="on-a-call-unit-stays"),
        pytest.param(2, 4, id="on-a-tool-result-moves-past-the-unit"),
        pytest.param(3, 4, id="on-the-last-result-moves-past-the-unit"),
        pytest.param(5, 6, id="on-an-orphan-result-skips-it"),
        pytest.param(6, 6, id="on-the-last-message"),
        pytest.param(7, 7, id="past-the-end"),
    ],
)
def test_trim_to_units_moves_the_start_forward_to_a_unit_boundary(keep_from, expected):
    assert trim_to_units(_UNITS, keep_from) == expected


# --- make_valid ---------------------------------------------------------------------------


def _valid(*messages: StoredMessage) -> tuple[list[WindowItem], int]:
    return make_valid(as_items(history(*messages)))


def _roles(items: list[WindowItem]) -> list[str]:
    return [i.message.role for i in items]


def test_a_valid_window_comes_back_unchanged():
    items = as_items(
        history(user(), assistant(None, tool_calls=["a"]), tool("a"), assistant("done"))
    )
    repaired, dropped = make_valid(items)
    assert dropped == 0
    assert all(a is b for a, b in zip(repaired, items, strict=True))


def test_a_tool_result_without_its_call_is_dropped():
    repaired, dropped = _valid(user(), tool("a"), assistant("hi"))
    assert (_roles(repaired), dropped) == (["user", "assistant"], 1)


def test_a_duplicate_answer_is_dropped():
    repaired, dropped = _valid(user(), assistant(None, tool_calls=["a"]), tool("a"), tool("a"))
    assert (_roles(repaired), dropped) == (["user", "assistant", "tool"], 1)


def test_unanswered_calls_are_removed_from_a_copy_of_the_message():
    source = assistant("checking", tool_calls=["a", "b"])
    repaired, dropped = _valid(user(), source, tool("a"))
    assert dropped == 0
    assert [c["id"] for c in repaired[1].message.tool_calls] == ["a"]
    assert repaired[1].message is not source
    assert [c["id"] for c in source.tool_calls] == ["a", "b"]


def test_an_assistant_with_no_answered_call_and_no_text_is_dropped():
    repaired, dropped = _valid(user(), assistant(None, tool_calls=["a"]), user("next"))
    assert (_roles(repaired), dropped) == (["user", "user"], 1)


def test_an_assistant_with_no_answered_call_keeps_its_text():
    repaired, _ = _valid(user(), assistant("let me look", tool_calls=["a"]), user("next"))
    assert repaired[1].message.content == "let me look"
    assert repaired[1].message.tool_calls is None


def test_a_result_after_interleaved_text_is_an_orphan_and_its_call_is_removed():
    repaired, dropped = _valid(
        user(), assistant(None, tool_calls=["a"]), assistant("meanwhile"), tool("a")
    )
    assert (_roles(repaired), dropped) == (["user", "assistant"], 2)
    assert repaired[1].message.content == "meanwhile"


def test_leading_messages_are_dropped_until_a_user_message():
    repaired, dropped = _valid(
        tool("x"), assistant(None, tool_calls=["a"]), tool("a"), assistant("a1"), user("q")
    )
    assert (_roles(repaired), dropped) == (["user"], 4)


def test_a_window_without_a_user_message_repairs_to_nothing():
    assert _valid(assistant("hi"), assistant(None, tool_calls=["a"]), tool("a")) == ([], 3)


def test_make_valid_keeps_the_items_text_and_marker():
    items = as_items(history(user(), assistant(None, tool_calls=["a", "b"]), tool("a")))
    items[2] = WindowItem(items[2].message, tokens=5, text="[stub]", marker="compressed")
    repaired, _ = make_valid(items)
    assert (repaired[2].text, repaired[2].marker, repaired[2].tokens) == ("[stub]", "compressed", 5)


# --- check_openai_messages ----------------------------------------------------------------

SYSTEM = {"role": "system", "content": "s"}
USER = {"role": "user", "content": "u"}
TEXT = {"role": "assistant", "content": "a"}


def _calls(*ids: str) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": i, "type": "function", "function": {"name": "f", "arguments": "{}"}} for i in ids
        ],
    }


def _result(call_id: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": "r"}


@pytest.mark.parametrize(
    "messages",
    [
        pytest.param([SYSTEM, USER, TEXT], id="plain"),
        pytest.param([USER], id="no-system"),
        pytest.param([SYSTEM, {"role": "developer", "content": "d"}, USER], id="system-block"),
        pytest.param([SYSTEM, USER, _calls("a", "b"), _result("b"), _result("a")], id="tools"),
        pytest.param(
            [USER, _calls("a"), _result("a"), _calls("b"), _result("b"), TEXT], id="two-units"
        ),
    ],
)
def test_the_checker_accepts_valid_windows(messages):
    assert check_openai_messages(messages) == []


@pytest.mark.parametrize(
    ("messages", "fragment"),
    [
        pytest.param([SYSTEM, USER, SYSTEM, TEXT], "outside the leading", id="system-mid"),
        pytest.param([USER, {"role": "developer", "content": "d"}], "outside", id="developer-mid"),
        pytest.param([SYSTEM, TEXT, USER], "first non-system", id="starts-with-assistant"),
        pytest.param([SYSTEM, _result("a"), USER], "first non-system", id="starts-with-tool"),
        pytest.param([SYSTEM], "no message after", id="only-system"),
        pytest.param([], "no message after", id="empty"),
        pytest.param([USER, _result("a")], "does not follow", id="orphan-after-user"),
        pytest.param([USER, _calls("a"), _result("b")], "answers no call", id="wrong-id"),
        pytest.param([USER, _calls("a"), USER], "not answered", id="unanswered-then-user"),
        pytest.param([USER, _calls("a", "b"), _result("a")], "not answered", id="unanswered-end"),
        pytest.param([USER, _calls("a"), _result("a"), _result("a")], "twice", id="duplicate"),
        pytest.param(
            [USER, _calls("a"), TEXT, _result("a")], "not answered", id="interleaved-text"
        ),
        pytest.param(
            [USER, _calls("a"), _result("a"), _calls("b"), _result("a"), _result("b")],
            "answers no call",
            id="answer-for-the-previous-unit",
        ),
        pytest.param([USER, {**_calls(), "tool_calls": []}], "empty tool_calls", id="empty-calls"),
        pytest.param([USER, _calls("a", "a"), _result("a")], "duplicate tool call id", id="dup-id"),
        pytest.param([USER, {"role": "robot", "content": "x"}], "unknown role", id="unknown-role"),
        pytest.param(
            [{**USER, "tool_calls": _calls("a")["tool_calls"]}], "carries", id="user-calls"
        ),
    ],
)
def test_the_checker_reports_each_kind_of_violation(messages, fragment):
    problems = check_openai_messages(messages)
    assert any(fragment in p for p in problems), problems


# --- properties over random histories, for every strategy ---------------------------------

_sizes = st.integers(min_value=1, max_value=3000)
_RESULT_FATES = ("answer",) * 6 + ("missing", "duplicate", "late")


@st.composite
def _unit(draw: st.DrawFn, ids: itertools.count, *, well_formed: bool) -> list[StoredMessage]:
    """An assistant tool-call message and its results; broken on purpose unless well_formed."""
    call_ids = [f"call_{next(ids)}" for _ in range(draw(st.integers(1, 3)))]
    text = draw(st.sampled_from([None, "", "let me check"]))
    messages = [assistant(text, tool_calls=call_ids, tokens=draw(_sizes))]
    results = [tool(c, f"result of {c}", tokens=draw(_sizes)) for c in call_ids]
    results = draw(st.permutations(results))
    if well_formed:
        return messages + results
    late: list[StoredMessage] = []
    for result in results:
        fate = draw(st.sampled_from(_RESULT_FATES))
        if fate in ("answer", "duplicate"):
            messages.append(result)
        if fate == "duplicate":
            messages.append(tool(result.tool_call_id or "", "again", tokens=draw(_sizes)))
        if fate == "late":
            late.append(result)
    if late:
        messages.append(assistant("interleaved text", tokens=draw(_sizes)))
        messages.extend(late)
    if draw(st.integers(0, 9)) == 0:
        messages.append(tool(f"call_{next(ids)}_orphan", "orphan", tokens=draw(_sizes)))
    return messages


@st.composite
def _turn(draw: st.DrawFn, ids: itertools.count, *, current: bool) -> list[StoredMessage]:
    messages = [user(f"question {next(ids)}", tokens=draw(_sizes))]
    for _ in range(draw(st.integers(0, 3))):
        messages += draw(_unit(ids, well_formed=current or draw(st.booleans())))
    # the current turn is in flight: it ends with the user message or fresh tool results
    if not current and draw(st.booleans()):
        messages.append(assistant("answer", tokens=draw(_sizes)))
    return messages


@st.composite
def histories(draw: st.DrawFn) -> list[StoredMessage]:
    """Random sessions: older turns may be broken (missing, duplicate, late, orphan results;
    a stray leading tool result), the current turn is well formed."""
    ids = itertools.count(1)
    messages: list[StoredMessage] = []
    if draw(st.integers(0, 9)) == 0:
        messages.append(tool("call_stray", "stray", tokens=draw(_sizes)))
    for _ in range(draw(st.integers(0, 6))):
        messages += draw(_turn(ids, current=False))
    messages += draw(_turn(ids, current=True))
    return history(*messages)


def _load(messages: list[StoredMessage], limit: int) -> list[StoredMessage]:
    """What the proxy loads: the tail of ``limit`` messages, widened to the whole current turn."""
    return messages[-max(limit, len(messages) - turn_start(messages)) :]


KINDS = ("full", "windowed", "none")


@st.composite
def cases(draw: st.DrawFn, kind: str) -> tuple[Any, Any, list[StoredMessage], list[StoredMessage]]:
    """(strategy, config, whole history, loaded messages) for a random config of ``kind``."""
    messages = draw(histories())
    if kind == "full":
        config: Any = FullConfig(maxHistoryFetch=draw(st.integers(1, 60)))
        strategy: Any = FullStrategy()
        limit = config.maxHistoryFetch
    elif kind == "windowed":
        config = WindowedConfig(windowSize=draw(st.integers(1, 30)))
        strategy = WindowedStrategy()
        limit = config.windowSize
    else:
        config, strategy, limit = NoneConfig(), NoneStrategy(), 0
    # the proxy may also have loaded more than the strategy asked for
    loaded = messages if draw(st.booleans()) else _load(messages, limit)
    return strategy, config, messages, loaded


_settings = settings(max_examples=examples(200), deadline=None,
                     suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("kind", KINDS)
@_settings
@given(data=st.data())
def test_every_strategy_sends_a_valid_ordered_window_with_the_whole_current_turn(kind, data):
    strategy, config, messages, loaded = data.draw(cases(kind))
    ctx = context(loaded, config, system_tokens=77)
    window = strategy.select(ctx)

    assert check_openai_messages(render(window)) == []
    sent = seqs(window)
    assert sent == sorted(set(sent)), "order preserved, nothing twice"
    assert {m.seq for m in loaded} >= set(sent)
    current = [m.seq for m in messages[turn_start(messages) :]]
    assert sent[-len(current) :] == current, "the current turn is sent whole"

    assert window.trimmed == len(loaded) - len(window.items)
    assert window.tokens == 77 + sum(i.tokens for i in window.items)
    assert window.summaries == []
    assert strategy.after_turn(ctx, window.tokens) is None


@_settings
@given(histories())
def test_make_valid_is_idempotent_and_keeps_a_subsequence(messages):
    once, dropped = make_valid(as_items(messages))
    twice, dropped_again = make_valid(once)
    assert dropped_again == 0
    assert [i.message for i in twice] == [i.message for i in once]
    assert len(once) + dropped == len(messages)
    kept = [i.message.seq for i in once]
    assert kept == sorted(kept)
    assert set(kept) <= {m.seq for m in messages}
    assert check_openai_messages(render(Window(items=once))) == []


@_settings
@given(histories(), st.integers(0, 80))
def test_trim_to_units_never_splits_a_unit_or_starts_on_a_result(messages, keep_from):
    start = trim_to_units(messages, keep_from)
    assert start >= min(keep_from, len(messages))
    assert start == len(messages) or messages[start].role != "tool"
    assert start in {s for s, _ in tool_units(messages)} | {len(messages)}
