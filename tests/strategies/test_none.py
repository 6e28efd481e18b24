"""none: only the current turn reaches the model."""

from __future__ import annotations

from helpers import assistant, context, history, render, seqs, tool, user

from strategies.config import NoneConfig
from strategies.none import NoneStrategy
from strategies.records import LoadSpec
from strategies.validity import check_openai_messages

stateless = NoneStrategy()


def _with_tool_loop():
    return history(
        user("q1"),
        assistant("a1"),
        user("q2"),  # seq 3: the current turn
        assistant("looking", tool_calls=["a", "b"]),
        tool("a"),
        tool("b"),
        assistant(None, tool_calls=["c"]),
        tool("c"),
    )


def test_none_loads_only_the_current_turn():
    assert stateless.load_spec(NoneConfig()) == LoadSpec(limit=500, since="turn")


def test_only_the_current_turn_is_sent_tool_loop_included():
    window = stateless.select(context(_with_tool_loop(), NoneConfig(), system_tokens=9))
    assert seqs(window) == [3, 4, 5, 6, 7, 8]
    assert window.trimmed == 2
    assert window.tokens == 9 + sum(i.tokens for i in window.items)
    assert check_openai_messages(render(window)) == []


def test_a_turn_loaded_on_its_own_is_sent_whole_and_nothing_is_trimmed():
    turn = _with_tool_loop()[2:]
    window = stateless.select(context(turn, NoneConfig()))
    assert seqs(window) == [3, 4, 5, 6, 7, 8]
    assert (window.trimmed, window.modified) == (0, False)


def test_a_single_user_message_is_the_whole_window():
    messages = history(user("q1"), assistant("a1"), user("q2"))
    assert seqs(stateless.select(context(messages, NoneConfig()))) == [3]


def test_none_never_summarizes_or_compresses():
    ctx = context(_with_tool_loop(), NoneConfig())
    assert stateless.after_turn(ctx, 10**9) is None
    plan = stateless.compress(ctx)
    assert plan.noop and plan.summarize == [] and plan.new_stubs == {}
    assert "never compresses" in plan.message
