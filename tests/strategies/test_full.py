"""full: every loaded message, verbatim."""

from __future__ import annotations

from helpers import assistant, context, history, render, seqs, tool, user

from strategies.config import FullConfig
from strategies.full import FullStrategy
from strategies.records import LoadSpec
from strategies.validity import check_openai_messages

full = FullStrategy()


def test_full_loads_max_history_fetch_messages():
    assert full.load_spec(FullConfig(maxHistoryFetch=123)) == LoadSpec(limit=123, since="all")
    assert full.load_spec(FullConfig()) == LoadSpec(limit=500, since="all")


def test_every_loaded_message_is_sent_verbatim():
    messages = history(
        user("q1"),
        assistant("checking", tool_calls=["a", "b"]),
        tool("a", "x" * 5000, tokens=1250),
        tool("b"),
        assistant("a1"),
        user("q2"),
    )
    messages[2].compressed_content = "[stub from another strategy]"
    window = full.select(context(messages, FullConfig(), system_tokens=40))
    assert all(i.message is m for i, m in zip(window.items, messages, strict=True))
    assert all(i.text is None and i.marker is None for i in window.items)
    assert [i.tokens for i in window.items] == [m.tokens for m in messages]
    assert window.tokens == 40 + sum(m.tokens for m in messages)
    assert (window.trimmed, window.modified, window.summaries) == (0, False, [])


def test_a_page_cut_inside_a_turn_is_repaired_and_counted_as_trimmed():
    messages = history(
        tool("a"),  # the page starts after this result's call
        assistant("a1"),
        user("q2"),
        assistant(None, tool_calls=["b"]),
        tool("b"),
    )
    window = full.select(context(messages, FullConfig(maxHistoryFetch=5)))
    assert seqs(window) == [3, 4, 5]
    assert window.trimmed == 2
    assert window.notes
    assert check_openai_messages(render(window)) == []


def test_full_never_summarizes_or_compresses():
    ctx = context(history(user()), FullConfig())
    assert full.after_turn(ctx, 10**9) is None
    plan = full.compress(ctx)
    assert plan.noop and plan.summarize == [] and plan.new_stubs == {}
    assert plan.message == "full never compresses: every loaded message goes to the model"
