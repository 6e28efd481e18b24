"""The summarizer call, summary placement and sanitizing of summary text."""

from __future__ import annotations

import pytest
from helpers import assistant, call, history, tool, user

from strategies.base import SummarizePlan
from strategies.records import SummaryRecord
from strategies.summary_prompt import (
    build_summary_messages,
    chunk_end,
    render_summary,
    sanitize_summary,
    transcript_budget,
)


def count(text: str) -> int:
    return len(text) // 4


def plan(messages, previous=None):
    return SummarizePlan(
        kind="summary",
        from_seq=previous.from_seq if previous else messages[0].seq,
        to_seq=messages[-1].seq,
        messages=messages,
        previous=previous,
    )


def session():
    return history(
        user("Fix the failing test in src/app.py, keep the public API."),
        assistant("Looking.", tool_calls=[call("c1", "read_file", '{"path": "src/app.py"}')]),
        tool("c1", "def main(): ..."),
        assistant("Fixed: renamed the import."),
    )


def test_the_system_prompt_names_what_to_preserve():
    system = build_summary_messages(plan(session()))[0]
    assert system["role"] == "system"
    text = system["content"].lower()
    for category in (
        "instructions and goals",
        "verbatim",
        "decisions",
        "file paths",
        "urls",
        "ids",
        "errors",
        "pending tasks",
        "next steps",
        "current state",
        "self-contained",
    ):
        assert category in text, category


def test_the_transcript_labels_roles_and_renders_tool_calls_compactly():
    user_message = build_summary_messages(plan(session()))[1]
    assert user_message["role"] == "user"
    text = user_message["content"]
    assert "USER: Fix the failing test in src/app.py" in text
    assert 'read_file({"path": "src/app.py"})' in text
    assert "TOOL RESULT" in text and "def main(): ..." in text
    assert "Previous summary" not in text


def test_the_previous_summary_is_included_to_build_upon():
    previous = SummaryRecord(kind="summary", text="User wants X; chose Y.", from_seq=1, to_seq=9)
    messages = history(*session())
    for message in messages:
        message.seq += 9
    text = build_summary_messages(plan(messages, previous))[1]["content"]
    assert "Previous summary" in text
    assert "User wants X; chose Y." in text
    assert text.index("Previous summary") < text.index("USER:")


def test_tool_results_are_summarized_from_the_original_not_the_stub():
    messages = session()
    messages[2].compressed_content = "stub"
    text = build_summary_messages(plan(messages))[1]["content"]
    assert "def main(): ..." in text


def test_a_very_large_item_is_capped_with_a_marker():
    messages = history(user("q"), tool("c1", "x" * 40_000))
    text = build_summary_messages(plan(messages), count_tokens=count)[1]["content"]
    assert "more tokens of this message omitted" in text
    assert count(text) < 2_500


def test_max_input_tokens_bounds_the_whole_call_by_capping_items():
    messages = history(
        user("the goal: ship v2"),
        *[tool(f"c{n}", f"{n} " * 2000) for n in range(10)],
        assistant("latest state"),
    )
    out = build_summary_messages(plan(messages), count_tokens=count, max_input_tokens=3000)
    assert sum(count(m["content"]) for m in out) <= 3000
    text = out[1]["content"]
    assert "the goal: ship v2" in text
    assert "latest state" in text
    assert all(f"[{m.seq}]" in text for m in messages)


def test_a_transcript_too_long_for_one_call_is_cut_into_chunks_that_each_fit():
    messages = history(
        user("the goal: ship v2"),
        *[tool(f"c{n}", f"{n} " * 2000) for n in range(10)],
        assistant("latest state"),
    )
    whole = plan(messages)
    budget = transcript_budget(whole, count_tokens=count, max_input_tokens=2500)
    chunks, start = [], 0
    while start < len(messages):
        end = chunk_end(messages, start, budget, count)
        assert end > start
        chunks.append(messages[start:end])
        start = end
    assert len(chunks) > 1
    assert [m.seq for chunk in chunks for m in chunk] == [m.seq for m in messages]
    for chunk in chunks:
        out = build_summary_messages(
            plan(chunk), count_tokens=count, max_input_tokens=2500)
        assert sum(count(m["content"]) for m in out) <= 2500
        assert "omitted to fit" not in out[1]["content"]


def test_the_placement_hint_is_mentioned():
    system = build_summary_messages(plan(session()), placement_hint="SYSTEM_PROMPT")[0]
    assert "Earlier conversation" in system["content"]


# --- placement -------------------------------------------------------------------------------

RECORD = SummaryRecord(kind="summary", text="The user wants a CLI.", from_seq=3, to_seq=40)


def test_a_system_prompt_summary_goes_under_earlier_conversation_labelled_as_derived():
    text = render_summary(RECORD, "SYSTEM_PROMPT")
    assert isinstance(text, str)
    assert text.startswith("\n\n## Earlier conversation\n")
    assert "derived summary of messages 3-40" in text
    assert text.endswith("The user wants a CLI.")


def test_a_user_message_summary_continues_the_session_labelled_as_derived():
    message = render_summary(RECORD, "USER_MESSAGE")
    assert message["role"] == "user"
    assert message["content"].startswith(
        "This session is being continued from a previous conversation that ran out of "
        "context. The conversation is summarized below:\n"
    )
    assert "derived summary" in message["content"]
    assert message["content"].endswith("The user wants a CLI.")


def test_rendering_sanitizes_the_summary_text():
    record = SummaryRecord(kind="compaction", text="a\u202eb\x07c", from_seq=1, to_seq=2)
    assert render_summary(record, "USER_MESSAGE")["content"].endswith("abc")


# --- sanitizing ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "clean"),
    [
        pytest.param("a\u200bb", "ab", id="zero-width-space"),
        pytest.param("a\u202eb", "ab", id="bidi-override"),
        pytest.param("a\x07b", "ab", id="bell"),
        pytest.param("a\ufeffb\u2066c", "abc", id="bom-and-isolate"),
        pytest.param("line 1\nline 2\tcol", "line 1\nline 2\tcol", id="newlines-and-tabs-kept"),
        pytest.param("a\r\nb\rc", "a\nb\nc", id="carriage-returns-become-newlines"),
        pytest.param("naïve — 東京", "naïve — 東京", id="ordinary-unicode-kept"),
    ],
)
def test_sanitize_strips_invisible_and_control_characters(raw, clean):
    assert sanitize_summary(raw) == clean
