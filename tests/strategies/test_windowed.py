"""windowed: the last windowSize messages, cut at unit boundaries, the current turn whole."""

from __future__ import annotations

import pytest
from helpers import assistant, context, history, render, seqs, tool, user

from strategies.config import SummarizingWindowConfig, WindowedConfig
from strategies.records import LoadSpec, StoredMessage
from strategies.validity import check_openai_messages
from strategies.windowed import WindowedStrategy

windowed = WindowedStrategy()


def _history() -> list[StoredMessage]:
    return history(
        user("q1"),  # seq 1
        assistant("a1"),  # 2
        user("q2"),  # 3
        assistant(None, tool_calls=["x", "y"]),  # 4
        tool("x"),  # 5
        tool("y"),  # 6
        assistant("a2"),  # 7
        user("q3"),  # 8
        assistant("a3"),  # 9
        user("q4"),  # 10: the current turn
    )


@pytest.mark.parametrize(
    ("size", "sent", "trimmed"),
    [
        pytest.param(10, range(1, 11), 0, id="size-equals-history"),
        pytest.param(11, range(1, 11), 0, id="size-above-history"),
        pytest.param(9, range(3, 11), 2, id="one-less-drops-to-the-next-user-message"),
        pytest.param(8, range(3, 11), 2, id="start-on-a-user-message"),
        pytest.param(7, range(8, 11), 7, id="start-on-a-tool-call-unit"),
        pytest.param(6, range(8, 11), 7, id="start-on-the-first-tool-result"),
        pytest.param(5, range(8, 11), 7, id="start-on-the-last-tool-result"),
        pytest.param(3, range(8, 11), 7, id="start-on-a-later-user-message"),
        pytest.param(1, [10], 9, id="size-one-sends-the-current-turn"),
    ],
)
def test_the_window_keeps_the_last_messages_from_a_valid_boundary(size, sent, trimmed):
    window = windowed.select(context(_history(), WindowedConfig(windowSize=size)))
    assert seqs(window) == list(sent)
    assert window.trimmed == trimmed
    assert window.modified == bool(trimmed)
    assert check_openai_messages(render(window)) == []


def test_window_never_starts_with_a_tool_result():
    messages = history(
        user("q1"), assistant(None, tool_calls=["a"]), tool("a"), assistant("a1"), user("q2")
    )
    for size in range(1, len(messages) + 1):
        window = windowed.select(context(messages, WindowedConfig(windowSize=size)))
        assert window.items[0].message.role == "user"


def test_a_current_turn_longer_than_the_window_is_sent_whole():
    messages = history(
        user("q1"),
        assistant("a1"),
        user("q2"),  # seq 3: the current turn
        assistant(None, tool_calls=["a", "b"]),
        tool("a"),
        tool("b"),
        assistant("next", tool_calls=["c"]),
        tool("c"),
    )
    window = windowed.select(context(messages, WindowedConfig(windowSize=2)))
    assert seqs(window) == [3, 4, 5, 6, 7, 8]
    assert window.trimmed == 2


def test_the_window_keeps_loaded_messages_verbatim():
    messages = _history()
    messages[4].compressed_content = "[stub from another strategy]"
    window = windowed.select(context(messages, WindowedConfig(windowSize=10)))
    assert all(i.message is m for i, m in zip(window.items, messages, strict=True))
    assert all(i.text is None and i.marker is None for i in window.items)


def test_window_tokens_count_the_system_prompt_and_every_item():
    messages = history(user("q", tokens=10), assistant("a", tokens=20), user("q2", tokens=30))
    window = windowed.select(context(messages, WindowedConfig(windowSize=2), system_tokens=5))
    assert window.tokens == 5 + 30


def test_windowed_loads_window_size_messages():
    assert windowed.load_spec(WindowedConfig(windowSize=7)) == LoadSpec(limit=7, since="all")
    assert windowed.load_spec(WindowedConfig()) == LoadSpec(limit=20, since="all")


def test_windowed_never_summarizes_or_compresses():
    ctx = context(_history(), WindowedConfig())
    assert windowed.after_turn(ctx, 10**9) is None
    plan = windowed.compress(ctx)
    assert plan.noop and plan.summarize == [] and plan.new_stubs == {}
    assert "never compresses" in plan.message


def test_windowed_refuses_another_kinds_config():
    with pytest.raises(TypeError, match="WindowedConfig"):
        windowed.select(context(_history(), SummarizingWindowConfig()))


def test_a_window_step_keeps_the_start_until_the_window_is_full_again():
    strategy = WindowedStrategy()
    config = WindowedConfig(windowSize=6, windowStep=4)
    starts, sizes = [], []
    messages: list = []
    for n in range(1, 13):
        messages = history(*messages, user(f"q{n}"))
        window = strategy.select(context(messages, config))
        starts.append(seqs(window)[0])
        sizes.append(len(window.items))
        assert seqs(window)[-1] == n and len(window.items) <= 6
    # the start moves in steps of four (seqs 1, 5, 9), never at every message
    assert starts == [1, 1, 1, 1, 1, 1, 5, 5, 5, 5, 9, 9]
    assert min(sizes[6:]) == 3


def test_a_window_step_of_one_is_the_last_window_size_messages():
    strategy = WindowedStrategy()
    messages = history(*[user(f"q{n}") for n in range(1, 11)])
    window = strategy.select(context(messages, WindowedConfig(windowSize=4, windowStep=1)))
    assert seqs(window) == [7, 8, 9, 10]
