"""Shortcuts of the window's validity rules give what the general code gives:
``sanitize_summary`` skips its character filter for printable text, ``make_valid`` skips
the repair of complete units, tool units computed once by the caller change nothing, and
``fit_sizes`` keeps what the unit-by-unit rule keeps (the select shortcuts:
test_select_paths.py)."""

from __future__ import annotations

import unicodedata

import pytest
from helpers import assistant, call, history, tool, user
from hypothesis import given, settings
from hypothesis import strategies as st
from soak import examples
from test_select_paths import _settings
from test_validity import histories

from strategies.records import StoredMessage
from strategies.summarizing_window import fit_sizes, fit_tail
from strategies.summary_prompt import sanitize_summary
from strategies.validity import (
    as_items,
    make_valid,
    opening_with_a_user,
    tool_units,
    trim_to_units,
)

# --- sanitize_summary and make_valid ---------------------------------------------------------


def _filtered(text: str) -> str:
    """sanitize_summary's character filter, applied to every text."""
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\u2028", "\n")
    text = text.replace("\u2029", "\n")
    return "".join(
        ch for ch in text if ch in "\n\t" or unicodedata.category(ch) not in ("Cc", "Cf")
    ).strip()


@settings(max_examples=examples(500), deadline=None)
@given(st.text())
def test_sanitize_summary_gives_the_character_filter_result_for_any_text(text):
    assert sanitize_summary(text) == _filtered(text)


@pytest.mark.parametrize(
    "text",
    ["  plain summary\n\twith tabs  ", "caf\u00e9 \u2014 ok", "zero\u200bwidth", "bell\x07",
     "line\u2028sep", "cr\r\nlf", "nbsp\u00a0kept", "\ufeffbom"],
)
def test_sanitize_summary_shortcut_and_filter_agree_on_edge_characters(text):
    assert sanitize_summary(text) == _filtered(text)


@pytest.mark.parametrize(
    ("calls", "answers", "sent_calls"),
    [
        pytest.param(["a", "b"], ["a", "b"], ["a", "b"], id="complete-unit-untouched"),
        pytest.param(["a", "a"], ["a"], ["a", "a"], id="duplicate-ids-one-answer-complete"),
        pytest.param(["a", "b"], ["b"], ["b"], id="unanswered-call-removed"),
        pytest.param([call("a"), {"type": "function"}], ["a"], ["a"], id="id-less-call-removed"),
        pytest.param([call("a"), "junk"], ["a"], ["a"], id="malformed-call-removed"),
    ],
)
def test_make_valid_repairs_exactly_the_incomplete_units(calls, answers, sent_calls):
    head = StoredMessage(role="assistant", content=None,
                         tool_calls=[call(c) if isinstance(c, str) else c for c in calls])
    items = as_items([user(), head, *[tool(a) for a in answers], user()])
    kept, dropped = make_valid(items)
    assert dropped == 0
    sent = kept[1].message.tool_calls or []
    assert [c.get("id") for c in sent if isinstance(c, dict)] == sent_calls
    assert (kept[1] is items[1]) == (len(sent) == len(calls))


# --- tool units computed once ----------------------------------------------------------------


def _units_by_scan(messages: list[StoredMessage]) -> list[tuple[int, int]]:
    units, i = [], 0
    while i < len(messages):
        end = i + 1
        if messages[i].role == "assistant" and messages[i].tool_calls:
            ids = {c["id"] for c in messages[i].tool_calls if isinstance(c, dict) and c.get("id")}
            while end < len(messages) and messages[end].role == "tool" and (
                messages[end].tool_call_id in ids
            ):
                end += 1
        units.append((i, end))
        i = end
    return units


@_settings
@given(histories(), st.integers(-2, 80), st.integers(0, 80))
def test_units_given_by_the_caller_change_nothing(messages, keep_from, turn):
    units = tool_units(messages)
    assert units == _units_by_scan(messages)
    assert trim_to_units(messages, keep_from, units) == trim_to_units(messages, keep_from)
    items = as_items(messages)
    fit = {"fixed": 10, "ratio": 0.5, "context_window": 3000, "calibration": 1.07}
    assert fit_tail(messages, items, turn, units=units, **fit) == fit_tail(
        messages, items, turn, **fit
    )


def reference_fit(
    sizes: list[int], units: list[tuple[int, int]], turn_start: int, *, fixed: int,
    limit: float, calibration: float,
) -> int:
    """``fit_sizes`` as documented: whole units newest first, those of the current turn
    always, stopping at the first older unit that does not fit."""
    total, keep_from = fixed, len(sizes)
    for start, end in reversed(units):
        size = sum(sizes[start:end])
        if end <= turn_start and (total + size) * calibration > limit:
            break
        total += size
        keep_from = start
    return keep_from


@_settings
@given(
    st.lists(st.integers(0, 400), max_size=60),
    st.integers(-2, 64),
    st.integers(0, 500),
    st.integers(0, 6000),
    st.sampled_from([0.0, 0.5, 1.0, 1.07, 2.5]),
)
def test_fitting_one_message_units_keeps_what_the_unit_by_unit_rule_keeps(
    sizes, turn, fixed, limit, calibration
):
    units = [(i, i + 1) for i in range(len(sizes))]
    fit = {"fixed": fixed, "limit": limit, "calibration": calibration}
    assert fit_sizes(sizes, units, turn, **fit) == reference_fit(sizes, units, turn, **fit)
    # a negative size (never stored, but the general code takes it) takes the general path
    if sizes:
        negative = [*sizes[:-1], -5]
        assert fit_sizes(negative, units, turn, **fit) == reference_fit(
            negative, units, turn, **fit)


@_settings
@given(st.lists(st.sampled_from(["user", "assistant", "system"]), max_size=12))
def test_a_window_without_tools_opens_as_make_valid_opens_it(roles):
    makers = {"user": user, "assistant": assistant,
              "system": lambda text: StoredMessage(role="system", content=text)}  # type: ignore[arg-type]
    items = as_items(history(*(makers[role](f"m{i}") for i, role in enumerate(roles))))

    assert opening_with_a_user(list(items)) == make_valid(items)[0]
